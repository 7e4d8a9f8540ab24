//! Multipart publication to a remote store, on the S3-compatible test server.
//!
//! Guards that an extent larger than `part_bytes` goes up as a multipart
//! upload whose parts are bounded per publication, and that multipart does
//! not weaken what a single create-if-absent PUT gave: the object restores
//! bit-exactly, an existing object of the right size is reused (HEAD, no
//! upload), one of the wrong size is quarantined and replaced, and an
//! upload interrupted by a failed part or a failed `complete` is aborted —
//! no object of it visible, no root, and no pending upload left on the
//! server (whose parts would be billed storage that nothing references).
//! Why it matters: object_store's multipart `complete` overwrites (it has
//! no `PutMode::Create`), so create-if-absent and "nothing visible on
//! failure" are deltapack's own doing here, not the backend's.
//!
//! A wrapper around the real S3 store counts the multipart calls, measures
//! the parts in flight, and injects part and `complete` failures; the
//! server's list of pending uploads is read over raw HTTP
//! (`GET /<bucket>?uploads`). Needs `DELTAPACK_TEST_S3_ENDPOINT`; skips
//! without it (fails under `CI=true`).

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deltapack_store::wrap::{Intercept, Wrapped};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{
    MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt, PutMultipartOptions, PutPayload,
    PutResult, Result, UploadPart,
};

use crate::common::*;
use deltapack_format::synth::{self, Preset};
use deltapack_format::{CacheIdentity, ContextDigest, Snapshot};
use deltapack_store::{Backend, BackendKind, PublishOutcome, RootFormat, Store, StoreConfig};

const MIB: u64 = 1 << 20;

// ------------------------------------------------------------ the wrapper

/// What the wrapper saw, and the faults it is to inject.
#[derive(Debug, Default)]
struct Seen {
    /// `put_multipart_opts` calls (uploads started).
    creates: AtomicUsize,
    /// `put_part` calls.
    parts: AtomicUsize,
    /// Parts being sent (and the most sent at once).
    sending: InFlight,
    /// Successful `complete` calls.
    completes: AtomicUsize,
    /// `abort` calls.
    aborts: AtomicUsize,
    /// Fail this `put_part` (1-based, counted over all uploads).
    fail_part: Mutex<Option<usize>>,
    /// Fail the next `complete` (then clear).
    fail_complete: AtomicBool,
    /// The Nth upload's creation answers this much later than the server
    /// created it (a slow response): a caller that gives up meanwhile has
    /// an upload on the server it never heard of.
    slow_create: Mutex<Option<(usize, Duration)>>,
    /// Keys of the uploads a fault was injected into.
    failed_keys: Mutex<Vec<String>>,
    /// Keys of the uploads aborted.
    aborted_keys: Mutex<Vec<String>>,
}

impl Seen {
    fn n(a: &AtomicUsize) -> usize {
        a.load(Ordering::SeqCst)
    }
    fn failed_keys(&self) -> Vec<String> {
        Seen::keys(&self.failed_keys)
    }
    fn aborted_keys(&self) -> Vec<String> {
        Seen::keys(&self.aborted_keys)
    }
    fn keys(keys: &Mutex<Vec<String>>) -> Vec<String> {
        keys.lock().map(|k| k.clone()).unwrap_or_default()
    }
}

/// Forwards everything to a real store; multipart uploads go through
/// [`Upload`].
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn ObjectStore>,
    seen: Arc<Seen>,
    /// Added to every part, so that concurrency is observable.
    part_delay: Duration,
}

fn injected(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "multipart-test",
        source: format!("injected fault in {what}").into(),
    }
}

/// One part being sent (counted down when the part's future ends or is
/// dropped).
struct Sending(Arc<Seen>);

impl Sending {
    fn start(seen: &Arc<Seen>) -> Sending {
        seen.sending.enter();
        Sending(seen.clone())
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.0.sending.leave();
    }
}

#[derive(Debug)]
struct Upload {
    inner: Box<dyn MultipartUpload>,
    seen: Arc<Seen>,
    key: String,
    part_delay: Duration,
}

#[async_trait::async_trait]
impl MultipartUpload for Upload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let n = self.seen.parts.fetch_add(1, Ordering::SeqCst) + 1;
        let fail = self
            .seen
            .fail_part
            .lock()
            .map(|f| *f == Some(n))
            .unwrap_or(false);
        if fail {
            if let Ok(mut k) = self.seen.failed_keys.lock() {
                k.push(self.key.clone());
            }
        }
        // Always numbered by the real upload, so the parts after a failed
        // one keep their places.
        let send = self.inner.put_part(data);
        let (seen, delay) = (self.seen.clone(), self.part_delay);
        Box::pin(async move {
            let _counted = Sending::start(&seen);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if fail {
                return Err(injected(&format!("put_part #{n}")));
            }
            send.await
        })
    }

    async fn complete(&mut self) -> Result<PutResult> {
        if self.seen.fail_complete.swap(false, Ordering::SeqCst) {
            if let Ok(mut k) = self.seen.failed_keys.lock() {
                k.push(self.key.clone());
            }
            return Err(injected("complete"));
        }
        let r = self.inner.complete().await?;
        self.seen.completes.fetch_add(1, Ordering::SeqCst);
        Ok(r)
    }

    async fn abort(&mut self) -> Result<()> {
        self.seen.aborts.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut k) = self.seen.aborted_keys.lock() {
            k.push(self.key.clone());
        }
        self.inner.abort().await
    }
}

#[async_trait::async_trait]
impl Intercept for Counting {
    deltapack_store::layer_basics!("Counting");

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let n = self.seen.creates.fetch_add(1, Ordering::SeqCst) + 1;
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        let slow = self.seen.slow_create.lock().ok().and_then(|s| *s);
        if let Some((nth, delay)) = slow {
            if nth == n {
                tokio::time::sleep(delay).await;
            }
        }
        Ok(Box::new(Upload {
            inner,
            seen: self.seen.clone(),
            key: location.to_string(),
            part_delay: self.part_delay,
        }))
    }
}

// ------------------------------------------------------------ helpers

/// A store on `raw` through the counting wrapper (keeping `raw`'s kind, so
/// multipart applies where it would), and what the wrapper sees.
fn counting(raw: &Backend, config: StoreConfig, part_delay: Duration) -> (Store, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let layer = Wrapped::arc(Counting {
        inner: raw.store.clone(),
        seen: seen.clone(),
        part_delay,
    });
    (through(raw, layer, config), seen)
}

/// A store on a fresh S3 prefix through the counting wrapper (still an S3
/// backend, so multipart applies), the raw backend, and what the wrapper
/// sees. `None` without the test server.
fn s3_counting(config: StoreConfig, part_delay: Duration) -> Option<(Store, Backend, Arc<Seen>)> {
    let raw = raw_backend(&s3_url()?);
    let (store, seen) = counting(&raw, config, part_delay);
    Some((store, raw, seen))
}

/// Extents of 16 MiB in parts of 5 MiB: a full extent is 4 parts.
fn multipart_config() -> StoreConfig {
    StoreConfig::default()
        .with_max_extent_bytes(16 * MIB)
        .with_part_bytes(5 * MIB)
}

/// A ~40 MB snapshot: two full 16 MiB extents and a third of ~8 MB (all
/// three larger than a part).
fn big(seed: u64) -> Arc<Snapshot> {
    let s = synth::snapshot(Preset::Default, seed, 6144).expect("synth");
    let len = s.encoded().len() as u64;
    assert!(
        (32 * MIB + 5 * MIB..48 * MIB).contains(&len),
        "snapshot size {len}"
    );
    Arc::new(s)
}

/// [`big`]`(seed)` in the namespace `label`: its identity, the snapshot and
/// its context.
fn big_turn(label: &str, seed: u64) -> (CacheIdentity, Arc<Snapshot>, ContextDigest) {
    let id = identity(label);
    let c = ctx(&id, seed, 6144);
    (id, big(seed), c)
}

/// Keys (relative to the store's prefix) and sizes under `prefix`.
async fn listed(s: &Store, prefix: &str) -> Vec<(String, u64)> {
    let metas: Vec<ObjectMeta> = s
        .object_store()
        .list(Some(&Path::from(prefix)))
        .try_collect()
        .await
        .expect("list");
    metas
        .into_iter()
        .map(|m| (m.location.to_string(), m.size))
        .collect()
}

/// The key prefix of an S3 store inside its bucket.
fn bucket_prefix(raw: &Backend) -> String {
    match &raw.kind {
        BackendKind::S3 { prefix, .. } => prefix.clone(),
        other => panic!("not an S3 store: {other:?}"),
    }
}

/// Keys of the multipart uploads pending on the test server under `prefix`
/// (`GET /<bucket>?uploads`, read over a raw connection; moto answers it
/// unsigned).
fn pending_uploads(prefix: &str) -> Vec<String> {
    let ep = s3_endpoint().expect("endpoint");
    let host = ep
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mut s = std::net::TcpStream::connect(&host).expect("connect to the S3 server");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "GET /{}?uploads&prefix={prefix}/ HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n",
        s3_bucket()
    )
    .expect("write");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    assert!(
        resp.starts_with("HTTP/1.1 200") || resp.starts_with("HTTP/1.0 200"),
        "list uploads: {resp}"
    );
    assert!(resp.contains("ListMultipartUploadsResult"), "{resp}");
    resp.split("<Key>")
        .skip(1)
        .filter_map(|k| k.split("</Key>").next())
        .filter(|k| k.starts_with(&format!("{prefix}/")))
        .map(str::to_string)
        .collect()
}

/// Waits (up to 10 s) until every upload the wrapper saw started has been
/// completed or aborted (an upload a failing publication abandoned is
/// aborted in the background) and none is pending on the server.
async fn wait_settled(seen: &Seen, prefix: &str) {
    let start = Instant::now();
    loop {
        let settled = Seen::n(&seen.creates) == Seen::n(&seen.completes) + Seen::n(&seen.aborts);
        let pending = pending_uploads(prefix);
        if settled && pending.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "uploads not settled: {} started, {} completed, {} aborted; pending on the server: {pending:?}",
            Seen::n(&seen.creates),
            Seen::n(&seen.completes),
            Seen::n(&seen.aborts),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ------------------------------------------------------------ the tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_extents_go_up_as_multipart_restore_exactly_and_are_reused() {
    let Some((s, raw, seen)) = s3_counting(multipart_config(), Duration::ZERO) else {
        return;
    };
    let (id, snap, c) = big_turn("multipart-roundtrip", 1);
    let r = publish_base(&s, &id, c, snap.clone(), RootFormat::V2).await;
    assert_eq!(r.outcome, PublishOutcome::Created);
    assert_eq!(r.objects_written, 3, "{r:?}");
    // Every extent is larger than a part: three uploads, of 4 + 4 + 2 parts.
    assert_eq!(Seen::n(&seen.creates), 3, "uploads started");
    assert_eq!(Seen::n(&seen.completes), 3, "uploads completed");
    assert_eq!(Seen::n(&seen.parts), 10, "parts sent");
    assert_eq!(Seen::n(&seen.aborts), 0);
    assert!(seen.sending.max() <= 16);
    let objects = listed(&s, "objects").await;
    assert_eq!(objects.len(), 3, "{objects:?}");
    assert_eq!(
        objects.iter().map(|(_, n)| n).sum::<u64>(),
        r.payload_len,
        "the objects hold the payload"
    );
    assert_eq!(restore_bytes(&s, &id, c).await, snap.encoded());
    // A fresh handle (no cache of any kind) restores the same bytes.
    let fresh = wrapped(raw.clone(), multipart_config());
    assert_eq!(restore_bytes(&fresh, &id, c).await, snap.encoded());

    // The same snapshot under another context: every extent exists with
    // the right size (HEAD), so nothing is uploaded.
    let c2 = ctx(&id, 2, 6144);
    let r2 = publish_base(&s, &id, c2, snap.clone(), RootFormat::V2).await;
    assert_eq!(r2.outcome, PublishOutcome::Created);
    assert_eq!((r2.objects_written, r2.objects_reused), (0, 3), "{r2:?}");
    assert_eq!(Seen::n(&seen.creates), 3, "no upload for reused extents");
    assert_eq!(Seen::n(&seen.parts), 10);
    assert_eq!(restore_bytes(&s, &id, c2).await, snap.encoded());
    assert!(pending_uploads(&bucket_prefix(&raw)).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_in_flight_are_bounded_across_the_extents_of_a_publication() {
    const LIMIT: usize = 3;
    // Slow parts: two extents (8 parts) are written at once, so without the
    // shared bound more than LIMIT parts would be in flight.
    let config = multipart_config().with_parts_in_flight(LIMIT);
    let Some((s, _raw, seen)) = s3_counting(config, Duration::from_millis(150)) else {
        return;
    };
    let (id, snap, c) = big_turn("multipart-bound", 3);
    let r = publish_base(&s, &id, c, snap.clone(), RootFormat::V2).await;
    assert_eq!(r.outcome, PublishOutcome::Created);
    assert_eq!(Seen::n(&seen.parts), 10);
    let max = seen.sending.max();
    assert!(max <= LIMIT, "{max} parts in flight, limit {LIMIT}");
    assert_eq!(max, LIMIT, "parts are sent concurrently, up to the limit");
    assert_eq!(restore_bytes(&s, &id, c).await, snap.encoded());
}

/// Publishes `big(seed)` with a fault armed by `arm`; checks that the
/// publication failed cleanly and left nothing behind. Returns the store and
/// what it needs to publish again.
async fn interrupted(
    seed: u64,
    part_delay: Duration,
    arm: impl FnOnce(&Seen),
) -> Option<(Store, Arc<Snapshot>, ContextDigest)> {
    let (s, raw, seen) = s3_counting(multipart_config(), part_delay)?;
    let prefix = bucket_prefix(&raw);
    let (id, snap, c) = big_turn("multipart-interrupted", seed);
    arm(&seen);
    let err = s
        .publish(flat(&id, c, &snap, RootFormat::V2))
        .await
        .expect_err("a failed upload fails the publication");
    let msg = err.to_string();
    eprintln!("publication error: {msg}");
    assert!(
        msg.contains("multipart upload failed") && msg.contains("aborted"),
        "a clear error: {msg}"
    );
    assert!(msg.contains("injected fault"), "names the cause: {msg}");
    assert!(Seen::n(&seen.aborts) >= 1, "the failed upload was aborted");
    let failed = seen.failed_keys();
    assert_eq!(failed.len(), 1, "one fault injected: {failed:?}");
    let aborted = seen.aborted_keys();
    assert!(aborted.contains(&failed[0]), "{aborted:?} / {failed:?}");
    // Every upload started is finished one way or the other, and the
    // server holds no pending upload under this store's prefix.
    wait_settled(&seen, &prefix).await;
    // Nothing of the failed upload is visible, and no root was written.
    let key = Path::from(failed[0].as_str());
    assert!(
        matches!(
            raw.store.head(&key).await,
            Err(object_store::Error::NotFound { .. })
        ),
        "the failed upload's object is not visible"
    );
    let objects = listed(&s, "objects").await;
    assert!(
        objects.iter().all(|(k, _)| *k != failed[0]),
        "{objects:?} holds {}",
        failed[0]
    );
    assert!(listed(&s, "roots").await.is_empty(), "no root");
    assert_eq!(
        s.list_roots(None).await.expect("roots"),
        Vec::new(),
        "no root"
    );
    Some((s, snap, c))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_part_aborts_the_upload_and_publishes_nothing() {
    interrupted(5, Duration::ZERO, |seen| {
        if let Ok(mut f) = seen.fail_part.lock() {
            *f = Some(2);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_abandoned_while_being_created_is_aborted_too() {
    // The first extent's first part fails (after 300 ms) while the second
    // extent's upload exists on the server but its creation has not
    // answered yet (1 s): the publication gives that extent up mid-create,
    // and its upload must still be aborted, not left pending.
    interrupted(11, Duration::from_millis(300), |seen| {
        if let Ok(mut f) = seen.fail_part.lock() {
            *f = Some(1);
        }
        if let Ok(mut c) = seen.slow_create.lock() {
            *c = Some((2, Duration::from_secs(1)));
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_complete_aborts_the_upload_and_a_retry_publishes() {
    let Some((s, snap, c)) = interrupted(6, Duration::ZERO, |seen| {
        seen.fail_complete.store(true, Ordering::SeqCst);
    })
    .await
    else {
        return;
    };
    // Faults over: publishing again succeeds and restores exactly.
    let id = identity("multipart-interrupted");
    let r = publish_base(&s, &id, c, snap.clone(), RootFormat::V2).await;
    assert_eq!(r.outcome, PublishOutcome::Created);
    assert_eq!(restore_bytes(&s, &id, c).await, snap.encoded());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_object_of_the_wrong_size_is_quarantined_and_replaced() {
    let Some((s, raw, seen)) = s3_counting(multipart_config(), Duration::ZERO) else {
        return;
    };
    let (id, snap, c) = big_turn("multipart-wrong-size", 7);
    publish_base(&s, &id, c, snap.clone(), RootFormat::V2).await;
    // Damage one extent object at rest: the same key, shorter bytes.
    let objects = listed(&s, "objects").await;
    let (victim, size) = objects.first().cloned().expect("an object");
    assert!(size > 5 * MIB, "a multipart-sized extent");
    raw.store
        .put(
            &Path::from(victim.as_str()),
            PutPayload::from(vec![7u8; 1000]),
        )
        .await
        .expect("overwrite");
    let before = Seen::n(&seen.creates);

    // The same snapshot under another context: the damaged extent is
    // quarantined and uploaded again; the other two are reused.
    let c2 = ctx(&id, 8, 6144);
    let r = publish_base(&s, &id, c2, snap.clone(), RootFormat::V2).await;
    assert_eq!(r.outcome, PublishOutcome::Created);
    assert_eq!((r.objects_written, r.objects_reused), (1, 2), "{r:?}");
    assert_eq!(Seen::n(&seen.creates), before + 1, "one upload");
    let meta = raw
        .store
        .head(&Path::from(victim.as_str()))
        .await
        .expect("replaced");
    assert_eq!(meta.size, size, "the right size again");
    let quarantined = listed(&s, "quarantine").await;
    assert!(
        quarantined
            .iter()
            .any(|(k, n)| k.ends_with(&victim) && *n == 1000),
        "the damaged object is in quarantine: {quarantined:?}"
    );
    assert_eq!(restore_bytes(&s, &id, c2).await, snap.encoded());
    assert_eq!(restore_bytes(&s, &id, c).await, snap.encoded());
    assert!(pending_uploads(&bucket_prefix(&raw)).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_extents_and_local_disk_do_not_use_multipart() {
    // On S3, extents no larger than a part are single PUTs.
    if let Some((s, _raw, seen)) = s3_counting(
        multipart_config().with_max_extent_bytes(4 * MIB),
        Duration::ZERO,
    ) {
        let (id, snap, c) = big_turn("multipart-small", 9);
        let r = publish_base(&s, &id, c, snap.clone(), RootFormat::V2).await;
        assert!(r.objects_written >= 9, "{r:?}");
        assert_eq!(Seen::n(&seen.creates), 0, "no multipart upload");
        assert_eq!(restore_bytes(&s, &id, c).await, snap.encoded());
    }
    // Local disk keeps its single durable create, whatever the extent size.
    let dir = tempfile::tempdir().expect("tempdir");
    let raw = raw_backend(&format!("file://{}", dir.path().display()));
    let (s, seen) = counting(&raw, multipart_config(), Duration::ZERO);
    let (id, snap, c) = big_turn("multipart-local", 10);
    publish_base(&s, &id, c, snap.clone(), RootFormat::V2).await;
    assert_eq!(
        Seen::n(&seen.creates),
        0,
        "no multipart upload on local disk"
    );
    assert_eq!(restore_bytes(&s, &id, c).await, snap.encoded());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pending_upload_check_sees_a_pending_upload() {
    // The control for `pending_uploads`: an upload left open is listed,
    // and gone once aborted.
    let Some(url) = s3_url() else {
        return;
    };
    let raw = raw_backend(&url);
    let prefix = bucket_prefix(&raw);
    let key = Path::from("objects/pending-probe");
    let mut u = raw
        .store
        .put_multipart_opts(&key, PutMultipartOptions::default())
        .await
        .expect("start an upload");
    u.put_part(PutPayload::from(vec![1u8; 1024]))
        .await
        .expect("a part");
    let pending = pending_uploads(&prefix);
    assert_eq!(pending, vec![format!("{prefix}/objects/pending-probe")]);
    u.abort().await.expect("abort");
    assert!(pending_uploads(&prefix).is_empty());
}

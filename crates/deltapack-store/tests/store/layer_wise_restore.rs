//! Layer-wise restore: each (group, layer) of a snapshot is handed to the
//! caller as soon as it is proven, before the rest has been read.
//!
//! Why this file exists: handing out bytes before the whole snapshot has
//! been verified is exactly what the rest of the store never does, so the
//! one rule that makes it safe — a layer leaves only after its bytes
//! matched the stream digest its authenticated root records — is guarded
//! here from every side: every layer handed out equals the published bytes
//! (flat roots, chains of 1, 4 and 64 turns, local disk, a remote-like
//! store, S3); a layer whose object is still being read is not handed out,
//! while the layers that do not need that object are; a flipped byte in a
//! layer means that layer never leaves, the others do, and the call is a
//! miss naming the object (quarantined only after the usual two failed
//! checks); the buffer after a miss holds the proven layers and zeros; roots
//! without stream digests (legacy v1) fall back to whole verification and
//! then hand out every layer, in the caller's order; keyed stores refuse
//! forged roots before anything is handed out; bad arguments are errors
//! found before any byte is read; the `Stream` form gives the same.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use deltapack_format::{CacheIdentity, ContextDigest, Snapshot};
use deltapack_store::wrap::{Intercept, Wrapped};
use deltapack_store::{
    keys, ChainPolicy, LayerEvent, LayerOrder, LayerProof, LayerReady, RestoreIntoOutcome,
    RestoreOptions, RootFormat, RootStatus, Store, StoreConfig,
};
use futures::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetResult, ObjectStore, ObjectStoreExt, PutPayload};

/// Every restore here is bounded: a lost wake-up must fail, not hang.
const LIMIT: Duration = Duration::from_secs(60);

/// Small extents (every layer spans several) and chains of any length.
fn layered_config() -> StoreConfig {
    config().with_chain(ChainPolicy::unbounded())
}

/// What one layer-wise restore handed out, and how it ended.
struct Layers {
    outcome: RestoreIntoOutcome,
    got: Vec<(LayerReady, Vec<u8>)>,
    buf: Vec<u8>,
}

async fn restore_layers(
    store: &Store,
    id: &CacheIdentity,
    c: ContextDigest,
    len: usize,
    order: &LayerOrder,
) -> Layers {
    let mut buf = vec![0xAAu8; len];
    let mut got = Vec::new();
    let outcome = tokio::time::timeout(
        LIMIT,
        store.restore_layers_with(
            (id, c),
            &mut buf,
            RestoreOptions::default(),
            order,
            |r, b| got.push((r.clone(), b.to_vec())),
        ),
    )
    .await
    .expect("the layer-wise restore finished")
    .expect("restore_layers_with");
    Layers { outcome, got, buf }
}

/// Every stream's range in `s`'s encoding (payload order).
fn ranges(s: &Snapshot) -> Vec<std::ops::Range<u64>> {
    let p = s.header().encode_prefix().expect("prefix").len() as u64;
    deltapack_format::layer_digest::stream_ranges(s.header(), p).expect("ranges")
}

/// `(group, layer)` of every stream of `s`, payload order.
fn names(s: &Snapshot) -> Vec<(usize, usize)> {
    deltapack_format::layer_digest::stream_layers(s.header())
}

/// Each layer handed out names its place, carries `proof`, equals the
/// published bytes, and comes once; with `all`, every layer came.
fn assert_layers_are(l: &Layers, want: &Snapshot, proof: LayerProof, all: bool, what: &str) {
    let (rs, ns) = (ranges(want), names(want));
    let mut seen = vec![false; rs.len()];
    for (r, bytes) in &l.got {
        assert!(
            !seen[r.stream],
            "{what}: stream {} handed out twice",
            r.stream
        );
        seen[r.stream] = true;
        assert_eq!(r.range, rs[r.stream], "{what}: stream {}'s range", r.stream);
        assert_eq!(
            (r.group, r.layer),
            ns[r.stream],
            "{what}: stream {}",
            r.stream
        );
        assert_eq!(r.proof, proof, "{what}: stream {}", r.stream);
        let (a, b) = (r.range.start as usize, r.range.end as usize);
        assert!(
            bytes[..] == want.encoded()[a..b],
            "{what}: stream {} handed out other bytes than published",
            r.stream
        );
        assert!(
            l.buf[a..b] == want.encoded()[a..b],
            "{what}: stream {} in the buffer",
            r.stream
        );
    }
    if all {
        assert!(seen.iter().all(|s| *s), "{what}: not every layer came");
    }
}

fn assert_hit(l: &Layers, want: &Snapshot, proof: LayerProof, what: &str) {
    assert!(
        matches!(l.outcome, RestoreIntoOutcome::Hit { .. }),
        "{what}: {:?}",
        l.outcome
    );
    assert_layers_are(l, want, proof, true, what);
    assert!(l.buf == want.encoded(), "{what}: the whole buffer");
}

/// A conversation of `turns` turns (a flat root, then deltas) of the tiny
/// preset, each turn 256 tokens longer; its contexts and snapshots.
async fn conversation(
    store: &Store,
    id: &CacheIdentity,
    seed: u64,
    first: u64,
    turns: usize,
) -> Vec<(ContextDigest, Arc<Snapshot>)> {
    let mut out: Vec<(ContextDigest, Arc<Snapshot>)> = Vec::new();
    for i in 0..=turns {
        let tokens = first + 256 * i as u64;
        let (c, s) = (ctx(id, seed, tokens as usize), turn(seed, tokens));
        match out.last() {
            None => {
                publish_base(store, id, c, s.clone(), RootFormat::V2).await;
            }
            Some((bc, b)) => {
                publish_delta(store, id, c, s.clone(), *bc, b.clone(), RootFormat::V2).await;
            }
        }
        out.push((c, s));
    }
    out
}

/// A handle on the same stored bytes with no verified base in memory (for
/// `memory://`, the same handle: its bytes live in it).
fn reopened(t: &TestStore) -> Store {
    match &t._dir {
        Some(d) => Store::open(&format!("file://{}", d.path().display()), layered_config())
            .expect("reopen"),
        None => t.store.clone(),
    }
}

async fn proven_layers_on(on: Scratch) {
    let Some(t) = on.store(layered_config()) else {
        return;
    };
    let id = identity("layers-proven");
    let flat = conversation(&t.store, &id, 3, 16_384, 0).await;
    let chain = conversation(&t.store, &id, 4, 8_192, 64).await;
    let orders = [
        LayerOrder::default(),
        LayerOrder::GroupMajor,
        LayerOrder::Custom(vec![(1, 0), (0, 1)]),
    ];
    let cases: Vec<(&str, &(ContextDigest, Arc<Snapshot>))> = vec![
        ("flat", &flat[0]),
        ("chain of 1", &chain[1]),
        ("chain of 4", &chain[4]),
        ("chain of 64", &chain[64]),
    ];
    for (what, (c, want)) in cases {
        for order in &orders {
            let s = reopened(&t);
            let l = restore_layers(&s, &id, *c, want.encoded().len(), order).await;
            let what = format!("{} {what}, {order:?}", t.name);
            assert_hit(&l, want, LayerProof::StreamDigest, &what);
        }
    }
    // The bottom held in memory (a handle that restored turn 3 serves
    // turn 4's bottom from its verified-base cache) gives the same.
    let s = reopened(&t);
    let (c3, _) = &chain[3];
    let kept = s
        .restore((&id, *c3), Default::default())
        .await
        .expect("restore");
    assert!(kept.hit().is_some());
    let (c4, want) = &chain[4];
    let l = restore_layers(&s, &id, *c4, want.encoded().len(), &LayerOrder::default()).await;
    assert_hit(&l, want, LayerProof::StreamDigest, "bottom in memory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_handed_out_is_the_published_layer_local() {
    proven_layers_on(Scratch::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_handed_out_is_the_published_layer_remote_like() {
    proven_layers_on(Scratch::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_handed_out_is_the_published_layer_s3() {
    proven_layers_on(Scratch::S3).await;
}

/// Every stored object whose bytes contain `needle`.
async fn objects_containing(store: &Store, needle: &[u8]) -> Vec<String> {
    use futures::TryStreamExt;
    let listed: Vec<object_store::ObjectMeta> = store
        .object_store()
        .list(Some(&Path::from("objects")))
        .try_collect()
        .await
        .expect("list");
    let mut out = Vec::new();
    for p in listed.into_iter().map(|m| m.location) {
        let bytes = stored(store.object_store().as_ref(), &p).await;
        if bytes.windows(needle.len()).any(|w| w == needle) {
            out.push(p.to_string());
        }
    }
    out
}

/// A layer that holds every GET of some objects until released (or until
/// [`HOLD_PATIENCE`] passed, which the test then reports).
#[derive(Debug)]
struct Hold {
    inner: Arc<dyn ObjectStore>,
    keys: Mutex<Vec<String>>,
    released: AtomicBool,
    gave_up: AtomicBool,
}

const HOLD_PATIENCE: Duration = Duration::from_secs(20);

#[async_trait::async_trait]
impl Intercept for Hold {
    deltapack_store::layer_basics!("Hold");

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let held = self
            .keys
            .lock()
            .is_ok_and(|k| k.iter().any(|k| k == location.as_ref()));
        if held {
            let start = std::time::Instant::now();
            while !self.released.load(Ordering::SeqCst) {
                if start.elapsed() > HOLD_PATIENCE {
                    self.gave_up.store(true, Ordering::SeqCst);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        self.inner.get_opts(location, options).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_is_handed_out_only_once_its_own_bytes_arrived() {
    let hold = Arc::new(Wrapped(Hold {
        inner: raw_backend("memory://").store,
        keys: Mutex::new(Vec::new()),
        released: AtomicBool::new(false),
        gave_up: AtomicBool::new(false),
    }));
    let store = memory_kind(hold.clone() as Arc<dyn ObjectStore>, layered_config());
    let id = identity("layers-hold");
    for (what, turns, seed) in [("flat", 0usize, 11), ("chain of 4", 4, 12)] {
        let conv = conversation(&store, &id, seed, 16_384, turns).await;
        let (c, want) = conv.last().expect("turn");
        // Hold every object that holds the page in the middle of stream 1
        // (group 0, layer 1) of the result: only that layer needs them
        // (extents are 4 KiB, pages 1 KiB, layers 32 KiB).
        let rs = ranges(want);
        let mid = ((rs[1].start + rs[1].end) / 2 / 1024 * 1024) as usize;
        let page = &want.encoded()[mid..mid + 1024];
        let held = objects_containing(&store, page).await;
        assert!(!held.is_empty(), "{what}: no object holds the page");
        *hold.keys.lock().expect("keys") = held;
        hold.released.store(false, Ordering::SeqCst);
        let mut buf = vec![0u8; want.encoded().len()];
        let mut order_seen = Vec::new();
        let hold_ref = hold.clone();
        // A fresh handle over the same objects: no verified base in memory
        // (the publishing handle may serve the bottom from its cache).
        let reader = memory_kind(hold.clone() as Arc<dyn ObjectStore>, layered_config());
        let outcome = tokio::time::timeout(
            LIMIT,
            reader.restore_layers_with(
                (&id, *c),
                &mut buf,
                RestoreOptions::default(),
                &LayerOrder::GroupMajor,
                |r, _| {
                    let released = hold_ref.released.load(Ordering::SeqCst);
                    order_seen.push((r.stream, released));
                    // Every layer but the held one is out: release it.
                    if order_seen.len() == rs.len() - 1 {
                        hold_ref.released.store(true, Ordering::SeqCst);
                    }
                },
            ),
        )
        .await
        .expect("finished")
        .expect("restore");
        assert!(
            matches!(outcome, RestoreIntoOutcome::Hit { .. }),
            "{what}: {outcome:?}"
        );
        assert!(
            !hold.gave_up.load(Ordering::SeqCst),
            "{what}: the other layers were not handed out while one object was held: {order_seen:?}"
        );
        assert_eq!(order_seen.len(), rs.len(), "{what}: {order_seen:?}");
        for (stream, released) in &order_seen {
            assert_eq!(
                *released,
                *stream == 1,
                "{what}: stream {stream} handed out {} the held object was released ({order_seen:?})",
                if *released { "after" } else { "before" }
            );
        }
        assert!(buf == want.encoded(), "{what}: buffer");
    }
}

/// Flips one stored byte of `key` (read, flip, write back through the
/// backend: a real file on disk, a real object on S3).
async fn flip_stored_byte(store: &Store, key: &Path, at: usize) {
    let mut bytes = stored(store.object_store().as_ref(), key).await.to_vec();
    bytes[at] ^= 0x10;
    store
        .object_store()
        .put(key, PutPayload::from(bytes))
        .await
        .expect("put");
}

async fn flipped_byte_in_layer_on(on: Scratch) {
    let Some(t) = on.store(layered_config()) else {
        return;
    };
    let id = identity("layers-flip");
    for (what, turns, seed) in [("flat", 0usize, 21), ("chain of 4", 4, 22)] {
        let conv = conversation(&t.store, &id, seed, 16_384, turns).await;
        let (c, want) = conv.last().expect("turn");
        let rs = ranges(want);
        // A flat root: damage the object holding a byte near the end of
        // stream 1 (group 0, layer 1). A chain: the last byte of the top
        // delta's last extent, which is the last byte of the newest turn's
        // recurrent checkpoint (stream 2), a byte the result needs.
        let RootStatus::Found(root) = t.store.peek_root(&id.namespace(), c).await.expect("root")
        else {
            panic!("no root")
        };
        let deltapack_format::DecodedRoot::V2(m) = *root else {
            panic!("not v2")
        };
        let (key, off, damaged) = if turns == 0 {
            let at = rs[1].end - 100;
            let e = m
                .extents
                .iter()
                .find(|e| e.offset <= at && at < e.offset + e.raw_len)
                .expect("extent");
            (
                keys::object_key(&e.object_digest()),
                (at - e.offset) as usize,
                1,
            )
        } else {
            let e = m.extents.last().expect("extent");
            (
                keys::object_key(&e.object_digest()),
                e.raw_len as usize - 1,
                2,
            )
        };
        flip_stored_byte(&t.store, &key, off).await;
        let s = reopened(&t);
        let before = s.stats().quarantined;
        let l = restore_layers(&s, &id, *c, want.encoded().len(), &LayerOrder::GroupMajor).await;
        s.settle_quarantines().await;
        let what = format!("{} {what}", t.name);
        let RestoreIntoOutcome::Miss { reason } = &l.outcome else {
            panic!("{what}: damaged layer restored: {:?}", l.outcome)
        };
        assert_eq!(reason.label(), "corrupt", "{what}: {reason}");
        assert_eq!(
            reason.object().map(|o| o.path()),
            Some(key.clone()),
            "{what}: {reason}"
        );
        // Proven at rest (read twice): quarantined.
        assert_eq!(s.stats().quarantined, before + 1, "{what}");
        // Every layer handed out is the published one; the damaged one
        // (the one whose bytes differ in the stored object) never came, and
        // at least one other did.
        assert_layers_are(&l, want, LayerProof::StreamDigest, false, &what);
        assert!(!l.got.is_empty(), "{what}: no layer was handed out");
        assert!(l.got.len() < rs.len(), "{what}: every layer was handed out");
        assert!(l.got.iter().all(|(r, _)| r.stream != damaged), "{what}");
        assert!(l.got.iter().any(|(r, _)| r.stream == 0), "{what}");
        // The buffer: proven layers, zeros elsewhere.
        let mut expect = vec![0u8; want.encoded().len()];
        for (r, _) in &l.got {
            let (a, b) = (r.range.start as usize, r.range.end as usize);
            expect[a..b].copy_from_slice(&want.encoded()[a..b]);
        }
        assert!(l.buf == expect, "{what}: the buffer after the miss");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_layer_keeps_that_layer_back_local() {
    flipped_byte_in_layer_on(Scratch::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_layer_keeps_that_layer_back_s3() {
    flipped_byte_in_layer_on(Scratch::S3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_roots_are_verified_whole_then_handed_out_in_order() {
    let t = local(layered_config());
    let id = identity("layers-v1");
    let (ca, a) = (ctx(&id, 5, 4096), turn(5, 4096));
    let (cb, b) = (ctx(&id, 5, 8192), turn(5, 8192));
    publish_base(&t.store, &id, ca, a.clone(), RootFormat::V1).await;
    publish_delta(&t.store, &id, cb, b.clone(), ca, a.clone(), RootFormat::V1).await;
    let order = LayerOrder::Custom(vec![(1, 0), (0, 1)]);
    for (c, want) in [(ca, &a), (cb, &b)] {
        let l = restore_layers(&reopened(&t), &id, c, want.encoded().len(), &order).await;
        assert_hit(&l, want, LayerProof::WholeSnapshot, "v1");
        // Sequential after the whole check: exactly the caller's order,
        // the layers it left out following in payload order.
        let streams: Vec<usize> = l.got.iter().map(|(r, _)| r.stream).collect();
        assert_eq!(streams, vec![2, 1, 0], "v1 order");
        // An order the layout does not have: an error, no layer handed out.
        let mut buf = vec![0u8; want.encoded().len()];
        let mut n = 0;
        let bad = LayerOrder::Custom(vec![(0, 9)]);
        let r = reopened(&t)
            .restore_layers_with((&id, c), &mut buf, Default::default(), &bad, |_, _| n += 1)
            .await;
        assert!(r.is_err(), "v1, a bad order: {r:?}");
        assert_eq!(n, 0, "v1, a bad order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_stores_refuse_forged_roots_before_any_layer() {
    let t = local(layered_config().with_mac_secret(Some(b"layer secret".to_vec())));
    let url = format!("file://{}", t._dir.as_ref().expect("dir").path().display());
    let id = identity("layers-keyed");
    let conv = conversation(&t.store, &id, 8, 8_192, 2).await;
    let (c, want) = conv.last().expect("turn");
    let l = restore_layers(
        &t.store,
        &id,
        *c,
        want.encoded().len(),
        &LayerOrder::default(),
    )
    .await;
    assert_hit(&l, want, LayerProof::StreamDigest, "keyed");
    // Someone with write access but no key publishes a root.
    let attacker = Store::open(&url, layered_config()).expect("open");
    let (cf, forged) = (ctx(&id, 9, 4096), turn(9, 4096));
    publish_base(&attacker, &id, cf, forged.clone(), RootFormat::V2).await;
    let l = restore_layers(
        &t.store,
        &id,
        cf,
        forged.encoded().len(),
        &LayerOrder::default(),
    )
    .await;
    let RestoreIntoOutcome::Miss { reason } = &l.outcome else {
        panic!("a forged root was restored: {:?}", l.outcome)
    };
    assert_eq!(reason.label(), "unauthenticated", "{reason}");
    assert!(l.got.is_empty(), "a layer of a forged root was handed out");
    assert!(l.buf.iter().all(|b| *b == 0xAA), "the buffer was touched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_errors_before_any_byte_is_read() {
    let t = local(layered_config());
    let id = identity("layers-bad");
    let conv = conversation(&t.store, &id, 2, 4_096, 1).await;
    let (c, want) = conv.last().expect("turn");
    let len = want.encoded().len();
    let bad_orders = [
        LayerOrder::Custom(vec![(0, 0), (0, 0)]),
        LayerOrder::Custom(vec![(0, 2)]),
        LayerOrder::Custom(vec![(7, 0)]),
    ];
    for order in &bad_orders {
        let mut buf = vec![0xAAu8; len];
        let mut n = 0;
        let r = t
            .store
            .restore_layers_with((&id, *c), &mut buf, Default::default(), order, |_, _| {
                n += 1
            })
            .await;
        assert!(r.is_err(), "{order:?}: {r:?}");
        assert_eq!(n, 0, "{order:?}");
    }
    for wrong in [len - 1, len + 1, 0] {
        let mut buf = vec![0xAAu8; wrong];
        let mut n = 0;
        let r = t
            .store
            .restore_layers_with(
                (&id, *c),
                &mut buf,
                Default::default(),
                &LayerOrder::default(),
                |_, _| n += 1,
            )
            .await;
        assert!(r.is_err(), "{wrong} bytes: {r:?}");
        assert_eq!(n, 0);
        assert!(
            buf.iter().all(|b| *b == 0xAA),
            "{wrong} bytes: the buffer was touched"
        );
    }
    // An absent root and a deadline already past: misses, buffer untouched.
    let mut opts = RestoreOptions::default();
    opts.deadline = Some(tokio::time::Instant::now());
    for (key, opts, label) in [
        (ctx(&id, 99, 4096), RestoreOptions::default(), "absent"),
        (*c, opts, "deadline-exceeded"),
    ] {
        let mut buf = vec![0xAAu8; len];
        let out = t
            .store
            .restore_layers_with(
                (&id, key),
                &mut buf,
                opts,
                &LayerOrder::default(),
                |_, _| panic!("a layer was handed out"),
            )
            .await
            .expect("restore");
        let RestoreIntoOutcome::Miss { reason } = out else {
            panic!("{label}: {out:?}")
        };
        assert_eq!(reason.label(), label);
        assert!(
            buf.iter().all(|b| *b == 0xAA),
            "{label}: the buffer was touched"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_form_hands_out_the_same_layers() {
    let t = memory(layered_config());
    let id = identity("layers-stream");
    let conv = conversation(&t.store, &id, 6, 8_192, 4).await;
    let (c, want) = conv.last().expect("turn");
    let mut stream = t.store.restore_layers(
        (&id, *c),
        vec![0u8; want.encoded().len()],
        Default::default(),
        LayerOrder::default(),
    );
    let rs = ranges(want);
    let mut seen = vec![false; rs.len()];
    let mut done = None;
    while let Some(ev) = tokio::time::timeout(LIMIT, stream.next())
        .await
        .expect("next")
    {
        match ev.expect("event") {
            LayerEvent::Ready(r) => {
                assert!(done.is_none(), "a layer after the final item");
                let bytes = stream.layer(&r).expect("its bytes");
                let (a, b) = (r.range.start as usize, r.range.end as usize);
                assert!(bytes == &want.encoded()[a..b], "stream {}", r.stream);
                assert!(!std::mem::replace(&mut seen[r.stream], true));
            }
            LayerEvent::Done(out) => done = Some(out),
        }
    }
    assert!(
        matches!(done, Some(RestoreIntoOutcome::Hit { .. })),
        "{done:?}"
    );
    assert!(seen.iter().all(|s| *s));
    let buf = stream.into_buffer().await.expect("buffer");
    assert!(buf == want.encoded());
}

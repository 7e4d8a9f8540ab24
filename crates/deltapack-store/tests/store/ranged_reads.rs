//! Ranged reads verify: an extent read from a remote backend as concurrent
//! ranged GETs is bit-exact, and a backend that answers a range wrongly
//! never gets a wrong byte handed out.
//!
//! Object stores cap the bandwidth of one connection, so a restore reads
//! every raw extent as aligned ranges, fetched concurrently, each hashed as
//! its own BLAKE3 subtree and the range names merged into the extent's name
//! before the extent counts as verified. What can go wrong is new: a range
//! returned short or long, a different range than asked, a flipped bit in
//! one range of many, ranges failing at random. This file guards that each
//! is caught (a one-off fault costs a re-read, not the restore; persistent
//! damage is a miss, and only damage at rest is quarantined), that the
//! budget of ranges in flight holds, and that chains (the deferred pass,
//! which reads ranges unchecked and verifies the result) read ranges too.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use deltapack_store::wrap::{Intercept, ReadHead, Wrapped};
use futures::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetResult, ObjectStore, Result};

use crate::common::*;
use deltapack_store::{Backend, BackendKind, RestoreOutcome, RootFormat, Store, StoreConfig};

/// How a misbehaving backend answers a ranged GET of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mischief {
    /// One byte short.
    Short,
    /// One byte too many.
    Long,
    /// The bytes asked for, but the response claims another range.
    Shifted,
    /// The bytes of the range one further on (same length, wrong bytes).
    Misplaced,
    /// One bit flipped.
    Flip,
}

impl Mischief {
    const ALL: [Mischief; 5] = [
        Mischief::Short,
        Mischief::Long,
        Mischief::Shifted,
        Mischief::Misplaced,
        Mischief::Flip,
    ];
}

/// Forwards to a real backend; counts object GETs (ranged or not) and the
/// most in flight at once; answers ranged object GETs wrongly when told;
/// delivers bodies in 300-byte chunks, so ranges span several chunks.
#[derive(Debug)]
struct Ranges {
    inner: Arc<dyn ObjectStore>,
    delay: Duration,
    gets: AtomicUsize,
    ranged: AtomicUsize,
    in_flight: InFlight,
    /// The mischief and how many more ranged GETs it applies to.
    mischief: Mutex<Option<(Mischief, u64)>>,
    /// Fail this fraction of ranged object GETs (deterministic from a
    /// counter).
    fail_per_mille: AtomicU64,
    draws: AtomicU64,
    seed: u64,
}

impl Ranges {
    fn new(inner: Arc<dyn ObjectStore>, delay: Duration) -> Arc<Wrapped<Self>> {
        Arc::new(Wrapped(Ranges {
            inner,
            delay,
            gets: AtomicUsize::new(0),
            ranged: AtomicUsize::new(0),
            in_flight: InFlight::default(),
            mischief: Mutex::new(None),
            fail_per_mille: AtomicU64::new(0),
            draws: AtomicU64::new(0),
            seed: 0x5eed,
        }))
    }

    fn arm(&self, m: Mischief, times: u64) {
        *self.mischief.lock().expect("lock") = Some((m, times));
    }

    fn take(&self) -> Option<Mischief> {
        let mut g = self.mischief.lock().expect("lock");
        match g.as_mut() {
            Some((m, n)) if *n > 0 => {
                *n -= 1;
                Some(*m)
            }
            _ => None,
        }
    }

    fn fails(&self) -> bool {
        let p = self.fail_per_mille.load(Ordering::SeqCst);
        if p == 0 {
            return false;
        }
        let i = self.draws.fetch_add(1, Ordering::SeqCst);
        mix64(self.seed ^ i.wrapping_mul(GOLDEN_GAMMA)) % 1000 < p
    }
}

#[async_trait::async_trait]
impl Intercept for Ranges {
    deltapack_store::layer_basics!("Ranges");

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let object = location.as_ref().starts_with("objects/") && !options.head;
        if !object {
            return self.inner.get_opts(location, options).await;
        }
        self.gets.fetch_add(1, Ordering::SeqCst);
        let asked = options.range.clone();
        let ranged = asked.is_some();
        if ranged {
            self.ranged.fetch_add(1, Ordering::SeqCst);
        }
        self.in_flight.enter();
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let mischief = if ranged { self.take() } else { None };
        let fail = ranged && self.fails();
        let r = self.inner.get_opts(location, options).await;
        self.in_flight.leave();
        if fail {
            return Err(object_store::Error::Generic {
                store: "ranges",
                source: "injected ranged GET failure".into(),
            });
        }
        let r = r?;
        let (mut reply, body) = ReadHead::read(r).await?;
        let (meta, range) = (&reply.meta, &mut reply.range);
        let mut body = body.to_vec();
        match mischief {
            Some(Mischief::Short) => {
                body.pop();
            }
            Some(Mischief::Long) => body.push(0),
            Some(Mischief::Shifted) => *range = range.start + 1..range.end + 1,
            Some(Mischief::Misplaced) => {
                // The same number of bytes from one range further on (or
                // back, at the end of the object): right length, right
                // claimed range, wrong bytes.
                let len = range.end - range.start;
                let start = if range.end + len <= meta.size {
                    range.end
                } else {
                    range.start.saturating_sub(len)
                };
                let other = GetOptions::default().with_range(Some(start..start + len));
                body = self
                    .inner
                    .get_opts(location, other)
                    .await?
                    .bytes()
                    .await?
                    .to_vec();
            }
            Some(Mischief::Flip) => {
                let i = body.len() / 2;
                if let Some(b) = body.get_mut(i) {
                    *b ^= 0x10;
                }
            }
            None => {}
        }
        let chunks: Vec<Result<Bytes>> = body
            .chunks(300)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        Ok(reply.stream(futures::stream::iter(chunks).boxed()))
    }
}

/// 8 KiB extents read in 1 KiB ranges (8 per extent), at most 6 ranges in
/// flight.
fn ranged_config() -> StoreConfig {
    StoreConfig::default()
        .with_max_extent_bytes(8 << 10)
        .with_range_bytes(1 << 10)
        .with_ranges_in_flight(6)
        .with_chain(deltapack_store::ChainPolicy::unbounded())
}

/// A fresh handle (no base cache) over `ranges`, as a memory backend.
fn handle(ranges: &Arc<Wrapped<Ranges>>, config: StoreConfig) -> Store {
    Store::from_backend(
        Backend {
            store: ranges.clone(),
            kind: BackendKind::Memory,
        },
        config,
    )
    .expect("store")
}

struct World {
    raw: Arc<dyn ObjectStore>,
    ranges: Arc<Wrapped<Ranges>>,
    id: deltapack_format::CacheIdentity,
    base: (
        deltapack_format::ContextDigest,
        Arc<deltapack_format::Snapshot>,
    ),
    top: (
        deltapack_format::ContextDigest,
        Arc<deltapack_format::Snapshot>,
    ),
}

/// A flat root and a delta over it, published through a plain handle.
async fn world(salt: &str, delay: Duration) -> World {
    let raw = raw_backend("memory://").store;
    let ranges = Ranges::new(raw.clone(), delay);
    let store = handle(&ranges, ranged_config());
    let id = identity(salt);
    let base = (ctx(&id, 9, 24576), turn(9, 24576));
    let top = (ctx(&id, 9, 28672), turn(9, 28672));
    assert!(
        base.1.encoded().len() > 8 * (8 << 10),
        "the base spans several extents ({} bytes)",
        base.1.encoded().len()
    );
    publish_base(&store, &id, base.0, base.1.clone(), RootFormat::V2).await;
    publish_delta(
        &store,
        &id,
        top.0,
        top.1.clone(),
        base.0,
        base.1.clone(),
        RootFormat::V2,
    )
    .await;
    World {
        raw,
        ranges,
        id,
        base,
        top,
    }
}

async fn outcome(s: &Store, w: &World, which: deltapack_format::ContextDigest) -> RestoreOutcome {
    s.restore((&w.id, which), Default::default())
        .await
        .expect("restore")
}

async fn quarantined(raw: &Arc<dyn ObjectStore>) -> usize {
    raw.list(Some(&Path::from("quarantine")))
        .collect::<Vec<_>>()
        .await
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranged_restores_are_bit_exact_and_keep_the_budget() {
    let w = world("ranged-exact", Duration::from_millis(3)).await;
    let s = handle(&w.ranges, ranged_config());
    let before = w.ranges.ranged.load(Ordering::SeqCst);
    match outcome(&s, &w, w.base.0).await {
        RestoreOutcome::Hit(r) => assert_eq!(r.snapshot.encoded(), w.base.1.encoded()),
        RestoreOutcome::Miss(m) => panic!("flat restore missed: {m}"),
    }
    let ranged = w.ranges.ranged.load(Ordering::SeqCst) - before;
    let extents_of_base = w.base.1.encoded().len().div_ceil(8 << 10);
    assert!(
        ranged >= 8 * (extents_of_base - 1),
        "{ranged} ranged GETs for {extents_of_base} extents of 8 ranges"
    );
    let max = w.ranges.in_flight.max();
    assert!(max <= 6, "{max} GETs in flight, the budget is 6");
    assert!(max >= 2, "ranges were fetched one at a time ({max})");

    // The chain, cold (a fresh handle: no base cache), and its result
    // through `restore_into`.
    let s = handle(&w.ranges, ranged_config());
    match outcome(&s, &w, w.top.0).await {
        RestoreOutcome::Hit(r) => assert_eq!(r.snapshot.encoded(), w.top.1.encoded()),
        RestoreOutcome::Miss(m) => panic!("chain restore missed: {m}"),
    }
    let s = handle(&w.ranges, ranged_config());
    let mut buf = vec![0u8; w.top.1.encoded().len()];
    let got = s
        .restore_into((&w.id, w.top.0), &mut buf, Default::default())
        .await
        .expect("restore_into");
    s.settle_quarantines().await;
    assert!(
        matches!(got, deltapack_store::RestoreIntoOutcome::Hit { .. }),
        "restore_into missed: {got:?}"
    );
    assert_eq!(&buf[..], w.top.1.encoded());
    assert!(w.ranges.in_flight.max() <= 6);
    assert_eq!(quarantined(&w.raw).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_answer_once_costs_a_reread_not_the_restore() {
    for m in Mischief::ALL {
        let w = world(&format!("ranged-once-{m:?}"), Duration::ZERO).await;
        for (which, want) in [(w.base.0, &w.base.1), (w.top.0, &w.top.1)] {
            w.ranges.arm(m, 1);
            let s = handle(&w.ranges, ranged_config());
            let got = outcome(&s, &w, which).await;
            s.settle_quarantines().await;
            match got {
                RestoreOutcome::Hit(r) => assert_eq!(r.snapshot.encoded(), want.encoded(), "{m:?}"),
                RestoreOutcome::Miss(miss) => panic!("{m:?} once: missed {miss}"),
            }
            assert!(w.ranges.take().is_none(), "{m:?} was never served");
        }
        assert_eq!(quarantined(&w.raw).await, 0, "{m:?} once quarantined");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_keeps_answering_wrongly_never_hands_out_wrong_bytes() {
    for m in Mischief::ALL {
        let w = world(&format!("ranged-always-{m:?}"), Duration::ZERO).await;
        w.ranges.arm(m, u64::MAX);
        let s = handle(&w.ranges, ranged_config());
        let r = s.restore((&w.id, w.base.0), Default::default()).await;
        s.settle_quarantines().await;
        match (m, r) {
            // Wrong lengths and ranges are the backend's failure: an error,
            // and nothing at rest is blamed.
            (Mischief::Short | Mischief::Long | Mischief::Shifted, Err(_)) => {
                assert_eq!(quarantined(&w.raw).await, 0, "{m:?} quarantined");
            }
            // Wrong bytes of the right length are what damage at rest
            // looks like: a corrupt miss, proven by the re-read.
            (Mischief::Misplaced | Mischief::Flip, Ok(RestoreOutcome::Miss(miss))) => {
                assert_eq!(miss.label(), "corrupt", "{m:?}: {miss}");
                assert_eq!(quarantined(&w.raw).await, 1, "{m:?}: the extent is proven");
            }
            (m, r) => panic!("{m:?} always: unexpected {r:?}"),
        }
        w.ranges.arm(m, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_range_failures_restore_exactly_or_fail_cleanly() {
    let w = world("ranged-random", Duration::ZERO).await;
    let (mut hits, mut failed) = (0, 0);
    for per_mille in [20u64, 100, 300] {
        w.ranges.fail_per_mille.store(per_mille, Ordering::SeqCst);
        for (which, want) in [(w.base.0, &w.base.1), (w.top.0, &w.top.1)] {
            for _ in 0..3 {
                let s = handle(&w.ranges, ranged_config());
                let got = s.restore((&w.id, which), Default::default()).await;
                s.settle_quarantines().await;
                match got {
                    Ok(RestoreOutcome::Hit(r)) => {
                        assert_eq!(r.snapshot.encoded(), want.encoded());
                        hits += 1;
                    }
                    Ok(RestoreOutcome::Miss(m)) => {
                        panic!("transient failures must not be a miss: {m}")
                    }
                    Err(_) => failed += 1,
                }
            }
        }
    }
    w.ranges.fail_per_mille.store(0, Ordering::SeqCst);
    assert!(hits > 0, "no restore got through ({failed} failed)");
    assert_eq!(
        quarantined(&w.raw).await,
        0,
        "transient failures quarantined"
    );
    // Everything is still there and sound.
    let s = handle(&w.ranges, ranged_config());
    assert_eq!(restore_bytes(&s, &w.id, w.top.0).await, w.top.1.encoded());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranged_reads_against_a_real_s3_server() {
    let Some(url) = s3_url() else {
        eprintln!("skipped: no S3 server configured");
        return;
    };
    let raw = raw_backend(&url);
    let ranges = Ranges::new(raw.store.clone(), Duration::ZERO);
    let store = Store::from_backend(
        Backend {
            store: ranges.clone(),
            kind: raw.kind.clone(),
        },
        ranged_config(),
    )
    .expect("store");
    let id = identity("ranged-s3");
    let (c, snap) = (ctx(&id, 5, 24576), turn(5, 24576));
    publish_base(&store, &id, c, snap.clone(), RootFormat::V2).await;
    let fresh = Store::from_backend(
        Backend {
            store: ranges.clone(),
            kind: raw.kind.clone(),
        },
        ranged_config(),
    )
    .expect("store");
    assert_eq!(restore_bytes(&fresh, &id, c).await, snap.encoded());
    assert!(ranges.ranged.load(Ordering::SeqCst) >= 16);
}

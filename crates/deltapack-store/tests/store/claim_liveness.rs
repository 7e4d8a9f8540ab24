//! A live collector's delete claims outlast the claim lifetime; a dead
//! collector's lapse (the CLI's `dead_collector` test kills one at every
//! claim step).
//!
//! Why: claims in `deleting` lapse [`CLAIM_TTL`](3 s) after their
//! collector's last heartbeat, so a publisher blocked by a dead collector
//! proceeds within seconds. The other half of that bargain is safety: a
//! collector that is alive but slow — each DELETE taking longer than a
//! claim's whole lifetime — must keep its claims fresh by its heartbeat,
//! so the publisher that needs the object it is deleting waits for the
//! deletion and writes the object again, instead of deciding the claim
//! lapsed, finding the object still there, relying on it, and losing it
//! to the DELETE a moment later.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deltapack_store::{RootFormat, Store};

use crate::common::faults::SlowDeletes;
use crate::common::*;

/// Longer than a claim lives without renewal (3 s).
const SLOW_DELETE: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_live_collector_keeps_its_claims_and_a_publisher_waits_for_it() {
    let Some(url) = s3_url() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let raw = raw_backend(&url);
    let started = Arc::new(AtomicU64::new(0));
    let slow = deltapack_store::wrap::Wrapped::arc(SlowDeletes {
        inner: raw.store.clone(),
        delay: SLOW_DELETE,
        started: started.clone(),
    });
    // Default extents: the snapshot is one object, deleted in one slow
    // DELETE. Two handles on one ledger: the publisher's keeps condemned
    // objects for an hour (its invalidation collects nothing), the
    // collector's for no time at all.
    let ledger = format!("sqlite://{}", dir.path().join("ledger.sqlite3").display());
    let cfg = |grace| {
        deltapack_store::StoreConfig::default()
            .with_ledger(Some(ledger.clone()))
            .with_grace(grace)
    };
    let store: Store = through(&raw, slow.clone(), cfg(Duration::from_secs(3600)));
    let collector: Store = through(&raw, slow, cfg(Duration::ZERO));
    let id = identity("claim-liveness");
    let snap = turn(31, 1024);
    let (a, b) = (ctx(&id, 31, 1024), ctx(&id, 32, 1024));
    publish_base(&store, &id, a, snap.clone(), RootFormat::V2).await;
    // A is invalidated: its object is condemned, due at once.
    let plan = store
        .invalidate_plan(id.namespace(), Some(a))
        .await
        .expect("plan");
    store.execute(plan).await.expect("invalidate");
    let before = started.load(Ordering::SeqCst);
    let collecting = tokio::spawn(async move { collector.collect_garbage().await });
    // Once the collector's DELETE is under way, publish the same bytes at
    // B: the very object being deleted.
    tokio::time::timeout(Duration::from_secs(60), async {
        while started.load(Ordering::SeqCst) == before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the collector never started its DELETE");
    publish_base(&store, &id, b, snap.clone(), RootFormat::V2).await;
    let gc = tokio::time::timeout(Duration::from_secs(60), collecting)
        .await
        .expect("the collection hung")
        .expect("gc task")
        .expect("the slow collector finished its collection");
    assert!(gc.objects >= 1, "the collector deleted nothing: {gc:?}");
    // The publication waited for the deletion and wrote the object again:
    // B is whole.
    assert_eq!(restore_bytes(&store, &id, b).await, snap.encoded());
}

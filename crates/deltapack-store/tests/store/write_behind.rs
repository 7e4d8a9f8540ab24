//! Write-behind publication: read-your-writes while the queue is full. A
//! context published with `publish_async` restores exactly at every moment —
//! from the buffer before its root is durable, from the store after — the
//! bounded queue never drops work (a full queue publishes inline, counted),
//! and shutdown flushes everything to the store.

use std::time::Duration;

use crate::common::faults::Faulty;
use crate::common::*;
use deltapack_format::{CacheIdentity, ContextDigest};
use deltapack_store::{PublishRequest, RestoreOutcome, RootFormat, WriteBehind};

/// The snapshot `wb` restores for `key`, from its buffer or from the store
/// (a miss fails the test, naming `what`).
async fn restored(wb: &WriteBehind, key: (&CacheIdentity, ContextDigest), what: &str) -> Vec<u8> {
    match wb.restore(key, Default::default()).await.expect("restore") {
        RestoreOutcome::Hit(h) => h.snapshot.encoded().to_vec(),
        RestoreOutcome::Miss(m) => panic!("{what}: a miss: {m}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_your_writes_under_a_full_queue() {
    let dir = tempfile::tempdir().expect("tmp");
    let inner = raw_backend(&format!("file://{}", dir.path().display()));
    // 20 ms per storage operation: the single writer falls behind.
    let slow = Faulty::slowed(inner.store.clone(), Duration::from_millis(20));
    let store = memory_kind(slow, config());
    let wb = WriteBehind::new(store.clone(), 1, 1);
    let id = identity("write-behind");
    let n = 8u64;
    for i in 0..n {
        let snap = turn(90 + i, 2048);
        let c = ctx(&id, 90 + i, 2048);
        wb.publish_async(flat(&id, c, &snap, RootFormat::V2))
            .await
            .expect("publish_async");
        // Immediately readable, whether buffered or already durable.
        let what = format!("context {i} right after publish_async");
        assert_eq!(
            restored(&wb, (&id, c), &what).await,
            snap.encoded(),
            "{what}"
        );
    }
    let mid = wb.report();
    assert!(mid.inline > 0, "a full queue publishes inline: {mid:?}");
    assert!(
        mid.served_from_buffer > 0,
        "some restores were served from the buffer: {mid:?}"
    );
    let report = wb.shutdown().await.expect("shutdown flushes");
    assert_eq!(report.accepted, n);
    assert_eq!(report.written, n, "every publication completed: {report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    // Everything is durable in the store itself.
    let plain = wrapped(inner, config());
    for i in 0..n {
        assert_eq!(
            restore_bytes(&plain, &id, ctx(&id, 90 + i, 2048)).await,
            turn(90 + i, 2048).encoded()
        );
    }
}

/// A conversation published turn after turn through write-behind, with two
/// writers and a queue of one (so some turns publish inline while their
/// base is still queued or being written): every delta waits for its base,
/// nothing fails, and every turn restores exactly from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_chain_publishes_in_order_through_two_writers() {
    let slow = Faulty::slowed(raw_backend("memory://").store, Duration::from_millis(5));
    let store = memory_kind(slow, config());
    let wb = WriteBehind::new(store.clone(), 1, 2);
    let id = identity("write-behind-chain");
    let turns: Vec<_> = (1..=8u64)
        .map(|k| (ctx(&id, 61, (k * 1024) as usize), turn(61, k * 1024)))
        .collect();
    for (i, (c, s)) in turns.iter().enumerate() {
        let base = (i > 0).then(|| deltapack_store::BaseInput {
            context: turns[i - 1].0,
            snapshot: turns[i - 1].1.clone(),
        });
        wb.publish_async(PublishRequest {
            identity: id.clone(),
            context: *c,
            snapshot: s.clone(),
            base,
            format: RootFormat::V2,
        })
        .await
        .expect("publish_async");
    }
    let report = wb.shutdown().await.expect("shutdown");
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.written, turns.len() as u64);
    assert_restores(&store, &id, &turns, "the store").await;
}

/// A publication that can only end in a conflict is refused when it is
/// queued, and the buffer never serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_publication_is_refused_at_enqueue() {
    let store = memory(config()).store;
    let id = identity("write-behind-conflict");
    let c = ctx(&id, 62, 2048);
    let (a, b) = (turn(62, 2048), turn(63, 2048));
    publish_base(&store, &id, c, a.clone(), RootFormat::V2).await;
    let wb = WriteBehind::new(store.clone(), 4, 1);
    let refused = wb.publish_async(flat(&id, c, &b, RootFormat::V2)).await;
    assert!(refused.is_err(), "a conflicting publish_async is refused");
    // The store's root is what a reader sees, never the refused snapshot.
    assert_eq!(
        restored(&wb, (&id, c), "the store's root").await,
        a.encoded()
    );
    // A second buffered snapshot of a context already buffered with other
    // bytes is refused too.
    let c2 = ctx(&id, 64, 2048);
    let slow = WriteBehind::new(store.clone(), 4, 1);
    slow.publish_async(flat(&id, c2, &turn(64, 2048), RootFormat::V2))
        .await
        .expect("first");
    let second = slow
        .publish_async(flat(&id, c2, &turn(65, 2048), RootFormat::V2))
        .await;
    assert!(second.is_err(), "two different snapshots for one context");
    let report = slow.shutdown().await.expect("shutdown");
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let r = wb.shutdown().await.expect("shutdown");
    assert!(r.failed.is_empty(), "{:?}", r.failed);
}

//! Garbage collection running concurrently with publishers never loses a
//! published root. On local disk two store handles share one SQLite ledger
//! (as two processes would): one clears a namespace with a zero grace period
//! — condemning and deleting objects — while the other publishes the same
//! bytes under another namespace, reusing exactly those objects; publication
//! protections must serialise them. Against the real S3 server two handles
//! act as two nodes with separate ledgers: one sweeps (grace period) in a
//! loop while the other publishes chains of deltas.

use std::time::Duration;

use crate::common::*;
use deltapack_store::{RootFormat, Store, SweepOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clear_and_gc_race_publishers_reusing_the_same_objects() {
    let dir = tempfile::tempdir().expect("tmp");
    let url = format!("file://{}", dir.path().display());
    let cfg = || config().with_grace(Duration::ZERO);
    let publisher = Store::open(&url, cfg()).expect("open");
    let collector = Store::open(&url, cfg()).expect("open");
    let (a, b) = (identity("gc-race-a"), identity("gc-race-b"));
    for k in 0..25u64 {
        let snap = turn(200 + k, 4096);
        publish_base(
            &collector,
            &a,
            ctx(&a, 200 + k, 4096),
            snap.clone(),
            RootFormat::V2,
        )
        .await;
        let (p, c) = (publisher.clone(), collector.clone());
        let (b2, a2, snap2) = (b.clone(), a.namespace(), snap.clone());
        let publish = tokio::spawn(async move {
            publish_base(&p, &b2, ctx(&b2, 200 + k, 4096), snap2, RootFormat::V2).await;
        });
        let clear = tokio::spawn(async move {
            c.execute(c.clear_plan(Some(a2)).await.expect("plan"))
                .await
                .expect("clear");
            c.collect_garbage().await.expect("gc");
        });
        publish.await.expect("publisher");
        clear.await.expect("collector");
        collector.collect_garbage().await.expect("gc");
        assert_eq!(
            restore_bytes(&publisher, &b, ctx(&b, 200 + k, 4096)).await,
            snap.encoded(),
            "iteration {k}"
        );
    }
    assert_no_damage(&sweep(&publisher).await, "after the race");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_sweeps_with_grace_never_lose_a_published_root() {
    let Some(url) = s3_url() else { return };
    let node_a = Store::open(&url, config()).expect("open");
    let node_b = Store::open(&url, config()).expect("open");
    let id = identity("gc-s3");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (b, stop2) = (node_b.clone(), stop.clone());
    let gc = tokio::spawn(async move {
        let mut sweeps = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let r = b
                .sweep(&SweepOptions::default().with_grace(Duration::from_secs(2)))
                .await
                .expect("sweep");
            assert_no_damage(&r, "a sweep with grace");
            sweeps += 1;
        }
        sweeps
    });
    let mut published = Vec::new();
    for seed in 0..4u64 {
        let mut prev = None;
        for t in 1..=5u64 {
            let (c, snap) = (
                ctx(&id, 300 + seed, (1024 * t) as usize),
                turn(300 + seed, 1024 * t),
            );
            match prev.take() {
                None => publish_base(&node_a, &id, c, snap.clone(), RootFormat::V2).await,
                Some((pc, ps)) => {
                    publish_delta(&node_a, &id, c, snap.clone(), pc, ps, RootFormat::V2).await
                }
            };
            published.push((c, snap.clone()));
            prev = Some((c, snap));
        }
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sweeps = gc.await.expect("gc");
    assert!(
        sweeps >= 2,
        "the collector ran concurrently ({sweeps} sweeps)"
    );
    let fresh = Store::open(&url, config()).expect("open");
    for (c, snap) in published {
        assert_eq!(restore_bytes(&fresh, &id, c).await, snap.encoded());
    }
}

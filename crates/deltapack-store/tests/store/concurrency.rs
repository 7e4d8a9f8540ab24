//! Concurrency and bounded memory: concurrent writers of one context can
//! never make it alias two snapshots; concurrent restores of one root share
//! one fetch+verify (single flight); a restore never holds more object
//! payloads (ranged GETs) than its configured ranges in flight, and a
//! publication never writes more than
//! PUBLISH_BATCH objects at once; deadlines turn slow restores into misses.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::common::instrumented::Counters;
use crate::common::*;
use deltapack_store::PUBLISH_BATCH;
use deltapack_store::RESTORE_IN_FLIGHT;
use deltapack_store::{
    Backend, MissReason, PublishOutcome, RestoreIntoOutcome, RestoreOptions, RestoreOutcome,
    RootFormat,
};

fn instrumented(inner: Backend, delay: Duration) -> (deltapack_store::Store, Arc<Counters>) {
    common::instrumented::instrumented_store(inner, delay, config())
}

async fn racing_writers(t: TestStore) {
    let id = identity("racing");
    let c = ctx(&id, 21, 2048);
    // Four distinct snapshots, each published by two tasks, half v1.
    let snaps: Vec<_> = (0..4).map(|k| turn(21 + k, 2048)).collect();
    let mut tasks = Vec::new();
    for i in 0..8usize {
        let (s, id, snap) = (t.store.clone(), id.clone(), snaps[i % 4].clone());
        let format = if i % 2 == 0 {
            RootFormat::V2
        } else {
            RootFormat::V1
        };
        tasks.push(tokio::spawn(async move {
            s.publish(flat(&id, c, &snap, format))
                .await
                .map(|r| (r, snap))
        }));
    }
    let mut created = 0;
    let mut winners = HashSet::new();
    let mut results = Vec::new();
    for task in tasks {
        let (r, snap) = task.await.expect("join").expect("publish");
        if r.outcome == PublishOutcome::Created {
            created += 1;
            winners.insert(v2_digest(&snap));
        }
        results.push((r, snap));
    }
    assert_eq!(
        created, 1,
        "{}: exactly one writer creates the root",
        t.name
    );
    let winner = *winners.iter().next().expect("winner");
    // The root's own digest: the winner's, by the definition of the
    // winner's format (layered for v2, of the encoding for v1).
    let root_digest = match t.store.peek_root(&id.namespace(), &c).await.expect("root") {
        deltapack_store::RootStatus::Found(r) => {
            r.summary().expect("summary").result_snapshot_digest
        }
        other => panic!("{other:?}"),
    };
    for (r, snap) in &results {
        match r.outcome {
            PublishOutcome::Created | PublishOutcome::AlreadyPresent => {
                assert_eq!(v2_digest(snap), winner)
            }
            PublishOutcome::Conflict => {
                assert_ne!(v2_digest(snap), winner);
                assert_eq!(r.existing_snapshot_digest, Some(root_digest));
            }
        }
    }
    let restored = restore_bytes(&t.store, &id, c).await;
    assert_eq!(
        v2_digest(&deltapack_format::Snapshot::from_encoded(restored).expect("snapshot")),
        winner
    );
    assert_eq!(t.store.list_roots(None).await.expect("list").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_writers_one_context_local_and_s3() {
    racing_writers(local(config())).await;
    racing_writers(memory(config())).await;
    if let Some(t) = s3(config()) {
        racing_writers(t).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_restores_share_one_fetch() {
    let (s, counters) = instrumented(raw_backend("memory://"), Duration::from_millis(20));
    let id = identity("single-flight");
    let (a, b) = (turn(31, 2048), turn(31, 8192));
    let (ca, cb) = (ctx(&id, 31, 2048), ctx(&id, 31, 8192));
    let ra = publish_base(&s, &id, ca, a.clone(), RootFormat::V2).await;
    let rb = publish_delta(&s, &id, cb, b.clone(), ca, a, RootFormat::V2).await;
    let objects = (ra.objects_written + rb.objects_written) as usize;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (s, id) = (s.clone(), id.clone());
            tokio::spawn(async move { s.restore((&id, cb), Default::default()).await })
        })
        .collect();
    let mut held = Vec::new();
    for t in tasks {
        match t.await.expect("join").expect("restore") {
            RestoreOutcome::Hit(r) => {
                assert_eq!(r.snapshot.encoded(), b.encoded());
                held.push(r);
            }
            RestoreOutcome::Miss(m) => panic!("miss {m}"),
        }
    }
    // Each object once (the v2.1 root carries the delta's header, so the
    // plan is made without a probe of the first extent).
    assert_eq!(
        counters.gets_of_objects(),
        objects,
        "8 concurrent restores fetched each object once"
    );
    assert!(s.stats().restores_shared >= 7);
    // The next turn restores from the last one: while the caller holds the
    // snapshot just restored, a delta over it reads only its own objects,
    // and its base is never read again.
    let (c3, b3) = (ctx(&id, 31, 12288), turn(31, 12288));
    let r3 = publish_delta(&s, &id, c3, b3.clone(), cb, b.clone(), RootFormat::V2).await;
    let before = counters.gets_of_objects();
    assert_eq!(restore_bytes(&s, &id, c3).await, b3.encoded());
    assert_eq!(
        counters.gets_of_objects() - before,
        r3.objects_written as usize + r3.objects_reused as usize
    );
    assert!(s.stats().base_cache_hits >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restore_and_publish_hold_bounded_payloads() {
    let dir = tempfile::tempdir().expect("tmp");
    let (s, counters) = instrumented(
        raw_backend(&format!("file://{}", dir.path().display())),
        Duration::from_millis(5),
    );
    // (This wrapper holds every GET's body whole, so GETs in flight are
    // payloads held; the restore's bound is its budget of ranged GETs in
    // flight, and its chain workers, both set here to RESTORE_IN_FLIGHT.)
    let s = deltapack_store::Store::from_backend(
        deltapack_store::Backend {
            store: s.object_store().clone(),
            kind: s.backend_kind().clone(),
        },
        config()
            .with_chain_gets_in_flight(RESTORE_IN_FLIGHT)
            .with_ranges_in_flight(RESTORE_IN_FLIGHT),
    )
    .expect("store");
    let id = identity("bounded");
    let (a, b) = (turn(41, 1024), turn(41, 32768));
    let (ca, cb) = (ctx(&id, 41, 1024), ctx(&id, 41, 32768));
    publish_base(&s, &id, ca, a.clone(), RootFormat::V2).await;
    let r = publish_delta(&s, &id, cb, b.clone(), ca, a, RootFormat::V2).await;
    assert!(
        r.objects_written >= 16,
        "enough extents to observe the bound ({})",
        r.objects_written
    );
    assert!(
        counters.max_puts() <= PUBLISH_BATCH,
        "publication wrote {} objects at once",
        counters.max_puts()
    );
    assert!(
        counters.max_puts() >= 2,
        "publication does overlap its batch"
    );
    assert_eq!(restore_bytes(&s, &id, cb).await, b.encoded());
    let held = counters.max_held();
    assert!(
        held <= RESTORE_IN_FLIGHT,
        "restore held {held} object payloads at once"
    );
    let gets = counters.max_object_gets();
    assert!(
        gets <= RESTORE_IN_FLIGHT,
        "restore had {gets} object GETs in flight"
    );
    assert!(gets >= 2, "restore does overlap fetches ({gets})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_turns_a_slow_restore_into_a_miss() {
    let (s, _) = instrumented(raw_backend("memory://"), Duration::from_millis(300));
    let id = identity("deadline");
    let c = ctx(&id, 51, 2048);
    publish_base(&s, &id, c, turn(51, 2048), RootFormat::V2).await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(50);
    let out = s
        .restore(
            (id.namespace(), c),
            RestoreOptions::default().with_deadline(Some(deadline)),
        )
        .await
        .expect("restore");
    assert!(
        matches!(out, RestoreOutcome::Miss(MissReason::DeadlineExceeded)),
        "{out:?}"
    );
    assert_eq!(s.stats().miss_deadline, 1);
    // Without a deadline the same restore is a hit.
    assert!(s
        .restore((&id, c), Default::default())
        .await
        .expect("restore")
        .hit()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_inside_restore_into_is_a_miss_and_blames_nothing() {
    // Every GET takes 100 ms: the root is read in time, the deadline passes
    // while the extents stream into the caller's buffer.
    let (s, _) = instrumented(raw_backend("memory://"), Duration::from_millis(100));
    let id = identity("deadline-into");
    let c = ctx(&id, 52, 4096);
    let snap = turn(52, 4096);
    let r = publish_base(&s, &id, c, snap.clone(), RootFormat::V2).await;
    assert!(r.objects_written > 4, "several rounds of extents");
    let mut buf = vec![0u8; snap.encoded().len()];
    let deadline = tokio::time::Instant::now() + Duration::from_millis(150);
    let out = s
        .restore_into(
            (&id, c),
            &mut buf,
            RestoreOptions::default().with_deadline(Some(deadline)),
        )
        .await
        .expect("restore_into");
    assert!(
        matches!(
            out,
            RestoreIntoOutcome::Miss {
                reason: MissReason::DeadlineExceeded
            }
        ),
        "{out:?}"
    );
    assert_eq!(s.stats().miss_deadline, 1);
    assert_eq!(s.stats().quarantined, 0, "a deadline blames no object");
    // Without a deadline the same buffer receives the snapshot.
    assert_restored_into(&s, (&id, c), &mut buf, snap.encoded(), "no deadline").await;
}

/// 16 writers race on 4 contexts (mixed v1/v2, identical and different
/// snapshots) while readers restore and a collector evicts and sweeps: no
/// context ever shows two different snapshots, and every hit is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_writers_with_readers_eviction_and_sweep() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    let dir = tempfile::tempdir().expect("tmp");
    let store = deltapack_store::Store::open(
        &format!("file://{}", dir.path().display()),
        config()
            .with_grace(Duration::ZERO)
            .with_budget_bytes(Some(200_000)),
    )
    .expect("open");
    let id = identity("sixteen");
    let contexts: Vec<_> = (0..4u64).map(|k| ctx(&id, 500 + k, 2048)).collect();
    let seen: Arc<Mutex<HashMap<deltapack_format::ContextDigest, deltapack_format::Digest>>> =
        Arc::default();
    let stop = Arc::new(AtomicBool::new(false));

    let mut readers = Vec::new();
    for r in 0..3usize {
        let (s, id, contexts, seen, stop) = (
            store.clone(),
            id.clone(),
            contexts.clone(),
            seen.clone(),
            stop.clone(),
        );
        readers.push(tokio::spawn(async move {
            let mut hits = 0;
            while !stop.load(Ordering::Relaxed) {
                for c in &contexts {
                    if let RestoreOutcome::Hit(h) = s
                        .restore((&id, *c), Default::default())
                        .await
                        .expect("restore")
                    {
                        assert_eq!(
                            deltapack_format::layer_digest::digest_like(&h.snapshot, &h.digest)
                                .expect("digest"),
                            h.digest
                        );
                        let mut m = seen.lock().expect("lock");
                        let first = *m.entry(*c).or_insert(h.digest);
                        assert_eq!(
                            first, h.digest,
                            "reader {r}: context {c} showed two snapshots"
                        );
                        hits += 1;
                    }
                }
            }
            hits
        }));
    }
    let (s, stop2) = (store.clone(), stop.clone());
    let collector = tokio::spawn(async move {
        let mut rounds = 0;
        while !stop2.load(Ordering::Relaxed) {
            s.sweep(&deltapack_store::SweepOptions::default())
                .await
                .expect("sweep");
            s.execute(s.evict_plan(60_000).await.expect("plan"))
                .await
                .expect("evict");
            rounds += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        rounds
    });
    let mut writers = Vec::new();
    for w in 0..16u64 {
        let (s, id, c) = (store.clone(), id.clone(), contexts[(w % 4) as usize]);
        // Writers w and w+8 publish identical bytes; w and w+4 differ.
        let snap = turn(500 + (w % 8), 2048);
        let format = if w % 3 == 0 {
            RootFormat::V1
        } else {
            RootFormat::V2
        };
        writers.push(tokio::spawn(async move {
            for _ in 0..3 {
                let r = s
                    .publish(flat(&id, c, &snap, format))
                    .await
                    .expect("publish");
                if r.outcome == PublishOutcome::Conflict {
                    assert_ne!(r.existing_snapshot_digest, Some(v2_digest(&snap)));
                }
            }
        }));
    }
    for w in writers {
        w.await.expect("writer");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.store(true, Ordering::Relaxed);
    let rounds = collector.await.expect("collector");
    let mut hits = 0;
    for r in readers {
        hits += r.await.expect("reader");
    }
    assert!(
        rounds > 0 && hits > 0,
        "readers ({hits} hits) and the collector ({rounds} rounds) ran"
    );
    assert_no_damage(&sweep(&store).await, "after the race");
}

/// A publication whose root creation loses the race to another writer,
/// whose root is then removed (evicted by a third process) before this
/// writer reads it back, is not an internal error: the context is free
/// again. The lost race is injected at the root's create-if-absent PUT.
/// Found by the CLI's `chaos_kill9` suite (`crates/deltapack-cli/tests/cli/chaos_kill9.rs`) ("internal invariant
/// broken: root … existed at create but vanished before it could be read").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_lost_to_a_writer_whose_root_then_vanished_is_not_an_internal_error() {
    use common::faults::{FaultPlan, Faulty};

    for on in [Scratch::Memory, Scratch::Local] {
        let (raw, _dir) = on.backend().expect("a scratch backend");
        let faulty = Arc::new(Faulty::new(
            raw.store.clone(),
            FaultPlan {
                create_exists_once: Some("roots/"),
                ..Default::default()
            },
        ));
        let s = through(&raw, faulty, config());
        let id = identity("create-race-vanished");
        let (c, snap) = (ctx(&id, 57, 2048), turn(57, 2048));
        let out = s.publish(flat(&id, c, &snap, RootFormat::V2)).await;
        // The context is free again, so the publication creates its root
        // (retrying the create) and the root restores to its bytes.
        let r = match out {
            Ok(r) => r,
            Err(e) => panic!("{on:?}: a lost create race whose winner vanished failed: {e}"),
        };
        assert_eq!(r.outcome, PublishOutcome::Created, "{on:?}");
        let fresh = wrapped(raw.clone(), config());
        assert_eq!(
            restore_bytes(&fresh, &id, c).await,
            snap.encoded(),
            "{on:?}"
        );
    }
}

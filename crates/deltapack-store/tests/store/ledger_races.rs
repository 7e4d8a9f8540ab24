//! Races between the capacity ledger and the store it accounts for: each
//! test names one interleaving found by reading the code, forces it with
//! real components (a fault wrapper that lets "another actor" act in the
//! exact window, a second SQLite connection holding the ledger's write
//! lock, concurrent publications on real files), and checks that nothing a
//! surviving root references is lost, that a hard budget holds, and that a
//! locked ledger cannot stall the async runtime.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::faults::{republish_on_delete, FaultPlan, Faulty, FaultyStore, Hook};
use crate::common::*;
use deltapack_store::{Backend, PublishOutcome, RestoreOptions, RestoreOutcome, RootFormat, Store};

/// The bucket `url` and two handles on it sharing `ledger`, with no grace:
/// `a` through a fault layer (returned before it, no faults planned) and
/// `b` plain.
fn two_nodes(url: &str, ledger: String) -> (Backend, Arc<FaultyStore>, Store, Store) {
    let cfg = config()
        .with_grace(Duration::ZERO)
        .with_ledger(Some(ledger));
    let raw = raw_backend(url);
    let (faulty, a) = faulty_handle(&raw, cfg.clone());
    let b = wrapped(raw.clone(), cfg);
    (raw, faulty, a, b)
}

/// Both nodes reconcile their ledger with the bucket.
async fn reconciled(a: &Store, b: &Store) {
    a.reconcile_ledger().await.expect("a reconciled");
    b.reconcile_ledger().await.expect("b reconciled");
}

/// Eviction used to delete the root object first and forget the root in the
/// ledger second. A republication of the same context in between wrote a
/// new root, found the old ledger row and only touched it; the eviction then
/// removed that row and condemned the objects the *new* root uses, and the
/// collector deleted them. The republication now waits for the removal to
/// finish (root creation and root removal each cover the ledger update),
/// so its root is recorded afresh and restores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_racing_a_republication_keeps_the_new_roots_objects() {
    for url in std::iter::once("memory://".to_string()).chain(s3_url()) {
        let raw = raw_backend(&url);
        let (faulty, s) = faulty_handle(&raw, config().with_grace(Duration::ZERO));
        let id = identity("evict-vs-republish");
        let (c, snap) = (ctx(&id, 61, 2048), turn(61, 2048));
        publish_base(&s, &id, c, snap.clone(), RootFormat::V2).await;

        // Another actor republishes the context right after the eviction has
        // deleted the root object, and is given up to 2 s to finish inside
        // that window (the old code finished in milliseconds; the new code
        // waits for the removal instead, so the window simply passes).
        let republication = republish_on_delete(&faulty, "roots/", false, &s, &id, c, &snap);

        let plan = s.evict_plan(0).await.expect("plan");
        assert_eq!(plan.roots().len(), 1, "{url}: the one root is planned");
        let report = s.execute(plan).await.expect("evict");
        assert_eq!(report.roots.len(), 1, "{url}");
        let receipt = republication
            .receipt("the hook ran: the eviction deleted the root object")
            .await;
        assert_eq!(receipt.outcome, PublishOutcome::Created, "{url}");
        // Any garbage due is collected now: nothing the new root uses is.
        s.collect_garbage().await.expect("gc");

        let fresh = wrapped(raw.clone(), config());
        assert_kept(
            &fresh,
            (&id, c),
            &snap,
            &format!("{url}: the republished root lost objects to the eviction"),
            [&s, &fresh],
            &format!("{url}: the ledger disagrees with a rebuild from the store"),
        )
        .await;
    }
}

/// The budget check used to read the ledger's totals and let the
/// publication write: N publications checking at once all saw the same
/// free space and together overshot a hard budget by up to N×. Each
/// publication now reserves its bytes in the same ledger transaction that
/// checks them, so the bucket never holds more than the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publications_never_exceed_a_hard_budget() {
    const N: u64 = 8;
    // What one publication occupies, measured on a scratch store.
    let one = {
        let t = local(config());
        let id = identity("budget-scratch");
        publish_seed(&t.store, &id, 900, 2048, RootFormat::V2).await;
        listed_bytes(&t.store).await
    };
    let budget = one * 5 / 2;
    let t = local(
        config()
            .with_budget_bytes(Some(budget))
            .with_grace(Duration::ZERO),
    );
    let id = identity("budget-race");
    let sampler = PeakBytes::sample(&t.store, Duration::from_millis(2));
    let mut tasks = Vec::new();
    for k in 0..N {
        let (s, id) = (t.store.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            let snap = turn(910 + k, 2048);
            s.publish(flat(&id, ctx(&id, 910 + k, 2048), &snap, RootFormat::V2))
                .await
        }));
    }
    let created = created_or_refused(tasks).await;
    let peak = sampler.stop().await;
    assert!(
        created >= 1,
        "no publication fitted a budget of 2.5 publications"
    );
    assert!(
        peak <= budget,
        "{N} concurrent publications put {peak} bytes into a hard budget of {budget} \
         (one publication is {one} bytes)"
    );
    // Every root that survived restores.
    let fresh = Store::open(
        &format!("file://{}", t._dir.as_ref().expect("dir").path().display()),
        config(),
    )
    .expect("open");
    for k in 0..N {
        let c = ctx(&id, 910 + k, 2048);
        if let RestoreOutcome::Hit(r) = fresh
            .restore((&id, c), Default::default())
            .await
            .expect("restore")
        {
            assert_eq!(r.snapshot.encoded(), turn(910 + k, 2048).encoded());
        }
    }
}

/// Ledger calls used to run synchronously on the tokio worker that made
/// them, waiting out SQLite's 30 s busy timeout (and sleeping between
/// retries) when another process held the ledger's write lock. On a
/// current-thread runtime nothing else could run meanwhile: not the
/// restore's deadline, not other requests. Here another connection holds
/// the write lock for the whole test; a restore with a 500 ms deadline must
/// come back (a hit or a deadline miss) long before the lock is released.
#[test]
fn a_deadline_fires_while_another_process_holds_the_ledger_lock() {
    let dir = tempfile::tempdir().expect("tmp");
    let url = format!("file://{}", dir.path().display());
    let id = identity("ledger-locked");
    let (c, snap) = (ctx(&id, 71, 2048), turn(71, 2048));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let s = Store::open(&url, config()).expect("open");
        publish_base(&s, &id, c, snap.clone(), RootFormat::V2).await;
    });

    // "Another process": a second connection that takes the write lock and
    // keeps it until told to stop (or 120 s).
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel::<()>();
    let db = dir.path().join("ledger").join("ledger.sqlite3");
    let holder = std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(&db).expect("open ledger");
        conn.execute_batch("BEGIN IMMEDIATE").expect("lock");
        locked_tx.send(()).expect("signal");
        let _ = stop_rx.recv_timeout(Duration::from_secs(120));
        conn.execute_batch("COMMIT").expect("unlock");
    });
    locked_rx.recv().expect("the ledger is locked");

    let start = Instant::now();
    let outcome = rt.block_on(async {
        let s = Store::open(&url, config()).expect("open");
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        s.restore(
            (&id, c),
            RestoreOptions::default().with_deadline(Some(deadline)),
        )
        .await
    });
    let took = start.elapsed();
    let _ = stop_tx.send(());
    holder.join().expect("holder");
    drop(rt);
    match outcome.expect("restore") {
        RestoreOutcome::Hit(r) => assert_eq!(r.snapshot.encoded(), snap.encoded()),
        RestoreOutcome::Miss(m) => assert_eq!(m, deltapack_store::MissReason::DeadlineExceeded),
    }
    // A liveness bound, not a performance figure: the lock is held for up
    // to 120 s and the old code waited out a 30 s busy timeout.
    assert!(
        took < Duration::from_secs(15),
        "a restore with a 500 ms deadline took {took:?} while the ledger was locked"
    );
}

/// A rebuild used to replace the ledger with the picture its listing
/// showed. A root another node (its own root lock) published after the
/// listing was dropped from the ledger; its objects, listed as present
/// and referenced by nobody the rebuild knew, were condemned and the
/// collector deleted them. A rebuild now merges: rows recorded after its
/// listing began survive, and the new root restores after a collection
/// with no grace at all. Two handles share one SQLite ledger, on a memory
/// bucket and on the moto server; the fault wrapper lets the second node
/// publish right after the first node's listing of the roots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_during_a_publication_keeps_the_new_root() {
    for url in std::iter::once("memory://".to_string()).chain(s3_url()) {
        let dir = tempfile::tempdir().expect("tmp");
        let ledger = format!("sqlite://{}", dir.path().join("shared.sqlite3").display());
        let (raw, faulty, a, b) = two_nodes(&url, ledger);
        let id = identity("rebuild-vs-publish");
        let (c1, snap1) = (ctx(&id, 71, 2048), turn(71, 2048));
        let (c2, snap2) = (ctx(&id, 72, 3072), turn(72, 3072));
        publish_base(&a, &id, c1, snap1.clone(), RootFormat::V2).await;
        reconciled(&a, &b).await;

        let (b2, id2, snap2b) = (b.clone(), id.clone(), snap2.clone());
        let hook = Hook::after("roots", move || {
            let (b2, id2, snap2b) = (b2.clone(), id2.clone(), snap2b.clone());
            async move {
                let r = b2
                    .publish(flat(&id2, c2, &snap2b, RootFormat::V2))
                    .await
                    .expect("the other node's publication");
                assert_eq!(r.outcome, PublishOutcome::Created);
            }
        });
        faulty.set_plan(FaultPlan {
            after_list: Some(hook.clone()),
            ..Default::default()
        });
        a.rebuild_ledger().await.expect("rebuild");
        assert!(hook.has_fired(), "{url}: the rebuild listed the roots");
        assert_eq!(
            a.ledger_totals().await.expect("totals").roots,
            2,
            "{url}: the root published during the rebuild is still recorded"
        );
        a.collect_garbage().await.expect("gc");
        let fresh = wrapped(raw.clone(), config());
        assert_eq!(
            restore_bytes(&fresh, &id, c2).await,
            snap2.encoded(),
            "{url}: the root published during the rebuild lost objects"
        );
        assert_eq!(restore_bytes(&fresh, &id, c1).await, snap1.encoded());
        assert_ledger_equals_rebuild(
            &a,
            &format!("{url}: the merged ledger equals a rebuild on a quiet store"),
        )
        .await;
    }
}

/// Opening a store used to list its roots (a count check against the
/// ledger) before the first ledger use returned, so a node's first
/// restore waited for a listing of the whole bucket. A persisted ledger is
/// now trusted at open and reconciled in the background: with the listing
/// held back by the fault wrapper, totals and a restore hit still answer;
/// the reconciliation finishes once the listing is let go, and records a
/// root the ledger never saw (published through another ledger, as by a
/// process that died before recording it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_a_persisted_ledger_does_not_wait_for_a_listing() {
    let dir = tempfile::tempdir().expect("tmp");
    let url = format!("file://{}", dir.path().display());
    let id = identity("o1-open");
    let (c1, snap1) = (ctx(&id, 81, 2048), turn(81, 2048));
    let (c2, snap2) = (ctx(&id, 82, 2048), turn(82, 2048));
    {
        let s = wrapped(raw_backend(&url), config());
        publish_base(&s, &id, c1, snap1.clone(), RootFormat::V2).await;
        s.reconcile_ledger().await.expect("reconciled");
        // A root and objects no ledger of this store recorded: published
        // into another store, and its files copied in.
        let elsewhere = tempfile::tempdir().expect("tmp");
        let other = wrapped(
            raw_backend(&format!("file://{}", elsewhere.path().display())),
            config(),
        );
        publish_base(&other, &id, c2, snap2.clone(), RootFormat::V2).await;
        for sub in ["roots", "objects"] {
            copy_dir(&elsewhere.path().join(sub), &dir.path().join(sub));
        }
    }

    let raw = raw_backend(&url);
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let hook = Hook::after("roots", move || {
        let g = g.clone();
        async move { g.notified().await }
    });
    let faulty = Arc::new(Faulty::new(
        raw.store.clone(),
        FaultPlan {
            after_list: Some(hook.clone()),
            ..Default::default()
        },
    ));
    let s = through(&raw, faulty, config());
    let limit = Duration::from_secs(60);
    let totals = tokio::time::timeout(limit, s.ledger_totals())
        .await
        .expect("the ledger opened without waiting for the listing")
        .expect("totals");
    assert_eq!(totals.roots, 1, "the persisted ledger, as it was");
    let bytes = tokio::time::timeout(limit, restore_bytes(&s, &id, c1))
        .await
        .expect("a restore hit does not wait for the listing");
    assert_eq!(bytes, snap1.encoded());

    // The background reconciliation is listing (held back) by now.
    tokio::time::timeout(limit, async {
        while !hook.has_fired() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the reconciliation runs in the background");
    gate.notify_one();
    tokio::time::timeout(limit, s.reconcile_ledger())
        .await
        .expect("reconciliation finishes")
        .expect("reconciled");
    assert_eq!(
        s.ledger_totals().await.expect("totals").roots,
        2,
        "the root the ledger never saw is recorded"
    );
    let fresh = wrapped(
        raw_backend(&url),
        config().with_cold_start(deltapack_store::ColdStart::Rebuild),
    );
    assert_eq!(
        s.ledger_image().await.expect("image"),
        fresh.ledger_image().await.expect("rebuilt"),
        "reconciled ledger equals a rebuild"
    );
    assert_eq!(restore_bytes(&s, &id, c2).await, snap2.encoded());
}

/// With the ledger reconciled in the background, a removal plan made
/// right after open saw only what the ledger already knew: a node's first
/// `evict` on a bucket with a fresh ledger planned nothing, and a root the
/// ledger never saw escaped `clear`. Removal plans now wait for the
/// reconciliation. The fault wrapper slows the reconciliation's listing so
/// that the plan would otherwise come first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removal_plans_wait_for_the_background_reconciliation() {
    for url in std::iter::once("memory://".to_string()).chain(s3_url()) {
        let dir = tempfile::tempdir().expect("tmp");
        let raw = raw_backend(&url);
        let id = identity("plans-wait");
        let first = format!("sqlite://{}", dir.path().join("first.sqlite3").display());
        let writer = wrapped(raw.clone(), config().with_ledger(Some(first)));
        for k in 0..3 {
            publish_seed(&writer, &id, 120 + k, 1024, RootFormat::V2).await;
        }
        // A node with a ledger of its own, new to the bucket.
        let fresh = format!("sqlite://{}", dir.path().join("fresh.sqlite3").display());
        let faulty = Arc::new(Faulty::new(
            raw.store.clone(),
            FaultPlan {
                after_list: Some(Hook::after("roots", || {
                    tokio::time::sleep(Duration::from_millis(500))
                })),
                ..Default::default()
            },
        ));
        let node = through(&raw, faulty, config().with_ledger(Some(fresh)));
        let plan = node.evict_plan(0).await.expect("plan");
        assert_eq!(
            plan.roots().len(),
            3,
            "{url}: a fresh node's eviction plan covers the whole bucket"
        );
        let plan = node.clear_plan(None).await.expect("clear plan");
        assert_eq!(plan.roots().len(), 3, "{url}");
    }
}

/// A delta publication checked its base root, then pinned it in its own
/// process only. Another node evicting in between (or any node, at any
/// time before the delta was recorded) removed the base: the delta root
/// was written over a base that no longer existed, and restored as a
/// `base-missing` miss (three real processes on moto with a PostgreSQL
/// ledger hit it within seconds). A publication now protects its base root
/// in the shared ledger before it reads it, and a removal claims a root in
/// a transaction that refuses it while a live publication protects it or a
/// recorded root builds on it. Two handles share one ledger (SQLite on a
/// memory bucket and on moto, PostgreSQL on moto); the fault wrapper lets
/// the second node evict everything right after the first node's
/// publisher has read its base root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_racing_a_delta_publication_keeps_its_base() {
    let dir = tempfile::tempdir().expect("tmp");
    let sqlite = |n: &str| format!("sqlite://{}", dir.path().join(n).display());
    let mut cases = vec![("memory://".to_string(), sqlite("m.sqlite3"))];
    if let Some(bucket) = s3_url() {
        cases.push((bucket, sqlite("s.sqlite3")));
        if let Some(pg) = postgres_ledger_url() {
            cases.push((s3_url().expect("bucket"), pg));
        }
    }
    for (url, ledger) in cases {
        let (raw, faulty, a, b) = two_nodes(&url, ledger);
        let id = identity("evict-vs-delta");
        let (c1, snap1) = (ctx(&id, 81, 2048), turn(81, 2048));
        let (c2, snap2) = (ctx(&id, 81, 3072), turn(81, 3072));
        publish_base(&b, &id, c1, snap1.clone(), RootFormat::V2).await;
        reconciled(&a, &b).await;

        let evicted = Arc::new(Mutex::new(Vec::new()));
        let (b2, evicted2) = (b.clone(), evicted.clone());
        let hook = Hook::after("roots", move || {
            let (b2, evicted2) = (b2.clone(), evicted2.clone());
            async move {
                let plan = b2.evict_plan(0).await.expect("plan");
                let report = b2.execute(plan).await.expect("the other node's eviction");
                if let Ok(mut e) = evicted2.lock() {
                    e.extend(report.roots);
                }
            }
        });
        faulty.set_plan(FaultPlan {
            after_get: Some(hook.clone()),
            ..Default::default()
        });
        let r = publish_delta(
            &a,
            &id,
            c2,
            snap2.clone(),
            c1,
            snap1.clone(),
            RootFormat::V2,
        )
        .await;
        assert_eq!(r.outcome, PublishOutcome::Created, "{url}");
        assert!(hook.has_fired(), "{url}: the publisher read its base root");
        assert_eq!(
            evicted.lock().map(|e| e.clone()).unwrap_or_default(),
            Vec::<String>::new(),
            "{url}: the base of a delta being published was evicted"
        );
        let fresh = wrapped(raw.clone(), config());
        assert_eq!(
            restore_bytes(&fresh, &id, c2).await,
            snap2.encoded(),
            "{url}: the delta restores"
        );
        // Once the delta is recorded, an eviction takes it with its base.
        let report = b
            .execute(b.evict_plan(0).await.expect("plan"))
            .await
            .expect("evict");
        assert_eq!(report.roots.len(), 2, "{url}: {:?}", report.roots);
        assert_eq!(listed_bytes(&b).await, 0, "{url}: the bucket is empty");
    }
}

//! The ledger's engines: one conformance workload run against SQLite and
//! PostgreSQL (real servers: the PostgreSQL cluster and the moto bucket that
//! `.ci/run` starts) must leave the same account, equal to a rebuild from
//! the store; two nodes sharing a PostgreSQL ledger on one bucket never
//! collect each other's objects (the data loss separate ledgers cause)
//! and share one hard budget;
//! a ledger outside its store belongs to one store only; and the engine in
//! use is reported.

use std::time::Duration;

use crate::common::*;
use deltapack_store::{LedgerImage, PruneFilter, RootFormat, Store, StoreConfig, Totals};

/// The ledgers the conformance workload runs on: a SQLite file outside the
/// store, and PostgreSQL when the test server is configured.
fn engines(dir: &std::path::Path) -> Vec<(&'static str, String)> {
    let mut v = vec![(
        "sqlite",
        format!("sqlite://{}", dir.join("ledger.sqlite3").display()),
    )];
    if let Some(pg) = postgres_ledger_url() {
        v.push(("postgres", pg));
    }
    v
}

/// Publishes, restores, holds, evicts, prunes and collects; returns the
/// ledger's image and totals at the end (access times aside).
async fn workload(s: &Store) -> (LedgerImage, Totals) {
    let id = identity("engines");
    let (c0, c1, c2, c3) = (
        ctx(&id, 80, 1024),
        ctx(&id, 80, 2048),
        ctx(&id, 80, 3072),
        ctx(&id, 81, 2048),
    );
    let (t0, t1, t2, t3) = (
        turn(80, 1024),
        turn(80, 2048),
        turn(80, 3072),
        turn(81, 2048),
    );
    publish_base(s, &id, c0, t0.clone(), RootFormat::V2).await;
    publish_delta(s, &id, c1, t1.clone(), c0, t0.clone(), RootFormat::V2).await;
    publish_delta(s, &id, c2, t2.clone(), c1, t1.clone(), RootFormat::V2).await;
    publish_base(s, &id, c3, t3.clone(), RootFormat::V1).await;
    assert_eq!(restore_bytes(s, &id, c2).await, t2.encoded());
    assert_eq!(restore_bytes(s, &id, c3).await, t3.encoded());
    s.hold("keep", id.namespace(), c3).await.expect("hold");
    // Pruning v1 roots skips the held one; evicting to zero removes the
    // chain (dependents first) but not the held root.
    let plan = s
        .prune_plan(&PruneFilter::default().with_schema(Some("v1".into())))
        .await
        .expect("prune plan");
    assert!(plan.is_empty(), "a held root was planned for pruning");
    let report = s
        .execute(s.evict_plan(0).await.expect("plan"))
        .await
        .expect("evict");
    assert_eq!(report.roots.len(), 3, "{report:?}");
    s.collect_garbage().await.expect("gc");
    assert_eq!(restore_bytes(s, &id, c3).await, t3.encoded());
    let image = s.ledger_image().await.expect("image");
    let totals = s.ledger_totals().await.expect("totals");
    (image, totals)
}

/// The same workload on every engine leaves the same account, and each
/// account equals a rebuild from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_workload_leaves_the_same_ledger_on_every_engine() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut seen: Vec<(&str, LedgerImage, Totals)> = Vec::new();
    for (engine, url) in engines(dir.path()) {
        let store_dir = tempfile::tempdir().expect("store dir");
        let cfg = config()
            .with_grace(Duration::ZERO)
            .with_ledger(Some(url.clone()));
        let s = Store::open(
            &format!("file://{}", store_dir.path().display()),
            cfg.clone(),
        )
        .expect("open");
        let (image, totals) = workload(&s).await;
        assert_eq!(s.ledger_location().await.expect("location").engine, engine);
        let rebuilt = s.rebuild_ledger().await.expect("rebuild");
        assert_eq!(
            s.ledger_image().await.expect("image"),
            image,
            "{engine}: the incremental ledger differs from a rebuild"
        );
        assert_eq!(rebuilt.used_bytes, totals.used_bytes, "{engine}");
        // A second handle (another process would do the same) opens the
        // persisted ledger and sees the same account.
        let again =
            Store::open(&format!("file://{}", store_dir.path().display()), cfg).expect("reopen");
        assert_eq!(
            again.ledger_image().await.expect("image"),
            image,
            "{engine}"
        );
        seen.push((engine, image, totals));
    }
    for w in seen.windows(2) {
        assert_eq!(w[0].1, w[1].1, "{} and {} disagree", w[0].0, w[1].0);
        assert_eq!(w[0].2.used_bytes, w[1].2.used_bytes);
        assert_eq!(w[0].2.roots, w[1].2.roots);
    }
}

/// Two nodes on one bucket. With a ledger each, node A's eviction condemned
/// C's objects in A's ledger only; node B republished C reusing them; A's
/// collector then deleted them and C restored as `corrupt: … missing`. With
/// one PostgreSQL ledger, B's republication references the objects again
/// in the ledger A collects from, so A deletes nothing C needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_sharing_a_postgres_ledger_never_collect_each_others_objects() {
    let (Some(bucket), Some(pg)) = (s3_url(), postgres_ledger_url()) else {
        return;
    };
    // Node A keeps condemned objects for 1 s; node B publishes.
    let cfg = config().with_ledger(Some(pg));
    let a = Store::open(&bucket, cfg.clone().with_grace(Duration::from_secs(1))).expect("node A");
    let b = Store::open(&bucket, cfg.clone()).expect("node B");
    let id = identity("fleet");
    let (c, snap) = (ctx(&id, 90, 4096), turn(90, 4096));
    publish_base(&a, &id, c, snap.clone(), RootFormat::V2).await;
    // A evicts C: its objects are condemned, still inside A's grace.
    let report = a
        .execute(a.evict_plan(0).await.expect("plan"))
        .await
        .expect("evict");
    assert_eq!(report.roots.len(), 1);
    assert!(report.condemned_objects > 0, "{report:?}");
    assert_eq!(report.deleted_objects, 0, "{report:?}");
    // B republishes C, finding the objects present and reusing them.
    let receipt = publish_base(&b, &id, c, snap.clone(), RootFormat::V2).await;
    assert_eq!(receipt.outcome, deltapack_store::PublishOutcome::Created);
    assert!(receipt.objects_reused > 0, "{receipt:?}");
    // A's grace passes; A collects.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let deleted = a.collect_garbage().await.expect("A collects").objects;
    assert_eq!(deleted, 0, "A deleted objects B's new root uses");
    let fresh = Store::open(&bucket, cfg).expect("node C");
    assert_kept(
        &fresh,
        (&id, c),
        &snap,
        "node A's collector deleted objects node B's root uses",
        [&a, &b],
        "the nodes see different ledgers",
    )
    .await;
}

/// The budget is the fleet's: two nodes (handles with root locks of their
/// own) publishing into one bucket at once, sharing a PostgreSQL ledger,
/// never put more into it than one hard budget — measured from the
/// bucket's listing while they publish. With a ledger per node each node
/// counted only its own writes and the bucket held up to N × budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_publishing_at_once_share_one_hard_budget() {
    let (Some(bucket), Some(pg)) = (s3_url(), postgres_ledger_url()) else {
        return;
    };
    const PER_NODE: u64 = 4;
    // What one publication occupies, measured on a scratch prefix.
    let one = {
        let scratch = Store::open(&s3_url().expect("s3"), config()).expect("scratch");
        let id = identity("fleet-budget-scratch");
        publish_seed(&scratch, &id, 950, 2048, RootFormat::V2).await;
        listed_bytes(&scratch).await
    };
    let budget = one * 5 / 2;
    let cfg = config()
        .with_ledger(Some(pg))
        .with_budget_bytes(Some(budget))
        .with_grace(Duration::ZERO);
    let nodes = [
        Store::open(&bucket, cfg.clone()).expect("node A"),
        Store::open(&bucket, cfg.clone()).expect("node B"),
    ];
    let id = identity("fleet-budget");
    let sampler = PeakBytes::sample(&nodes[0], Duration::from_millis(5));
    let mut tasks = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        for k in 0..PER_NODE {
            let (s, id) = (node.clone(), id.clone());
            let seed = 960 + n as u64 * PER_NODE + k;
            tasks.push(tokio::spawn(async move {
                let snap = turn(seed, 2048);
                s.publish(flat(&id, ctx(&id, seed, 2048), &snap, RootFormat::V2))
                    .await
            }));
        }
    }
    let created = created_or_refused(tasks).await;
    let peak = sampler.stop().await;
    assert!(created >= 1, "no publication fitted a budget of 2.5");
    assert!(
        peak <= budget,
        "two nodes put {peak} bytes into a shared hard budget of {budget} \
         (one publication is {one} bytes)"
    );
    // Both nodes see one account, and it agrees with the bucket.
    let (ta, tb) = (
        nodes[0].ledger_totals().await.expect("totals"),
        nodes[1].ledger_totals().await.expect("totals"),
    );
    assert_eq!(ta.used_bytes, tb.used_bytes);
    assert!(ta.used_bytes <= budget, "{ta:?}");
    // Every root that survived restores exactly.
    let fresh = Store::open(&bucket, config()).expect("node C");
    for seed in 960..960 + 2 * PER_NODE {
        let c = ctx(&id, seed, 2048);
        if let deltapack_store::RestoreOutcome::Hit(r) = fresh
            .restore((&id, c), Default::default())
            .await
            .expect("restore")
        {
            assert_eq!(r.snapshot.encoded(), turn(seed, 2048).encoded());
        }
    }
}

/// A ledger outside the store is bound to the first store that uses it; a
/// second store is refused with an error naming both, never mixed in.
#[tokio::test]
async fn a_ledger_belongs_to_one_store() {
    let dir = tempfile::tempdir().expect("tmp");
    for (engine, url) in engines(dir.path()) {
        let (d1, d2) = (
            tempfile::tempdir().expect("a"),
            tempfile::tempdir().expect("b"),
        );
        let cfg = config().with_ledger(Some(url.clone()));
        let s1 =
            Store::open(&format!("file://{}", d1.path().display()), cfg.clone()).expect("open");
        s1.ledger_totals()
            .await
            .expect("first store binds the ledger");
        let s2 = Store::open(&format!("file://{}", d2.path().display()), cfg).expect("open");
        let err = s2
            .ledger_totals()
            .await
            .expect_err(&format!("{engine}: a second store used the ledger"));
        let msg = err.to_string();
        assert!(
            msg.contains("keeps the account of the store")
                && msg.contains(&d1.path().display().to_string()),
            "{engine}: {msg}"
        );
        // Not damage: the ledger is someone else's, and the error says so.
        assert!(!msg.contains("inconsistent"), "{engine}: {msg}");
        assert!(
            matches!(
                err,
                deltapack_store::StoreError::Ledger(
                    deltapack_store::LedgerError::OtherStore { .. }
                )
            ),
            "{engine}: {err:?}"
        );
    }
}

/// `ledger_location` names the engine and where it lives; a bad URL is a
/// clear error.
#[tokio::test]
async fn the_ledger_in_use_is_reported() {
    let dir = tempfile::tempdir().expect("tmp");
    let local = Store::open(&format!("file://{}", dir.path().display()), config()).expect("open");
    let l = local.ledger_location().await.expect("location");
    assert_eq!((l.engine, l.persisted), ("sqlite", true));
    assert!(
        l.location.ends_with("ledger/ledger.sqlite3"),
        "{}",
        l.location
    );
    let mem = Store::open("memory://", config()).expect("open");
    let l = mem.ledger_location().await.expect("location");
    assert_eq!((l.engine, l.persisted), ("sqlite", false));
    if let Some(url) = s3_url() {
        let s3 = Store::open(&url, config()).expect("open");
        let l = s3.ledger_location().await.expect("location");
        assert_eq!(
            (l.engine, l.persisted),
            ("sqlite", true),
            "an S3 store's default ledger is persisted"
        );
        assert!(
            l.location
                .starts_with(&deltapack_store::state_dir().display().to_string()),
            "{}",
            l.location
        );
    }
    if let Some(pg) = postgres_ledger_url() {
        let s = Store::open(
            &format!(
                "file://{}",
                tempfile::tempdir().expect("d").keep().display()
            ),
            StoreConfig::default().with_ledger(Some(pg)),
        )
        .expect("open");
        let l = s.ledger_location().await.expect("location");
        assert_eq!((l.engine, l.persisted), ("postgres", true));
    }
    let bad =
        Store::open("memory://", config().with_ledger(Some("mysql://x".into()))).expect("open");
    let err = bad.ledger_totals().await.expect_err("mysql is no engine");
    assert!(err.to_string().contains("sqlite:///"), "{err}");
}

/// The exact cross-node GC protocol. Node A's collector decides to delete
/// an object of an evicted root; node B republishes the same bytes in the
/// instant before A's DELETE reaches the bucket. B used to find the object
/// present, reuse it and record its root — and A's DELETE then removed an
/// object B's root relies on. Now A claims each object in the ledger
/// (`deleting`) before deleting it, and B's protection of a claimed key
/// makes B wait for the deletion and write the object again. Run with a
/// shared SQLite file (two handles) and with PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_and_a_publisher_racing_on_one_object_lose_nothing() {
    use crate::common::faults::republish_on_delete;

    let dir = tempfile::tempdir().expect("tmp");
    for (engine, ledger) in engines(dir.path()) {
        let Some(bucket) = s3_url() else {
            return;
        };
        let raw = raw_backend(&bucket);
        let cfg = config().with_ledger(Some(ledger));
        let (faulty, a) = faulty_handle(&raw, cfg.clone().with_grace(Duration::ZERO));
        let b = Store::open(&bucket, cfg.clone()).expect("node B");
        let id = identity("gc-race");
        let (c, snap) = (ctx(&id, 95, 4096), turn(95, 4096));
        publish_base(&a, &id, c, snap.clone(), RootFormat::V2).await;

        // Right before A's first object DELETE, B republishes C; B gets up
        // to 2 s to finish inside that window.
        let republication = republish_on_delete(&faulty, "objects/", true, &b, &id, c, &snap);
        // A evicts C and (grace 0) collects its objects at once.
        let report = a
            .execute(a.evict_plan(0).await.expect("plan"))
            .await
            .expect("evict");
        assert_eq!(report.roots.len(), 1, "{engine}");
        let receipt = republication
            .receipt("the hook ran: A deleted an object")
            .await;
        assert_eq!(
            receipt.outcome,
            deltapack_store::PublishOutcome::Created,
            "{engine}"
        );
        let fresh = Store::open(&bucket, cfg).expect("node C");
        assert_eq!(
            restore_bytes(&fresh, &id, c).await,
            snap.encoded(),
            "{engine}: A's DELETE removed an object B's new root relies on"
        );
    }
}

/// `lookup` answers from the ledger's root index: over the 128 candidate
/// boundaries of a 32,768-token request it sends one request to the store
/// (the HEAD confirming the chosen root), not one per candidate. A root
/// the ledger does not know (another node's, with a ledger per node) is
/// still found by the HEAD scan the lookup falls back to.
#[tokio::test]
async fn lookup_answers_from_the_ledger_with_one_head() {
    let dir = tempfile::tempdir().expect("tmp");
    let url = format!("file://{}", dir.path().display());
    let (s, counters) = crate::common::instrumented::instrumented_store(
        raw_backend(&url),
        Duration::ZERO,
        config(),
    );
    // A second handle with a ledger of its own, opened (and built from
    // the then empty store) before the root is published: its ledger never
    // learns of the root.
    let other = Store::open(
        &url,
        config().with_ledger(Some(format!(
            "sqlite://{}",
            dir.path().join("other.sqlite3").display()
        ))),
    )
    .expect("open");
    assert_eq!(other.ledger_totals().await.expect("totals").roots, 0);
    let id = identity("lookup");
    let (c, snap) = (ctx(&id, 97, 6144), turn(97, 6144));
    publish_base(&s, &id, c, snap, RootFormat::V2).await;
    let hasher =
        deltapack_format::ContextHasher::new(id.namespace(), id.chunk_tokens).expect("hasher");
    let candidates = hasher.boundaries(&deltapack_format::synth::tokens(97, 32_768));
    assert_eq!(candidates.len(), 128);
    let before = counters.gets_of_roots();
    assert_eq!(
        s.lookup(&id, &candidates).await.expect("lookup"),
        Some((6144, c))
    );
    assert_eq!(
        counters.gets_of_roots() - before,
        1,
        "lookup sent more than one root request"
    );
    // The other handle's ledger does not know the root: the fallback scan
    // finds it.
    let none_known = other
        .lookup(&id, &candidates)
        .await
        .expect("lookup via a fresh ledger");
    assert_eq!(none_known, Some((6144, c)));
}

//! Migration v1 → v2: every migrated context restores to the same snapshot
//! digest as before, each root is replaced only after that was proven (a
//! dry run changes nothing), deltas built on a migrated base keep working,
//! the old v1 chunk objects become garbage reclaimed after the grace
//! period, and the ledger agrees with a rebuild afterwards. The proof
//! `migrate_check` gives beforehand writes nothing and predicts, byte for
//! byte, the size of the v2 root `migrate` then writes.

use crate::common;

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use deltapack_format::{DecodedRoot, SCHEMA_V1, SCHEMA_V2, SCHEMA_V2_1};
use deltapack_store::{RestoreOutcome, RootFormat, RootStatus, Store};

/// A copy of the `2026-11-v1v2` fixture store: its folder and a handle on
/// it with no grace.
fn v1v2_fixture() -> (tempfile::TempDir, Store) {
    let tmp = tempfile::tempdir().expect("tmp");
    copy_dir(
        &crate::common::repo_root().join("fixtures/2026-11-v1v2/store"),
        tmp.path(),
    );
    let url = format!("file://{}", tmp.path().display());
    let s = Store::open(&url, config().with_grace(Duration::ZERO)).expect("open");
    (tmp, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_fixture_v1_roots_and_a_mixed_chain() {
    let (tmp, s) = v1v2_fixture();

    // A v2 delta on a v1 base, in another namespace.
    let id = identity("migrate");
    let (b, r) = (turn(81, 1024), turn(81, 3072));
    let (cb, cr) = (ctx(&id, 81, 1024), ctx(&id, 81, 3072));
    publish_base(&s, &id, cb, b.clone(), RootFormat::V1).await;
    publish_delta(&s, &id, cr, r.clone(), cb, b.clone(), RootFormat::V2).await;

    // Expected digests of every root, before.
    let mut before = Vec::new();
    for (ns, ctx) in s.list_roots(None).await.expect("list") {
        let RootStatus::Found(root) = s.peek_root(&ns, &ctx).await.expect("read") else {
            panic!()
        };
        let sum = root.summary().expect("summary");
        before.push((ns, ctx, sum.result_snapshot_digest, sum.schema));
    }
    let v1_count = before.iter().filter(|x| x.3 == SCHEMA_V1).count();
    assert_eq!(v1_count, 3, "two fixture v1 roots + the v1 base");

    let files_before = std::fs::read_dir(tmp.path().join("roots"))
        .expect("roots")
        .count();
    let dry = s.migrate(None, true).await.expect("dry run");
    assert_eq!(dry.migrated.len(), 3);
    assert_eq!(
        std::fs::read_dir(tmp.path().join("roots"))
            .expect("roots")
            .count(),
        files_before
    );
    for (ns, ctx, _, schema) in &before {
        let RootStatus::Found(root) = s.peek_root(ns, ctx).await.expect("read") else {
            panic!()
        };
        assert_eq!(
            root.summary().expect("s").schema,
            *schema,
            "dry run left the root alone"
        );
    }

    let report = s.migrate(None, false).await.expect("migrate");
    assert_eq!(report.migrated.len(), 3, "{report:?}");
    assert!(report.skipped.is_empty(), "{report:?}");
    assert!(report.objects_before > report.objects_after, "{report:?}");

    // Every root: same digest, now v2, restores exactly (the keyed fixture
    // roots are read without MAC verification by this unkeyed handle).
    for (ns, ctx, digest, _) in &before {
        let RootStatus::Found(root) = s.peek_root(ns, ctx).await.expect("read") else {
            panic!()
        };
        assert!(matches!(*root, DecodedRoot::V2(_)), "{ctx} migrated to v2");
        match s
            .restore((*ns, *ctx), Default::default())
            .await
            .expect("restore")
        {
            RestoreOutcome::Hit(h) => {
                assert_eq!(h.digest, *digest, "{ctx}: snapshot digest unchanged")
            }
            RestoreOutcome::Miss(m) => panic!("{ctx}: {m}"),
        }
        // (The delta published over a v1 base was written as v2.2, with
        // its chain hints and the layered digest; migration leaves it as it
        // is. Migrated roots keep their digest, so they are v2 or v2.1.)
        let schema = root.summary().expect("s").schema;
        assert!(
            schema == SCHEMA_V2 || schema == SCHEMA_V2_1 || schema == deltapack_format::SCHEMA_V2_2,
            "{schema}"
        );
    }
    assert_eq!(
        restore_bytes(&s, &id, cr).await,
        r.encoded(),
        "the delta on the migrated base"
    );

    // The v1 chunks are garbage now: nothing left under objects/sha256.
    let sha = tmp.path().join("objects/sha256");
    let left = files_under(&sha).len();
    assert_eq!(left, 0, "v1 chunk objects reclaimed (grace 0)");
    let sweep = sweep(&s).await;
    assert!(
        sweep.corrupt.is_empty() && sweep.missing.is_empty() && sweep.invalidated_roots.is_empty(),
        "{sweep:?}"
    );
    assert_ledger_equals_rebuild(&s, "ledger equals a rebuild after migration").await;
    assert_eq!(s.migrate(None, false).await.expect("again").v1_roots, 0);
}

/// A keyed v1 root is never rewritten without its MAC: a migration without
/// the key skips it (and says why), a migration with the key migrates it
/// and the new root carries a MAC that verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_check_writes_nothing_and_predicts_the_migrated_root() {
    let (tmp, s) = v1v2_fixture();
    let roots_dir = tmp.path().join("roots");
    let root_files = |dir: &Path| {
        let mut out = Vec::new();
        for ns in std::fs::read_dir(dir).expect("roots") {
            for r in std::fs::read_dir(ns.expect("ns").path()).expect("ns") {
                let p = r.expect("root").path();
                let bytes = std::fs::read(&p).expect("read");
                out.push((p, bytes));
            }
        }
        out.sort();
        out
    };
    let before = root_files(&roots_dir);
    let proofs = s.migrate_check(None).await.expect("check");
    assert_eq!(proofs.len(), 2, "the fixture's two v1 roots: {proofs:?}");
    assert!(proofs.iter().all(|p| p.proven), "{proofs:?}");
    assert_eq!(root_files(&roots_dir), before, "the check wrote a root");
    let report = s.migrate(None, false).await.expect("migrate");
    assert_eq!(report.migrated.len(), 2, "{report:?}");
    for p in &proofs {
        let path = roots_dir.join(&p.namespace).join(&p.context);
        let bytes = std::fs::read(&path).expect("migrated root");
        assert_eq!(bytes.len() as u64, p.v2_root_bytes, "{}", p.root);
        let RootStatus::Found(root) = s
            .peek_root(
                &p.namespace.parse().expect("ns"),
                &p.context.parse().expect("ctx"),
            )
            .await
            .expect("read")
        else {
            panic!("{} unreadable after migration", p.root)
        };
        let DecodedRoot::V2(m) = *root else {
            panic!("{} is not v2", p.root)
        };
        assert_eq!(m.extents.len() as u64, p.extents, "{}", p.root);
        assert_eq!(m.result_snapshot_digest.to_string(), p.snapshot_digest);
    }
    assert!(
        s.migrate_check(None).await.expect("again").is_empty(),
        "no v1 root is left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_roots_migrate_only_with_the_key() {
    let tmp = tempfile::tempdir().expect("tmp");
    let url = format!("file://{}", tmp.path().display());
    let keyed_cfg = || {
        config()
            .with_mac_secret(Some(b"migration test key".to_vec()))
            .with_grace(Duration::ZERO)
    };
    let keyed = Store::open(&url, keyed_cfg()).expect("open");
    let id = identity("migrate-keyed");
    let (c, snap) = (ctx(&id, 82, 2048), turn(82, 2048));
    publish_base(&keyed, &id, c, snap.clone(), RootFormat::V1).await;
    let path = tmp
        .path()
        .join(deltapack_store::keys::root_key(&id.namespace(), &c).as_ref());
    let before = std::fs::read(&path).expect("root");
    assert!(deltapack_format::root::has_mac(&before));

    let plain = Store::open(&url, config().with_grace(Duration::ZERO)).expect("open");
    for dry_run in [true, false] {
        let r = plain.migrate(None, dry_run).await.expect("migrate");
        assert!(r.migrated.is_empty(), "{r:?}");
        assert!(r.skipped.iter().any(|s| s.contains("keyed")), "{r:?}");
        assert_eq!(std::fs::read(&path).expect("root"), before, "untouched");
    }

    let r = keyed.migrate(None, false).await.expect("migrate");
    assert_eq!(r.migrated.len(), 1, "{r:?}");
    let after = std::fs::read(&path).expect("root");
    assert!(deltapack_format::root::has_mac(&after), "still keyed");
    assert_eq!(restore_bytes(&keyed, &id, c).await, snap.encoded());
}

/// A root removed or rewritten by another actor while it is being migrated
/// keeps what that actor did. The race is placed exactly in the window the
/// old code left open: after migration's last read of the root and before
/// its overwrite (the fault wrapper acts right after that read is served).
/// The old code overwrote unconditionally and brought an evicted root back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_removed_or_replaced_during_migration_is_not_brought_back() {
    use common::faults::{FaultPlan, Race};
    use deltapack_store::keys;
    use object_store::ObjectStoreExt;

    let mut kinds = vec!["memory"];
    if s3_endpoint().is_some() {
        kinds.push("s3");
    }
    for name in kinds {
        for republish in [false, true] {
            let url = match name {
                "s3" => s3_url().expect("s3 url"),
                _ => "memory://".to_string(),
            };
            let raw = raw_backend(&url);
            let (faulty, s) = faulty_handle(&raw, config().with_grace(Duration::ZERO));
            let id = identity("migrate-race");
            let (c, snap) = (ctx(&id, 83, 2048), turn(83, 2048));
            publish_base(&s, &id, c, snap, RootFormat::V1).await;
            let key = keys::root_key(&id.namespace(), &c);
            let other = bytes::Bytes::from_static(b"another writer's root");
            faulty.set_plan(FaultPlan {
                race: Some(if republish {
                    Race::Put(key.clone(), other.clone())
                } else {
                    Race::Delete(key.clone())
                }),
                race_after_put: "objects/",
                ..Default::default()
            });
            let r = s.migrate(None, false).await.expect("migrate");
            let what = format!("{name}, republish={republish}: {r:?}");
            assert!(r.migrated.is_empty(), "{what}");
            assert!(
                r.skipped
                    .iter()
                    .any(|x| x.contains("changed during migration")),
                "{what}"
            );
            match raw.store.get(&key).await {
                Ok(g) => {
                    assert!(republish, "evicted root brought back ({what})");
                    assert_eq!(g.bytes().await.expect("body"), other, "{what}");
                }
                Err(object_store::Error::NotFound { .. }) => assert!(!republish, "{what}"),
                Err(e) => panic!("{what}: {e}"),
            }
        }
    }
}

/// A backend that cannot overwrite conditionally (no `If-Match`) makes
/// migration fail with a clear error, and the root stays as it was: an
/// unconditional overwrite could undo a concurrent eviction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_refuses_a_backend_without_conditional_overwrite() {
    use common::faults::FaultPlan;
    use deltapack_store::{keys, StoreError};

    let raw = raw_backend("memory://");
    let (faulty, s) = faulty_handle(&raw, config());
    let id = identity("migrate-no-if-match");
    let (c, snap) = (ctx(&id, 84, 2048), turn(84, 2048));
    publish_base(&s, &id, c, snap.clone(), RootFormat::V1).await;
    let key = keys::root_key(&id.namespace(), &c);
    let before = stored(&raw.store, &key).await;
    faulty.set_plan(FaultPlan {
        updates_unsupported: true,
        ..Default::default()
    });
    match s.migrate(None, false).await {
        Err(e @ StoreError::Unsupported(_)) => {
            assert!(e.to_string().contains("If-Match"), "{e}")
        }
        other => panic!("expected an Unsupported error, got {other:?}"),
    }
    let after = stored(&raw.store, &key).await;
    assert_eq!(before, after, "root untouched");
    assert_eq!(restore_bytes(&s, &id, c).await, snap.encoded());
}

/// Local disk: migration and eviction in two stores (two ledger
/// connections, as two processes have) on one directory, concurrently. The
/// replacement compares and renames under the ledger's lock and every root
/// deletion takes that lock too, so once eviction has removed everything no
/// migrated root may reappear. Racy by nature (it cannot fail spuriously:
/// migration never creates a root, so any root left is one brought back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_migration_racing_eviction_never_resurrects_a_root() {
    let tmp = tempfile::tempdir().expect("tmp");
    let url = format!("file://{}", tmp.path().display());
    let cfg = || config().with_grace(Duration::ZERO);
    let id = identity("migrate-vs-evict");
    for round in 0..3u64 {
        let a = Store::open(&url, cfg()).expect("open");
        for k in 0..6u64 {
            let seed = 100 + round * 10 + k;
            publish_seed(&a, &id, seed, 1024, RootFormat::V1).await;
        }
        let b = Store::open(&url, cfg()).expect("open");
        let migrating = tokio::spawn(async move { a.migrate(None, false).await });
        tokio::time::sleep(Duration::from_millis(round * 5)).await;
        b.execute(b.evict_plan(0).await.expect("plan"))
            .await
            .expect("evict");
        let _ = migrating.await.expect("join").expect("migrate");
        let left = b.list_roots(None).await.expect("list");
        assert!(
            left.is_empty(),
            "round {round}: roots brought back: {left:?}"
        );
    }
}

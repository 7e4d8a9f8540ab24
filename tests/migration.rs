//! Migration v1 → v2: every migrated context restores to the same snapshot
//! digest as before, each root is replaced only after that was proven (a
//! dry run changes nothing), deltas built on a migrated base keep working,
//! the old v1 chunk objects become garbage reclaimed after the grace
//! period, and the ledger agrees with a rebuild afterwards.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use deltapack::format::{DecodedRoot, SCHEMA_V1, SCHEMA_V2, SCHEMA_V2_1};
use deltapack::store::{RestoreOutcome, RootFormat, RootStatus, Store, StoreConfig, SweepOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_fixture_v1_roots_and_a_mixed_chain() {
    let tmp = tempfile::tempdir().expect("tmp");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/2026-11-v1v2/store"),
        tmp.path(),
    );
    let url = format!("file://{}", tmp.path().display());
    let s = Store::open(
        &url,
        StoreConfig {
            grace: Duration::ZERO,
            ..config()
        },
    )
    .expect("open");

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
            .restore_with(*ns, *ctx, Default::default())
            .await
            .expect("restore")
        {
            RestoreOutcome::Hit(h) => {
                assert_eq!(h.digest, *digest, "{ctx}: snapshot digest unchanged")
            }
            RestoreOutcome::Miss(m) => panic!("{ctx}: {m}"),
        }
        // (The delta published over a v1 base was written as v2.1, with
        // its chain hints; migration leaves it as it is.)
        let schema = root.summary().expect("s").schema;
        assert!(schema == SCHEMA_V2 || schema == SCHEMA_V2_1, "{schema}");
    }
    assert_eq!(
        restore_bytes(&s, &id, cr).await,
        r.encoded(),
        "the delta on the migrated base"
    );

    // The v1 chunks are garbage now: nothing left under objects/sha256.
    let sha = tmp.path().join("objects/sha256");
    fn files(p: &Path) -> usize {
        std::fs::read_dir(p)
            .map(|d| {
                d.flatten()
                    .map(|e| {
                        if e.path().is_dir() {
                            files(&e.path())
                        } else {
                            1
                        }
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    let left = files(&sha);
    assert_eq!(left, 0, "v1 chunk objects reclaimed (grace 0)");
    let sweep = s.sweep(&SweepOptions::default()).await.expect("sweep");
    assert!(
        sweep.corrupt.is_empty() && sweep.missing.is_empty() && sweep.invalidated_roots.is_empty(),
        "{sweep:?}"
    );
    let image = s.ledger_image().await.expect("image");
    s.rebuild_ledger().await.expect("rebuild");
    assert_eq!(
        s.ledger_image().await.expect("image"),
        image,
        "ledger equals a rebuild after migration"
    );
    assert_eq!(s.migrate(None, false).await.expect("again").v1_roots, 0);
}

/// A keyed v1 root is never rewritten without its MAC: a migration without
/// the key skips it (and says why), a migration with the key migrates it
/// and the new root carries a MAC that verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_roots_migrate_only_with_the_key() {
    let tmp = tempfile::tempdir().expect("tmp");
    let url = format!("file://{}", tmp.path().display());
    let keyed_cfg = || StoreConfig {
        mac_secret: Some(b"migration test key".to_vec()),
        grace: Duration::ZERO,
        ..config()
    };
    let keyed = Store::open(&url, keyed_cfg()).expect("open");
    let id = identity("migrate-keyed");
    let (c, snap) = (ctx(&id, 82, 2048), turn(82, 2048));
    publish_base(&keyed, &id, c, snap.clone(), RootFormat::V1).await;
    let path = tmp
        .path()
        .join(deltapack::store::keys::root_key(&id.namespace(), &c).as_ref());
    let before = std::fs::read(&path).expect("root");
    assert!(deltapack::format::root::has_mac(&before));

    let plain = Store::open(
        &url,
        StoreConfig {
            grace: Duration::ZERO,
            ..config()
        },
    )
    .expect("open");
    for dry_run in [true, false] {
        let r = plain.migrate(None, dry_run).await.expect("migrate");
        assert!(r.migrated.is_empty(), "{r:?}");
        assert!(r.skipped.iter().any(|s| s.contains("keyed")), "{r:?}");
        assert_eq!(std::fs::read(&path).expect("root"), before, "untouched");
    }

    let r = keyed.migrate(None, false).await.expect("migrate");
    assert_eq!(r.migrated.len(), 1, "{r:?}");
    let after = std::fs::read(&path).expect("root");
    assert!(deltapack::format::root::has_mac(&after), "still keyed");
    assert_eq!(restore_bytes(&keyed, &id, c).await, snap.encoded());
}

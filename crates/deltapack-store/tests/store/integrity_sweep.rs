//! Integrity sweep: injected corruption of v1 and v2 objects is found and
//! quarantined, every root that needs a damaged or missing object is
//! invalidated together with the deltas built on it (no delta outlives its
//! base), orphans are reclaimed only after the grace period, a dry run
//! changes nothing, subsets n of m cover everything, and healthy roots are
//! untouched. Runs on local disk and the real S3 server.

use crate::common;

use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use deltapack_format::{DecodedRoot, Digest};
use deltapack_store::{keys, RestoreOutcome, RootFormat, RootStatus, Store, SweepOptions};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

async fn flip(s: &Store, key: &Path) {
    let mut b = stored(s.object_store(), key).await.to_vec();
    let n = b.len() / 2;
    b[n] ^= 0x80;
    s.object_store()
        .put(key, PutPayload::from_bytes(Bytes::from(b)))
        .await
        .expect("put");
}

async fn sweep_suite(t: TestStore) {
    let s = &t.store;
    let id = identity("sweep");
    // Chain A (v2): a0 <- a1 <- a2. Chain B (v1): b0 <- b1. Chain C (v2): c0 alone.
    let (a0, a1, a2) = (turn(61, 1024), turn(61, 3072), turn(61, 5120));
    let (ka0, ka1, ka2) = (ctx(&id, 61, 1024), ctx(&id, 61, 3072), ctx(&id, 61, 5120));
    publish_base(s, &id, ka0, a0.clone(), RootFormat::V2).await;
    publish_delta(s, &id, ka1, a1.clone(), ka0, a0.clone(), RootFormat::V2).await;
    publish_delta(s, &id, ka2, a2.clone(), ka1, a1.clone(), RootFormat::V2).await;
    let (b0, b1) = (turn(62, 1024), turn(62, 2048));
    let (kb0, kb1) = (ctx(&id, 62, 1024), ctx(&id, 62, 2048));
    publish_base(s, &id, kb0, b0.clone(), RootFormat::V1).await;
    publish_delta(s, &id, kb1, b1.clone(), kb0, b0.clone(), RootFormat::V1).await;
    let (c0, kc0) = (turn(63, 2048), ctx(&id, 63, 2048));
    publish_base(s, &id, kc0, c0.clone(), RootFormat::V2).await;

    // A clean store sweeps clean, and m subset runs check every object once.
    let clean = sweep(s).await;
    assert!(
        clean.corrupt.is_empty() && clean.missing.is_empty() && clean.invalidated_roots.is_empty(),
        "{clean:?}"
    );
    assert_eq!(clean.roots, 6);
    let mut covered = 0;
    for n in 0..4u8 {
        covered += s
            .sweep(&SweepOptions::default().with_subset(Some((n, 4))))
            .await
            .expect("sweep")
            .checked;
    }
    assert_eq!(
        covered, clean.checked,
        "{}: subsets cover every object exactly once",
        t.name
    );

    // Damage: corrupt an object of a1 (v2) and of b0 (v1); an orphan appears.
    let a1_only: Vec<Path> = {
        let a0k = object_keys(s, &id, &ka0).await;
        object_keys(s, &id, &ka1)
            .await
            .into_iter()
            .filter(|k| !a0k.contains(k))
            .collect()
    };
    let bad_v2 = a1_only[0].clone();
    let bad_v1 = object_keys(s, &id, &kb0).await[1].clone();
    flip(s, &bad_v2).await;
    flip(s, &bad_v1).await;
    let orphan = keys::object_key(&Digest::blake3(b"orphan bytes"));
    s.object_store()
        .put(
            &orphan,
            PutPayload::from_bytes(Bytes::from_static(b"orphan bytes")),
        )
        .await
        .expect("put");

    // Dry run: reports, changes nothing.
    let dry = s
        .sweep(&SweepOptions::default().with_dry_run(true))
        .await
        .expect("dry");
    assert_eq!(dry.corrupt.len(), 2, "{dry:?}");
    assert!(
        s.object_store().head(&bad_v2).await.is_ok(),
        "dry run left the object in place"
    );
    assert!(s.object_store().head(&orphan).await.is_ok());

    // Grace keeps the young orphan.
    let graced = dry_sweep(s).await;
    assert_eq!(graced.orphans_in_grace, 1);
    assert_eq!(graced.orphans_deleted, 0);

    let r = sweep(s).await;
    let mut corrupt = r.corrupt.clone();
    corrupt.sort();
    let mut want = vec![bad_v2.to_string(), bad_v1.to_string()];
    want.sort();
    assert_eq!(corrupt, want, "{}: exactly the damaged objects", t.name);
    for k in [&bad_v2, &bad_v1] {
        assert!(
            s.object_store().head(k).await.is_err(),
            "corrupt object removed from its key"
        );
        assert!(
            s.object_store()
                .head(&keys::quarantine_key(k))
                .await
                .is_ok(),
            "and quarantined"
        );
    }
    let mut inv = r.invalidated_roots.clone();
    inv.sort();
    let mut want_inv: Vec<String> = [ka1, ka2, kb0, kb1]
        .iter()
        .map(|c| keys::root_key(&id.namespace(), c).to_string())
        .collect();
    want_inv.sort();
    assert_eq!(
        inv, want_inv,
        "{}: damaged roots and every delta above them",
        t.name
    );
    assert!(r.orphans_deleted >= 1 && r.reclaimed_bytes >= 12, "{r:?}");
    assert!(
        s.object_store().head(&orphan).await.is_err(),
        "orphan reclaimed"
    );

    // Healthy roots still restore exactly; invalidated ones are misses.
    assert_eq!(restore_bytes(s, &id, ka0).await, a0.encoded());
    assert_eq!(restore_bytes(s, &id, kc0).await, c0.encoded());
    for c in [ka1, ka2, kb0, kb1] {
        assert!(matches!(
            s.restore((&id, c), Default::default())
                .await
                .expect("restore"),
            RestoreOutcome::Miss(_)
        ));
    }
    // Objects only the invalidated roots used are now orphans; a second
    // sweep reclaims them and finds nothing wrong.
    let again = sweep(s).await;
    assert!(
        again.corrupt.is_empty() && again.missing.is_empty() && again.invalidated_roots.is_empty(),
        "{again:?}"
    );
    assert!(again.orphans_deleted > 0);
    let last = sweep(s).await;
    assert_eq!(last.orphans_deleted, 0);
    let RootStatus::Found(r) = s.read_root(&id.namespace(), &ka0).await.expect("read") else {
        panic!()
    };
    assert!(matches!(*r, DecodedRoot::V2(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_local_disk() {
    sweep_suite(local(config())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_s3() {
    if let Some(t) = s3(config()) {
        sweep_suite(t).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_removes_only_old_staging_files() {
    let t = local(config());
    let root = match t.store.backend_kind() {
        deltapack_store::BackendKind::Local { root } => root.clone(),
        _ => unreachable!(),
    };
    let dir = root.join("objects/blake3/aa");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("aabb#1"), b"torn").expect("write");
    std::fs::write(dir.join("aabb#2"), b"being written").expect("write");
    let old = std::time::SystemTime::now() - Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(dir.join("aabb#1"))
        .and_then(|f| f.set_modified(old))
        .expect("age the torn staging file");
    let kept = t
        .store
        .sweep(&SweepOptions::default().with_grace(Duration::from_secs(3600)))
        .await
        .expect("sweep");
    assert_eq!(kept.staging_removed, 0);
    let r = sweep(&t.store).await;
    assert_eq!(r.staging_removed, 1);
    assert!(!dir.join("aabb#1").exists());
    assert!(
        dir.join("aabb#2").exists(),
        "a fresh staging file may belong to a live writer"
    );
}

/// A sweep invalidates only the root it judged. A delta whose base root is
/// gone (evicted by another process while the delta was published) is
/// invalidated by the sweep; if another process republishes that context
/// — here as a flat root, whole and healthy — after the sweep read it, the
/// sweep must not move the new root to quarantine. The race is placed
/// right after the sweep's read of the root (the fault wrapper acts as soon
/// as that read is served). Found by the CLI's `chaos_kill9` suite (`crates/deltapack-cli/tests/cli/chaos_kill9.rs`)
/// (a healthy flat root in `quarantine/`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_does_not_quarantine_a_root_republished_after_it_read_it() {
    use common::faults::{FaultPlan, Race};
    use deltapack_store::RootFormat;
    use futures::TryStreamExt;

    let mut failures = Vec::new();
    for on in [Scratch::Memory, Scratch::Local] {
        let (raw, _dir) = on.backend().expect("a scratch backend");
        let (faulty, s) = faulty_handle(&raw, config());
        let id = identity("sweep-republished");
        let (b, r) = (turn(64, 1024), turn(64, 2048));
        let (kb, kr) = (ctx(&id, 64, 1024), ctx(&id, 64, 2048));
        publish_base(&s, &id, kb, b.clone(), RootFormat::V2).await;
        publish_delta(&s, &id, kr, r.clone(), kb, b.clone(), RootFormat::V2).await;
        // The same context published flat elsewhere: its root and objects.
        let other = memory(config());
        publish_base(&other.store, &id, kr, r.clone(), RootFormat::V2).await;
        let listed: Vec<_> = other
            .store
            .object_store()
            .list(None)
            .try_collect()
            .await
            .expect("list");
        let rk = keys::root_key(&id.namespace(), &kr);
        let mut flat_root = Bytes::new();
        for m in listed {
            let body = stored(other.store.object_store(), &m.location).await;
            if m.location == rk {
                flat_root = body;
            } else {
                raw.store
                    .put(&m.location, PutPayload::from_bytes(body))
                    .await
                    .expect("copy object");
            }
        }
        // Another process evicted the base: the delta is stranded.
        raw.store
            .delete(&keys::root_key(&id.namespace(), &kb))
            .await
            .expect("evict base");
        // ... and republishes the context flat right after the sweep read it.
        faulty.set_plan(FaultPlan {
            race: Some(Race::Put(rk.clone(), flat_root.clone())),
            race_after_put: "arm/",
            ..Default::default()
        });
        faulty
            .put(&Path::from("arm/now"), PutPayload::from_static(b"arm"))
            .await
            .expect("arm the race");
        let report = s
            .sweep(&SweepOptions::default().with_grace(Duration::from_secs(3600)))
            .await
            .expect("sweep");
        if raw.store.head(&rk).await.is_err() {
            failures.push(format!(
                "{on:?}: the republished flat root was moved to quarantine: {report:?}"
            ));
            continue;
        }
        let fresh = wrapped(raw.clone(), config());
        assert_eq!(restore_bytes(&fresh, &id, kr).await, r.encoded(), "{on:?}");
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

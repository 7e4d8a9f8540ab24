//! Conformance: one behavioural suite, run unchanged against every backend —
//! memory, a temp-dir local disk store (fsync on), and a real S3-compatible
//! server on 127.0.0.1. It guards that publication and restore mean the same
//! thing everywhere: bit-exact round trips for v2, v1 and mixed chains,
//! idempotent re-publication, conflicts that never alias two snapshots,
//! validation before any write, `restore_into`, `lookup`, and compressed
//! extents.

use std::sync::Arc;

use crate::common::*;
use deltapack_format::{synth, ContextDigest, Snapshot};
use deltapack_store::{
    MissReason, PublishOutcome, PublishRequest, RestoreOptions, RestoreOutcome, RootFormat, Store,
    StoreError,
};
use futures::TryStreamExt;

/// Whether a refused publication's error is the one expected.
type Refusal = fn(&StoreError) -> bool;

async fn object_count(store: &Store) -> usize {
    store
        .object_store()
        .list(None)
        .try_collect::<Vec<_>>()
        .await
        .expect("list")
        .len()
}

async fn suite(t: TestStore) {
    let s = &t.store;
    let name = t.name;
    let id = identity(&format!("conformance-{name}"));

    // --- v2 base + v2 delta chain, bit exact.
    let (b0, b1, b2) = (turn(1, 2048), turn(1, 4096), turn(1, 6144));
    let (c0, c1, c2) = (ctx(&id, 1, 2048), ctx(&id, 1, 4096), ctx(&id, 1, 6144));
    let r0 = publish_base(s, &id, c0, b0.clone(), RootFormat::V2).await;
    assert_eq!(r0.outcome, PublishOutcome::Created, "{name}");
    assert!(r0.objects_written > 1, "{name}: several extents expected");
    let r1 = publish_delta(s, &id, c1, b1.clone(), c0, b0.clone(), RootFormat::V2).await;
    assert_eq!(r1.outcome, PublishOutcome::Created);
    assert!(
        r1.payload_len < b1.encoded().len() as u64,
        "{name}: the delta stores less than the snapshot"
    );
    let r2 = publish_delta(s, &id, c2, b2.clone(), c1, b1.clone(), RootFormat::V2).await;
    assert_eq!(r2.outcome, PublishOutcome::Created);
    assert_eq!(
        restore_bytes(s, &id, c0).await,
        b0.encoded(),
        "{name}: base"
    );
    assert_eq!(
        restore_bytes(s, &id, c1).await,
        b1.encoded(),
        "{name}: delta"
    );
    assert_eq!(
        restore_bytes(s, &id, c2).await,
        b2.encoded(),
        "{name}: delta of delta"
    );

    // --- v1 roots and mixed chains: v1 base + v2 delta, v2 base + v1 delta.
    let (v0, v1s) = (turn(2, 1024), turn(2, 3072));
    let (d0, d1) = (ctx(&id, 2, 1024), ctx(&id, 2, 3072));
    let r = publish_base(s, &id, d0, v0.clone(), RootFormat::V1).await;
    assert_eq!(r.outcome, PublishOutcome::Created);
    assert_eq!(
        r.objects_written, 4,
        "{name}: v1 writes one object per 256-token chunk"
    );
    publish_delta(s, &id, d1, v1s.clone(), d0, v0.clone(), RootFormat::V2).await;
    assert_eq!(restore_bytes(s, &id, d0).await, v0.encoded());
    assert_eq!(
        restore_bytes(s, &id, d1).await,
        v1s.encoded(),
        "{name}: v1 base + v2 delta"
    );
    let (e1, e1s) = (ctx(&id, 1, 5120), turn(1, 5120));
    publish_delta(s, &id, e1, e1s.clone(), c0, b0.clone(), RootFormat::V1).await;
    assert_eq!(
        restore_bytes(s, &id, e1).await,
        e1s.encoded(),
        "{name}: v2 base + v1 delta"
    );

    // --- Idempotence (also v1 against v2 of the same snapshot) and conflict.
    let again = publish_base(s, &id, c0, b0.clone(), RootFormat::V2).await;
    assert_eq!(again.outcome, PublishOutcome::AlreadyPresent);
    assert_eq!(again.objects_written, 0);
    let cross = publish_base(s, &id, c0, b0.clone(), RootFormat::V1).await;
    assert_eq!(
        cross.outcome,
        PublishOutcome::AlreadyPresent,
        "{name}: v1 vs v2 of one snapshot"
    );
    let other = turn(99, 2048);
    let conflict = publish_base(s, &id, c0, other.clone(), RootFormat::V2).await;
    assert_eq!(conflict.outcome, PublishOutcome::Conflict);
    assert_eq!(conflict.existing_snapshot_digest, Some(v2_digest(&b0)));
    assert_eq!(
        restore_bytes(s, &id, c0).await,
        b0.encoded(),
        "{name}: the existing root wins"
    );

    // --- Validation before any write.
    let before = object_count(s).await;
    let bad_boundary = Arc::new(synth::snapshot(synth::Preset::Tiny, 3, 1000).expect("synth"));
    // A delta of conversation 1 at `n` tokens on `base`, published (or
    // not) under `bc`.
    let delta_at = |n: u64, bc: ContextDigest, base: &Arc<Snapshot>| {
        delta(
            &id,
            ctx(&id, 1, n as usize),
            &turn(1, n),
            bc,
            base,
            RootFormat::V2,
        )
    };
    let refused: [(&str, PublishRequest, Refusal); 4] = [
        (
            "boundary 1000 is not a multiple of 256",
            flat(&id, ctx(&id, 3, 1000), &bad_boundary, RootFormat::V2),
            |e| matches!(e, StoreError::Invalid(_)),
        ),
        (
            "base snapshot does not match the base root",
            delta_at(8192, c1, &other),
            |e| matches!(e, StoreError::Invalid(_) | StoreError::BaseMismatch { .. }),
        ),
        (
            "no base root",
            delta_at(8192, ctx(&id, 7, 2048), &turn(7, 2048)),
            |e| matches!(e, StoreError::BaseMismatch { .. }),
        ),
        ("base above result", delta_at(2048, c1, &b1), |e| {
            matches!(e, StoreError::Invalid(_))
        }),
    ];
    for (why, req, expected) in refused {
        let err = s.publish(req).await.expect_err(why);
        assert!(expected(&err), "{name}: {why}: {err}");
    }
    assert_eq!(
        object_count(s).await,
        before,
        "{name}: rejected publications wrote nothing"
    );

    // --- Misses and restore_into.
    match s
        .restore((&id, ctx(&id, 42, 256)), Default::default())
        .await
        .expect("restore")
    {
        RestoreOutcome::Miss(MissReason::Absent) => {}
        other => panic!("{name}: expected absent, got {other:?}"),
    }
    let mut buf = vec![0u8; b2.encoded().len()];
    assert_restored_into(s, (&id, c2), &mut buf, b2.encoded(), name).await;
    let mut small = vec![0u8; 10];
    assert!(s
        .restore_into((&id, c2), &mut small, RestoreOptions::default())
        .await
        .is_err());

    // --- lookup: longest published boundary among candidates, no payload reads.
    let hasher =
        deltapack_format::ContextHasher::new(id.namespace(), id.chunk_tokens).expect("hasher");
    let candidates = hasher.boundaries(&synth::tokens(1, 8192));
    assert_eq!(candidates.len(), 32);
    let found = s.lookup(&id, &candidates).await.expect("lookup");
    assert_eq!(found, Some((6144, c2)), "{name}");
    let none = s
        .lookup(&id, &hasher.boundaries(&synth::tokens(77, 1024)))
        .await
        .expect("lookup");
    assert_eq!(none, None);

    // --- inspect lists every root.
    let roots = s.inspect(Some(&id.namespace())).await.expect("inspect");
    assert_eq!(roots.len(), 6, "{name}: {roots:?}");
}

async fn compressed(t: TestStore) {
    let s = &t.store;
    let id = identity("compressed");
    let (a, b) = (turn(5, 2048), turn(5, 4096));
    let (ca, cb) = (ctx(&id, 5, 2048), ctx(&id, 5, 4096));
    publish_base(s, &id, ca, a.clone(), RootFormat::V2).await;
    publish_delta(s, &id, cb, b.clone(), ca, a.clone(), RootFormat::V2).await;
    let root = s.read_root(&id.namespace(), &cb).await.expect("read");
    let deltapack_store::RootStatus::Found(r) = root else {
        panic!("root")
    };
    let deltapack_format::DecodedRoot::V2(m) = *r else {
        panic!("v2")
    };
    assert!(
        m.extents
            .iter()
            .any(|e| e.codec == deltapack_format::ExtentCodec::Zstd),
        "{}: bf16-like synthetic pages compress",
        t.name
    );
    assert_eq!(restore_bytes(s, &id, cb).await, b.encoded());
}

fn zstd_config() -> deltapack_store::StoreConfig {
    config().with_compression(Some(3))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_memory() {
    suite(memory(config())).await;
    compressed(memory(zstd_config())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_local_disk() {
    suite(local(config())).await;
    compressed(local(zstd_config())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_s3() {
    let Some(t) = s3(config()) else { return };
    suite(t).await;
    if let Some(t) = s3(zstd_config()) {
        compressed(t).await;
    }
}

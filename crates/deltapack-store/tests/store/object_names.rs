//! An object's name is the hash of the bytes written under it — and a
//! publication never relies on a name merely because an object exists.
//!
//! The poisoning sequence this guards (reproduced with the release CLI
//! before the fix): a publication whose input changed while it ran stored
//! objects under names of bytes they did not hold; a second, correct
//! publication of the *unchanged* snapshot under another context then found
//! those names present, reused them, answered success — and its restore was
//! `corrupt`. An acknowledged, correct publication lost because of someone
//! else's bad input. Here the bad objects are made directly, as such a
//! writer (or an older version of this code) left them: same names, same
//! sizes, other bytes. A publication that finds them proves the mismatch
//! (read twice), quarantines them and writes its own; one that finds good
//! objects still reuses them. On local disk, on the S3 test server (plain
//! and multipart extents) and in memory.

use std::sync::Arc;

use bytes::Bytes;
use deltapack_format::{ContextDigest, Snapshot};
use deltapack_store::{Backend, RootFormat, Store, StoreConfig};
use object_store::{ObjectStoreExt, PutPayload};

use crate::common::*;

/// A store and a raw handle on the same bucket/directory (to damage
/// objects behind the store's back).
fn store_and_raw(
    kind: Scratch,
    config: StoreConfig,
) -> Option<(Store, Backend, Option<tempfile::TempDir>)> {
    let (raw, dir) = kind.backend()?;
    let store = through(&raw, raw.store.clone(), config);
    Some((store, raw, dir))
}

/// Replaces every object `ctx`'s root names with other bytes of the same
/// length (each byte inverted), as a writer whose input changed between
/// hashing and writing would have left them. Returns how many.
async fn poison(
    store: &Store,
    raw: &Backend,
    id: &deltapack_format::CacheIdentity,
    ctx: ContextDigest,
) -> usize {
    let keys = object_keys(store, id, &ctx).await;
    for k in &keys {
        let good = raw
            .store
            .get(k)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        let bad: Vec<u8> = good.iter().map(|b| !b).collect();
        raw.store
            .put(k, PutPayload::from(Bytes::from(bad)))
            .await
            .expect("overwrite");
    }
    keys.len()
}

async fn poisoned_names_are_never_reused(kind: Scratch, config: StoreConfig) {
    let Some((store, raw, _dir)) = store_and_raw(kind, config) else {
        return;
    };
    let id = identity(&format!("object-names-{kind:?}"));
    let snap: Arc<Snapshot> = turn(41, 4096);
    let (c1, c2, c3) = (ctx(&id, 41, 4096), ctx(&id, 42, 4096), ctx(&id, 43, 4096));

    let first = publish_base(&store, &id, c1, snap.clone(), RootFormat::V2).await;
    assert!(first.objects_written > 0);
    let n = poison(&store, &raw, &id, c1).await;
    assert!(n > 1, "{kind:?}: want several objects, got {n}");

    // The unchanged snapshot under another context: the names exist, their
    // bytes are wrong. Before the fix every one was reused (rc 0, restore
    // corrupt).
    let second = publish_base(&store, &id, c2, snap.clone(), RootFormat::V2).await;
    assert_eq!(
        second.objects_reused, 0,
        "{kind:?}: an object that does not hold its name's bytes was reused"
    );
    assert_eq!(
        second.objects_written as usize, n,
        "{kind:?}: every bad object rewritten"
    );
    assert_restores(
        &store,
        &id,
        &[(c2, snap.clone())],
        &format!("{kind:?} second"),
    )
    .await;
    // The first root named the right digests all along: with the objects
    // rewritten it restores too.
    assert_restores(
        &store,
        &id,
        &[(c1, snap.clone())],
        &format!("{kind:?} first"),
    )
    .await;
    // Good objects are still reused, not rewritten.
    let third = publish_base(&store, &id, c3, snap.clone(), RootFormat::V2).await;
    assert_eq!(
        third.objects_reused as usize, n,
        "{kind:?}: good objects reused"
    );
    assert_eq!(third.objects_written, 0, "{kind:?}");
    // The bad copies were quarantined (proof: two reads), nothing is damaged.
    assert!(
        store.stats().quarantined >= n as u64,
        "{kind:?}: {} quarantined, want {n}",
        store.stats().quarantined
    );
    let report = sweep(&store).await;
    assert_no_damage(&report, &format!("{kind:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_disk() {
    poisoned_names_are_never_reused(Scratch::Local, config()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory() {
    poisoned_names_are_never_reused(Scratch::Memory, config()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3() {
    poisoned_names_are_never_reused(Scratch::S3, config()).await;
}

/// Extents above `part_bytes` go up as multipart uploads, which check the
/// key first (HEAD-then-write): the same rule holds there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_multipart() {
    const MIB: u64 = 1 << 20;
    let config = StoreConfig::default()
        .with_max_extent_bytes(16 * MIB)
        .with_part_bytes(5 * MIB);
    let Some((store, raw, _dir)) = store_and_raw(Scratch::S3, config) else {
        return;
    };
    let id = identity("object-names-multipart");
    // The default preset: extents of 16 MiB, several parts each.
    let snap = Arc::new(
        deltapack_format::synth::snapshot(deltapack_format::synth::Preset::Default, 9, 8192)
            .expect("synth"),
    );
    let (c1, c2) = (ctx(&id, 91, 8192), ctx(&id, 92, 8192));
    publish_base(&store, &id, c1, snap.clone(), RootFormat::V2).await;
    let n = poison(&store, &raw, &id, c1).await;
    let second = publish_base(&store, &id, c2, snap.clone(), RootFormat::V2).await;
    assert_eq!(
        second.objects_reused, 0,
        "a bad multipart-sized object was reused"
    );
    assert_eq!(second.objects_written as usize, n);
    assert_restores(&store, &id, &[(c1, snap.clone()), (c2, snap)], "multipart").await;
}

/// The legacy v1 writer (one SHA-256 object per chunk) follows the rule too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_v1_chunks() {
    let Some((store, raw, _dir)) = store_and_raw(Scratch::Local, config()) else {
        return;
    };
    let id = identity("object-names-v1");
    let snap = turn(44, 2048);
    let (c1, c2) = (ctx(&id, 44, 2048), ctx(&id, 45, 2048));
    publish_base(&store, &id, c1, snap.clone(), RootFormat::V1).await;
    let n = poison(&store, &raw, &id, c1).await;
    let second = publish_base(&store, &id, c2, snap.clone(), RootFormat::V1).await;
    assert_eq!(second.objects_reused, 0);
    assert_eq!(second.objects_written as usize, n);
    assert_restores(&store, &id, &[(c1, snap.clone()), (c2, snap)], "v1").await;
}

//! Bad input from storage: every kind of damage to stored bytes must end in a
//! clean miss with the right reason — never a panic, never wrong bytes — and
//! a corrupt object or root must be quarantined. Runs against a real local
//! disk store and the real S3 server (and memory), tampering through the same
//! `ObjectStore` API an attacker or a bad disk would affect.

use crate::common::*;
use bytes::Bytes;
use deltapack_format::{CacheIdentity, ContextDigest, DecodedRoot, Digest};
use deltapack_store::{keys, MissReason, RestoreOutcome, RootFormat, RootStatus, Store};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

struct Fixture {
    t: TestStore,
    id: CacheIdentity,
    base_ctx: ContextDigest,
    ctx: ContextDigest,
}

async fn fixture(on: Scratch, format: RootFormat) -> Option<Fixture> {
    let t = on.store(config())?;
    let id = identity("bad-input");
    let (a, b) = (turn(11, 2048), turn(11, 4096));
    let (ca, cb) = (ctx(&id, 11, 2048), ctx(&id, 11, 4096));
    publish_base(&t.store, &id, ca, a.clone(), format).await;
    publish_delta(&t.store, &id, cb, b, ca, a, format).await;
    Some(Fixture {
        t,
        id,
        base_ctx: ca,
        ctx: cb,
    })
}

async fn get(s: &Store, key: &Path) -> Vec<u8> {
    stored(s.object_store(), key).await.to_vec()
}

async fn put(s: &Store, key: &Path, bytes: Vec<u8>) {
    s.object_store()
        .put(key, PutPayload::from_bytes(Bytes::from(bytes)))
        .await
        .expect("put");
}

async fn exists(s: &Store, key: &Path) -> bool {
    s.object_store().head(key).await.is_ok()
}

async fn expect_miss(f: &Fixture, ctx: ContextDigest, want: &str) -> MissReason {
    let outcome =
        f.t.store
            .restore((&f.id, ctx), Default::default())
            .await
            .expect("restore must not error");
    // Moves to quarantine are queued off the read path: wait for them.
    f.t.store.settle_quarantines().await;
    match outcome {
        RestoreOutcome::Miss(m) => {
            assert_eq!(m.label(), want, "{}: {m}", f.t.name);
            m
        }
        RestoreOutcome::Hit(_) => panic!(
            "{}: damaged store restored as a hit (expected {want})",
            f.t.name
        ),
    }
}

/// Flip a byte at the start, middle and end of each object in turn.
async fn flipped_bytes(on: Scratch, format: RootFormat) {
    let Some(probe) = fixture(on, format).await else {
        return;
    };
    let n = object_keys(&probe.t.store, &probe.id, &probe.ctx)
        .await
        .len();
    for i in 0..n {
        for pos in [0.0, 0.5, 1.0] {
            let f = fixture(on, format).await.expect("fixture");
            let s = &f.t.store;
            let key = object_keys(s, &f.id, &f.ctx).await[i].clone();
            let mut b = get(s, &key).await;
            if b.is_empty() {
                continue;
            }
            let at = ((b.len() - 1) as f64 * pos) as usize;
            b[at] ^= 0x01;
            put(s, &key, b).await;
            expect_miss(&f, f.ctx, "corrupt").await;
            assert!(
                !exists(s, &key).await,
                "{}: corrupt object left in place",
                f.t.name
            );
            assert!(
                exists(s, &keys::quarantine_key(&key)).await,
                "{}: corrupt object not quarantined",
                f.t.name
            );
            assert_eq!(s.stats().quarantined, 1);
            // The base is untouched and still restores exactly.
            assert_eq!(
                restore_bytes(s, &f.id, f.base_ctx).await,
                turn(11, 2048).encoded()
            );
        }
    }
}

async fn truncated_extended_missing(on: Scratch, format: RootFormat) {
    for case in ["truncate", "extend", "delete", "swap"] {
        let Some(f) = fixture(on, format).await else {
            return;
        };
        let s = &f.t.store;
        let ks = object_keys(s, &f.id, &f.ctx).await;
        let key = ks[ks.len() / 2].clone();
        match case {
            "truncate" => {
                let b = get(s, &key).await;
                put(s, &key, b[..b.len() - 1].to_vec()).await;
            }
            "extend" => {
                let mut b = get(s, &key).await;
                b.push(0);
                put(s, &key, b).await;
            }
            "delete" => s.object_store().delete(&key).await.expect("delete"),
            "swap" => {
                let other = ks
                    .iter()
                    .find(|k| **k != key)
                    .expect("another object")
                    .clone();
                let (x, y) = (get(s, &key).await, get(s, &other).await);
                put(s, &key, y).await;
                put(s, &other, x).await;
            }
            _ => unreachable!(),
        }
        let m = expect_miss(&f, f.ctx, "corrupt").await;
        if case == "delete" {
            assert!(m.to_string().contains("missing"), "{m}");
        }
    }
}

async fn damaged_roots(on: Scratch) {
    // Wrong body digest.
    let Some(f) = fixture(on, RootFormat::V2).await else {
        return;
    };
    let s = &f.t.store;
    let rk = keys::root_key(&f.id.namespace(), &f.ctx);
    let mut b = get(s, &rk).await;
    let n = b.len();
    b[n - 3] ^= 0x40;
    put(s, &rk, b).await;
    expect_miss(&f, f.ctx, "corrupt").await;
    assert!(
        exists(s, &keys::quarantine_key(&rk)).await,
        "corrupt root quarantined"
    );

    // A root copied under another context is refused.
    let f = fixture(on, RootFormat::V2).await.expect("fixture");
    let s = &f.t.store;
    let rk = keys::root_key(&f.id.namespace(), &f.ctx);
    let elsewhere = ctx(&f.id, 12, 4096);
    put(
        s,
        &keys::root_key(&f.id.namespace(), &elsewhere),
        get(s, &rk).await,
    )
    .await;
    let m = expect_miss(&f, elsewhere, "corrupt").await;
    assert!(m.to_string().contains("another key"), "{m}");
    assert_eq!(
        restore_bytes(s, &f.id, f.ctx).await,
        turn(11, 4096).encoded(),
        "the real root still works"
    );

    // Unknown schema and unknown envelope version: incompatible.
    let body = serde_cbor::to_vec(&std::collections::BTreeMap::from([(
        "schema",
        "deltapack-page-delta-manifest/v9",
    )]))
    .expect("cbor");
    let env = forge(&body);
    let c9 = ctx(&f.id, 13, 256);
    put(s, &keys::root_key(&f.id.namespace(), &c9), env.clone()).await;
    expect_miss(&f, c9, "incompatible").await;
    let mut v2env = env.clone();
    v2env[8] = 2;
    let c10 = ctx(&f.id, 14, 256);
    put(s, &keys::root_key(&f.id.namespace(), &c10), v2env).await;
    expect_miss(&f, c10, "incompatible").await;

    // Huge length field: refused before allocation.
    let mut huge = get(s, &rk).await;
    huge[12..20].copy_from_slice(&(1u64 << 63).to_le_bytes());
    let c11 = ctx(&f.id, 15, 256);
    put(s, &keys::root_key(&f.id.namespace(), &c11), huge).await;
    expect_miss(&f, c11, "corrupt").await;

    // Not a root at all, and an empty object.
    let c12 = ctx(&f.id, 16, 256);
    put(
        s,
        &keys::root_key(&f.id.namespace(), &c12),
        b"hello".to_vec(),
    )
    .await;
    expect_miss(&f, c12, "corrupt").await;

    // Base root gone: the delta is a base-missing miss.
    s.object_store()
        .delete(&keys::root_key(&f.id.namespace(), &f.base_ctx))
        .await
        .expect("delete base root");
    expect_miss(&f, f.ctx, "base-missing").await;
}

/// A well-formed root whose manifest lists an object digest whose key holds
/// other bytes with the right length: verification, not the size check,
/// must catch it.
async fn substituted_object(on: Scratch) {
    let Some(f) = fixture(on, RootFormat::V2).await else {
        return;
    };
    let s = &f.t.store;
    let RootStatus::Found(r) = s.read_root(&f.id.namespace(), &f.ctx).await.expect("read") else {
        panic!()
    };
    let DecodedRoot::V2(m) = *r else { panic!("v2") };
    let e = m.extents[0];
    let key = keys::object_key(&e.object_digest());
    put(s, &key, vec![0x5a; e.stored_len as usize]).await;
    expect_miss(&f, f.ctx, "corrupt").await;
    assert_ne!(
        e.object_digest(),
        Digest::blake3(&vec![0x5a; e.stored_len as usize])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bytes_in_every_object_local_v2_and_v1() {
    flipped_bytes(Scratch::Local, RootFormat::V2).await;
    flipped_bytes(Scratch::Local, RootFormat::V1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bytes_in_every_object_s3() {
    flipped_bytes(Scratch::S3, RootFormat::V2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_extended_missing_swapped_objects() {
    for on in [Scratch::Memory, Scratch::Local, Scratch::S3] {
        truncated_extended_missing(on, RootFormat::V2).await;
        truncated_extended_missing(on, RootFormat::V1).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_misplaced_unknown_and_huge_roots() {
    for on in [Scratch::Memory, Scratch::Local, Scratch::S3] {
        damaged_roots(on).await;
        substituted_object(on).await;
    }
}

//! One verification path: `Store::verify_root` checks every object a root
//! references with the same check the restore's blame pass and the sweep
//! use, says which check each failed (expected against found), and never
//! writes; a restore's miss names the damaged object and its check, so no
//! caller (compat, an operator's script) has to search error text for a key.

use crate::common::*;
use bytes::Bytes;
use deltapack_format::{Algorithm, DecodedRoot};
use deltapack_store::{
    keys, MissReason, ObjectCheck, ObjectKey, RestoreOutcome, RootFormat, RootStatus, Store,
};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

/// The objects a root references, in its order.
async fn objects_of(
    s: &Store,
    id: &deltapack_format::CacheIdentity,
    c: deltapack_format::ContextDigest,
) -> Vec<(ObjectKey, u64)> {
    let RootStatus::Found(r) = s.peek_root(&id.namespace(), &c).await.expect("read") else {
        panic!("root")
    };
    r.summary()
        .expect("summary")
        .objects
        .iter()
        .map(|(d, len)| (ObjectKey(*d), *len))
        .collect()
}

async fn get(s: &Store, key: &Path) -> Vec<u8> {
    s.object_store()
        .get(key)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes")
        .to_vec()
}

async fn put(s: &Store, key: &Path, b: Vec<u8>) {
    s.object_store()
        .put(key, PutPayload::from_bytes(Bytes::from(b)))
        .await
        .expect("put");
}

/// Flips one bit in the middle of the object.
async fn flip(s: &Store, key: &Path) {
    let mut b = get(s, key).await;
    let n = b.len() / 2;
    b[n] ^= 0x80;
    put(s, key, b).await;
}

async fn every_failure_is_named(t: TestStore) {
    let s = &t.store;
    let id = identity("verify-root");
    let c = ctx(&id, 81, 4096);
    publish_base(s, &id, c, turn(81, 4096), RootFormat::V2).await;
    let objects = objects_of(s, &id, c).await;
    assert!(
        objects.len() >= 3,
        "{}: want three extents, got {}",
        t.name,
        objects.len()
    );

    let v = s.verify_root((&id, c)).await.expect("verify");
    assert!(v.is_intact(), "{}: {v:?}", t.name);
    assert_eq!(v.schema, Some("deltapack-page-delta-manifest/v2.2"));
    let named: Vec<ObjectKey> = v.objects.iter().map(|o| o.object).collect();
    let want: Vec<ObjectKey> = objects.iter().map(|(k, _)| *k).collect();
    assert_eq!(named, want, "every referenced object, in the root's order");

    // Damage three extents three ways.
    let (k0, k1, k2) = (objects[0].0, objects[1].0, objects[2].0);
    flip(s, &k0.path()).await;
    let mut short = get(s, &k1.path()).await;
    short.pop();
    put(s, &k1.path(), short).await;
    s.object_store().delete(&k2.path()).await.expect("delete");
    let listed_before = listed_bytes(s).await;

    let v = s.verify_root((&id, c)).await.expect("verify");
    assert!(!v.is_intact());
    assert!(v.unusable.is_none(), "the root itself is fine");
    let failed: Vec<_> = v
        .objects
        .iter()
        .filter_map(|o| o.failed.clone().map(|f| (o.object, f)))
        .collect();
    assert_eq!(failed.len(), 3, "{}: {failed:?}", t.name);
    match &failed[0] {
        (k, ObjectCheck::Name { expected, found })
        | (k, ObjectCheck::StoredDigest { expected, found }) => {
            assert_eq!(*k, k0);
            assert_ne!(expected, found);
        }
        other => panic!(
            "{}: a flipped bit is a digest failure, got {other:?}",
            t.name
        ),
    }
    assert_eq!(
        failed[1],
        (
            k1,
            ObjectCheck::Size {
                expected: objects[1].1,
                found: objects[1].1 - 1
            }
        )
    );
    assert_eq!(failed[2], (k2, ObjectCheck::Missing));
    assert_eq!(v.first_failure().map(|(k, _)| *k), Some(k0));

    // Reported, not acted on: nothing quarantined, nothing written.
    assert_eq!(s.stats().quarantined, 0);
    assert!(
        s.object_store().head(&k0.path()).await.is_ok(),
        "the damaged object stays"
    );
    assert_eq!(listed_bytes(s).await, listed_before);

    // An absent root is unusable as absent.
    let v = s
        .verify_root((&id, ctx(&id, 82, 1024)))
        .await
        .expect("verify");
    assert_eq!(v.unusable, Some(MissReason::Absent));
    assert!(v.objects.is_empty());
}

#[tokio::test]
async fn verify_root_names_each_failed_object_and_check_and_writes_nothing() {
    every_failure_is_named(local(config())).await;
    every_failure_is_named(memory(config())).await;
    if let Some(t) = s3(config()) {
        every_failure_is_named(t).await;
    }
}

#[tokio::test]
async fn verify_root_checks_legacy_chunks_by_their_sha256() {
    let t = local(config());
    let s = &t.store;
    let id = identity("verify-v1");
    let c = ctx(&id, 83, 1024);
    publish_base(s, &id, c, turn(83, 1024), RootFormat::V1).await;
    let objects = objects_of(s, &id, c).await;
    assert!(objects
        .iter()
        .all(|(k, _)| k.0.algorithm() == Algorithm::Sha256));
    assert!(s.verify_root((&id, c)).await.expect("verify").is_intact());
    flip(s, &objects[0].0.path()).await;
    let v = s.verify_root((&id, c)).await.expect("verify");
    match v.first_failure() {
        Some((k, ObjectCheck::Name { expected, found })) => {
            assert_eq!(*k, objects[0].0);
            assert_eq!(*expected, objects[0].0 .0);
            assert_ne!(found, expected);
        }
        other => panic!("expected a SHA-256 name failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_restore_miss_names_the_damaged_object_and_its_check() {
    let t = local(config());
    let s = &t.store;
    let id = identity("miss-names");
    let (c0, c1) = (ctx(&id, 84, 2048), ctx(&id, 84, 4096));
    let (t0, t1) = (turn(84, 2048), turn(84, 4096));
    publish_base(s, &id, c0, t0.clone(), RootFormat::V2).await;
    publish_delta(s, &id, c1, t1, c0, t0, RootFormat::V2).await;
    let RootStatus::Found(root) = s.peek_root(&id.namespace(), &c0).await.expect("read") else {
        panic!("root")
    };
    let DecodedRoot::V2(m) = *root else {
        panic!("v2")
    };
    let damaged = ObjectKey(m.extents[0].object_digest());
    flip(s, &damaged.path()).await;

    // The delta on the damaged base: a miss naming the base's object.
    let out = s
        .restore((&id, c1), Default::default())
        .await
        .expect("restore");
    let RestoreOutcome::Miss(miss) = out else {
        panic!("a damaged base restored")
    };
    assert_eq!(miss.object(), Some(&damaged), "{miss}");
    let json = serde_json::to_value(&miss).expect("json");
    assert_eq!(json["object"], damaged.path().to_string(), "{json}");

    // The base itself: a corrupt miss with the object and the check.
    let t2 = local(config());
    let s2 = &t2.store;
    publish_base(s2, &id, c0, turn(84, 2048), RootFormat::V2).await;
    flip(s2, &damaged.path()).await;
    match s2
        .restore((&id, c0), Default::default())
        .await
        .expect("restore")
    {
        RestoreOutcome::Miss(MissReason::Corrupt { object, check, .. }) => {
            assert_eq!(object, Some(damaged));
            assert!(
                matches!(
                    check,
                    Some(ObjectCheck::Name { .. } | ObjectCheck::StoredDigest { .. })
                ),
                "{check:?}"
            );
        }
        other => panic!("expected a corrupt miss, got {other:?}"),
    }
    assert_eq!(keys::parse_object_key(&damaged.path()), Some(damaged.0));
}

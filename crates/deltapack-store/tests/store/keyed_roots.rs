//! Keyed root authentication: a store opened with a secret writes a keyed
//! BLAKE3 MAC over every root envelope and refuses any root without a valid
//! one as an `unauthenticated` miss. A party that can write to the shared
//! bucket but lacks the key — publishing through its own unkeyed handle, or
//! replaying a valid root under another key — cannot make a keyed reader
//! consume forged state. Unkeyed stores keep working as before.

use crate::common::*;
use bytes::Bytes;
use deltapack_format::{CacheIdentity, ContextDigest};
use deltapack_store::{keys, MissReason, RestoreOutcome, RootFormat, Store};
use object_store::{ObjectStoreExt, PutPayload};

fn keyed(url: &str, secret: &[u8]) -> Store {
    Store::open(url, config().with_mac_secret(Some(secret.to_vec()))).expect("open")
}

async fn suite(url: String) {
    let reader = keyed(&url, b"the real secret");
    let attacker = Store::open(&url, config()).expect("open"); // write access, no key
    let id = identity("keyed");
    let (good, forged) = (turn(600, 2048), turn(601, 2048));
    let (cg, cf) = (ctx(&id, 600, 2048), ctx(&id, 601, 2048));

    // The keyed writer's roots restore for a keyed reader.
    publish_base(&reader, &id, cg, good.clone(), RootFormat::V2).await;
    assert_eq!(restore_bytes(&reader, &id, cg).await, good.encoded());
    // An unkeyed reader still reads them (the MAC is extra, not required).
    assert_eq!(restore_bytes(&attacker, &id, cg).await, good.encoded());

    // The attacker publishes its own (perfectly well-formed) root.
    publish_base(&attacker, &id, cf, forged.clone(), RootFormat::V2).await;
    assert_unauthenticated(&reader, &id, cf, "a root without a valid MAC was accepted").await;
    // Nor can it overwrite a keyed root with its own bytes.
    let rk = keys::root_key(&id.namespace(), &cg);
    let forged_root = attacker
        .object_store()
        .get(&keys::root_key(&id.namespace(), &cf))
        .await
        .expect("get");
    let forged_bytes = forged_root.bytes().await.expect("bytes");
    attacker
        .object_store()
        .put(
            &rk,
            PutPayload::from_bytes(Bytes::from(forged_bytes.to_vec())),
        )
        .await
        .expect("put");
    assert!(matches!(
        reader
            .restore((&id, cg), Default::default())
            .await
            .expect("restore"),
        RestoreOutcome::Miss(_)
    ));

    // A root sealed under another key is refused too.
    let other = keyed(&url, b"someone else's key");
    let co = ctx(&id, 602, 2048);
    publish_base(&other, &id, co, turn(602, 2048), RootFormat::V2).await;
    assert_unauthenticated(&reader, &id, co, "a root under another key was accepted").await;
    assert!(reader.stats().miss_unauthenticated >= 2);
    // The secret never appears in debug output.
    assert!(!format!("{:?}", reader.config()).contains("real secret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_roots_local_disk() {
    let dir = tempfile::tempdir().expect("tmp");
    suite(format!("file://{}", dir.path().display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_roots_s3() {
    if let Some(url) = s3_url() {
        suite(url).await;
    }
}

/// Asserts that `reader` refuses the root of `c` as unauthenticated.
async fn assert_unauthenticated(
    reader: &Store,
    id: &CacheIdentity,
    c: ContextDigest,
    accepted: &str,
) {
    match reader
        .restore((id, c), Default::default())
        .await
        .expect("restore")
    {
        RestoreOutcome::Miss(MissReason::Unauthenticated { .. }) => {}
        other => panic!("{accepted}: {other:?}"),
    }
}

//! The `restore_into` contract: after a miss, the caller's buffer holds no
//! byte of unverified data — it is zeroed.
//!
//! Extent bytes are placed into the caller's buffer as they stream in, before
//! the extent (or, for a delta chain, the whole result) has verified. A miss
//! used to leave those bytes behind, so a caller that ignored the outcome
//! could hand corrupt state to a model. Checked here for a flat root and a
//! delta chain on local disk, with the damage in the last extent (so that
//! every other extent's bytes were already placed when the check failed).

use crate::common::*;
use deltapack_store::{keys, RestoreIntoOutcome, RootFormat, RootStatus};

async fn damage_last_extent(
    t: &TestStore,
    id: &deltapack_format::CacheIdentity,
    c: deltapack_format::ContextDigest,
) {
    let RootStatus::Found(root) = t.store.peek_root(&id.namespace(), &c).await.expect("root")
    else {
        panic!("no root")
    };
    let deltapack_format::DecodedRoot::V2(m) = *root else {
        panic!("not v2")
    };
    let e = m.extents.last().expect("extents");
    let path = t
        ._dir
        .as_ref()
        .expect("local")
        .path()
        .join(keys::object_key(&e.object_digest()).as_ref());
    let mut bytes = std::fs::read(&path).expect("extent");
    let n = bytes.len();
    bytes[n - 1] ^= 0x01;
    std::fs::write(&path, bytes).expect("damage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_miss_leaves_the_buffer_zeroed() {
    for delta in [false, true] {
        let t = local(config());
        let id = identity("into-contract");
        let (ca, a) = (ctx(&id, 9, 2048), turn(9, 2048));
        let (cb, b) = (ctx(&id, 9, 8192), turn(9, 8192));
        publish_base(&t.store, &id, ca, a.clone(), RootFormat::V2).await;
        publish_delta(&t.store, &id, cb, b.clone(), ca, a.clone(), RootFormat::V2).await;
        let (c, want) = if delta { (cb, b) } else { (ca, a) };
        damage_last_extent(&t, &id, c).await;
        let mut buf = vec![0xAAu8; want.encoded().len()];
        match t
            .store
            .restore_into((&id, c), &mut buf, Default::default())
            .await
            .expect("restore_into")
        {
            RestoreIntoOutcome::Miss { reason } => assert_eq!(reason.label(), "corrupt"),
            RestoreIntoOutcome::Hit { .. } => panic!("damaged bytes restored (delta {delta})"),
        }
        assert!(
            buf.iter().all(|x| *x == 0),
            "delta {delta}: the buffer holds bytes after a miss"
        );
    }
}

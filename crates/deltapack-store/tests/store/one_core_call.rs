//! One core call each: `restore_to(key, Target, opts)` and
//! `publish_with(req, PublishOptions)`.
//!
//! `restore`, `restore_into`, `publish` and `publish_with_progress` are
//! the core calls with a fixed target or fixed options. If the two paths
//! drifted apart (one target verifying less, a wrapper losing the
//! progress callback), a caller would get different guarantees depending
//! on which name it used. Checked on local disk, for a flat root and a
//! delta on it, against the bytes that were published.

use std::sync::Mutex;

use crate::common::*;
use deltapack_store::{
    PublishOptions, Restoration, RestoreIntoOutcome, RestoreOutcome, RootFormat, StoreError, Target,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_target_gets_the_published_bytes_and_progress_reaches_the_total() {
    let t = local(config());
    let id = identity("one-core-call");
    let (ca, a) = (ctx(&id, 5, 2048), turn(5, 2048));
    let (cb, b) = (ctx(&id, 5, 8192), turn(5, 8192));

    // publish_with reports progress, monotone, ending at the total.
    let seen: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());
    let progress = |done: u64, total: u64| seen.lock().expect("lock").push((done, total));
    let receipt = t
        .store
        .publish_with(
            flat(&id, ca, &a, RootFormat::V2),
            PublishOptions::default().with_progress(&progress),
        )
        .await
        .expect("publish_with");
    let seen = seen.into_inner().expect("lock");
    assert!(!seen.is_empty(), "no progress reported");
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
    let (done, total) = *seen.last().expect("last");
    assert_eq!(done, total, "{seen:?}");
    assert_eq!(total, receipt.payload_len, "{seen:?}");
    publish_delta(&t.store, &id, cb, b.clone(), ca, a.clone(), RootFormat::V2).await;

    for (c, want) in [(ca, &a), (cb, &b)] {
        let new = t
            .store
            .restore_to((&id, c), Target::New, Default::default())
            .await
            .expect("restore_to new");
        let Restoration::New(RestoreOutcome::Hit(hit)) = &new else {
            panic!("expected a new snapshot, got {new:?}")
        };
        assert_eq!(hit.snapshot.encoded(), want.encoded());

        let mut buf = vec![0xEEu8; want.encoded().len()];
        let into = t
            .store
            .restore_to((&id, c), Target::Into(&mut buf), Default::default())
            .await
            .expect("restore_to into");
        assert!(
            matches!(into, Restoration::Into(RestoreIntoOutcome::Hit { .. })),
            "{into:?}"
        );
        assert_eq!(&buf[..], want.encoded());
        assert_eq!(new.digest(), into.digest());
        assert_eq!(new.digest(), Some(v2_digest(want)));

        // The convenient names say the same.
        let plain = t
            .store
            .restore((&id, c), Default::default())
            .await
            .expect("restore");
        assert_eq!(plain.hit().map(|h| h.digest), new.digest());
    }

    // A miss is a miss on both targets, and a wrong-sized buffer is bad
    // input, whatever name the call goes by.
    let absent = ctx(&id, 6, 2048);
    let mut buf = vec![0u8; 16];
    for target in [Target::New, Target::Into(&mut buf)] {
        let out = t
            .store
            .restore_to((&id, absent), target, Default::default())
            .await
            .expect("absent");
        assert_eq!(out.miss().map(|m| m.label()), Some("absent"), "{out:?}");
    }
    let err = t
        .store
        .restore_to((&id, ca), Target::Into(&mut buf), Default::default())
        .await
        .expect_err("wrong size");
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
}

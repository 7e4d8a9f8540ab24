//! Quarantine needs proof: a digest mismatch seen on a second read.
//!
//! One bad read (bits flipped in transit by a proxy or a flaky link) or one
//! failed read (a dropped connection, a transient error) used to quarantine
//! a healthy root at once, and during a sweep a healthy object too — and a
//! quarantined object invalidates every root that uses it and every delta
//! above them. This file guards the rule on every path that quarantines —
//! a root read, a flat restore, a composed chain restore, the sweep — with
//! one-shot faults injected in front of a real backend, and that damage at
//! rest (seen on every read) is still quarantined. (A one-shot fault hits
//! the next matching read, so two of them in a row would hit a read and its
//! re-read: that is proof, and is quarantined.)

use std::sync::Arc;

use crate::common::faults::{FaultPlan, Faulty, FaultyStore};
use crate::common::*;
use deltapack_store::{
    keys, Backend, BackendKind, RestoreOutcome, RootFormat, Store, SweepOptions,
};
use object_store::ObjectStoreExt;

struct World {
    faulty: Arc<FaultyStore>,
    store: Store,
    id: deltapack_format::CacheIdentity,
    turns: Vec<(
        deltapack_format::ContextDigest,
        Arc<deltapack_format::Snapshot>,
    )>,
}

/// Three turns (a flat root and two v2.1 deltas) on a memory backend
/// behind a fault injector (no faults armed yet).
async fn world(salt: &str) -> World {
    let faulty = Arc::new(Faulty::new(
        raw_backend("memory://").store,
        FaultPlan::default(),
    ));
    let store = Store::from_backend(
        Backend {
            store: faulty.clone(),
            kind: BackendKind::Memory,
        },
        config(),
    )
    .expect("store");
    let id = identity(salt);
    let turns: Vec<_> = [1024u64, 2048, 4096]
        .iter()
        .map(|t| (ctx(&id, 77, *t as usize), turn(77, *t)))
        .collect();
    publish_base(&store, &id, turns[0].0, turns[0].1.clone(), RootFormat::V2).await;
    for i in 1..turns.len() {
        let (c, s) = turns[i].clone();
        let (bc, b) = turns[i - 1].clone();
        publish_delta(&store, &id, c, s, bc, b, RootFormat::V2).await;
    }
    World {
        faulty,
        store,
        id,
        turns,
    }
}

impl World {
    /// The key of the last extent of `c`'s (v2) root.
    async fn last_extent(&self, c: &deltapack_format::ContextDigest) -> object_store::path::Path {
        let m = match self
            .store
            .read_root(&self.id.namespace(), c)
            .await
            .expect("root")
        {
            deltapack_store::RootStatus::Found(d) => match *d {
                deltapack_format::DecodedRoot::V2(m) => m,
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        };
        keys::object_key(&m.extents[m.extents.len() - 1].object_digest())
    }

    /// A new handle on the same backend (no cache, no single flight).
    fn reader(&self) -> Store {
        Store::from_backend(
            Backend {
                store: self.faulty.clone(),
                kind: BackendKind::Memory,
            },
            config(),
        )
        .expect("store")
    }

    fn arm(&self, plan: FaultPlan) {
        self.faulty.set_plan(plan);
    }

    async fn quarantined(&self) -> usize {
        use futures::TryStreamExt;
        let listed: Vec<_> = self
            .store
            .object_store()
            .list(Some(&object_store::path::Path::from("quarantine")))
            .try_collect()
            .await
            .expect("list");
        listed.len()
    }
}

fn one_shot(prefix: &'static str, flip: u64, fail: u64) -> FaultPlan {
    FaultPlan {
        flip_next: flip,
        fail_next: fail,
        once_prefix: prefix,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_in_transit_quarantines_nothing_on_restore() {
    let w = world("proof-restore").await;
    // (prefix, flipped reads, failed reads, which turn)
    let cases = [
        ("roots/", 1, 0, 2),   // the requested root's first read
        ("objects/", 1, 0, 0), // a flat root's extent
        ("objects/", 1, 0, 2), // an extent of a composed chain
        ("objects/", 0, 1, 0), // a transient error on a flat root's extent
        ("objects/", 0, 1, 2), // a transient error in a chain
    ];
    for (prefix, flip, fail, k) in cases {
        w.arm(one_shot(prefix, flip, fail));
        let r = w.reader();
        let (c, want) = &w.turns[k];
        match r.restore((&w.id, *c), Default::default()).await {
            Ok(RestoreOutcome::Hit(h)) => {
                assert_eq!(
                    h.snapshot.encoded(),
                    want.encoded(),
                    "{prefix} {flip}/{fail}"
                )
            }
            Ok(RestoreOutcome::Miss(m)) => {
                panic!("{prefix} flip {flip} fail {fail}: one bad read made a miss: {m}")
            }
            Err(e) => panic!("{prefix} flip {flip} fail {fail}: {e}"),
        }
        r.settle_quarantines().await;
        assert_eq!(r.stats().quarantined, 0, "{prefix} flip {flip} fail {fail}");
        assert_eq!(w.quarantined().await, 0, "{prefix} flip {flip} fail {fail}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_in_transit_quarantines_nothing_in_a_sweep() {
    let w = world("proof-sweep").await;
    for (flip, fail) in [(1, 0), (0, 1)] {
        w.arm(one_shot("objects/", flip, fail));
        let report = sweep(&w.reader()).await;
        assert!(
            report.corrupt.is_empty() && report.invalidated_roots.is_empty(),
            "flip {flip} fail {fail}: {report:?}"
        );
        assert_eq!(w.quarantined().await, 0);
    }
    for (c, want) in &w.turns {
        assert_eq!(restore_bytes(&w.reader(), &w.id, *c).await, want.encoded());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_at_rest_is_still_quarantined() {
    let w = world("proof-at-rest").await;
    // Damage one extent of the top delta at rest: every read sees it.
    let (top, _) = w.turns[2];
    let key = w.last_extent(&top).await;
    let mut bytes = stored(w.store.object_store(), &key).await.to_vec();
    bytes[0] ^= 0x80;
    w.store
        .object_store()
        .put(&key, bytes.into())
        .await
        .expect("put");
    let r = w.reader();
    match r
        .restore((&w.id, top), Default::default())
        .await
        .expect("restore")
    {
        RestoreOutcome::Miss(m) => assert_eq!(m.label(), "corrupt", "{m}"),
        RestoreOutcome::Hit(_) => panic!("damaged bytes restored"),
    }
    r.settle_quarantines().await;
    assert_eq!(r.stats().quarantined, 1);
    assert!(
        w.store.object_store().head(&key).await.is_err(),
        "moved aside"
    );
}

/// A failed read followed by one flipped read is one bad read, not proof:
/// the object was never seen damaged twice. Found by
/// `chaos_faults`; checked here on every path that re-reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_then_a_flipped_read_quarantines_nothing() {
    let mut failures = Vec::new();
    for (what, k, sweep) in [
        ("flat restore", 0usize, false),
        ("composed chain restore", 2, false),
        ("sweep", 2, true),
    ] {
        let w = world(&format!("proof-fail-flip-{k}-{sweep}")).await;
        let (c, want) = w.turns[k].clone();
        // The last extent of the root (of the top delta for a chain).
        let key = w.last_extent(&c).await;
        let prefix: &'static str = Box::leak(key.to_string().into_boxed_str());
        w.arm(one_shot(prefix, 1, 1));
        let r = w.reader();
        let outcome = if sweep {
            format!(
                "{:?}",
                r.sweep(&SweepOptions::default()).await.map(|s| s.corrupt)
            )
        } else {
            match r.restore((&w.id, c), Default::default()).await {
                Ok(RestoreOutcome::Hit(h)) => {
                    assert_eq!(h.snapshot.encoded(), want.encoded(), "{what}");
                    "hit".into()
                }
                Ok(RestoreOutcome::Miss(m)) => format!("miss: {m}"),
                Err(e) => format!("error: {e}"),
            }
        };
        r.settle_quarantines().await;
        let q = w.quarantined().await;
        if q != 0 {
            failures.push(format!("{what}: {key} quarantined ({outcome})"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

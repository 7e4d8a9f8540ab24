//! Turn publication: publishing one more turn costs the turn, not the
//! conversation. The layered snapshot digest (`blake3-layers:`, v2.2 roots)
//! extends the previous turn's hashing state with the new pages alone, so
//! a warm publication — from a [`Turn`] handle with the new pages only, or
//! from the same `Arc` the previous turn was published or restored with —
//! hashes no byte of the base and reads no object of it. These tests count
//! what a publication hashes (`snapshot_bytes_hashed`) and reads, check
//! every turn restores bit-exactly (flat, composed, mixed with roots of the
//! old digest), and that a bad turn request writes nothing.

use std::sync::Arc;

use crate::common::*;
use bytes::Bytes;
use deltapack_format::layer_digest;
use deltapack_format::{Algorithm, DecodedRoot, Snapshot, SCHEMA_V2_1, SCHEMA_V2_2};
use deltapack_store::{
    PublishOutcome, RestoreOutcome, RootFormat, Store, StoreConfig, StoreError, Turn, TurnRequest,
};

const SEED: u64 = 29;

fn turn_request(id: &deltapack_format::CacheIdentity, tokens: u64, tail: Bytes) -> TurnRequest {
    TurnRequest {
        identity: id.clone(),
        context: ctx(id, SEED, tokens as usize),
        boundary: tokens,
        tail,
    }
}

async fn restored(
    store: &Store,
    id: &deltapack_format::CacheIdentity,
    seed: u64,
    tokens: u64,
) -> Arc<Snapshot> {
    match store
        .restore((id, ctx(id, seed, tokens as usize)), Default::default())
        .await
        .expect("restore")
    {
        RestoreOutcome::Hit(h) => h.snapshot,
        RestoreOutcome::Miss(m) => panic!("turn at {tokens} tokens missed: {m}"),
    }
}

fn hashed(s: &Store) -> u64 {
    s.stats().snapshot_bytes_hashed
}

/// A conversation published turn by turn — tail-only and full-snapshot
/// turns alternating — records the layered digest of every turn (the same
/// as hashing it from scratch), and every turn restores bit-exactly,
/// through this handle and through a fresh one (composed from the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_published_turn_by_turn_restores_every_turn() {
    // Deep chains of small turns: no rebasing (the default policy would
    // publish some of these tiny turns flat).
    let mut cfg = config();
    cfg.publication.chain = deltapack_store::ChainPolicy::unbounded();
    for t in [memory(cfg.clone()), local(cfg.clone())] {
        let id = identity("turns");
        let mut tokens = 1024u64;
        let first = turn(SEED, tokens);
        let r = publish_base(
            &t.store,
            &id,
            ctx(&id, SEED, 1024),
            first.clone(),
            RootFormat::V2,
        )
        .await;
        assert_eq!(r.schema, SCHEMA_V2_2, "{}", t.name);
        assert_eq!(r.snapshot_digest.algorithm(), Algorithm::Blake3Layers);
        let mut prev_turn: Turn = r.turn.expect("a v2.2 publication returns a turn");
        let mut prev_snap = first;
        for k in 0..6u64 {
            let next_tokens = tokens + 256 * (1 + k % 3);
            let next = turn(SEED, next_tokens);
            let want = layer_digest::of_snapshot(&next).expect("digest").snapshot;
            let receipt = if k % 2 == 0 {
                let tail = prev_turn.tail_of(&next).expect("tail");
                assert!((tail.len() as u64) < next.encoded().len() as u64 / 2);
                t.store
                    .publish_turn(&prev_turn, turn_request(&id, next_tokens, tail))
                    .await
                    .expect("publish_turn")
            } else {
                publish_delta(
                    &t.store,
                    &id,
                    ctx(&id, SEED, next_tokens as usize),
                    next.clone(),
                    ctx(&id, SEED, tokens as usize),
                    prev_snap.clone(),
                    RootFormat::V2,
                )
                .await
            };
            assert_eq!(receipt.outcome, PublishOutcome::Created, "{}", t.name);
            assert_eq!(receipt.schema, SCHEMA_V2_2);
            assert_eq!(receipt.snapshot_digest, want, "{} turn {k}", t.name);
            assert_eq!(receipt.chain_depth as u64, k + 1);
            prev_turn = receipt.turn.expect("turn");
            assert_eq!(prev_turn.digest(), want);
            assert_eq!(prev_turn.boundary(), next_tokens);
            tokens = next_tokens;
            prev_snap = next;
        }
        // Every turn restores bit-exactly, here and through a fresh handle
        // (no cached base: the whole chain is composed from the store).
        let fresh = Store::from_backend(
            deltapack_store::Backend {
                store: t.store.object_store().clone(),
                kind: t.store.backend_kind().clone(),
            },
            cfg.clone(),
        )
        .expect("fresh handle");
        let mut b = 1024u64;
        let mut k = 0;
        while b <= tokens {
            let want = turn(SEED, b);
            for s in [&t.store, &fresh] {
                let got = restore_bytes(s, &id, ctx(&id, SEED, b as usize)).await;
                assert_eq!(got, want.encoded(), "{} turn at {b}", t.name);
            }
            b += 256 * (1 + k % 3);
            k += 1;
        }
    }
}

/// A warm publication hashes the new pages only and reads nothing of the
/// base; a cold one (a fresh handle given the base as plain bytes) hashes
/// the base to check it, as before. On the code before the layered digest
/// every publication hashed base and result whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_publication_hashes_only_the_new_pages_and_reads_no_base_object() {
    let t = local(config());
    let id = identity("warm");
    let base = turn(SEED, 4096);
    let prev = first_turn(&t.store, &id, 4096, &base).await;

    // Tail-only.
    let next = turn(SEED, 4608);
    let tail = prev.tail_of(&next).expect("tail");
    let (h0, s0) = (hashed(&t.store), t.store.stats());
    let r = t
        .store
        .publish_turn(&prev, turn_request(&id, 4608, tail.clone()))
        .await
        .expect("turn");
    let s1 = t.store.stats();
    assert_eq!(
        hashed(&t.store) - h0,
        tail.len() as u64,
        "only the tail is hashed"
    );
    assert_eq!(
        s1.objects_read, s0.objects_read,
        "no object of the base is read"
    );
    assert_eq!(
        r.payload_len as usize,
        tail.len() + (r.payload_len as usize - tail.len())
    );
    let after = r.turn.expect("turn");

    // Full snapshot with the same Arc as the previous publication: its
    // settled pages are compared, not hashed; only the pages after them are.
    let third = turn(SEED, 5120);
    let mid = turn(SEED, 4608);
    // Re-publishing turn 2 as a full snapshot is idempotent and makes its
    // Arc known to this handle.
    let again = seed_delta(&t.store, &id, (4608, &mid), (4096, &base)).await;
    assert_eq!(again.outcome, PublishOutcome::AlreadyPresent);
    assert_eq!(again.snapshot_digest, after.digest());
    let h1 = hashed(&t.store);
    let s2 = t.store.stats();
    let r3 = seed_delta(&t.store, &id, (5120, &third), (4608, &mid)).await;
    assert_eq!(r3.outcome, PublishOutcome::Created);
    let full_hashed = hashed(&t.store) - h1;
    let new_pages = after.tail_len(5120).expect("len");
    assert_eq!(
        full_hashed, new_pages,
        "a warm full publication hashes the new pages only"
    );
    assert_eq!(t.store.stats().objects_read, s2.objects_read);

    // Cold: a fresh handle, the base given as bytes (a new Arc): the base
    // is hashed once to check it against its root.
    let cold = Store::open(
        &format!("file://{}", t._dir.as_ref().expect("dir").path().display()),
        config(),
    )
    .expect("open");
    let third_copy = Arc::new(Snapshot::from_encoded(third.encoded().to_vec()).expect("copy"));
    let fourth = turn(SEED, 5632);
    let h2 = hashed(&cold);
    let r4 = publish_delta(
        &cold,
        &id,
        ctx(&id, SEED, 5632),
        fourth.clone(),
        ctx(&id, SEED, 5120),
        third_copy,
        RootFormat::V2,
    )
    .await;
    assert_eq!(r4.outcome, PublishOutcome::Created);
    let cold_hashed = hashed(&cold) - h2;
    assert!(
        cold_hashed >= third.encoded().len() as u64,
        "a cold publication checks the base: {cold_hashed} bytes hashed"
    );
    // The result's digest still extended the base's state just computed.
    assert!(cold_hashed < (third.encoded().len() + fourth.encoded().len()) as u64);
    assert_eq!(
        restore_bytes(&cold, &id, ctx(&id, SEED, 5632)).await,
        fourth.encoded()
    );
}

/// Bad turn requests fail with `invalid-input` and write nothing: a tail of
/// the wrong length, a boundary not above the previous one or off the
/// chunk grid, the previous turn's own context, a handle from another
/// namespace or another store. A handle whose root is gone is a base
/// mismatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_turn_requests_write_nothing() {
    let t = local(config());
    let other = memory(config());
    let id = identity("bad-turns");
    let base = turn(SEED, 2048);
    let prev = first_turn(&t.store, &id, 2048, &base).await;
    let foreign = first_turn(&other.store, &id, 2048, &base).await;
    let other_id = identity("bad-turns-elsewhere");
    let other_ns = first_turn(&t.store, &other_id, 2048, &base).await;

    let next = turn(SEED, 2560);
    let tail = prev.tail_of(&next).expect("tail");
    let before = listed_bytes(&t.store).await;
    let written = t.store.stats().objects_written;
    let cases: Vec<(&str, &Turn, TurnRequest)> = vec![
        (
            "short tail",
            &prev,
            turn_request(&id, 2560, tail.slice(1..)),
        ),
        ("long tail", &prev, {
            let mut v = tail.to_vec();
            v.push(0);
            turn_request(&id, 2560, Bytes::from(v))
        }),
        ("empty tail", &prev, turn_request(&id, 2560, Bytes::new())),
        (
            "boundary not above",
            &prev,
            turn_request(&id, 2048, tail.clone()),
        ),
        (
            "boundary off the grid",
            &prev,
            turn_request(&id, 2600, tail.clone()),
        ),
        (
            "own context",
            &prev,
            TurnRequest {
                context: ctx(&id, SEED, 2048),
                ..turn_request(&id, 2560, tail.clone())
            },
        ),
        (
            "another store's handle",
            &foreign,
            turn_request(&id, 2560, tail.clone()),
        ),
        (
            "another namespace's handle",
            &other_ns,
            turn_request(&id, 2560, tail.clone()),
        ),
    ];
    for (what, handle, req) in cases {
        match t.store.publish_turn(handle, req).await {
            Err(StoreError::Invalid(m)) => assert!(!m.is_empty(), "{what}"),
            other => panic!("{what}: expected invalid input, got {other:?}"),
        }
    }
    assert_eq!(listed_bytes(&t.store).await, before, "nothing was written");
    assert_eq!(t.store.stats().objects_written, written);

    // The previous turn's root gone: a base mismatch, nothing written.
    let plan = t
        .store
        .invalidate_plan(id.namespace(), Some(ctx(&id, SEED, 2048)))
        .await
        .expect("plan");
    t.store.execute(plan).await.expect("invalidate");
    match t
        .store
        .publish_turn(&prev, turn_request(&id, 2560, tail.clone()))
        .await
    {
        Err(StoreError::BaseMismatch { .. }) => {}
        other => panic!("expected a base mismatch, got {other:?}"),
    }
    assert!(t
        .store
        .restore((&id, ctx(&id, SEED, 2560)), Default::default())
        .await
        .expect("restore")
        .miss()
        .is_some());
}

/// Mixed chains: a conversation stored with the old digest (the frozen
/// v2.1 fixture) gets new turns with the layered one — a full-snapshot
/// delta on the old root, then tail-only turns — and every turn restores,
/// composed across both kinds of root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_turns_on_a_conversation_stored_with_the_old_digest() {
    let tmp = tempfile::tempdir().expect("tmp");
    copy_dir(
        &repo_root().join("fixtures/2026-12-v2.1-chain/store"),
        tmp.path(),
    );
    let url = format!("file://{}", tmp.path().display());
    let store =
        Store::open(&url, StoreConfig::default().with_max_extent_bytes(4096)).expect("open");
    let id = deltapack_format::CacheIdentity::from_json(
        &std::fs::read(repo_root().join("fixtures/2026-12-v2.1-chain/inputs/identity-chain.json"))
            .expect("identity"),
    )
    .expect("identity");
    const FIXTURE_SEED: u64 = 2026;
    let c = |tokens: u64| ctx(&id, FIXTURE_SEED, tokens as usize);
    let old = match store
        .restore((&id, c(5120)), Default::default())
        .await
        .expect("restore")
    {
        RestoreOutcome::Hit(h) => {
            assert_eq!(h.schema, SCHEMA_V2_1);
            assert_eq!(h.digest.algorithm(), Algorithm::Blake3);
            h.snapshot
        }
        RestoreOutcome::Miss(m) => panic!("fixture turn 5 missed: {m}"),
    };
    // A layered delta on a `blake3:` base, given the restored Arc.
    let six = turn(FIXTURE_SEED, 6144);
    let r = store
        .publish(delta(&id, c(6144), &six, c(5120), &old, RootFormat::V2))
        .await
        .expect("publish");
    assert_eq!(r.outcome, PublishOutcome::Created);
    assert_eq!(r.schema, SCHEMA_V2_2);
    let key = deltapack_store::keys::root_key(&id.namespace(), &c(6144));
    let bytes = stored(store.object_store(), &key).await;
    match deltapack_format::root::decode(&bytes, None).expect("decode") {
        DecodedRoot::V2(m) => {
            let b = m.base.expect("base");
            assert_eq!(
                b.snapshot_digest.algorithm(),
                Algorithm::Blake3,
                "the base keeps its digest"
            );
            assert_eq!(
                m.result_snapshot_digest.algorithm(),
                Algorithm::Blake3Layers
            );
            assert_eq!(
                m.layer_digests().expect("layers"),
                layer_digest::of_snapshot(&six).expect("d").streams
            );
        }
        other => panic!("{other:?}"),
    }
    // Tail-only turns on top.
    let mut prev = r.turn.expect("turn");
    for tokens in [6656u64, 7168] {
        let next = turn(FIXTURE_SEED, tokens);
        let r = store
            .publish_turn(
                &prev,
                TurnRequest {
                    identity: id.clone(),
                    context: c(tokens),
                    boundary: tokens,
                    tail: prev.tail_of(&next).expect("tail"),
                },
            )
            .await
            .expect("turn");
        prev = r.turn.expect("turn");
    }
    // Everything restores through a fresh handle: composed chains whose
    // lower links carry the old digest and upper ones the layered digest.
    let fresh = Store::open(&url, StoreConfig::default()).expect("open");
    for tokens in [1024u64, 5120, 6144, 6656, 7168] {
        assert_eq!(
            restore_bytes(&fresh, &id, c(tokens)).await,
            turn(FIXTURE_SEED, tokens).encoded(),
            "turn at {tokens}"
        );
    }
    // A turn handle from a restored snapshot: its root's recorded turn
    // state, proven with about a page per stream, then warm.
    let seven = restored(&fresh, &id, FIXTURE_SEED, 7168).await;
    let h = hashed(&fresh);
    let handle = fresh
        .turn_from(&id, c(7168), &seven)
        .await
        .expect("turn_from");
    assert_eq!(
        hashed(&fresh) - h,
        layer_digest::resume_bytes(seven.header())
    );
    let eight = turn(FIXTURE_SEED, 7680);
    let h = hashed(&fresh);
    let tail = handle.tail_of(&eight).expect("tail");
    let r = fresh
        .publish_turn(
            &handle,
            TurnRequest {
                identity: id.clone(),
                context: c(7680),
                boundary: 7680,
                tail: tail.clone(),
            },
        )
        .await
        .expect("turn");
    assert_eq!(hashed(&fresh) - h, tail.len() as u64);
    assert_eq!(
        r.snapshot_digest,
        layer_digest::of_snapshot(&eight).expect("d").snapshot
    );
    assert_eq!(restore_bytes(&store, &id, c(7680)).await, eight.encoded());
    // An old-digest root gives no turn handle (its digest does not extend).
    match fresh.turn_from(&id, c(5120), &old).await {
        Err(StoreError::Invalid(m)) => assert!(m.contains("does not extend"), "{m}"),
        other => panic!("expected invalid input, got {other:?}"),
    }
}

/// Every v2.2 root records its result's turn state, so a process that did
/// not publish a turn — it restored it, or read it from a file — publishes
/// the next one after hashing about a page per stream, not the turn: the
/// recorded chaining values are finished with the caller's own last settled
/// chunk and unsettled pages and must reach the root's stream digests. What
/// that proves is exactly what the next turn depends on: a changed byte
/// there is caught (the snapshot is then hashed whole, and refused); a
/// changed byte in a settled page cannot reach the store, because a turn
/// reuses settled pages from the store, never from the caller. A recorded
/// state that does not finish (damaged) costs one full hash, nothing else.
/// On the code before the turn state was recorded, `turn_from` hashed the
/// whole snapshot in each of these cases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_did_not_publish_a_turn_resumes_its_recorded_state() {
    let t = local(config());
    let id = identity("resume");
    let url = format!("file://{}", t._dir.as_ref().expect("dir").path().display());
    let mut prev = first_turn(&t.store, &id, 4096, &turn(SEED, 4096)).await;
    for tokens in [4608u64, 5120] {
        let next = turn(SEED, tokens);
        let tail = prev.tail_of(&next).expect("tail");
        prev = t
            .store
            .publish_turn(&prev, turn_request(&id, tokens, tail))
            .await
            .expect("turn")
            .turn
            .expect("turn");
    }
    let five = turn(SEED, 5120);
    let resume_cost = layer_digest::resume_bytes(five.header());
    assert!(
        resume_cost * 4 < five.encoded().len() as u64,
        "the proof reads a small part of the snapshot ({resume_cost} of {} bytes)",
        five.encoded().len()
    );
    // Recorded in the root, with the length its header calls for.
    let root_path = t
        ._dir
        .as_ref()
        .expect("dir")
        .path()
        .join(deltapack_store::keys::root_key(&id.namespace(), &ctx(&id, SEED, 5120)).as_ref());
    let mut manifest =
        match deltapack_format::root::decode(&std::fs::read(&root_path).expect("root"), None)
            .expect("decode")
        {
            DecodedRoot::V2(m) => m,
            other => panic!("{other:?}"),
        };
    assert!(
        manifest.stored_turn_state().is_some(),
        "a turn state is recorded"
    );

    // 1. A fresh process restores turn 5120 (composed from the store) and
    //    publishes the next turn: tail-only, then a full snapshot.
    let fresh = Store::open(&url, config()).expect("open");
    let restored5 = restored(&fresh, &id, SEED, 5120).await;
    let (h, reads) = (hashed(&fresh), fresh.stats().objects_read);
    let handle = fresh
        .turn_from(&id, ctx(&id, SEED, 5120), &restored5)
        .await
        .expect("turn_from");
    assert_eq!(
        hashed(&fresh) - h,
        resume_cost,
        "one page per stream, not the turn"
    );
    assert_eq!(fresh.stats().objects_read, reads, "no object read");
    assert_eq!(handle.digest(), prev.digest());
    let six = turn(SEED, 5632);
    let tail = handle.tail_of(&six).expect("tail");
    let h = hashed(&fresh);
    let r6 = fresh
        .publish_turn(&handle, turn_request(&id, 5632, tail.clone()))
        .await
        .expect("turn");
    assert_eq!(hashed(&fresh) - h, tail.len() as u64);
    assert_eq!(r6.snapshot_digest, v2_digest(&six));
    // A full-snapshot delta on the restored Arc (another fresh process):
    // the restored base is not hashed, only the proof and the new pages.
    let other = Store::open(&url, config()).expect("open");
    let restored6 = restored(&other, &id, SEED, 5632).await;
    let seven = turn(SEED, 6144);
    let h = hashed(&other);
    let r7 = seed_delta(&other, &id, (6144, &seven), (5632, &restored6)).await;
    assert_eq!(r7.outcome, PublishOutcome::Created);
    let new_pages = r6.turn.as_ref().expect("turn").tail_len(6144).expect("len");
    assert_eq!(
        hashed(&other) - h,
        layer_digest::resume_bytes(restored6.header()) + new_pages,
        "the base's recorded state is proven, the new pages hashed; the base is not"
    );
    assert_eq!(r7.snapshot_digest, v2_digest(&seven));

    // 2. A fresh process given turn 5120 as bytes (not restored, not
    //    published by it): the same small proof.
    let cold = Store::open(&url, config()).expect("open");
    let copy = |s: &Snapshot| Arc::new(Snapshot::from_encoded(s.encoded().to_vec()).expect("copy"));
    let h = hashed(&cold);
    let handle = cold
        .turn_from(&id, ctx(&id, SEED, 5120), &copy(&five))
        .await
        .expect("turn_from bytes");
    assert_eq!(hashed(&cold) - h, resume_cost);
    assert_eq!(handle.digest(), prev.digest());

    // 3. A changed byte in the last page of a layer (unsettled, read by the
    //    proof): the proof fails, the snapshot is hashed whole and refused.
    let payload_offset = five.encoded().len() - five.payload().len();
    let layer0 = five.layer_range(0, 0).expect("layer range");
    let mut bad = five.encoded().to_vec();
    bad[payload_offset + layer0.end - 1] ^= 0x40;
    let bad = Arc::new(Snapshot::from_encoded(bad).expect("bad"));
    let h = hashed(&cold);
    match cold.turn_from(&id, ctx(&id, SEED, 5120), &bad).await {
        Err(StoreError::BaseMismatch { .. }) => {}
        other => panic!("expected a base mismatch, got {other:?}"),
    }
    assert!(hashed(&cold) - h >= five.encoded().len() as u64);

    // 4. A changed byte in a settled page (the first page of a layer): not
    //    read, and harmless — the next turn reuses the stored page.
    let mut settled = five.encoded().to_vec();
    settled[payload_offset + layer0.start] ^= 0x40;
    let settled = Arc::new(Snapshot::from_encoded(settled).expect("settled"));
    let handle = cold
        .turn_from(&id, ctx(&id, SEED, 5120), &settled)
        .await
        .expect("turn_from");
    assert_eq!(handle.digest(), prev.digest());

    // 5. A damaged recorded state: the proof fails, one full hash, and the
    //    handle is as good as ever.
    let ts = manifest.turn_state.as_mut().expect("turn state");
    assert!(!ts.is_empty());
    ts[7] ^= 1;
    std::fs::write(
        &root_path,
        deltapack_format::root::encode_v2(&manifest, None).expect("encode"),
    )
    .expect("write root");
    let damaged = Store::open(&url, config()).expect("open");
    let h = hashed(&damaged);
    let handle = damaged
        .turn_from(&id, ctx(&id, SEED, 5120), &copy(&five))
        .await
        .expect("turn_from with a damaged state");
    assert!(hashed(&damaged) - h >= five.encoded().len() as u64);
    assert_eq!(handle.digest(), prev.digest());
    // Every turn still restores bit-exactly from a fresh handle.
    let last = Store::open(&url, config()).expect("open");
    for (tokens, want) in [(5120u64, &five), (5632, &six), (6144, &seven)] {
        assert_eq!(
            restore_bytes(&last, &id, ctx(&id, SEED, tokens as usize)).await,
            want.encoded(),
            "turn at {tokens}"
        );
    }
}

/// Publishes `snap`, the conversation of seed [`SEED`] at `tokens`, as a
/// flat v2 root and returns its turn (the handle keeps `snap`'s Arc).
async fn first_turn(
    store: &Store,
    id: &deltapack_format::CacheIdentity,
    tokens: u64,
    snap: &Arc<Snapshot>,
) -> Turn {
    let snap = snap.clone();
    let r = publish_base(
        store,
        id,
        ctx(id, SEED, tokens as usize),
        snap,
        RootFormat::V2,
    )
    .await;
    r.turn.expect("turn")
}

/// Publishes the `SEED` conversation's snapshot at `tokens` as a v2 delta
/// on its snapshot at `base_tokens`.
async fn seed_delta(
    store: &Store,
    id: &deltapack_format::CacheIdentity,
    (tokens, snap): (u64, &Arc<Snapshot>),
    (base_tokens, base): (u64, &Arc<Snapshot>),
) -> deltapack_store::PublishReceipt {
    let (c, bc) = (
        ctx(id, SEED, tokens as usize),
        ctx(id, SEED, base_tokens as usize),
    );
    publish_delta(store, id, c, snap.clone(), bc, base.clone(), RootFormat::V2).await
}

//! Composed chain restore: a conversation is a chain of deltas (turn N+1
//! against turn N), and restoring turn N must cost one pass over the bytes
//! of the result, not one restore per turn — while staying exactly as safe.
//!
//! This file guards that a chain restores bit-exactly through the composed
//! path whatever the turn lengths, page edits, recurrent groups and extent
//! sizes (proptest, against the snapshots the turns were made from); that
//! damage anywhere in a chain — an extent, a root, a base digest, a missing
//! middle root, a cycle, a base that is itself — is a miss with the right
//! reason and never wrong bytes or a hang; that `restore_into` leaves no
//! unverified byte behind on a miss; that a warm restore of the next turn
//! reads only its own delta, concurrent restores of one conversation share
//! work, and a v2.1 root's chain is fetched in one round of concurrent
//! reads; and that the chain policy rebases long or wasteful chains.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::common::instrumented::Counters;
use crate::common::*;
use deltapack_format::root::{self, DecodedRoot};
use deltapack_format::{
    BaseRef, CacheIdentity, ContextDigest, GroupKind, LayerSpec, PageGroup, PageLayout, Snapshot,
    SnapshotHeader, SCHEMA_V2_2,
};
use deltapack_store::{
    keys, Backend, ChainPolicy, MissReason, RestoreIntoOutcome, RestoreOutcome, RootFormat, Store,
    StoreConfig,
};
use object_store::{ObjectStoreExt, PutPayload};
use proptest::prelude::*;

/// Every test bounds its restores: a cycle must never hang the suite.
const LIMIT: Duration = Duration::from_secs(60);

fn unbounded(extent: u64) -> StoreConfig {
    StoreConfig::default()
        .with_max_extent_bytes(extent)
        .with_chain(ChainPolicy::unbounded())
}

fn fill(seed: u64, out: &mut [u8]) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in out.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// A layout with `full` full groups and `recurrent` recurrent ones, pages
/// of `tpp` tokens (so 256-token boundaries often fall inside pages).
fn layout(full: usize, recurrent: usize, tpp: u32, bpp: u64) -> PageLayout {
    let group = |kind, i: usize| PageGroup {
        kind,
        tokens_per_page: tpp,
        layers: (0..2)
            .map(|l| LayerSpec {
                name: format!("l{i}.{l}"),
                dtype: "u8".into(),
                bytes_per_page: bpp + (i + l) as u64,
            })
            .collect(),
    };
    PageLayout {
        groups: (0..full)
            .map(|i| group(GroupKind::Full, i))
            .chain((0..recurrent).map(|i| group(GroupKind::Recurrent, full + i)))
            .collect(),
    }
}

/// The next turn: every page of `prev` kept except the edited ones (an
/// edit index hits one page of every full group), new pages random.
fn next_turn(
    prev: Option<&Snapshot>,
    l: &PageLayout,
    boundary: u64,
    seed: u64,
    edits: &[u64],
) -> Arc<Snapshot> {
    let header = SnapshotHeader::new(l.clone(), boundary);
    let plen = l.payload_len(&header.block_counts).expect("len") as usize;
    let mut payload = vec![0u8; plen];
    fill(seed, &mut payload);
    if let Some(prev) = prev {
        let offs = l.layer_offsets(&header.block_counts).expect("offsets");
        for (gi, g) in l.groups.iter().enumerate() {
            if g.kind == GroupKind::Recurrent {
                continue;
            }
            let keep = prev.block_counts()[gi].min(header.block_counts[gi]);
            for (li, layer) in g.layers.iter().enumerate() {
                let bpp = layer.bytes_per_page as usize;
                let from = prev.layer_range(gi, li).expect("range");
                let d = offs[gi][li] as usize;
                let n = keep as usize * bpp;
                payload[d..d + n].copy_from_slice(&prev.payload()[from.start..from.start + n]);
                for e in edits {
                    if keep > 0 {
                        let p = (e % keep) as usize;
                        payload[d + p * bpp] ^= 0x5a;
                    }
                }
            }
        }
    }
    Arc::new(Snapshot::from_parts(header, &payload).expect("snapshot"))
}

/// A conversation: its turns (context, snapshot), oldest first.
struct Conversation {
    id: CacheIdentity,
    turns: Vec<(ContextDigest, Arc<Snapshot>)>,
}

impl Conversation {
    fn new(salt: &str, l: &PageLayout, chunks: &[u64], seed: u64, edits: &[Vec<u64>]) -> Self {
        let id = identity(salt);
        let mut turns: Vec<(ContextDigest, Arc<Snapshot>)> = Vec::new();
        let mut boundary = 0;
        for (i, c) in chunks.iter().enumerate() {
            boundary += c * 256;
            let prev = turns.last().map(|(_, s)| s.as_ref());
            let none = Vec::new();
            let e = edits.get(i).unwrap_or(&none);
            let snap = next_turn(prev, l, boundary, seed ^ (i as u64 * 7919), e);
            turns.push((ctx(&id, seed, boundary as usize), snap));
        }
        Conversation { id, turns }
    }

    /// Turn 1 flat, every later turn a delta on the one before.
    async fn publish(&self, s: &Store, format: RootFormat) -> Vec<deltapack_store::PublishReceipt> {
        let mut out = Vec::new();
        for (i, (c, snap)) in self.turns.iter().enumerate() {
            out.push(match i {
                0 => publish_base(s, &self.id, *c, snap.clone(), format).await,
                _ => {
                    let (bc, b) = &self.turns[i - 1];
                    publish_delta(s, &self.id, *c, snap.clone(), *bc, b.clone(), format).await
                }
            });
        }
        out
    }
}

async fn restore(s: &Store, id: &CacheIdentity, c: ContextDigest) -> RestoreOutcome {
    tokio::time::timeout(LIMIT, s.restore((id, c), Default::default()))
        .await
        .expect("restore finished")
        .expect("restore")
}

async fn restore_into(
    s: &Store,
    id: &CacheIdentity,
    c: ContextDigest,
    buf: &mut [u8],
) -> RestoreIntoOutcome {
    tokio::time::timeout(LIMIT, s.restore_into((id, c), buf, Default::default()))
        .await
        .expect("restore_into finished")
        .expect("restore_into")
}

fn hit_bytes(o: RestoreOutcome) -> Vec<u8> {
    match o {
        RestoreOutcome::Hit(r) => r.snapshot.encoded().to_vec(),
        RestoreOutcome::Miss(m) => panic!("expected a hit, got {m}"),
    }
}

/// A second handle on the same backend: no base cache, no single flight.
fn fresh(s: &Store, config: StoreConfig) -> Store {
    Store::from_backend(
        Backend {
            store: s.object_store().clone(),
            kind: s.backend_kind().clone(),
        },
        config,
    )
    .expect("store")
}

/// [`fresh`], with its ledger open as a serving process's is: a new handle
/// on a remote store builds its ledger on first use, reading every root,
/// and here that is done before the reads a test counts.
async fn fresh_with_ledger(s: &Store, config: StoreConfig) -> Store {
    let reader = fresh(s, config);
    reader.ledger_totals().await.expect("ledger");
    reader
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random chains restore bit-exactly through the composed path, with a
    /// new buffer and into the caller's, for the newest turn and a middle
    /// one, on memory and local disk.
    #[test]
    fn random_chains_restore_bit_exactly(
        full in 1usize..3,
        recurrent in 0usize..2,
        tpp in prop::sample::select(vec![64u32, 128, 512]),
        bpp in 8u64..48,
        chunks in prop::collection::vec(1u64..5, 2..7),
        edits in prop::collection::vec(prop::collection::vec(any::<u64>(), 0..3), 0..7),
        extent in prop::sample::select(vec![1024u64, 2048, 4096]),
        seed in any::<u64>(),
        local_disk in any::<bool>(),
    ) {
        let l = layout(full, recurrent, tpp, bpp);
        let conv = Conversation::new("prop-chain", &l, &chunks, seed, &edits);
        rt().block_on(async {
            let t = if local_disk { local(unbounded(extent)) } else { memory(unbounded(extent)) };
            conv.publish(&t.store, RootFormat::V2).await;
            let last = conv.turns.len() - 1;
            for k in [last, last / 2] {
                let (c, want) = &conv.turns[k];
                let s = fresh(&t.store, unbounded(extent));
                prop_assert_eq!(&hit_bytes(restore(&s, &conv.id, *c).await), want.encoded());
                let mut buf = vec![0xAAu8; want.encoded().len()];
                let s = fresh(&t.store, unbounded(extent));
                match restore_into(&s, &conv.id, *c, &mut buf).await {
                    RestoreIntoOutcome::Hit { .. } => prop_assert_eq!(&buf[..], want.encoded()),
                    RestoreIntoOutcome::Miss { reason } => prop_assert!(false, "miss {}", reason),
                }
            }
            Ok(())
        })?;
    }
}

/// Five turns on local disk; returns the store, the conversation and the
/// store's directory.
async fn five_turns(salt: &str) -> (TestStore, Conversation) {
    let l = layout(2, 1, 128, 40);
    let conv = Conversation::new(
        salt,
        &l,
        &[2, 2, 1, 3, 2],
        17,
        &[vec![], vec![3], vec![], vec![1, 8]],
    );
    let t = local(unbounded(1024));
    conv.publish(&t.store, RootFormat::V2).await;
    (t, conv)
}

fn dir(t: &TestStore) -> &std::path::Path {
    t._dir.as_ref().expect("local store").path()
}

fn manifest(t: &TestStore, id: &CacheIdentity, c: ContextDigest) -> deltapack_format::ManifestV2 {
    let bytes =
        std::fs::read(dir(t).join(keys::root_key(&id.namespace(), &c).as_ref())).expect("root");
    match root::decode(&bytes, None).expect("decode") {
        DecodedRoot::V2(m) => m,
        other => panic!("not v2: {other:?}"),
    }
}

fn put_manifest(
    t: &TestStore,
    id: &CacheIdentity,
    c: ContextDigest,
    m: &deltapack_format::ManifestV2,
) {
    let path = dir(t).join(keys::root_key(&id.namespace(), &c).as_ref());
    std::fs::write(path, root::encode_v2(m, None).expect("encode")).expect("write root");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_to_any_extent_is_a_miss_never_wrong_bytes() {
    let (t, conv) = five_turns("chain-damage").await;
    let (top, want) = conv.turns.last().cloned().expect("turns");
    let (mut cases, mut superseded) = (0, 0);
    for (k, (c, _)) in conv.turns.iter().enumerate() {
        let m = manifest(&t, &conv.id, *c);
        for e in &m.extents {
            let key = keys::object_key(&e.object_digest());
            let path = dir(&t).join(key.as_ref());
            let good = std::fs::read(&path).expect("extent");
            let mut bad = good.clone();
            let mid = bad.len() / 2;
            bad[mid] ^= 0x01;
            std::fs::write(&path, &bad).expect("damage");
            let s = fresh(&t.store, unbounded(1024));
            let mut buf = vec![0xAAu8; want.encoded().len()];
            let outcome = restore_into(&s, &conv.id, top, &mut buf).await;
            s.settle_quarantines().await;
            match outcome {
                RestoreIntoOutcome::Hit { .. } => {
                    // Possible only if the damaged byte is not part of the
                    // result (later turns replaced it): the result digest
                    // checks every byte that is placed, and the extent's
                    // name is checked only if that fails. The restore does
                    // not judge what it did not need...
                    assert_eq!(
                        &buf[..],
                        want.encoded(),
                        "turn {k}: a hit has the right bytes"
                    );
                    assert!(path.exists(), "a restore quarantines only what it proved");
                    // ...the sweep does: nothing damaged stays unnoticed (a
                    // dry run here, so the next cases keep their roots).
                    let report = dry_sweep(&s).await;
                    assert_eq!(
                        report.corrupt,
                        vec![key.to_string()],
                        "turn {k}: the sweep finds the damaged extent"
                    );
                    superseded += 1;
                }
                RestoreIntoOutcome::Miss { reason } => {
                    let expect = if k + 1 == conv.turns.len() {
                        "corrupt"
                    } else {
                        "base-missing"
                    };
                    assert_eq!(reason.label(), expect, "turn {k}: {reason}");
                    assert!(
                        buf.iter().all(|b| *b == 0),
                        "turn {k}: no unverified byte stays in the buffer"
                    );
                    // Corruption at rest is seen twice: proven, quarantined.
                    assert!(
                        !path.exists(),
                        "turn {k}: the damaged extent is quarantined"
                    );
                    assert_eq!(s.stats().quarantined, 1);
                    cases += 1;
                }
            }
            // Put it back for the next case (and check the restore).
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, &good).expect("repair");
            let s = fresh(&t.store, unbounded(1024));
            assert_eq!(hit_bytes(restore(&s, &conv.id, top).await), want.encoded());
        }
    }
    assert!(
        cases >= conv.turns.len(),
        "every turn had a damage that mattered"
    );
    eprintln!("{cases} damaged extents were misses, {superseded} held only replaced bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_links_are_misses() {
    let (t, conv) = five_turns("chain-links").await;
    let (top, _) = conv.turns[4];
    let cfg = || unbounded(1024);

    // A missing middle root: base-missing, from both entry points.
    let mid = keys::root_key(&conv.id.namespace(), &conv.turns[2].0);
    let saved = std::fs::read(dir(&t).join(mid.as_ref())).expect("root");
    std::fs::remove_file(dir(&t).join(mid.as_ref())).expect("rm");
    match restore(&fresh(&t.store, cfg()), &conv.id, top).await {
        RestoreOutcome::Miss(MissReason::BaseMissing { detail, .. }) => {
            assert!(detail.contains("absent"), "{detail}")
        }
        other => panic!("expected base-missing, got {other:?}"),
    }
    let mut buf = vec![0xAA; conv.turns[4].1.encoded().len()];
    match restore_into(&fresh(&t.store, cfg()), &conv.id, top, &mut buf).await {
        RestoreIntoOutcome::Miss { reason } => assert_eq!(reason.label(), "base-missing"),
        other => panic!("expected a miss, got {other:?}"),
    }
    std::fs::write(dir(&t).join(mid.as_ref()), &saved).expect("restore root");

    // A link naming the wrong base digest: base-missing.
    let mut m = manifest(&t, &conv.id, conv.turns[3].0);
    let real = m.clone();
    if let Some(b) = m.base.as_mut() {
        b.snapshot_digest = conv.turns[0].1.digest();
    }
    // (As a plain v2 root: a v2.1 root's recorded header would not match.)
    m.chain = None;
    m.schema = m.schema_str().into();
    put_manifest(&t, &conv.id, conv.turns[3].0, &m);
    match restore(&fresh(&t.store, cfg()), &conv.id, top).await {
        RestoreOutcome::Miss(MissReason::BaseMissing { .. }) => {}
        other => panic!("expected base-missing, got {other:?}"),
    }
    put_manifest(&t, &conv.id, conv.turns[3].0, &real);
    assert_eq!(
        hit_bytes(restore(&fresh(&t.store, cfg()), &conv.id, top).await),
        conv.turns[4].1.encoded()
    );

    // A damaged middle root: base-missing (and the root is quarantined).
    let path = dir(&t).join(keys::root_key(&conv.id.namespace(), &conv.turns[1].0).as_ref());
    let good = std::fs::read(&path).expect("root");
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 3] ^= 0xff;
    std::fs::write(&path, &bad).expect("damage");
    match restore(&fresh(&t.store, cfg()), &conv.id, top).await {
        RestoreOutcome::Miss(MissReason::BaseMissing { .. }) => {}
        other => panic!("expected base-missing, got {other:?}"),
    }
}

/// Rewrites the root of `c` so that its base names `target` (with a
/// boundary below its own, as every valid root must).
fn relink(
    t: &TestStore,
    conv: &Conversation,
    c: ContextDigest,
    target: ContextDigest,
    boundary: u64,
) {
    let mut m = manifest(t, &conv.id, c);
    m.base = Some(BaseRef {
        namespace: conv.id.namespace(),
        context: target,
        snapshot_digest: conv.turns[0].1.digest(),
        boundary,
    });
    m.chain = None;
    m.schema = m.schema_str().into();
    put_manifest(t, &conv.id, c, &m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycles_and_self_bases_are_corrupt_misses_not_hangs() {
    // A root whose base is itself.
    let (t, conv) = five_turns("chain-self").await;
    let (c3, s3) = conv.turns[3].clone();
    relink(&t, &conv, c3, c3, 256);
    for _ in 0..2 {
        match restore(&fresh(&t.store, unbounded(1024)), &conv.id, c3).await {
            RestoreOutcome::Miss(MissReason::Corrupt { what, .. }) => {
                assert!(what.contains("loops"), "{what}")
            }
            other => panic!("expected corrupt, got {other:?}"),
        }
        let mut buf = vec![0u8; s3.encoded().len()];
        match restore_into(&fresh(&t.store, unbounded(1024)), &conv.id, c3, &mut buf).await {
            RestoreIntoOutcome::Miss { reason } => assert_eq!(reason.label(), "corrupt"),
            other => panic!("expected a miss, got {other:?}"),
        }
    }
    // A two-root cycle: turn 2's base rewritten to point at turn 3, whose
    // base is turn 2; restores of both, concurrently, on one handle.
    let (t, conv) = five_turns("chain-cycle").await;
    let (c2, c3) = (conv.turns[2].0, conv.turns[3].0);
    relink(&t, &conv, c2, c3, 256);
    let s = fresh(&t.store, unbounded(1024));
    let (a, b) = tokio::join!(restore(&s, &conv.id, c3), restore(&s, &conv.id, c2));
    for o in [a, b] {
        assert!(matches!(o, RestoreOutcome::Miss(_)), "{o:?}");
    }
    // And the top of the conversation over it.
    let o = restore(&fresh(&t.store, unbounded(1024)), &conv.id, conv.turns[4].0).await;
    assert!(matches!(o, RestoreOutcome::Miss(_)), "{o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_v1_self_base_is_a_miss_not_a_hang() {
    let l = layout(1, 1, 128, 24);
    let conv = Conversation::new("chain-v1-self", &l, &[1, 2, 1], 5, &[]);
    let t = local(unbounded(1024));
    conv.publish(&t.store, RootFormat::V1).await;
    let (c, _) = conv.turns[2];
    let path = dir(&t).join(keys::root_key(&conv.id.namespace(), &c).as_ref());
    let mut m = match root::decode(&std::fs::read(&path).expect("root"), None).expect("decode") {
        DecodedRoot::V1(m) => m,
        other => panic!("not v1: {other:?}"),
    };
    if let Some(b) = m.base.as_mut() {
        b.context = c;
    }
    std::fs::write(&path, root::encode_v1(&m, None).expect("encode")).expect("write");
    let s = fresh(&t.store, unbounded(1024));
    match restore(&s, &conv.id, c).await {
        RestoreOutcome::Miss(m) => assert!(matches!(m.label(), "corrupt" | "base-missing"), "{m}"),
        other => panic!("expected a miss, got {other:?}"),
    }
}

/// A fresh memory store behind the instrumented layer (object GETs delayed
/// by `delay`, chains unbounded) with `conv` published on it as v2 roots:
/// the store, its counters and the receipts.
async fn instrumented(
    conv: &Conversation,
    delay: Duration,
) -> (Store, Arc<Counters>, Vec<deltapack_store::PublishReceipt>) {
    let (s, counters) =
        common::instrumented::instrumented_store(raw_backend("memory://"), delay, unbounded(1024));
    let receipts = conv.publish(&s, RootFormat::V2).await;
    (s, counters, receipts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_next_turn_reads_only_its_delta() {
    let l = layout(2, 1, 128, 40);
    let conv = Conversation::new("chain-warm", &l, &[2, 1, 2, 1, 2, 3], 9, &[]);
    let (s, counters, receipts) = instrumented(&conv, Duration::ZERO).await;
    let reader = fresh(&s, unbounded(1024));
    // Cold: turn 5 reads its chain, each needed extent once (v2.1 roots
    // carry their delta headers: no header probes).
    let before = counters.gets_of_objects();
    let held = restore(&reader, &conv.id, conv.turns[4].0).await;
    assert_eq!(
        held.hit().expect("hit").snapshot.encoded(),
        conv.turns[4].1.encoded()
    );
    let chain: usize = receipts[..5]
        .iter()
        .map(|r| (r.objects_written + r.objects_reused) as usize)
        .sum();
    assert!(counters.gets_of_objects() - before <= chain);
    // Warm: turn 6 right after turn 5, while the caller still holds turn
    // 5, reads only its own objects.
    let before = counters.gets_of_objects();
    assert_eq!(
        hit_bytes(restore(&reader, &conv.id, conv.turns[5].0).await),
        conv.turns[5].1.encoded()
    );
    let r = &receipts[5];
    assert_eq!(
        counters.gets_of_objects() - before,
        (r.objects_written + r.objects_reused) as usize
    );
    assert!(reader.stats().base_cache_hits >= 1);
    // Once the caller lets turn 5 go, the store does not keep it: restoring
    // turn 6 again reads the chain (the cache never holds a result alive).
    drop(held);
    let (c6, _) = conv.turns[5];
    let fresh_reader = fresh(&s, unbounded(1024));
    let before = counters.gets_of_objects();
    let again = restore(&fresh_reader, &conv.id, c6).await;
    drop(again);
    let before2 = counters.gets_of_objects();
    assert!(before2 - before > (r.objects_written + r.objects_reused) as usize);
    assert_eq!(
        hit_bytes(restore(&fresh_reader, &conv.id, c6).await),
        conv.turns[5].1.encoded()
    );
    assert!(
        counters.gets_of_objects() - before2 > (r.objects_written + r.objects_reused) as usize,
        "a dropped result is not cached"
    );
}

/// The read counters (`objects_read`, `bytes_read`, and so the metrics
/// built on them) count what a chain restore fetched from the backend: the
/// extents that still hold result bytes, and of those only the needed
/// ranges — not every extent of every turn, which is what they counted
/// before (2.36 GB for a 1.6 GB result at 256 turns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_counters_count_what_a_chain_restore_fetched() {
    let l = layout(2, 1, 128, 40);
    // Edits rewrite earlier pages, so older turns' bytes are partly
    // replaced and some of their extents are not needed at all.
    let edits = [vec![], vec![0, 1], vec![2], vec![0, 5], vec![1, 3, 4]];
    let conv = Conversation::new("chain-reads", &l, &[3, 1, 2, 1, 2, 1], 23, &edits);
    let (s, counters, _) = instrumented(&conv, Duration::ZERO).await;
    // What the counters used to say: every extent of every turn, whole.
    let mut every_extent = 0u64;
    for (c, _) in &conv.turns {
        match s.peek_root(&conv.id.namespace(), c).await.expect("root") {
            deltapack_store::RootStatus::Found(r) => match *r {
                DecodedRoot::V2(m) => {
                    every_extent += m.extents.iter().map(|e| e.stored_len).sum::<u64>()
                }
                other => panic!("not v2: {other:?}"),
            },
            _ => panic!("root missing"),
        }
    }
    let (c, want) = &conv.turns[5];
    for into in [false, true] {
        let reader = fresh(&s, unbounded(1024));
        let (gets, bytes) = (counters.gets_of_objects(), counters.object_bytes());
        if into {
            let mut buf = vec![0u8; want.encoded().len()];
            assert!(matches!(
                restore_into(&reader, &conv.id, *c, &mut buf).await,
                RestoreIntoOutcome::Hit { .. }
            ));
            assert_eq!(&buf[..], want.encoded());
        } else {
            assert_eq!(
                hit_bytes(restore(&reader, &conv.id, *c).await),
                want.encoded()
            );
        }
        let st = reader.stats();
        let (gets, bytes) = (
            (counters.gets_of_objects() - gets) as u64,
            counters.object_bytes() - bytes,
        );
        assert!(gets > 0 && bytes > 0);
        assert_eq!(st.objects_read, gets, "objects read (into: {into})");
        assert_eq!(st.bytes_read, bytes, "bytes read (into: {into})");
        assert!(
            bytes < every_extent,
            "a chain restore reads less than all its extents ({bytes} of {every_extent})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_is_fetched_in_one_round_of_root_reads() {
    let l = layout(1, 1, 128, 24);
    let conv = Conversation::new("chain-hints", &l, &[1; 12], 3, &[]);
    let (s, counters, receipts) = instrumented(&conv, Duration::from_millis(20)).await;
    assert_eq!(receipts[0].chain_depth, 0);
    for (i, r) in receipts.iter().enumerate().skip(1) {
        assert_eq!(r.chain_depth as usize, i, "turn {i}'s depth");
        assert_eq!(r.schema, SCHEMA_V2_2);
    }
    let top = conv.turns[11].0;
    let m = match s.read_root(&conv.id.namespace(), &top).await.expect("root") {
        deltapack_store::RootStatus::Found(d) => match *d {
            DecodedRoot::V2(m) => m,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    assert_eq!(
        m.chain_hints().len(),
        10,
        "every root below the base is listed"
    );
    let reader = fresh_with_ledger(&s, unbounded(1024)).await;
    let roots = roots_read_restoring(&counters, &reader, &conv, 11).await;
    // The base and the ten roots below it were read concurrently, not one
    // per turn.
    assert!(
        counters.max_root_gets() >= 11,
        "max root reads in flight: {}",
        counters.max_root_gets()
    );
    assert_eq!(roots, 12, "each root read once");
}

/// Restores turn `k` of `conv` through `reader` (asserting its bytes) and
/// returns how many root GETs the restore made.
async fn roots_read_restoring(
    counters: &Counters,
    reader: &Store,
    conv: &Conversation,
    k: usize,
) -> usize {
    let roots_before = counters.gets_of_roots();
    let (top, want) = &conv.turns[k];
    let got = tokio::time::timeout(Duration::from_secs(60), restore(reader, &conv.id, *top))
        .await
        .expect("restore finishes");
    assert_eq!(hit_bytes(got), want.encoded());
    counters.gets_of_roots() - roots_before
}

/// A process with its ledger open does not wait for the requested root to
/// learn the chain below it: the ledger's base links name the roots, whose
/// reads start while the requested root is still being read — one round
/// trip for a chain's roots instead of two. The requested root's GET is
/// held until the eleven other roots' GETs have started; a restore that
/// waited for that root before reading the others would make the gate give
/// up (after 10 s) instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_names_a_chains_roots_while_its_root_is_read() {
    let l = layout(1, 1, 128, 24);
    let conv = Conversation::new("chain-ledger", &l, &[1; 12], 7, &[]);
    let (s, counters, _) = instrumented(&conv, Duration::from_millis(5)).await;
    let top = conv.turns[11].0;
    // The ledger is open, its roots read before the gate is set.
    let reader = fresh_with_ledger(&s, unbounded(1024)).await;
    let started = counters
        .root_gets_started
        .load(std::sync::atomic::Ordering::SeqCst);
    let key = keys::root_key(&conv.id.namespace(), &top).to_string();
    *counters.gate.lock().expect("gate") = Some((key, started + 12));
    let roots = roots_read_restoring(&counters, &reader, &conv, 11).await;
    assert!(
        !counters
            .gate_gave_up
            .load(std::sync::atomic::Ordering::SeqCst),
        "the chain's roots were not read until the requested root was"
    );
    assert_eq!(roots, 12, "each root read once");
}

/// The ledger is derived state and only a hint to a restore: links it
/// records wrongly (a root "based" on another conversation's turn, a forged
/// cycle, a forgotten middle root) cost reads, never a wrong byte or a
/// hang: every root is checked, and the walk follows the roots' own links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_or_forged_ledger_costs_reads_never_bytes() {
    let l = layout(2, 1, 128, 40);
    let edits = [vec![], vec![0], vec![1, 2]];
    let a = Conversation::new("ledger-a", &l, &[2, 1, 2, 1, 2, 1], 31, &edits);
    let b = Conversation::new("ledger-b", &l, &[1, 2, 1, 2], 37, &[]);
    let t = local(unbounded(1024));
    a.publish(&t.store, RootFormat::V2).await;
    b.publish(&t.store, RootFormat::V2).await;
    let reader = fresh(&t.store, unbounded(1024));
    // Opens the ledger and waits for its reconciliation with the store, so
    // that nothing rewrites the links forged below.
    reader.collect_garbage().await.expect("gc");
    let db = t
        ._dir
        .as_ref()
        .expect("local dir")
        .path()
        .join("ledger")
        .join("ledger.sqlite3");
    let conn = rusqlite::Connection::open(&db).expect("open ledger");
    let (an, bn) = (a.id.namespace().hex(), b.id.namespace().hex());
    let hex = |c: &ContextDigest| c.hex();
    let relink = "UPDATE roots SET base_ns = ?1, base_ctx = ?2 WHERE ns = ?3 AND ctx = ?4";
    // A's turn 5 "based on" B's turn 3.
    let n = conn
        .execute(relink, [&bn, &hex(&b.turns[2].0), &an, &hex(&a.turns[4].0)])
        .expect("relink");
    assert_eq!(n, 1);
    // B's flat turn 1 and its turn 2 based on each other.
    let n = conn
        .execute(relink, [&bn, &hex(&b.turns[1].0), &bn, &hex(&b.turns[0].0)])
        .expect("cycle");
    assert_eq!(n, 1);
    // A's turn 3 forgotten.
    let n = conn
        .execute(
            "DELETE FROM roots WHERE ns = ?1 AND ctx = ?2",
            [&an, &hex(&a.turns[2].0)],
        )
        .expect("forget");
    assert_eq!(n, 1);
    drop(conn);
    // One handle (a new one would reconcile its ledger in the background,
    // repairing the links), each result dropped before the next restore, so
    // no turn is restored from memory.
    let r = &reader;
    for conv in [&a, &b] {
        for (c, want) in conv.turns.iter().rev() {
            assert_eq!(hit_bytes(restore(r, &conv.id, *c).await), want.encoded());
            let mut buf = vec![0u8; want.encoded().len()];
            assert!(matches!(
                restore_into(r, &conv.id, *c, &mut buf).await,
                RestoreIntoOutcome::Hit { .. }
            ));
            assert_eq!(&buf[..], want.encoded());
        }
    }
}

/// A chain longer than the old fixed prefetch width (32) still has its
/// roots read in one round, and `roots_in_flight` bounds that round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roots_in_flight_bounds_the_one_round_of_root_reads() {
    let l = layout(1, 1, 128, 24);
    let conv = Conversation::new("chain-wide", &l, &[1; 48], 5, &[]);
    let (s, counters, _) = instrumented(&conv, Duration::from_millis(20)).await;
    // The requested root's own read may still be in flight when the
    // ledger-named roots' reads start: one more than the width.
    for (width, at_least, at_most) in [(256, 47, 48), (5, 5, 6)] {
        let reader = fresh_with_ledger(&s, unbounded(1024).with_roots_in_flight(width)).await;
        counters.root_gets.reset_max();
        let roots = roots_read_restoring(&counters, &reader, &conv, 47).await;
        let max = counters.max_root_gets();
        assert!(
            (at_least..=at_most).contains(&max),
            "roots_in_flight {width}: {max} root reads in flight"
        );
        assert_eq!(roots, 48, "each root read once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_restores_of_one_conversation_share_work() {
    let l = layout(2, 0, 128, 40);
    let conv = Conversation::new("chain-share", &l, &[2, 2, 2, 2, 2, 2, 2], 4, &[]);
    let (s, _counters, _) = instrumented(&conv, Duration::from_millis(20)).await;
    let reader = fresh(&s, unbounded(1024));
    let (c6, c7) = (conv.turns[5].0, conv.turns[6].0);
    let r6 = {
        let (r, id) = (reader.clone(), conv.id.clone());
        tokio::spawn(async move { r.restore((&id, c6), Default::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    let b7 = hit_bytes(restore(&reader, &conv.id, c7).await);
    let b6 = hit_bytes(r6.await.expect("join").expect("restore"));
    assert_eq!(b6, conv.turns[5].1.encoded());
    assert_eq!(b7, conv.turns[6].1.encoded());
    assert!(
        reader.stats().restores_shared >= 1,
        "turn 7 built on turn 6's restore"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_chains_restore_and_the_depth_limit_holds() {
    let l = layout(1, 1, 256, 16);
    let conv = Conversation::new("chain-deep", &l, &[1; 40], 12, &[]);
    let t = memory(unbounded(1024));
    conv.publish(&t.store, RootFormat::V2).await;
    let (top, want) = conv.turns[39].clone();
    assert_eq!(
        hit_bytes(restore(&fresh(&t.store, unbounded(1024)), &conv.id, top).await),
        want.encoded()
    );
    let shallow = unbounded(1024).with_max_base_depth(10);
    match restore(&fresh(&t.store, shallow), &conv.id, top).await {
        RestoreOutcome::Miss(MissReason::Corrupt { what, .. }) => {
            assert!(what.contains("deeper"), "{what}")
        }
        other => panic!("expected corrupt, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_policy_rebases() {
    let l = layout(2, 1, 128, 32);
    let conv = Conversation::new("chain-policy", &l, &[2; 9], 21, &[]);
    // At most 3 deltas above a flat root.
    let t = memory(
        StoreConfig::default()
            .with_max_extent_bytes(1024)
            .with_chain(
                ChainPolicy::default()
                    .with_max_depth(Some(3))
                    .with_max_read_overhead(None),
            ),
    );
    let receipts = conv.publish(&t.store, RootFormat::V2).await;
    let depths: Vec<u32> = receipts.iter().map(|r| r.chain_depth).collect();
    let rebased: Vec<bool> = receipts.iter().map(|r| r.rebased).collect();
    assert_eq!(depths, vec![0, 1, 2, 3, 0, 1, 2, 3, 0]);
    assert_eq!(
        rebased,
        vec![false, false, false, false, true, false, false, false, true]
    );
    for (c, snap) in &conv.turns {
        assert_eq!(
            hit_bytes(restore(&fresh(&t.store, unbounded(1024)), &conv.id, *c).await),
            snap.encoded()
        );
    }
    // A read-overhead bound of zero: every chain reads more than its result
    // (the flat root alone is the base), so every turn is flat.
    let t = memory(
        StoreConfig::default()
            .with_max_extent_bytes(1024)
            .with_chain(
                ChainPolicy::default()
                    .with_max_depth(None)
                    .with_max_read_overhead(Some(0.0)),
            ),
    );
    let receipts = conv.publish(&t.store, RootFormat::V2).await;
    assert!(receipts
        .iter()
        .skip(1)
        .all(|r| r.rebased && r.chain_depth == 0));
    // A chain that cannot be followed below the base (a middle root gone)
    // is not grown: the next turn is published flat.
    let t = memory(unbounded(1024));
    let receipts = conv.publish(&t.store, RootFormat::V2).await;
    assert!(receipts.iter().all(|r| !r.rebased));
    let more = Conversation::new("chain-policy", &l, &[2; 10], 21, &[]);
    let mid = keys::root_key(&conv.id.namespace(), &conv.turns[4].0);
    // Drop the hints' shortcut too: the root below the base is read link by link.
    let base_root = keys::root_key(&conv.id.namespace(), &conv.turns[8].0);
    let bytes = stored(t.store.object_store(), &base_root).await;
    let mut m = match root::decode(&bytes, None).expect("decode") {
        DecodedRoot::V2(m) => m,
        other => panic!("{other:?}"),
    };
    m.chain = None;
    m.schema = m.schema_str().into();
    t.store
        .object_store()
        .put(
            &base_root,
            PutPayload::from(root::encode_v2(&m, None).expect("encode")),
        )
        .await
        .expect("put");
    t.store.object_store().delete(&mid).await.expect("delete");
    let (c10, s10) = more.turns[9].clone();
    let r = publish_delta(
        &t.store,
        &conv.id,
        c10,
        s10.clone(),
        conv.turns[8].0,
        conv.turns[8].1.clone(),
        RootFormat::V2,
    )
    .await;
    assert!(r.rebased && r.chain_depth == 0, "{r:?}");
    assert_eq!(
        hit_bytes(restore(&fresh(&t.store, unbounded(1024)), &conv.id, c10).await),
        s10.encoded()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_over_a_legacy_base_compose() {
    // A v1 flat root, then v2 deltas: the v1 base is restored the old way
    // and the v2 deltas composed over it.
    let l = layout(2, 1, 128, 24);
    let conv = Conversation::new("chain-mixed", &l, &[2, 1, 2, 2], 8, &[]);
    let t = local(unbounded(1024));
    let (c0, s0) = conv.turns[0].clone();
    publish_base(&t.store, &conv.id, c0, s0, RootFormat::V1).await;
    for i in 1..conv.turns.len() {
        let (c, s) = conv.turns[i].clone();
        let (bc, b) = conv.turns[i - 1].clone();
        publish_delta(&t.store, &conv.id, c, s, bc, b, RootFormat::V2).await;
    }
    for (c, snap) in &conv.turns {
        assert_eq!(
            hit_bytes(restore(&fresh(&t.store, unbounded(1024)), &conv.id, *c).await),
            snap.encoded()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_header_that_lies_is_corrupt_and_blames_no_object() {
    // A v2.1 root whose recorded delta header claims less reuse than the
    // stored payload's header: self-consistent for the decoder, but not the
    // payload. The plan is made from the root; the stored header bytes
    // verify against their extent's name, so the root is at fault: a
    // corrupt miss, and no healthy object is quarantined.
    let (t, conv) = five_turns("chain-header-lie").await;
    let (c, want) = conv.turns[3].clone();
    let mut m = manifest(&t, &conv.id, c);
    let chain = m.chain.as_mut().expect("v2.1");
    let (mut h, _) = deltapack_format::delta::decode_header(&chain.delta_header).expect("header");
    let g = h
        .reused_pages
        .iter()
        .position(|r| *r > 0)
        .expect("a group reuses pages");
    h.reused_pages[g] -= 1;
    chain.delta_header = deltapack_format::DeltaLayout {
        header: h,
        tails: Vec::new(),
    }
    .header_bytes()
    .expect("header");
    put_manifest(&t, &conv.id, c, &m);
    let s = fresh(&t.store, unbounded(1024));
    match restore(&s, &conv.id, c).await {
        RestoreOutcome::Miss(MissReason::Corrupt { .. }) => {}
        other => panic!("expected corrupt, got {other:?}"),
    }
    let mut buf = vec![0xAA; want.encoded().len()];
    match restore_into(&s, &conv.id, c, &mut buf).await {
        RestoreIntoOutcome::Miss { reason } => assert_eq!(reason.label(), "corrupt"),
        other => panic!("expected a miss, got {other:?}"),
    }
    assert!(buf.iter().all(|b| *b == 0));
    assert_eq!(
        s.stats().quarantined,
        0,
        "every object is what its name says"
    );
}

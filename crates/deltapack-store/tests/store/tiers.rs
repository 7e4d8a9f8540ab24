//! Tiers: a node-local tier in front of an origin (the S3 test server in
//! CI, a local directory otherwise). Why: a node restores the same roots
//! again and again, and the tier must serve them from its own disk with
//! the same verification, fall through to the origin on anything it cannot
//! prove, fill itself only with checked bytes, never change the origin,
//! and never serve a root the origin no longer holds once it has checked.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use deltapack_format::{CacheIdentity, ContextDigest, Snapshot};
use deltapack_store::{
    PublishOutcome, RestoreOutcome, RootFormat, RootStatus, Store, StoreError, TierAck, TierConfig,
    TierStats, Turn, TurnRequest,
};

/// A conversation's turns, oldest first: each one's context and snapshot.
pub(crate) type Turns = Vec<(ContextDigest, Arc<Snapshot>)>;

/// A test's scratch space: its origin (a fresh S3 prefix when the test
/// server is there, else a local directory) and its node's tier folder.
pub(crate) struct Site {
    pub(crate) origin: String,
    pub(crate) tier_dir: PathBuf,
    pub(crate) dir: tempfile::TempDir,
}

impl Site {
    /// A fresh site in a new temp dir.
    pub(crate) fn new() -> Site {
        let dir = tempfile::tempdir().expect("tmp");
        let origin =
            s3_url().unwrap_or_else(|| format!("file://{}", dir.path().join("origin").display()));
        Site {
            origin,
            tier_dir: dir.path().join("tier"),
            dir,
        }
    }

    /// A handle on the origin without a tier (another node's, or a check's).
    pub(crate) fn plain(&self) -> Store {
        Store::open(&self.origin, config()).expect("origin")
    }
}

/// A tier in `tier_dir` checking the origin at most every `interval`.
pub(crate) fn tier_config(tier_dir: &Path, interval: Duration) -> TierConfig {
    TierConfig::new(format!("file://{}", tier_dir.display())).with_check_interval(interval)
}

/// A handle on `origin` with `tier`.
pub(crate) fn open_tiered(origin: &str, tier: TierConfig) -> Store {
    Store::open(origin, config().with_tier(Some(tier))).expect("tiered store")
}

/// A handle on `origin` with a tier in `tier_dir`, checking the origin at
/// most every `interval`.
pub(crate) fn tiered(origin: &str, tier_dir: &Path, interval: Duration) -> Store {
    open_tiered(origin, tier_config(tier_dir, interval))
}

pub(crate) fn tier_stats(s: &Store) -> TierStats {
    s.tier_stats().expect("a tier is configured")
}

/// Every object file in a store directory, largest first.
fn object_files(root: &Path) -> Vec<PathBuf> {
    let mut out = files_under(&root.join("objects"));
    out.sort_by_key(|p| std::cmp::Reverse(std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)));
    out
}

/// `store`'s root of `c`, unverified.
pub(crate) async fn peek(store: &Store, id: &CacheIdentity, c: &ContextDigest) -> RootStatus {
    store.peek_root(&id.namespace(), c).await.expect("peek")
}

/// Uploads `node`'s backlog to the origin: every root of it, none failed.
pub(crate) async fn upload_all(node: &Store) {
    let report = node.tier_upload().await.expect("upload");
    assert_eq!((report.failed, report.remaining), (0, 0), "{report:?}");
}

/// Each turn restores from the origin (`plain`) to exactly its snapshot,
/// and its root there verifies intact.
pub(crate) async fn assert_in_origin(
    plain: &Store,
    id: &CacheIdentity,
    turns: &[(ContextDigest, Arc<Snapshot>)],
) {
    assert_restores(plain, id, turns, "the origin").await;
    for (c, _) in turns {
        let verdict = plain.verify_root((id, *c)).await.expect("verify");
        assert!(verdict.is_intact(), "{verdict:?}");
    }
}

/// Publishes a flat turn and three deltas on it through `store`; the
/// contexts and snapshots, oldest first.
pub(crate) async fn chain_of_four(store: &Store, id: &CacheIdentity, seed: u64) -> Turns {
    let mut turns: Turns = Vec::new();
    for i in 1..=4u64 {
        let (c, snap) = (ctx(id, seed, (i * 1024) as usize), turn(seed, i * 1024));
        let req = match turns.last() {
            None => flat(id, c, &snap, RootFormat::V2),
            Some((bc, b)) => delta(id, c, &snap, *bc, b, RootFormat::V2),
        };
        store.publish(req).await.expect("publish");
        turns.push((c, snap));
    }
    turns
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_restore_on_a_node_is_served_by_the_tier() {
    let site = Site::new();
    let id = identity("tier-fill");
    // Published by another node: the tier has never seen these roots.
    let plain = site.plain();
    let turns = chain_of_four(&plain, &id, 301).await;
    let node = tiered(&site.origin, &site.tier_dir, Duration::from_secs(60));

    for (c, snap) in &turns {
        assert_eq!(restore_bytes(&node, &id, *c).await, snap.encoded());
        node.tier_settle().await;
    }
    let filled = tier_stats(&node);
    assert_eq!(filled.hits, 0, "{filled:?}");
    assert_eq!(filled.misses, 4, "{filled:?}");
    assert!(filled.fills >= 1 && filled.fill_bytes > 0, "{filled:?}");
    assert_eq!(filled.fills_failed, 0, "{filled:?}");

    // Again: every turn from the tier, not one object read from the origin.
    let before = node.stats();
    for (c, snap) in &turns {
        assert_eq!(restore_bytes(&node, &id, *c).await, snap.encoded());
        let mut buf = vec![0u8; snap.encoded().len()];
        assert_restored_into(&node, (&id, *c), &mut buf, snap.encoded(), "the node").await;
    }
    let after = node.stats();
    assert_eq!(
        after.objects_read, before.objects_read,
        "the origin was read"
    );
    assert_eq!(tier_stats(&node).hits, 8);
    assert_eq!(
        after.hits - before.hits,
        8,
        "tier hits are hits of the handle"
    );
    // The tier holds exactly the origin's roots (copied verbatim).
    let tier = node.tier_store().expect("tier");
    for (c, _) in &turns {
        let ns = id.namespace();
        assert_eq!(
            tier.peek_root(&ns, c).await.expect("tier root"),
            plain.peek_root(&ns, c).await.expect("origin root"),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_through_publication_fills_both_and_acknowledges_the_origin() {
    let site = Site::new();
    let id = identity("tier-write");
    let node = tiered(&site.origin, &site.tier_dir, Duration::from_secs(60));
    let turns = chain_of_four(&node, &id, 302).await;

    // The origin has every root, readable by a handle without a tier.
    assert_restores(&site.plain(), &id, &turns, "the origin").await;
    // The node reads them from its tier, without a fill.
    assert_restores(&node, &id, &turns, "the node").await;
    let s = tier_stats(&node);
    assert_eq!((s.hits, s.fills, s.publish_failures), (4, 0, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_the_tier_falls_through_and_is_quarantined_there_only() {
    let site = Site::new();
    let id = identity("tier-flip");
    let node = tiered(&site.origin, &site.tier_dir, Duration::from_secs(60));
    let (c, snap) = (ctx(&id, 303, 4096), turn(303, 4096));
    node.publish(flat(&id, c, &snap, RootFormat::V2))
        .await
        .expect("publish");

    // Damage the tier's largest extent (a real byte of a real file).
    let victim = object_files(&site.tier_dir)
        .into_iter()
        .next()
        .expect("a tier object");
    let mut bytes = std::fs::read(&victim).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    std::fs::write(&victim, &bytes).expect("write");

    // A hit with the right bytes, from the origin.
    assert_eq!(restore_bytes(&node, &id, c).await, snap.encoded());
    let s = tier_stats(&node);
    assert_eq!((s.hits, s.fall_throughs), (0, 1), "{s:?}");
    let tier = node.tier_store().expect("tier");
    assert!(
        tier.stats().quarantined >= 1,
        "the tier quarantined the proven damage"
    );
    // The origin is untouched: intact, nothing quarantined there.
    let verdict = site.plain().verify_root((&id, c)).await.expect("verify");
    assert!(verdict.is_intact(), "{verdict:?}");
    assert_eq!(
        node.stats().quarantined,
        0,
        "the origin quarantined nothing"
    );

    // The fill puts the object back, and the tier serves again.
    node.tier_settle().await;
    assert_eq!(restore_bytes(&node, &id, c).await, snap.encoded());
    assert_eq!(tier_stats(&node).hits, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_invalidation_is_not_served_from_the_tier_after_the_check() {
    let site = Site::new();
    let id = identity("tier-coherence");
    // Interval zero: every tier hit is checked against the origin.
    let node = tiered(&site.origin, &site.tier_dir, Duration::ZERO);
    let turns = chain_of_four(&node, &id, 304).await;
    let (top, _) = turns[3];
    let (bottom, bottom_snap) = &turns[0];
    assert_eq!(restore_bytes(&node, &id, top).await, turns[3].1.encoded());
    assert_eq!(tier_stats(&node).hits, 1);

    // Another handle invalidates the top turn in the origin.
    let plain = site.plain();
    let plan = plain
        .invalidate_plan(id.namespace(), Some(top))
        .await
        .expect("plan");
    plain.execute(plan).await.expect("invalidate");

    let out = node
        .restore((&id, top), Default::default())
        .await
        .expect("restore");
    assert!(
        matches!(out, RestoreOutcome::Miss(_)),
        "served a root the origin invalidated"
    );
    let s = tier_stats(&node);
    assert_eq!(s.refused, 1, "{s:?}");
    // The tier dropped its copy; the turns below it still serve.
    let tier = node.tier_store().expect("tier");
    assert!(matches!(peek(tier, &id, &top).await, RootStatus::Absent));
    assert_eq!(
        restore_bytes(&node, &id, *bottom).await,
        bottom_snap.encoded()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_origin_down_the_tier_serves_what_it_holds_and_misses_name_the_origin() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let site = Site::new();
    let (origin, tier_dir) = (&site.origin, &site.tier_dir);
    let id = identity("tier-down");
    let node = tiered(origin, tier_dir, Duration::ZERO);
    let (c, snap) = (ctx(&id, 305, 2048), turn(305, 2048));
    node.publish(flat(&id, c, &snap, RootFormat::V2))
        .await
        .expect("publish");
    drop(node);

    // The same bucket and prefix behind an endpoint nothing listens on: the
    // origin is down (no retries, so the test does not wait minutes).
    let down = down(origin, &endpoint);
    assert_ne!(&down, origin);
    let node = tiered(&down, tier_dir, Duration::ZERO);
    assert_eq!(restore_bytes(&node, &id, c).await, snap.encoded());
    let s = tier_stats(&node);
    assert_eq!((s.hits, s.unchecked), (1, 1), "{s:?}");

    let unknown = ctx(&id, 306, 2048);
    match node.restore((&id, unknown), Default::default()).await {
        Err(e @ StoreError::OriginUnavailable { .. }) => {
            let text = e.to_string();
            assert!(text.contains("origin s3://"), "{text}");
        }
        other => panic!("expected the origin to be named as down, got {other:?}"),
    }
}

/// A tier in `tier_dir` that acknowledges publications itself (and checks
/// the origin on every hit).
pub(crate) fn behind_config(tier_dir: &Path) -> TierConfig {
    tier_config(tier_dir, Duration::ZERO).with_ack(TierAck::Tier)
}

/// A tiered handle that acknowledges publications in the tier.
pub(crate) fn behind(origin: &str, tier_dir: &Path) -> Store {
    open_tiered(origin, behind_config(tier_dir))
}

/// `origin` behind an endpoint nothing listens on, failing at once.
pub(crate) fn down(origin: &str, endpoint: &str) -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    origin
        .replace(endpoint, &format!("http://127.0.0.1:{port}"))
        .replace("?endpoint", "?max_retries=0&retry_timeout=1s&endpoint")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_mode_acknowledges_in_the_tier_and_uploads_behind() {
    let site = Site::new();
    let id = identity("tier-behind");
    let node = behind(&site.origin, &site.tier_dir);
    let turns = chain_of_four(&node, &id, 307).await;
    // Read-your-writes on the node, whatever the upload has done so far.
    assert_restores(&node, &id, &turns, "the node").await;
    // Everything reaches the origin.
    upload_all(&node).await;
    assert_eq!(node.tier_backlog().await.expect("backlog"), 0);
    assert_in_origin(&site.plain(), &id, &turns).await;
    assert_eq!(tier_stats(&node).uploads, 4, "{:?}", tier_stats(&node));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_through_with_the_origin_down_fails_and_keeps_nothing_in_the_tier() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let site = Site::new();
    let origin = down(&site.origin, &endpoint);
    let id = identity("tier-through-down");
    let node = tiered(&origin, &site.tier_dir, Duration::ZERO);
    let (c, snap) = (ctx(&id, 308, 2048), turn(308, 2048));
    let out = node.publish(flat(&id, c, &snap, RootFormat::V2)).await;
    assert!(
        out.is_err(),
        "a write-through publication with the origin down: {out:?}"
    );
    let tier = node.tier_store().expect("tier");
    assert!(matches!(peek(tier, &id, &c).await, RootStatus::Absent));
}

/// The child of [`a_killed_node_resumes_its_uploads_and_the_origin_never_shows_a_root_early`]:
/// publishes two turns acknowledged in the tier with the origin down, says
/// so, and waits to be killed.
const CHILD: &str = "DELTAPACK_TEST_TIER_CHILD";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_resumes_its_uploads_and_the_origin_never_shows_a_root_early() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let id = identity("tier-kill9");
    let (c1, s1) = (ctx(&id, 309, 1024), turn(309, 1024));
    let (c2, s2) = (ctx(&id, 309, 2048), turn(309, 2048));
    if let Ok(spec) = std::env::var(CHILD) {
        let (origin, tier_dir) = spec.split_once('\n').expect("child spec");
        let node = behind(origin, Path::new(tier_dir));
        node.publish(flat(&id, c1, &s1, RootFormat::V2))
            .await
            .expect("acknowledged in the tier");
        node.publish(delta(&id, c2, &s2, c1, &s1, RootFormat::V2))
            .await
            .expect("acknowledged in the tier");
        println!("ACKED");
        tokio::time::sleep(Duration::from_secs(300)).await;
        return;
    }
    let site = Site::new();
    let (origin, tier_dir) = (&site.origin, &site.tier_dir);
    let mut child = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args([
            "tiers::a_killed_node_resumes_its_uploads_and_the_origin_never_shows_a_root_early",
            "--exact",
            "--nocapture",
        ])
        .env(
            CHILD,
            format!("{}\n{}", down(origin, &endpoint), tier_dir.display()),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the node");
    let stdout = child.stdout.take().expect("stdout");
    let acked = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(std::result::Result::ok)
            .any(|l| l.contains("ACKED"))
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !acked.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    assert!(
        acked.join().expect("reader"),
        "the node acknowledged in its tier"
    );

    // Nothing reached the origin while it was down.
    let plain = site.plain();
    for c in [c1, c2] {
        assert!(matches!(peek(&plain, &id, &c).await, RootStatus::Absent));
    }
    // The restarted node finds its journal and uploads, objects first.
    let node = behind(origin, tier_dir);
    assert_eq!(node.tier_backlog().await.expect("backlog"), 2);
    upload_all(&node).await;
    assert_in_origin(&plain, &id, &[(c1, s1), (c2, s2)]).await;
}

/// A conversation of `n` turns through `store`: a flat first turn, then
/// each next one from its new pages alone ([`Store::publish_turn`]) with
/// the handle the previous publication returned. The contexts and
/// snapshots, oldest first, and the last turn's handle.
pub(crate) async fn turn_by_turn(
    store: &Store,
    id: &CacheIdentity,
    seed: u64,
    n: u64,
) -> (Turns, Turn) {
    let (c, first) = (ctx(id, seed, 1024), turn(seed, 1024));
    let r = publish_base(store, id, c, first.clone(), RootFormat::V2).await;
    let mut prev = r.turn.expect("a v2.2 publication returns a turn");
    let mut out = vec![(c, first)];
    for k in 1..n {
        let (c, snap, next) = next_turn(store, id, seed, &prev, 1024 + 512 * k).await;
        prev = next;
        out.push((c, snap));
    }
    (out, prev)
}

/// Publishes the `seed` conversation at `tokens` as the turn after `prev`
/// (its new pages alone); its context, snapshot and handle.
pub(crate) async fn next_turn(
    store: &Store,
    id: &CacheIdentity,
    seed: u64,
    prev: &Turn,
    tokens: u64,
) -> (ContextDigest, Arc<Snapshot>, Turn) {
    let (c, snap) = (ctx(id, seed, tokens as usize), turn(seed, tokens));
    let req = TurnRequest {
        identity: id.clone(),
        context: c,
        boundary: tokens,
        tail: prev.tail_of(&snap).expect("tail"),
    };
    let r = store.publish_turn(prev, req).await.expect("publish_turn");
    assert_eq!(r.outcome, PublishOutcome::Created);
    (c, snap, r.turn.expect("turn"))
}

pub(crate) fn held(status: RootStatus) -> bool {
    matches!(status, RootStatus::Found(_))
}

/// Turns published through a tiered handle land in the origin and in the
/// tier from their new pages alone: the tier takes its own turn on its
/// copy of the previous root, so no fill reads them back from the origin.
/// A node whose tier lacks the previous turn gets the new one by a fill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_are_written_through_to_the_tier_from_their_new_pages() {
    let site = Site::new();
    let id = identity("tier-turns");
    let node = tiered(&site.origin, &site.tier_dir, Duration::from_secs(60));
    let (turns, last) = turn_by_turn(&node, &id, 311, 4).await;
    let plain = site.plain();
    let tier = node.tier_store().expect("tier");
    assert_restores(&plain, &id, &turns, "the origin").await;
    for (c, _) in &turns {
        assert!(held(peek(tier, &id, c).await));
    }
    node.tier_settle().await;
    let s = tier_stats(&node);
    assert_eq!((s.fills, s.publish_failures), (0, 0), "{s:?}");
    let before = node.stats();
    assert_restores(&node, &id, &turns, "the node").await;
    assert_eq!(
        node.stats().objects_read,
        before.objects_read,
        "the origin was read"
    );
    assert_eq!(tier_stats(&node).hits, 4);

    // Another node continues the conversation with the same handle; its
    // tier never saw the previous turn, so the new one is filled in.
    let other = tiered(
        &site.origin,
        &site.dir.path().join("tier2"),
        Duration::from_secs(60),
    );
    let (c, snap, _) = next_turn(&other, &id, 311, &last, 3072).await;
    other.tier_settle().await;
    let s = tier_stats(&other);
    assert!(s.fills >= 1 && s.publish_failures == 0, "{s:?}");
    assert_eq!(restore_bytes(&other, &id, c).await, snap.encoded());
    assert_eq!(restore_bytes(&plain, &id, c).await, snap.encoded());
    assert_eq!(tier_stats(&other).hits, 1);
}

/// Behind mode takes turns too. With the origin unreachable a conversation
/// goes on turn by turn in the tier — the handle a publication returns is
/// one for the same store handle, so the next turn takes it, and
/// `turn_from` finds the tier's root — and the node reads its own writes.
/// Nothing reaches the origin until it is back; then the upload brings
/// every turn there, base first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_mode_queues_turns_in_the_tier_while_the_origin_is_down() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let site = Site::new();
    let id = identity("tier-behind-turns");
    let turns = {
        let node = behind(&down(&site.origin, &endpoint), &site.tier_dir);
        let (mut turns, _) = turn_by_turn(&node, &id, 313, 4).await;
        // A process that did not publish the last turn picks the
        // conversation up from the tier's root (the origin is down).
        let (c, last) = turns.last().cloned().expect("turns");
        let resumed = node.turn_from(&id, c, &last).await.expect("turn_from");
        let (c, snap, _) = next_turn(&node, &id, 313, &resumed, 3072).await;
        turns.push((c, snap));
        assert_restores(&node, &id, &turns, "the node").await;
        assert_eq!(node.tier_backlog().await.expect("backlog"), 5);
        turns
    };
    let plain = site.plain();
    for (c, _) in &turns {
        assert!(!held(peek(&plain, &id, c).await));
    }
    let node = behind(&site.origin, &site.tier_dir);
    upload_all(&node).await;
    assert_in_origin(&plain, &id, &turns).await;
}

/// The upload backlog is bounded: with `max_upload_backlog` roots pending
/// (the origin down), the next publication is written through instead of
/// queued — and fails, since the origin is down — counted as inline. A new
/// handle on the same tier counts the journal it finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_upload_backlog_writes_through() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let site = Site::new();
    let origin = &site.origin;
    let id = identity("tier-backlog");
    let bounded = |origin: &str| {
        let mut tier = behind_config(&site.tier_dir);
        tier.max_upload_backlog = 2;
        open_tiered(origin, tier)
    };
    let snaps: Vec<_> = (1..=4u64)
        .map(|i| (ctx(&id, 317, (i * 1024) as usize), turn(317 + i, i * 1024)))
        .collect();
    {
        let node = bounded(&down(origin, &endpoint));
        for (c, snap) in &snaps[..2] {
            node.publish(flat(&id, *c, snap, RootFormat::V2))
                .await
                .expect("queued in the tier");
        }
        let (c, snap) = &snaps[2];
        let out = node.publish(flat(&id, *c, snap, RootFormat::V2)).await;
        assert!(out.is_err(), "written through to a down origin: {out:?}");
        assert_eq!(tier_stats(&node).uploads_inline, 1);
    }
    {
        let node = bounded(&down(origin, &endpoint));
        let (c, snap) = &snaps[3];
        let out = node.publish(flat(&id, *c, snap, RootFormat::V2)).await;
        assert!(out.is_err(), "the journal it found is full: {out:?}");
        assert_eq!(tier_stats(&node).uploads_inline, 1);
        assert_eq!(node.tier_backlog().await.expect("backlog"), 2);
    }
    // With the origin back, the journal drains: this call or the handle's
    // background uploader (which resumes a journal it finds on open, and
    // may get there first) uploads both queued roots.
    let node = bounded(origin);
    upload_all(&node).await;
    assert_eq!(node.tier_backlog().await.expect("backlog"), 0);
    assert_restores(&site.plain(), &id, &snaps[..2], "the origin").await;
}

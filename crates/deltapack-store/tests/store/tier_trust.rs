//! A tier you can trust: the store's two promises hold through a tier —
//! *never hand out anything but what the store holds now* and *never lose
//! an acknowledged publication* — on the paths a fleet takes: a root
//! invalidated and replaced in the origin, a read in the tier while an
//! acknowledged turn waits for its upload, an upload whose base was
//! replaced meanwhile, an origin that accepts and never answers, and a
//! process killed between a behind root's creation and its journal entry.
//!
//! Why: each of these was reproduced with the release CLI (issue 48): the
//! tier served a replaced root for ever, a read deleted an acknowledged
//! write-behind turn, an upload attached a turn to a foreign base, tier
//! hits ignored the restore deadline during an outage, and `lookup` did
//! not see the tier.
//!
//! Real components: local stores with fsync (origin and tier), the origin's
//! SQLite ledger made unreadable by renaming garbage over it (so uploads
//! fail while reads work), the S3 test server behind a TCP black hole
//! (`deltapack_testkit::FaultProxy`), and a child process aborted at a
//! failpoint.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::tiers::*;
use deltapack_format::ContextHasher;
use deltapack_store::{
    LookupSource, PublishOutcome, RestoreOptions, RestoreOutcome, RootFormat, RootStatus, Store,
    TierAck, TierConfig, UPLOAD_HOLD,
};

/// The whole of each test under one bound: nothing here may hang.
const LIMIT: Duration = Duration::from_secs(240);

/// A local origin with its own SQLite ledger (which a test can take down
/// and bring back) and a node's tier folder.
struct LocalSite {
    origin: String,
    ledger: PathBuf,
    tier_dir: PathBuf,
    dir: tempfile::TempDir,
}

impl LocalSite {
    fn new() -> LocalSite {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(dir.path().join("ledger")).expect("ledger folder");
        LocalSite {
            origin: format!("file://{}", dir.path().join("origin").display()),
            ledger: dir.path().join("ledger").join("ledger.sqlite3"),
            tier_dir: dir.path().join("tier"),
            dir,
        }
    }

    fn config(&self) -> deltapack_store::StoreConfig {
        config().with_ledger(Some(format!("sqlite://{}", self.ledger.display())))
    }

    /// A handle on the origin without a tier.
    fn plain(&self) -> Store {
        Store::open(&self.origin, self.config()).expect("origin")
    }

    /// A handle on the origin with the node's tier.
    fn node(&self, tier: TierConfig) -> Store {
        Store::open(&self.origin, self.config().with_tier(Some(tier))).expect("node")
    }

    /// A tier config for this node's tier folder (every hit checked).
    fn tier(&self, ack: TierAck) -> TierConfig {
        tier_config(&self.tier_dir, Duration::ZERO).with_ack(ack)
    }

    /// Takes the origin's ledger down: its folder (database, WAL and
    /// shared-memory files together) moved away and a file of garbage put
    /// in its place (a publication into the origin, and so an upload,
    /// fails; reads work).
    fn ledger_down(&self) {
        let folder = self.ledger.parent().expect("ledger folder");
        std::fs::rename(folder, self.dir.path().join("ledger.away")).expect("move away");
        std::fs::create_dir(folder).expect("folder");
        std::fs::write(&self.ledger, vec![0x5a; 8192]).expect("garbage");
    }

    /// Brings the ledger back.
    fn ledger_up(&self) {
        let folder = self.ledger.parent().expect("ledger folder");
        std::fs::remove_dir_all(folder).expect("remove the garbage");
        std::fs::rename(self.dir.path().join("ledger.away"), folder).expect("move back");
    }
}

/// Runs `f` to completion on a runtime of its own (in a thread of its
/// own), which is then shut down with every task it spawned.
fn on_own_runtime<'a, F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'a,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(f());
            rt.shutdown_timeout(Duration::from_secs(5));
        })
        .join()
        .expect("the node's thread");
    });
}

/// `f`, failing the test if it takes longer than [`LIMIT`].
pub(crate) async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f).await.expect("the test hung")
}

/// Scenario 1 (write-through): publish S1 at C through the tier, the
/// origin invalidates the namespace, publish S2 at C through the same
/// tier: every later restore through the tier returns S2, and the tier
/// holds S2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_root_is_replaced_in_the_tier_by_write_through() {
    bounded(async {
        let site = Site::new();
        let id = identity("trust-replace-through");
        let c = ctx(&id, 401, 2048);
        let (s1, s2) = (turn(401, 2048), turn(402, 2048));
        let node = tiered(&site.origin, &site.tier_dir, Duration::from_secs(60));
        node.publish(flat(&id, c, &s1, RootFormat::V2))
            .await
            .expect("S1");
        assert_eq!(restore_bytes(&node, &id, c).await, s1.encoded());

        let plain = site.plain();
        let plan = plain
            .invalidate_plan(id.namespace(), None)
            .await
            .expect("plan");
        plain.execute(plan).await.expect("invalidate");
        let r = node
            .publish(flat(&id, c, &s2, RootFormat::V2))
            .await
            .expect("S2");
        assert_eq!(r.outcome, PublishOutcome::Created);
        for _ in 0..3 {
            assert_eq!(restore_bytes(&node, &id, c).await, s2.encoded());
        }
        assert_eq!(restore_bytes(&plain, &id, c).await, s2.encoded());
        let tier = node.tier_store().expect("tier");
        assert_eq!(restore_bytes(tier, &id, c).await, s2.encoded());
    })
    .await;
}

/// Scenario 1 (another node replaced it): a node that served S1 from its
/// tier never serves it again once the origin, asked, holds S2 at C; the
/// tier's copy is replaced by the origin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_replaced_by_another_node_is_not_served_from_the_tier() {
    bounded(async {
        let site = Site::new();
        let id = identity("trust-replace-other");
        let c = ctx(&id, 403, 2048);
        let (s1, s2) = (turn(403, 2048), turn(404, 2048));
        let node = tiered(&site.origin, &site.tier_dir, Duration::ZERO);
        node.publish(flat(&id, c, &s1, RootFormat::V2))
            .await
            .expect("S1");
        assert_eq!(restore_bytes(&node, &id, c).await, s1.encoded());
        assert_eq!(tier_stats(&node).hits, 1);

        let plain = site.plain();
        let plan = plain
            .invalidate_plan(id.namespace(), Some(c))
            .await
            .expect("plan");
        plain.execute(plan).await.expect("invalidate");
        plain
            .publish(flat(&id, c, &s2, RootFormat::V2))
            .await
            .expect("S2 by another node");

        assert_eq!(restore_bytes(&node, &id, c).await, s2.encoded());
        let s = tier_stats(&node);
        assert_eq!(s.refused, 1, "{s:?}");
        // The fill replaces the tier's copy: the next restore is a tier hit
        // of S2.
        node.tier_settle().await;
        assert_eq!(restore_bytes(&node, &id, c).await, s2.encoded());
        assert_eq!(tier_stats(&node).hits, 2, "{:?}", tier_stats(&node));
    })
    .await;
}

/// Scenario 1 (behind): a stale uploaded root in the tier does not make a
/// new publication of its context a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_root_does_not_block_a_behind_publication() {
    bounded(async {
        let site = Site::new();
        let id = identity("trust-replace-behind");
        let c = ctx(&id, 405, 2048);
        let (s1, s2) = (turn(405, 2048), turn(406, 2048));
        let node = behind(&site.origin, &site.tier_dir);
        node.publish(flat(&id, c, &s1, RootFormat::V2))
            .await
            .expect("S1");
        upload_all(&node).await;

        let plain = site.plain();
        let plan = plain
            .invalidate_plan(id.namespace(), None)
            .await
            .expect("plan");
        plain.execute(plan).await.expect("invalidate");
        let r = node
            .publish(flat(&id, c, &s2, RootFormat::V2))
            .await
            .expect("S2");
        assert_ne!(r.outcome, PublishOutcome::Conflict, "{r:?}");
        upload_all(&node).await;
        assert_eq!(restore_bytes(&node, &id, c).await, s2.encoded());
        assert_eq!(restore_bytes(&plain, &id, c).await, s2.encoded());
    })
    .await;
}

/// Scenario 2: B is uploaded, the origin removes B, and with the origin's
/// ledger down (uploads fail) D is published on B behind. A restore of B
/// on the node is refused (the origin no longer holds it) — and must not
/// take D with it: once the ledger is back, D is uploaded and restores
/// bit-exactly from the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_never_removes_an_unuploaded_turn() {
    bounded(async {
        let site = LocalSite::new();
        let id = identity("trust-read-keeps");
        let (cb, b) = (ctx(&id, 407, 1024), turn(407, 1024));
        let (cd, d) = (ctx(&id, 407, 2048), turn(407, 2048));
        {
            let node = site.node(site.tier(TierAck::Tier));
            node.publish(flat(&id, cb, &b, RootFormat::V2))
                .await
                .expect("B");
            upload_all(&node).await;
        }
        let plain = site.plain();
        let plan = plain
            .invalidate_plan(id.namespace(), Some(cb))
            .await
            .expect("plan");
        plain.execute(plan).await.expect("the origin removes B");
        drop(plain);

        site.ledger_down();
        let node = site.node(site.tier(TierAck::Tier));
        let r = node
            .publish(delta(&id, cd, &d, cb, &b, RootFormat::V2))
            .await
            .expect("D acknowledged in the tier");
        assert_eq!(r.outcome, PublishOutcome::Created);
        let report = node.tier_upload().await.expect("round");
        assert_eq!(report.remaining, 1, "{report:?}");

        // The read: B is refused (the origin does not hold it) …
        let out = node
            .restore((&id, cb), Default::default())
            .await
            .expect("restore B");
        assert!(matches!(out, RestoreOutcome::Miss(_)), "served B");
        // … and D is still on the node, journaled.
        assert_eq!(restore_bytes(&node, &id, cd).await, d.encoded());
        assert_eq!(node.tier_backlog().await.expect("backlog"), 1);

        site.ledger_up();
        upload_all(&node).await;
        assert_eq!(restore_bytes(&site.plain(), &id, cd).await, d.encoded());
    })
    .await;
}

/// Scenario 3: with the origin's ledger down node A journals B1 at CB and
/// D (on B1) at CD; another node then publishes B2 at CB. A's upload must
/// not attach D to B2: D reaches the origin whole (flattened) and restores
/// bit-exactly, B2 stays the origin's, and A keeps B1 as a reported
/// conflict until it is abandoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_never_attaches_a_turn_to_a_foreign_base() {
    bounded(async {
        let site = LocalSite::new();
        let id = identity("trust-foreign-base");
        let (cb, b1, b2) = (ctx(&id, 409, 1024), turn(409, 1024), turn(410, 1024));
        let (cd, d) = (ctx(&id, 409, 2048), turn(409, 2048));
        // The origin's ledger exists before it goes down.
        let other = identity("trust-foreign-base-other");
        site.plain()
            .publish(flat(
                &other,
                ctx(&other, 1, 1024),
                &turn(1, 1024),
                RootFormat::V2,
            ))
            .await
            .expect("a first publication creates the ledger");
        site.ledger_down();
        // Node A runs on a runtime of its own, so that nothing of it (its
        // background uploader) outlives it.
        on_own_runtime(|| async {
            let a = site.node(site.tier(TierAck::Tier));
            a.publish(flat(&id, cb, &b1, RootFormat::V2))
                .await
                .expect("B1");
            a.publish(delta(&id, cd, &d, cb, &b1, RootFormat::V2))
                .await
                .expect("D");
            assert_eq!(a.tier_backlog().await.expect("backlog"), 2);
        });
        site.ledger_up();
        let x = site.plain();
        let r = x
            .publish(flat(&id, cb, &b2, RootFormat::V2))
            .await
            .expect("B2 by node X");
        assert_eq!(r.outcome, PublishOutcome::Created);

        let a = site.node(site.tier(TierAck::Tier));
        let report = a.tier_upload().await.expect("upload");
        assert_eq!((report.failed, report.remaining), (0, 0), "{report:?}");
        assert!(
            restore_bytes(&x, &id, cd).await == d.encoded(),
            "D in the origin"
        );
        assert!(
            restore_bytes(&x, &id, cb).await == b2.encoded(),
            "B2 in the origin"
        );
        assert!(
            restore_bytes(&a, &id, cb).await == b2.encoded(),
            "B2 through A"
        );
        assert_eq!(tier_stats(&a).upload_conflicts, 1, "{:?}", tier_stats(&a));
        // B1 is kept in the tier as a conflict, said where it is.
        let roots = a.inspect(Some(&id.namespace())).await.expect("inspect");
        let b1_there = roots.iter().find(|r| {
            r.context == cb.hex() && r.location.as_deref() == Some("tier (upload conflict)")
        });
        assert!(b1_there.is_some(), "{roots:?}");
        let tier = a.tier_store().expect("tier");
        assert_eq!(restore_bytes(tier, &id, cb).await, b1.encoded());
        // Abandoning it says what is lost, and removes it.
        let lost = a.tier_abandon(id.namespace(), cb).await.expect("abandon");
        assert_eq!(lost.abandoned.len(), 1, "{lost:?}");
        assert!(matches!(
            peek(tier, &id, &cb).await,
            RootStatus::Absent | RootStatus::Found(_)
        ));
        let roots = a.inspect(Some(&id.namespace())).await.expect("inspect");
        assert!(
            !roots
                .iter()
                .any(|r| r.location.as_deref() == Some("tier (upload conflict)")),
            "{roots:?}"
        );
    })
    .await;
}

/// `origin` behind a TCP black hole (accepts, never answers), failing at
/// once on the client's side otherwise (no retries).
fn black_holed(origin: &str, endpoint: &str, hole: &deltapack_testkit::FaultProxy) -> String {
    origin
        .replace(endpoint, &format!("http://127.0.0.1:{}", hole.port()))
        .replace("?endpoint", "?max_retries=0&retry_timeout=1s&endpoint")
}

/// Scenario 4: with the origin accepting and never answering, a tier hit
/// honours the restore's deadline, and the outage is remembered: once the
/// check the deadline cut short has timed out (in the background), hits
/// are served without asking the origin again until the probe interval
/// ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tier_hits_honour_the_deadline_while_the_origin_does_not_answer() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    bounded(async {
        let site = Site::new();
        let id = identity("trust-deadline");
        let (c, s) = (ctx(&id, 411, 2048), turn(411, 2048));
        tiered(&site.origin, &site.tier_dir, Duration::ZERO)
            .publish(flat(&id, c, &s, RootFormat::V2))
            .await
            .expect("publish");
        let hole = deltapack_testkit::FaultProxy::black_hole().expect("black hole");
        // A check timeout far longer than the deadline: the hit must not
        // wait for it.
        let check = Duration::from_secs(8);
        let mut tc = tier_config(&site.tier_dir, Duration::ZERO);
        tc.check_timeout = check;
        tc.probe_interval = Duration::from_secs(120);
        let node = open_tiered(&black_holed(&site.origin, &endpoint, &hole), tc);
        let opts = RestoreOptions::default().with_deadline(Some(
            tokio::time::Instant::now() + Duration::from_millis(300),
        ));
        let start = Instant::now();
        let out = node.restore((&id, c), opts).await.expect("restore");
        let took = start.elapsed();
        let hit = out.hit().expect("the verified tier copy is served");
        assert!(hit.snapshot.encoded() == s.encoded(), "the tier's snapshot");
        assert!(took < check / 2, "the hit took {took:?}");
        assert!(hole.accepted() >= 1, "the origin was asked");

        // The check goes on without the restore and times out: the breaker
        // opens. Later hits are served at once, and nothing is sent to the
        // origin (no new connection reaches it).
        tokio::time::sleep(check + Duration::from_secs(1)).await;
        let asked = hole.accepted();
        for _ in 0..3 {
            let start = Instant::now();
            assert!(restore_bytes(&node, &id, c).await == s.encoded());
            let took = start.elapsed();
            assert!(took < check / 2, "a hit took {took:?}");
        }
        assert_eq!(hole.accepted(), asked, "the origin was asked again");
        assert_eq!(tier_stats(&node).unchecked, 4, "{:?}", tier_stats(&node));
    })
    .await;
}

/// Scenario 5: `lookup` consults the tier. A root acknowledged in the tier
/// (the origin down) is found, and with the origin accepting and never
/// answering the lookup answers from the tier within the check timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_finds_what_the_tier_acknowledged() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    bounded(async {
        let site = Site::new();
        let id = identity("trust-lookup");
        let tokens = deltapack_format::synth::tokens(413, 4096);
        let hasher = ContextHasher::new(id.namespace(), id.chunk_tokens).expect("hasher");
        let candidates = hasher.boundaries(&tokens);
        let (_, c) = *candidates
            .iter()
            .find(|(b, _)| *b == 2048)
            .expect("a 2,048-token boundary");
        let s = turn(413, 2048);
        let hole = deltapack_testkit::FaultProxy::black_hole().expect("black hole");
        let mut tc = tier_config(&site.tier_dir, Duration::ZERO).with_ack(TierAck::Tier);
        tc.check_timeout = Duration::from_secs(2);
        let node = open_tiered(&black_holed(&site.origin, &endpoint, &hole), tc);
        node.publish(flat(&id, c, &s, RootFormat::V2))
            .await
            .expect("acknowledged in the tier");
        let start = Instant::now();
        let found = node
            .lookup_detailed(&id, &candidates)
            .await
            .expect("lookup");
        let took = start.elapsed();
        assert_eq!(found.found, Some((2048, c)), "{found:?}");
        assert_eq!(found.source, LookupSource::Tier);
        assert!(took < Duration::from_secs(20), "the lookup took {took:?}");
    })
    .await;
}

/// The child of [`a_behind_root_is_journaled_from_its_creation`].
const CHILD: &str = "DELTAPACK_TEST_TRUST_CHILD";

/// Scenario 6: a behind root is journaled from its creation. A process
/// killed right after the tier made the root durable (failpoint
/// `tier.behind.created`) leaves it journaled and pinned: an eviction of
/// the whole tier keeps it, and the next handle uploads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_behind_root_is_journaled_from_its_creation() {
    let id = identity("trust-hold-first");
    let (c, s) = (ctx(&id, 415, 2048), turn(415, 2048));
    if let Ok(spec) = std::env::var(CHILD) {
        let (origin, tier_dir) = spec.split_once('\n').expect("spec");
        let node = open_tiered(origin, behind_config(Path::new(tier_dir)));
        let _ = node.publish(flat(&id, c, &s, RootFormat::V2)).await;
        panic!("the failpoint did not abort the process");
    }
    bounded(async {
        let dir = tempfile::tempdir().expect("tmp");
        let origin = format!("file://{}", dir.path().join("origin").display());
        let tier_dir = dir.path().join("tier");
        let out = std::process::Command::new(std::env::current_exe().expect("exe"))
            .args([
                "tier_trust::a_behind_root_is_journaled_from_its_creation",
                "--exact",
                "--nocapture",
            ])
            .env(CHILD, format!("{origin}\n{}", tier_dir.display()))
            .env("DELTAPACK_FAILPOINT", "tier.behind.created")
            .output()
            .expect("run the child");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("failpoint tier.behind.created: reached"),
            "{stderr}"
        );
        // Nothing of it in the origin yet; in the tier it is journaled.
        let plain = Store::open(&origin, config()).expect("origin");
        assert!(matches!(peek(&plain, &id, &c).await, RootStatus::Absent));
        let tier = Store::open(&format!("file://{}", tier_dir.display()), config()).expect("tier");
        let marker = tier_dir
            .join("holds")
            .join(UPLOAD_HOLD)
            .join(id.namespace().hex())
            .join(c.hex());
        assert!(marker.is_file(), "no journal entry at {}", marker.display());
        let plan = tier.evict_plan(0).await.expect("evict plan");
        tier.execute(plan).await.expect("evict");
        assert!(held(peek(&tier, &id, &c).await), "evicted a journaled root");
        drop(tier);
        let node = behind(&origin, &tier_dir);
        upload_all(&node).await;
        assert_eq!(restore_bytes(&plain, &id, c).await, s.encoded());
    })
    .await;
}

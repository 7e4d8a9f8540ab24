//! A history-checked fleet campaign (the kind of test Jepsen runs against
//! databases): three nodes, each with its own tier — one writing through,
//! one acknowledging in its tier and uploading behind, and a third behind
//! one in a process of its own (`fleet_node_process.rs`) — and an
//! operator's handle, in front of one origin (the S3 test server) and one
//! fleet ledger (PostgreSQL), run random publications (flat roots and turns
//! on them, with two competing snapshots per context), restores under a
//! deadline, lookups, invalidations, evictions of a tier and upload rounds,
//! while a nemesis black-holes or stops the origin, black-holes or cuts the
//! ledger, or crashes its server and starts it again, and another kills the
//! process node with SIGKILL and starts it again. Every call, its result
//! and its time go to a history; after the faults heal and the uploads
//! finish, a checker proves:
//!
//! - **(a)** every restore hit returned the bytes of a snapshot published
//!   at that context, and never one invalidated before the restore started
//!   unless the origin could not be asked (a fault window, plus the
//!   breaker's probe interval) or it was published again since;
//! - **(b)** every context with an acknowledged publication after its last
//!   invalidation restores bit-exactly from the origin to one of those
//!   snapshots (two nodes may race on one context: one of them wins);
//! - **(c)** no restore outlived its deadline by more than one check timeout
//!   (plus scheduling slack);
//! - **(d)** the origin's final sweep finds nothing corrupt or missing.
//!
//! Scale: `DELTAPACK_CAMPAIGN_SECONDS` (30 s by default, the smoke run in
//! CI); the seed is printed and `DELTAPACK_CAMPAIGN_SEED` replays the same
//! choices of operations and faults (the interleaving of the concurrent
//! workers is the machine's). `scripts`-free: a longer run is this test
//! with a larger `DELTAPACK_CAMPAIGN_SECONDS`, run by hand; its figures go
//! to `docs/reliability.md`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deltapack_format::{CacheIdentity, ContextDigest, Snapshot};
use deltapack_store::{
    PublishOutcome, PublishRequest, RestoreOptions, RestoreOutcome, RootFormat, Store,
    SweepOptions, TierAck, TierConfig,
};
use deltapack_testkit::{Fault, FaultProxy};

use crate::common::*;
use crate::fleet_node_process::{behind_tier, NodeProcess, NodeSpec, PROCESS_NODE};

/// A restore's deadline.
const DEADLINE: Duration = Duration::from_secs(2);
/// The tiers' check timeout.
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(1);
/// The tiers' breaker probe interval.
pub(crate) const PROBE: Duration = Duration::from_secs(2);
/// Scheduling slack on a loaded 2-core machine for bound (c).
const SLACK: Duration = Duration::from_millis(1500);
/// Contexts: `K` flat roots, each with one turn on it.
pub(crate) const K: usize = 3;

/// The snapshots the campaign publishes: for each of `K` conversations a
/// flat context (1,024 tokens) and a turn context on it (2,048 tokens),
/// each with two competing snapshots.
pub(crate) struct World {
    pub(crate) id: CacheIdentity,
    /// `(context, [variant 0, variant 1])` for flat roots.
    flats: Vec<(ContextDigest, [Arc<Snapshot>; 2])>,
    /// The same for turns (the turn on flat `i` is `turns[i]`).
    turns: Vec<(ContextDigest, [Arc<Snapshot>; 2])>,
}

impl World {
    pub(crate) fn new() -> World {
        let id = identity("fleet-campaign");
        let flats = (0..K as u64)
            .map(|i| {
                (
                    ctx(&id, 900 + i, 1024),
                    [turn(900 + i, 1024), turn(950 + i, 1024)],
                )
            })
            .collect();
        let turns = (0..K as u64)
            .map(|i| {
                (
                    ctx(&id, 900 + i, 2048),
                    [turn(900 + i, 2048), turn(950 + i, 2048)],
                )
            })
            .collect();
        World { id, flats, turns }
    }

    /// Context `c` of the campaign: `0..K` flat, `K..2K` turns.
    pub(crate) fn context(&self, c: usize) -> (ContextDigest, &[Arc<Snapshot>; 2]) {
        let (ctx, v) = if c < K {
            &self.flats[c]
        } else {
            &self.turns[c - K]
        };
        (*ctx, v)
    }

    /// The publication of variant `v` at context `c` (a turn on variant
    /// `base_v` of its flat root).
    pub(crate) fn request(&self, c: usize, v: usize, base_v: usize) -> PublishRequest {
        let (context, snaps) = self.context(c);
        if c < K {
            return flat(&self.id, context, &snaps[v], RootFormat::V2);
        }
        let (bc, bsnaps) = self.context(c - K);
        delta(
            &self.id,
            context,
            &snaps[v],
            bc,
            &bsnaps[base_v],
            RootFormat::V2,
        )
    }

    /// Which variant of context `c` `bytes` are, if any.
    fn variant(&self, c: usize, bytes: &[u8]) -> Option<usize> {
        let (_, v) = self.context(c);
        (0..2).find(|&i| v[i].encoded() == bytes)
    }
}

/// One call of the history.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) node: usize,
    pub(crate) op: Op,
    pub(crate) start: Duration,
    pub(crate) end: Duration,
    pub(crate) result: Result_,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Publish { c: usize, v: usize, base_v: usize },
    Restore { c: usize },
    Lookup { i: usize },
    Invalidate { c: usize },
    EvictTier,
    Upload,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Result_ {
    Acked,
    Refused,
    Hit(Option<usize>),
    Miss,
    Done,
    Failed(String),
}

/// A fault window of the nemesis.
#[derive(Debug, Clone)]
struct FaultWindow {
    what: &'static str,
    start: Duration,
    end: Duration,
}

struct Campaign {
    world: World,
    nodes: Vec<Store>,
    epoch: Instant,
    history: Arc<Mutex<Vec<Event>>>,
}

/// Whether `node` acknowledges publications in its tier (uploaded
/// behind): node B and the process node. An invalidation of the origin
/// does not reach their upload journals (design.md §6.7).
fn behind(node: usize) -> bool {
    node == 1 || node == PROCESS_NODE
}

impl Campaign {
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn record(&self, node: usize, op: Op, start: Duration, result: Result_) {
        let end = self.now();
        self.history.lock().expect("history").push(Event {
            node,
            op,
            start,
            end,
            result,
        });
    }

    /// One random operation on `node`.
    async fn step(&self, rng: &mut Rng, node: usize) {
        let w = &self.world;
        let store = &self.nodes[node];
        let start = self.now();
        let roll = rng.below(100);
        if roll < 35 && node < 2 {
            let c = rng.below(2 * K as u64) as usize;
            let (v, base_v) = (rng.below(2) as usize, rng.below(2) as usize);
            let result = match store.publish(w.request(c, v, base_v)).await {
                Ok(r) if r.outcome == PublishOutcome::Conflict => Result_::Refused,
                Ok(_) => Result_::Acked,
                Err(e) => Result_::Failed(e.to_string()),
            };
            self.record(node, Op::Publish { c, v, base_v }, start, result);
        } else if roll < 70 && node < 2 {
            let c = rng.below(2 * K as u64) as usize;
            let (context, _) = w.context(c);
            let opts = RestoreOptions::default()
                .with_deadline(Some(tokio::time::Instant::now() + DEADLINE));
            let result = match store.restore((&w.id, context), opts).await {
                Ok(RestoreOutcome::Hit(h)) => {
                    Result_::Hit(w.variant(c, h.snapshot.encoded().as_ref()))
                }
                Ok(RestoreOutcome::Miss(_)) => Result_::Miss,
                Err(e) => Result_::Failed(e.to_string()),
            };
            self.record(node, Op::Restore { c }, start, result);
        } else if roll < 78 && node < 2 {
            let i = rng.below(K as u64) as usize;
            let cands = [(1024, w.flats[i].0), (2048, w.turns[i].0)];
            let result = match store.lookup(&w.id, &cands).await {
                Ok(_) => Result_::Done,
                Err(e) => Result_::Failed(e.to_string()),
            };
            self.record(node, Op::Lookup { i }, start, result);
        } else if node == 2 {
            tokio::time::sleep(Duration::from_millis(100 + rng.below(400))).await;
            let start = self.now();
            let c = rng.below(2 * K as u64) as usize;
            let (context, _) = w.context(c);
            let out = async {
                let plan = store
                    .invalidate_plan(w.id.namespace(), Some(context))
                    .await?;
                store.execute(plan).await
            }
            .await;
            let result = match out {
                Ok(_) => Result_::Done,
                Err(e) => Result_::Failed(e.to_string()),
            };
            self.record(node, Op::Invalidate { c }, start, result);
        } else if roll < 93 && node < 2 {
            let tier = store.tier_store().expect("tier");
            let out = async {
                let plan = tier.evict_plan(0).await?;
                tier.execute(plan).await
            }
            .await;
            let result = match out {
                Ok(_) => Result_::Done,
                Err(e) => Result_::Failed(e.to_string()),
            };
            self.record(node, Op::EvictTier, start, result);
        } else if node == 1 {
            let result = match store.tier_upload().await {
                Ok(_) => Result_::Done,
                Err(e) => Result_::Failed(e.to_string()),
            };
            self.record(node, Op::Upload, start, result);
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A TCP proxy in front of the `host:port` in `url` after `marker`, and
/// `url` pointing at it.
fn proxied(url: &str, upstream: &str) -> (FaultProxy, String) {
    let addr: std::net::SocketAddr = upstream.parse().expect("an IP:port test address");
    let proxy = FaultProxy::start(addr).expect("proxy");
    let url = url.replacen(upstream, &format!("127.0.0.1:{}", proxy.port()), 1);
    (proxy, url)
}

/// The checker: the violations of (a)–(c) in `history`.
fn check(history: &[Event], faults: &[FaultWindow]) -> Vec<String> {
    let mut out = Vec::new();
    let origin_faulty = |start: Duration, end: Duration| {
        faults
            .iter()
            .filter(|f| f.what.starts_with("origin"))
            .any(|f| f.start <= end && start <= f.end + PROBE + CHECK_TIMEOUT)
    };
    for e in history {
        if let Op::Restore { .. } = e.op {
            let took = e.end - e.start;
            if took > DEADLINE + CHECK_TIMEOUT + SLACK {
                out.push(format!("(c) {e:?}: took {took:?}"));
            }
        }
        if let (Op::Restore { c }, Result_::Hit(v)) = (&e.op, &e.result) {
            let Some(v) = *v else {
                out.push(format!(
                    "(a) {e:?}: bytes of no snapshot published at this context"
                ));
                continue;
            };
            let published = history.iter().any(|p| {
                matches!(p.op, Op::Publish { c: pc, v: pv, .. } if pc == *c && pv == v)
                    && p.result != Result_::Refused
                    && p.start <= e.end
            });
            if !published {
                out.push(format!("(a) {e:?}: a snapshot never published"));
                continue;
            }
            // Invalidated before the restore started (this context, or
            // the flat root a turn is built on) …
            let invalidated = history.iter().filter(|i| {
                matches!(i.op, Op::Invalidate { c: ic } if ic == *c || (*c >= K && ic == *c - K))
                    && i.result == Result_::Done
                    && i.end < e.start
            });
            for inv in invalidated {
                // … and not published again since it began — nor
                // acknowledged in the behind node's tier before it: an
                // invalidation of the origin does not reach a node's
                // upload journal, whose upload may bring the snapshot
                // back (design.md §6.7, "Invalidation and the journal").
                let again = history.iter().any(|p| {
                    matches!(p.op, Op::Publish { c: pc, v: pv, .. } if pc == *c && pv == v)
                        && p.result != Result_::Refused
                        && (p.end >= inv.start || behind(p.node))
                });
                if !again && !origin_faulty(inv.start, e.end) {
                    out.push(format!(
                        "(a) {e:?}: served a root invalidated at {:?}..{:?}",
                        inv.start, inv.end
                    ));
                }
            }
        }
    }
    out
}

/// Whether `e` publishes or invalidates context `c` (or the flat root a
/// turn context is built on).
fn touches(e: &Event, c: usize) -> bool {
    match e.op {
        Op::Publish { c: pc, .. } => pc == c || (pc < K && c == pc + K),
        Op::Invalidate { c: ic } => ic == c || (c >= K && ic == c - K),
        _ => false,
    }
}

/// (b): what each context may hold once everything healed, if it must
/// hold anything: a publication was acknowledged after its last
/// invalidation began (`None`: nothing is required there).
fn expected(history: &[Event], c: usize) -> Option<Vec<usize>> {
    let last_inv = history
        .iter()
        .filter(|i| {
            matches!(i.op, Op::Invalidate { c: ic } if ic == c || (c >= K && ic == c - K))
                && i.result != Result_::Refused
        })
        .map(|i| i.start)
        .max();
    // An invalidation still running when a publication ended may have
    // removed it: such a context requires nothing.
    let acked: Vec<&Event> = history
        .iter()
        .filter(|p| {
            matches!(p.op, Op::Publish { c: pc, .. } if pc == c)
                && p.result == Result_::Acked
                && last_inv.is_none_or(|t| p.start > t)
        })
        .collect();
    let racing = history.iter().any(|i| {
        matches!(i.op, Op::Invalidate { c: ic } if ic == c || (c >= K && ic == c - K))
            && acked.iter().any(|p| i.end >= p.start)
    });
    if acked.is_empty() || racing {
        return None;
    }
    // What may be there: the acknowledged snapshots, and those of
    // publications that failed after the same point — a failed call's
    // outcome is unknown (it may have made its root durable before a later
    // step failed), as a Jepsen history calls it indeterminate.
    let mut vs: Vec<usize> = history
        .iter()
        .filter(|p| {
            matches!(p.op, Op::Publish { c: pc, .. } if pc == c)
                && matches!(p.result, Result_::Acked | Result_::Failed(_))
                && (last_inv.is_none_or(|t| p.start > t) || behind(p.node))
        })
        .map(|p| match p.op {
            Op::Publish { v, .. } => v,
            _ => unreachable!("a publication"),
        })
        .collect();
    vs.sort_unstable();
    vs.dedup();
    Some(vs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_under_faults_keeps_both_promises() {
    let (Some(origin), Some(endpoint), Some(ledger)) =
        (s3_url(), s3_endpoint(), postgres_ledger_url())
    else {
        return;
    };
    // The fleet ledger: a cluster of the campaign's own when CI started
    // one (the nemesis crashes and restarts it), else the shared one.
    let restartable = campaign_cluster();
    let ledger = match &restartable {
        Some((base, _)) => {
            crate::common::pg::fresh_schema_on(base, &format!("c_{}", unique().replace('-', "_")))
        }
        None => ledger,
    };
    let seed = std::env::var("DELTAPACK_CAMPAIGN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let seconds: u64 = std::env::var("DELTAPACK_CAMPAIGN_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    // `DELTAPACK_CAMPAIGN_LOG=1`: the store's warnings, to see why calls
    // failed (hundreds of MB over a long run).
    if std::env::var_os("DELTAPACK_CAMPAIGN_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_max_level(tracing::Level::WARN)
            .try_init();
    }
    println!(
        "fleet campaign: seed {seed} ({seconds} s; replay with DELTAPACK_CAMPAIGN_SEED={seed})"
    );

    // The origin and the ledger behind proxies the nemesis controls; every
    // client bound so that a black hole costs seconds, not minutes.
    let upstream = endpoint.trim_start_matches("http://").to_string();
    let (s3_proxy, origin) = proxied(&origin, &upstream);
    let origin = origin.replace(
        "?endpoint",
        "?max_retries=0&retry_timeout=2s&timeout=2s&connect_timeout=1s&endpoint",
    );
    let pg_at = ledger
        .split('@')
        .nth(1)
        .and_then(|s| s.split('/').next())
        .expect("host:port in the test ledger URL")
        .to_string();
    let (pg_proxy, ledger) = proxied(&ledger, &pg_at);
    let ledger = format!("{ledger}%20-c%20statement_timeout%3D2000&connect_timeout=2");

    let dir = tempfile::tempdir().expect("tmp");
    let cfg = || config().with_ledger(Some(ledger.clone()));
    let tier = |name: &str, ack: TierAck| {
        let mut t = TierConfig::new(format!("file://{}", dir.path().join(name).display()))
            .with_check_interval(Duration::ZERO)
            .with_ack(ack);
        t.check_timeout = CHECK_TIMEOUT;
        t.probe_interval = PROBE;
        t
    };
    let nodes = vec![
        Store::open(
            &origin,
            cfg().with_tier(Some(tier("tier-a", TierAck::Origin))),
        )
        .expect("node A"),
        Store::open(
            &origin,
            cfg().with_tier(Some(tier("tier-b", TierAck::Tier))),
        )
        .expect("node B"),
        Store::open(&origin, cfg()).expect("operator"),
    ];
    let epoch_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let campaign = Arc::new(Campaign {
        world: World::new(),
        nodes,
        epoch: Instant::now(),
        history: Arc::new(Mutex::new(Vec::new())),
    });
    let until = Duration::from_secs(seconds);

    // The process node, killed with SIGKILL and started again on the same
    // tier directory, over and over.
    let spec = NodeSpec {
        origin: origin.clone(),
        ledger: ledger.clone(),
        tier_dir: dir.path().join("tier-c"),
        seed,
        epoch_ms,
        lifetime: until + Duration::from_secs(120),
    };
    let kills = Arc::new(Mutex::new(Vec::<FaultWindow>::new()));
    let killer = {
        let (c, spec, kills) = (campaign.clone(), spec.clone(), kills.clone());
        let mut rng = Rng(seed ^ 0x0000_6b69_6c6c_6572);
        std::thread::spawn(move || {
            while c.now() < until {
                let node = NodeProcess::start(&spec, c.history.clone(), c.epoch);
                std::thread::sleep(Duration::from_millis(1500 + rng.below(4000)));
                let start = c.now();
                node.kill();
                std::thread::sleep(Duration::from_millis(200 + rng.below(1500)));
                kills.lock().expect("kills").push(FaultWindow {
                    what: "node",
                    start,
                    end: c.now(),
                });
            }
        })
    };

    // The nemesis.
    let s3_proxy = Arc::new(s3_proxy);
    let pg_proxy = Arc::new(pg_proxy);
    let faults = Arc::new(Mutex::new(Vec::<FaultWindow>::new()));
    let nemesis = {
        let (c, s3, pg, faults) = (
            campaign.clone(),
            s3_proxy.clone(),
            pg_proxy.clone(),
            faults.clone(),
        );
        let mut rng = Rng(seed ^ 0x006e_656d_6573_6973);
        let restart_data = restartable.as_ref().map(|(_, d)| d.clone());
        tokio::spawn(async move {
            while c.now() < until {
                tokio::time::sleep(Duration::from_millis(1000 + rng.below(2000))).await;
                let kinds = if restart_data.is_some() { 5 } else { 4 };
                let (what, proxy, fault) = match rng.below(kinds) {
                    0 => ("origin", &s3, Fault::BlackHole),
                    // The origin stopped: every connection closed, new
                    // ones refused, until it is back.
                    1 => ("origin-stop", &s3, Fault::Cut),
                    2 => ("ledger", &pg, Fault::BlackHole),
                    3 => ("ledger-cut", &pg, Fault::Cut),
                    // The ledger's server crashes (`pg_ctl stop -m
                    // immediate`) and is started again.
                    _ => ("ledger-restart", &pg, Fault::None),
                };
                let start = c.now();
                let hold = Duration::from_millis(500 + rng.below(2500));
                match (what, &restart_data) {
                    ("ledger-restart", Some(data)) => {
                        let data = data.clone();
                        tokio::task::spawn_blocking(move || {
                            pg_ctl(&data, "stop");
                            std::thread::sleep(hold);
                            pg_ctl(&data, "start");
                        })
                        .await
                        .expect("pg_ctl");
                    }
                    _ => {
                        proxy.set(fault);
                        tokio::time::sleep(hold).await;
                        proxy.set(Fault::None);
                    }
                }
                faults.lock().expect("faults").push(FaultWindow {
                    what,
                    start,
                    end: c.now(),
                });
            }
        })
    };
    // The workers: two per node, one for the operator.
    let workers: Vec<_> = [0usize, 0, 1, 1, 2]
        .into_iter()
        .enumerate()
        .map(|(k, node)| {
            let c = campaign.clone();
            let mut rng = Rng(seed.wrapping_add(k as u64 * 0x9e37));
            tokio::spawn(async move {
                while c.now() < until {
                    let step = c.step(&mut rng, node);
                    if tokio::time::timeout(Duration::from_secs(60), step)
                        .await
                        .is_err()
                    {
                        panic!("an operation on node {node} hung for 60 s (seed {seed})");
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("worker");
    }
    nemesis.await.expect("nemesis");
    tokio::task::spawn_blocking(move || killer.join())
        .await
        .expect("killer")
        .expect("killer thread");
    s3_proxy.set(Fault::None);
    pg_proxy.set(Fault::None);

    // Heal: the behind node's journal drains.
    let node_b = &campaign.nodes[1];
    let mut drained = false;
    let mut last = None;
    for _ in 0..30 {
        match node_b.tier_upload().await {
            Ok(r) if r.remaining == 0 => {
                drained = true;
                break;
            }
            other => {
                last = Some(format!("{other:?}"));
                tokio::time::sleep(Duration::from_millis(500)).await
            }
        }
    }
    // The process node's tier, drained by the next process on it (here:
    // a handle of this one). A journal entry whose process was killed
    // before its root was durable stays pending for ten minutes (it was
    // never acknowledged); every root the tier holds must go up.
    let rebooted = Store::open(&origin, cfg().with_tier(Some(behind_tier(&spec.tier_dir))))
        .expect("the process node, rebooted");
    let mut drained_c = false;
    for _ in 0..30 {
        let _ = rebooted.tier_upload().await;
        match rebooted.inspect(Some(&campaign.world.id.namespace())).await {
            Ok(roots)
                if !roots
                    .iter()
                    .any(|r| r.location.as_deref() == Some("tier (upload pending)")) =>
            {
                drained_c = true;
                break;
            }
            other => {
                last = Some(format!("{other:?}"));
                tokio::time::sleep(Duration::from_millis(500)).await
            }
        }
    }
    let history = campaign.history.lock().expect("history").clone();
    let mut faults = faults.lock().expect("faults").clone();
    faults.extend(kills.lock().expect("kills").iter().cloned());
    let mut violations = check(&history, &faults);
    if !drained {
        violations.push(format!(
            "(b) the behind node's upload journal did not drain: {last:?}"
        ));
    }
    if !drained_c {
        violations.push(format!(
            "(b) the process node's upload journal did not drain: {last:?}"
        ));
    }
    // (b) every acknowledged publication not deliberately removed is in
    // the origin, bit-exactly.
    let plain = Store::open(&origin, cfg()).expect("check handle");
    for c in 0..2 * K {
        let Some(want) = expected(&history, c) else {
            continue;
        };
        let (context, _) = campaign.world.context(c);
        match plain
            .restore((&campaign.world.id, context), Default::default())
            .await
        {
            Ok(RestoreOutcome::Hit(h)) => {
                match campaign.world.variant(c, h.snapshot.encoded().as_ref()) {
                    Some(v) if want.contains(&v) => {}
                    got => {
                        violations.push(format!(
                            "(b) context {c}: the origin restores variant {got:?}, acknowledged {want:?}"
                        ));
                        for e in history.iter().filter(|e| touches(e, c)) {
                            println!("  context {c}: {e:?}");
                        }
                    }
                }
            }
            other => violations.push(format!(
                "(b) context {c}: acknowledged {want:?}, the origin answers {other:?}"
            )),
        }
    }
    // (d) the final sweep is clean.
    match plain.sweep(&SweepOptions::default()).await {
        Ok(s) if s.corrupt.is_empty() && s.missing.is_empty() => {}
        other => violations.push(format!("(d) the final sweep: {other:?}")),
    }

    let count = |f: &dyn Fn(&Event) -> bool| history.iter().filter(|e| f(e)).count();
    let kind = |k: &str| faults.iter().filter(|f| f.what == k).count();
    for f in &faults {
        println!("  fault: {f:?}");
    }
    let mut why: Vec<String> = history
        .iter()
        .filter_map(|e| match &e.result {
            Result_::Failed(m) => Some(format!(
                "{:?}: {}",
                e.op,
                m.chars().take(160).collect::<String>()
            )),
            _ => None,
        })
        .collect();
    why.sort();
    why.dedup_by(|a, b| a.get(..40) == b.get(..40));
    for w in why.iter().take(12) {
        println!("  failed: {w}");
    }
    println!(
        "fleet campaign: seed {seed}: {} operations ({} publications ({} by the process node), {} acknowledged, {} restores, {} hits, {} lookups, {} invalidations, {} tier evictions, {} upload rounds, {} failed calls); {} faults ({} origin black holes, {} origin stops, {} ledger black holes, {} ledger cuts, {} ledger crashes and restarts, {} node kills); {} violations",
        history.len(),
        count(&|e| matches!(e.op, Op::Publish { .. })),
        count(&|e| e.node == PROCESS_NODE),
        count(&|e| e.result == Result_::Acked),
        count(&|e| matches!(e.op, Op::Restore { .. })),
        count(&|e| matches!(e.result, Result_::Hit(_))),
        count(&|e| matches!(e.op, Op::Lookup { .. })),
        count(&|e| matches!(e.op, Op::Invalidate { .. })),
        count(&|e| matches!(e.op, Op::EvictTier)),
        count(&|e| matches!(e.op, Op::Upload)),
        count(&|e| matches!(e.result, Result_::Failed(_))),
        faults.len(),
        kind("origin"),
        kind("origin-stop"),
        kind("ledger"),
        kind("ledger-cut"),
        kind("ledger-restart"),
        kind("node"),
        violations.len(),
    );
    assert!(
        violations.is_empty(),
        "seed {seed}: {} violations:\n{}",
        violations.len(),
        violations.join("\n")
    );
}

/// The campaign's own PostgreSQL cluster, if CI started one: its URL and
/// data directory (the nemesis stops and starts it).
fn campaign_cluster() -> Option<(String, String)> {
    match (
        std::env::var("DELTAPACK_TEST_POSTGRES_CAMPAIGN"),
        std::env::var("DELTAPACK_TEST_PG_CAMPAIGN_DATA"),
    ) {
        (Ok(u), Ok(d)) if !u.is_empty() && !d.is_empty() => Some((u, d)),
        _ => {
            assert!(
                std::env::var("CI").map(|v| v != "true").unwrap_or(true),
                "CI must start the fleet campaign's PostgreSQL cluster (.ci/run)"
            );
            println!(
                "fleet campaign: no cluster of its own: the ledger is not crashed and restarted"
            );
            None
        }
    }
}

/// `pg_ctl stop -m immediate` (a crash) or `start` on the cluster in
/// `data`.
fn pg_ctl(data: &str, action: &str) {
    crate::common::pg_ctl(data, action, "immediate", "campaign-log");
}

//! The fleet campaign's third node, as a process of its own: it publishes
//! flat roots and turns acknowledged in its tier (uploaded behind) until
//! the nemesis kills it with SIGKILL, and is started again on the same
//! tier directory, as a node that crashed and rebooted. What it did goes
//! to the campaign's history through its standard output, one line per
//! call's start and end; a call that started and never ended (the process
//! was killed under it) is recorded as failed: its outcome is unknown.
//!
//! The process is this test binary, run with `--exact` on
//! [`campaign_child_node`], which does nothing unless the campaign set
//! `DELTAPACK_CAMPAIGN_CHILD`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deltapack_store::{PublishOutcome, Store, TierAck, TierConfig};

use crate::common::*;
use crate::fleet_campaign::{Event, Op, Result_, World, CHECK_TIMEOUT, K, PROBE};

/// The node index of the process node in the history.
pub(crate) const PROCESS_NODE: usize = 3;

/// Where the process node runs, handed to it in its environment.
#[derive(Clone)]
pub(crate) struct NodeSpec {
    pub(crate) origin: String,
    pub(crate) ledger: String,
    pub(crate) tier_dir: PathBuf,
    pub(crate) seed: u64,
    /// The campaign's epoch as UNIX milliseconds (the history's zero).
    pub(crate) epoch_ms: u64,
    /// The longest a process may live (it exits on its own after this,
    /// should the campaign die without killing it).
    pub(crate) lifetime: Duration,
}

/// The tier of a behind node in `dir`, as the campaign's nodes have it.
pub(crate) fn behind_tier(dir: &Path) -> TierConfig {
    let mut t = TierConfig::new(format!("file://{}", dir.display()))
        .with_check_interval(Duration::ZERO)
        .with_ack(TierAck::Tier);
    t.check_timeout = CHECK_TIMEOUT;
    t.probe_interval = PROBE;
    t
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One running process node; killed (SIGKILL) when dropped.
pub(crate) struct NodeProcess {
    child: Child,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl NodeProcess {
    /// Starts the process node; its calls go to `history` (times from
    /// `epoch`) as they end.
    pub(crate) fn start(spec: &NodeSpec, history: Arc<Mutex<Vec<Event>>>, epoch: Instant) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--exact",
                "fleet_node_process::campaign_child_node",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("DELTAPACK_CAMPAIGN_CHILD", "1")
            .env("DELTAPACK_CAMPAIGN_CHILD_ORIGIN", &spec.origin)
            .env("DELTAPACK_CAMPAIGN_CHILD_LEDGER", &spec.ledger)
            .env("DELTAPACK_CAMPAIGN_CHILD_TIER", &spec.tier_dir)
            .env("DELTAPACK_CAMPAIGN_CHILD_SEED", spec.seed.to_string())
            .env(
                "DELTAPACK_CAMPAIGN_CHILD_EPOCH_MS",
                spec.epoch_ms.to_string(),
            )
            .env(
                "DELTAPACK_CAMPAIGN_CHILD_SECONDS",
                spec.lifetime.as_secs().to_string(),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the process node");
        let stdout = child.stdout.take().expect("its stdout");
        let reader = std::thread::spawn(move || read_history(stdout, &history, epoch));
        NodeProcess {
            child,
            reader: Some(reader),
        }
    }

    /// Kills the process with SIGKILL and records its unfinished calls.
    pub(crate) fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads the process node's lines into `history` until its output ends;
/// calls begun and never ended are recorded as failed (killed).
fn read_history(out: std::process::ChildStdout, history: &Mutex<Vec<Event>>, epoch: Instant) {
    let mut begun: Vec<(Op, Duration)> = Vec::new();
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok());
        let (Some(&"CAMPAIGN"), Some(kind)) = (f.first(), f.get(1)) else {
            continue;
        };
        let (Some(c), Some(v), Some(base_v), Some(t0)) = (num(2), num(3), num(4), num(5)) else {
            continue;
        };
        let op = Op::Publish {
            c: c as usize,
            v: v as usize,
            base_v: base_v as usize,
        };
        let start = Duration::from_millis(t0);
        match *kind {
            "begin" => begun.push((op, start)),
            "end" => {
                begun.retain(|b| *b != (op, start));
                let end = num(6).map_or(start, Duration::from_millis);
                let result = match f.get(7) {
                    Some(&"acked") => Result_::Acked,
                    Some(&"refused") => Result_::Refused,
                    _ => Result_::Failed(f[7..].join(" ")),
                };
                history.lock().expect("history").push(Event {
                    node: PROCESS_NODE,
                    op,
                    start,
                    end,
                    result,
                });
            }
            _ => {}
        }
    }
    let end = epoch.elapsed();
    let mut h = history.lock().expect("history");
    for (op, start) in begun {
        h.push(Event {
            node: PROCESS_NODE,
            op,
            start,
            end,
            result: Result_::Failed("killed".into()),
        });
    }
}

/// The process node's body: nothing unless the campaign started this
/// process (`DELTAPACK_CAMPAIGN_CHILD`).
#[test]
fn campaign_child_node() {
    if std::env::var_os("DELTAPACK_CAMPAIGN_CHILD").is_none() {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k}"));
    let num = |k: &str| var(k).parse::<u64>().unwrap_or_else(|_| panic!("{k}"));
    let (origin, ledger) = (
        var("DELTAPACK_CAMPAIGN_CHILD_ORIGIN"),
        var("DELTAPACK_CAMPAIGN_CHILD_LEDGER"),
    );
    let tier_dir = PathBuf::from(var("DELTAPACK_CAMPAIGN_CHILD_TIER"));
    let (seed, epoch_ms) = (
        num("DELTAPACK_CAMPAIGN_CHILD_SEED"),
        num("DELTAPACK_CAMPAIGN_CHILD_EPOCH_MS"),
    );
    let stop = Instant::now() + Duration::from_secs(num("DELTAPACK_CAMPAIGN_CHILD_SECONDS"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let node = Store::open(
            &origin,
            config()
                .with_ledger(Some(ledger))
                .with_tier(Some(behind_tier(&tier_dir))),
        )
        .expect("the process node");
        let w = World::new();
        // Each start of the process draws other calls.
        let mut rng = Rng(seed ^ now_ms());
        let out = std::io::stdout();
        let since = || now_ms().saturating_sub(epoch_ms);
        while Instant::now() < stop {
            let c = rng.below(2 * K as u64) as usize;
            let (v, base_v) = (rng.below(2) as usize, rng.below(2) as usize);
            let req = w.request(c, v, base_v);
            let t0 = since();
            {
                let mut o = out.lock();
                let _ = writeln!(o, "CAMPAIGN begin {c} {v} {base_v} {t0}");
                let _ = o.flush();
            }
            let result = match node.publish(req).await {
                Ok(r) if r.outcome == PublishOutcome::Conflict => "refused".to_string(),
                Ok(_) => "acked".to_string(),
                Err(e) => format!("failed {}", e.to_string().replace('\n', " ")),
            };
            {
                let mut o = out.lock();
                let _ = writeln!(o, "CAMPAIGN end {c} {v} {base_v} {t0} {} {result}", since());
                let _ = o.flush();
            }
            tokio::time::sleep(Duration::from_millis(50 + rng.below(200))).await;
        }
    });
}

//! A collector killed in the middle of a claim stalls nobody for long:
//! real `deltapack` processes on one S3 bucket (the moto server) sharing
//! one PostgreSQL ledger, a collector aborted by a failpoint at each step
//! of its claim–delete–finish protocol (`DELTAPACK_FAILPOINT`, which dies
//! as `kill -9` would: no claim finished), then a publication that needs
//! exactly what the dead collector had claimed.
//!
//! Why: a claim in `deleting` used to stand for a fixed two-minute lease
//! whether its collector was alive or not, and every publication reusing
//! a claimed object sat idle for those two minutes. Claims are now renewed
//! by their live collector's heartbeat and lapse a few seconds after it
//! stops, judged on the ledger's clock.
//!
//! Checked, for every claim step of garbage collection, the sweep's orphan
//! reclaim and root removal: the failpoint was reached (the claim exists),
//! the blocked publication ends within [`STALL_LIMIT`] (the design's
//! bound is 5 s; the limit leaves room for a loaded machine and is far
//! below the old two minutes), it publishes, and its context restores
//! bit-exactly; a last collection then finishes what the dead one left.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{command, wait_or_kill, words, Ended};

/// Longest a publication may take after its collector died.
const STALL_LIMIT: Duration = Duration::from_secs(12);
/// A process still running after this is a hang.
const HANG: Duration = Duration::from_secs(180);

/// One node's view: a folder with the inputs, the store and the ledger.
struct Node<'a> {
    dir: &'a Path,
    store: &'a str,
    ledger: &'a str,
}

/// How one run ended.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Node<'_> {
    /// Runs `deltapack <line>` (`{store}` replaced by the store URL), with
    /// the failpoint `fail` armed if given.
    fn run(&self, line: &str, fail: Option<&str>) -> Run {
        let line = line.replace("{store}", self.store);
        let mut c = command();
        c.args(words(&line))
            .current_dir(self.dir)
            .env("DELTAPACK_LEDGER", self.ledger)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(f) = fail {
            c.env("DELTAPACK_FAILPOINT", f);
        }
        let start = Instant::now();
        let mut child = c.spawn().expect("spawn deltapack");
        // Drain the pipes on threads so a chatty child cannot block.
        let mut out = child.stdout.take().expect("stdout");
        let mut err = child.stderr.take().expect("stderr");
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut s);
            s
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut s);
            s
        });
        let code = match wait_or_kill(&mut child, start, None, HANG) {
            Ended::Exited(s) => s.code(),
            Ended::Killed => None,
            Ended::Hung => panic!("deltapack {line} hung for {HANG:?}"),
        };
        let took = start.elapsed();
        Run {
            code,
            stdout: out.join().expect("stdout thread"),
            stderr: err.join().expect("stderr thread"),
            took,
        }
    }

    /// Runs `line` and asserts it succeeds; returns its stdout.
    fn ok(&self, line: &str) -> String {
        let r = self.run(line, None);
        assert_eq!(
            r.code,
            Some(0),
            "deltapack {line}\nstdout:\n{}\nstderr:\n{}",
            r.stdout,
            r.stderr
        );
        r.stdout
    }

    /// Runs `line` with failpoint `fail` armed and asserts the process
    /// died there.
    fn dies_at(&self, line: &str, fail: &str) {
        let r = self.run(line, Some(fail));
        assert!(
            r.stderr.contains(&format!("failpoint {fail}: reached")) && r.code.is_none(),
            "deltapack {line} with failpoint {fail} did not die there (exit {:?})\nstdout:\n{}\nstderr:\n{}",
            r.code,
            r.stdout,
            r.stderr
        );
    }

    /// Runs the publication `line` a dead collector blocks; asserts it
    /// succeeds within [`STALL_LIMIT`]; returns how long it took.
    fn publishes_soon(&self, line: &str, step: &str) -> Duration {
        let r = self.run(line, None);
        assert_eq!(
            r.code,
            Some(0),
            "after {step}: deltapack {line}\nstdout:\n{}\nstderr:\n{}",
            r.stdout,
            r.stderr
        );
        assert!(
            r.took < STALL_LIMIT,
            "after {step}: the publication took {:?}: a dead collector's claim held it",
            r.took
        );
        r.took
    }

    /// Asserts the context of `tokens` restores to exactly `snap`.
    fn restores(&self, tokens: &str, snap: &str) {
        let out = format!("restored-{tokens}.snap");
        self.ok(&format!(
            "restore --store {{store}} --identity id.json --tokens {tokens} --out {out}"
        ));
        let got = std::fs::read(self.dir.join(&out)).expect("restored file");
        let want = std::fs::read(self.dir.join(snap)).expect("snapshot file");
        assert!(got == want, "{tokens}: the restored bytes differ");
    }
}

#[test]
fn a_collector_killed_mid_claim_stalls_a_publication_for_seconds_not_minutes() {
    let Some((base, ledger)) = crate::common::fleet("deadcoll") else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let setup = Node {
        dir,
        store: &base,
        ledger: &ledger,
    };
    std::fs::write(dir.join("id.json"), setup.ok("identity --example")).expect("id");
    // One snapshot under two contexts of equal length (its objects are
    // shared by both roots), and a longer turn to publish as a delta.
    for (name, seed, tokens) in [("a", 71, 2048), ("b", 72, 2048), ("c", 71, 3072)] {
        setup.ok(&format!(
            "synth --preset tiny --tokens {tokens} --seed {seed} --out {name}.snap --tokens-out {name}.tok"
        ));
    }
    let publish = "publish --store {store} --identity id.json --max-extent-bytes 4096 --grace 0s";
    let mut stalls = Vec::new();
    for step in [
        "gc.claimed",
        "gc.deleted",
        "sweep.claimed",
        "sweep.deleted",
        "remove.claimed",
        "remove.deleted",
    ] {
        // Each step on a store of its own, with a ledger of its own (a
        // ledger is bound to one store).
        let (store, step_ledger) =
            crate::common::fleet(&format!("deadcoll_{}", step.replace('.', "_"))).expect("fleet");
        let n = Node {
            dir,
            store: &store,
            ledger: &step_ledger,
        };
        let took = match step.split('.').next() {
            Some("gc") | Some("sweep") => {
                // Objects of a root that is gone: due for collection (gc)
                // or orphans of the bucket (sweep).
                n.ok(&format!("{publish} --tokens a.tok --snapshot a.snap"));
                n.ok("invalidate --store {store} --identity id.json --tokens a.tok");
                if step.starts_with("gc") {
                    n.dies_at("evict --store {store} --to 1TiB --grace 0s", step);
                } else {
                    n.dies_at("sweep --store {store} --grace 0s", step);
                }
                // The same bytes under another context: the very objects
                // the dead collector claimed.
                let took =
                    n.publishes_soon(&format!("{publish} --tokens b.tok --snapshot a.snap"), step);
                n.restores("b.tok", "a.snap");
                took
            }
            _ => {
                // A root being removed, and a delta published on it.
                n.ok(&format!("{publish} --tokens a.tok --snapshot a.snap"));
                n.dies_at("evict --store {store} --to 0 --grace 0s", step);
                let line = if step == "remove.claimed" {
                    format!(
                        "{publish} --tokens c.tok --snapshot c.snap --base-tokens a.tok --base-snapshot a.snap"
                    )
                } else {
                    // The root object is gone: publish the context again.
                    format!("{publish} --tokens a.tok --snapshot a.snap")
                };
                let took = n.publishes_soon(&line, step);
                if step == "remove.claimed" {
                    n.restores("c.tok", "c.snap");
                } else {
                    n.restores("a.tok", "a.snap");
                }
                took
            }
        };
        // What the dead collector left is finished by the next one, and
        // the store is whole.
        n.ok("evict --store {store} --to 1TiB --grace 0s");
        let report = n.ok("sweep --store {store} --grace 0s --json");
        let report: serde_json::Value = serde_json::from_str(&report).expect("sweep json");
        crate::common::assert_none(&report, &["corrupt", "missing"]);
        stalls.push((step, took));
    }
    for (step, took) in &stalls {
        eprintln!("dead collector at {step}: the blocked publication took {took:.2?}");
    }
}

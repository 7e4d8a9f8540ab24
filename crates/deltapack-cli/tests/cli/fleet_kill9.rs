//! Kill -9 of fleet nodes mid-publication and mid-collection: real
//! `deltapack` processes on one S3 bucket (the moto server) sharing one
//! PostgreSQL ledger (the cluster `.ci/run` starts) — publishers under a
//! byte budget (which evicts and collects), collectors (`evict --grace
//! 0s`: eviction plus garbage collection) and restorers — with random
//! publishers and collectors killed by SIGKILL at random moments.
//!
//! Why: `chaos_kill9.rs` kills processes sharing a `file://` store and its
//! SQLite ledger; on a bucket the protocol is different (no file locks,
//! claims in `deleting` before each DELETE, protections and reservations
//! that must lapse when their node dies), and a node dies in the middle of
//! a collection's claim–delete–finish or between a root's write and its
//! ledger record.
//!
//! Checked: every restore that reports a hit wrote exactly the published
//! snapshot; no process fails except a publication that does not fit its
//! budget or whose base is gone; afterwards a sweep (which reconciles the
//! ledger with the bucket) finds nothing corrupt or missing, every context
//! restores exactly or is absent (never corrupt: nothing a root references
//! was deleted), a last collection finishes what killed collectors left,
//! and the shared ledger equals a rebuild from the bucket.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{assert_none, command, mix, wait_or_kill, words, Ended};

const CONTEXTS: u64 = 6;
const ROUNDS: u64 = 8;
const HANG: Duration = Duration::from_secs(180);

/// Runs `deltapack args`; with `kill_after`, kills it with SIGKILL then if
/// it is still running. Returns the exit code (`None` when killed) and
/// stdout.
fn run(
    dir: &Path,
    args: &[String],
    ledger: &str,
    kill_after: Option<Duration>,
) -> (Option<i32>, String) {
    let tag = mix(Instant::now().elapsed().as_nanos() as u64
        ^ args.len() as u64
        ^ std::process::id() as u64);
    let out_path = dir.join(format!("out-{tag:x}-{}.txt", args.join("_").len()));
    let err_path = out_path.with_extension("err");
    let mut child = command()
        .args(args)
        .current_dir(dir)
        .env("DELTAPACK_LEDGER", ledger)
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn deltapack");
    let start = Instant::now();
    let status = match wait_or_kill(&mut child, start, kill_after.map(|k| start + k), HANG) {
        Ended::Exited(s) => Some(s),
        Ended::Killed => None,
        Ended::Hung => panic!("deltapack {args:?} hung for {HANG:?}"),
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    match status {
        None => (None, stdout),
        Some(s) => {
            let code = s.code();
            if code == Some(1) || code.is_none() {
                eprintln!("deltapack {args:?} exited {code:?}: {stderr}");
            }
            (code, stdout)
        }
    }
}

fn strs(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn fleet_nodes_killed_mid_publication_and_mid_gc_lose_nothing() {
    let Some((store, ledger)) = crate::common::fleet("kill9") else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let (code, id) = run(dir, &strs(&["identity", "--example"]), &ledger, None);
    assert_eq!(code, Some(0));
    std::fs::write(dir.join("id.json"), id).expect("id");
    // Contexts 0..CONTEXTS: flat roots of 2,048 tokens; context k+1 of an
    // even k is also published as a delta on k (a base that eviction may
    // take away under its delta).
    let mut snaps = Vec::new();
    for k in 0..CONTEXTS {
        let seed = (60 + k / 2).to_string();
        let tokens = (2048 + 1024 * (k % 2)).to_string();
        let (code, _) = run(
            dir,
            &strs(&words(&format!("synth --preset tiny --tokens {tokens} --seed {seed} --out c{k}.snap --tokens-out c{k}.tok"))),
            &ledger,
            None,
        );
        assert_eq!(code, Some(0));
        snaps.push(std::fs::read(dir.join(format!("c{k}.snap"))).expect("snap"));
    }
    let publish = |k: u64| {
        let mut a = strs(&words(&format!("publish --store {store} --identity id.json --tokens c{k}.tok --snapshot c{k}.snap --budget 90000 --grace 0s --max-extent-bytes 4096")));
        if k % 2 == 1 {
            a.extend(strs(&[
                "--base-snapshot",
                &format!("c{}.snap", k - 1),
                "--base-tokens",
                &format!("c{}.tok", k - 1),
            ]));
        }
        a
    };
    let restore = |k: u64, out: &str| {
        strs(&words(&format!(
            "restore --store {store} --identity id.json --tokens c{k}.tok --out {out} --json"
        )))
    };
    let check_restore = |k: u64, code: Option<i32>, out: &str, stdout: &str, during: bool| {
        match code {
            Some(0) => assert!(
                std::fs::read(dir.join(out)).expect("restored") == snaps[k as usize],
                "context {k}: WRONG BYTES"
            ),
            Some(3) => {
                let miss: serde_json::Value = serde_json::from_str(stdout).expect("miss json");
                let reason = miss["reason"].as_str().unwrap_or("");
                // During the campaign a restore may race an eviction on
                // another node (its objects go while it reads); afterwards
                // a context is whole or absent.
                let ok =
                    matches!(reason, "absent" | "base-missing") || (during && reason == "corrupt");
                assert!(ok, "context {k}: miss {miss}");
            }
            other => panic!("context {k}: restore exited {other:?}"),
        }
    };

    let mut killed = 0;
    for round in 0..ROUNDS {
        let r = mix(round ^ 0x6b11);
        std::thread::scope(|s| {
            let publisher = s.spawn(|| {
                let mut killed = 0;
                for i in 0..2 {
                    let k = mix(r ^ i) % CONTEXTS;
                    let kill = (mix(r ^ i ^ 0x50) % 10 < 4)
                        .then(|| Duration::from_millis(20 + mix(r ^ i ^ 0x51) % 400));
                    let (code, _) = run(dir, &publish(k), &ledger, kill);
                    match code {
                        None => killed += 1,
                        Some(0) | Some(1) => {}
                        other => panic!("publish exited {other:?}"),
                    }
                }
                killed
            });
            let collector = s.spawn(|| {
                let to = (20_000 + mix(r ^ 0xc0) % 40_000).to_string();
                let kill = (mix(r ^ 0xc1) % 10 < 5)
                    .then(|| Duration::from_millis(10 + mix(r ^ 0xc2) % 300));
                let a = strs(&["evict", "--store", &store, "--to", &to, "--grace", "0s"]);
                let (code, _) = run(dir, &a, &ledger, kill);
                match code {
                    None => 1,
                    Some(0) => 0,
                    other => panic!("evict exited {other:?}"),
                }
            });
            let restorer = s.spawn(|| {
                for i in 0..2 {
                    let k = mix(r ^ 0xa0 ^ i) % CONTEXTS;
                    let out = format!("during-{round}-{i}.snap");
                    let (code, stdout) = run(dir, &restore(k, &out), &ledger, None);
                    check_restore(k, code, &out, &stdout, true);
                }
            });
            killed += publisher.join().expect("publisher");
            killed += collector.join().expect("collector");
            restorer.join().expect("restorer");
        });
    }
    eprintln!("fleet_kill9: {ROUNDS} rounds, {killed} processes killed");
    assert!(killed > 0, "the campaign killed nobody");

    // The sweep reconciles the ledger with the bucket (a root written by a
    // publisher killed before it recorded it) and finds no damage.
    // One command to completion, which must succeed; its stdout.
    let ok = |line: String| {
        let (code, out) = run(dir, &strs(&words(&line)), &ledger, None);
        assert_eq!(code, Some(0), "{line}: {out}");
        out
    };
    let report = ok(format!("sweep --store {store} --grace 0s --json"));
    let report: serde_json::Value = serde_json::from_str(&report).expect("sweep json");
    assert_none(&report, &["corrupt", "missing"]);
    // A last collection finishes whatever killed collectors left.
    ok(format!("evict --store {store} --to 1000000 --grace 0s"));
    for k in 0..CONTEXTS {
        let out = format!("final-{k}.snap");
        let (code, stdout) = run(dir, &restore(k, &out), &ledger, None);
        check_restore(k, code, &out, &stdout, false);
    }
    let shown = ok(format!("ledger show --store {store} --json"));
    let rebuilt = ok(format!("ledger rebuild --store {store} --json --grace 0s"));
    let shown: serde_json::Value = serde_json::from_str(&shown).expect("json");
    let rebuilt: serde_json::Value = serde_json::from_str(&rebuilt).expect("json");
    assert_eq!(shown["engine"], "postgres");
    for field in ["roots", "objects", "object_bytes", "root_bytes"] {
        assert_eq!(
            shown[field], rebuilt[field],
            "{field}: shared ledger vs rebuilt\n{shown}\n{rebuilt}"
        );
    }
}

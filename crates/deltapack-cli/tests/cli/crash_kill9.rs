//! Kill -9 campaign: a real `deltapack publish` process killed with SIGKILL
//! at random moments (while starting, hashing, writing and fsyncing extents,
//! or creating the root) never leaves a torn publication. Afterwards `sweep`
//! finds nothing corrupt or missing and reclaims the orphans (including
//! staging files), every publication that reported success restores
//! bit-exactly, and every other context is either exact or absent.
//!
//! `DELTAPACK_KILL9_ITERS` sets the number of kills (default 12 for CI; the
//! full campaign in docs/reliability.md ran ≥ 100).

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{assert_none, command, deltapack, mix, ok, scratch, words};

#[test]
fn publish_killed_at_random_moments_never_tears() {
    let iters: u64 = std::env::var("DELTAPACK_KILL9_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let (tmp, store) = scratch();
    let dir = tmp.path();
    std::fs::write(dir.join("id.json"), ok(dir, &["identity", "--example"])).expect("id");
    // Base and eight candidate results of one conversation (tiny preset, many
    // 4 KiB extents so a publication takes many fsync'd writes).
    ok(
        dir,
        &words("synth --preset tiny --tokens 2048 --seed 9 --out base.snap --tokens-out base.tok"),
    );
    ok(
        dir,
        &words(&format!(
            "publish --store {store} --identity id.json --tokens base.tok --snapshot base.snap"
        )),
    );
    let variants = 8u64;
    for v in 0..variants {
        let n = (16384 + 2048 * v).to_string();
        ok(
            dir,
            &words(&format!(
                "synth --preset tiny --tokens {n} --seed 9 --out r{v}.snap --tokens-out r{v}.tok"
            )),
        );
    }
    let publish_args = |v: u64| -> Vec<String> {
        let format = if v % 2 == 0 { "v2" } else { "v1" };
        let line = format!(
            "publish --store {store} --identity id.json --tokens r{v}.tok --snapshot r{v}.snap \
             --base-snapshot base.snap --base-tokens base.tok --format {format} \
             --max-extent-bytes 4096 --json"
        );
        words(&line).into_iter().map(String::from).collect()
    };
    // How long an uninterrupted publication takes (on a scratch store).
    let scratch = format!("file://{}", dir.join("scratch").display());
    let mut timing_args = publish_args(0);
    timing_args[2] = scratch.clone();
    ok(
        dir,
        &words(&format!(
            "publish --store {scratch} --identity id.json --tokens base.tok --snapshot base.snap"
        )),
    );
    let t = Instant::now();
    let targs: Vec<&str> = timing_args.iter().map(String::as_str).collect();
    ok(dir, &targs);
    let full = t.elapsed().max(Duration::from_millis(20));

    let mut reported = std::collections::BTreeSet::new();
    let mut killed = 0;
    for i in 0..iters {
        let v = mix(i ^ 0xdead) % variants;
        let args = publish_args(v);
        let mut child = command()
            .args(&args)
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let wait = Duration::from_micros(mix(i) % (full.as_micros() as u64 * 2).max(1));
        std::thread::sleep(wait);
        match child.try_wait().expect("try_wait") {
            Some(status) => {
                if status.success() {
                    reported.insert(v);
                }
            }
            None => {
                child.kill().expect("SIGKILL");
                killed += 1;
                let _ = child.wait();
            }
        }
    }
    eprintln!(
        "kill -9 campaign: {iters} publications, {killed} killed, {} reported published",
        reported.len()
    );

    // Staging files of killed writers count as abandoned after 2 s.
    std::thread::sleep(Duration::from_millis(2100));
    // The sweep finds no damage and reclaims every orphan.
    let out = deltapack(
        dir,
        &["sweep", "--store", &store, "--grace", "0s", "--json"],
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("sweep json");
    assert_eq!(out.status.code(), Some(0), "sweep found damage: {report}");
    assert_none(&report, &["corrupt", "missing", "invalidated_roots"]);
    let again = ok(
        dir,
        &["sweep", "--store", &store, "--grace", "0s", "--json"],
    );
    let again: serde_json::Value = serde_json::from_str(&again).expect("json");
    assert_eq!(
        again["orphans_deleted"], 0,
        "the first sweep reclaimed every orphan: {again}"
    );
    assert_eq!(again["staging_removed"], 0, "{again}");

    // Reported publications restore exactly; the rest are exact or absent.
    let mut restorable = 0;
    for v in 0..variants {
        let line = format!(
            "restore --store {store} --identity id.json --tokens r{v}.tok --out out{v}.snap --json"
        );
        let out = deltapack(dir, &words(&line));
        match out.status.code() {
            Some(0) => {
                let got = std::fs::read(dir.join(format!("out{v}.snap"))).expect("restored");
                let want = std::fs::read(dir.join(format!("r{v}.snap"))).expect("input");
                assert!(got == want, "variant {v}: restored bytes differ");
                restorable += 1;
            }
            Some(3) => {
                let miss: serde_json::Value =
                    serde_json::from_slice(&out.stdout).expect("miss json");
                assert_eq!(miss["reason"], "absent", "variant {v}: {miss}");
                assert!(
                    !reported.contains(&v),
                    "variant {v} was reported published but is absent"
                );
            }
            other => panic!(
                "variant {v}: restore exited {other:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }
    eprintln!("{restorable} of {variants} contexts restorable after the campaign");
    assert!(restorable <= variants);
}

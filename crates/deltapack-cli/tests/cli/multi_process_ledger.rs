//! Several processes on one `file://` store (one per tensor-parallel rank,
//! say) share one capacity ledger: real `deltapack` processes publishing,
//! restoring, evicting and sweeping (with no grace) concurrently never
//! corrupt or double-count it, and never lose a root's objects. At the end
//! every surviving root restores bit-exactly, the persisted ledger equals
//! one rebuilt from the store, it agrees with the bytes on disk, and the
//! budget held.

use crate::common::{deltapack, files_below, scratch, words};
use std::path::Path;

fn run(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = deltapack(dir, args);
    let code = out.status.code().unwrap_or(-1);
    if code != 0 {
        // Shown with the failing assertion's output.
        eprintln!(
            "deltapack {args:?} exited {code}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (code, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Bytes of the files below `p`.
fn dir_bytes(p: &Path) -> u64 {
    files_below(p)
        .iter()
        .map(|f| f.metadata().map(|m| m.len()).unwrap_or(0))
        .sum()
}

#[test]
fn concurrent_processes_share_one_ledger() {
    let (tmp, store) = scratch();
    let dir = tmp.path();
    let shown = hammer(dir, &store, None);
    let on_disk = dir_bytes(&dir.join("store/objects")) + dir_bytes(&dir.join("store/roots"));
    let used = shown["used_bytes"].as_u64().expect("used");
    assert_eq!(used, on_disk, "ledger bytes equal bytes on disk");
    assert!(on_disk <= 60_000, "budget held: {on_disk}");
    let (c, stats) = run(dir, &["stats", "--store", &store, "--prometheus"]);
    assert_eq!(c, 0);
    assert!(
        stats.contains(&format!("deltapack_ledger_used_bytes {used}\n")),
        "{stats}"
    );
    let hits = stats
        .lines()
        .find_map(|l| l.strip_prefix("deltapack_ledger_accumulated{counter=\"hits\"} "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(
        hits.is_some_and(|h| h > 0),
        "counters from every process persisted: {stats}"
    );
}

/// The fleet form: the processes are nodes on one S3 bucket (the moto
/// server) sharing a PostgreSQL ledger (the cluster `.ci/run` starts), each
/// given it with `--ledger`. The shared account equals a rebuild from the
/// bucket at the end, and the budget held.
#[test]
fn fleet_processes_share_one_postgres_ledger() {
    let Some((store, ledger)) = crate::common::fleet("cli") else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let shown = hammer(tmp.path(), &store, Some(&ledger));
    assert_eq!(shown["engine"], "postgres", "{shown}");
    assert!(
        shown["used_bytes"].as_u64().expect("used") <= 60_000,
        "{shown}"
    );
}

/// Two lanes of publishers+restorers (v2 and v1 chains under a budget) and
/// an evictor that also sweeps with no grace, each command a real process;
/// then the quiet checks; returns `ledger show --json` after checking it
/// equals a rebuild.
fn hammer(dir: &Path, store: &str, ledger: Option<&str>) -> serde_json::Value {
    let store = store.to_string();
    // Runs a store command with the ledger under test, if any.
    let run_l = move |args: &[&str]| {
        let mut a = args.to_vec();
        if let Some(l) = ledger {
            a.extend(["--ledger", l]);
        }
        run(dir, &a)
    };
    // Restores lane `lane`'s turn `t` into `out` (with `extra` options);
    // a hit must be bit-exact. Returns whether it was a hit.
    let restore_turn = move |store: &str, lane: u64, t: u64, out: &str, extra: &[&str]| {
        let tok = format!("l{lane}t{t}.tok");
        let mut args = vec![
            "restore",
            "--store",
            store,
            "--identity",
            "id.json",
            "--tokens",
            &tok,
            "--out",
            out,
        ];
        args.extend_from_slice(extra);
        let (code, _) = run_l(&args);
        assert!(code == 0 || code == 3, "restore exited {code}");
        if code == 0 {
            let got = std::fs::read(dir.join(out)).expect("out");
            let want = std::fs::read(dir.join(format!("l{lane}t{t}.snap"))).expect("in");
            assert!(got == want, "lane {lane} turn {t}: restored bytes differ");
        }
        code == 0
    };
    let budget = "60000";
    let (c, id) = run(dir, &["identity", "--example"]);
    assert_eq!(c, 0);
    std::fs::write(dir.join("id.json"), id).expect("id");
    for lane in 0..2u64 {
        for t in 1..=6u64 {
            let n = (1024 * t).to_string();
            let seed = (40 + lane).to_string();
            let (c, _) = run(
                dir,
                &words(&format!("synth --preset tiny --tokens {n} --seed {seed} --out l{lane}t{t}.snap --tokens-out l{lane}t{t}.tok")),
            );
            assert_eq!(c, 0);
        }
    }
    std::thread::scope(|s| {
        for lane in 0..2u64 {
            let store = store.clone();
            s.spawn(move || {
                for t in 1..=6u64 {
                    let (snap, tok) = (format!("l{lane}t{t}.snap"), format!("l{lane}t{t}.tok"));
                    let format = if lane == 0 { "v2" } else { "v1" };
                    let mut line = format!(
                        "publish --store {store} --identity id.json --tokens {tok} \
                         --snapshot {snap} --budget {budget} --grace 0s --format {format} \
                         --max-extent-bytes 4096"
                    );
                    if t > 1 {
                        let p = t - 1;
                        line.push_str(&format!(
                            " --base-snapshot l{lane}t{p}.snap --base-tokens l{lane}t{p}.tok"
                        ));
                    }
                    let a = words(&line);
                    // Success, or a clean failure when the budget forced the
                    // base out (then the next turn is published flat).
                    let (code, _) = run_l(&a);
                    assert!(code == 0 || code == 1, "publish exited {code}");
                    let out = format!("out{lane}.snap");
                    restore_turn(
                        &store,
                        lane,
                        t,
                        &out,
                        &["--grace", "0s", "--budget", budget],
                    );
                }
            });
        }
        let store = store.clone();
        s.spawn(move || {
            for _ in 0..4 {
                let (code, _) =
                    run_l(&["evict", "--store", &store, "--to", "40000", "--grace", "0s"]);
                assert_eq!(code, 0, "evict");
                // A sweep with no grace while the lanes publish: orphans
                // are deleted at once, so only the ledger's protections keep
                // a publication's fresh objects. It may report an object
                // missing that an eviction collected after the sweep listed
                // it (exit 3), but it must never invalidate a root: nothing
                // here is damaged.
                let (code, out) = run_l(&["sweep", "--store", &store, "--grace", "0s", "--json"]);
                assert!(code == 0 || code == 4, "sweep exited {code}");
                let report: serde_json::Value = serde_json::from_str(&out).expect("sweep json");
                assert_eq!(
                    report["invalidated_roots"],
                    serde_json::json!([]),
                    "a sweep during the campaign invalidated a healthy root: {report}"
                );
                assert_eq!(report["corrupt"], serde_json::json!([]), "{report}");
            }
        });
    });
    // Quiet now: a sweep finds nothing wrong, and every root that survived
    // the campaign restores bit-exactly (each turn that misses has no root).
    let (code, out) = run_l(&["sweep", "--store", &store, "--grace", "0s", "--json"]);
    assert_eq!(code, 0, "final sweep: {out}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("sweep json");
    for field in ["missing", "corrupt", "invalidated_roots", "unusable_roots"] {
        assert_eq!(report[field], serde_json::json!([]), "{field}: {report}");
    }
    let mut restored = 0u64;
    for lane in 0..2u64 {
        for t in 1..=6u64 {
            if restore_turn(&store, lane, t, "final.snap", &[]) {
                restored += 1;
            }
        }
    }
    assert_eq!(
        Some(restored),
        report["roots"].as_u64(),
        "every root the sweep found restores: {report}"
    );
    let (c, shown) = run_l(&["ledger", "show", "--store", &store, "--json"]);
    assert_eq!(c, 0);
    let (c, rebuilt) = run_l(&words(&format!(
        "ledger rebuild --store {store} --json --grace 0s"
    )));
    assert_eq!(c, 0);
    let shown: serde_json::Value = serde_json::from_str(&shown).expect("json");
    let rebuilt: serde_json::Value = serde_json::from_str(&rebuilt).expect("json");
    for field in ["roots", "objects", "object_bytes", "root_bytes"] {
        assert_eq!(
            shown[field], rebuilt[field],
            "{field}: persisted ledger vs rebuilt\n{shown}\n{rebuilt}"
        );
    }
    shown
}

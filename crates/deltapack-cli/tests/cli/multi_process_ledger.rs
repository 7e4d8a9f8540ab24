//! Several processes on one `file://` store (one per tensor-parallel rank,
//! say) share one capacity ledger: real `deltapack` processes publishing,
//! restoring and evicting concurrently never corrupt or double-count it. At
//! the end the persisted ledger equals one rebuilt from the store, it agrees
//! with the bytes on disk, the budget held, and every restore is exact.

use std::path::Path;
use std::process::Command;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_deltapack"));
    c.env("RUST_LOG", "error").env_remove("DELTAPACK_ROOT_KEY");
    c
}

fn run(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = bin()
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run deltapack");
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

fn dir_bytes(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| {
                    if e.path().is_dir() {
                        dir_bytes(&e.path())
                    } else {
                        e.metadata().map(|m| m.len()).unwrap_or(0)
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn concurrent_processes_share_one_ledger() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let store = format!("file://{}", dir.join("store").display());
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
                &[
                    "synth",
                    "--preset",
                    "tiny",
                    "--tokens",
                    &n,
                    "--seed",
                    &seed,
                    "--out",
                    &format!("l{lane}t{t}.snap"),
                    "--tokens-out",
                    &format!("l{lane}t{t}.tok"),
                ],
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
                    let mut args: Vec<String> = [
                        "publish",
                        "--store",
                        &store,
                        "--identity",
                        "id.json",
                        "--tokens",
                        &tok,
                        "--snapshot",
                        &snap,
                        "--budget",
                        budget,
                        "--grace",
                        "0s",
                        "--format",
                        if lane == 0 { "v2" } else { "v1" },
                        "--max-extent-bytes",
                        "4096",
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                    if t > 1 {
                        args.extend([
                            "--base-snapshot".into(),
                            format!("l{lane}t{}.snap", t - 1),
                            "--base-tokens".into(),
                            format!("l{lane}t{}.tok", t - 1),
                        ]);
                    }
                    let a: Vec<&str> = args.iter().map(String::as_str).collect();
                    // Success, or a clean failure when the budget forced the
                    // base out (then the next turn is published flat).
                    let (code, _) = run(dir, &a);
                    assert!(code == 0 || code == 1, "publish exited {code}");
                    let (code, _) = run(
                        dir,
                        &[
                            "restore",
                            "--store",
                            &store,
                            "--identity",
                            "id.json",
                            "--tokens",
                            &tok,
                            "--out",
                            &format!("out{lane}.snap"),
                            "--grace",
                            "0s",
                            "--budget",
                            budget,
                        ],
                    );
                    assert!(code == 0 || code == 3, "restore exited {code}");
                    if code == 0 {
                        let got = std::fs::read(dir.join(format!("out{lane}.snap"))).expect("out");
                        let want = std::fs::read(dir.join(&snap)).expect("in");
                        assert!(got == want, "lane {lane} turn {t}: restored bytes differ");
                    }
                }
            });
        }
        let store = store.clone();
        s.spawn(move || {
            for _ in 0..4 {
                let (code, _) = run(
                    dir,
                    &["evict", "--store", &store, "--to", "40000", "--grace", "0s"],
                );
                assert_eq!(code, 0, "evict");
            }
        });
    });
    let (c, shown) = run(dir, &["ledger", "show", "--store", &store, "--json"]);
    assert_eq!(c, 0);
    let (c, rebuilt) = run(
        dir,
        &[
            "ledger", "rebuild", "--store", &store, "--json", "--grace", "0s",
        ],
    );
    assert_eq!(c, 0);
    let shown: serde_json::Value = serde_json::from_str(&shown).expect("json");
    let rebuilt: serde_json::Value = serde_json::from_str(&rebuilt).expect("json");
    for field in ["roots", "objects", "object_bytes", "root_bytes"] {
        assert_eq!(
            shown[field], rebuilt[field],
            "{field}: persisted ledger vs rebuilt\n{shown}\n{rebuilt}"
        );
    }
    let on_disk = dir_bytes(&dir.join("store/objects")) + dir_bytes(&dir.join("store/roots"));
    let used = shown["used_bytes"].as_u64().expect("used");
    assert_eq!(used, on_disk, "ledger bytes equal bytes on disk");
    assert!(on_disk <= 60_000, "budget held: {on_disk}");
    let (c, stats) = run(dir, &["stats", "--store", &store, "--prometheus"]);
    assert_eq!(c, 0);
    assert!(stats.contains("deltapack_ledger_used_bytes"), "{stats}");
    assert!(
        stats.contains("deltapack_hits_total"),
        "counters from every process persisted: {stats}"
    );
}

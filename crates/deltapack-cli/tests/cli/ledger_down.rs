//! `deltapack lookup` and `restore` work while the ledger is unreadable,
//! say where the answer came from, and `publish` fails closed with the
//! `ledger-unavailable` kind and a hint.
//!
//! Why: a placement layer calls `lookup` first; with the metadata engine
//! down it used to fail (exit 1), making the whole cache unusable although
//! every root was in the store. Real processes, a real SQLite ledger file
//! replaced by garbage.

use std::path::Path;

use crate::common::{code_and_text, deltapack, ok, scratch, words};

fn run(dir: &Path, args: &[&str]) -> (i32, String, String) {
    code_and_text(&deltapack(dir, args))
}

#[test]
fn lookup_and_restore_answer_from_the_store_when_the_ledger_is_unreadable() {
    let (dir, store) = scratch();
    let d = dir.path();
    let ledger_path = d.join("ledger.sqlite3");
    let ledger = format!("sqlite://{}", ledger_path.display());
    std::fs::write(d.join("id.json"), ok(d, &["identity", "--example"])).expect("id");
    for (n, name) in [("2048", "a"), ("4096", "b")] {
        ok(
            d,
            &words(&format!("synth --preset tiny --tokens {n} --seed 5 --out {name}.snap --tokens-out {name}.tok")),
        );
    }
    ok(
        d,
        &words(&format!("publish --store {store} --ledger {ledger} --identity id.json --tokens a.tok --snapshot a.snap")),
    );
    let lookup_line = format!(
        "lookup --store {store} --ledger {ledger} --identity id.json --tokens b.tok --json"
    );
    let lookup = words(&lookup_line);
    let up: serde_json::Value = serde_json::from_str(&ok(d, &lookup)).expect("json");
    assert_eq!(up["outcome"], "hit", "{up}");
    assert_eq!(up["source"], "ledger", "{up}");
    assert_eq!(up["boundary"], 2048, "{up}");

    // The ledger file becomes garbage (and its WAL files go).
    let garbage = d.join("garbage");
    std::fs::write(&garbage, vec![0x5a; 8192]).expect("garbage");
    std::fs::rename(&garbage, &ledger_path).expect("replace");
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", ledger_path.display()));
    }
    let down: serde_json::Value = serde_json::from_str(&ok(d, &lookup)).expect("json");
    assert_eq!(down["outcome"], "hit", "{down}");
    assert_eq!(down["source"], "store", "{down}");
    assert_eq!(down["boundary"], up["boundary"], "{down}");
    ok(
        d,
        &words(&format!("restore --store {store} --ledger {ledger} --identity id.json --tokens a.tok --out r.snap")),
    );
    assert_eq!(
        std::fs::read(d.join("r.snap")).expect("restored"),
        std::fs::read(d.join("a.snap")).expect("published")
    );
    let (code, _, err) = run(
        d,
        &words(&format!("publish --store {store} --ledger {ledger} --identity id.json --tokens b.tok --snapshot b.snap --json")),
    );
    assert_eq!(code, 1, "{err}");
    let e: serde_json::Value = serde_json::from_str(err.trim()).expect("one JSON error");
    assert_eq!(e["error"]["kind"], "ledger-unavailable", "{err}");
    assert!(
        e["error"]["hint"]
            .as_str()
            .unwrap_or_default()
            .contains("restore and lookup still answer"),
        "{err}"
    );
}

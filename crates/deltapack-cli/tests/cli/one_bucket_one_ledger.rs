//! Two `deltapack` processes that share a bucket but not a state directory
//! (so each keeps the default SQLite ledger for `s3://`) must not lose an
//! acknowledged publication; and a node that lost its state directory gets
//! the store back with `ledger adopt`.
//!
//! Why: this exact sequence, run by hand on moto, lost data: A published a
//! context, A `evict --to 0 --grace 2s`, B published the same context
//! (`objects_reused: 1`, acknowledged as `created`), A `evict --to 100GiB
//! --grace 2s` 3 s later deleted the object, and a third process restoring
//! the context got `miss: absent` after A's sweep. Now B is refused with
//! `ledger-mismatch` and writes nothing, and, once told the store's ledger,
//! its publication survives A's collection. Real processes, real moto, real
//! SQLite files under two `DELTAPACK_STATE_DIR`s.

use crate::common::{assert_none, code_and_text, s3_prefix, words};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Runs `deltapack` in `dir` with `state` as its state directory; returns
/// (exit code, stdout, stderr).
fn run(dir: &Path, state: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_deltapack"))
        .args(args)
        .current_dir(dir)
        .env("DELTAPACK_STATE_DIR", state)
        .env_remove("DELTAPACK_LEDGER")
        .env_remove("DELTAPACK_ROOT_KEY")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run deltapack");
    code_and_text(&out)
}

fn ok(dir: &Path, state: &Path, args: &[&str]) -> String {
    let (code, out, err) = run(dir, state, args);
    assert_eq!(code, 0, "deltapack {args:?}: {err}");
    assert!(
        !err.contains("task was cancelled"),
        "deltapack {args:?} lost work at exit: {err}"
    );
    out
}

fn s3_store() -> Option<String> {
    let ep = match std::env::var("DELTAPACK_TEST_S3_ENDPOINT") {
        Ok(e) if !e.is_empty() => e,
        _ => {
            assert!(std::env::var("CI").is_err(), "CI must start the S3 server");
            return None;
        }
    };
    Some(s3_prefix("one-ledger", &ep))
}

#[test]
fn two_default_ledgers_on_one_bucket_lose_nothing() {
    let Some(store) = s3_store() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let (sa, sb) = (d.join("state-a"), d.join("state-b"));
    std::fs::write(d.join("id.json"), ok(d, &sa, &["identity", "--example"])).expect("id");
    ok(
        d,
        &sa,
        &words("synth --preset tiny --tokens 2048 --seed 3 --out t.snap --tokens-out t.tok"),
    );
    let publish_line = format!(
        "publish --store {store} --identity id.json --tokens t.tok --snapshot t.snap --json"
    );
    let publish = words(&publish_line);
    let restore_line =
        format!("restore --store {store} --identity id.json --tokens t.tok --out r.snap --json");
    let restore = words(&restore_line);
    // A publishes, then evicts everything (objects condemned, grace 2 s).
    ok(d, &sa, &publish);
    ok(
        d,
        &sa,
        &words(&format!("evict --store {store} --to 0 --grace 2s --json")),
    );
    // B, with a ledger of its own, is refused and writes nothing.
    let (code, _, err) = run(d, &sb, &publish);
    assert_eq!(code, 1, "{err}");
    let e: serde_json::Value = serde_json::from_str(err.trim()).expect("one JSON error");
    assert_eq!(e["error"]["kind"], "ledger-mismatch", "{err}");
    let hint = e["error"]["hint"].as_str().unwrap_or_default();
    assert!(hint.contains("ledger adopt"), "{hint}");
    // The command the error suggests names the store whole: pasted, it
    // goes to the same server (`?endpoint=` kept), not to AWS.
    assert!(store.contains("?endpoint="), "{store}");
    assert!(
        err.contains(&format!("ledger adopt --store {store}")),
        "{store}: {err}"
    );
    // `ledger show` on B names A's ledger and says B is not it.
    let shown: serde_json::Value = serde_json::from_str(&ok(
        d,
        &sb,
        &["ledger", "show", "--store", &store, "--json"],
    ))
    .expect("json");
    assert_eq!(
        shown["binding"]["ownership"]["status"], "foreign",
        "{shown}"
    );
    let a_ledger = shown["binding"]["store_ledger"]["description"]
        .as_str()
        .expect("the store's ledger")
        .to_string();
    assert!(a_ledger.contains("state-a"), "{a_ledger}");
    // A collects after the grace: the context is absent (nothing of B's
    // was acknowledged), never corrupt.
    std::thread::sleep(Duration::from_secs(3));
    ok(
        d,
        &sa,
        &words(&format!(
            "evict --store {store} --to 100GiB --grace 2s --json"
        )),
    );
    let (code, out, err) = run(d, &sa, &restore);
    assert_eq!(code, 3, "{out} {err}");
    assert!(out.contains("absent"), "{out}");
    // B told the store's ledger (the path `ledger show` named) publishes,
    // and A's next collection leaves its root whole.
    let path = a_ledger.rsplit(": ").next().expect("path");
    let with_a = format!("sqlite://{path}");
    let mut fixed: Vec<&str> = publish.to_vec();
    fixed.extend(["--ledger", &with_a]);
    let receipt: serde_json::Value = serde_json::from_str(&ok(d, &sb, &fixed)).expect("json");
    assert_eq!(receipt["outcome"], "created", "{receipt}");
    std::thread::sleep(Duration::from_secs(3));
    ok(
        d,
        &sa,
        &words(&format!(
            "evict --store {store} --to 100GiB --grace 2s --json"
        )),
    );
    let third = d.join("state-c");
    ok(d, &third, &restore);
    assert_eq!(
        std::fs::read(d.join("r.snap")).expect("restored"),
        std::fs::read(d.join("t.snap")).expect("published")
    );
    let sweep = ok(
        d,
        &sa,
        &words(&format!("sweep --store {store} --grace 1h --json")),
    );
    let sweep: serde_json::Value = serde_json::from_str(&sweep).expect("json");
    assert_none(&sweep, &["corrupt", "missing"]);

    // A loses its state directory: its fresh ledger is refused until it
    // adopts the store; then it publishes, and nothing was lost.
    std::fs::remove_dir_all(&sa).expect("lose A's state");
    let (code, _, err) = run(d, &sa, &["evict", "--store", &store, "--to", "0", "--json"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("ledger-mismatch"), "{err}");
    let adopted = ok(
        d,
        &sa,
        &words(&format!(
            "ledger adopt --store {store} --old-owner-gone --json"
        )),
    );
    let adopted: serde_json::Value = serde_json::from_str(&adopted).expect("json");
    assert_eq!(adopted["changed"], true, "{adopted}");
    assert_eq!(adopted["binding"]["generation"], 2, "{adopted}");
    ok(d, &sa, &restore);
    assert_eq!(
        std::fs::read(d.join("r.snap")).expect("restored"),
        std::fs::read(d.join("t.snap")).expect("published")
    );
    let shown: serde_json::Value = serde_json::from_str(&ok(
        d,
        &sa,
        &["ledger", "show", "--store", &store, "--json"],
    ))
    .expect("json");
    assert_eq!(shown["binding"]["ownership"]["status"], "owner", "{shown}");
    assert_eq!(shown["roots"], 1, "{shown}");
}

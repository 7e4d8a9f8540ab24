//! What scripts around the CLI rely on: where output goes and how errors
//! look.
//!
//! Guards: `restore --out -` streams exactly the verified snapshot to
//! stdout (report on stderr; nothing on stdout on a miss); a file output is
//! whole or absent (no `.tmp` left behind), with or without `--durable`;
//! every command that names a root accepts `--tokens FILE` with the same
//! effect as `--context HEX` (hold, release, inspect, invalidate); errors
//! under `--json` are one JSON object on stderr with a stable `error.kind`
//! (`io`, `conflict`); each cause is printed once; `--deadline` takes a
//! duration (and the old `--deadline-ms` still works); shell completions
//! are generated for bash, zsh and fish.

use std::path::Path;

use crate::common::{conversation, expect_code, Cli};

fn json(text: &[u8]) -> serde_json::Value {
    serde_json::from_slice(text)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", String::from_utf8_lossy(text)))
}

/// A tiny conversation published flat: (store URL, context hex).
fn published(dir: &Path) -> (String, String) {
    let store = conversation(dir, &[("a", 5, 2048), ("b", 5, 2304)]);
    let r = Cli(dir).ok(format!(
        "publish --store {store} --identity id.json --tokens a.tok --snapshot a.snap --json"
    ));
    let ctx = json(r.as_bytes())["context"]
        .as_str()
        .expect("context")
        .to_string();
    (store, ctx)
}

#[test]
fn restore_streams_to_stdout_and_writes_files_whole() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (store, ctx) = published(dir);
    let snap = std::fs::read(dir.join("a.snap")).expect("read a.snap");

    let out = Cli(dir).run(format!(
        "restore --store {store} --identity id.json --context {ctx} --out - --json"
    ));
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout == snap, "stdout is exactly the snapshot");
    let report = json(&out.stderr);
    assert_eq!(report["outcome"], "hit", "{report}");

    for durable in [false, true] {
        let name = format!("out-{durable}.snap");
        let mut args = vec![
            "restore",
            "--store",
            &store,
            "--identity",
            "id.json",
            "--tokens",
            "a.tok",
            "--out",
            &name,
            "--json",
        ];
        if durable {
            args.push("--durable");
        }
        let r = json(expect_code(dir, &args, 0).as_bytes());
        assert_eq!(r["durable"], durable);
        assert_eq!(std::fs::read(dir.join(&name)).expect("out"), snap);
        assert!(
            !dir.join(format!("{name}.tmp")).exists(),
            "no temp file left"
        );
    }

    // A miss writes nothing to stdout (the miss report goes to stderr).
    let out = Cli(dir).run(format!(
        "restore --store {store} --identity id.json --tokens b.tok --out - --json --deadline 5s"
    ));
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty(), "nothing on stdout on a miss");
    assert_eq!(json(&out.stderr)["reason"], "absent");
    // The deprecated spelling still parses; both at once is a usage error.
    Cli(dir).code(
        3,
        format!(
            "restore --store {store} --identity id.json --tokens b.tok --out x --deadline-ms 5000"
        ),
    );
    Cli(dir).code(2, format!("restore --store {store} --identity id.json --tokens b.tok --out x --deadline-ms 5 --deadline 5ms"));
    assert!(!dir.join("x").exists(), "a miss writes no output file");
}

#[test]
fn tokens_name_roots_as_contexts_do() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (store, ctx) = published(dir);
    let s = store.as_str();

    let by_ctx = Cli(dir).ok(format!("inspect --store {s} --context {ctx} --json"));
    let by_tok = Cli(dir).ok(format!(
        "inspect --store {s} --identity id.json --tokens a.tok --json"
    ));
    assert_eq!(json(by_ctx.as_bytes()), json(by_tok.as_bytes()));
    // --tokens without --identity is a usage error.
    Cli(dir).code(2, format!("inspect --store {s} --tokens a.tok"));

    let held = json(
        Cli(dir)
            .ok(format!(
                "hold --store {s} --name pin1 --identity id.json --tokens a.tok --json"
            ))
            .as_bytes(),
    );
    assert_eq!(held["held"], true);
    let released = json(
        Cli(dir)
            .ok(format!(
                "release --store {s} --name pin1 --identity id.json --context {ctx} --json"
            ))
            .as_bytes(),
    );
    assert_eq!(
        released["released"], true,
        "the hold taken by tokens is released by context"
    );
    // Released again (or a typo in --name): nothing is released, and the
    // exit code says so (3, as a miss), in text and in JSON.
    let again = Cli(dir).code(
        3,
        format!("release --store {s} --name pin1 --identity id.json --context {ctx} --json"),
    );
    assert_eq!(json(again.as_bytes())["released"], false);
    let text = Cli(dir).code(
        3,
        format!("release --store {s} --name pin-typo --identity id.json --context {ctx}"),
    );
    assert!(text.contains("nothing released"), "{text}");

    // invalidate --tokens (dry run first: nothing removed), then for real.
    let plan = Cli(dir).ok(format!(
        "invalidate --store {s} --identity id.json --tokens a.tok --dry-run --json"
    ));
    assert!(plan.contains(&ctx), "the plan names the root: {plan}");
    Cli(dir).ok(format!("inspect --store {s} --context {ctx}"));
    Cli(dir).ok(format!(
        "invalidate --store {s} --identity id.json --tokens a.tok --json"
    ));
    Cli(dir).code(3, format!("inspect --store {s} --context {ctx}"));
}

#[test]
fn errors_are_json_with_a_kind_and_each_cause_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (store, _ctx) = published(dir);

    let out = Cli(dir).run(format!(
        "restore --store {store} --identity missing.json --tokens a.tok --out o --json"
    ));
    assert_eq!(out.status.code(), Some(1));
    let e = json(&out.stderr);
    assert_eq!(e["error"]["kind"], "io", "{e}");
    assert!(e["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("missing.json")));

    // A conflicting publication: the receipt on stdout, the error on stderr.
    let ctx = json(
        Cli(dir).ok(format!("publish --store {store} --identity id.json --tokens a.tok --snapshot a.snap --json"))
        .as_bytes(),
    )["context"]
        .as_str()
        .expect("context")
        .to_string();
    let out = Cli(dir).run(format!(
        "publish --store {store} --identity id.json --context {ctx} --snapshot b.snap --json"
    ));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out.stdout)["outcome"], "conflict");
    let e = json(&out.stderr);
    assert_eq!(e["error"]["kind"], "conflict", "{e}");

    // Text errors: each cause on its own line, none repeated.
    let out = Cli(dir).run(format!(
        "restore --store {store} --identity missing.json --tokens a.tok --out o"
    ));
    let text = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("error: "), "{text}");
    for (i, a) in lines.iter().enumerate() {
        for b in &lines[i + 1..] {
            let a = a
                .trim_start_matches("error: ")
                .trim_start_matches("  caused by: ");
            let b = b.trim_start_matches("  caused by: ");
            assert!(!a.contains(b), "a cause repeats: {text}");
        }
    }
}

#[test]
fn completions_for_common_shells() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for (shell, marker) in [
        ("bash", "_deltapack"),
        ("zsh", "#compdef deltapack"),
        ("fish", "complete -c deltapack"),
    ] {
        let out = expect_code(tmp.path(), &["completions", shell], 0);
        assert!(out.contains(marker), "{shell}");
        for sub in ["restore", "publish", "config", "sweep"] {
            assert!(out.contains(sub), "{shell} completes {sub}");
        }
    }
    expect_code(tmp.path(), &["completions", "tcsh"], 2);
}

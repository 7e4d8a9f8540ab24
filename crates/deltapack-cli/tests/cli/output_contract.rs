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

use crate::common::{deltapack, expect_code};

fn json(text: &[u8]) -> serde_json::Value {
    serde_json::from_slice(text)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", String::from_utf8_lossy(text)))
}

/// A tiny conversation published flat: (store URL, context hex).
fn published(dir: &Path) -> (String, String) {
    let store = format!("file://{}", dir.join("store").display());
    let id = expect_code(dir, &["identity", "--example"], 0);
    std::fs::write(dir.join("id.json"), id).expect("write id.json");
    for (n, name) in [("2048", "a"), ("2304", "b")] {
        expect_code(
            dir,
            &[
                "synth",
                "--preset",
                "tiny",
                "--seed",
                "5",
                "--tokens",
                n,
                "--out",
                &format!("{name}.snap"),
                "--tokens-out",
                &format!("{name}.tok"),
            ],
            0,
        );
    }
    let r = expect_code(
        dir,
        &[
            "publish",
            "--store",
            &store,
            "--identity",
            "id.json",
            "--tokens",
            "a.tok",
            "--snapshot",
            "a.snap",
            "--json",
        ],
        0,
    );
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

    let out = deltapack(
        dir,
        &[
            "restore",
            "--store",
            &store,
            "--identity",
            "id.json",
            "--context",
            &ctx,
            "--out",
            "-",
            "--json",
        ],
    );
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
    let out = deltapack(
        dir,
        &[
            "restore",
            "--store",
            &store,
            "--identity",
            "id.json",
            "--tokens",
            "b.tok",
            "--out",
            "-",
            "--json",
            "--deadline",
            "5s",
        ],
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty(), "nothing on stdout on a miss");
    assert_eq!(json(&out.stderr)["reason"], "absent");
    // The deprecated spelling still parses; both at once is a usage error.
    expect_code(
        dir,
        &[
            "restore",
            "--store",
            &store,
            "--identity",
            "id.json",
            "--tokens",
            "b.tok",
            "--out",
            "x",
            "--deadline-ms",
            "5000",
        ],
        3,
    );
    expect_code(
        dir,
        &[
            "restore",
            "--store",
            &store,
            "--identity",
            "id.json",
            "--tokens",
            "b.tok",
            "--out",
            "x",
            "--deadline-ms",
            "5",
            "--deadline",
            "5ms",
        ],
        2,
    );
    assert!(!dir.join("x").exists(), "a miss writes no output file");
}

#[test]
fn tokens_name_roots_as_contexts_do() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (store, ctx) = published(dir);
    let s = store.as_str();

    let by_ctx = expect_code(
        dir,
        &["inspect", "--store", s, "--context", &ctx, "--json"],
        0,
    );
    let by_tok = expect_code(
        dir,
        &[
            "inspect",
            "--store",
            s,
            "--identity",
            "id.json",
            "--tokens",
            "a.tok",
            "--json",
        ],
        0,
    );
    assert_eq!(json(by_ctx.as_bytes()), json(by_tok.as_bytes()));
    // --tokens without --identity is a usage error.
    expect_code(dir, &["inspect", "--store", s, "--tokens", "a.tok"], 2);

    let held = json(
        expect_code(
            dir,
            &[
                "hold",
                "--store",
                s,
                "--name",
                "pin1",
                "--identity",
                "id.json",
                "--tokens",
                "a.tok",
                "--json",
            ],
            0,
        )
        .as_bytes(),
    );
    assert_eq!(held["held"], true);
    let released = json(
        expect_code(
            dir,
            &[
                "release",
                "--store",
                s,
                "--name",
                "pin1",
                "--identity",
                "id.json",
                "--context",
                &ctx,
                "--json",
            ],
            0,
        )
        .as_bytes(),
    );
    assert_eq!(
        released["released"], true,
        "the hold taken by tokens is released by context"
    );

    // invalidate --tokens (dry run first: nothing removed), then for real.
    let plan = expect_code(
        dir,
        &[
            "invalidate",
            "--store",
            s,
            "--identity",
            "id.json",
            "--tokens",
            "a.tok",
            "--dry-run",
            "--json",
        ],
        0,
    );
    assert!(plan.contains(&ctx), "the plan names the root: {plan}");
    expect_code(dir, &["inspect", "--store", s, "--context", &ctx], 0);
    expect_code(
        dir,
        &[
            "invalidate",
            "--store",
            s,
            "--identity",
            "id.json",
            "--tokens",
            "a.tok",
            "--json",
        ],
        0,
    );
    expect_code(dir, &["inspect", "--store", s, "--context", &ctx], 3);
}

#[test]
fn errors_are_json_with_a_kind_and_each_cause_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let (store, _ctx) = published(dir);

    let out = deltapack(
        dir,
        &[
            "restore",
            "--store",
            &store,
            "--identity",
            "missing.json",
            "--tokens",
            "a.tok",
            "--out",
            "o",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let e = json(&out.stderr);
    assert_eq!(e["error"]["kind"], "io", "{e}");
    assert!(e["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("missing.json")));

    // A conflicting publication: the receipt on stdout, the error on stderr.
    let ctx = json(
        expect_code(
            dir,
            &[
                "publish",
                "--store",
                &store,
                "--identity",
                "id.json",
                "--tokens",
                "a.tok",
                "--snapshot",
                "a.snap",
                "--json",
            ],
            0,
        )
        .as_bytes(),
    )["context"]
        .as_str()
        .expect("context")
        .to_string();
    let out = deltapack(
        dir,
        &[
            "publish",
            "--store",
            &store,
            "--identity",
            "id.json",
            "--context",
            &ctx,
            "--snapshot",
            "b.snap",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out.stdout)["outcome"], "conflict");
    let e = json(&out.stderr);
    assert_eq!(e["error"]["kind"], "conflict", "{e}");

    // Text errors: each cause on its own line, none repeated.
    let out = deltapack(
        dir,
        &[
            "restore",
            "--store",
            &store,
            "--identity",
            "missing.json",
            "--tokens",
            "a.tok",
            "--out",
            "o",
        ],
    );
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

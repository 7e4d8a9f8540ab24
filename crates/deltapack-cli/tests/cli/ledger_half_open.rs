//! The CLI against a PostgreSQL ledger that accepts connections and never
//! answers: reads answer from the store and the process exits promptly;
//! a publication fails with `ledger-unavailable` within the URL's
//! `connect_timeout`. Before, the start-up handshake had no deadline:
//! `restore` printed its hit and never exited, and `publish` never
//! returned. The listener is a real TCP socket that accepts and holds every
//! connection without writing a byte (the test kit's black hole).
//!
//! A damaged object is refused at once too: the move to quarantine, which
//! needs the ledger's word, is queued instead of waited for (before, the
//! restore waited out the ledger's connect deadline, and under
//! `--deadline 500ms` reported `deadline-exceeded` instead of `corrupt`).

use std::time::{Duration, Instant};

use crate::common::{code_and_text, command, scratch_conversation};

/// Runs `deltapack` in `dir`, killed after `limit` (a hang); (code,
/// stdout, stderr, wall time).
fn run_bounded(
    dir: &std::path::Path,
    args: &[&str],
    limit: Duration,
) -> (i32, String, String, Duration) {
    let t = Instant::now();
    let mut child = command()
        .args(args)
        .current_dir(dir)
        .env_remove("DELTAPACK_LEDGER")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            let (_, o, e) = code_and_text(&out);
            panic!("deltapack {args:?} still running after {limit:?}\n{o}\n{e}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let (code, o, e) = code_and_text(&out);
    (code, o, e, t.elapsed())
}

#[test]
fn a_ledger_that_never_answers_neither_hangs_nor_keeps_the_process() {
    let (tmp, store) = scratch_conversation(&[("a", 1, 512)]);
    let dir = tmp.path();
    // Published with the store's own ledger.
    crate::common::Cli(dir).ok(format!(
        "publish --store {store} --identity id.json --tokens a.tok --snapshot a.snap"
    ));
    let hole_proxy = deltapack_testkit::FaultProxy::black_hole().expect("black hole");
    let port = hole_proxy.port();
    // No connect_timeout: the start-up deadline is the default 10 s, far
    // longer than a read may keep the process.
    let hole = format!("postgres://postgres@127.0.0.1:{port}/db?sslmode=disable");
    let limit = Duration::from_secs(8);
    // `line`, with the store and `ledger`, under `limit`.
    let run = |line: &str, ledger: &str, limit: Duration| {
        let mut args: Vec<&str> = line.split_whitespace().collect();
        args.extend(["--store", store.as_str(), "--ledger", ledger]);
        run_bounded(dir, &args, limit)
    };
    let (code, out, err, _) = run(
        "restore --identity id.json --tokens a.tok --out r.snap",
        &hole,
        limit,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        std::fs::read(dir.join("r.snap")).expect("restored"),
        std::fs::read(dir.join("a.snap")).expect("snap")
    );
    let (code, out, err, _) = run(
        "lookup --identity id.json --tokens a.tok --json",
        &hole,
        limit,
    );
    assert_eq!(code, 0, "{out}{err}");
    // A publication needs the ledger: refused within the URL's deadline.
    let hole1 = format!("{hole}&connect_timeout=1");
    let (code, _, err, _) = run(
        "publish --identity id.json --tokens a.tok --snapshot a.snap --json",
        &hole1,
        Duration::from_secs(30),
    );
    assert_ne!(code, 0);
    assert!(err.contains("ledger-unavailable"), "{err}");
    // A damaged object: refused as corrupt under a 500 ms deadline, and the
    // process ends within the limit although its ledger never answers.
    let objects = crate::common::files_below(&dir.join("store").join("objects"));
    let victim = objects.first().expect("an object");
    let mut bytes = std::fs::read(victim).expect("object");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(victim, &bytes).expect("damage");
    let (code, out, err, took) = run(
        "restore --identity id.json --tokens a.tok --out d.snap --deadline 500ms --json",
        &hole,
        limit,
    );
    assert_eq!(code, 3, "{out}{err}");
    let miss: serde_json::Value = serde_json::from_str(&out).expect("miss json");
    assert_eq!(miss["reason"], "corrupt", "{miss}");
    eprintln!("damaged object with a black-holed ledger: corrupt, exited after {took:?}");
}

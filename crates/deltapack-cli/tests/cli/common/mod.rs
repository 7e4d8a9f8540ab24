//! Helpers shared by the CLI's test binaries: run the `deltapack` binary
//! as a user would and check its exit code.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

/// The `deltapack` binary with quiet logs and no root key from the
/// environment, for a test to give its arguments (and more settings).
pub(crate) fn command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_deltapack"));
    c.env("RUST_LOG", "error").env_remove("DELTAPACK_ROOT_KEY");
    c
}

/// Runs `deltapack` with `args` in `dir` ([`command`]).
pub(crate) fn deltapack(dir: &Path, args: &[&str]) -> Output {
    command()
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run the deltapack binary")
}

/// A finished run as (exit code, or -1 when a signal ended it; stdout;
/// stderr).
pub(crate) fn code_and_text(out: &Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs and asserts the exit code, returning stdout.
pub(crate) fn expect_code(dir: &Path, args: &[&str], code: i32) -> String {
    let out = deltapack(dir, args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "deltapack {args:?}\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs and asserts success, returning stdout ([`expect_code`] 0).
pub(crate) fn ok(dir: &Path, args: &[&str]) -> String {
    expect_code(dir, args, 0)
}

/// A fleet to test on: a fresh prefix of the moto bucket and a PostgreSQL
/// ledger URL with a schema of its own (both from the servers `.ci/run`
/// starts), as `(store URL, ledger URL)`. `None`, with a note, when they are
/// not configured outside CI; in CI (`CI=true`) that is a failure.
pub(crate) fn fleet(name: &str) -> Option<(String, String)> {
    let (Some(endpoint), Some(pg)) = (
        std::env::var("DELTAPACK_TEST_S3_ENDPOINT").ok(),
        std::env::var("DELTAPACK_TEST_POSTGRES").ok(),
    ) else {
        assert!(
            std::env::var("CI").map(|v| v != "true").unwrap_or(true),
            "CI=true but the S3 or PostgreSQL test server is not configured"
        );
        eprintln!("S3 or PostgreSQL test server not configured: skipping");
        return None;
    };
    let schema = format!("{name}_{}", std::process::id());
    let mut c = postgres::Client::connect(&pg, postgres::NoTls).expect("connect");
    c.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
    ))
    .expect("schema");
    drop(c);
    let sep = if pg.contains('?') { '&' } else { '?' };
    let ledger = format!("{pg}{sep}options=-c%20search_path%3D{schema}");
    Some((s3_prefix(name, &endpoint), ledger))
}

/// The URL of a fresh prefix, `name-<pid>-<nanos>`, of the test bucket
/// (`DELTAPACK_TEST_S3_BUCKET`, else `deltapack-test`) on the S3 server at
/// `endpoint`.
pub(crate) fn s3_prefix(name: &str, endpoint: &str) -> String {
    let bucket =
        std::env::var("DELTAPACK_TEST_S3_BUCKET").unwrap_or_else(|_| "deltapack-test".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "s3://{bucket}/{name}-{}-{nanos}?endpoint={endpoint}",
        std::process::id()
    )
}

/// Every file below `dir` (recursively), sorted.
pub(crate) fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Asserts that each of `lists` is an empty array in a JSON report.
pub(crate) fn assert_none(report: &serde_json::Value, lists: &[&str]) {
    for k in lists {
        assert_eq!(
            report[*k].as_array().map(Vec::len),
            Some(0),
            "{k} in {report}"
        );
    }
}

/// The arguments of a command line written as one string: its words
/// (no argument a test passes has a space in it; see [`Cli`]).
pub(crate) fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// `deltapack` run in one folder, its arguments written as one command
/// line and split on white space (no argument a test passes has a space
/// in it: store URLs are temp-dir paths, the rest are flags, hex and file
/// names).
#[derive(Clone, Copy)]
pub(crate) struct Cli<'a>(pub(crate) &'a Path);

impl Cli<'_> {
    /// Runs `deltapack` with the words of `line` ([`deltapack`]).
    pub(crate) fn run(self, line: impl AsRef<str>) -> Output {
        deltapack(self.0, &words(line.as_ref()))
    }

    /// Runs it and asserts the exit code ([`expect_code`]); returns stdout.
    pub(crate) fn code(self, code: i32, line: impl AsRef<str>) -> String {
        expect_code(self.0, &words(line.as_ref()), code)
    }

    /// Runs it and asserts success; returns stdout.
    pub(crate) fn ok(self, line: impl AsRef<str>) -> String {
        self.code(0, line)
    }
}

/// The URL of a local store in `dir/store` (created by the first
/// publication).
pub(crate) fn local_store(dir: &Path) -> String {
    format!("file://{}", dir.join("store").display())
}

/// A new temporary folder for a test and the URL of a [`local_store`] in
/// it.
pub(crate) fn scratch() -> (tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = local_store(tmp.path());
    (tmp, store)
}

/// [`scratch`], with a [`conversation`] of `turns` set up in the folder.
pub(crate) fn scratch_conversation(turns: &[(&str, u64, u64)]) -> (tempfile::TempDir, String) {
    let (tmp, store) = scratch();
    conversation(tmp.path(), turns);
    (tmp, store)
}

/// A tiny conversation set up in `dir`: the example identity in `id.json`
/// and, per `(name, seed, tokens)`, a synthetic snapshot `name.snap` with
/// its tokens in `name.tok`. Returns the URL of the [`local_store`] in
/// `dir`.
pub(crate) fn conversation(dir: &Path, turns: &[(&str, u64, u64)]) -> String {
    let id = Cli(dir).ok("identity --example");
    std::fs::write(dir.join("id.json"), id).expect("write id.json");
    for (name, seed, n) in turns {
        Cli(dir).ok(format!(
            "synth --preset tiny --seed {seed} --tokens {n} --out {name}.snap --tokens-out {name}.tok"
        ));
    }
    local_store(dir)
}

/// SplitMix64: a well-mixed 64-bit value from `z` (test randomness that a
/// seed reproduces).
pub(crate) fn mix(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seeded SplitMix64 stream.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next value.
    pub(crate) fn next(&mut self) -> u64 {
        let r = mix(self.0);
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        r
    }
    /// A value in `0..n` (`0` for `n = 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        (self.next() as f64 / u64::MAX as f64) < p
    }
}

/// How a child waited for by [`wait_or_kill`] ended.
pub(crate) enum Ended {
    /// It exited (or died of a signal someone else sent).
    Exited(ExitStatus),
    /// We killed it with SIGKILL at the moment asked for.
    Killed,
    /// It was still running `hang` after `start`: killed, and a failure.
    Hung,
}

/// Waits for `child`, polling every 2 ms; kills it with SIGKILL at
/// `kill_at` if that comes first, and as a hang once `hang` has passed
/// since `start`. The child is always reaped.
pub(crate) fn wait_or_kill(
    child: &mut Child,
    start: Instant,
    kill_at: Option<Instant>,
    hang: Duration,
) -> Ended {
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Ended::Exited(status);
        }
        let now = Instant::now();
        if kill_at.is_some_and(|k| now >= k) {
            child.kill().expect("SIGKILL");
            let _ = child.wait();
            return Ended::Killed;
        }
        if now - start > hang {
            child.kill().expect("SIGKILL");
            let _ = child.wait();
            return Ended::Hung;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

//! Helpers shared by the CLI's test binaries: run the `deltapack` binary
//! as a user would and check its exit code.

use std::path::Path;
use std::process::{Command, Output};

/// Runs `deltapack` with `args` in `dir` (quiet logs, no root key from the
/// environment).
pub(crate) fn deltapack(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deltapack"))
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "error")
        .env_remove("DELTAPACK_ROOT_KEY")
        .output()
        .expect("run the deltapack binary")
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

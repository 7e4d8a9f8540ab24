//! The `deltapack-bench` command line: suites, the hidden child command and
//! argument checks that fail before any work. (Running the suites is
//! `.ci/smoke`'s job, at a tiny scale; building this test also builds the
//! binary the smoke runs.)

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deltapack-bench"))
        .args(args)
        .env_remove("DELTAPACK_TEST_S3_ENDPOINT")
        .output()
        .expect("running deltapack-bench")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_lists_the_suites_and_hides_the_child_command() {
    let o = bench(&["--help"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    for suite in [
        "restore", "publish", "chain", "shaped", "all", "tiers", "layers",
    ] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{suite} "))),
            "{suite} missing from:\n{text}"
        );
    }
    assert!(!text.contains("bench-one"), "{text}");
    let o = bench(&["chain", "--help"]);
    let text = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--scale",
        "--repeats",
        "--extent-bytes",
        "--chain-turns",
        "--out",
        "--wait-idle",
        "--latency-ms",
        "--shaped-latency-ms",
        "--shaped-conn-mb-s",
        "--shaped-aggregate-mb-s",
        "--s3-scale",
        "--store",
        "--keep",
        "--json",
    ] {
        assert!(text.contains(flag), "{flag} missing from:\n{text}");
    }
}

#[test]
fn bad_arguments_fail_before_any_work() {
    let o = bench(&["all", "--scale", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--scale must be in (0, 16]"),
        "{}",
        stderr(&o)
    );

    let o = bench(&["restore", "--extent-bytes", "1000"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--extent-bytes"), "{}", stderr(&o));

    let o = bench(&["publish", "--store", "memory://"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot be shared"), "{}", stderr(&o));

    let o = bench(&["shaped", "--shaped-conn-mb-s", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--shaped-conn-mb-s"), "{}", stderr(&o));

    let o = bench(&["layers", "--consumer-gbps", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--consumer-gbps"), "{}", stderr(&o));

    let o = bench(&["all", "--repeats", "0"]);
    assert_eq!(o.status.code(), Some(2), "a usage error");
}

#[test]
fn the_child_command_takes_one_json_job() {
    let o = bench(&["bench-one", "--job", "{\"job\": \"no-such-job\"}"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bad --job JSON"), "{}", stderr(&o));
    // The S3 cleanup of no store is a job that needs nothing: one JSON line.
    let o = bench(&[
        "bench-one",
        "--job",
        "{\"job\": \"s3-cleanup\", \"urls\": []}",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let line = String::from_utf8_lossy(&o.stdout);
    assert!(
        line.trim_start().starts_with('{') && line.contains("\"deleted\":0"),
        "{line}"
    );
}

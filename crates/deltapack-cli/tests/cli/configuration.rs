//! Store settings come from flags, `DELTAPACK_*` environment variables and
//! a TOML file, in that order of precedence over the defaults.
//!
//! Guards what an operator relies on when a fleet is configured by files
//! and environments: a flag beats the environment, the environment beats
//! the file, the file beats the default (`config show` says which won, and
//! the opened store really uses the value: a budget from the file is the
//! budget `stats` reports); sizes and durations take human units; a bad
//! file (unknown key, bad unit, `cold-start = "clear"`) is refused with the
//! key named and nothing opened; and the store URL itself may come from any
//! of the three.

use crate::common::{command, scratch, words};
use std::path::Path;
use std::process::Output;

fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = command();
    c.args(args).current_dir(dir);
    // No setting leaks in from the environment running the tests.
    for (k, _) in std::env::vars() {
        if k.starts_with("DELTAPACK_") && k != "DELTAPACK_STATE_DIR" {
            c.env_remove(k);
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run deltapack")
}

fn ok_json(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let out = run(dir, args, env);
    assert_eq!(
        out.status.code(),
        Some(0),
        "deltapack {args:?} {env:?}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn setting(v: &serde_json::Value, name: &str) -> (String, String) {
    (
        v[name]["value"].as_str().unwrap_or("?").to_string(),
        v[name]["source"].as_str().unwrap_or("?").to_string(),
    )
}

#[test]
fn flag_beats_env_beats_file_beats_default() {
    let (tmp, store) = scratch();
    let dir = tmp.path();
    let cfg = dir.join("deltapack.toml");
    std::fs::write(
        &cfg,
        format!(
            "store = \"{store}\"\nbudget = \"50GiB\"\ngrace = \"2h\"\nmin-free = \"1G\"\n\
             max-extent-bytes = \"16MiB\"\npart-bytes = \"16MiB\"\nparts-in-flight = 4\n\
             [chain]\nmax-depth = 8\n"
        ),
    )
    .expect("write config");
    let cfg_s = cfg.to_str().expect("utf-8 path");

    // File only (named by the flag): file values, defaults elsewhere.
    let v = ok_json(dir, &["config", "show", "--config", cfg_s, "--json"], &[]);
    assert_eq!(setting(&v, "config").1, "flag");
    assert_eq!(setting(&v, "store"), (store.clone(), "file".into()));
    assert_eq!(
        setting(&v, "budget"),
        ("50.0 GiB (53687091200 bytes)".into(), "file".into())
    );
    assert_eq!(setting(&v, "grace"), ("2h".into(), "file".into()));
    assert_eq!(setting(&v, "max-chain-depth"), ("8".into(), "file".into()));
    assert_eq!(setting(&v, "cold-start"), ("load".into(), "default".into()));
    assert_eq!(
        setting(&v, "max-base-depth"),
        ("1024".into(), "default".into())
    );
    assert_eq!(
        setting(&v, "part-bytes"),
        ("16.0 MiB (16777216 bytes)".into(), "file".into())
    );
    assert_eq!(setting(&v, "parts-in-flight"), ("4".into(), "file".into()));

    // The file named by DELTAPACK_CONFIG; env beats file; flag beats env.
    let env = [
        ("DELTAPACK_CONFIG", cfg_s),
        ("DELTAPACK_GRACE", "30m"),
        ("DELTAPACK_BUDGET", "1TB"),
        ("DELTAPACK_MAX_BASE_DEPTH", "77"),
        ("DELTAPACK_PARTS_IN_FLIGHT", "9"),
        ("DELTAPACK_PART_BYTES", "32MiB"),
    ];
    let v = ok_json(
        dir,
        &words("config show --budget 2GiB --part-bytes 6MiB --json"),
        &env,
    );
    assert_eq!(setting(&v, "parts-in-flight"), ("9".into(), "env".into()));
    assert_eq!(
        setting(&v, "part-bytes"),
        ("6.0 MiB (6291456 bytes)".into(), "flag".into())
    );
    assert_eq!(setting(&v, "config").1, "env");
    assert_eq!(setting(&v, "grace"), ("30m".into(), "env".into()));
    assert_eq!(
        setting(&v, "budget"),
        ("2.0 GiB (2147483648 bytes)".into(), "flag".into())
    );
    assert_eq!(setting(&v, "max-base-depth"), ("77".into(), "env".into()));
    assert_eq!(setting(&v, "min-free").1, "file");
    assert_eq!(
        setting(&v, "max-extent-bytes"),
        ("16.0 MiB (16777216 bytes)".into(), "file".into())
    );

    // The opened store uses what was resolved: the store URL and budget
    // from the file, then the budget from the environment.
    let stats = ok_json(dir, &["stats", "--config", cfg_s, "--json"], &[]);
    assert_eq!(stats["budget_bytes"], 50u64 << 30, "{stats}");
    let stats = ok_json(
        dir,
        &["stats", "--json"],
        &[("DELTAPACK_CONFIG", cfg_s), ("DELTAPACK_BUDGET", "1.5TB")],
    );
    assert_eq!(stats["budget_bytes"], 1_500_000_000_000u64, "{stats}");
    assert!(
        dir.join("store").is_dir(),
        "the file's store URL was opened"
    );
}

#[test]
fn bad_files_and_units_are_refused_and_nothing_is_opened() {
    let (tmp, store) = scratch();
    let dir = tmp.path();
    for (text, needle) in [
        ("budgett = \"1G\"\n", "budgett"),
        ("budget = \"lots\"\n", "lots"),
        ("cold-start = \"clear\"\n", "clear"),
        ("grace = \"soon\"\n", "soon"),
        ("compress = 99\n", "compress"),
        ("part-bytes = \"1MiB\"\n", "part-bytes"),
        ("parts-in-flight = 0\n", "parts-in-flight"),
    ] {
        let cfg = dir.join("bad.toml");
        std::fs::write(&cfg, format!("store = \"{store}\"\n{text}")).expect("write");
        let out = run(
            dir,
            &["stats", "--config", cfg.to_str().expect("utf-8"), "--json"],
            &[],
        );
        assert_eq!(out.status.code(), Some(1), "{text}");
        let err: serde_json::Value =
            serde_json::from_slice(&out.stderr).expect("a JSON error on stderr");
        assert_eq!(err["error"]["kind"], "config", "{text}: {err}");
        assert!(err.to_string().contains(needle), "{text}: {err}");
        assert!(out.stdout.is_empty(), "nothing on stdout: {text}");
        assert!(!dir.join("store").exists(), "no store was created: {text}");
    }
    // A missing file is an error too, not silently the defaults.
    let out = run(dir, &["config", "show", "--config", "nope.toml"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.toml"));

    // Units on flags: accepted with units, usage errors (exit 2) without.
    let v = ok_json(
        dir,
        &words(&format!(
            "config show --store {store} --budget 1.5TB --grace 1h30m --min-free 10GiB --json"
        )),
        &[],
    );
    assert_eq!(setting(&v, "budget").0, "1.4 TiB (1500000000000 bytes)");
    assert_eq!(setting(&v, "grace").0, "1h 30m");
    assert_eq!(setting(&v, "min-free").0, "10.0 GiB (10737418240 bytes)");
    for bad in [
        ["--budget", "lots"],
        ["--budget", "99999999999999999999TB"],
        ["--grace", "soon"],
    ] {
        let mut args = vec!["config", "show", "--store", &store];
        args.extend(bad);
        let out = run(dir, &args, &[]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
    // A store command without any store named is a usage error that says
    // how to name one.
    let out = run(dir, &["stats"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("DELTAPACK_STORE"), "{err}");
}

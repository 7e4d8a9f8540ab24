//! A credential in the ledger URL never leaves the process: not into the
//! store (its binding records the ledger's identity — engine, host, port,
//! database — not the connection string), not into any command's output,
//! not into the logs (at `debug`), not into an error.
//!
//! Why: with `--ledger 'postgres://…/db?sslmode=disable&password=…'`, the
//! bucket's `ledger/binding.json` held the password in clear and
//! `ledger show` printed it; only the user-info password was redacted. A
//! binding written that way by an older version is rewritten without the
//! secret at the owner's next check. Real processes, the PostgreSQL server
//! `.ci/run` starts (trust authentication: it accepts the URL's password
//! and ignores it), a local store whose every file is searched.

use std::path::Path;

use crate::common::{code_and_text, command, fleet, local_store};

/// Every secret the test puts in a URL (each unique, so a hit names its
/// source).
const SECRETS: &[&str] = &[
    "userinfoHunter1",
    "queryHunter2",
    "sslHunter3",
    "badHunter4",
    "oldHunter5",
];

/// Runs `deltapack` in `dir` with debug logs; (code, stdout, stderr).
fn run(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = command()
        .env("RUST_LOG", "debug")
        .env_remove("DELTAPACK_LEDGER")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run deltapack");
    code_and_text(&out)
}

/// Fails if any secret is in `text` (`what` names where it came from).
fn assert_clean(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{s} leaked into {what}:\n{text}");
    }
}

/// Fails if any secret is in a file below `dir`.
fn assert_files_clean(dir: &Path) {
    let files = crate::common::files_below(dir);
    assert!(!files.is_empty(), "nothing below {}", dir.display());
    for f in files {
        let bytes = std::fs::read(&f).expect("read");
        for s in SECRETS {
            assert!(
                !bytes.windows(s.len()).any(|w| w == s.as_bytes()),
                "{s} leaked into {}",
                f.display()
            );
        }
    }
}

#[test]
fn a_ledger_credential_is_never_written_or_printed() {
    let Some((_, ledger)) = fleet("secrets") else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let store = local_store(dir);
    let id = crate::common::Cli(dir).ok("identity --example");
    std::fs::write(dir.join("id.json"), id).expect("id");
    crate::common::Cli(dir)
        .ok("synth --preset tiny --seed 3 --tokens 512 --out a.snap --tokens-out a.tok");

    // The fleet URL with a password in the user-info and in the query.
    let url = format!(
        "{}&sslmode=disable&password=queryHunter2&application_name=secrets",
        ledger.replacen("://postgres@", "://postgres:userinfoHunter1@", 1)
    );
    // Runs a command line with the store and the secret-laden ledger URL
    // added; it must succeed and show no secret on stdout or in its logs.
    let ok = |line: &str| {
        let mut args: Vec<&str> = line.split_whitespace().collect();
        args.extend(["--store", store.as_str(), "--ledger", url.as_str()]);
        let (code, out, err) = run(dir, &args);
        assert_eq!(code, 0, "deltapack {line}: {err}");
        assert_clean(&format!("the stdout of {line}"), &out);
        assert_clean(&format!("the logs of {line}"), &err);
        out
    };
    let publish = "publish --identity id.json --tokens a.tok --snapshot a.snap";
    ok(publish);
    ok("restore --identity id.json --tokens a.tok --out r.snap");
    ok("lookup --identity id.json --tokens a.tok");
    for line in [
        "stats",
        "stats --prometheus",
        "config show",
        "config show --json",
        "sweep --json",
        "ledger show",
    ] {
        ok(line);
    }
    let shown = ok("ledger show --json");
    // The binding names the ledger by its identity.
    let v: serde_json::Value = serde_json::from_str(&shown).expect("json");
    let host_port = ledger
        .split("://postgres@")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("host:port");
    let want = format!("postgres://{host_port}/deltapack_test");
    assert_eq!(
        v["binding"]["store_ledger"]["description"],
        want.as_str(),
        "{v}"
    );

    // Errors: a URL the ledger refuses (a parameter given twice, in any
    // encoding), one of another scheme, a client key's passphrase.
    for bad in [
        format!("{url}&ssl%6Dode=require"),
        "mysql://u:badHunter4@h/db?password=badHunter4".to_string(),
        format!("{url}&sslpassword=sslHunter3"),
    ] {
        let with_bad = |line: &str| {
            let mut args: Vec<&str> = line.split_whitespace().collect();
            args.extend(["--store", store.as_str(), "--ledger", bad.as_str()]);
            run(dir, &args)
        };
        let (code, out, err) =
            with_bad("lookup --identity id.json --tokens a.tok --ledger-deadline 5s");
        assert_clean(
            &format!("lookup with {bad}"),
            &format!("{code} {out} {err}"),
        );
        let (code, out, err) = with_bad(publish);
        assert_ne!(code, 0, "{bad}: {out}");
        assert_clean(&format!("publish with {bad}"), &format!("{out} {err}"));
    }

    assert_files_clean(&dir.join("store"));

    // A binding an older version wrote with the connection string in it is
    // rewritten without the secret at the owner's next check.
    let binding = dir.join("store/ledger/binding.json");
    let mut b: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&binding).expect("binding")).expect("json");
    b["description"] = serde_json::Value::String(format!(
        "postgres://postgres:***@{host_port}/deltapack_test?sslmode=disable&password=oldHunter5"
    ));
    let mut text = serde_json::to_vec(&b).expect("json");
    text.push(b'\n');
    std::fs::write(&binding, text).expect("write");
    ok("ledger show --json");
    ok(publish);
    assert_files_clean(&dir.join("store"));
    let v: serde_json::Value = serde_json::from_str(&ok("ledger show --json")).expect("json");
    assert_eq!(
        v["binding"]["store_ledger"]["description"],
        want.as_str(),
        "{v}"
    );
}

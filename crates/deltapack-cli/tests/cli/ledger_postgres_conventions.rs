//! A PostgreSQL ledger behaves as a PostgreSQL client should: an error
//! carries the server's message and SQLSTATE (not the driver's "db error"
//! or "invalid configuration"), with a hint for the failures a new
//! operator meets first; and the password can come from where libpq takes
//! it — `PGPASSWORD`, or a private password file (`PGPASSFILE`, else
//! `~/.pgpass`) — with the URL's own password winning.
//!
//! Why: following the README, a URL without a password gave `invalid
//! configuration`, a wrong password and a PostgreSQL 15 database whose
//! `public` schema the role cannot create in both gave `db error`, and
//! `PGPASSWORD` did nothing. Real processes against the server `.ci/run`
//! starts, whose role `deltapack_pw` must give a password (scram-sha-256)
//! and owns a database of its own (`DELTAPACK_TEST_POSTGRES_PASSWORD_URL`,
//! `DELTAPACK_TEST_POSTGRES_PASSWORD`).

use std::path::Path;

use crate::common::{code_and_text, command, local_store};

/// The password role's URL (no password in it) and its password, if the
/// test server has them.
fn password_role() -> Option<(String, String)> {
    let (Ok(url), Ok(pw)) = (
        std::env::var("DELTAPACK_TEST_POSTGRES_PASSWORD_URL"),
        std::env::var("DELTAPACK_TEST_POSTGRES_PASSWORD"),
    ) else {
        assert!(
            std::env::var("CI").map(|v| v != "true").unwrap_or(true),
            "CI=true but the PostgreSQL password role is not configured"
        );
        eprintln!("PostgreSQL password role not configured: skipping");
        return None;
    };
    Some((url, pw))
}

/// `deltapack stats` against a local store in `dir` and the ledger at
/// `ledger`, with `env` set and every other libpq variable (and the home
/// directory's password file) out of the way; (code, stdout, stderr).
fn stats(dir: &Path, ledger: &str, env: &[(&str, &str)]) -> (i32, String, String) {
    let store = local_store(dir);
    let mut c = command();
    for v in ["PGPASSWORD", "PGPASSFILE", "PGUSER", "DELTAPACK_LEDGER"] {
        c.env_remove(v);
    }
    c.env("HOME", dir);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c
        .args(["stats", "--store", &store, "--ledger", ledger])
        .current_dir(dir)
        .output()
        .expect("run deltapack");
    code_and_text(&out)
}

/// `url` in a fresh schema of its database (made with `password`), so
/// that a fresh store gets a ledger of its own: one schema per store, as
/// the README recommends.
fn fresh(url: &str, password: &str, name: &str) -> String {
    let schema = format!("{name}_{}", std::process::id());
    let mut c = postgres::Client::connect(&with_password(url, password), postgres::NoTls)
        .expect("connect as the password role");
    c.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
    ))
    .expect("schema");
    format!("{url}?options=-c%20search_path%3D{schema}")
}

/// `url` naming the database `db` instead.
fn on_database(url: &str, db: &str) -> String {
    let (server, _) = url.rsplit_once('/').expect("a database in the URL");
    format!("{server}/{db}")
}

/// `url` with `password` in its user-info.
fn with_password(url: &str, password: &str) -> String {
    url.replacen(
        "://deltapack_pw@",
        &format!("://deltapack_pw:{password}@"),
        1,
    )
}

/// A private password file in `dir` holding `line`.
fn password_file(dir: &Path, name: &str, line: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("# deltapack test\n{line}\n")).expect("write");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    p
}

#[test]
fn the_password_comes_from_where_libpq_takes_it_and_the_url_wins() {
    let Some((url, pw)) = password_role() else {
        return;
    };
    // In the URL.
    let tmp = tempfile::tempdir().expect("tmp");
    let ledger = fresh(&url, &pw, "pw_url");
    let (code, _, err) = stats(tmp.path(), &with_password(&ledger, &pw), &[]);
    assert_eq!(code, 0, "password in the URL: {err}");
    // In PGPASSWORD.
    let tmp = tempfile::tempdir().expect("tmp");
    let ledger = fresh(&url, &pw, "pw_env");
    let (code, _, err) = stats(tmp.path(), &ledger, &[("PGPASSWORD", &pw)]);
    assert_eq!(code, 0, "PGPASSWORD: {err}");
    // The URL's password wins over PGPASSWORD.
    let tmp = tempfile::tempdir().expect("tmp");
    let ledger = fresh(&url, &pw, "pw_url_first");
    let (code, _, err) = stats(
        tmp.path(),
        &with_password(&ledger, &pw),
        &[("PGPASSWORD", "wrong")],
    );
    assert_eq!(code, 0, "the URL's password first: {err}");
    // In PGPASSFILE, and in ~/.pgpass.
    let tmp = tempfile::tempdir().expect("tmp");
    let file = password_file(
        tmp.path(),
        "passwords",
        &format!("127.0.0.1:*:*:deltapack_pw:{pw}"),
    );
    let ledger = fresh(&url, &pw, "pw_file");
    let (code, _, err) = stats(
        tmp.path(),
        &ledger,
        &[("PGPASSFILE", file.to_str().expect("utf-8"))],
    );
    assert_eq!(code, 0, "PGPASSFILE: {err}");
    let tmp = tempfile::tempdir().expect("tmp");
    password_file(tmp.path(), ".pgpass", &format!("*:*:*:deltapack_pw:{pw}"));
    let ledger = fresh(&url, &pw, "pw_home");
    let (code, _, err) = stats(tmp.path(), &ledger, &[]);
    assert_eq!(code, 0, "~/.pgpass: {err}");
}

#[test]
fn a_refused_connection_says_what_the_server_said_and_what_to_do() {
    let Some((url, pw)) = password_role() else {
        return;
    };
    let cases: Vec<(String, &[&str])> = vec![
        // No password anywhere.
        (
            url.clone(),
            &["password missing", "asks for a password", "PGPASSWORD"],
        ),
        // The wrong one.
        (
            with_password(&url, "not-the-password"),
            &[
                "password authentication failed",
                "28P01",
                "refused the password",
            ],
        ),
        // A database that does not exist.
        (
            on_database(&with_password(&url, &pw), "no_such_database"),
            &["does not exist", "3D000", "CREATE DATABASE"],
        ),
        // PostgreSQL 15: the role may connect to the test database but not
        // create its tables in `public` there.
        (
            on_database(&with_password(&url, &pw), "deltapack_test"),
            &["permission denied", "42501", "CREATE on its schema"],
        ),
    ];
    for (ledger, want) in cases {
        let tmp = tempfile::tempdir().expect("tmp");
        let (code, out, err) = stats(tmp.path(), &ledger, &[]);
        assert_ne!(code, 0, "{ledger}: {out}");
        for w in want {
            assert!(err.contains(w), "{ledger}: no {w:?} in\n{err}");
        }
        assert!(!err.contains("db error\n"), "{err}");
        assert!(!err.contains(&pw), "the password was shown: {err}");
    }
}

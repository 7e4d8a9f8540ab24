//! A fresh PostgreSQL schema for one test, in the test database `.ci/run`
//! starts (`DELTAPACK_TEST_POSTGRES`). Owns the one way the store's tests
//! get a PostgreSQL ledger URL: the integration tests through
//! `common::postgres_ledger_url`, the ledger's unit tests (which include
//! this file by path) directly.

/// The URL of the new, empty schema `schema` in the test database, if
/// `DELTAPACK_TEST_POSTGRES` is set. In CI (`CI=true`) a missing server is
/// a failure, not a skip.
pub(crate) fn fresh_schema(schema: &str) -> Option<String> {
    let base = match std::env::var("DELTAPACK_TEST_POSTGRES") {
        Ok(u) if !u.is_empty() => u,
        _ => {
            assert!(
                std::env::var("CI").map(|v| v != "true").unwrap_or(true),
                "CI=true but DELTAPACK_TEST_POSTGRES is not set"
            );
            eprintln!("DELTAPACK_TEST_POSTGRES not set: skipping the PostgreSQL ledger (run `bash .ci/run` for the full suite)");
            return None;
        }
    };
    Some(fresh_schema_on(&base, schema))
}

/// The URL of the new, empty schema `schema` in the database at `base`.
pub(crate) fn fresh_schema_on(base: &str, schema: &str) -> String {
    // The blocking client runs its own runtime: not on an async worker.
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut c = postgres::Client::connect(base, postgres::NoTls)
                .expect("connect to the test PostgreSQL");
            c.batch_execute(&format!("CREATE SCHEMA {schema}"))
                .expect("create schema");
        })
        .join()
        .expect("create schema");
    });
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options=-c%20search_path%3D{schema}")
}

//! A fleet ledger crosses the network, so it is reached over TLS when the
//! URL says so, and a connection that cannot be secured as asked is refused
//! before a single query.
//!
//! Why: managed PostgreSQL services require TLS, and a ledger that silently
//! fell back to plaintext (or trusted any certificate under `verify-full`)
//! would hand the fleet's account — and its deletion claims — to whoever sits
//! on the path. Run against two real PostgreSQL servers started by `.ci/run`:
//! the plaintext one every other ledger test uses, and one that accepts only
//! TLS (`hostssl` in pg_hba.conf, so a connection that succeeds is encrypted)
//! with a certificate for `localhost` signed by a CA the harness made.

use deltapack_store::{Store, StoreError};

use crate::common::*;

/// The TLS-only server's port and CA files, if the harness started it. In CI
/// a missing server is a failure, not a skip.
fn tls_server() -> Option<(String, String, String)> {
    let port = std::env::var("DELTAPACK_TEST_POSTGRES_TLS_PORT").ok();
    let ca = std::env::var("DELTAPACK_TEST_POSTGRES_CA").ok();
    let wrong = std::env::var("DELTAPACK_TEST_POSTGRES_WRONG_CA").ok();
    match (port, ca, wrong) {
        (Some(p), Some(c), Some(w)) => Some((p, c, w)),
        _ => {
            assert!(
                std::env::var("CI").is_err(),
                "CI must start the TLS PostgreSQL server (.ci/run)"
            );
            None
        }
    }
}

/// Opens a memory store whose ledger is `url` and makes the ledger connect.
/// The ledger's hint for a failure, if the failure is the ledger's.
fn ledger_hint(e: &StoreError) -> Option<&'static str> {
    match e {
        StoreError::Ledger(l) | StoreError::LedgerUnavailable(l) => l.hint(),
        _ => None,
    }
}

async fn connect(url: &str) -> Result<deltapack_store::Totals, StoreError> {
    let s = Store::open("memory://", config().with_ledger(Some(url.to_string())))?;
    s.ledger_totals().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_connects_with_the_right_ca_and_refuses_everything_else() {
    let Some((port, ca, wrong)) = tls_server() else {
        return;
    };
    let url = |host: &str, mode: &str, ca: &str| {
        format!("postgres://postgres@{host}:{port}/deltapack_test?sslmode={mode}&sslrootcert={ca}")
    };
    // The right CA and host name: connected (and encrypted: the server
    // accepts nothing else), and the ledger works end to end.
    connect(&url("localhost", "verify-full", &ca))
        .await
        .expect("verify-full with the right CA");
    let s = Store::open(
        "memory://",
        config().with_ledger(Some(url("localhost", "verify-full", &ca))),
    )
    .expect("store");
    let id = identity("ledger-tls");
    let (c, snap) = (ctx(&id, 91, 2048), turn(91, 2048));
    publish_base(&s, &id, c, snap.clone(), deltapack_store::RootFormat::V2).await;
    assert_eq!(restore_bytes(&s, &id, c).await, snap.encoded());
    assert!(s.ledger_totals().await.expect("totals").roots >= 1);

    // A CA the server's certificate does not chain to.
    let e = connect(&url("localhost", "verify-full", &wrong))
        .await
        .expect_err("a wrong CA must not connect");
    // The message says what the handshake found, not only that it failed;
    // the hint says what to do.
    let text = e.to_string();
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    let hint = ledger_hint(&e).unwrap_or_default();
    assert!(hint.contains("does not chain to the CA"), "{text}: {hint}");

    // The right CA, but a host the certificate does not name: verify-full
    // checks the name, verify-ca does not.
    let e = connect(&url("127.0.0.1", "verify-full", &ca))
        .await
        .expect_err("verify-full must check the host name");
    let text = e.to_string();
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    let hint = ledger_hint(&e).unwrap_or_default();
    assert!(hint.contains("does not name the host"), "{text}: {hint}");
    connect(&url("127.0.0.1", "verify-ca", &ca))
        .await
        .expect("verify-ca checks the chain, not the name");

    // A missing CA file is an error at open, naming the file.
    let e = connect(&url("localhost", "verify-full", "/nonexistent/ca.pem"))
        .await
        .expect_err("missing CA file");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");

    // Plaintext to the TLS-only server is refused by the server.
    let plain = format!("postgres://postgres@localhost:{port}/deltapack_test?sslmode=disable");
    assert!(connect(&plain).await.is_err(), "the server takes TLS only");
}

/// A server that offers no TLS fails `require` (and stronger) closed: no
/// fallback to plaintext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_against_a_plaintext_server_fails_closed() {
    let (Some(_), Some(plain)) = (tls_server(), postgres_ledger_url()) else {
        return;
    };
    let sep = if plain.contains('?') { '&' } else { '?' };
    for mode in ["require", "verify-full"] {
        let ca = std::env::var("DELTAPACK_TEST_POSTGRES_CA").expect("ca");
        let url = format!("{plain}{sep}sslmode={mode}&sslrootcert={ca}");
        let e = connect(&url)
            .await
            .expect_err("a plaintext server must not satisfy sslmode=require");
        assert!(matches!(e, StoreError::Ledger(_)), "{mode}: {e}");
    }
}

/// The TLS parameters are read as the driver reads them: a percent-encoded
/// name is that name (`ssl%6Dode=verify-full` checks the host name, as
/// `sslmode=verify-full` does), a name given twice in any encoding is
/// refused before connecting (it used to be matched as raw text, so
/// `…sslmode=verify-full&ssl%6Dode=disable` connected without TLS), and
/// the environment (`PGSSLMODE=disable`) weakens nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_mode_cannot_be_weakened_by_encoding_repetition_or_environment() {
    let Some((port, ca, _)) = tls_server() else {
        return;
    };
    let base = |host: &str| format!("postgres://postgres@{host}:{port}/deltapack_test");
    for extra in [
        "ssl%6Dode=disable",
        "sslmode=disable",
        "%73%73%6C%6D%6F%64%65=prefer",
        "SSLMODE=disable&sslmode=disable",
    ] {
        let url = format!(
            "{}?sslmode=verify-full&sslrootcert={ca}&{extra}",
            base("localhost")
        );
        let e = connect(&url).await.expect_err(extra);
        assert!(e.to_string().contains("given twice"), "{extra}: {e}");
    }
    // An encoded name is the name: verify-full, so the wrong host name is
    // refused and the right one connects.
    let e = connect(&format!(
        "{}?ssl%6Dode=verify-full&sslroot%63ert={ca}",
        base("127.0.0.1")
    ))
    .await
    .expect_err("verify-full must check the host name");
    let text = format!("{e} {:?}", std::error::Error::source(&e));
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    connect(&format!(
        "{}?ssl%6Dode=verify-full&sslroot%63ert={ca}",
        base("localhost")
    ))
    .await
    .expect("an encoded verify-full with the right CA");
    // The environment is not read: PGSSLMODE=disable changes nothing (the
    // server accepts TLS only, and the host name is still checked).
    std::env::set_var("PGSSLMODE", "disable");
    let e = connect(&format!(
        "{}?sslmode=verify-full&sslrootcert={ca}",
        base("127.0.0.1")
    ))
    .await
    .expect_err("PGSSLMODE must not weaken verify-full");
    let text = format!("{e} {:?}", std::error::Error::source(&e));
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    connect(&format!(
        "{}?sslmode=verify-full&sslrootcert={ca}",
        base("localhost")
    ))
    .await
    .expect("verify-full under PGSSLMODE=disable");
    std::env::remove_var("PGSSLMODE");
}

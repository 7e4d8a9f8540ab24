//! A PostgreSQL ledger that accepts connections and never answers (a hung
//! server, a full connection queue, a black-holed load balancer) bounds
//! every call: a connection's whole start-up has a deadline (the URL's
//! `connect_timeout`), so each call returns `LedgerUnavailable` instead of
//! hanging, reads still answer from the store, and the connection threads
//! end instead of piling up.
//!
//! Why: `connect_timeout` covered only the TCP connect. Against such a
//! listener every attempt left a ledger thread and a blocking-pool thread
//! stuck for ever (a Python handle calling `lookup` every 100 ms went from
//! 3 to 63 threads in 30 s), publication never returned, and the CLI never
//! exited. The listener here is a real TCP socket that accepts and holds
//! every connection without writing a byte.

use std::io::Read;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use deltapack_store::{RootFormat, Store, StoreError};

use crate::common::*;

/// A TCP listener on 127.0.0.1 that accepts every connection and never
/// answers (each accepted socket is held, its input drained). Its port.
pub(crate) fn black_hole() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 4096];
                while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    port
}

/// The ledger threads of this process still alive that talk to `port`.
fn ledger_threads(port: u16) -> usize {
    let name = format!("ledger-pg:{port}");
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == name)
                })
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_never_answers_bounds_every_call() {
    let port = black_hole();
    let url = format!("postgres://postgres@127.0.0.1:{port}/db?sslmode=disable&connect_timeout=1");
    let s = Store::open("memory://", config().with_ledger(Some(url))).expect("store");
    let id = identity("half-open");
    let (c, snap) = (ctx(&id, 5, 1024), turn(5, 1024));
    let t0 = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        for _ in 0..6 {
            let e = s.ledger_totals().await.expect_err("no ledger");
            assert!(matches!(e, StoreError::LedgerUnavailable { .. }), "{e}");
        }
        let e = s
            .publish(flat(&id, c, &snap, RootFormat::V2))
            .await
            .expect_err("publication needs the ledger");
        assert!(matches!(e, StoreError::LedgerUnavailable { .. }), "{e}");
        // Reads answer from the store without waiting on the ledger
        // beyond its deadline.
        let _ = s
            .restore((&id, c), Default::default())
            .await
            .expect("restore");
    })
    .await;
    assert!(outcome.is_ok(), "a call hung on the black-holed ledger");
    // Seven attempts of at most a second each (plus margins), not seven
    // hangs: bounded by the deadline, not by the test's patience.
    assert!(t0.elapsed() < Duration::from_secs(45), "{:?}", t0.elapsed());
    // Every connection attempt's thread has ended.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ledger_threads(port), 0, "ledger threads left behind");
}

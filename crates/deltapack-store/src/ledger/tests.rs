//! Unit tests of the ledger (both engines where a PostgreSQL server is
//! given).

use std::time::{SystemTime, UNIX_EPOCH};

use deltapack_format::{ContextDigest, Namespace};
use rusqlite::Connection;

use super::db::V;
use super::roots::{hexpair, parse_pair};
use super::schema::LEDGER_VERSION;
use super::*;

#[path = "../../tests/store/common/pg.rs"]
mod pg;

/// Publication ids come from the database's sequence. The ids they
/// replace (`pid << 32 ^ seq << 1 ^ now_ms`) collided within one
/// process — e.g. seq 1 at a millisecond ending in binary 100 and
/// seq 2 two milliseconds later (…010) both give …110 — and one
/// publication's end then dropped the other's protections. Two
/// handles (two processes' connections) on one file, in a tight loop.
#[test]
fn publication_ids_never_collide_in_a_tight_loop() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("ledger.sqlite3");
    ids_never_collide(
        Ledger::open_file(&path).expect("open a"),
        Ledger::open_file(&path).expect("open b"),
    );
    if let Some(url) = postgres_url() {
        ids_never_collide(
            Ledger::open_postgres(&url).expect("open a"),
            Ledger::open_postgres(&url).expect("open b"),
        );
    }
}

/// `try_bases_below` follows base links down a chain, ends on a forged
/// cycle, honours its limit, answers the same on both engines, and
/// never waits for a busy connection.
#[test]
fn bases_below_follow_links_and_end_on_cycles() {
    bases_below(Ledger::open_memory().expect("memory"));
    if let Some(url) = postgres_url() {
        bases_below(Ledger::open_postgres(&url).expect("postgres"));
    }
}

fn bases_below(l: Ledger) {
    type Id = (Namespace, ContextDigest);
    let id = |n: u8| -> Id { (Namespace([1; 32]), ContextDigest([n; 32])) };
    let add = |r: Id, base: Option<Id>| {
        let (ns, ctx) = hexpair(&r.0, &r.1);
        let (bn, bc) = match base {
            Some(b) => {
                let (a, c) = hexpair(&b.0, &b.1);
                (V::from(a), V::from(c))
            }
            None => (V::NullT, V::NullT),
        };
        l.write(|db| {
            db.exec(
                "INSERT INTO roots(ns, ctx, schema, kind, boundary, base_ns, base_ctx, root_bytes, last_access)
                 VALUES (?1, ?2, 's', 'v2', 0, ?3, ?4, 1, 0)",
                &[V::from(&ns), V::from(&ctx), bn.clone(), bc.clone()],
            )
        })
        .expect("insert");
    };
    // 1 ← 2 ← 3 ← 4; a forged cycle 5 ↔ 6, and 7 on top of it.
    add(id(1), None);
    add(id(2), Some(id(1)));
    add(id(3), Some(id(2)));
    add(id(4), Some(id(3)));
    add(id(5), Some(id(6)));
    add(id(6), Some(id(5)));
    add(id(7), Some(id(6)));
    let below = |r: Id, limit: u64| {
        let mut v = l
            .try_bases_below(&r.0, &r.1, limit)
            .expect("query")
            .expect("connection free");
        v.sort();
        v
    };
    assert_eq!(below(id(4), 64), vec![id(1), id(2), id(3)]);
    assert_eq!(below(id(2), 64), vec![id(1)]);
    assert_eq!(below(id(1), 64), Vec::<Id>::new());
    assert_eq!(below(id(7), 64), vec![id(5), id(6)]);
    assert_eq!(below(id(4), 2).len(), 2);
    assert_eq!(below(id(9), 64), Vec::<Id>::new());
    // Another user of the connection: no answer, and no wait.
    let held = l.db.lock().expect("lock");
    assert_eq!(
        l.try_bases_below(&id(4).0, &id(4).1, 64).expect("query"),
        None
    );
    drop(held);
}

/// A fresh schema in the test PostgreSQL database, if configured (in CI
/// it must be).
fn postgres_url() -> Option<String> {
    pg::fresh_schema(&format!(
        "u_{}_{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ))
}

/// Two handles (two processes' connections) on one ledger, 500 ids
/// each, taken at once.
fn ids_never_collide(a: Ledger, b: Ledger) {
    let until = now_ms() + 60_000;
    let ids: Vec<Vec<i64>> = std::thread::scope(|s| {
        let ta = s.spawn(|| {
            (0..500)
                .map(|_| a.begin_publication(until).expect("a"))
                .collect()
        });
        let tb = s.spawn(|| {
            (0..500)
                .map(|_| b.begin_publication(until).expect("b"))
                .collect()
        });
        vec![ta.join().expect("a"), tb.join().expect("b")]
    });
    let all: std::collections::HashSet<i64> = ids.iter().flatten().copied().collect();
    assert_eq!(all.len(), 1000, "publication ids collided");
    // Ending one publication leaves another's protections in place.
    let (p, q) = (ids[0][0], ids[1][0]);
    a.protect(p, &["objects/k1".into()], until)
        .expect("protect p");
    b.protect(q, &["objects/k2".into()], until)
        .expect("protect q");
    a.end_publication(p).expect("end p");
    assert!(!b.is_used("objects/k1").expect("used"));
    assert!(
        b.is_used("objects/k2").expect("used"),
        "q lost its protection"
    );
}

/// The tables of ledger version 1, as that version created them.
const V1_SCHEMA: &str = "
CREATE TABLE meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE roots(
ns TEXT NOT NULL, ctx TEXT NOT NULL, schema TEXT NOT NULL, kind TEXT NOT NULL,
boundary INTEGER NOT NULL, base_ns TEXT, base_ctx TEXT,
root_bytes INTEGER NOT NULL, last_access INTEGER NOT NULL,
PRIMARY KEY(ns, ctx));
CREATE INDEX roots_lru ON roots(last_access);
CREATE INDEX roots_base ON roots(base_ns, base_ctx);
CREATE TABLE refs(ns TEXT NOT NULL, ctx TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY(ns, ctx, key));
CREATE INDEX refs_key ON refs(key);
CREATE TABLE objects(key TEXT PRIMARY KEY, bytes INTEGER NOT NULL, refs INTEGER NOT NULL, condemned_at INTEGER);
CREATE TABLE holds(name TEXT NOT NULL, ns TEXT NOT NULL, ctx TEXT NOT NULL, PRIMARY KEY(name, ns, ctx));
CREATE TABLE counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE protected(owner INTEGER NOT NULL, key TEXT NOT NULL, until INTEGER NOT NULL, PRIMARY KEY(owner, key));
";

/// A ledger written by version 1 is migrated forward (through 2 and 3);
/// one written by a newer build is refused with a clear message, not
/// misread.
#[test]
fn older_ledgers_migrate_and_newer_ones_are_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("ledger.sqlite3");
    {
        let c = Connection::open(&path).expect("open");
        c.execute_batch(V1_SCHEMA).expect("v1 schema");
        c.execute(
            "INSERT INTO roots(ns, ctx, schema, kind, boundary, root_bytes, last_access)
             VALUES (?1, ?2, 's', 'snapshot', 256, 10, 5)",
            [&"ab".repeat(32), &"cd".repeat(32)],
        )
        .expect("v1 root");
        c.execute(
            "INSERT INTO holds(name, ns, ctx) VALUES ('h', ?1, ?2)",
            [&"ab".repeat(32), &"cd".repeat(32)],
        )
        .expect("v1 hold");
        c.execute("INSERT INTO meta(k, v) VALUES ('version', '1')", [])
            .expect("v1");
        c.execute(
            "INSERT INTO protected(owner, key, until) VALUES (7, 'objects/x', ?1)",
            [now_ms() as i64 + 60_000],
        )
        .expect("old protection");
    }
    let l = Ledger::open_file(&path).expect("migrate");
    let id = l
        .begin_publication(now_ms() + 1000)
        .expect("publications table");
    assert!(id > 0);
    // Old-style protections were dropped (their ids meant nothing).
    assert!(!l.is_used("objects/x").expect("used"));
    drop(l);
    // Rows survive; version 3's columns start at 0 (recorded before
    // any listing, so a rebuild may correct them).
    let c = Connection::open(&path).expect("open");
    let (recorded, since): (i64, i64) = c
        .query_row(
            "SELECT r.recorded_at, h.since FROM roots r JOIN holds h ON h.ns = r.ns AND h.ctx = r.ctx",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("migrated root and hold");
    assert_eq!((recorded, since), (0, 0));
    drop(c);
    // The root index was filled in: lookups find the migrated root.
    let l = Ledger::open_file(&path).expect("reopen");
    let (ns, ctx) = parse_pair(&"ab".repeat(32), &"cd".repeat(32)).expect("pair");
    assert!(l.recorded(&ns, &[ctx]).expect("recorded").contains(&ctx));
    drop(l);
    let c = Connection::open(&path).expect("open");
    let v: String = c
        .query_row("SELECT v FROM meta WHERE k = 'version'", [], |r| r.get(0))
        .expect("version");
    assert_eq!(v, LEDGER_VERSION.to_string());
    c.execute("UPDATE meta SET v = '99' WHERE k = 'version'", [])
        .expect("newer");
    drop(c);
    match Ledger::open_file(&path) {
        Err(LedgerError::Inconsistent(m)) => assert!(m.contains("newer"), "{m}"),
        other => panic!("a newer ledger was opened: {other:?}"),
    }
}

//! The capacity ledger: one account of every root and object, v1 and v2.
//!
//! The ledger tracks each root (namespace, context, schema, kind, boundary,
//! base reference, root size, last access) and each object (key, stored
//! bytes, how many roots reference it, and when it was condemned). An object
//! shared by many roots — a base's extents, identical content — is counted
//! once. Holds (named, persistent protections) are cached here too, but
//! their source of truth is the store (`holds/<name>/<ns>/<ctx>` markers),
//! so the whole ledger is *derived state*: [`crate::Store::rebuild_ledger`] recomputes it
//! from a listing of the store and must agree with the incrementally
//! maintained ledger.
//!
//! **Mechanism: SQLite.** Several processes on one machine (e.g. one per
//! tensor-parallel rank) share one `file://` store, so the ledger must
//! tolerate concurrent writers without corruption or double counting.
//! SQLite gives exactly that: every mutation is one ACID transaction under
//! SQLite's file locking (WAL mode, busy timeout), a crash rolls back a torn
//! transaction, and an embedded library needs no daemon. The alternatives —
//! a journal plus an advisory lock, or a single-process embedded store
//! (redb, sled) — would need their own multi-process protocol. For a local
//! store the database lives at `<store>/ledger/ledger.sqlite3`; for S3 and
//! `memory://` stores each process keeps an in-memory ledger built at open;
//! `s3://` stores keep a SQLite file under the state directory, or share a
//! PostgreSQL ledger across a fleet (`db.rs` runs one set of statements on
//! either engine).
//!
//! **Rebuilds merge.** A rebuild or reconciliation lists the store and
//! merges what it saw ([`Ledger::merge_listing`]): a row recorded after the
//! listing began survives, a root removed after the listing saw it stays
//! removed (a tombstone), and a recorded root is forgotten only when a HEAD
//! after the listing confirms it absent. So a rebuild never needs the root
//! lock and is safe while other processes and nodes publish and evict.
//!
//! **Two-phase deletion.** Removing a root never deletes objects directly:
//! objects whose reference count drops to zero are *condemned* with a
//! timestamp, still count against the budget, and are deleted only after the
//! grace period by [`crate::Store::collect_garbage`]. A publisher that
//! references a condemned object again un-condemns it in the same
//! transaction that records its root, and the garbage collector deletes an
//! object only inside a transaction that re-checks it is still condemned and
//! unreferenced — so on one machine a delete and a re-reference are
//! serialised. See `docs/design.md` for the protocol across machines.

use std::path::Path as FsPath;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deltapack_format::{ContextDigest, LedgerId, Namespace, RootKind, RootSummary};
use rusqlite::Connection;

mod db;
mod tls;
use db::{Db, V};
use serde::Serialize;

/// Errors of the ledger database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// SQLite failed.
    #[error("ledger database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database could not be created.
    #[error("ledger at {path}: {source}")]
    Io {
        /// Where.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// PostgreSQL failed (connection, statement).
    #[error("ledger database (PostgreSQL): {0}")]
    Postgres(#[from] postgres::Error),
    /// A ledger URL that cannot be used.
    #[error("ledger URL {0}")]
    Url(String),
    /// The TLS settings of a PostgreSQL ledger URL cannot be used (a
    /// missing or malformed CA file, an unknown `sslmode`).
    #[error("ledger TLS: {0}")]
    Tls(String),
    /// Stored values are not what this version writes.
    #[error("ledger content is inconsistent: {0}")]
    Inconsistent(String),
    /// The blocking task running a ledger call failed (panicked or was
    /// cancelled at shutdown).
    #[error("ledger task: {0}")]
    Task(String),
}

impl LedgerError {
    /// Whether the ledger could not be reached at all (as opposed to
    /// answering with an error): a connection refused, reset or timed out,
    /// a closed PostgreSQL connection, a statement cancelled by its
    /// timeout, a SQLite file that cannot be opened or is not a database,
    /// a database still busy after every retry.
    pub fn is_unavailable(&self) -> bool {
        use std::io::ErrorKind as K;
        match self {
            LedgerError::Postgres(e) => {
                if e.is_closed() {
                    return true;
                }
                if let Some(db) = e.as_db_error() {
                    // 57014: a statement cancelled by statement_timeout;
                    // 57P01..03: the server is shutting down or starting.
                    return matches!(db.code().code(), "57014" | "57P01" | "57P02" | "57P03");
                }
                let mut source = std::error::Error::source(e);
                while let Some(s) = source {
                    if let Some(io) = s.downcast_ref::<std::io::Error>() {
                        return matches!(
                            io.kind(),
                            K::ConnectionRefused
                                | K::ConnectionReset
                                | K::ConnectionAborted
                                | K::NotConnected
                                | K::TimedOut
                                | K::BrokenPipe
                                | K::UnexpectedEof
                                | K::HostUnreachable
                                | K::NetworkUnreachable
                                | K::AddrNotAvailable
                        );
                    }
                    source = s.source();
                }
                // A connect that timed out carries no I/O error.
                e.to_string().contains("timeout") || e.to_string().contains("timed out")
            }
            LedgerError::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => matches!(
                f.code,
                rusqlite::ErrorCode::CannotOpen
                    | rusqlite::ErrorCode::NotADatabase
                    | rusqlite::ErrorCode::DatabaseBusy
                    | rusqlite::ErrorCode::DatabaseLocked
                    | rusqlite::ErrorCode::SystemIoFailure
                    | rusqlite::ErrorCode::PermissionDenied
                    | rusqlite::ErrorCode::DatabaseCorrupt
            ),
            LedgerError::Io { .. } | LedgerError::Task(_) => true,
            _ => false,
        }
    }
}

/// What to do with a persisted ledger when a store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ColdStart {
    /// Trust a persisted ledger at open, without listing the store, and
    /// reconcile it with the store in the background (see
    /// [`crate::Store::reconcile_ledger`]); an in-memory ledger, or one new
    /// to the store, is built from the store.
    #[default]
    Load,
    /// Always rebuild from the store.
    Rebuild,
    /// Start genuinely empty: delete every root, object and hold.
    Clear,
}

impl std::str::FromStr for ColdStart {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "load" => Ok(ColdStart::Load),
            "rebuild" => Ok(ColdStart::Rebuild),
            "clear" => Ok(ColdStart::Clear),
            other => Err(format!(
                "unknown cold-start policy {other:?} (expected load, rebuild or clear)"
            )),
        }
    }
}

/// One root as the ledger records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RootEntry {
    /// Namespace.
    pub namespace: Namespace,
    /// Context.
    pub context: ContextDigest,
    /// Schema string.
    pub schema: String,
    /// `snapshot` or `delta`.
    pub kind: String,
    /// Result boundary.
    pub boundary: u64,
    /// Base root, for deltas.
    pub base: Option<(Namespace, ContextDigest)>,
    /// Size of the root object.
    pub root_bytes: u64,
    /// `(object key, stored bytes)` of every object it references.
    pub objects: Vec<(String, u64)>,
}

impl RootEntry {
    /// The entry for a decoded root.
    pub(crate) fn from_summary(s: &RootSummary, root_bytes: u64) -> Self {
        RootEntry {
            namespace: s.namespace,
            context: s.context,
            schema: s.schema.to_string(),
            kind: match s.kind {
                RootKind::Snapshot => "snapshot".into(),
                RootKind::Delta => "delta".into(),
            },
            boundary: s.boundary,
            base: s.base.map(|b| (b.namespace, b.context)),
            root_bytes,
            objects: s
                .objects
                .iter()
                .map(|(d, n)| (crate::keys::object_key(d).to_string(), *n))
                .collect(),
        }
    }
}

/// Ledger totals.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct Totals {
    /// Roots.
    pub roots: u64,
    /// Live (referenced) objects.
    pub objects: u64,
    /// Bytes of live objects, each counted once.
    pub object_bytes: u64,
    /// Bytes of root objects.
    pub root_bytes: u64,
    /// Condemned objects awaiting deletion.
    pub condemned_objects: u64,
    /// Bytes of condemned objects (they still occupy storage).
    pub condemned_bytes: u64,
    /// Bytes reserved by publications in progress (their objects and roots
    /// are not recorded yet).
    pub reserved_bytes: u64,
    /// Bytes counted against the budget: live + condemned + roots +
    /// reserved.
    pub used_bytes: u64,
    /// Physical bytes per namespace (objects shared within a namespace
    /// counted once; shared across namespaces counted in each).
    pub per_namespace: Vec<(String, u64)>,
}

/// A root row used by eviction and pruning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RootRow {
    /// Namespace.
    pub namespace: Namespace,
    /// Context.
    pub context: ContextDigest,
    /// Schema string.
    pub schema: String,
    /// Base root.
    pub base: Option<(Namespace, ContextDigest)>,
    /// Last access, ms since the epoch.
    pub last_access_ms: u64,
}

/// One root of a [`LedgerImage`]: namespace, context, schema, kind,
/// boundary, base `(namespace, context)`, root bytes, sorted object keys.
pub(crate) type ImageRoot = (
    String,
    String,
    String,
    String,
    u64,
    Option<(String, String)>,
    u64,
    Vec<String>,
);

/// The comparable content of a ledger (everything but access times).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LedgerImage {
    /// Roots with their references, sorted.
    pub roots: Vec<ImageRoot>,
    /// Objects `(key, bytes, reference count, condemned?)`, sorted.
    pub objects: Vec<(String, u64, u64, bool)>,
    /// Holds `(name, namespace, context)`, sorted.
    pub holds: Vec<(String, String, String)>,
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The tables, SQLite dialect (version [`LEDGER_VERSION`]).
const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS roots(
    ns TEXT NOT NULL, ctx TEXT NOT NULL, schema TEXT NOT NULL, kind TEXT NOT NULL,
    boundary INTEGER NOT NULL, base_ns TEXT, base_ctx TEXT,
    root_bytes INTEGER NOT NULL, last_access INTEGER NOT NULL,
    recorded_at INTEGER NOT NULL DEFAULT 0, ckey INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(ns, ctx));
CREATE INDEX IF NOT EXISTS roots_ckey ON roots(ckey);
CREATE INDEX IF NOT EXISTS roots_lru ON roots(last_access);
CREATE INDEX IF NOT EXISTS roots_base ON roots(base_ns, base_ctx);
CREATE TABLE IF NOT EXISTS refs(ns TEXT NOT NULL, ctx TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY(ns, ctx, key));
CREATE INDEX IF NOT EXISTS refs_key ON refs(key);
CREATE TABLE IF NOT EXISTS objects(key TEXT PRIMARY KEY, bytes INTEGER NOT NULL, refs INTEGER NOT NULL, condemned_at INTEGER);
CREATE TABLE IF NOT EXISTS holds(name TEXT NOT NULL, ns TEXT NOT NULL, ctx TEXT NOT NULL, since INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(name, ns, ctx));
CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS protected(owner INTEGER NOT NULL, key TEXT NOT NULL, until INTEGER NOT NULL, PRIMARY KEY(owner, key));
CREATE TABLE IF NOT EXISTS publications(id INTEGER PRIMARY KEY AUTOINCREMENT, reserved INTEGER NOT NULL, until INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS deleting(key TEXT PRIMARY KEY, since INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS tombstones(kind TEXT NOT NULL, id TEXT NOT NULL, at INTEGER NOT NULL, PRIMARY KEY(kind, id));
";

/// The same tables, PostgreSQL dialect (version [`LEDGER_VERSION`]).
const POSTGRES_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS roots(
    ns TEXT NOT NULL, ctx TEXT NOT NULL, schema TEXT NOT NULL, kind TEXT NOT NULL,
    boundary BIGINT NOT NULL, base_ns TEXT, base_ctx TEXT,
    root_bytes BIGINT NOT NULL, last_access BIGINT NOT NULL,
    recorded_at BIGINT NOT NULL DEFAULT 0, ckey BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY(ns, ctx));
CREATE INDEX IF NOT EXISTS roots_ckey ON roots(ckey);
CREATE INDEX IF NOT EXISTS roots_lru ON roots(last_access);
CREATE INDEX IF NOT EXISTS roots_base ON roots(base_ns, base_ctx);
CREATE TABLE IF NOT EXISTS refs(ns TEXT NOT NULL, ctx TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY(ns, ctx, key));
CREATE INDEX IF NOT EXISTS refs_key ON refs(key);
CREATE TABLE IF NOT EXISTS objects(key TEXT PRIMARY KEY, bytes BIGINT NOT NULL, refs BIGINT NOT NULL, condemned_at BIGINT);
CREATE TABLE IF NOT EXISTS holds(name TEXT NOT NULL, ns TEXT NOT NULL, ctx TEXT NOT NULL, since BIGINT NOT NULL DEFAULT 0, PRIMARY KEY(name, ns, ctx));
CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS protected(owner BIGINT NOT NULL, key TEXT NOT NULL, until BIGINT NOT NULL, PRIMARY KEY(owner, key));
CREATE INDEX IF NOT EXISTS protected_key ON protected(key);
CREATE TABLE IF NOT EXISTS publications(id BIGSERIAL PRIMARY KEY, reserved BIGINT NOT NULL, until BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS deleting(key TEXT PRIMARY KEY, since BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS tombstones(kind TEXT NOT NULL, id TEXT NOT NULL, at BIGINT NOT NULL, PRIMARY KEY(kind, id));
";

/// Migrations: `(version, SQL)` — the SQL takes a ledger of the previous
/// version to this one, per engine. A fresh ledger is created at
/// [`LEDGER_VERSION`] directly.
const SQLITE_MIGRATIONS: &[(u32, &str)] = &[
    // 2: publications get ids from a database sequence (the old
    // `pid << 32 ^ seq << 1 ^ now_ms` ids could collide, and one
    // publication's `unprotect` then dropped another's protections), and
    // carry the bytes they reserved against the budget; objects being
    // deleted from an object store are claimed in `deleting`.
    (
        2,
        "DELETE FROM protected;
         CREATE TABLE IF NOT EXISTS publications(id INTEGER PRIMARY KEY AUTOINCREMENT, reserved INTEGER NOT NULL, until INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS deleting(key TEXT PRIMARY KEY, since INTEGER NOT NULL);",
    ),
    // 3: a rebuild merges instead of replacing. Roots and holds carry when
    // they were recorded (rows recorded after a rebuild's listing began
    // survive it), and removals leave tombstones (a root removed after
    // the listing saw it is not brought back).
    (
        3,
        "ALTER TABLE roots ADD COLUMN recorded_at INTEGER NOT NULL DEFAULT 0;
         ALTER TABLE roots ADD COLUMN ckey INTEGER NOT NULL DEFAULT 0;
         CREATE INDEX IF NOT EXISTS roots_ckey ON roots(ckey);
         ALTER TABLE holds ADD COLUMN since INTEGER NOT NULL DEFAULT 0;
         CREATE TABLE IF NOT EXISTS tombstones(kind TEXT NOT NULL, id TEXT NOT NULL, at INTEGER NOT NULL, PRIMARY KEY(kind, id));",
    ),
];

/// PostgreSQL ledgers start at version 2.
const POSTGRES_MIGRATIONS: &[(u32, &str)] = &[(
    3,
    "ALTER TABLE roots ADD COLUMN IF NOT EXISTS recorded_at BIGINT NOT NULL DEFAULT 0;
     ALTER TABLE roots ADD COLUMN IF NOT EXISTS ckey BIGINT NOT NULL DEFAULT 0;
     CREATE INDEX IF NOT EXISTS roots_ckey ON roots(ckey);
     ALTER TABLE holds ADD COLUMN IF NOT EXISTS since BIGINT NOT NULL DEFAULT 0;
     CREATE TABLE IF NOT EXISTS tombstones(kind TEXT NOT NULL, id TEXT NOT NULL, at BIGINT NOT NULL, PRIMARY KEY(kind, id));",
)];

/// Condemned objects due for deletion: unreferenced, condemned at or before
/// ?1, and not protected by a publication in progress at ?2.
const DUE: &str =
    "SELECT key, bytes FROM objects WHERE refs = 0 AND condemned_at IS NOT NULL AND condemned_at <= ?1
    AND NOT EXISTS (SELECT 1 FROM protected p WHERE p.key = objects.key AND p.until > ?2)";
const STILL_DUE: &str = "SELECT bytes FROM objects WHERE key = ?1 AND refs = 0 AND condemned_at IS NOT NULL
    AND condemned_at <= ?2 AND NOT EXISTS (SELECT 1 FROM protected p WHERE p.key = objects.key AND p.until > ?3)";
const IS_USED: &str = "SELECT COALESCE((SELECT refs FROM objects WHERE key = ?1), 0) > 0
    OR EXISTS (SELECT 1 FROM protected WHERE key = ?1 AND until > ?2)";

/// How long a claim in `deleting` stands: a collector that claimed an
/// object and then died (or hangs) is presumed gone after this, and its
/// claim is taken over or ignored. Far longer than any one DELETE request.
pub(crate) const DELETING_LEASE: Duration = Duration::from_secs(120);

/// Keys among ?2.. claimed for deletion since ?1 (a fresh claim).
const FRESH_CLAIM: &str = "SELECT 1 FROM deleting WHERE key = ?1 AND since > ?2";

/// Ledger format version, bumped when the tables change. An older ledger is
/// migrated forward at open (`*_MIGRATIONS`); a newer one is refused (this
/// build would misread it).
const LEDGER_VERSION: u32 = 3;

/// Bytes reserved by publications in progress (not expired) at `?1`.
const RESERVED: &str =
    "SELECT CAST(COALESCE(SUM(reserved), 0) AS BIGINT) FROM publications WHERE until > ?1";

/// Where a ledger lives, for `ledger show` and messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LedgerLocation {
    /// `sqlite` or `postgres`.
    pub engine: &'static str,
    /// The database: a file path, `:memory:`, or a PostgreSQL URL without
    /// its password.
    pub location: String,
    /// Whether the ledger outlives the process.
    pub persisted: bool,
}

/// The ledger: a cheap handle (clones share one connection).
#[derive(Clone)]
pub(crate) struct Ledger {
    db: Arc<Mutex<Db>>,
    location: LedgerLocation,
    /// The database's own random id (`meta.ledger_id`), chosen when the
    /// database was created: what a store's ledger binding names.
    id: LedgerId,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Ledger({} {})",
            self.location.engine, self.location.location
        )
    }
}

fn hexpair(ns: &Namespace, ctx: &ContextDigest) -> (String, String) {
    (ns.hex(), ctx.hex())
}

/// Records a root inside a write transaction (see [`Ledger::record_root`]).
fn record_in(db: &mut Db, e: &RootEntry, now: u64) -> Result<(), LedgerError> {
    let (ns, ctx) = hexpair(&e.namespace, &e.context);
    let exists = db
        .opt(
            "SELECT 1 FROM roots WHERE ns = ?1 AND ctx = ?2",
            &[V::from(&ns), V::from(&ctx)],
        )?
        .is_some();
    if exists {
        db.exec(
            "UPDATE roots SET last_access = ?3 WHERE ns = ?1 AND ctx = ?2",
            &[V::from(&ns), V::from(&ctx), V::from(now)],
        )?;
        return Ok(());
    }
    let (bns, bctx) = match e.base {
        Some((b, c)) => (Some(b.hex()), Some(c.hex())),
        None => (None, None),
    };
    db.exec(
        "INSERT INTO roots(ns, ctx, schema, kind, boundary, base_ns, base_ctx, root_bytes, last_access, recorded_at, ckey)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10)",
        &[
            V::from(&ns),
            V::from(&ctx),
            V::from(&e.schema),
            V::from(&e.kind),
            V::from(e.boundary),
            V::from(bns),
            V::from(bctx),
            V::from(e.root_bytes),
            V::from(now),
            V::I(ckey(&e.context)),
        ],
    )?;
    db.exec(
        "DELETE FROM tombstones WHERE kind = 'root' AND id = ?1",
        &[V::from(format!("{ns}/{ctx}"))],
    )?;
    for (key, bytes) in &e.objects {
        let fresh = db.exec(
            "INSERT INTO refs(ns, ctx, key) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
            &[V::from(&ns), V::from(&ctx), V::from(key)],
        )?;
        if fresh == 1 {
            db.exec(
                "INSERT INTO objects(key, bytes, refs, condemned_at) VALUES (?1, ?2, 1, NULL)
                 ON CONFLICT(key) DO UPDATE SET refs = objects.refs + 1, condemned_at = NULL",
                &[V::from(key), V::from(*bytes)],
            )?;
        }
    }
    Ok(())
}

/// The root index's lookup key of a context: its first 8 bytes as an
/// integer. Contexts are digests, so the keys are uniform; a lookup
/// compares integers (≈ 3× cheaper than 64-character text in SQLite) and
/// checks the full namespace and context of what it finds.
fn ckey(ctx: &ContextDigest) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&ctx.0[..8]);
    i64::from_be_bytes(b)
}

/// Fills `roots.ckey` of rows recorded before version 3.
fn backfill_ckeys(db: &mut Db) -> Result<(), LedgerError> {
    for r in db.query("SELECT ns, ctx FROM roots", &[])? {
        let (ns, ctx) = (r.text(0)?, r.text(1)?);
        let (_, c) = parse_pair(&ns, &ctx)?;
        db.exec(
            "UPDATE roots SET ckey = ?3 WHERE ns = ?1 AND ctx = ?2",
            &[V::from(&ns), V::from(&ctx), V::I(ckey(&c))],
        )?;
    }
    Ok(())
}

/// Forgets root `pair` (`[ns, ctx]` as hex) and its references: each object
/// it referenced loses one reference, and those left with none are
/// condemned at `now`. Returns `(key, bytes)` of the newly condemned.
fn unref_root_in(db: &mut Db, pair: &[V; 2], now: u64) -> Result<Vec<(String, u64)>, LedgerError> {
    let mut condemned = Vec::new();
    for k in db.query("SELECT key FROM refs WHERE ns = ?1 AND ctx = ?2", pair)? {
        let key = k.text(0)?;
        db.exec(
            "UPDATE objects SET refs = refs - 1 WHERE key = ?1",
            &[V::from(&key)],
        )?;
        let Some(r) = db.opt(
            "SELECT refs, bytes FROM objects WHERE key = ?1",
            &[V::from(&key)],
        )?
        else {
            continue;
        };
        if r.i64(0)? <= 0 {
            db.exec(
                "UPDATE objects SET refs = 0, condemned_at = ?2 WHERE key = ?1",
                &[V::from(&key), V::from(now)],
            )?;
            condemned.push((key, r.u64(1)?));
        }
    }
    db.exec("DELETE FROM refs WHERE ns = ?1 AND ctx = ?2", pair)?;
    db.exec("DELETE FROM roots WHERE ns = ?1 AND ctx = ?2", pair)?;
    Ok(condemned)
}

/// Leaves a tombstone for a removed root or hold (`kind` `root` or `hold`).
fn tombstone_in(db: &mut Db, kind: &str, id: &str, now: u64) -> Result<(), LedgerError> {
    db.exec(
        "INSERT INTO tombstones(kind, id, at) VALUES (?1, ?2, ?3)
         ON CONFLICT(kind, id) DO UPDATE SET at = excluded.at",
        &[V::from(kind), V::from(id), V::from(now)],
    )?;
    Ok(())
}

/// How far the clocks of a fleet's nodes may disagree. A tombstone this
/// much older than a rebuild's listing still keeps the removed root out.
pub(crate) const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// Roots merged per transaction by [`Ledger::merge_listing`].
const MERGE_BATCH: usize = 1000;

/// How long tombstones are kept: far longer than any rebuild runs.
const TOMBSTONE_KEEP: Duration = Duration::from_secs(24 * 3600);

/// What a listing of the store showed, for [`Ledger::merge_listing`].
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// When the listing began (ms since the epoch).
    pub began: u64,
    /// Whether `roots` holds every listed root (a full rebuild, which also
    /// corrects recorded roots) or only the ones the ledger did not know.
    pub full: bool,
    /// Roots read from the store.
    pub roots: Vec<RootEntry>,
    /// Recorded roots the listing did not show and a HEAD after the
    /// listing found absent.
    pub vanished: Vec<(Namespace, ContextDigest)>,
    /// Hold markers listed.
    pub holds: Vec<(String, Namespace, ContextDigest)>,
    /// Objects listed: `(key, bytes, last modified ms)`.
    pub present: Vec<(String, u64, u64)>,
}

/// What a rebuild or reconciliation changed in the ledger (the merge of a
/// listing of the store).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MergeReport {
    /// Roots the ledger did not know, recorded.
    pub added: u64,
    /// Recorded roots replaced by what the store holds (full rebuild).
    pub replaced: u64,
    /// Recorded roots kept as they were (known, or recorded after the
    /// listing began).
    pub kept: u64,
    /// Listed roots not recorded because they were removed after the
    /// listing began.
    pub skipped_removed: u64,
    /// Recorded roots gone from the store, forgotten.
    pub removed: u64,
    /// Holds added from markers.
    pub holds_added: u64,
    /// Holds dropped (no marker).
    pub holds_removed: u64,
    /// Unreferenced object rows dropped (the object is gone).
    pub objects_dropped: u64,
}

fn parse_pair(ns: &str, ctx: &str) -> Result<(Namespace, ContextDigest), LedgerError> {
    Ok((
        ns.parse()
            .map_err(|e| LedgerError::Inconsistent(format!("namespace {ns:?}: {e}")))?,
        ctx.parse()
            .map_err(|e| LedgerError::Inconsistent(format!("context {ctx:?}: {e}")))?,
    ))
}

/// The totals, read on `db` (inside a transaction or not).
fn totals_in(db: &mut Db) -> Result<Totals, LedgerError> {
    let mut t = usage_in(db)?;
    t.per_namespace = db
        .query(
            "SELECT ns, CAST(SUM(bytes) AS BIGINT) FROM (SELECT DISTINCT refs.ns AS ns, objects.key AS key, objects.bytes AS bytes
               FROM refs JOIN objects ON objects.key = refs.key) AS d GROUP BY ns ORDER BY ns",
            &[],
        )?
        .iter()
        .map(|r| Ok((r.text(0)?, r.u64(1)?)))
        .collect::<Result<Vec<_>, LedgerError>>()?;
    Ok(t)
}

/// [`totals_in`] without the per-namespace breakdown (a join of every
/// reference with its object, most of the cost at 100,000 roots): what a
/// budget check needs.
fn usage_in(db: &mut Db) -> Result<Totals, LedgerError> {
    let roots = db.one("SELECT COUNT(*) FROM roots", &[])?.u64(0)?;
    let root_bytes = db
        .one(
            "SELECT CAST(COALESCE(SUM(root_bytes), 0) AS BIGINT) FROM roots",
            &[],
        )?
        .u64(0)?;
    let live = db.one(
        "SELECT COUNT(*), CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM objects WHERE refs > 0",
        &[],
    )?;
    let condemned = db.one(
        "SELECT COUNT(*), CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM objects WHERE refs = 0",
        &[],
    )?;
    let reserved = db.one(RESERVED, &[V::from(now_ms())])?.u64(0)?;
    let (object_bytes, condemned_bytes) = (live.u64(1)?, condemned.u64(1)?);
    Ok(Totals {
        roots,
        objects: live.u64(0)?,
        object_bytes,
        root_bytes,
        condemned_objects: condemned.u64(0)?,
        condemned_bytes,
        reserved_bytes: reserved,
        used_bytes: object_bytes + condemned_bytes + root_bytes + reserved,
        per_namespace: Vec::new(),
    })
}

/// WAL pages after which a commit checkpoints the ledger.
const WAL_CHECKPOINT_PAGES: i64 = 64;

/// Bytes the WAL is truncated to after a checkpoint.
const WAL_SIZE_LIMIT: i64 = 256 * 1024;

/// How long [`retry_busy`] keeps trying.
const BUSY_PATIENCE: Duration = Duration::from_secs(30);

/// Runs `op` again (with a growing pause) while it fails with a busy
/// database, for up to [`BUSY_PATIENCE`]. The busy timeout covers waiting
/// for a lock, but in WAL mode SQLite also returns `SQLITE_BUSY` at once in
/// a few cases — another process recovering the WAL index, or closing and
/// checkpointing the last connection while this one opens — which a
/// multi-process test hit about once in 30 runs (`database is locked` from
/// an `evict` process). Ledger calls run on blocking threads
/// ([`Ledger::run`]), so the pauses never stall an async worker.
fn retry_busy<T>(mut op: impl FnMut() -> Result<T, LedgerError>) -> Result<T, LedgerError> {
    let start = std::time::Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        match op() {
            Err(e) if Db::is_busy(&e) && start.elapsed() < BUSY_PATIENCE => {
                tracing::debug!(error = %e, "ledger busy; retrying");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// A PostgreSQL URL without its password (for messages).
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "postgres://…".into(),
    }
}

impl Ledger {
    /// Opens (creating) a SQLite ledger file.
    pub(crate) fn open_file(path: &FsPath) -> Result<Self, LedgerError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| LedgerError::Io {
                path: dir.display().to_string(),
                source,
            })?;
        }
        retry_busy(|| Self::open_file_once(path))
    }

    fn open_file_once(path: &FsPath) -> Result<Self, LedgerError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(30))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // Keep the WAL small: by default it grows to ~4 MiB before the first
        // checkpoint and never shrinks, which on a small or full disk is
        // space taken from the store (a 3 MiB tmpfs held a 2.2 MiB WAL over
        // a 4 KiB database). Checkpoint every 64 pages and truncate the WAL
        // to 256 KiB after a checkpoint.
        conn.pragma_update(None, "wal_autocheckpoint", WAL_CHECKPOINT_PAGES)?;
        conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
        // A page cache that holds the root index of a large ledger (the
        // default 2 MiB does not hold 100,000 roots' index: every lookup
        // probe was a read of the file). Not memory-mapped: a full disk
        // must give errors, not SIGBUS.
        conn.pragma_update(None, "cache_size", -32768)?;
        Self::init(
            Db::Sqlite(conn),
            LedgerLocation {
                engine: "sqlite",
                location: path.display().to_string(),
                persisted: true,
            },
        )
    }

    /// An in-memory SQLite ledger (memory stores).
    pub(crate) fn open_memory() -> Result<Self, LedgerError> {
        Self::init(
            Db::Sqlite(Connection::open_in_memory()?),
            LedgerLocation {
                engine: "sqlite",
                location: ":memory:".into(),
                persisted: false,
            },
        )
    }

    /// Connects to a PostgreSQL ledger (`postgres://user@host/db`), creating
    /// or migrating its tables. TLS as libpq's `sslmode` and `sslrootcert`
    /// in the URL say (`tls.rs`): `prefer` by default, `verify-full` to
    /// check the server's certificate and host name.
    pub(crate) fn open_postgres(url: &str) -> Result<Self, LedgerError> {
        let tls = tls::TlsSettings::parse(url, &redact(url))?;
        let connector = tls.connector()?;
        let mut config: postgres::Config = tls
            .driver_url
            .parse()
            .map_err(|e| LedgerError::Url(format!("{}: {e}", redact(url))))?;
        let timeout = format!(
            "-c statement_timeout={}",
            db::PG_STATEMENT_TIMEOUT.as_millis()
        );
        let options = match config.get_options() {
            Some(o) if !o.is_empty() => format!("{o} {timeout}"),
            _ => timeout,
        };
        config.options(&options);
        config.connect_timeout(Duration::from_secs(10));
        Self::init(
            Db::Postgres(db::Pg::connect(config, connector)?),
            LedgerLocation {
                engine: "postgres",
                location: redact(url),
                persisted: true,
            },
        )
    }

    /// Where this ledger lives.
    pub(crate) fn location(&self) -> &LedgerLocation {
        &self.location
    }

    /// The version a ledger database records (`None`: a new database).
    fn stored_version(db: &mut Db) -> Result<Option<u32>, LedgerError> {
        let has_meta = match db.kind() {
            db::Kind::Sqlite => db
                .opt(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                    &[],
                )?
                .is_some(),
            db::Kind::Postgres => db
                .opt(
                    "SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'meta'",
                    &[],
                )?
                .is_some(),
        };
        if !has_meta {
            return Ok(None);
        }
        match db.opt("SELECT v FROM meta WHERE k = 'version'", &[])? {
            None => Ok(None),
            Some(r) => {
                let v = r.text(0)?;
                v.parse::<u32>().map(Some).map_err(|_| {
                    LedgerError::Inconsistent(format!("ledger version {v:?} is not a number"))
                })
            }
        }
    }

    fn init(mut db: Db, location: LedgerLocation) -> Result<Self, LedgerError> {
        // The common case reads only: a ledger at this build's version is
        // opened without taking the write lock (another process may hold
        // it for a while).
        if Self::stored_version(&mut db)? != Some(LEDGER_VERSION) {
            let (schema, migrations) = match db.kind() {
                db::Kind::Sqlite => (SQLITE_SCHEMA, SQLITE_MIGRATIONS),
                db::Kind::Postgres => (POSTGRES_SCHEMA, POSTGRES_MIGRATIONS),
            };
            db.write(|db| {
                db.batch("CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);")?;
                match Self::stored_version(db)? {
                    None => db.batch(schema)?,
                    Some(v) if v > LEDGER_VERSION => {
                        return Err(LedgerError::Inconsistent(format!(
                            "ledger version {v} is newer than this build's {LEDGER_VERSION}: \
                             upgrade deltapack (or open the store with a ledger of its own)"
                        )))
                    }
                    Some(v) => {
                        for (to, sql) in migrations {
                            if *to > v {
                                tracing::info!(from = v, to, "migrating the ledger");
                                db.batch(sql)?;
                            }
                        }
                        if v < 3 {
                            backfill_ckeys(db)?;
                        }
                    }
                }
                db.exec(
                    "INSERT INTO meta(k, v) VALUES ('version', ?1) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                    &[V::from(LEDGER_VERSION.to_string())],
                )?;
                Ok(())
            })?;
        }
        let id = Self::ledger_id(&mut db)?;
        Ok(Ledger {
            db: Arc::new(Mutex::new(db)),
            location,
            id,
        })
    }

    /// The database's id (`meta.ledger_id`), created the first time: 16
    /// random bytes, never changed. A ledger at this build's version that
    /// already has one is read without the write lock.
    fn ledger_id(db: &mut Db) -> Result<LedgerId, LedgerError> {
        let read = |db: &mut Db| -> Result<Option<LedgerId>, LedgerError> {
            match db.opt("SELECT v FROM meta WHERE k = 'ledger_id'", &[])? {
                Some(r) => {
                    let text = r.text(0)?;
                    text.parse().map(Some).map_err(|_| {
                        LedgerError::Inconsistent(format!("meta.ledger_id {text:?} is malformed"))
                    })
                }
                None => Ok(None),
            }
        };
        if let Some(id) = read(db)? {
            return Ok(id);
        }
        let mut fresh = [0u8; 16];
        getrandom::getrandom(&mut fresh).map_err(|e| LedgerError::Io {
            path: "the system's random source".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        // Another process may create the database's id at the same moment:
        // the first insert wins, and both read the winner back.
        db.write(|db| {
            db.exec(
                "INSERT INTO meta(k, v) VALUES ('ledger_id', ?1) ON CONFLICT(k) DO NOTHING",
                &[V::from(LedgerId(fresh).hex())],
            )?;
            Ok(())
        })?;
        read(db)?.ok_or_else(|| LedgerError::Inconsistent("meta.ledger_id was not stored".into()))
    }

    /// This ledger's id (see [`deltapack_format::binding`]).
    pub(crate) fn id(&self) -> LedgerId {
        self.id
    }

    /// The generation of the store's ledger binding this ledger recorded
    /// when it bound the store or adopted it (`None`: never bound).
    pub(crate) fn binding_generation(&self) -> Result<Option<u64>, LedgerError> {
        self.with(
            |db| match db.opt("SELECT v FROM meta WHERE k = 'binding_generation'", &[])? {
                Some(r) => {
                    let text = r.text(0)?;
                    text.parse().map(Some).map_err(|_| {
                        LedgerError::Inconsistent(format!(
                            "meta.binding_generation {text:?} is not a number"
                        ))
                    })
                }
                None => Ok(None),
            },
        )
    }

    /// Records the generation of the store's binding that names this ledger.
    pub(crate) fn set_binding_generation(&self, generation: u64) -> Result<(), LedgerError> {
        self.write(|db| {
            db.exec(
                "INSERT INTO meta(k, v) VALUES ('binding_generation', ?1) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                &[V::from(generation.to_string())],
            )?;
            Ok(())
        })
    }

    /// Runs `f` on a blocking thread, never on an async worker: the
    /// database may wait for another process's lock (busy timeout,
    /// retries) or the network, and a worker blocked there could not run
    /// anything else — not even the deadline of the request that is
    /// waiting.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Ledger) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        let l = self.clone();
        tokio::task::spawn_blocking(move || f(&l))
            .await
            .map_err(|e| LedgerError::Task(e.to_string()))?
    }

    /// Runs `f` on the connection; retried while SQLite reports the
    /// database busy (see [`retry_busy`]). Every `f` is one transaction (or
    /// reads only), so a retry repeats nothing that took effect.
    fn with<T>(
        &self,
        mut f: impl FnMut(&mut Db) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        let mut guard = match self.db.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        retry_busy(|| f(&mut guard))
    }

    /// Runs `f` as one write transaction (see [`Db::write`]), retried while
    /// busy.
    fn write<T>(
        &self,
        mut f: impl FnMut(&mut Db) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        self.with(|db| db.write(&mut f))
    }

    /// Binds this ledger to the store `identity` (a ledger outside the
    /// store). Returns `true` the first time (the ledger is new to the
    /// store and must be built from it); an error if another store owns it.
    pub(crate) fn bind_store(&self, identity: &str) -> Result<bool, LedgerError> {
        self.write(
            |db| match db.opt("SELECT v FROM meta WHERE k = 'store'", &[])? {
                Some(r) => {
                    let owner = r.text(0)?;
                    if owner == identity {
                        Ok(false)
                    } else {
                        Err(LedgerError::Inconsistent(format!(
                            "this ledger belongs to the store {owner}, not {identity}: \
                             give each store (bucket and prefix) a ledger of its own"
                        )))
                    }
                }
                None => {
                    db.exec(
                        "INSERT INTO meta(k, v) VALUES ('store', ?1)",
                        &[V::from(identity)],
                    )?;
                    Ok(true)
                }
            },
        )
    }

    /// Records a root (idempotent: an existing root is only touched). Objects
    /// it references are counted (once per root) and un-condemned.
    pub(crate) fn record_root(&self, e: &RootEntry, now: u64) -> Result<(), LedgerError> {
        self.write(|db| record_in(db, e, now))
    }

    /// Replaces a recorded root by a new version of it (a migration from
    /// v1 to v2) in one transaction: the old root's objects no other root
    /// uses are condemned, the new one's recorded. The root is never absent
    /// from the ledger in between (a removal plan made meanwhile covers it).
    /// If the root is no longer recorded (removed since), nothing is
    /// recorded: the root file went with it. Returns whether it replaced.
    pub(crate) fn replace_root(&self, e: &RootEntry, now: u64) -> Result<bool, LedgerError> {
        let (ns, ctx) = hexpair(&e.namespace, &e.context);
        self.write(|db| {
            let pair = [V::from(&ns), V::from(&ctx)];
            if db
                .opt("SELECT 1 FROM roots WHERE ns = ?1 AND ctx = ?2", &pair)?
                .is_none()
            {
                return Ok(false);
            }
            unref_root_in(db, &pair, now)?;
            record_in(db, e, now)?;
            Ok(true)
        })
    }

    /// Marks accesses of many roots, `((namespace, context), ms)`, in one
    /// transaction (an access time never moves back).
    pub(crate) fn touch_many(
        &self,
        touches: &[((Namespace, ContextDigest), u64)],
    ) -> Result<(), LedgerError> {
        if touches.is_empty() {
            return Ok(());
        }
        self.write(|db| {
            for ((ns, ctx), now) in touches {
                let (ns, ctx) = hexpair(ns, ctx);
                db.exec(
                    "UPDATE roots SET last_access = CASE WHEN last_access < ?3 THEN ?3 ELSE last_access END
                     WHERE ns = ?1 AND ctx = ?2",
                    &[V::from(ns), V::from(ctx), V::from(*now)],
                )?;
            }
            Ok(())
        })
    }

    /// Claims a root for removal by eviction or pruning: refused (`false`)
    /// while a live publication protects its key — a delta being published
    /// on it, which protected its base before reading it — or while a
    /// recorded root builds on it (a delta recorded after the caller's plan
    /// was made). Otherwise the root key is entered in `deleting`, so a
    /// publication that protects it from now on learns it is going and
    /// waits for the removal instead of building on it. The claim ends with
    /// [`Ledger::remove_root`] (or [`Ledger::finish_delete`] if the removal
    /// fails); a remover that dies leaves a claim that lapses after
    /// [`DELETING_LEASE`].
    pub(crate) fn claim_root_removal(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
    ) -> Result<bool, LedgerError> {
        let key = crate::keys::root_key(ns, ctx).to_string();
        let (ns, ctx) = hexpair(ns, ctx);
        let now = now_ms();
        let stale = now.saturating_sub(DELETING_LEASE.as_millis() as u64);
        self.write(|db| {
            db.exec(
                "DELETE FROM deleting WHERE key LIKE 'roots/%' AND since <= ?1",
                &[V::from(stale)],
            )?;
            let protected = db
                .opt(
                    "SELECT 1 FROM protected p JOIN publications u ON u.id = p.owner
                     WHERE p.key = ?1 AND p.until > ?2 AND u.until > ?2",
                    &[V::from(&key), V::from(now)],
                )?
                .is_some();
            let built_on = db
                .opt(
                    "SELECT 1 FROM roots WHERE base_ns = ?1 AND base_ctx = ?2
                     AND NOT (ns = ?1 AND ctx = ?2)",
                    &[V::from(&ns), V::from(&ctx)],
                )?
                .is_some();
            if protected || built_on {
                return Ok(false);
            }
            db.exec(
                "INSERT INTO deleting(key, since) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET since = excluded.since",
                &[V::from(&key), V::from(now)],
            )?;
            Ok(true)
        })
    }

    /// Forgets a root; objects no other root references are condemned at
    /// `now`. Returns `(key, bytes)` of the newly condemned objects. Ends a
    /// removal claim on the root ([`Ledger::claim_root_removal`]).
    pub(crate) fn remove_root(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        now: u64,
    ) -> Result<Vec<(String, u64)>, LedgerError> {
        let root_key = crate::keys::root_key(ns, ctx).to_string();
        let (ns, ctx) = hexpair(ns, ctx);
        self.write(|db| {
            let pair = [V::from(&ns), V::from(&ctx)];
            let condemned = unref_root_in(db, &pair, now)?;
            db.exec("DELETE FROM holds WHERE ns = ?1 AND ctx = ?2", &pair)?;
            db.exec("DELETE FROM deleting WHERE key = ?1", &[V::from(&root_key)])?;
            tombstone_in(db, "root", &format!("{ns}/{ctx}"), now)?;
            Ok(condemned)
        })
    }

    /// Runs `delete(key)` for every condemned object condemned at or before
    /// `cutoff`, each inside a transaction that re-checks the object is still
    /// condemned and unreferenced; forgets the ones deleted. Returns
    /// `(objects, bytes)` reclaimed.
    pub(crate) fn collect(
        &self,
        cutoff: u64,
        mut delete: impl FnMut(&str) -> bool,
    ) -> Result<(u64, u64), LedgerError> {
        let due = self.due(cutoff)?;
        let (mut n, mut bytes) = (0u64, 0u64);
        for (key, _) in due {
            let done = self.write(|db| {
                let still = db.opt(
                    STILL_DUE,
                    &[V::from(&key), V::from(cutoff), V::from(now_ms())],
                )?;
                let Some(b) = still else {
                    return Ok(None);
                };
                if !delete(&key) {
                    return Ok(None);
                }
                db.exec("DELETE FROM objects WHERE key = ?1", &[V::from(&key)])?;
                Ok(Some(b.u64(0)?))
            })?;
            if let Some(b) = done {
                n += 1;
                bytes += b;
            }
        }
        Ok((n, bytes))
    }

    /// Starts a publication: a fresh id from the database's sequence
    /// (never reused, so one publication's protections and reservation can
    /// never be dropped by another's end). Its reservation is a lease until
    /// `until` (ms), which the publisher renews while it runs
    /// ([`Ledger::renew_publication`]): a killed publisher's reservation
    /// lapses within one lease. Expired publications are cleaned up.
    pub(crate) fn begin_publication(&self, until: u64) -> Result<i64, LedgerError> {
        self.write(|db| {
            db.lease_commit()?;
            let now = V::from(now_ms());
            db.exec(
                "DELETE FROM publications WHERE until <= ?1",
                std::slice::from_ref(&now),
            )?;
            db.exec(
                "DELETE FROM protected WHERE until <= ?1",
                std::slice::from_ref(&now),
            )?;
            db.one(
                "INSERT INTO publications(reserved, until) VALUES (0, ?1) RETURNING id",
                &[V::from(until)],
            )?
            .i64(0)
        })
    }

    /// Extends publication `id`'s lease to `until` (ms).
    pub(crate) fn renew_publication(&self, id: i64, until: u64) -> Result<(), LedgerError> {
        self.with(|db| {
            db.exec(
                "UPDATE publications SET until = CASE WHEN until < ?2 THEN ?2 ELSE until END WHERE id = ?1",
                &[V::from(id), V::from(until)],
            )?;
            Ok(())
        })
    }

    /// Reserves `need` bytes for publication `id` against `budget`, in the
    /// transaction that checks them: bytes in use (live + condemned + roots)
    /// plus every other publication's reservation plus `need` must fit.
    /// Returns `None` when reserved, or the totals that did not fit.
    pub(crate) fn reserve(
        &self,
        id: i64,
        need: u64,
        budget: u64,
    ) -> Result<Option<Totals>, LedgerError> {
        self.write(|db| {
            db.lease_commit()?;
            db.exec(
                "UPDATE publications SET reserved = 0 WHERE id = ?1",
                &[V::from(id)],
            )?;
            let t = usage_in(db)?;
            if t.used_bytes.saturating_add(need) > budget {
                return Ok(Some(t));
            }
            db.exec(
                "UPDATE publications SET reserved = ?2 WHERE id = ?1",
                &[V::from(id), V::from(need)],
            )?;
            Ok(None)
        })
    }

    /// Protects objects a publication is about to rely on (or write) from
    /// garbage collection until `until` (ms), under the publication's
    /// `owner` id. Serialised with [`Ledger::collect`] and
    /// [`Ledger::claim_due`] by the write lock. Returns the keys a collector
    /// has already claimed for deletion from an object store: the
    /// publication must not rely on those, but wait until their deletion is
    /// over ([`Ledger::deleting`]) and write them again.
    pub(crate) fn protect(
        &self,
        owner: i64,
        keys: &[String],
        until: u64,
    ) -> Result<Vec<String>, LedgerError> {
        let fresh = now_ms().saturating_sub(DELETING_LEASE.as_millis() as u64);
        self.write(|db| {
            db.lease_commit()?;
            let mut claimed = Vec::new();
            for k in keys {
                db.exec(
                    "INSERT INTO protected(owner, key, until) VALUES (?1, ?2, ?3)
                     ON CONFLICT(owner, key) DO UPDATE SET until = excluded.until",
                    &[V::from(owner), V::from(k), V::from(until)],
                )?;
                if db
                    .opt(FRESH_CLAIM, &[V::from(k), V::from(fresh)])?
                    .is_some()
                {
                    claimed.push(k.clone());
                }
            }
            Ok(claimed)
        })
    }

    /// Which of `keys` are still claimed for deletion (fresh claims only).
    pub(crate) fn deleting(&self, keys: &[String]) -> Result<Vec<String>, LedgerError> {
        let fresh = now_ms().saturating_sub(DELETING_LEASE.as_millis() as u64);
        self.with(|db| {
            let mut out = Vec::new();
            for k in keys {
                if db
                    .opt(FRESH_CLAIM, &[V::from(k), V::from(fresh)])?
                    .is_some()
                {
                    out.push(k.clone());
                }
            }
            Ok(out)
        })
    }

    /// Claims every object due for deletion (condemned at or before
    /// `cutoff`, unreferenced, unprotected, not freshly claimed by another
    /// collector) for deletion from an object store, in one transaction.
    /// The caller deletes each and then calls [`Ledger::finish_delete`].
    /// Between the claim and the finish, a publisher that protects the key
    /// learns it is being deleted and rewrites it afterwards instead of
    /// relying on it: no DELETE can land on an object a root relies on.
    pub(crate) fn claim_due(&self, cutoff: u64) -> Result<Vec<(String, u64)>, LedgerError> {
        let now = now_ms();
        let fresh = now.saturating_sub(DELETING_LEASE.as_millis() as u64);
        self.write(|db| {
            let mut claimed = Vec::new();
            for r in db.query(DUE, &[V::from(cutoff), V::from(now)])? {
                let (key, bytes) = (r.text(0)?, r.u64(1)?);
                if db
                    .opt(FRESH_CLAIM, &[V::from(&key), V::from(fresh)])?
                    .is_some()
                {
                    continue;
                }
                db.exec(
                    "INSERT INTO deleting(key, since) VALUES (?1, ?2)
                     ON CONFLICT(key) DO UPDATE SET since = excluded.since",
                    &[V::from(&key), V::from(now)],
                )?;
                claimed.push((key, bytes));
            }
            Ok(claimed)
        })
    }

    /// Claims one object the sweep found unreferenced in a listing, unless
    /// a recorded root references it, a publication protects it, or another
    /// collector claimed it. Returns whether it is now this caller's to
    /// delete (then [`Ledger::finish_delete`]).
    pub(crate) fn claim_orphan(&self, key: &str) -> Result<bool, LedgerError> {
        let now = now_ms();
        let fresh = now.saturating_sub(DELETING_LEASE.as_millis() as u64);
        self.write(|db| {
            if db.one(IS_USED, &[V::from(key), V::from(now)])?.bool(0)?
                || db
                    .opt(FRESH_CLAIM, &[V::from(key), V::from(fresh)])?
                    .is_some()
            {
                return Ok(false);
            }
            db.exec(
                "INSERT INTO deleting(key, since) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET since = excluded.since",
                &[V::from(key), V::from(now)],
            )?;
            Ok(true)
        })
    }

    /// Ends a claim: if the object was deleted, forgets it (unless a root
    /// references it again, which the protocol rules out); either way the
    /// claim goes.
    pub(crate) fn finish_delete(&self, key: &str, deleted: bool) -> Result<(), LedgerError> {
        self.write(|db| {
            if deleted {
                db.exec(
                    "DELETE FROM objects WHERE key = ?1 AND refs = 0",
                    &[V::from(key)],
                )?;
            }
            db.exec("DELETE FROM deleting WHERE key = ?1", &[V::from(key)])?;
            Ok(())
        })
    }

    /// Ends a publication: drops its protections and its reservation (and
    /// any that expired).
    pub(crate) fn end_publication(&self, owner: i64) -> Result<(), LedgerError> {
        self.write(|db| {
            db.lease_commit()?;
            let p = [V::from(owner), V::from(now_ms())];
            db.exec("DELETE FROM protected WHERE owner = ?1 OR until <= ?2", &p)?;
            db.exec("DELETE FROM publications WHERE id = ?1 OR until <= ?2", &p)?;
            Ok(())
        })
    }

    /// Deletes an object the sweep found unreferenced, unless — checked in
    /// the same transaction as the deletion — a root recorded since the
    /// sweep's listing references it or a publication protects it. Returns
    /// whether `delete` ran and succeeded.
    pub(crate) fn delete_if_unused(
        &self,
        key: &str,
        delete: impl FnOnce(&str) -> bool,
    ) -> Result<bool, LedgerError> {
        // `with` may retry on a busy database; the deletion itself runs at
        // most once (a retry after it only finishes the bookkeeping).
        let mut delete = Some(delete);
        let mut ran: Option<bool> = None;
        self.write(|db| {
            let used = db
                .one(IS_USED, &[V::from(key), V::from(now_ms())])?
                .bool(0)?;
            if used && ran.is_none() {
                return Ok(false);
            }
            let done = match ran {
                Some(d) => d,
                None => {
                    let d = delete.take().is_some_and(|f| f(key));
                    ran = Some(d);
                    d
                }
            };
            if done {
                db.exec(
                    "DELETE FROM objects WHERE key = ?1 AND refs = 0",
                    &[V::from(key)],
                )?;
            }
            Ok(done)
        })
    }

    /// Whether a recorded root references the object or a publication
    /// protects it.
    #[cfg(test)]
    pub(crate) fn is_used(&self, key: &str) -> Result<bool, LedgerError> {
        self.with(|db| db.one(IS_USED, &[V::from(key), V::from(now_ms())])?.bool(0))
    }

    /// Keys due for deletion, with their bytes.
    pub(crate) fn due(&self, cutoff: u64) -> Result<Vec<(String, u64)>, LedgerError> {
        self.with(|db| {
            db.query(DUE, &[V::from(cutoff), V::from(now_ms())])?
                .iter()
                .map(|r| Ok((r.text(0)?, r.u64(1)?)))
                .collect()
        })
    }

    /// Forgets an object if it is still unreferenced.
    pub(crate) fn forget_if_condemned(&self, key: &str) -> Result<(), LedgerError> {
        self.with(|db| {
            db.exec(
                "DELETE FROM objects WHERE key = ?1 AND refs = 0",
                &[V::from(key)],
            )?;
            Ok(())
        })
    }

    /// Forgets an object (e.g. deleted or quarantined by the sweep).
    pub(crate) fn forget_object(&self, key: &str) -> Result<(), LedgerError> {
        self.forget_if_condemned(key)
    }

    /// Totals.
    pub(crate) fn totals(&self) -> Result<Totals, LedgerError> {
        self.with(totals_in)
    }

    /// Totals without the per-namespace breakdown (what a budget check
    /// needs; `per_namespace` is empty).
    pub(crate) fn usage(&self) -> Result<Totals, LedgerError> {
        self.with(usage_in)
    }

    /// Every root, least recently used first.
    pub(crate) fn roots_lru(&self) -> Result<Vec<RootRow>, LedgerError> {
        self.with(|db| {
            let rows = db.query(
                "SELECT ns, ctx, schema, base_ns, base_ctx, last_access FROM roots ORDER BY last_access, ns, ctx",
                &[],
            )?;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows {
                let (namespace, context) = parse_pair(&r.text(0)?, &r.text(1)?)?;
                let base = match (r.opt_text(3)?, r.opt_text(4)?) {
                    (Some(a), Some(b)) => Some(parse_pair(&a, &b)?),
                    _ => None,
                };
                out.push(RootRow {
                    namespace,
                    context,
                    schema: r.text(2)?,
                    base,
                    last_access_ms: r.u64(5)?,
                });
            }
            Ok(out)
        })
    }

    /// The roots the ledger records below `(ns, ctx)` through base links:
    /// its base, that root's base, and so on, at most `limit` of them, in
    /// no particular order; `None` when the connection is busy right now
    /// (this call never waits for it, nor for a busy database).
    ///
    /// A hint for a restore's prefetch of a chain's roots, read before the
    /// requested root itself is: every root it names is read and checked
    /// like any other, and the walk follows the roots' own base links, so
    /// a stale ledger costs reads, never a wrong answer. The recursion
    /// (`UNION`, not `UNION ALL`) ends on a forged cycle.
    pub(crate) fn try_bases_below(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        limit: u64,
    ) -> Result<Option<Vec<(Namespace, ContextDigest)>>, LedgerError> {
        let (ns, ctx) = hexpair(ns, ctx);
        let mut db = match self.db.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::WouldBlock) => return Ok(None),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        let rows = match db.query(
            "WITH RECURSIVE chain(ns, ctx) AS (
                 SELECT base_ns, base_ctx FROM roots
                  WHERE ns = ?1 AND ctx = ?2 AND base_ns IS NOT NULL AND base_ctx IS NOT NULL
                 UNION
                 SELECT r.base_ns, r.base_ctx FROM roots r JOIN chain c ON r.ns = c.ns AND r.ctx = c.ctx
                  WHERE r.base_ns IS NOT NULL AND r.base_ctx IS NOT NULL)
             SELECT ns, ctx FROM chain LIMIT ?3",
            &[V::from(&ns), V::from(&ctx), V::from(limit)],
        ) {
            Ok(rows) => rows,
            Err(e) if Db::is_busy(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(parse_pair(&r.text(0)?, &r.text(1)?)?);
        }
        Ok(Some(out))
    }

    /// Which of `contexts` (of namespace `ns`) have a recorded root (one
    /// indexed query per 1,024 contexts: a 262,144-token request is one
    /// query, one round trip to PostgreSQL).
    ///
    /// SQLite probes the `ckey` index once per candidate from a `VALUES`
    /// list it scans in order (`CROSS JOIN` fixes the loop order): half the
    /// time of `ckey IN (…)`, for which it first builds and sorts a
    /// temporary index of the 1,024 values (0.34 vs 0.74 ms over 100,000
    /// roots on the reference machine).
    pub(crate) fn recorded(
        &self,
        ns: &Namespace,
        contexts: &[ContextDigest],
    ) -> Result<std::collections::HashSet<ContextDigest>, LedgerError> {
        let ns = ns.hex();
        self.with(|db| {
            let mut out = std::collections::HashSet::new();
            for chunk in contexts.chunks(1024) {
                let sql = match db.kind() {
                    db::Kind::Sqlite => {
                        let marks: Vec<String> =
                            (0..chunk.len()).map(|i| format!("(?{})", i + 1)).collect();
                        format!(
                            "SELECT r.ns, r.ctx FROM (VALUES {}) v CROSS JOIN roots r ON r.ckey = v.column1",
                            marks.join(", ")
                        )
                    }
                    db::Kind::Postgres => {
                        let marks: Vec<String> =
                            (0..chunk.len()).map(|i| format!("?{}", i + 1)).collect();
                        format!(
                            "SELECT ns, ctx FROM roots WHERE ckey IN ({})",
                            marks.join(", ")
                        )
                    }
                };
                let params: Vec<V> = chunk.iter().map(|c| V::I(ckey(c))).collect();
                let wanted: std::collections::HashSet<&ContextDigest> = chunk.iter().collect();
                for r in db.query(&sql, &params)? {
                    if r.text(0)? != ns {
                        continue;
                    }
                    let (_, ctx) = parse_pair(&ns, &r.text(1)?)?;
                    if wanted.contains(&ctx) {
                        out.insert(ctx);
                    }
                }
            }
            Ok(out)
        })
    }

    /// Adds a hold (idempotent).
    pub(crate) fn add_hold(
        &self,
        name: &str,
        ns: &Namespace,
        ctx: &ContextDigest,
    ) -> Result<(), LedgerError> {
        let (ns, ctx) = hexpair(ns, ctx);
        let id = format!("{name}/{ns}/{ctx}");
        self.write(|db| {
            db.exec(
                "INSERT INTO holds(name, ns, ctx, since) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                &[V::from(name), V::from(&ns), V::from(&ctx), V::from(now_ms())],
            )?;
            db.exec(
                "DELETE FROM tombstones WHERE kind = 'hold' AND id = ?1",
                &[V::from(&id)],
            )?;
            Ok(())
        })
    }

    /// Releases a hold (and leaves a tombstone, so a rebuild whose listing
    /// still saw the marker does not bring it back).
    pub(crate) fn release_hold(
        &self,
        name: &str,
        ns: &Namespace,
        ctx: &ContextDigest,
    ) -> Result<bool, LedgerError> {
        let (ns, ctx) = hexpair(ns, ctx);
        let id = format!("{name}/{ns}/{ctx}");
        self.write(|db| {
            let released = db.exec(
                "DELETE FROM holds WHERE name = ?1 AND ns = ?2 AND ctx = ?3",
                &[V::from(name), V::from(&ns), V::from(&ctx)],
            )? > 0;
            tombstone_in(db, "hold", &id, now_ms())?;
            Ok(released)
        })
    }

    /// Whether any hold protects the root.
    pub(crate) fn is_held(&self, ns: &Namespace, ctx: &ContextDigest) -> Result<bool, LedgerError> {
        let (ns, ctx) = hexpair(ns, ctx);
        self.with(|db| {
            Ok(db
                .opt(
                    "SELECT 1 FROM holds WHERE ns = ?1 AND ctx = ?2 LIMIT 1",
                    &[V::from(&ns), V::from(&ctx)],
                )?
                .is_some())
        })
    }

    /// Every recorded root.
    pub(crate) fn recorded_roots(&self) -> Result<Vec<(Namespace, ContextDigest)>, LedgerError> {
        self.with(|db| {
            db.query("SELECT ns, ctx FROM roots", &[])?
                .iter()
                .map(|r| parse_pair(&r.text(0)?, &r.text(1)?))
                .collect()
        })
    }

    /// Merges what a listing of the store showed into the ledger (roots in
    /// transactions of [`MERGE_BATCH`], then one for the rest), losing
    /// nothing recorded meanwhile:
    ///
    /// - a listed root the ledger lacks is recorded, unless it was removed
    ///   after the listing began (a tombstone); on a full rebuild a
    ///   recorded root is replaced by what the store holds, unless it was
    ///   recorded after the listing began;
    /// - a recorded root is forgotten only if a HEAD after the listing
    ///   confirmed it absent ([`Listing::vanished`]) and it was recorded
    ///   before the listing began;
    /// - holds likewise (listed ones added unless released meanwhile,
    ///   unlisted ones dropped if placed before the listing);
    /// - listed objects the ledger lacks are added as condemned (as of
    ///   their last modification); reference counts are recounted from the
    ///   roots; unreferenced rows of objects the listing did not show are
    ///   dropped unless a publication protects them or a collector is
    ///   deleting them.
    pub(crate) fn merge_listing(
        &self,
        listing: &Listing,
        now: u64,
    ) -> Result<MergeReport, LedgerError> {
        let began = listing.began;
        let tomb_since = began.saturating_sub(CLOCK_SKEW.as_millis() as u64);
        let present: std::collections::HashSet<&str> =
            listing.present.iter().map(|(k, _, _)| k.as_str()).collect();
        let listed_holds: std::collections::HashSet<(String, String, String)> = listing
            .holds
            .iter()
            .map(|(n, ns, c)| (n.clone(), ns.hex(), c.hex()))
            .collect();
        let tombs_in =
            |db: &mut Db| -> Result<std::collections::HashSet<(String, String)>, LedgerError> {
                db.query(
                    "SELECT kind, id FROM tombstones WHERE at >= ?1",
                    &[V::from(tomb_since)],
                )?
                .iter()
                .map(|r| Ok((r.text(0)?, r.text(1)?)))
                .collect()
            };
        let mut report = MergeReport::default();
        // Roots in batches, one transaction each: a fleet's writers wait
        // for one batch at a time, not for the whole rebuild. Each root's
        // rule is checked against the ledger as it is in its batch.
        for batch in listing.roots.chunks(MERGE_BATCH) {
            let r = self.write(|db| {
                let mut report = MergeReport::default();
                let tombs = tombs_in(db)?;
                for e in batch {
                    let (ns, ctx) = hexpair(&e.namespace, &e.context);
                    if tombs.contains(&("root".to_string(), format!("{ns}/{ctx}"))) {
                        report.skipped_removed += 1;
                        continue;
                    }
                    let pair = [V::from(&ns), V::from(&ctx)];
                    match db.opt(
                        "SELECT recorded_at, last_access FROM roots WHERE ns = ?1 AND ctx = ?2",
                        &pair,
                    )? {
                        Some(r) if !listing.full || r.u64(0)? >= began => report.kept += 1,
                        Some(r) => {
                            // Replaced by what the store holds; reference
                            // counts are recounted below.
                            let last = r.u64(1)?;
                            db.exec("DELETE FROM refs WHERE ns = ?1 AND ctx = ?2", &pair)?;
                            db.exec("DELETE FROM roots WHERE ns = ?1 AND ctx = ?2", &pair)?;
                            record_in(db, e, began)?;
                            db.exec(
                                "UPDATE roots SET last_access = ?3 WHERE ns = ?1 AND ctx = ?2",
                                &[V::from(&ns), V::from(&ctx), V::from(last)],
                            )?;
                            report.replaced += 1;
                        }
                        None => {
                            record_in(db, e, began)?;
                            report.added += 1;
                        }
                    }
                }
                Ok(report)
            })?;
            report.added += r.added;
            report.replaced += r.replaced;
            report.kept += r.kept;
            report.skipped_removed += r.skipped_removed;
        }
        let r = self.write(|db| {
            let mut report = MergeReport::default();
            let tombs = tombs_in(db)?;
            for (vns, vctx) in &listing.vanished {
                let (ns, ctx) = hexpair(vns, vctx);
                let pair = [V::from(&ns), V::from(&ctx), V::from(began)];
                if db.exec(
                    "DELETE FROM roots WHERE ns = ?1 AND ctx = ?2 AND recorded_at < ?3",
                    &pair,
                )? > 0
                {
                    db.exec(
                        "DELETE FROM refs WHERE ns = ?1 AND ctx = ?2",
                        &pair[..2],
                    )?;
                    db.exec("DELETE FROM holds WHERE ns = ?1 AND ctx = ?2", &pair[..2])?;
                    report.removed += 1;
                }
            }
            for (name, ns, ctx) in &listed_holds {
                if tombs.contains(&("hold".to_string(), format!("{name}/{ns}/{ctx}"))) {
                    continue;
                }
                report.holds_added += db.exec(
                    "INSERT INTO holds(name, ns, ctx, since) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                    &[V::from(name), V::from(ns), V::from(ctx), V::from(began)],
                )?;
            }
            for r in db.query(
                "SELECT name, ns, ctx FROM holds WHERE since < ?1",
                &[V::from(began)],
            )? {
                let h = (r.text(0)?, r.text(1)?, r.text(2)?);
                if !listed_holds.contains(&h) {
                    report.holds_removed += db.exec(
                        "DELETE FROM holds WHERE name = ?1 AND ns = ?2 AND ctx = ?3",
                        &[V::from(&h.0), V::from(&h.1), V::from(&h.2)],
                    )?;
                }
            }
            for (key, bytes, mtime) in &listing.present {
                db.exec(
                    "INSERT INTO objects(key, bytes, refs, condemned_at) VALUES (?1, ?2, 0, ?3) ON CONFLICT(key) DO NOTHING",
                    &[V::from(key), V::from(*bytes), V::from(*mtime)],
                )?;
            }
            db.batch(
                "UPDATE objects SET refs = (SELECT COUNT(*) FROM refs WHERE refs.key = objects.key);
                 UPDATE objects SET condemned_at = NULL WHERE refs > 0 AND condemned_at IS NOT NULL;",
            )?;
            db.exec(
                "UPDATE objects SET condemned_at = ?1 WHERE refs = 0 AND condemned_at IS NULL",
                &[V::from(now)],
            )?;
            for r in db.query("SELECT key FROM objects WHERE refs = 0", &[])? {
                let key = r.text(0)?;
                if present.contains(key.as_str()) {
                    continue;
                }
                report.objects_dropped += db.exec(
                    "DELETE FROM objects WHERE key = ?1 AND refs = 0
                     AND NOT EXISTS (SELECT 1 FROM protected p WHERE p.key = ?1 AND p.until > ?2)
                     AND NOT EXISTS (SELECT 1 FROM deleting d WHERE d.key = ?1)",
                    &[V::from(&key), V::from(now)],
                )?;
            }
            db.exec(
                "DELETE FROM tombstones WHERE at < ?1",
                &[V::from(now.saturating_sub(TOMBSTONE_KEEP.as_millis() as u64))],
            )?;
            Ok(report)
        })?;
        report.removed = r.removed;
        report.holds_added = r.holds_added;
        report.holds_removed = r.holds_removed;
        report.objects_dropped = r.objects_dropped;
        Ok(report)
    }

    /// The comparable content (everything but access and condemnation times).
    pub(crate) fn image(&self) -> Result<LedgerImage, LedgerError> {
        self.with(|db| {
            let mut refs: std::collections::HashMap<(String, String), Vec<String>> =
                std::collections::HashMap::new();
            for r in db.query("SELECT ns, ctx, key FROM refs", &[])? {
                refs.entry((r.text(0)?, r.text(1)?))
                    .or_default()
                    .push(r.text(2)?);
            }
            let mut roots = Vec::new();
            for r in db.query(
                "SELECT ns, ctx, schema, kind, boundary, base_ns, base_ctx, root_bytes FROM roots ORDER BY ns, ctx",
                &[],
            )? {
                let (ns, ctx) = (r.text(0)?, r.text(1)?);
                let mut keys = refs.remove(&(ns.clone(), ctx.clone())).unwrap_or_default();
                keys.sort();
                let base = r.opt_text(5)?.zip(r.opt_text(6)?);
                roots.push((ns, ctx, r.text(2)?, r.text(3)?, r.u64(4)?, base, r.u64(7)?, keys));
            }
            let objects = db
                .query(
                    "SELECT key, bytes, refs, condemned_at FROM objects ORDER BY key",
                    &[],
                )?
                .iter()
                .map(|r| Ok((r.text(0)?, r.u64(1)?, r.u64(2)?, r.opt_i64(3)?.is_some())))
                .collect::<Result<_, LedgerError>>()?;
            let holds = db
                .query("SELECT name, ns, ctx FROM holds ORDER BY name, ns, ctx", &[])?
                .iter()
                .map(|r| Ok((r.text(0)?, r.text(1)?, r.text(2)?)))
                .collect::<Result<_, LedgerError>>()?;
            Ok(LedgerImage { roots, objects, holds })
        })
    }

    /// Adds counter deltas to the persisted counters.
    pub(crate) fn add_counters(&self, deltas: &[(&str, u64)]) -> Result<(), LedgerError> {
        self.write(|db| {
            for (name, v) in deltas {
                if *v > 0 {
                    db.exec(
                        "INSERT INTO counters(name, value) VALUES (?1, ?2)
                         ON CONFLICT(name) DO UPDATE SET value = counters.value + excluded.value",
                        &[V::from(*name), V::from(*v)],
                    )?;
                }
            }
            Ok(())
        })
    }

    /// The persisted counters.
    pub(crate) fn counters(&self) -> Result<Vec<(String, u64)>, LedgerError> {
        self.with(|db| {
            db.query("SELECT name, value FROM counters ORDER BY name", &[])?
                .iter()
                .map(|r| Ok((r.text(0)?, r.u64(1)?)))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let base = match std::env::var("DELTAPACK_TEST_POSTGRES") {
            Ok(u) if !u.is_empty() => u,
            _ => {
                assert!(
                    std::env::var("CI").map(|v| v != "true").unwrap_or(true),
                    "CI=true but DELTAPACK_TEST_POSTGRES is not set"
                );
                return None;
            }
        };
        let schema = format!(
            "u_{}_{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        let mut c = postgres::Client::connect(&base, postgres::NoTls).expect("connect");
        c.batch_execute(&format!("CREATE SCHEMA {schema}"))
            .expect("schema");
        let sep = if base.contains('?') { '&' } else { '?' };
        Some(format!("{base}{sep}options=-c%20search_path%3D{schema}"))
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
}

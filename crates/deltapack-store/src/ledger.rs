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
//! memory stores each process keeps an in-memory ledger rebuilt at open.
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

use deltapack_format::{ContextDigest, Namespace, RootKind, RootSummary};
use rusqlite::{params, Connection, OptionalExtension};
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
    /// Stored values are not what this version writes.
    #[error("ledger content is inconsistent: {0}")]
    Inconsistent(String),
    /// The blocking task running a ledger call failed (panicked or was
    /// cancelled at shutdown).
    #[error("ledger task: {0}")]
    Task(String),
}

/// What to do with a persisted ledger when a store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ColdStart {
    /// Trust the persisted ledger after a cheap consistency check (root
    /// count against a listing of the store); rebuild if the check fails.
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

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS roots(
    ns TEXT NOT NULL, ctx TEXT NOT NULL, schema TEXT NOT NULL, kind TEXT NOT NULL,
    boundary INTEGER NOT NULL, base_ns TEXT, base_ctx TEXT,
    root_bytes INTEGER NOT NULL, last_access INTEGER NOT NULL,
    PRIMARY KEY(ns, ctx));
CREATE INDEX IF NOT EXISTS roots_lru ON roots(last_access);
CREATE INDEX IF NOT EXISTS roots_base ON roots(base_ns, base_ctx);
CREATE TABLE IF NOT EXISTS refs(ns TEXT NOT NULL, ctx TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY(ns, ctx, key));
CREATE INDEX IF NOT EXISTS refs_key ON refs(key);
CREATE TABLE IF NOT EXISTS objects(key TEXT PRIMARY KEY, bytes INTEGER NOT NULL, refs INTEGER NOT NULL, condemned_at INTEGER);
CREATE TABLE IF NOT EXISTS holds(name TEXT NOT NULL, ns TEXT NOT NULL, ctx TEXT NOT NULL, PRIMARY KEY(name, ns, ctx));
CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS protected(owner INTEGER NOT NULL, key TEXT NOT NULL, until INTEGER NOT NULL, PRIMARY KEY(owner, key));
CREATE TABLE IF NOT EXISTS publications(id INTEGER PRIMARY KEY AUTOINCREMENT, reserved INTEGER NOT NULL, until INTEGER NOT NULL);
";

/// Migrations: `(version, SQL)` — the SQL takes a ledger of the previous
/// version to this one. A fresh ledger is created by [`SCHEMA`] at
/// [`LEDGER_VERSION`] directly.
const MIGRATIONS: &[(u32, &str)] = &[
    // 2: publications get ids from a database sequence (the old
    // `pid << 32 ^ seq << 1 ^ now_ms` ids could collide, and one
    // publication's `unprotect` then dropped another's protections), and
    // carry the bytes they reserved against the budget.
    (
        2,
        "DELETE FROM protected;
         CREATE TABLE IF NOT EXISTS publications(id INTEGER PRIMARY KEY AUTOINCREMENT, reserved INTEGER NOT NULL, until INTEGER NOT NULL);",
    ),
];

/// Condemned objects due for deletion: unreferenced, condemned at or before
/// ?1, and not protected by a publication in progress at ?2.
const DUE: &str =
    "SELECT key FROM objects WHERE refs = 0 AND condemned_at IS NOT NULL AND condemned_at <= ?1
    AND NOT EXISTS (SELECT 1 FROM protected p WHERE p.key = objects.key AND p.until > ?2)";
const STILL_DUE: &str = "SELECT bytes FROM objects WHERE key = ?1 AND refs = 0 AND condemned_at IS NOT NULL
    AND condemned_at <= ?2 AND NOT EXISTS (SELECT 1 FROM protected p WHERE p.key = objects.key AND p.until > ?3)";

/// Ledger format version, bumped when the tables change. An older ledger is
/// migrated forward at open ([`MIGRATIONS`]); a newer one is refused (this
/// build would misread it).
const LEDGER_VERSION: u32 = 2;

/// Bytes reserved by publications in progress (not expired) at `?1`.
const RESERVED: &str = "SELECT COALESCE(SUM(reserved), 0) FROM publications WHERE until > ?1";

/// The ledger: a cheap handle (clones share one connection).
#[derive(Clone)]
pub(crate) struct Ledger {
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ledger")
    }
}

fn hexpair(ns: &Namespace, ctx: &ContextDigest) -> (String, String) {
    (ns.hex(), ctx.hex())
}

/// Records a root inside a transaction (see [`Ledger::record_root`]).
fn record_in(tx: &rusqlite::Transaction<'_>, e: &RootEntry, now: u64) -> Result<(), LedgerError> {
    let (ns, ctx) = hexpair(&e.namespace, &e.context);
    let exists: bool = tx
        .query_row(
            "SELECT 1 FROM roots WHERE ns = ?1 AND ctx = ?2",
            params![ns, ctx],
            |_| Ok(true),
        )
        .optional()?
        .unwrap_or(false);
    if exists {
        tx.execute(
            "UPDATE roots SET last_access = ?3 WHERE ns = ?1 AND ctx = ?2",
            params![ns, ctx, now as i64],
        )?;
        return Ok(());
    }
    let (bns, bctx) = match e.base {
        Some((b, c)) => (Some(b.hex()), Some(c.hex())),
        None => (None, None),
    };
    tx.execute(
        "INSERT INTO roots(ns, ctx, schema, kind, boundary, base_ns, base_ctx, root_bytes, last_access)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![ns, ctx, e.schema, e.kind, e.boundary as i64, bns, bctx, e.root_bytes as i64, now as i64],
    )?;
    for (key, bytes) in &e.objects {
        let fresh = tx.execute(
            "INSERT OR IGNORE INTO refs(ns, ctx, key) VALUES (?1, ?2, ?3)",
            params![ns, ctx, key],
        )?;
        if fresh == 1 {
            tx.execute(
                "INSERT INTO objects(key, bytes, refs, condemned_at) VALUES (?1, ?2, 1, NULL)
                 ON CONFLICT(key) DO UPDATE SET refs = refs + 1, condemned_at = NULL",
                params![key, *bytes as i64],
            )?;
        }
    }
    Ok(())
}

fn parse_pair(ns: &str, ctx: &str) -> Result<(Namespace, ContextDigest), LedgerError> {
    Ok((
        ns.parse()
            .map_err(|e| LedgerError::Inconsistent(format!("namespace {ns:?}: {e}")))?,
        ctx.parse()
            .map_err(|e| LedgerError::Inconsistent(format!("context {ctx:?}: {e}")))?,
    ))
}

/// The totals, read on `c` (inside a transaction or not).
fn totals_in(c: &Connection) -> Result<Totals, LedgerError> {
    let roots: i64 = c.query_row("SELECT COUNT(*) FROM roots", [], |r| r.get(0))?;
    let root_bytes: i64 =
        c.query_row("SELECT COALESCE(SUM(root_bytes), 0) FROM roots", [], |r| {
            r.get(0)
        })?;
    let (objects, object_bytes): (i64, i64) = c.query_row(
        "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM objects WHERE refs > 0",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let (condemned_objects, condemned_bytes): (i64, i64) = c.query_row(
        "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM objects WHERE refs = 0",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let reserved: i64 = c.query_row(RESERVED, [now_ms() as i64], |r| r.get(0))?;
    let per_namespace: Vec<(String, u64)> = {
        let mut st = c.prepare(
        "SELECT ns, SUM(bytes) FROM (SELECT DISTINCT refs.ns AS ns, objects.key AS key, objects.bytes AS bytes
           FROM refs JOIN objects ON objects.key = refs.key) GROUP BY ns ORDER BY ns",
    )?;
        let rows = st.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
        })?;
        rows.collect::<Result<_, _>>()?
    };
    Ok(Totals {
        roots: roots as u64,
        objects: objects as u64,
        object_bytes: object_bytes as u64,
        root_bytes: root_bytes as u64,
        condemned_objects: condemned_objects as u64,
        condemned_bytes: condemned_bytes as u64,
        reserved_bytes: reserved as u64,
        used_bytes: (object_bytes + condemned_bytes + root_bytes + reserved) as u64,
        per_namespace,
    })
}

/// WAL pages after which a commit checkpoints the ledger.
const WAL_CHECKPOINT_PAGES: i64 = 64;

/// Bytes the WAL is truncated to after a checkpoint.
const WAL_SIZE_LIMIT: i64 = 256 * 1024;

/// How long [`retry_busy`] keeps trying.
const BUSY_PATIENCE: Duration = Duration::from_secs(30);

/// Whether SQLite refused for contention (`SQLITE_BUSY`/`SQLITE_LOCKED`).
fn is_busy(e: &LedgerError) -> bool {
    matches!(
        e,
        LedgerError::Sqlite(rusqlite::Error::SqliteFailure(f, _))
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Runs `op` again (with a growing pause) while it fails with a busy
/// database, for up to [`BUSY_PATIENCE`]. The busy timeout covers waiting
/// for a lock, but in WAL mode SQLite also returns `SQLITE_BUSY` at once in
/// a few cases — another process recovering the WAL index, or closing and
/// checkpointing the last connection while this one opens — which a
/// multi-process test hit about once in 30 runs (`database is locked` from
/// an `evict` process).
fn retry_busy<T>(mut op: impl FnMut() -> Result<T, LedgerError>) -> Result<T, LedgerError> {
    let start = std::time::Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        match op() {
            Err(e) if is_busy(&e) && start.elapsed() < BUSY_PATIENCE => {
                tracing::debug!(error = %e, "ledger busy; retrying");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

impl Ledger {
    /// Opens (creating) the ledger database of a local store.
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
        Self::init(conn)
    }

    /// An in-memory ledger (S3 and memory stores).
    pub(crate) fn open_memory() -> Result<Self, LedgerError> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(mut conn: Connection) -> Result<Self, LedgerError> {
        // The common case reads only: a ledger at this build's version is
        // opened without taking the write lock (another process may hold
        // it for a while).
        if Self::stored_version(&conn)? == Some(LEDGER_VERSION) {
            return Ok(Ledger {
                conn: Arc::new(Mutex::new(conn)),
            });
        }
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);",
        )?;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let found = Self::stored_version(&tx)?;
        match found {
            None => tx.execute_batch(SCHEMA)?,
            Some(v) if v > LEDGER_VERSION => {
                return Err(LedgerError::Inconsistent(format!(
                    "ledger version {v} is newer than this build's {LEDGER_VERSION}: \
                     upgrade deltapack (or open the store with a ledger of its own)"
                )))
            }
            Some(v) => {
                for (to, sql) in MIGRATIONS {
                    if *to > v {
                        tracing::info!(from = v, to, "migrating the ledger");
                        tx.execute_batch(sql)?;
                    }
                }
            }
        }
        if found != Some(LEDGER_VERSION) {
            tx.execute(
                "INSERT OR REPLACE INTO meta(k, v) VALUES ('version', ?1)",
                [LEDGER_VERSION.to_string()],
            )?;
        }
        tx.commit()?;
        Ok(Ledger {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// The version a ledger database records (`None`: a new database).
    fn stored_version(conn: &Connection) -> Result<Option<u32>, LedgerError> {
        let has_meta: bool = conn
            .query_row(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                [],
                |_| Ok(true),
            )
            .optional()?
            .unwrap_or(false);
        if !has_meta {
            return Ok(None);
        }
        let version: Option<String> = conn
            .query_row("SELECT v FROM meta WHERE k = 'version'", [], |r| r.get(0))
            .optional()?;
        match version.as_deref() {
            None => Ok(None),
            Some(v) => v.parse::<u32>().map(Some).map_err(|_| {
                LedgerError::Inconsistent(format!("ledger version {v:?} is not a number"))
            }),
        }
    }

    /// Runs `f` on a blocking thread, never on an async worker: SQLite may
    /// wait for another process's lock (busy timeout, retries), and a
    /// worker blocked there could not run anything else — not even the
    /// deadline of the request that is waiting.
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
        mut f: impl FnMut(&mut Connection) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        let mut guard = match self.conn.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        retry_busy(|| f(&mut guard))
    }

    /// Records a root (idempotent: an existing root is only touched). Objects
    /// it references are counted (once per root) and un-condemned.
    pub(crate) fn record_root(&self, e: &RootEntry, now: u64) -> Result<(), LedgerError> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            record_in(&tx, e, now)?;
            tx.commit()?;
            Ok(())
        })
    }

    /// Marks accesses of many roots, `((namespace, context), ms)`, in one
    /// transaction (the batched form of [`Ledger::touch`]).
    pub(crate) fn touch_many(
        &self,
        touches: &[((Namespace, ContextDigest), u64)],
    ) -> Result<(), LedgerError> {
        if touches.is_empty() {
            return Ok(());
        }
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            for ((ns, ctx), now) in touches {
                let (ns, ctx) = hexpair(ns, ctx);
                tx.execute(
                    "UPDATE roots SET last_access = MAX(last_access, ?3) WHERE ns = ?1 AND ctx = ?2",
                    params![ns, ctx, *now as i64],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// Forgets a root; objects no other root references are condemned at
    /// `now`. Returns `(key, bytes)` of the newly condemned objects.
    pub(crate) fn remove_root(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        now: u64,
    ) -> Result<Vec<(String, u64)>, LedgerError> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let (ns, ctx) = hexpair(ns, ctx);
            let keys: Vec<String> = {
                let mut st = tx.prepare("SELECT key FROM refs WHERE ns = ?1 AND ctx = ?2")?;
                let rows = st.query_map(params![ns, ctx], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            let mut condemned = Vec::new();
            for key in keys {
                tx.execute("UPDATE objects SET refs = refs - 1 WHERE key = ?1", [&key])?;
                let (refs, bytes): (i64, i64) = tx.query_row(
                    "SELECT refs, bytes FROM objects WHERE key = ?1",
                    [&key],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?;
                if refs <= 0 {
                    tx.execute(
                        "UPDATE objects SET refs = 0, condemned_at = ?2 WHERE key = ?1",
                        params![key, now as i64],
                    )?;
                    condemned.push((key, bytes as u64));
                }
            }
            tx.execute(
                "DELETE FROM refs WHERE ns = ?1 AND ctx = ?2",
                params![ns, ctx],
            )?;
            tx.execute(
                "DELETE FROM roots WHERE ns = ?1 AND ctx = ?2",
                params![ns, ctx],
            )?;
            tx.execute(
                "DELETE FROM holds WHERE ns = ?1 AND ctx = ?2",
                params![ns, ctx],
            )?;
            tx.commit()?;
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
        self.with(|c| {
            let due: Vec<String> = {
                let mut st = c.prepare(DUE)?;
                let rows = st.query_map(params![cutoff as i64, now_ms() as i64], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            let (mut n, mut bytes) = (0u64, 0u64);
            for key in due {
                let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let still: Option<i64> = tx
                    .query_row(
                        STILL_DUE,
                        params![key, cutoff as i64, now_ms() as i64],
                        |r| r.get(0),
                    )
                    .optional()?;
                if let Some(b) = still {
                    if delete(&key) {
                        tx.execute("DELETE FROM objects WHERE key = ?1", [&key])?;
                        n += 1;
                        bytes += b as u64;
                    }
                }
                tx.commit()?;
            }
            Ok((n, bytes))
        })
    }

    /// Starts a publication: a fresh id from the database's sequence
    /// (never reused, so one publication's protections and reservation can
    /// never be dropped by another's end). Its reservation is a lease until
    /// `until` (ms), which the publisher renews while it runs
    /// ([`Ledger::renew_publication`]): a killed publisher's reservation
    /// lapses within one lease. Expired publications are cleaned up.
    pub(crate) fn begin_publication(&self, until: u64) -> Result<i64, LedgerError> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let now = now_ms() as i64;
            tx.execute("DELETE FROM publications WHERE until <= ?1", [now])?;
            tx.execute("DELETE FROM protected WHERE until <= ?1", [now])?;
            tx.execute(
                "INSERT INTO publications(reserved, until) VALUES (0, ?1)",
                [until as i64],
            )?;
            let id = tx.last_insert_rowid();
            tx.commit()?;
            Ok(id)
        })
    }

    /// Extends publication `id`'s lease to `until` (ms).
    pub(crate) fn renew_publication(&self, id: i64, until: u64) -> Result<(), LedgerError> {
        self.with(|c| {
            c.execute(
                "UPDATE publications SET until = MAX(until, ?2) WHERE id = ?1",
                params![id, until as i64],
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
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            tx.execute("UPDATE publications SET reserved = 0 WHERE id = ?1", [id])?;
            let t = totals_in(&tx)?;
            if t.used_bytes.saturating_add(need) > budget {
                return Ok(Some(t));
            }
            tx.execute(
                "UPDATE publications SET reserved = ?2 WHERE id = ?1",
                params![id, need as i64],
            )?;
            tx.commit()?;
            Ok(None)
        })
    }

    /// Protects objects a publication is about to rely on (or write) from
    /// garbage collection until `until` (ms), under the publication's
    /// `owner` id. Serialised with [`Ledger::collect`] by SQLite's write lock.
    pub(crate) fn protect(
        &self,
        owner: i64,
        keys: &[String],
        until: u64,
    ) -> Result<(), LedgerError> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            for k in keys {
                tx.execute(
                    "INSERT INTO protected(owner, key, until) VALUES (?1, ?2, ?3)
                     ON CONFLICT(owner, key) DO UPDATE SET until = ?3",
                    params![owner, k, until as i64],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// Ends a publication: drops its protections and its reservation (and
    /// any that expired).
    pub(crate) fn end_publication(&self, owner: i64) -> Result<(), LedgerError> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let now = now_ms() as i64;
            tx.execute(
                "DELETE FROM protected WHERE owner = ?1 OR until <= ?2",
                params![owner, now],
            )?;
            tx.execute(
                "DELETE FROM publications WHERE id = ?1 OR until <= ?2",
                params![owner, now],
            )?;
            tx.commit()?;
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
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let used: bool = tx.query_row(
                "SELECT COALESCE((SELECT refs FROM objects WHERE key = ?1), 0) > 0
                     OR EXISTS (SELECT 1 FROM protected WHERE key = ?1 AND until > ?2)",
                params![key, now_ms() as i64],
                |r| r.get(0),
            )?;
            if used && ran.is_none() {
                tx.commit()?;
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
                tx.execute("DELETE FROM objects WHERE key = ?1 AND refs = 0", [key])?;
            }
            tx.commit()?;
            Ok(done)
        })
    }

    /// Whether a recorded root references the object or a publication
    /// protects it.
    pub(crate) fn is_used(&self, key: &str) -> Result<bool, LedgerError> {
        self.with(|c| {
            Ok(c.query_row(
                "SELECT COALESCE((SELECT refs FROM objects WHERE key = ?1), 0) > 0
                     OR EXISTS (SELECT 1 FROM protected WHERE key = ?1 AND until > ?2)",
                params![key, now_ms() as i64],
                |r| r.get(0),
            )?)
        })
    }

    /// Keys due for deletion (for backends deleted asynchronously).
    pub(crate) fn due(&self, cutoff: u64) -> Result<Vec<(String, u64)>, LedgerError> {
        self.with(|c| {
            let mut st = c.prepare(&DUE.replace("SELECT key", "SELECT key, bytes"))?;
            let rows = st.query_map(params![cutoff as i64, now_ms() as i64], |r| {
                Ok((r.get(0)?, r.get::<_, i64>(1)? as u64))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
    }

    /// Forgets an object if it is still unreferenced.
    pub(crate) fn forget_if_condemned(&self, key: &str) -> Result<(), LedgerError> {
        self.with(|c| {
            c.execute("DELETE FROM objects WHERE key = ?1 AND refs = 0", [key])?;
            Ok(())
        })
    }

    /// Forgets an object (e.g. deleted or quarantined by the sweep).
    pub(crate) fn forget_object(&self, key: &str) -> Result<(), LedgerError> {
        self.with(|c| {
            c.execute("DELETE FROM objects WHERE key = ?1 AND refs = 0", [key])?;
            Ok(())
        })
    }

    /// Totals.
    pub(crate) fn totals(&self) -> Result<Totals, LedgerError> {
        self.with(|c| totals_in(c))
    }

    /// Every root, least recently used first.
    pub(crate) fn roots_lru(&self) -> Result<Vec<RootRow>, LedgerError> {
        self.with(|c| {
            let mut st =
                c.prepare("SELECT ns, ctx, schema, base_ns, base_ctx, last_access FROM roots ORDER BY last_access, ns, ctx")?;
            let rows = st.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, Option<String>>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (ns, ctx, schema, bns, bctx, la) = row?;
                let (namespace, context) = parse_pair(&ns, &ctx)?;
                let base = match (bns, bctx) {
                    (Some(a), Some(b)) => Some(parse_pair(&a, &b)?),
                    _ => None,
                };
                out.push(RootRow { namespace, context, schema, base, last_access_ms: la as u64 });
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
        self.with(|c| {
            let (ns, ctx) = hexpair(ns, ctx);
            c.execute(
                "INSERT OR IGNORE INTO holds(name, ns, ctx) VALUES (?1, ?2, ?3)",
                params![name, ns, ctx],
            )?;
            Ok(())
        })
    }

    /// Releases a hold.
    pub(crate) fn release_hold(
        &self,
        name: &str,
        ns: &Namespace,
        ctx: &ContextDigest,
    ) -> Result<bool, LedgerError> {
        self.with(|c| {
            let (ns, ctx) = hexpair(ns, ctx);
            Ok(c.execute(
                "DELETE FROM holds WHERE name = ?1 AND ns = ?2 AND ctx = ?3",
                params![name, ns, ctx],
            )? > 0)
        })
    }

    /// Whether any hold protects the root.
    pub(crate) fn is_held(&self, ns: &Namespace, ctx: &ContextDigest) -> Result<bool, LedgerError> {
        self.with(|c| {
            let (ns, ctx) = hexpair(ns, ctx);
            Ok(c.query_row(
                "SELECT 1 FROM holds WHERE ns = ?1 AND ctx = ?2 LIMIT 1",
                params![ns, ctx],
                |_| Ok(true),
            )
            .optional()?
            .unwrap_or(false))
        })
    }

    /// Replaces the whole content with what a listing of the store shows:
    /// `roots`, `holds`, and every present object `(key, bytes, last
    /// modified ms)`; present objects no root references are condemned as of
    /// their last modification.
    pub(crate) fn replace_all(
        &self,
        roots: &[RootEntry],
        holds: &[(String, Namespace, ContextDigest)],
        present: &[(String, u64, u64)],
        now: u64,
    ) -> Result<(), LedgerError> {
        // One transaction: other processes see the old ledger or the new
        // one, never a half-built one.
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            tx.execute_batch("DELETE FROM refs; DELETE FROM roots; DELETE FROM objects; DELETE FROM holds;")?;
            for r in roots {
                record_in(&tx, r, now)?;
            }
            for (name, ns, ctx) in holds {
                let (ns, ctx) = hexpair(ns, ctx);
                tx.execute("INSERT OR IGNORE INTO holds(name, ns, ctx) VALUES (?1, ?2, ?3)", params![name, ns, ctx])?;
            }
            for (key, bytes, mtime) in present {
                tx.execute(
                    "INSERT INTO objects(key, bytes, refs, condemned_at) VALUES (?1, ?2, 0, ?3) ON CONFLICT(key) DO NOTHING",
                    params![key, *bytes as i64, *mtime as i64],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// The comparable content (everything but access and condemnation times).
    pub(crate) fn image(&self) -> Result<LedgerImage, LedgerError> {
        self.with(|c| {
            let mut roots = Vec::new();
            {
                let mut st = c.prepare(
                    "SELECT ns, ctx, schema, kind, boundary, base_ns, base_ctx, root_bytes FROM roots ORDER BY ns, ctx",
                )?;
                let rows = st.query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)? as u64,
                        r.get::<_, Option<String>>(5)?,
                        r.get::<_, Option<String>>(6)?,
                        r.get::<_, i64>(7)? as u64,
                    ))
                })?;
                for row in rows {
                    let (ns, ctx, schema, kind, b, bns, bctx, rb) = row?;
                    let mut keys: Vec<String> = {
                        let mut st2 = c.prepare("SELECT key FROM refs WHERE ns = ?1 AND ctx = ?2 ORDER BY key")?;
                        let k = st2.query_map(params![ns, ctx], |r| r.get(0))?;
                        k.collect::<Result<_, _>>()?
                    };
                    keys.sort();
                    let base = bns.zip(bctx);
                    roots.push((ns, ctx, schema, kind, b, base, rb, keys));
                }
            }
            let objects = {
                let mut st = c.prepare("SELECT key, bytes, refs, condemned_at IS NOT NULL FROM objects ORDER BY key")?;
                let rows = st.query_map([], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64, r.get::<_, i64>(2)? as u64, r.get::<_, bool>(3)?))
                })?;
                rows.collect::<Result<_, _>>()?
            };
            let holds = {
                let mut st = c.prepare("SELECT name, ns, ctx FROM holds ORDER BY name, ns, ctx")?;
                let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                rows.collect::<Result<_, _>>()?
            };
            Ok(LedgerImage { roots, objects, holds })
        })
    }

    /// Adds counter deltas to the persisted counters.
    pub(crate) fn add_counters(&self, deltas: &[(&str, u64)]) -> Result<(), LedgerError> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            for (name, v) in deltas {
                if *v > 0 {
                    tx.execute(
                        "INSERT INTO counters(name, value) VALUES (?1, ?2) ON CONFLICT(name) DO UPDATE SET value = value + ?2",
                        params![name, *v as i64],
                    )?;
                }
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// The persisted counters.
    pub(crate) fn counters(&self) -> Result<Vec<(String, u64)>, LedgerError> {
        self.with(|c| {
            let mut st = c.prepare("SELECT name, value FROM counters ORDER BY name")?;
            let rows = st.query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
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
        let a = Ledger::open_file(&path).expect("open a");
        let b = Ledger::open_file(&path).expect("open b");
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

    /// A ledger written by the previous version (1) is migrated forward;
    /// one written by a newer build is refused with a clear message, not
    /// misread.
    #[test]
    fn older_ledgers_migrate_and_newer_ones_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("ledger.sqlite3");
        {
            let c = Connection::open(&path).expect("open");
            c.execute_batch(&SCHEMA.replace(
                "CREATE TABLE IF NOT EXISTS publications(id INTEGER PRIMARY KEY AUTOINCREMENT, reserved INTEGER NOT NULL, until INTEGER NOT NULL);",
                "",
            ))
            .expect("v1 schema");
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

//! The ledger's tables and their versions: creating, opening, migrating.
//!
//! Owns the SQL schema of both engines, the forward migrations, the
//! ledger's own id and its binding to a store. It must never migrate a
//! ledger newer than [`LEDGER_VERSION`]: this build would misread it.

use std::path::Path as FsPath;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deltapack_format::LedgerId;
use rusqlite::Connection;

use super::db::{Db, V};
use super::error::LedgerError;
use super::handle::retry_busy;
use super::handle::{Ledger, LedgerLocation};
use super::roots::{ckey, parse_pair};

/// The tables, SQLite dialect (version [`LEDGER_VERSION`]).
pub(super) const SQLITE_SCHEMA: &str = "
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
CREATE TABLE IF NOT EXISTS deleting(key TEXT PRIMARY KEY, since INTEGER NOT NULL, claimant INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS deleting_claimant ON deleting(claimant);
CREATE TABLE IF NOT EXISTS tombstones(kind TEXT NOT NULL, id TEXT NOT NULL, at INTEGER NOT NULL, PRIMARY KEY(kind, id));
";

/// The same tables, PostgreSQL dialect (version [`LEDGER_VERSION`]).
pub(super) const POSTGRES_SCHEMA: &str = "
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
CREATE TABLE IF NOT EXISTS deleting(key TEXT PRIMARY KEY, since BIGINT NOT NULL, claimant BIGINT NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS deleting_claimant ON deleting(claimant);
CREATE TABLE IF NOT EXISTS tombstones(kind TEXT NOT NULL, id TEXT NOT NULL, at BIGINT NOT NULL, PRIMARY KEY(kind, id));
";

/// Migrations: `(version, SQL)` — the SQL takes a ledger of the previous
/// version to this one, per engine. A fresh ledger is created at
/// [`LEDGER_VERSION`] directly.
pub(super) const SQLITE_MIGRATIONS: &[(u32, &str)] = &[
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
    // 4: delete claims name their collector, which renews them while it
    // lives (a heartbeat); a claim lapses seconds after its collector
    // stops instead of after a fixed two-minute lease. A build of version
    // 3 would honour renewed claims but treat its own as two-minute
    // leases nobody renews, so it must not share a ledger with this one.
    (
        4,
        "ALTER TABLE deleting ADD COLUMN claimant INTEGER NOT NULL DEFAULT 0;
         CREATE INDEX IF NOT EXISTS deleting_claimant ON deleting(claimant);",
    ),
];

/// PostgreSQL ledgers start at version 2.
pub(super) const POSTGRES_MIGRATIONS: &[(u32, &str)] = &[
    (
        3,
        "ALTER TABLE roots ADD COLUMN IF NOT EXISTS recorded_at BIGINT NOT NULL DEFAULT 0;
         ALTER TABLE roots ADD COLUMN IF NOT EXISTS ckey BIGINT NOT NULL DEFAULT 0;
         CREATE INDEX IF NOT EXISTS roots_ckey ON roots(ckey);
         ALTER TABLE holds ADD COLUMN IF NOT EXISTS since BIGINT NOT NULL DEFAULT 0;
         CREATE TABLE IF NOT EXISTS tombstones(kind TEXT NOT NULL, id TEXT NOT NULL, at BIGINT NOT NULL, PRIMARY KEY(kind, id));",
    ),
    (
        4,
        "ALTER TABLE deleting ADD COLUMN IF NOT EXISTS claimant BIGINT NOT NULL DEFAULT 0;
         CREATE INDEX IF NOT EXISTS deleting_claimant ON deleting(claimant);",
    ),
];

/// Ledger format version, bumped when the tables change. An older ledger is
/// migrated forward at open (`*_MIGRATIONS`); a newer one is refused (this
/// build would misread it).
pub(super) const LEDGER_VERSION: u32 = 4;

/// Fills `roots.ckey` of rows recorded before version 3.
pub(super) fn backfill_ckeys(db: &mut Db) -> Result<(), LedgerError> {
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

/// WAL pages after which a commit checkpoints the ledger.
pub(super) const WAL_CHECKPOINT_PAGES: i64 = 64;

/// Bytes the WAL is truncated to after a checkpoint.
pub(super) const WAL_SIZE_LIMIT: i64 = 256 * 1024;

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

    pub(super) fn open_file_once(path: &FsPath) -> Result<Self, LedgerError> {
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
        let url = super::url::LedgerUrl::parse(url)?;
        let tls = super::tls::TlsSettings::parse(&url)?;
        let connector = tls.connector()?;
        let mut config: tokio_postgres::Config = tls
            .driver_url
            .parse()
            .map_err(|e| LedgerError::Url(format!("{}: {e}", url.redacted())))?;
        // What the URL leaves out, from libpq's variables (`pgenv.rs`).
        super::pgenv::apply(
            &mut config,
            &|k| std::env::var(k).ok(),
            std::env::var_os("HOME").map(std::path::PathBuf::from),
        );
        // The server cancels a statement after `statement_timeout`: the
        // URL's (`options=-c statement_timeout=…`) or 60 s; the client gives
        // up on a call a margin later.
        let statement = match config.get_options() {
            Some(o) => super::url::statement_timeout(o)?,
            None => None,
        };
        let statement = match statement {
            Some(t) => t,
            None => {
                let ours = format!(
                    "-c statement_timeout={}",
                    super::db::PG_STATEMENT_TIMEOUT.as_millis()
                );
                let options = match config.get_options() {
                    Some(o) if !o.is_empty() => format!("{o} {ours}"),
                    _ => ours,
                };
                config.options(&options);
                super::db::PG_STATEMENT_TIMEOUT
            }
        };
        let call_timeout = statement + super::db::PG_CALL_MARGIN;
        // A session its client left inside a transaction (the client gave
        // up on a call, its connection black-holed on the way, the server
        // never saw the close) would hold the write lock until TCP noticed:
        // every writer of the fleet then timed out (the fleet campaign
        // found it). The server ends such a session after
        // `idle_in_transaction_session_timeout`: the URL's, or the call
        // deadline capped at 10 s (a live client idles inside a write
        // transaction for a network round trip between statements).
        let opts = config.get_options().unwrap_or_default().to_string();
        if !opts
            .replace('-', "_")
            .contains("idle_in_transaction_session_timeout")
        {
            let idle = call_timeout.min(super::db::PG_IDLE_IN_TRANSACTION);
            let ours = format!(
                "-c idle_in_transaction_session_timeout={}",
                idle.as_millis()
            );
            config.options(&if opts.is_empty() {
                ours
            } else {
                format!("{opts} {ours}")
            });
        }
        // The URL's `connect_timeout` bounds the whole start-up (TCP, TLS,
        // handshake: `db.rs`), as libpq's does; 10 s when it sets none.
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(super::db::PG_CONNECT_TIMEOUT);
        }
        Self::init(
            Db::Postgres(super::db::Pg::connect(config, connector, call_timeout)?),
            LedgerLocation {
                engine: "postgres",
                location: url.identity(),
                persisted: true,
            },
        )
    }

    /// The version a ledger database records (`None`: a new database).
    pub(super) fn stored_version(db: &mut Db) -> Result<Option<u32>, LedgerError> {
        let has_meta = match db.kind() {
            super::db::Kind::Sqlite => db
                .opt(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                    &[],
                )?
                .is_some(),
            super::db::Kind::Postgres => db
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

    pub(super) fn init(mut db: Db, location: LedgerLocation) -> Result<Self, LedgerError> {
        // The common case reads only: a ledger at this build's version is
        // opened without taking the write lock (another process may hold
        // it for a while).
        if Self::stored_version(&mut db)? != Some(LEDGER_VERSION) {
            let (schema, migrations) = match db.kind() {
                super::db::Kind::Sqlite => (SQLITE_SCHEMA, SQLITE_MIGRATIONS),
                super::db::Kind::Postgres => (POSTGRES_SCHEMA, POSTGRES_MIGRATIONS),
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
            reached: Arc::default(),
        })
    }

    /// The database's id (`meta.ledger_id`), created the first time: 16
    /// random bytes, never changed. A ledger at this build's version that
    /// already has one is read without the write lock.
    pub(super) fn ledger_id(db: &mut Db) -> Result<LedgerId, LedgerError> {
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
                        Err(LedgerError::OtherStore {
                            owner,
                            this: identity.to_string(),
                        })
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
}

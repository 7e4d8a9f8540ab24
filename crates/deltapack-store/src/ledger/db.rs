//! The two SQL engines behind the ledger, one interface.
//!
//! The ledger's statements are written once, in the dialect SQLite and
//! PostgreSQL share (`?N` placeholders, `ON CONFLICT … DO NOTHING/UPDATE`,
//! `CAST(… AS BIGINT)` around sums, `CASE` instead of two-argument `MAX`).
//! [`Db`] runs them on either engine: for PostgreSQL `?N` becomes `$N`, and
//! values cross as [`V`] (64-bit integers, text, nulls) so that no caller
//! sees a driver type.
//!
//! **Write transactions are serialised on both engines.** SQLite's
//! `BEGIN IMMEDIATE` takes the database's single write lock. PostgreSQL's
//! default isolation (read committed) would let two "check, then change"
//! transactions interleave, so every write transaction there starts by
//! taking one transaction-scoped advisory lock
//! (`pg_advisory_xact_lock`): all ledger writers of a fleet queue on it,
//! exactly as SQLite's writers queue on its lock, and each protocol step
//! that re-checks a condition before acting (the collector's re-check, the
//! budget reservation, the protection of keys) is atomic fleet-wide.
//! Reads run outside transactions and see committed state.

use std::time::Duration;

use super::error::LedgerError;

/// A value crossing the engine boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum V {
    /// A 64-bit integer (also booleans read back: 0 or 1).
    I(i64),
    /// Text.
    T(String),
    /// An absent integer.
    NullI,
    /// An absent text.
    NullT,
}

impl From<i64> for V {
    fn from(v: i64) -> Self {
        V::I(v)
    }
}

impl From<u64> for V {
    fn from(v: u64) -> Self {
        V::I(v as i64)
    }
}

impl From<&str> for V {
    fn from(v: &str) -> Self {
        V::T(v.to_string())
    }
}

impl From<String> for V {
    fn from(v: String) -> Self {
        V::T(v)
    }
}

impl From<&String> for V {
    fn from(v: &String) -> Self {
        V::T(v.clone())
    }
}

impl From<Option<String>> for V {
    fn from(v: Option<String>) -> Self {
        v.map_or(V::NullT, V::T)
    }
}

/// One result row.
#[derive(Debug, Clone)]
pub(crate) struct Row(pub(crate) Vec<V>);

impl Row {
    fn col(&self, i: usize) -> Result<&V, LedgerError> {
        self.0
            .get(i)
            .ok_or_else(|| LedgerError::Inconsistent(format!("ledger row has no column {i}")))
    }

    /// Column `i` as an integer.
    pub(crate) fn i64(&self, i: usize) -> Result<i64, LedgerError> {
        match self.col(i)? {
            V::I(v) => Ok(*v),
            other => Err(LedgerError::Inconsistent(format!(
                "ledger column {i}: expected an integer, found {other:?}"
            ))),
        }
    }

    /// Column `i` as a non-negative integer.
    pub(crate) fn u64(&self, i: usize) -> Result<u64, LedgerError> {
        let v = self.i64(i)?;
        u64::try_from(v)
            .map_err(|_| LedgerError::Inconsistent(format!("ledger column {i}: {v} is negative")))
    }

    /// Column `i` as a truth value.
    pub(crate) fn bool(&self, i: usize) -> Result<bool, LedgerError> {
        Ok(self.i64(i)? != 0)
    }

    /// Column `i` as text.
    pub(crate) fn text(&self, i: usize) -> Result<String, LedgerError> {
        match self.col(i)? {
            V::T(v) => Ok(v.clone()),
            other => Err(LedgerError::Inconsistent(format!(
                "ledger column {i}: expected text, found {other:?}"
            ))),
        }
    }

    /// Column `i` as optional text.
    pub(crate) fn opt_text(&self, i: usize) -> Result<Option<String>, LedgerError> {
        match self.col(i)? {
            V::NullT | V::NullI => Ok(None),
            _ => self.text(i).map(Some),
        }
    }

    /// Column `i` as an optional integer.
    pub(crate) fn opt_i64(&self, i: usize) -> Result<Option<i64>, LedgerError> {
        match self.col(i)? {
            V::NullT | V::NullI => Ok(None),
            _ => self.i64(i).map(Some),
        }
    }
}

/// Which engine, for messages and `ledger show`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// SQLite (a file, or in memory).
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

/// The advisory lock key every PostgreSQL write transaction takes
/// (`b"dpledger"` as an integer).
const PG_WRITE_LOCK: i64 = 0x6470_6c65_6467_6572;

/// A connection to one of the engines.
pub(crate) enum Db {
    /// SQLite.
    Sqlite(rusqlite::Connection),
    /// PostgreSQL, through the thread that owns the connection.
    Postgres(Pg),
}

/// A job for the PostgreSQL connection's thread.
type PgJob = Box<dyn FnOnce(&mut postgres::Client) + Send>;

/// A PostgreSQL connection owned by a thread of its own. The blocking
/// client drives a runtime of its own inside every call (and when it is
/// dropped), which panics on a thread that is already driving async tasks;
/// so no other thread ever touches the client: calls are sent to its thread
/// and their results sent back. The thread reconnects when the server has
/// closed the connection, and ends (closing the connection) when the last
/// handle is dropped.
pub(crate) struct Pg {
    jobs: std::sync::mpsc::Sender<PgJob>,
}

impl Pg {
    /// Connects (on the new connection's thread).
    pub(crate) fn connect(
        config: postgres::Config,
        connector: super::tls::Connector,
    ) -> Result<Pg, LedgerError> {
        use super::tls::Connector;
        let open = move |config: &postgres::Config| match &connector {
            Connector::Plain => config.connect(postgres::NoTls),
            Connector::Tls(tls) => config.connect(tls.clone()),
        };
        let (jobs, inbox) = std::sync::mpsc::channel::<PgJob>();
        let (ready_tx, ready) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("deltapack-ledger-pg".into())
            .spawn(move || {
                let mut client = match open(&config) {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(()));
                        c
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                for job in inbox {
                    if client.is_closed() {
                        tracing::info!("reconnecting to the PostgreSQL ledger");
                        match open(&config) {
                            Ok(c) => client = c,
                            // The job's own call reports the closed
                            // connection.
                            Err(e) => {
                                tracing::warn!(error = %e, "PostgreSQL ledger reconnect failed")
                            }
                        }
                    }
                    job(&mut client);
                }
            })
            .map_err(|e| LedgerError::Io {
                path: "PostgreSQL ledger thread".into(),
                source: e,
            })?;
        match ready.recv() {
            Ok(Ok(())) => Ok(Pg { jobs }),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(LedgerError::Task(
                "the PostgreSQL ledger thread ended".into(),
            )),
        }
    }

    /// Runs `f` with `sql` (rewritten for PostgreSQL) and `params` (as
    /// PostgreSQL values) on the connection's thread.
    fn with_params<T: Send + 'static>(
        &self,
        sql: &str,
        params: &[V],
        f: impl FnOnce(
                &mut postgres::Client,
                &str,
                &[&(dyn postgres::types::ToSql + Sync)],
            ) -> Result<T, postgres::Error>
            + Send
            + 'static,
    ) -> Result<T, LedgerError> {
        let (sql, params) = (pg_sql(sql), params.to_vec());
        self.call(move |c| {
            let p = pg_params(&params);
            let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
                p.iter().map(|b| b.as_ref()).collect();
            f(c, sql.as_str(), &refs)
        })
    }

    /// Runs `f` on the connection's thread and waits for its result.
    fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut postgres::Client) -> Result<T, postgres::Error> + Send + 'static,
    ) -> Result<T, LedgerError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.jobs
            .send(Box::new(move |c| {
                let _ = tx.send(f(c));
            }))
            .map_err(|_| LedgerError::Task("the PostgreSQL ledger thread ended".into()))?;
        rx.recv()
            .map_err(|_| LedgerError::Task("the PostgreSQL ledger thread ended".into()))?
            .map_err(LedgerError::from)
    }
}

/// `?N` placeholders as PostgreSQL's `$N`. Only outside quoted text, which
/// the ledger's statements never put a `?` in.
fn pg_sql(sql: &str) -> String {
    sql.replace('?', "$")
}

fn sqlite_params(params: &[V]) -> Vec<rusqlite::types::Value> {
    use rusqlite::types::Value;
    params
        .iter()
        .map(|v| match v {
            V::I(i) => Value::Integer(*i),
            V::T(t) => Value::Text(t.clone()),
            V::NullI | V::NullT => Value::Null,
        })
        .collect()
}

fn sqlite_row(r: &rusqlite::Row<'_>, n: usize) -> Result<Row, LedgerError> {
    use rusqlite::types::ValueRef;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(match r.get_ref(i)? {
            ValueRef::Integer(v) => V::I(v),
            ValueRef::Text(t) => V::T(String::from_utf8_lossy(t).into_owned()),
            ValueRef::Null => V::NullT,
            ValueRef::Real(f) => V::I(f as i64),
            ValueRef::Blob(_) => {
                return Err(LedgerError::Inconsistent(
                    "ledger column holds a blob".into(),
                ))
            }
        });
    }
    Ok(out.into())
}

impl From<Vec<V>> for Row {
    fn from(v: Vec<V>) -> Self {
        Row(v)
    }
}

fn pg_row(r: &postgres::Row) -> Result<Row, LedgerError> {
    use postgres::types::Type;
    let mut out = Vec::with_capacity(r.len());
    for (i, c) in r.columns().iter().enumerate() {
        let t = c.type_();
        let v = if *t == Type::INT8 {
            r.try_get::<_, Option<i64>>(i)?.map_or(V::NullI, V::I)
        } else if *t == Type::INT4 {
            r.try_get::<_, Option<i32>>(i)?
                .map_or(V::NullI, |v| V::I(v.into()))
        } else if *t == Type::INT2 {
            r.try_get::<_, Option<i16>>(i)?
                .map_or(V::NullI, |v| V::I(v.into()))
        } else if *t == Type::BOOL {
            r.try_get::<_, Option<bool>>(i)?
                .map_or(V::NullI, |v| V::I(v.into()))
        } else if *t == Type::TEXT || *t == Type::VARCHAR || *t == Type::NAME {
            r.try_get::<_, Option<String>>(i)?.map_or(V::NullT, V::T)
        } else {
            return Err(LedgerError::Inconsistent(format!(
                "ledger column {i} has PostgreSQL type {t} (a statement lacks a CAST)"
            )));
        };
        out.push(v);
    }
    Ok(out.into())
}

fn pg_params(params: &[V]) -> Vec<Box<dyn postgres::types::ToSql + Sync>> {
    params
        .iter()
        .map(|v| -> Box<dyn postgres::types::ToSql + Sync> {
            match v {
                V::I(i) => Box::new(*i),
                V::T(t) => Box::new(t.clone()),
                V::NullI => Box::new(None::<i64>),
                V::NullT => Box::new(None::<String>),
            }
        })
        .collect()
}

impl Db {
    /// The engine.
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Db::Sqlite(_) => Kind::Sqlite,
            Db::Postgres(_) => Kind::Postgres,
        }
    }

    /// Runs a statement; returns the rows it changed.
    pub(crate) fn exec(&mut self, sql: &str, params: &[V]) -> Result<u64, LedgerError> {
        match self {
            Db::Sqlite(c) => {
                let mut st = c.prepare_cached(sql)?;
                Ok(st.execute(rusqlite::params_from_iter(sqlite_params(params)))? as u64)
            }
            Db::Postgres(c) => c.with_params(sql, params, |c, sql, p| c.execute(sql, p)),
        }
    }

    /// Runs a query; returns every row.
    pub(crate) fn query(&mut self, sql: &str, params: &[V]) -> Result<Vec<Row>, LedgerError> {
        match self {
            Db::Sqlite(c) => {
                let mut st = c.prepare_cached(sql)?;
                let n = st.column_count();
                let mut rows = st.query(rusqlite::params_from_iter(sqlite_params(params)))?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    out.push(sqlite_row(r, n)?);
                }
                Ok(out)
            }
            Db::Postgres(c) => c
                .with_params(sql, params, |c, sql, p| c.query(sql, p))?
                .iter()
                .map(pg_row)
                .collect(),
        }
    }

    /// Runs a query; returns every row as `f` reads it.
    pub(crate) fn query_map<T>(
        &mut self,
        sql: &str,
        params: &[V],
        f: impl Fn(&Row) -> Result<T, LedgerError>,
    ) -> Result<Vec<T>, LedgerError> {
        self.query(sql, params)?.iter().map(f).collect()
    }

    /// Runs a query expected to return at most one row.
    pub(crate) fn opt(&mut self, sql: &str, params: &[V]) -> Result<Option<Row>, LedgerError> {
        Ok(self.query(sql, params)?.into_iter().next())
    }

    /// Runs a query expected to return exactly one row.
    pub(crate) fn one(&mut self, sql: &str, params: &[V]) -> Result<Row, LedgerError> {
        self.opt(sql, params)?
            .ok_or_else(|| LedgerError::Inconsistent(format!("no row from {sql:?}")))
    }

    /// Runs several statements (DDL, migrations).
    pub(crate) fn batch(&mut self, sql: &str) -> Result<(), LedgerError> {
        match self {
            Db::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Db::Postgres(c) => {
                let sql = sql.to_string();
                c.call(move |c| c.batch_execute(&sql))
            }
        }
    }

    /// Inside a write transaction: let its commit return before the commit
    /// record is flushed to disk (PostgreSQL's `synchronous_commit = off`
    /// for this transaction; SQLite ledgers already commit without a flush,
    /// `synchronous = NORMAL` in WAL mode). For a publication's leases
    /// only — its id, reservation and protections, which a crashed server
    /// could lose no worse than a publisher that cannot reach the ledger
    /// (it publishes on; the grace period is the margin). Under a heavy
    /// publication on the same disk each flush took 100–370 ms, one per
    /// extent.
    pub(crate) fn lease_commit(&mut self) -> Result<(), LedgerError> {
        match self {
            Db::Sqlite(_) => Ok(()),
            Db::Postgres(_) => self.batch("SET LOCAL synchronous_commit TO OFF"),
        }
    }

    /// Starts a write transaction (serialised with every other writer; see
    /// the module docs).
    fn begin_write(&mut self) -> Result<(), LedgerError> {
        match self {
            Db::Sqlite(c) => Ok(c.execute_batch("BEGIN IMMEDIATE")?),
            Db::Postgres(c) => c.call(|c| {
                c.batch_execute("BEGIN")?;
                if let Err(e) = c.execute("SELECT pg_advisory_xact_lock($1)", &[&PG_WRITE_LOCK]) {
                    let _ = c.batch_execute("ROLLBACK");
                    return Err(e);
                }
                Ok(())
            }),
        }
    }

    /// Runs `f` as one write transaction: committed if it returns `Ok`,
    /// rolled back otherwise.
    pub(crate) fn write<T>(
        &mut self,
        f: impl FnOnce(&mut Db) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        self.begin_write()?;
        match f(self) {
            Ok(v) => {
                self.batch("COMMIT")?;
                Ok(v)
            }
            Err(e) => {
                let _ = self.batch("ROLLBACK");
                Err(e)
            }
        }
    }

    /// Whether the error means "another writer holds the lock; try again".
    pub(crate) fn is_busy(e: &LedgerError) -> bool {
        matches!(
            e.sqlite_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        )
    }
}

/// How long a PostgreSQL statement may run before the server cancels it
/// (a lock held by a stuck node must not hang every other node forever).
pub(crate) const PG_STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);

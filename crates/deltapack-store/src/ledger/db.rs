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
type PgJob = Box<dyn FnOnce(&mut PgConn) + Send>;

/// Calls that may wait for the connection's thread at once; more fail at
/// once with [`LedgerError::Unreachable`]. A server that accepts and never
/// answers holds each call for its deadline: this bounds the threads
/// waiting on it (each waiting call holds a blocking-pool thread).
pub(crate) const PG_MAX_WAITING: usize = 64;

/// After the server failed to answer (a connect or a call past its
/// deadline), calls fail at once for this long
/// instead of trying again: the calls queued behind a stuck one drain
/// immediately, and an outage costs one deadline per interval, not one
/// per call.
pub(crate) const PG_PROBE_INTERVAL: Duration = Duration::from_secs(5);

/// How long a connection's start-up (TCP connect, TLS and the start-up
/// handshake together) may take when the URL sets no `connect_timeout`.
pub(crate) const PG_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How much longer than the server's statement timeout one call may wait
/// for the server's answer before the connection is dropped (65 s with the
/// default [`PG_STATEMENT_TIMEOUT`]).
pub(crate) const PG_CALL_MARGIN: Duration = Duration::from_secs(5);

/// The longest a session may sit idle inside a transaction before the
/// server ends it (unless the URL's `options` set
/// `idle_in_transaction_session_timeout`; the call deadline when shorter).
pub(crate) const PG_IDLE_IN_TRANSACTION: Duration = Duration::from_secs(10);

/// A PostgreSQL connection owned by a thread of its own, driven by a
/// single-threaded runtime of that thread, so that every step has a
/// deadline: the connect (TCP, TLS and the start-up handshake:
/// [`PG_CONNECT_TIMEOUT`] or the URL's `connect_timeout`) and each call
/// (the statement timeout plus [`PG_CALL_MARGIN`]). A call past its deadline drops the connection
/// (the server rolls back whatever it had begun) and fails with
/// [`LedgerError::Unreachable`]; the next call connects again. At most
/// [`PG_MAX_WAITING`] calls wait for the thread at once. So a server that
/// accepts connections and never answers costs one thread and a bounded
/// number of waiting callers, never more, and every call returns. The
/// thread ends (closing the connection) when the last handle is dropped.
pub(crate) struct Pg {
    jobs: std::sync::mpsc::Sender<PgJob>,
    waiting: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// The connection thread's state.
pub(crate) struct PgConn {
    rt: tokio::runtime::Runtime,
    config: tokio_postgres::Config,
    connector: super::tls::Connector,
    connect_timeout: Duration,
    /// How long one call may wait for its answer.
    call_timeout: Duration,
    client: Option<tokio_postgres::Client>,
    driver: Option<tokio::task::JoinHandle<()>>,
    /// A transaction was open when the connection was lost: every call
    /// fails until it is ended (its `ROLLBACK` succeeds, its `COMMIT`
    /// fails), so nothing of it runs outside a transaction.
    lost_transaction: bool,
    in_transaction: bool,
    /// Until when calls fail at once (see [`PG_PROBE_INTERVAL`]).
    down_until: Option<std::time::Instant>,
}

impl PgConn {
    /// Connects, within the connect deadline.
    fn open(&mut self) -> Result<(), LedgerError> {
        use super::tls::Connector;
        self.close();
        let (config, connector, d) = (&self.config, &self.connector, self.connect_timeout);
        let connected = self.rt.block_on(async {
            let fut = async {
                Ok::<_, tokio_postgres::Error>(match connector {
                    Connector::Plain => {
                        let (c, conn) = config.connect(tokio_postgres::NoTls).await?;
                        (
                            c,
                            tokio::spawn(async move {
                                let _ = conn.await;
                            }),
                        )
                    }
                    Connector::Tls(tls) => {
                        let (c, conn) = config.connect(tls.clone()).await?;
                        (
                            c,
                            tokio::spawn(async move {
                                let _ = conn.await;
                            }),
                        )
                    }
                })
            };
            tokio::time::timeout(d, fut).await
        });
        match connected {
            Ok(Ok((client, driver))) => {
                self.client = Some(client);
                self.driver = Some(driver);
                Ok(())
            }
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(LedgerError::Unreachable(format!(
                "no answer to the connection's start-up within {d:?}"
            ))),
        }
    }

    /// Drops the connection (the server ends its session).
    fn close(&mut self) {
        self.client = None;
        if let Some(d) = self.driver.take() {
            d.abort();
        }
        if self.in_transaction {
            self.lost_transaction = true;
            self.in_transaction = false;
        }
    }

    /// A connection to run a call on: the current one, or a new one.
    fn ready(&mut self) -> Result<(), LedgerError> {
        if self.lost_transaction {
            return Err(LedgerError::Unreachable(
                "the connection was lost inside a transaction".into(),
            ));
        }
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            if let Some(t) = self.down_until {
                let now = std::time::Instant::now();
                if now < t {
                    return Err(LedgerError::Unreachable(format!(
                        "the server did not answer the last attempt; the next one in {:?}",
                        t - now
                    )));
                }
            }
            tracing::info!("connecting to the PostgreSQL ledger");
            if let Err(e) = self.open() {
                // Only a server that did not answer in time: a refused
                // connection fails fast anyway, and one to a server that
                // is starting again should succeed at the next call.
                if matches!(e, LedgerError::Unreachable(_)) {
                    self.down_until = Some(std::time::Instant::now() + PG_PROBE_INTERVAL);
                }
                return Err(e);
            }
            self.down_until = None;
        }
        Ok(())
    }

    /// The outcome of a call that ran within its deadline (see
    /// [`within`]); past it, drops the connection.
    fn finish<T>(
        &mut self,
        out: Result<Result<T, tokio_postgres::Error>, tokio::time::error::Elapsed>,
    ) -> Result<T, LedgerError> {
        match out {
            Ok(r) => Ok(r?),
            Err(_) => {
                self.close();
                self.down_until = Some(std::time::Instant::now() + PG_PROBE_INTERVAL);
                Err(LedgerError::Unreachable(format!(
                    "no answer within {:?}; the connection was dropped",
                    self.call_timeout
                )))
            }
        }
    }

    /// The connected client ([`PgConn::ready`] first).
    fn client(&self) -> Result<&tokio_postgres::Client, LedgerError> {
        self.client
            .as_ref()
            .ok_or_else(|| LedgerError::Unreachable("not connected".into()))
    }

    /// Runs a statement; the rows it changed.
    pub(crate) fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<u64, LedgerError> {
        self.ready()?;
        let out = within(
            &self.rt,
            self.call_timeout,
            self.client()?.execute(sql, params),
        );
        self.finish(out)
    }

    /// Runs a query; every row.
    pub(crate) fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, LedgerError> {
        self.ready()?;
        let out = within(
            &self.rt,
            self.call_timeout,
            self.client()?.query(sql, params),
        );
        self.finish(out)
    }

    /// Runs statements without parameters, keeping track of the
    /// transaction they begin or end.
    pub(crate) fn batch_execute(&mut self, sql: &str) -> Result<(), LedgerError> {
        let word = sql.trim().to_ascii_uppercase();
        let ends = word == "ROLLBACK" || word == "COMMIT";
        // The end of a transaction whose connection is gone (lost, or
        // closed under it) is answered here, without connecting: on a new
        // connection there is nothing to end, and a reconnection inside
        // `ready` would mark the transaction lost again with no caller
        // left to end it — every later call failed for ever (the fleet
        // campaign found it with the ledger black-holed mid-transaction).
        let gone = self.lost_transaction
            || (self.in_transaction && self.client.as_ref().is_none_or(|c| c.is_closed()));
        if ends && gone {
            self.lost_transaction = false;
            self.in_transaction = false;
            return if word == "ROLLBACK" {
                Ok(())
            } else {
                Err(LedgerError::Unreachable(
                    "the connection was lost before the commit; nothing was committed".into(),
                ))
            };
        }
        self.ready()?;
        let out = within(
            &self.rt,
            self.call_timeout,
            self.client()?.batch_execute(sql),
        );
        let done = self.finish(out);
        if ends {
            // The transaction is over whatever the answer: a commit that
            // got none, on a connection now dropped, is returned as an
            // error (its outcome unknown to the caller), and the next call
            // runs on a new connection. (Left marked lost, this connection
            // failed every later call for ever: the fleet campaign found
            // it after a black-holed commit.)
            self.in_transaction = false;
            self.lost_transaction = false;
        }
        done?;
        match word.as_str() {
            "BEGIN" => self.in_transaction = true,
            "COMMIT" | "ROLLBACK" => self.in_transaction = false,
            _ => {}
        }
        Ok(())
    }
}

/// Drives `fut` on `rt` for at most `deadline`.
fn within<T>(
    rt: &tokio::runtime::Runtime,
    deadline: Duration,
    fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<Result<T, tokio_postgres::Error>, tokio::time::error::Elapsed> {
    rt.block_on(async { tokio::time::timeout(deadline, fut).await })
}

impl Pg {
    /// Connects (on the new connection's thread), within the connect
    /// deadline; each later call waits at most `call_timeout`.
    pub(crate) fn connect(
        config: tokio_postgres::Config,
        connector: super::tls::Connector,
        call_timeout: Duration,
    ) -> Result<Pg, LedgerError> {
        let connect_timeout = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(PG_CONNECT_TIMEOUT);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| LedgerError::Io {
                path: "PostgreSQL ledger runtime".into(),
                source: e,
            })?;
        let mut conn = PgConn {
            rt,
            config,
            connector,
            connect_timeout,
            call_timeout,
            client: None,
            driver: None,
            lost_transaction: false,
            in_transaction: false,
            down_until: None,
        };
        let (jobs, inbox) = std::sync::mpsc::channel::<PgJob>();
        let (ready_tx, ready) = std::sync::mpsc::sync_channel(1);
        // Named after the server's port (a thread name holds 15 bytes), so
        // a stuck connection is easy to spot in a thread list.
        let port = conn.config.get_ports().first().copied().unwrap_or(5432);
        std::thread::Builder::new()
            .name(format!("ledger-pg:{port}"))
            .spawn(move || {
                let first = conn.open();
                let ok = first.is_ok();
                let _ = ready_tx.send(first);
                if !ok {
                    return;
                }
                for job in inbox {
                    job(&mut conn);
                }
                conn.close();
            })
            .map_err(|e| LedgerError::Io {
                path: "PostgreSQL ledger thread".into(),
                source: e,
            })?;
        // The thread answers within the connect deadline; the margin only
        // covers a thread that could not start.
        match ready.recv_timeout(connect_timeout + Duration::from_secs(5)) {
            Ok(Ok(())) => Ok(Pg {
                jobs,
                waiting: Default::default(),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(LedgerError::Unreachable(
                "the PostgreSQL ledger thread did not answer".into(),
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
                &mut PgConn,
                &str,
                &[&(dyn postgres::types::ToSql + Sync)],
            ) -> Result<T, LedgerError>
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

    /// Runs `f` on the connection's thread and waits for its result (at
    /// most [`PG_MAX_WAITING`] calls wait at once).
    fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut PgConn) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        use std::sync::atomic::Ordering;
        struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= PG_MAX_WAITING {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(LedgerError::Unreachable(format!(
                "{PG_MAX_WAITING} calls are already waiting for the PostgreSQL ledger"
            )));
        }
        let _waiting = Waiting(&self.waiting);
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.jobs
            .send(Box::new(move |c| {
                let _ = tx.send(f(c));
            }))
            .map_err(|_| LedgerError::Task("the PostgreSQL ledger thread ended".into()))?;
        rx.recv()
            .map_err(|_| LedgerError::Task("the PostgreSQL ledger thread ended".into()))?
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

/// Milliseconds since the epoch, by this machine's clock.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Db {
    /// The engine.
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Db::Sqlite(_) => Kind::Sqlite,
            Db::Postgres(_) => Kind::Postgres,
        }
    }

    /// The ledger's clock, in milliseconds since the epoch: the database
    /// server's for PostgreSQL (shared by every node, whatever their own
    /// clocks say), this machine's for SQLite (whose every user is on it).
    /// What judges leases many nodes compare, such as delete claims.
    pub(crate) fn clock_ms(&mut self) -> Result<u64, LedgerError> {
        match self {
            Db::Sqlite(_) => Ok(now_ms()),
            Db::Postgres(_) => self
                .one(
                    "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT",
                    &[],
                )?
                .u64(0),
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

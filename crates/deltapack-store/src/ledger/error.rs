//! The ledger's error type.
//!
//! Owns [`LedgerError`] and what callers may ask of it (is the database
//! unavailable?). Imports nothing else of the ledger.

/// Errors of the ledger database. Its public shape names no type of the
/// database drivers: an engine's own error is the [`EngineError`]'s
/// `source()`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// SQLite failed.
    #[error("ledger database: {0}")]
    Sqlite(EngineError),
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
    Postgres(EngineError),
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
    /// The ledger (outside the store) already keeps the account of another
    /// store: nothing is wrong with it, it is just not this store's.
    #[error(
        "this ledger keeps the account of the store {owner}, not of {this}: give each store \
         (bucket and prefix) a ledger of its own (another database, or another schema: \
         ?options=-c%20search_path%3DSCHEMA in a PostgreSQL URL)"
    )]
    OtherStore {
        /// The store the ledger belongs to.
        owner: String,
        /// The store that asked.
        this: String,
    },
    /// The blocking task running a ledger call failed (panicked or was
    /// cancelled at shutdown).
    #[error("ledger task: {0}")]
    Task(String),
    /// The ledger's server did not answer in time (a connection whose
    /// start-up handshake or statement outlived its deadline), or too many
    /// calls are already waiting on it.
    #[error("ledger database unreachable: {0}")]
    Unreachable(String),
}

/// A failure of one of the ledger's database engines. It displays as the
/// engine's error does, and that error is its `source()`.
#[derive(Debug)]
pub struct EngineError(Engine);

#[derive(Debug)]
enum Engine {
    Sqlite(rusqlite::Error),
    Postgres(postgres::Error),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Engine::Sqlite(e) => e.fmt(f),
            Engine::Postgres(e) => {
                // The driver's own text is a category ("db error", "invalid
                // configuration", "error performing TLS handshake"); what
                // happened is the server's message or the error's causes.
                match e.as_db_error() {
                    // The server's own text (severity, message, detail,
                    // hint), then its SQLSTATE.
                    Some(db) => write!(f, "{db} [SQLSTATE {}]", db.code().code()),
                    None => {
                        e.fmt(f)?;
                        let mut source = std::error::Error::source(e);
                        while let Some(s) = source {
                            write!(f, ": {s}")?;
                            source = s.source();
                        }
                        Ok(())
                    }
                }
            }
        }
    }
}

/// What to do about a PostgreSQL failure a new operator commonly meets,
/// if it is one: by SQLSTATE for the server's errors, by the driver's
/// cause otherwise.
fn pg_hint(e: &postgres::Error) -> Option<&'static str> {
    if let Some(db) = e.as_db_error() {
        return match db.code().code() {
            "28P01" => Some(
                "the server refused the password: check the URL's password, PGPASSWORD or \
                 the password file (PGPASSFILE or ~/.pgpass); the URL wins",
            ),
            "28000" => Some(
                "the server does not accept this user from this host: check the user name \
                 (it must be a role that can log in) and the server's pg_hba.conf",
            ),
            "3D000" => Some(
                "the database does not exist: create it first (CREATE DATABASE …; see the \
                 README's PostgreSQL recipe)",
            ),
            "42501" => Some(
                "the ledger's role lacks a privilege: it creates its tables at first use, so \
                 it needs CREATE on its schema (PostgreSQL 15 and later no longer grant it on \
                 `public`: own the database or the schema, or GRANT CREATE ON SCHEMA … TO …)",
            ),
            "53300" => Some(
                "the server has no free connection slot: raise max_connections or run fewer \
                 processes against it",
            ),
            _ => None,
        };
    }
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        causes.push(s.to_string());
        source = s.source();
    }
    let causes = causes.join(": ");
    if causes.contains("password missing") {
        Some(
            "the server asks for a password and none was given: put it in the URL \
             (postgres://USER:PASSWORD@HOST/DB), in PGPASSWORD or in the password file \
             (PGPASSFILE or ~/.pgpass)",
        )
    } else if causes.contains("not valid for name") || causes.contains("NotValidForName") {
        Some(
            "the server's certificate does not name the host the URL connects to: \
             connect by a name (or address) the certificate lists, as verify-full checks it",
        )
    } else if causes.contains("UnknownIssuer") || causes.contains("unknown issuer") {
        Some(
            "the server's certificate does not chain to the CA in sslrootcert: give the CA \
             that signed it",
        )
    } else {
        None
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            Engine::Sqlite(e) => Some(e),
            Engine::Postgres(e) => Some(e),
        }
    }
}

impl From<rusqlite::Error> for LedgerError {
    fn from(e: rusqlite::Error) -> Self {
        LedgerError::Sqlite(EngineError(Engine::Sqlite(e)))
    }
}

impl From<postgres::Error> for LedgerError {
    fn from(e: postgres::Error) -> Self {
        LedgerError::Postgres(EngineError(Engine::Postgres(e)))
    }
}

impl LedgerError {
    /// What to do about this failure, for the ones a new operator commonly
    /// meets (PostgreSQL authentication, a missing password or database,
    /// missing privileges, a certificate that does not name the host).
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            LedgerError::Postgres(EngineError(Engine::Postgres(e))) => pg_hint(e),
            _ => None,
        }
    }

    /// SQLite's result code, for a SQLite failure.
    pub(crate) fn sqlite_code(&self) -> Option<rusqlite::ErrorCode> {
        match self {
            LedgerError::Sqlite(EngineError(Engine::Sqlite(rusqlite::Error::SqliteFailure(
                f,
                _,
            )))) => Some(f.code),
            _ => None,
        }
    }

    /// Whether the ledger could not be reached at all (as opposed to
    /// answering with an error): a connection refused, reset or timed out,
    /// a closed PostgreSQL connection, a statement cancelled by its
    /// timeout, a SQLite file that cannot be opened or is not a database,
    /// a database still busy after every retry.
    pub fn is_unavailable(&self) -> bool {
        use std::io::ErrorKind as K;
        match self {
            LedgerError::Unreachable(_) => true,
            LedgerError::Postgres(EngineError(Engine::Postgres(e))) => {
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
                // (A connect that timed out carries an I/O error of kind
                // TimedOut, matched above.)
                false
            }
            LedgerError::Sqlite(_) => self.sqlite_code().is_some_and(|code| {
                matches!(
                    code,
                    rusqlite::ErrorCode::CannotOpen
                        | rusqlite::ErrorCode::NotADatabase
                        | rusqlite::ErrorCode::DatabaseBusy
                        | rusqlite::ErrorCode::DatabaseLocked
                        | rusqlite::ErrorCode::SystemIoFailure
                        | rusqlite::ErrorCode::PermissionDenied
                        | rusqlite::ErrorCode::DatabaseCorrupt
                )
            }),
            LedgerError::Io { .. } | LedgerError::Task(_) => true,
            _ => false,
        }
    }
}

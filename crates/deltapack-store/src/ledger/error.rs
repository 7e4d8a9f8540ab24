//! The ledger's error type.
//!
//! Owns [`LedgerError`] and what callers may ask of it (is the database
//! unavailable?). Imports nothing else of the ledger.

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

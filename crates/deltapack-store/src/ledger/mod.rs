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

//!
//! The code is split by concept: `handle` (the connection and its
//! transactions), `schema` (tables, migrations, binding), `roots`,
//! `objects`, `publications`, `claims`, `holds`, `merge` (rebuilds) and
//! `counters`; `db` runs one set of statements on either engine and `tls`
//! connects to PostgreSQL over TLS.

mod claims;
mod counters;
mod db;
mod error;
mod handle;
mod holds;
mod merge;
mod objects;
mod pgenv;
mod publications;
mod roots;
mod schema;
mod tls;
mod url;

pub(crate) use claims::{Claimant, CLAIM_WAIT_LIMIT};
pub use error::{EngineError, LedgerError};
pub(crate) use handle::{now_ms, Ledger};
pub use handle::{ColdStart, LedgerLocation};
pub(crate) use merge::Listing;
pub use merge::{ImageHold, ImageObject, ImageRoot, LedgerImage, MergeReport};
pub use objects::Totals;
pub(crate) use roots::{RootEntry, RootRow};
pub(crate) use url::holds_secret;
pub use url::redact_ledger_url;

#[cfg(test)]
mod tests;

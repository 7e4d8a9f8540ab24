//! Errors and miss reasons of the store.
//!
//! deltapack separates *misses* from *errors* (docs/design.md §5, invariant 5): a miss means "no
//! usable state here, recompute the prefix" and carries a reason; an error is
//! an I/O failure or a broken internal invariant. Corruption is a miss for the
//! caller, but it is never silent: it is counted, logged and quarantined.

use deltapack_format::{ContextDigest, Namespace};

use crate::keys::ObjectKey;
use crate::object_check::ObjectCheck;

/// Why a restore did not produce a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum MissReason {
    /// No root exists for the context.
    Absent,
    /// A root or object failed verification, is missing, or is inconsistent.
    Corrupt {
        /// The damaged object, when one object is to blame.
        #[serde(skip_serializing_if = "Option::is_none")]
        object: Option<ObjectKey>,
        /// The check it failed, when an object's check failed.
        #[serde(skip_serializing_if = "Option::is_none")]
        check: Option<ObjectCheck>,
        /// What was damaged, in words (root or object key and the check).
        what: String,
    },
    /// The root's envelope version or schema is unknown to this reader.
    Incompatible {
        /// Why.
        detail: String,
    },
    /// The delta's base root could not be restored.
    BaseMissing {
        /// The base's damaged or missing object, when one is to blame.
        #[serde(skip_serializing_if = "Option::is_none")]
        object: Option<ObjectKey>,
        /// Why the base did not restore.
        detail: String,
    },
    /// The restore's deadline passed.
    DeadlineExceeded,
    /// The store is keyed and the root's MAC is missing or wrong.
    Unauthenticated {
        /// Why.
        detail: String,
    },
}

impl MissReason {
    /// A `corrupt` miss.
    pub(crate) fn corrupt(
        object: Option<ObjectKey>,
        check: Option<ObjectCheck>,
        what: impl Into<String>,
    ) -> Self {
        MissReason::Corrupt {
            object,
            check,
            what: what.into(),
        }
    }

    /// A `corrupt` miss blamed on no single object.
    pub(crate) fn damaged(what: impl Into<String>) -> Self {
        MissReason::corrupt(None, None, what)
    }

    /// A `base-missing` miss blamed on no single object.
    pub(crate) fn base_missing(detail: impl Into<String>) -> Self {
        MissReason::BaseMissing {
            object: None,
            detail: detail.into(),
        }
    }

    /// The object a `corrupt` or `base-missing` miss blames, if any.
    pub fn object(&self) -> Option<&ObjectKey> {
        match self {
            MissReason::Corrupt { object, .. } | MissReason::BaseMissing { object, .. } => {
                object.as_ref()
            }
            _ => None,
        }
    }

    /// Short stable label (`absent`, `corrupt`, …) for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            MissReason::Absent => "absent",
            MissReason::Corrupt { .. } => "corrupt",
            MissReason::Incompatible { .. } => "incompatible",
            MissReason::BaseMissing { .. } => "base-missing",
            MissReason::DeadlineExceeded => "deadline-exceeded",
            MissReason::Unauthenticated { .. } => "unauthenticated",
        }
    }
}

impl std::fmt::Display for MissReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MissReason::Absent => write!(f, "absent"),
            MissReason::Corrupt { what, .. } => write!(f, "corrupt: {what}"),
            MissReason::Incompatible { detail } => write!(f, "incompatible: {detail}"),
            MissReason::BaseMissing { detail, .. } => write!(f, "base-missing: {detail}"),
            MissReason::DeadlineExceeded => write!(f, "deadline-exceeded"),
            MissReason::Unauthenticated { detail } => write!(f, "unauthenticated: {detail}"),
        }
    }
}

/// Errors from opening a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL is not one of `file://…`, a plain path, `s3://bucket/prefix`,
    /// `memory://`.
    #[error("unsupported store URL {url:?}: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The backend could not be built.
    #[error("cannot open store backend: {0}")]
    Backend(#[from] object_store::Error),
    /// Local-disk preparation failed (creating the directory, cleanup).
    #[error("cannot prepare local store at {path}: {source}")]
    Local {
        /// The directory.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The public error of the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Opening the store failed.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A backend operation failed (I/O, network, permissions).
    #[error("storage I/O on {key}: {source}")]
    Io {
        /// The object key involved.
        key: String,
        /// The backend error.
        source: object_store::Error,
    },
    /// The caller's input is invalid (nothing was written).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The caller's input (a snapshot or tail in memory the caller owns, or
    /// a file) changed while it was being published: the bytes staged for
    /// the objects are not the bytes the snapshot digest was computed from.
    /// No root was created; objects already written are unreferenced (and
    /// named by their own bytes). Publish again once the input is stable.
    #[error(
        "the input changed while it was being published ({0}); no root was created: keep the          snapshot unchanged until the call returns"
    )]
    InputChanged(String),
    /// A format-level error in caller-provided data (nothing was written).
    #[error(transparent)]
    Format(#[from] deltapack_format::Error),
    /// The base passed to a delta publication does not match the base root.
    #[error("base mismatch for {namespace}/{context}: {detail}")]
    BaseMismatch {
        /// Base namespace.
        namespace: Namespace,
        /// Base context.
        context: ContextDigest,
        /// Why.
        detail: String,
    },
    /// Publication would exceed the store's capacity (nothing was written).
    #[error("capacity: {0}")]
    Capacity(#[source] CapacityError),
    /// The capacity ledger failed.
    #[error("ledger: {0}")]
    Ledger(#[source] crate::ledger::LedgerError),
    /// The capacity ledger cannot be reached (its server is down or not
    /// answering, its file cannot be opened). Reads do not need it —
    /// restore and lookup answer from the store — but publication and
    /// deletion do, and fail closed with this error: the cache is degraded,
    /// not broken, and they work again once the ledger is back.
    #[error("ledger unavailable: {0}")]
    LedgerUnavailable(#[source] crate::ledger::LedgerError),
    /// A worker task (hashing, verifying, writing) panicked or was
    /// cancelled: a bug or a shutdown, never a data problem.
    #[error("{what} task failed: {source}")]
    Task {
        /// Which task.
        what: &'static str,
        /// Why it did not finish.
        source: tokio::task::JoinError,
    },
    /// The backend lacks an operation this request needs safely (e.g. a
    /// conditional overwrite); nothing was changed.
    #[error("not supported by this store: {0}")]
    Unsupported(#[source] Unsupported),
    /// A restore the tier could not serve failed in the origin behind it
    /// (unreachable, or an I/O error there): the tier serves only what it
    /// holds while the origin is down.
    #[error("origin {origin} unavailable, and the tier does not hold this root: {source}")]
    OriginUnavailable {
        /// The origin (its backend).
        origin: String,
        /// What failed there.
        source: Box<StoreError>,
    },
    /// An internal invariant broke (a bug): never a data problem.
    #[error("internal invariant broken: {0}")]
    Internal(String),
    /// This handle's capacity ledger is not the one that accounts for the
    /// store (the store's ledger binding names another), so it may read
    /// but not delete from or publish to the store: two ledgers collecting
    /// one store's objects lose data. Nothing was changed.
    #[error(
        "{op} refused (ledger mismatch): {detail}; this handle's ledger is {this_ledger}. \
         Two ledgers deleting from one store lose data, so only the store's ledger may delete \
         from it or publish to it. Open the store with its ledger (--ledger URL, \
         DELTAPACK_LEDGER or the `ledger` configuration key), or, if that ledger is gone for \
         good, make this one the store's with `deltapack ledger adopt --store {store}`"
    )]
    LedgerMismatch {
        /// The refused operation (`publish`, `evict`, `collect garbage`, …).
        op: &'static str,
        /// The store (`s3://bucket/prefix`, `file:///dir`).
        store: String,
        /// Which ledger the store names, or why its binding is unusable.
        detail: String,
        /// This handle's ledger (description and id).
        this_ledger: String,
    },
    /// Another process changed what this operation depends on while it ran
    /// (e.g. the store's ledger binding during an adoption); nothing was
    /// changed by this call, and running it again is safe.
    #[error("concurrent change: {0}")]
    Concurrent(String),
}

/// Why a publication found no room ([`StoreError::Capacity`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CapacityError {
    /// Condemned objects would make room, but only once their grace period
    /// has passed.
    #[error(
        "need {need} bytes: {condemned} bytes are condemned and will be reclaimed after the grace \
         period ({grace:?}); budget {budget}, in use {used} (of which {reserved} reserved by \
         publications in progress)"
    )]
    AwaitingGrace {
        /// Bytes the publication needs.
        need: u64,
        /// Bytes of condemned objects awaiting deletion.
        condemned: u64,
        /// The store's grace period.
        grace: std::time::Duration,
        /// The budget.
        budget: u64,
        /// Bytes counted against the budget.
        used: u64,
        /// Of those, bytes reserved by publications in progress.
        reserved: u64,
    },
    /// Every root that could be evicted was, or none may be (protected,
    /// held, or a base of a delta in progress).
    #[error(
        "need {need} bytes but nothing evictable is left (budget {budget:?}, live {live} bytes, \
         free space short: {free_short}); nothing was written"
    )]
    NothingEvictable {
        /// Bytes the publication needs.
        need: u64,
        /// The budget, if any.
        budget: Option<u64>,
        /// Bytes of live objects and roots.
        live: u64,
        /// Whether the filesystem's free space is what is short.
        free_short: bool,
    },
    /// The device under the store filled up while an object was written.
    #[error(
        "no space left on the device while writing {key}; nothing was published (free space and \
         retry)"
    )]
    DeviceFull {
        /// The object being written.
        key: String,
    },
    /// The device under the ledger is full.
    #[error("no space left for the ledger: {0}")]
    LedgerFull(#[source] crate::ledger::LedgerError),
}

/// An operation the backend lacks ([`StoreError::Unsupported`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Unsupported {
    /// The backend reports no ETag or version for the root, so it cannot be
    /// replaced conditionally.
    #[error(
        "{key}: the backend reports no ETag or version, so the root cannot be replaced \
         conditionally; refusing to overwrite it (a concurrent eviction could be undone)"
    )]
    NoVersion {
        /// The root's key.
        key: String,
    },
    /// The backend has no conditional overwrite (`If-Match`).
    #[error(
        "{key}: the backend has no conditional overwrite (If-Match); refusing to overwrite the \
         root, since a concurrent eviction or republication could be undone ({source})"
    )]
    NoConditionalOverwrite {
        /// The root's key.
        key: String,
        /// The backend's answer.
        source: object_store::Error,
    },
}

impl From<crate::ledger::LedgerError> for StoreError {
    /// A full disk under the ledger is a capacity error, like one under the
    /// objects; a ledger that cannot be reached is
    /// [`StoreError::LedgerUnavailable`]; anything else keeps the ledger's
    /// error as its source.
    fn from(e: crate::ledger::LedgerError) -> Self {
        if e.sqlite_code() == Some(rusqlite::ErrorCode::DiskFull) {
            return StoreError::Capacity(CapacityError::LedgerFull(e));
        }
        if e.is_unavailable() {
            return StoreError::LedgerUnavailable(e);
        }
        StoreError::Ledger(e)
    }
}

impl StoreError {
    /// A worker task that did not finish.
    pub(crate) fn task(what: &'static str, source: tokio::task::JoinError) -> Self {
        StoreError::Task { what, source }
    }

    /// A local-disk error on `key` (outside `object_store`).
    pub(crate) fn local_io(key: &object_store::path::Path, source: std::io::Error) -> Self {
        StoreError::Io {
            key: key.to_string(),
            source: object_store::Error::Generic {
                store: "local",
                source: Box::new(source),
            },
        }
    }

    pub(crate) fn io(key: &object_store::path::Path, source: object_store::Error) -> Self {
        StoreError::Io {
            key: key.to_string(),
            source,
        }
    }
}

/// Result alias for the store.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

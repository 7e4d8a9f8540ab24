//! What can be wrong with one object, typed.
//!
//! Every path that reads objects — the flat and composed restores, the v1
//! compatibility reader and the sweep — reports a failed read as an
//! [`ObjectFault`]: which key, and whether the object is *missing*, its
//! bytes are *corrupt* (wrong size or digest), the restore's *deadline*
//! passed, or the backend failed (*I/O*: not the object's fault, never a
//! reason to quarantine). Callers decide on the kind, never on the text:
//! only a `Corrupt` fault seen twice on the same key is proof enough to
//! quarantine (docs/design.md §5, the quarantine rule).

use object_store::path::Path;

use crate::error::StoreError;

/// What went wrong with one object.
#[derive(Debug)]
pub(crate) enum FaultKind {
    /// The object does not exist.
    Missing,
    /// The object exists but its bytes are wrong (or unreadable at rest).
    Corrupt,
    /// The restore's deadline passed.
    Deadline,
    /// The backend failed (network, permissions): not the object's fault.
    Io(Box<StoreError>),
}

/// Why a reassembly failed: the object key to blame (if any), and what
/// was wrong.
#[derive(Debug)]
pub(crate) struct ObjectFault {
    pub(crate) key: Option<Path>,
    pub(crate) kind: FaultKind,
    pub(crate) what: String,
    /// The damage lies in a base of the root being restored (a lower link
    /// of its chain): the miss is `base-missing`, not `corrupt`.
    pub(crate) in_base: bool,
}

impl ObjectFault {
    /// A fault blamed on no particular object (an inconsistent plan, a
    /// result that does not verify as a whole): a corrupt miss, nothing to
    /// quarantine.
    pub(crate) fn plain(what: impl Into<String>) -> Self {
        ObjectFault {
            key: None,
            kind: FaultKind::Corrupt,
            what: what.into(),
            in_base: false,
        }
    }

    /// A fault of the object at `key`.
    pub(crate) fn of(key: &Path, kind: FaultKind, what: impl std::fmt::Display) -> Self {
        ObjectFault {
            key: Some(key.clone()),
            kind,
            what: format!("{key}: {what}"),
            in_base: false,
        }
    }

    /// A failed backend call: a missing object, or the backend's own
    /// failure (not the object's fault).
    pub(crate) fn backend(key: &Path, x: object_store::Error) -> Self {
        match x {
            object_store::Error::NotFound { .. } => {
                ObjectFault::of(key, FaultKind::Missing, "object is missing")
            }
            x => {
                let what = x.to_string();
                ObjectFault::of(key, FaultKind::Io(Box::new(StoreError::io(key, x))), what)
            }
        }
    }

    /// The restore's deadline passed.
    pub(crate) fn deadline() -> Self {
        ObjectFault {
            key: None,
            kind: FaultKind::Deadline,
            what: "deadline exceeded".into(),
            in_base: false,
        }
    }

    /// A failed local or remote read of `key`: the backend's (or the media's)
    /// failure, not evidence about the object's bytes.
    pub(crate) fn io(key: &Path, op: &str, err: std::io::Error) -> Self {
        let what = format!("{op}: {err}");
        ObjectFault::of(
            key,
            FaultKind::Io(Box::new(StoreError::local_io(key, err))),
            what,
        )
    }

    /// Separates a backend failure (an error for the caller) from a fault
    /// of the object itself (missing, corrupt, deadline).
    pub(crate) fn into_error(self) -> Result<Self, StoreError> {
        match self.kind {
            FaultKind::Io(e) => Err(*e),
            _ => Ok(self),
        }
    }
}

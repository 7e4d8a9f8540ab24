//! What a restore returns: a verified snapshot or a miss with its reason,
//! and the options of one call. Plain types, no I/O.

use std::sync::Arc;

use deltapack_format::{Digest, Snapshot};
use serde::Serialize;

use crate::error::MissReason;

/// A verified snapshot.
#[derive(Debug, Clone)]
pub struct Restored {
    /// The snapshot (verified against its root's result snapshot digest).
    pub snapshot: Arc<Snapshot>,
    /// Its digest.
    pub digest: Digest,
    /// Schema of the root it came from.
    pub schema: &'static str,
}

/// The result of a restore: a verified snapshot or a miss with a reason.
#[derive(Debug, Clone)]
pub enum RestoreOutcome {
    /// The verified snapshot.
    Hit(Restored),
    /// No usable state; the caller recomputes.
    Miss(MissReason),
}

impl RestoreOutcome {
    /// The snapshot on a hit.
    pub fn hit(&self) -> Option<&Restored> {
        match self {
            RestoreOutcome::Hit(r) => Some(r),
            RestoreOutcome::Miss(_) => None,
        }
    }

    /// The reason on a miss.
    pub fn miss(&self) -> Option<&MissReason> {
        match self {
            RestoreOutcome::Hit(_) => None,
            RestoreOutcome::Miss(m) => Some(m),
        }
    }
}

/// Options of one restore call.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct RestoreOptions {
    /// Past this instant the call returns a `deadline-exceeded` miss.
    pub deadline: Option<tokio::time::Instant>,
}

impl RestoreOptions {
    /// Whether the deadline has passed already (a call then misses before
    /// it reads anything).
    pub fn deadline_passed(&self) -> bool {
        self.deadline
            .is_some_and(|d| d <= tokio::time::Instant::now())
    }
}

/// The result of [`crate::Store::restore_into`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum RestoreIntoOutcome {
    /// The buffer holds the verified snapshot encoding.
    Hit {
        /// Bytes written.
        len: u64,
        /// Snapshot digest (its text form in JSON, as before).
        digest: Digest,
    },
    /// The buffer's contents are unspecified.
    Miss {
        /// Why.
        #[serde(flatten)]
        reason: MissReason,
    },
}

/// Where [`crate::Store::restore_to`] puts the verified snapshot.
#[derive(Debug)]
pub enum Target<'a> {
    /// A new buffer owned by the result. Concurrent restores of one root
    /// share one fetch and verification, and a snapshot a caller still
    /// holds serves as the base of the next turn ([`crate::Store::restore`]).
    New,
    /// The caller's buffer, exactly the snapshot's encoded length: no result
    /// buffer is allocated ([`crate::Store::restore_into`], whose docs give
    /// the buffer's contract on a miss).
    Into(&'a mut [u8]),
}

/// What [`crate::Store::restore_to`] returns: the outcome of the
/// [`Target`] it was given.
#[derive(Debug, Clone)]
pub enum Restoration {
    /// For [`Target::New`].
    New(RestoreOutcome),
    /// For [`Target::Into`].
    Into(RestoreIntoOutcome),
}

impl Restoration {
    /// The verified snapshot's digest on a hit.
    pub fn digest(&self) -> Option<Digest> {
        match self {
            Restoration::New(RestoreOutcome::Hit(r)) => Some(r.digest),
            Restoration::Into(RestoreIntoOutcome::Hit { digest, .. }) => Some(*digest),
            _ => None,
        }
    }

    /// The reason on a miss.
    pub fn miss(&self) -> Option<&MissReason> {
        match self {
            Restoration::New(RestoreOutcome::Miss(m))
            | Restoration::Into(RestoreIntoOutcome::Miss { reason: m }) => Some(m),
            _ => None,
        }
    }
}

/// Most workers of a local-disk restore (one per core, up to this) and
/// legacy v1 chunks fetched at once. A remote flat restore reads as many
/// extents at once as their ranges fill
/// [`StoreConfig::remote.ranges_in_flight`](crate::RemoteIoConfig::ranges_in_flight).
pub const RESTORE_IN_FLIGHT: usize = 4;

//! Which check a stored object failed, typed: expected against found.
//!
//! A plain value type, shared by the restore, the sweep, verification and
//! the misses they report ([`crate::MissReason::Corrupt`]); it does no I/O
//! and depends on nothing of the store.

use deltapack_format::Digest;
use serde::Serialize;

/// Which check an object failed, with what was expected and what was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "check", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ObjectCheck {
    /// The object does not exist.
    Missing,
    /// It is not the size its root records.
    Size {
        /// Bytes the root records.
        expected: u64,
        /// Bytes stored.
        found: u64,
    },
    /// A zstd extent's stored bytes do not hash to its stored digest.
    StoredDigest {
        /// The digest the root records.
        expected: Digest,
        /// What the stored bytes hash to.
        found: Digest,
    },
    /// A zstd extent does not decompress to its recorded raw length.
    Decompress {
        /// Why.
        detail: String,
    },
    /// The (raw) bytes do not hash to the object's name.
    Name {
        /// The name the root records.
        expected: Digest,
        /// What the bytes hash to.
        found: Digest,
    },
}

impl std::fmt::Display for ObjectCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ObjectCheck::Missing => write!(f, "object is missing"),
            ObjectCheck::Size { expected, found } => {
                write!(f, "is {found} bytes, expected {expected}")
            }
            ObjectCheck::StoredDigest { expected, found } => {
                write!(f, "stored digest {found} != {expected}")
            }
            ObjectCheck::Decompress { detail } => write!(f, "{detail}"),
            ObjectCheck::Name { expected, found } => write!(f, "name {found} != {expected}"),
        }
    }
}

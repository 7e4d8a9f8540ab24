//! The error type shared by every decoder and encoder of this crate.

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can be wrong with bytes or arguments handed to the format
/// layer. Each variant says what was wrong; none of them is ever produced by a
/// panic path.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A digest, namespace or context in text form is malformed.
    #[error("invalid digest text {text:?}: {reason}")]
    DigestText {
        /// The offending text (truncated to 80 characters).
        text: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A cache identity is invalid (bad JSON, unknown field, bad value).
    #[error("invalid cache identity: {0}")]
    Identity(String),
    /// A page layout or block count is inconsistent.
    #[error("invalid page layout: {0}")]
    Layout(String),
    /// An encoded snapshot is malformed.
    #[error("malformed snapshot: {0}")]
    Snapshot(String),
    /// A page delta is malformed or does not fit its base.
    #[error("malformed page delta: {0}")]
    Delta(String),
    /// Input arguments are inconsistent (e.g. boundaries out of order).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// An extent plan or extent bytes are inconsistent.
    #[error("extent error: {0}")]
    Extent(String),
    /// A root envelope or manifest body is malformed (not merely of an
    /// unknown version, which decodes as [`crate::DecodedRoot::Incompatible`]).
    #[error("malformed root: {0}")]
    Root(String),
    /// A digest did not match the bytes it authenticates.
    #[error("digest mismatch for {what}: expected {expected}, found {found}")]
    DigestMismatch {
        /// What was being verified.
        what: String,
        /// The digest recorded by the authenticated metadata.
        expected: String,
        /// The digest of the bytes present.
        found: String,
    },
    /// A root's keyed MAC is missing or wrong for the reader's key.
    #[error("unauthenticated root: {0}")]
    Unauthenticated(String),
    /// A length field exceeded a fixed limit or the bytes present.
    #[error("length out of bounds: {0}")]
    Bounds(String),
}

impl Error {
    pub(crate) fn mismatch(
        what: impl Into<String>,
        expected: impl ToString,
        found: impl ToString,
    ) -> Self {
        Error::DigestMismatch {
            what: what.into(),
            expected: expected.to_string(),
            found: found.to_string(),
        }
    }
}

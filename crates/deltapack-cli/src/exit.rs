//! Exit codes of the `deltapack` commands and the two error types that pick
//! a non-default one (`Usage`: exit 2, `Conflict`: kind `conflict`).
//! A leaf: it owns these values only, and must never import from another
//! module of this crate (every command and `main.rs` import from it).

/// Exit code of a miss (no usable state for the context).
pub(crate) const EXIT_MISS: u8 = 3;
/// Exit code of an error.
pub(crate) const EXIT_ERROR: u8 = 1;
/// Exit code of a usage error (as clap's).
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit code of a sweep that found damage (corrupt or missing objects).
pub(crate) const EXIT_DAMAGE: u8 = 4;

/// A publication that lost to an existing, different root (exit 1, error
/// kind `conflict`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Conflict(pub(crate) String);

/// A usage error found after parsing (e.g. no store named by any source):
/// exit 2 as clap's, error kind `usage`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Usage(pub(crate) String);

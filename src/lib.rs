//! deltapack: an authenticated macro-object delta store for paged prefix state.
//!
//! This umbrella crate re-exports the two library crates:
//! [`mod@format`] (pure byte formats, no I/O) and [`store`] (object-store backed
//! publication and verified restore). The repository's `benches/` (criterion)
//! belong to this package; each library crate owns its tests.

pub use deltapack_format as format;
pub use deltapack_store as store;

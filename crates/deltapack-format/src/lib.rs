//! # deltapack-format — the pure byte formats of deltapack
//!
//! Everything deltapack ever writes to storage is defined here, and nothing in
//! this crate performs I/O or needs an async runtime: it is plain functions
//! over byte slices, so every format can be tested, fuzzed and frozen on its
//! own.
//!
//! The pieces, in the order data flows through them:
//!
//! * [`digest`] — algorithm-tagged 32-byte digests (`blake3:` / `sha256:`)
//!   and the typed 32-byte identifiers [`Namespace`] and [`ContextDigest`].
//! * [`identity`] — [`CacheIdentity`]: everything that makes cached state
//!   valid for a reader. Its canonical encoding hashes to the namespace; the
//!   derivation is frozen forever.
//! * [`context`] — context digests of token prefixes, computed incrementally
//!   at every `chunk_tokens` boundary in one O(n) pass.
//! * [`layout`] and [`snapshot`] — paged snapshots: ordered page groups,
//!   their canonical encoding and the snapshot digest.
//! * [`layer_digest`] — the layered snapshot digest (`blake3-layers:`):
//!   one BLAKE3 stream per (group, layer), so a turn's digest extends the
//!   last turn's hashing state with the new pages alone, and one layer can
//!   be checked on its own.
//! * [`delta`] — the `page-tail-cow-v1` page delta: reused base pages plus
//!   stored tails, with a copy plan that lets a reader reconstruct the result
//!   directly as verified bytes arrive.
//! * [`scatter`] — where payload bytes land in a result buffer: copy
//!   [`Span`]s, the disjoint per-extent regions of the result they write, and
//!   the targets of each piece read (the restore's and the benchmark floors'
//!   planning).
//! * [`extent`] — the v2 extent tree: a payload cut into power-of-two extents,
//!   each named by its BLAKE3 subtree chaining value so that one hashing pass
//!   verifies every extent and the whole payload.
//! * [`root`] — root envelopes and the manifest bodies
//!   `deltapack-page-delta-manifest/v1` (legacy) and `/v2`.
//! * [`binding`] — the ledger binding: which capacity ledger accounts for a
//!   store (the one that may delete from it and publish to it).
//!
//! Every decoder in this crate treats its input as hostile: lengths are
//! checked against the bytes actually present (and against fixed limits)
//! before anything is allocated, and malformed input is an [`Error`], never a
//! panic.

pub mod binding;
pub mod context;
pub mod delta;
pub mod digest;
pub mod error;
pub mod extent;
mod frame;
pub mod identity;
pub mod layer_digest;
pub mod layout;
pub mod root;
pub mod scatter;
pub mod snapshot;
pub mod synth;

pub use binding::{LedgerBinding, LedgerId};
pub use context::{context_digest, ContextHasher};
pub use delta::{
    compose, ComposedPlan, CopyOp, DeltaHeader, DeltaLayout, Origin, PageDelta, Piece, DELTA_SCHEMA,
};
pub use digest::{Algorithm, ContextDigest, Digest, Namespace};
pub use error::{Error, Result};
pub use extent::{ExtentCodec, ExtentPlan, ExtentSpec, ExtentVerifier, PayloadHasher};
pub use identity::{CacheIdentity, DEFAULT_CHUNK_TOKENS};
pub use layer_digest::{DigestState, LayerDigests, StreamDigest};
pub use layout::{GroupKind, LayerSpec, PageGroup, PageLayout};
pub use root::{
    BaseRef, ChainHints, ChunkEntryV1, DecodedRoot, ExtentEntry, ManifestV1, ManifestV2, RootKind,
    RootMeta, RootSummary, SCHEMA_V1, SCHEMA_V2, SCHEMA_V2_1, SCHEMA_V2_2,
};
pub use scatter::Span;
pub use snapshot::{Snapshot, SnapshotHeader};

/// Production extent size for v2 roots (64 MiB).
pub const DEFAULT_MAX_EXTENT_BYTES: u64 = 64 * 1024 * 1024;

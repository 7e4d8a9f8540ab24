//! What a publication is asked to do: the request types.
//!
//! Owns [`PublishRequest`], [`BaseInput`], [`RootFormat`] and
//! [`TurnRequest`]. Pure data: nothing here reads, writes or hashes.

use std::sync::Arc;

use super::input_file::TailFile;
use crate::error::Result;
use bytes::Bytes;
use deltapack_format::root::{self};
use deltapack_format::*;
use serde::Serialize;

/// Which root schema to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum RootFormat {
    /// `deltapack-page-delta-manifest/v2`: ordered extents (production).
    #[default]
    V2,
    /// Legacy `…/v1`: one SHA-256 object per logical chunk (fixtures,
    /// benchmarks, migration tests).
    V1,
}

impl RootFormat {
    /// Short name: `v2` or `v1` (as in the CLI's `--format`).
    pub fn name(&self) -> &'static str {
        match self {
            RootFormat::V2 => "v2",
            RootFormat::V1 => "v1",
        }
    }

    /// The schema string its roots carry (a delta chain written as v2 may
    /// carry the v2.1 minor version; see the receipt's `schema`).
    pub fn schema(&self) -> &'static str {
        match self {
            RootFormat::V2 => root::SCHEMA_V2,
            RootFormat::V1 => root::SCHEMA_V1,
        }
    }
}

/// The base of a delta publication.
#[derive(Debug, Clone)]
pub struct BaseInput {
    /// Context of the base root (same namespace).
    pub context: ContextDigest,
    /// The base snapshot bytes the caller holds; must match the base root.
    pub snapshot: Arc<Snapshot>,
}

/// A publication request.
#[derive(Debug, Clone)]
pub struct PublishRequest {
    /// Identity (gives the namespace and `chunk_tokens`).
    pub identity: CacheIdentity,
    /// Context being published.
    pub context: ContextDigest,
    /// The result snapshot.
    pub snapshot: Arc<Snapshot>,
    /// Base for a delta; `None` publishes a flat snapshot (a base root).
    pub base: Option<BaseInput>,
    /// Root schema.
    pub format: RootFormat,
}

/// How [`crate::Store::publish_with`] reports `(bytes done, bytes total)`.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Send + Sync);

/// Options of one publication ([`crate::Store::publish_with`]). Built from
/// `Default` and the `with_*` setters.
#[derive(Clone, Copy, Default)]
#[non_exhaustive]
pub struct PublishOptions<'a> {
    /// Called with `(bytes done, bytes total)` as objects become durable;
    /// `None` reports nothing.
    pub progress: Option<Progress<'a>>,
}

impl<'a> PublishOptions<'a> {
    /// Reports progress to `progress`.
    pub fn with_progress(mut self, progress: Progress<'a>) -> Self {
        self.progress = Some(progress);
        self
    }
}

impl std::fmt::Debug for PublishOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishOptions")
            .field("progress", &self.progress.map(|_| "<callback>"))
            .finish()
    }
}

/// The next turn of a conversation, as [`Store::publish_turn`](crate::Store::publish_turn) takes it.
#[derive(Debug, Clone)]
pub struct TurnRequest {
    /// Identity (the same namespace as the previous turn's).
    pub identity: CacheIdentity,
    /// Context of the new boundary (its token prefix).
    pub context: ContextDigest,
    /// The new boundary in tokens: above the previous turn's, a multiple of
    /// `chunk_tokens`.
    pub boundary: u64,
    /// The new pages, [`Turn::tail_len`](crate::Turn::tail_len) bytes: for each group, for each
    /// layer (payload order), the pages from the previous turn's
    /// [`Turn::kept_pages`](crate::Turn::kept_pages) to the new page count. Held, not copied.
    pub tail: Bytes,
}

/// Where a turn's new pages are.
#[derive(Clone)]
pub(super) enum Tail {
    /// In the caller's memory (held, copied once when staged).
    Memory(Bytes),
    /// In a file, read once straight into the staged payload.
    File(Arc<TailFile>),
}

impl Tail {
    /// The tail's length in bytes.
    pub(super) fn len(&self) -> u64 {
        match self {
            Tail::Memory(b) => b.len() as u64,
            Tail::File(f) => f.len(),
        }
    }

    /// Copies (or reads) the whole tail into `dest`, exactly its length.
    pub(super) fn fill(&self, dest: &mut [u8]) -> Result<()> {
        match self {
            Tail::Memory(b) => {
                dest.copy_from_slice(b);
                Ok(())
            }
            Tail::File(f) => f.read_into(dest),
        }
    }
}

/// A turn request ([`TurnRequest`]) whose tail is in memory or in a file.
pub(super) struct TurnInput {
    /// Identity (the same namespace as the previous turn's).
    pub(super) identity: CacheIdentity,
    /// Context of the new boundary.
    pub(super) context: ContextDigest,
    /// The new boundary in tokens.
    pub(super) boundary: u64,
    /// The new pages.
    pub(super) tail: Tail,
}

impl From<TurnRequest> for TurnInput {
    fn from(r: TurnRequest) -> TurnInput {
        TurnInput {
            identity: r.identity,
            context: r.context,
            boundary: r.boundary,
            tail: Tail::Memory(r.tail),
        }
    }
}

//! What a publication returns: the outcome, the receipt, and the
//! [`Turn`] handle the next turn is published from.
//!
//! Pure data plus cheap accessors; nothing here writes to the store.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use deltapack_format::root::{self};
use deltapack_format::*;
use serde::Serialize;

use crate::error::{Result, StoreError};
use crate::store::Store;

/// How a publication ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PublishOutcome {
    /// This call created the root.
    Created,
    /// A root with the same result snapshot already existed (idempotent).
    AlreadyPresent,
    /// A root with a *different* snapshot exists; it wins, nothing changed.
    Conflict,
}

impl PublishOutcome {
    /// Its label in the metrics: `created`, `already_present`, `conflict`.
    pub(crate) fn metric_label(self) -> &'static str {
        match self {
            PublishOutcome::Created => "created",
            PublishOutcome::AlreadyPresent => "already_present",
            PublishOutcome::Conflict => "conflict",
        }
    }
}

/// What a publication did.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct PublishReceipt {
    /// Outcome.
    pub outcome: PublishOutcome,
    /// Namespace.
    pub namespace: Namespace,
    /// Context.
    pub context: ContextDigest,
    /// BLAKE3 of the root object now stored under the context.
    pub root_digest: Option<Digest>,
    /// Schema of the root now stored under the context.
    pub schema: String,
    /// Result snapshot digest of this request.
    pub snapshot_digest: Digest,
    /// Result snapshot digest of the existing root (on conflict).
    pub existing_snapshot_digest: Option<Digest>,
    /// Payload length (snapshot or delta).
    pub payload_len: u64,
    /// Objects created.
    pub objects_written: u64,
    /// Objects that already existed.
    pub objects_reused: u64,
    /// Bytes created (objects + root).
    pub bytes_written: u64,
    /// Time building the payload (delta encoding).
    pub encode_time: Duration,
    /// Time hashing and writing objects and the root.
    pub write_time: Duration,
    /// Total time.
    pub total_time: Duration,
    /// The request named a base but the chain policy
    /// ([`crate::ChainPolicy`]) published the result as a flat root.
    pub rebased: bool,
    /// Deltas between this root and its flat root (0 for a flat root).
    pub chain_depth: u32,
    /// The handle to publish the next turn from (layered roots only; see
    /// [`Store::publish_turn`]).
    #[serde(skip)]
    pub turn: Option<Turn>,
}

impl PublishReceipt {
    /// On a conflict, what it was: the context, what the existing root
    /// holds, and this request's snapshot (the CLI's and Python's error
    /// text). `None` for any other outcome.
    pub fn conflict_message(&self) -> Option<String> {
        (self.outcome == PublishOutcome::Conflict).then(|| {
            format!(
                "conflict: context {} already holds {} (schema {}), this request's snapshot is \
                 {}; the existing root wins and nothing was written",
                self.context,
                self.existing_snapshot_digest
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| "an unreadable root".into()),
                self.schema,
                self.snapshot_digest,
            )
        })
    }

    /// The payload bytes this publication wrote, if it created its root
    /// (the metrics' publication size).
    pub(crate) fn created_bytes(&self) -> Option<u64> {
        (self.outcome == PublishOutcome::Created).then_some(self.payload_len)
    }
}

impl PublishReceipt {
    /// A receipt with nothing done yet.
    pub(crate) fn empty(
        namespace: Namespace,
        context: ContextDigest,
        snapshot_digest: Digest,
    ) -> Self {
        PublishReceipt {
            outcome: PublishOutcome::Created,
            namespace,
            context,
            root_digest: None,
            schema: root::SCHEMA_V2.into(),
            snapshot_digest,
            existing_snapshot_digest: None,
            payload_len: 0,
            objects_written: 0,
            objects_reused: 0,
            bytes_written: 0,
            encode_time: Duration::ZERO,
            write_time: Duration::ZERO,
            total_time: Duration::ZERO,
            rebased: false,
            chain_depth: 0,
            turn: None,
        }
    }
}

/// A delta's base, checked against its root.
pub(crate) struct CheckedBase {
    /// The reference the delta's root records.
    pub(crate) base: BaseRef,
    /// The chain below the base (see [`Store::chain_below`]).
    pub(crate) below: Option<(Vec<BaseRef>, u64)>,
    /// The base's digest state, when its digest is layered and known.
    pub(crate) state: Option<Arc<DigestState>>,
}

/// A result's snapshot digest as a publication computes it: the digest,
/// and for a layered one its stream digests and state.
pub(crate) struct ResultDigest {
    pub(crate) digest: Digest,
    pub(crate) layered: Option<(LayerDigests, Arc<DigestState>)>,
}

/// A published turn, kept to publish the next one from its new pages
/// alone ([`Store::publish_turn`]).
///
/// Holds no page bytes: the turn's header, its layered snapshot digest and
/// one BLAKE3 state (about 2 KiB) per (group, layer) stream. Cheap to
/// clone. Valid for the store and namespace it was made in.
#[derive(Clone)]
pub struct Turn {
    pub(super) store: Arc<str>,
    pub(super) namespace: Namespace,
    pub(super) context: ContextDigest,
    pub(super) state: Arc<DigestState>,
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn")
            .field("store", &self.store)
            .field("context", &self.context)
            .field("boundary", &self.boundary())
            .field("digest", &self.digest())
            .finish()
    }
}

impl Turn {
    pub(crate) fn new(
        store: &Store,
        namespace: Namespace,
        context: ContextDigest,
        state: Arc<DigestState>,
    ) -> Self {
        Turn {
            store: store.turn_tag(),
            namespace,
            context,
            state,
        }
    }

    /// The same turn as a handle on `store`: a tier's copy of a root is
    /// the same turn as the origin's (same snapshot, same digest state).
    pub(crate) fn for_store(&self, store: &Store) -> Turn {
        Turn {
            store: store.turn_tag(),
            ..self.clone()
        }
    }

    /// Namespace of the turn's root.
    pub fn namespace(&self) -> Namespace {
        self.namespace
    }

    /// Context of the turn's root.
    pub fn context(&self) -> ContextDigest {
        self.context
    }

    /// Tokens the turn covers.
    pub fn boundary(&self) -> u64 {
        self.state.header().boundary
    }

    /// The turn's snapshot digest (`blake3-layers:`).
    pub fn digest(&self) -> Digest {
        self.state.digest()
    }

    /// The turn's snapshot header (layout, boundary, pages per group).
    pub fn header(&self) -> &SnapshotHeader {
        self.state.header()
    }

    /// Pages per group the next turn keeps from this one: its tail starts
    /// there in every layer of the group.
    pub fn kept_pages(&self) -> &[u64] {
        self.state.settled()
    }

    /// Bytes of the tail a next turn at `boundary` tokens must give: for
    /// every group, for every layer, the pages from [`Turn::kept_pages`] to
    /// the group's page count at `boundary`.
    pub fn tail_len(&self, boundary: u64) -> Result<u64> {
        let h = SnapshotHeader::new(self.header().layout.clone(), boundary);
        h.validate()?;
        let mut n = 0u64;
        for ((g, &count), &kept) in h
            .layout
            .groups
            .iter()
            .zip(&h.block_counts)
            .zip(self.kept_pages())
        {
            let pages = count.checked_sub(kept).ok_or_else(|| {
                StoreError::Invalid(format!(
                    "boundary {boundary} holds fewer pages than the previous turn keeps"
                ))
            })?;
            n = n
                .checked_add(g.page_bytes().saturating_mul(pages))
                .ok_or_else(|| StoreError::Invalid("tail length overflows".into()))?;
        }
        Ok(n)
    }
}

impl Turn {
    /// The tail of `next` (a full snapshot of the turn after this one) as
    /// [`Store::publish_turn`] takes it: every layer's pages from
    /// [`Turn::kept_pages`] on, copied into one buffer. For callers that
    /// hold full snapshots; a serving engine gives its new pages directly.
    pub fn tail_of(&self, next: &Snapshot) -> Result<Bytes> {
        if next.layout() != &self.header().layout {
            return Err(StoreError::Invalid(
                "the snapshot's layout is not the turn's".into(),
            ));
        }
        let want = self.tail_len(next.boundary())?;
        let mut out = Vec::with_capacity(usize::try_from(want).unwrap_or(0));
        for (gi, g) in next.layout().groups.iter().enumerate() {
            let kept = self.kept_pages()[gi];
            for (li, l) in g.layers.iter().enumerate() {
                let r = next
                    .layer_range(gi, li)
                    .ok_or_else(|| StoreError::Internal("layer range".into()))?;
                let skip = (kept * l.bytes_per_page) as usize;
                out.extend_from_slice(&next.payload()[r.start + skip.min(r.len())..r.end]);
            }
        }
        Ok(Bytes::from(out))
    }
}

/// Records a finished v2.2 publication (a turn, a file) in `store`'s
/// metrics: its time since `start` and outcome, or `error` (logged with
/// `what`).
pub(super) fn count_v22(
    store: &Store,
    start: std::time::Instant,
    what: &str,
    out: &Result<PublishReceipt>,
) {
    let seconds = start.elapsed().as_secs_f64();
    let schema = root::SCHEMA_V2_2;
    match out {
        Ok(r) => {
            let (outcome, bytes) = (r.outcome.metric_label(), r.created_bytes());
            store.metrics().publish(seconds, outcome, schema, bytes);
        }
        Err(e) => {
            tracing::debug!(error = %e, "{what} failed");
            store.metrics().publish(seconds, "error", schema, None);
        }
    }
}

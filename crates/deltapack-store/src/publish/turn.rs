//! Turn publication: the next turn of a conversation from its new pages
//! alone.
//!
//! A serving engine holds a conversation's pages in place and, after a
//! turn, knows which pages it wrote: those from the page that held the old
//! boundary onward. [`Store::publish_turn`] takes exactly that — the new
//! boundary and the pages from each group's *settled* count on (the pages
//! wholly below the previous boundary are kept; a recurrent group's one
//! checkpoint page is always new) — and publishes it as a
//! `page-tail-cow-v1` delta over the previous turn's root without ever
//! materialising the full snapshot: the tail *is* the delta's payload after
//! its header, written straight from the caller's buffer.
//!
//! The previous turn is named by a [`Turn`], the handle a publication (or
//! [`Store::turn_from`]) returns. It carries the previous snapshot's
//! layered digest and every (group, layer) stream's BLAKE3 state after its
//! settled pages (see `deltapack_format::layer_digest`), so the new turn's
//! snapshot digest is computed by hashing the tail alone: the cost of a
//! turn is proportional to the turn, not to the conversation.
//!
//! Everything is checked before the first write, and a bad request writes
//! nothing: a handle from another store or namespace, a boundary not above
//! the previous one or off the chunk grid, a tail of the wrong length. The
//! previous turn's root must still be in the store and name the handle's
//! digest (one root read), and is protected from eviction while the turn is
//! written, as for any delta.

use std::sync::Arc;
use std::time::Instant;

use deltapack_format::delta::{DeltaHeader, DeltaLayout, DELTA_SCHEMA};
use deltapack_format::layer_digest::{self, DigestState};
use deltapack_format::root::{DecodedRoot, RootMeta};
use deltapack_format::{
    BaseRef, CacheIdentity, ChainHints, ContextDigest, Digest, Namespace, Snapshot, SnapshotHeader,
};

use super::input_file::TailFile;
use super::payload::Payload;
use super::receipt::{PublishOutcome, PublishReceipt, Turn};
use super::request::{Tail, TurnInput, TurnRequest};
use crate::error::{Result, StoreError};
use crate::gc::ProtectGuard;
use crate::keys;
use crate::stats::Stats;
use crate::store::{RootStatus, Store};

impl Store {
    /// What identifies this store in a [`Turn`].
    pub(crate) fn turn_tag(&self) -> Arc<str> {
        match self.backend_kind() {
            crate::BackendKind::Memory => {
                format!("memory:{:p}", Arc::as_ptr(self.object_store())).into()
            }
            other => other.identity().into(),
        }
    }

    /// Remembers that `snapshot` (this very `Arc`) is what the root of
    /// `ctx` names, with its digest state if it has one, so a delta on it is
    /// not hashed again; returns the turn handle for the next turn.
    pub(super) fn remember_published(
        &self,
        ns: Namespace,
        ctx: ContextDigest,
        digest: Digest,
        snapshot: &Arc<Snapshot>,
        state: Option<Arc<DigestState>>,
    ) -> Option<Turn> {
        let key = (ns, ctx, digest);
        if let Ok(mut c) = self.inner.base_cache.lock() {
            c.put_handed_out(key, snapshot);
            if let Some(st) = &state {
                c.put_state(key, st.clone());
            }
        }
        state.map(|state| Turn::new(self, ns, ctx, state))
    }

    /// A [`Turn`] for a snapshot already published under `context` (for
    /// example one just restored, or read from a file), to publish the
    /// next turns from their new pages.
    ///
    /// The root must exist and carry a layered digest (a v2.2 root). What
    /// it costs:
    /// * a snapshot this handle published (the same `Arc`): nothing, its
    ///   digest state was kept;
    /// * any other snapshot, restored or read from a file, under a root
    ///   that records its turn state (every root written since the state
    ///   was recorded): about one page per (group, layer) stream is hashed —
    ///   each stream is finished from its last settled chunk with the
    ///   snapshot's bytes and must give the root's stream digest. The
    ///   settled pages before that point are not read: the next turn reuses
    ///   them from the store, never from `snapshot`;
    /// * otherwise (an older v2.2 root, or a snapshot that does not finish
    ///   the recorded state) the snapshot is hashed once and must give the
    ///   root's digest.
    ///
    /// With a tier, the tier's root is asked first (a turn acknowledged
    /// there may not be in the store yet, or the store may be down); the
    /// store decides when the tier does not hold it.
    pub async fn turn_from(
        &self,
        identity: &CacheIdentity,
        context: ContextDigest,
        snapshot: &Arc<Snapshot>,
    ) -> Result<Turn> {
        if let Some(tier) = self.tier() {
            match tier.store.turn_from_here(identity, context, snapshot).await {
                Ok(turn) => return Ok(turn.for_store(self)),
                Err(e) => tracing::debug!(error = %e, "no turn from the tier; asking the store"),
            }
        }
        self.turn_from_here(identity, context, snapshot).await
    }

    /// [`Store::turn_from`] in this store alone.
    async fn turn_from_here(
        &self,
        identity: &CacheIdentity,
        context: ContextDigest,
        snapshot: &Arc<Snapshot>,
    ) -> Result<Turn> {
        identity.validate()?;
        let ns = identity.namespace();
        let mismatch = |detail: String| StoreError::BaseMismatch {
            namespace: ns,
            context,
            detail,
        };
        let root = match self.read_root(&ns, &context).await? {
            RootStatus::Found(root) => root,
            RootStatus::Absent => return Err(mismatch("no root is published there".into())),
            RootStatus::Unusable(r) => return Err(mismatch(format!("the root is unusable: {r}"))),
        };
        let want = root
            .summary()
            .ok_or_else(|| StoreError::Internal("summary".into()))?
            .result_snapshot_digest;
        if want.algorithm() != deltapack_format::Algorithm::Blake3Layers {
            return Err(StoreError::Invalid(format!(
                "the root of {context} names a {} snapshot digest, which does not extend; \
                 publish the next turn as a full snapshot (its root will be v2.2)",
                want.algorithm().as_str()
            )));
        }
        // A snapshot this handle published or restored: its kept state, or
        // the root's turn state proven with about a page per stream.
        let key = (ns, context, want);
        let held = match self.inner.base_cache.lock() {
            Ok(c) if c.holds(&key, snapshot) => Some(c.state(&key)),
            _ => None,
        };
        if let Some(state) = held.flatten() {
            return Ok(Turn::new(self, ns, context, state));
        }
        // Any snapshot (held or given as bytes): the root's turn state, if
        // it records one and the snapshot finishes every stream from the
        // state's point to the root's stream digests. That proves what the
        // next turn depends on (each stream's last settled chunk and its
        // unsettled pages); the settled pages before them are the root's by
        // construction — a turn reuses them from the store, never from
        // `snapshot` — so they need not be read.
        if let Some(state) = self.resume_state(ns, context, &root, snapshot).await {
            return Ok(Turn::new(self, ns, context, state));
        }
        // A root without a turn state (written before it was recorded), or
        // one the snapshot does not finish: hashed once.
        let (digest, state) = self
            .verify_base(&ns, &context, snapshot, want, &root)
            .await?;
        if digest != want {
            return Err(mismatch(format!(
                "the root holds {want} but the given snapshot is {digest}"
            )));
        }
        let state = match state {
            Some(s) => s,
            None => {
                let s = snapshot.clone();
                let hashed = s.encoded().len() as u64;
                let st = tokio::task::spawn_blocking(move || DigestState::capture(&s))
                    .await
                    .map_err(|e| StoreError::task("digest state", e))??
                    .1;
                Stats::add(&self.stats_ref().snapshot_bytes_hashed, hashed);
                let st = Arc::new(st);
                if let Ok(mut c) = self.inner.base_cache.lock() {
                    c.put_state((ns, context, want), st.clone());
                }
                st
            }
        };
        Ok(Turn::new(self, ns, context, state))
    }

    /// The digest state of `snapshot` (under the root `root` of `ctx`) from
    /// the turn state the root records, proven by
    /// [`DigestState::resume`]: each stream is finished from its state
    /// point with `snapshot`'s bytes (about a page per stream) and must
    /// give the root's stream digest. Kept for the handle's next
    /// publications. `None` when the root records no turn state or the
    /// snapshot does not finish it; the caller then hashes.
    pub(super) async fn resume_state(
        &self,
        ns: Namespace,
        ctx: ContextDigest,
        root: &DecodedRoot,
        snapshot: &Arc<Snapshot>,
    ) -> Option<Arc<DigestState>> {
        let DecodedRoot::V2(m) = root else {
            return None;
        };
        let (stored, streams) = (m.stored_turn_state()?, m.layer_digests()?);
        let want = m.result_snapshot_digest;
        let s = snapshot.clone();
        let hashed = layer_digest::resume_bytes(s.header());
        let resumed =
            tokio::task::spawn_blocking(move || DigestState::resume(&s, want, &streams, &stored))
                .await;
        Stats::add(&self.stats_ref().snapshot_bytes_hashed, hashed);
        match resumed {
            Ok(Ok(state)) => {
                let state = Arc::new(state);
                if let Ok(mut c) = self.inner.base_cache.lock() {
                    c.put_state((ns, ctx, want), state.clone());
                }
                Some(state)
            }
            Ok(Err(e)) => {
                tracing::debug!(context = %ctx, error = %e, "the root's turn state does not resume; hashing");
                None
            }
            Err(e) => {
                tracing::warn!(context = %ctx, error = %e, "turn state task failed; hashing");
                None
            }
        }
    }

    /// Publishes the turn after `prev` from its new pages alone (see the
    /// module docs of `publish::turn`): a delta over `prev`'s root whose
    /// payload is the delta header and `req.tail`, with a v2.2 root. The
    /// receipt's [`PublishReceipt::turn`] is the handle for the turn after.
    ///
    /// Hashes the tail only. Fails with [`StoreError::Invalid`], writing
    /// nothing, on a handle from another store or namespace, a boundary not
    /// above `prev`'s or off the chunk grid, a tail of the wrong length, or
    /// the context of `prev` itself; with [`StoreError::BaseMismatch`] when
    /// `prev`'s root is gone or names another snapshot.
    pub async fn publish_turn(&self, prev: &Turn, req: TurnRequest) -> Result<PublishReceipt> {
        let start = Instant::now();
        let out = match self.tier() {
            None => self.publish_turn_here(prev, req).await,
            Some(t) => match t.config.ack {
                crate::TierAck::Origin => self.turn_through(&t, prev, req).await,
                crate::TierAck::Tier => self.turn_behind(&t, prev, req).await,
            },
        };
        super::receipt::count_v22(self, start, "turn publication", &out);
        out
    }

    /// [`Store::publish_turn`] with the new pages in a file: `tail` is read
    /// once, with `pread`, straight into the buffer the turn's payload is
    /// staged in (behind room for the delta header), and the digest, the
    /// object's name and its bytes all come from that one copy. Fails with
    /// [`StoreError::InputChanged`] (nothing published) if the file is
    /// shorter than when it was opened or changed while it was read.
    ///
    /// Through a tier, the tail is read into memory once and published as
    /// [`Store::publish_turn`] does (the tier and the origin each write it).
    pub async fn publish_turn_file(
        &self,
        prev: &Turn,
        identity: CacheIdentity,
        context: ContextDigest,
        boundary: u64,
        tail: Arc<TailFile>,
    ) -> Result<PublishReceipt> {
        if self.tier().is_some() {
            let t = tail.clone();
            let bytes = tokio::task::spawn_blocking(move || t.read_bytes())
                .await
                .map_err(|e| StoreError::task("reading the tail", e))??;
            let req = TurnRequest {
                identity,
                context,
                boundary,
                tail: bytes,
            };
            return self.publish_turn(prev, req).await;
        }
        let start = Instant::now();
        let input = TurnInput {
            identity,
            context,
            boundary,
            tail: Tail::File(tail),
        };
        let out = self.publish_turn_input(prev, input).await;
        super::receipt::count_v22(self, start, "turn publication", &out);
        out
    }

    /// The turn publication in this store alone (`publish_turn` counts it,
    /// and sends it to a tier too).
    pub(crate) async fn publish_turn_here(
        &self,
        prev: &Turn,
        req: TurnRequest,
    ) -> Result<PublishReceipt> {
        self.publish_turn_input(prev, TurnInput::from(req)).await
    }

    /// [`Store::publish_turn_here`] of a tail in memory or in a file.
    async fn publish_turn_input(&self, prev: &Turn, req: TurnInput) -> Result<PublishReceipt> {
        let start = Instant::now();
        // The lease ends before this returns, on every path (see
        // `publish_uncounted`).
        let mut guard = None;
        let out = self
            .publish_turn_uncounted(prev, req, start, &mut guard)
            .await;
        if let Some(g) = guard.take() {
            g.finish().await;
        }
        out
    }

    async fn publish_turn_uncounted(
        &self,
        prev: &Turn,
        req: TurnInput,
        start: Instant,
        slot: &mut Option<ProtectGuard>,
    ) -> Result<PublishReceipt> {
        let id = &req.identity;
        super::plan::validate_turn(prev, &req, &self.turn_tag())?;
        let ns = id.namespace();
        let (old, new) = (prev.boundary(), req.boundary);
        let result_header = SnapshotHeader::new(prev.header().layout.clone(), new);
        let result_len = result_header.encoded_len()?;

        // As for any delta: only the store's ledger publishes, and the base
        // root is protected before it is read.
        self.require_owner("publish").await?;
        let guard = &*slot.insert(ProtectGuard::new(self).await?);
        guard
            .protect(vec![keys::root_key(&ns, &prev.context).to_string()])
            .await?;
        let _base_pin = self.pin(ns, prev.context);
        let below = self.previous_turn_root(prev).await?;

        // The payload is staged once (`staging.rs`): the tail copied from
        // the caller's memory (or read from its file) behind room for the
        // delta header, the turn's digest computed from that copy (the tail
        // alone), then the header written in front. The digest, the names
        // and the objects all come from the one copy, so a caller changing
        // its buffer or file during the call cannot make them disagree; and
        // nothing is copied twice.
        let t_encode = Instant::now();
        let mut template = turn_delta(
            prev,
            &req,
            &result_header,
            super::plan::stand_in_digest(true),
        );
        let h = template.header_bytes()?.len();
        let tail_len = req.tail.len() as usize;
        let (state, tail, header) = (prev.state.clone(), req.tail.clone(), result_header.clone());
        let (staged, digests, next, header_bytes) = tokio::task::spawn_blocking(move || {
            let mut out = None;
            let staged = super::staging::stage_with(h + tail_len, |dest| {
                let (head, body) = dest.split_at_mut(h);
                out = Some((|| -> Result<_> {
                    tail.fill(body)?;
                    let tails = split_tail(&state, &header, body)?;
                    let (d, next) = state.extend(&header, &tails)?;
                    template.header.result_digest = d.snapshot;
                    let hb = template.header_bytes()?;
                    if hb.len() != h {
                        return Err(StoreError::Internal(
                            "the delta header changed length".into(),
                        ));
                    }
                    head.copy_from_slice(&hb);
                    Ok((d, next, hb))
                })());
            })
            .map_err(|e| StoreError::Internal(format!("staging the turn: {e}")))?;
            let (d, next, hb) =
                out.ok_or_else(|| StoreError::Internal("the turn was not staged".into()))??;
            Ok::<_, StoreError>((staged, d, next, hb))
        })
        .await
        .map_err(|e| StoreError::task("turn digest", e))??;
        Stats::add(&self.stats_ref().snapshot_bytes_hashed, tail_len as u64);
        let digest = digests.snapshot;
        let mut receipt = PublishReceipt::empty(ns, req.context, digest);
        receipt.schema = deltapack_format::root::SCHEMA_V2_2.into();
        let payload = Payload::staged(staged);
        receipt.encode_time = t_encode.elapsed();
        receipt.payload_len = payload.len();

        // An existing root decides the outcome without writing anything.
        if !matches!(self.read_root(&ns, &req.context).await?, RootStatus::Absent) {
            if let Some(done) = self
                .existing_outcome(&ns, &req.context, &mut receipt, None)
                .await?
            {
                if done == PublishOutcome::AlreadyPresent {
                    self.ledger_touch(&ns, &req.context).await;
                    receipt.turn = Some(Turn::new(self, ns, req.context, Arc::new(next)));
                }
                receipt.outcome = done;
                receipt.total_time = start.elapsed();
                return Ok(receipt);
            }
        }

        let room = super::plan::room_needed(
            super::RootFormat::V2,
            receipt.payload_len,
            self.config().publication.max_extent_bytes,
            0,
        );
        self.make_room(room, guard).await?;
        let t_write = Instant::now();
        let (entries, payload_digest) = self
            .write_v2(payload, &mut receipt, &|_, _| {}, guard)
            .await?;
        let base = BaseRef {
            namespace: ns,
            context: prev.context,
            snapshot_digest: prev.digest(),
            boundary: old,
        };
        let chain = below.map(|(ancestors, bytes)| ChainHints {
            ancestors,
            payload_bytes: bytes + receipt.payload_len,
            delta_header: header_bytes,
        });
        receipt.chain_depth = chain.as_ref().map_or(0, |c| c.ancestors.len() as u32 + 1);
        let meta = RootMeta {
            namespace: ns,
            context: req.context,
            chunk_tokens: id.chunk_tokens,
            result_header,
            result_snapshot_digest: digest,
            result_snapshot_len: result_len,
            base: Some(base),
        };
        let root_bytes = self.encode_v2(
            &meta,
            Some((&digests.streams, &next)),
            receipt.payload_len,
            payload_digest,
            entries,
            chain,
        )?;
        self.create_root(&ns, &req.context, root_bytes, &mut receipt, None)
            .await?;
        if let Some(g) = slot.take() {
            g.finish().await;
        }
        receipt.write_time = t_write.elapsed();
        receipt.total_time = start.elapsed();
        self.settle_turn(next, &mut receipt);
        Ok(receipt)
    }
}

impl Store {
    /// After a turn's root is created: its digest state is cached and handed
    /// out as the next [`Turn`] (or a conflict counted), and the turn
    /// logged.
    pub(super) fn settle_turn(&self, next: DigestState, receipt: &mut PublishReceipt) {
        let (ns, context, digest) = (receipt.namespace, receipt.context, receipt.snapshot_digest);
        if receipt.outcome == PublishOutcome::Conflict {
            Stats::add(&self.stats_ref().conflicts, 1);
        } else {
            let next = Arc::new(next);
            if let Ok(mut c) = self.inner.base_cache.lock() {
                c.put_state((ns, context, digest), next.clone());
            }
            receipt.turn = Some(Turn::new(self, ns, context, next));
        }
        tracing::info!(
            context = %context,
            outcome = ?receipt.outcome,
            objects_written = receipt.objects_written,
            bytes = receipt.bytes_written,
            ms = receipt.total_time.as_millis() as u64,
            "published a turn"
        );
    }

    /// Checks that the previous turn's root still holds what its handle
    /// says, and returns the chain below it (see [`Store::chain_below`]).
    async fn previous_turn_root(&self, prev: &Turn) -> Result<Option<(Vec<BaseRef>, u64)>> {
        let (ns, old) = (prev.namespace, prev.boundary());
        let mismatch = |detail: String| StoreError::BaseMismatch {
            namespace: ns,
            context: prev.context,
            detail,
        };
        match self.read_root(&ns, &prev.context).await? {
            RootStatus::Found(root) => {
                let s = root
                    .summary()
                    .ok_or_else(|| StoreError::Internal("summary".into()))?;
                if s.result_snapshot_digest != prev.digest() || s.boundary != old {
                    return Err(mismatch(format!(
                        "the previous turn's root holds {} at {} tokens, the handle {} at {old}",
                        s.result_snapshot_digest,
                        s.boundary,
                        prev.digest()
                    )));
                }
                self.chain_below(&root).await
            }
            RootStatus::Absent => Err(mismatch("the previous turn's root is gone".into())),
            RootStatus::Unusable(r) => Err(mismatch(format!(
                "the previous turn's root is unusable: {r}"
            ))),
        }
    }
}

/// The tail cut into each stream's pages (payload order).
fn split_tail<'a>(
    state: &DigestState,
    header: &SnapshotHeader,
    tail: &'a [u8],
) -> deltapack_format::Result<Vec<&'a [u8]>> {
    let mut out = Vec::with_capacity(layer_digest::stream_count(header));
    let mut at = 0usize;
    for ((g, &count), &kept) in header
        .layout
        .groups
        .iter()
        .zip(&header.block_counts)
        .zip(state.settled())
    {
        for l in &g.layers {
            let n = ((count - kept.min(count)) * l.bytes_per_page) as usize;
            let piece = tail.get(at..at + n).ok_or_else(|| {
                deltapack_format::Error::Invalid("the tail is shorter than its layout".into())
            })?;
            out.push(piece);
            at += n;
        }
    }
    Ok(out)
}

/// The delta header of the turn `req` on `prev`: every page of `prev` kept,
/// the new pages in the tail (which follows the header in the payload).
fn turn_delta(
    prev: &Turn,
    req: &TurnInput,
    result_header: &SnapshotHeader,
    digest: Digest,
) -> DeltaLayout {
    DeltaLayout {
        header: DeltaHeader {
            schema: DELTA_SCHEMA.into(),
            chunk_tokens: req.identity.chunk_tokens,
            base_digest: prev.digest(),
            result_digest: digest,
            base_boundary: prev.boundary(),
            result_boundary: req.boundary,
            base_block_counts: prev.header().block_counts.clone(),
            result_block_counts: result_header.block_counts.clone(),
            reused_pages: prev.kept_pages().to_vec(),
        },
        tails: Vec::new(),
    }
}

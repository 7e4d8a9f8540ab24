//! Publication: payload → durable objects → root, in that order.
//!
//! 1. Validate everything before the first write: identity, boundaries
//!    (multiples of `chunk_tokens`, base < result), layouts, and — for a
//!    delta — that the caller's base snapshot is the one the base root names.
//! 2. If a root already exists for the context, stop: the same result digest
//!    is idempotent success, a different one is a conflict (the existing
//!    root wins; no context ever aliases two snapshots).
//! 3. Build the payload (the snapshot itself, or a `page-tail-cow-v1` delta).
//! 4. Write its objects with create-if-absent in durability batches of at
//!    most [`PUBLISH_BATCH`] objects. An existing object of the right size is
//!    reused (content addressing); one of the wrong size is quarantined and
//!    rewritten. On a remote backend an extent larger than
//!    [`StoreConfig::remote.part_bytes`](crate::RemoteIoConfig::part_bytes) is a multipart upload instead
//!    (HEAD, then upload if absent; see [`crate::backend`]), its parts
//!    zero-copy slices of the payload, at most
//!    [`StoreConfig::remote.parts_in_flight`](crate::RemoteIoConfig::parts_in_flight) parts of the publication in
//!    flight at once.
//! 5. Only when every object is durable, create the root (create-if-absent).
//!    Losing that race to another writer is resolved as in step 2.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use deltapack_format::layer_digest::StreamFeed;
use deltapack_format::root::{self, RootMeta};
use deltapack_format::{BaseRef, DeltaLayout, Digest, DigestState};

mod base;
mod commit;
mod file;
mod input_file;
mod payload;
mod plan;
mod receipt;
mod request;
mod shape;
pub(crate) mod staging;
mod turn;
mod write;

pub use input_file::{SnapshotFile, TailFile};
pub use write::PUBLISH_BATCH;

pub(crate) use payload::Payload;
use payload::{finish_feed, LateDigest};
pub use receipt::{PublishOutcome, PublishReceipt, Turn};
pub use request::{BaseInput, Progress, PublishOptions, PublishRequest, RootFormat, TurnRequest};
use shape::Shape;

use crate::error::Result;
use crate::gc::ProtectGuard;
use crate::keys;
use crate::stats::Stats;
use crate::store::{RootStatus, Store};

impl Store {
    /// Publishes a snapshot (flat or as a delta). See the module docs.
    /// This is [`Store::publish_with`] with default options.
    pub async fn publish(&self, req: PublishRequest) -> Result<PublishReceipt> {
        self.publish_with(req, PublishOptions::default()).await
    }

    /// [`Store::publish`] reporting `(bytes done, bytes total)` as objects
    /// become durable: [`Store::publish_with`] with
    /// [`PublishOptions::with_progress`].
    pub async fn publish_with_progress(
        &self,
        req: PublishRequest,
        progress: Progress<'_>,
    ) -> Result<PublishReceipt> {
        self.publish_with(req, PublishOptions::default().with_progress(progress))
            .await
    }

    /// Publishes the snapshot in `file` flat under `context` (a v2.2 root),
    /// reading the file once with `pread` into the staging buffers, never
    /// mapping it: a file truncated or rewritten meanwhile fails the call
    /// with [`StoreError::InputChanged`](crate::StoreError::InputChanged)
    /// and no root (see `publish/file.rs`). `progress` as in
    /// [`Store::publish_with_progress`]. Not through a tier (an error:
    /// publish from memory there).
    pub async fn publish_file(
        &self,
        identity: &deltapack_format::CacheIdentity,
        context: deltapack_format::ContextDigest,
        file: Arc<SnapshotFile>,
        progress: Progress<'_>,
    ) -> Result<PublishReceipt> {
        let start = Instant::now();
        let out = file::publish_file(self, identity, context, file, progress).await;
        receipt::count_v22(self, start, "file publication", &out);
        out
    }

    /// The publication: writes `req`'s objects, then its root, and records
    /// them in the ledger (the steps of the module docs). The one core
    /// publish call; the other names are this with fixed options.
    #[tracing::instrument(level = "info", name = "publish", skip_all, fields(
        namespace = %crate::metrics::short_hex(&req.identity.namespace().hex()),
        context = %crate::metrics::short_hex(&req.context.hex()),
        delta = req.base.is_some(),
        schema = tracing::field::Empty,
        outcome = tracing::field::Empty,
        bytes = tracing::field::Empty,
    ))]
    pub async fn publish_with(
        &self,
        req: PublishRequest,
        opts: PublishOptions<'_>,
    ) -> Result<PublishReceipt> {
        let progress: Progress<'_> = opts.progress.unwrap_or(&|_, _| {});
        let start = Instant::now();
        let asked = req.format.schema();
        let out = match self.tier() {
            None => self.publish_uncounted(req, progress).await,
            Some(t) => match t.config.ack {
                crate::TierAck::Origin => self.publish_through(&t, req, progress).await,
                crate::TierAck::Tier => self.publish_behind(&t, req, progress).await,
            },
        };
        let span = tracing::Span::current();
        let seconds = start.elapsed().as_secs_f64();
        match &out {
            Ok(r) => {
                let (outcome, bytes) = (r.outcome.metric_label(), r.created_bytes());
                // Only the schemas this crate writes are labels (a conflict
                // with an unusable root describes it in free text).
                let schema = [
                    root::SCHEMA_V2,
                    root::SCHEMA_V2_1,
                    root::SCHEMA_V2_2,
                    root::SCHEMA_V1,
                ]
                .into_iter()
                .find(|s| *s == r.schema)
                .unwrap_or(crate::metrics::UNKNOWN_SCHEMA);
                span.record("schema", schema);
                span.record("outcome", outcome);
                span.record("bytes", r.payload_len);
                self.metrics().publish(seconds, outcome, schema, bytes);
            }
            Err(e) => {
                span.record("schema", asked);
                span.record("outcome", "error");
                tracing::debug!(error = %e, "publication failed");
                self.metrics().publish(seconds, "error", asked, None);
            }
        }
        out
    }

    /// The publication itself (`publish_with` counts it).
    pub(crate) async fn publish_uncounted(
        &self,
        req: PublishRequest,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<PublishReceipt> {
        // The publication's lease ends before this returns, on every path:
        // a guard merely dropped ends it on a blocking thread later, and a
        // sweep or collection started right after a failed publication
        // would still see its objects protected.
        let mut guard = None;
        let out = self.publish_guarded(req, progress, &mut guard).await;
        if let Some(g) = guard.take() {
            g.finish().await;
        }
        out
    }

    /// [`Store::publish_uncounted`] with the publication's lease in `slot`,
    /// which the caller ends. The steps of the module docs, in order; the
    /// decisions are `plan.rs`'s, the shape of what is written
    /// `shape.rs`'s.
    async fn publish_guarded(
        &self,
        req: PublishRequest,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
        slot: &mut Option<ProtectGuard>,
    ) -> Result<PublishReceipt> {
        let start = Instant::now();
        let (id, snap) = (&req.identity, &req.snapshot);
        plan::validate(id, snap.boundary())?;
        let ns = id.namespace();
        // Only the store's own ledger may publish: a publication relies on
        // objects it finds present, which another ledger may be collecting.
        self.require_owner("publish").await?;
        let checked = self.protect_base(&req, slot).await?;
        let mut shape = self.shape(&req, checked).await?;
        // A flat layered snapshot's digest is fed from the staged extents
        // as they are written (`staging.rs`): the root's digest and its
        // objects come from the very same bytes. Any other result digest
        // starts now and is awaited only where it is needed: a delta's
        // header (written last, see `write_v2`), an existing root's
        // comparison, the root.
        let fed = shape.base_ref.is_none() && shape.layered && req.format == RootFormat::V2;
        let digest = if fed {
            None
        } else {
            self.start_digest(snap, &shape)
        };

        // An existing root decides the outcome without writing anything.
        if !matches!(self.read_root(&ns, &req.context).await?, RootStatus::Absent) {
            // (A fed snapshot is hashed here, from the caller's bytes, only
            // to compare: nothing is written from this digest.)
            let compare = if fed {
                self.start_digest(snap, &shape)
            } else {
                None
            };
            if let Some(done) = self
                .onto_existing(&req, digest.as_ref().or(compare.as_ref()))
                .await?
            {
                if let Some(g) = slot.take() {
                    g.finish().await;
                }
                let mut receipt = done;
                receipt.total_time = start.elapsed();
                return Ok(receipt);
            }
        }
        // Until the digest is known the receipt carries a placeholder; it is
        // set before the receipt leaves this function.
        let mut receipt = PublishReceipt::empty(ns, req.context, Digest::blake3(&[]));
        if req.format == RootFormat::V1 {
            receipt.schema = root::SCHEMA_V1.into();
        }
        // The base must not be evicted while its delta is being published
        // (the ledger protection above covers every node; the pin keeps it
        // out of this process's eviction plans too).
        let base_in = req.base.as_ref().filter(|_| !shape.rebased);
        let _base_pin = base_in.map(|b| self.pin(ns, b.context));

        // The payload as parts of the caller's snapshot: nothing is copied.
        let t_encode = Instant::now();
        let whole = snap.encoded_bytes();
        let (payload, header_template) = match (shape.layout.take(), &digest) {
            (Some(layout), Some(d)) => {
                let (p, h) = shape::delta_payload(layout, d, &whole)?;
                (p, Some(h))
            }
            _ => (Payload::from(whole), None),
        };
        let feed = if fed {
            let off = (snap.encoded().len() - snap.payload().len()) as u64;
            Some(Arc::new(std::sync::Mutex::new(StreamFeed::new(
                snap.header(),
                off,
            )?)))
        } else {
            None
        };
        let payload = match &feed {
            Some(f) => payload.with_feed(f.clone()),
            None => payload,
        };
        receipt.encode_time = t_encode.elapsed();
        receipt.payload_len = payload.len();

        // Capacity first: evict or refuse before anything is written.
        let guard = match slot {
            Some(g) => &*g,
            None => &*slot.insert(ProtectGuard::new(self).await?),
        };
        let room = plan::room_needed(
            req.format,
            receipt.payload_len,
            self.config().publication.max_extent_bytes,
            snap.boundary() / u64::from(id.chunk_tokens),
        );
        self.make_room(room, guard).await?;

        let t_write = Instant::now();
        let to_write = ToWrite {
            payload,
            digest: digest.as_ref(),
            header_template,
            feed,
        };
        let (root_bytes, result_state) = match req.format {
            RootFormat::V2 => {
                self.write_root_v2(&req, shape, to_write, &mut receipt, progress, guard)
                    .await?
            }
            RootFormat::V1 => {
                let bytes = self
                    .write_root_v1(
                        &req,
                        shape.base_ref,
                        to_write,
                        &mut receipt,
                        progress,
                        guard,
                    )
                    .await?;
                (bytes, None)
            }
        };
        self.create_root(&ns, &req.context, root_bytes, &mut receipt, Some(snap))
            .await?;
        if let Some(g) = slot.take() {
            g.finish().await;
        }
        receipt.write_time = t_write.elapsed();
        receipt.total_time = start.elapsed();
        self.settle(&req, result_state, &mut receipt);
        Ok(receipt)
    }

    /// A delta's base: protected in the ledger under a lease (taken into
    /// `slot`) *before* it is read, then checked against the caller's
    /// snapshot. `None` for a flat publication.
    async fn protect_base(
        &self,
        req: &PublishRequest,
        slot: &mut Option<ProtectGuard>,
    ) -> Result<Option<receipt::CheckedBase>> {
        let (id, snap) = (&req.identity, &req.snapshot);
        let ns = id.namespace();
        // The publication's ledger id, protections and reservation (taken
        // here for a delta, below for a flat snapshot). A delta
        // protects its base root in the ledger *before* reading it: from
        // then on no node's eviction or pruning removes the base (their
        // removal claim is refused) until this publication ends, by when
        // the delta is recorded and names its base. A base already claimed
        // for removal is waited for, and then found gone.
        if let Some(b) = &req.base {
            let g = slot.insert(ProtectGuard::new(self).await?);
            g.protect(vec![keys::root_key(&ns, &b.context).to_string()])
                .await?;
        }
        match &req.base {
            None => Ok(None),
            Some(b) => Ok(Some(self.check_base(&ns, id, b, snap).await?)),
        }
    }

    /// After the root is created: the caller's snapshot is remembered as
    /// what the root names (or a conflict counted), and the publication
    /// logged.
    fn settle(
        &self,
        req: &PublishRequest,
        result_state: Option<Arc<DigestState>>,
        receipt: &mut PublishReceipt,
    ) {
        let ns = req.identity.namespace();
        let snap = &req.snapshot;
        if receipt.outcome != PublishOutcome::Conflict {
            // The caller's snapshot is now what this root names: a delta on
            // it, given the same `Arc`, is not hashed again.
            receipt.turn = self.remember_published(
                ns,
                req.context,
                receipt.snapshot_digest,
                snap,
                result_state,
            );
        } else {
            Stats::add(&self.stats_ref().conflicts, 1);
        }
        tracing::info!(
            context = %req.context,
            outcome = ?receipt.outcome,
            objects_written = receipt.objects_written,
            bytes = receipt.bytes_written,
            ms = receipt.total_time.as_millis() as u64,
            "published"
        );
    }

    /// The receipt of a publication onto an existing root, if the root
    /// decides it: the same result is idempotent success (recorded as an
    /// access), another is a conflict. `None`: the root went away (or was
    /// damaged and quarantined), publish as if it were absent.
    async fn onto_existing(
        &self,
        req: &PublishRequest,
        digest: Option<&LateDigest>,
    ) -> Result<Option<PublishReceipt>> {
        let (ns, snap) = (req.identity.namespace(), &req.snapshot);
        let found = shape::snapshot_digest(digest, snap).await?;
        let mut receipt = PublishReceipt::empty(ns, req.context, found);
        if req.format == RootFormat::V1 {
            receipt.schema = root::SCHEMA_V1.into();
        }
        let Some(done) = self
            .existing_outcome(&ns, &req.context, &mut receipt, Some(snap))
            .await?
        else {
            return Ok(None);
        };
        if done == PublishOutcome::AlreadyPresent {
            self.ledger_touch(&ns, &req.context).await;
            // The caller's snapshot is the one the root names: a delta on
            // it (the same `Arc`) is not hashed again.
            let state = shape::layered_result(digest)
                .await
                .ok()
                .flatten()
                .map(|(_, st)| st);
            receipt.turn =
                self.remember_published(ns, req.context, receipt.snapshot_digest, snap, state);
        }
        receipt.outcome = done;
        Ok(Some(receipt))
    }

    /// Writes a v2 payload's extents and encodes its root (v2, v2.1 with
    /// chain hints, v2.2 with the layered digest); returns the root's
    /// bytes and the result's digest state.
    async fn write_root_v2(
        &self,
        req: &PublishRequest,
        shape: Shape,
        to_write: ToWrite<'_>,
        receipt: &mut PublishReceipt,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
        guard: &ProtectGuard,
    ) -> Result<(Bytes, Option<Arc<DigestState>>)> {
        let (entries, payload_digest) = self
            .write_v2(to_write.payload, receipt, progress, guard)
            .await?;
        let fed = match to_write.feed {
            Some(feed) => Some(finish_feed(feed, "the snapshot in memory")?),
            None => None,
        };
        receipt.snapshot_digest = match (&fed, to_write.digest) {
            (Some((d, _)), _) => d.snapshot,
            (None, Some(d)) => shape::snapshot_digest(Some(d), &req.snapshot).await?,
            (None, None) => payload_digest,
        };
        let meta = result_meta(req, shape.base_ref, receipt.snapshot_digest);
        let mut chain = shape.chain;
        if let (Some(c), Some(h)) = (chain.as_mut(), to_write.header_template) {
            c.delta_header = DeltaLayout {
                header: deltapack_format::DeltaHeader {
                    result_digest: receipt.snapshot_digest,
                    ..h
                },
                tails: Vec::new(),
            }
            .header_bytes()?;
        }
        receipt.chain_depth = chain.as_ref().map_or(0, |c| c.ancestors.len() as u32 + 1);
        receipt.rebased = shape.rebased;
        let layers = match fed {
            Some((d, st)) => Some((d.streams, Arc::new(st))),
            None => shape::layered_result(to_write.digest).await?,
        };
        receipt.schema = plan::v2_schema(layers.is_some(), chain.is_some()).into();
        let bytes = self.encode_v2(
            &meta,
            layers.as_ref().map(|(l, st)| (l.as_slice(), st.as_ref())),
            receipt.payload_len,
            payload_digest,
            entries,
            chain,
        )?;
        Ok((bytes, layers.map(|(_, st)| st)))
    }
}

impl Store {
    /// Writes a legacy v1 payload's chunk objects and encodes its root.
    async fn write_root_v1(
        &self,
        req: &PublishRequest,
        base_ref: Option<BaseRef>,
        to_write: ToWrite<'_>,
        receipt: &mut PublishReceipt,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
        guard: &ProtectGuard,
    ) -> Result<Bytes> {
        let whole = to_write.payload.assemble().await?;
        let (chunks, payload_digest) = self.write_v1(req, whole, receipt, progress, guard).await?;
        receipt.snapshot_digest = match to_write.digest {
            Some(d) => shape::snapshot_digest(Some(d), &req.snapshot).await?,
            None => payload_digest,
        };
        let meta = result_meta(req, base_ref, receipt.snapshot_digest);
        let manifest =
            deltapack_format::ManifestV1::new(&meta, receipt.payload_len, payload_digest, chunks)?;
        let bytes = root::encode_v1(&manifest, self.inner.mac_key.as_ref())?;
        Ok(Bytes::from(bytes))
    }
}

/// What the write step takes from the shaping step besides the shape: the
/// payload, the started result digest and a delta's header (its digest
/// filled in once known, for the root's chain hints).
struct ToWrite<'a> {
    payload: Payload,
    digest: Option<&'a LateDigest>,
    header_template: Option<deltapack_format::DeltaHeader>,
    /// A flat snapshot's digest, fed from its staged extents.
    feed: Option<Arc<std::sync::Mutex<StreamFeed>>>,
}

/// The root metadata of a publication request.
fn result_meta(req: &PublishRequest, base: Option<BaseRef>, digest: Digest) -> RootMeta {
    RootMeta {
        namespace: req.identity.namespace(),
        context: req.context,
        chunk_tokens: req.identity.chunk_tokens,
        result_header: req.snapshot.header().clone(),
        result_snapshot_digest: digest,
        result_snapshot_len: req.snapshot.encoded().len() as u64,
        base,
    }
}

#[cfg(test)]
mod tests {
    use super::payload::{slice_parts, split_payload};
    use super::*;
    use object_store::PutPayload;

    #[test]
    fn split_payload_cuts_zero_copy_parts() {
        let whole: Vec<u8> = (0..100u8).collect();
        let buf = Bytes::from(whole.clone());
        // Three buffers, boundaries not on part boundaries.
        let payload: PutPayload = [buf.slice(0..7), buf.slice(7..50), buf.slice(50..100)]
            .into_iter()
            .collect();
        for part in [1u64, 3, 10, 33, 99, 100, 1000] {
            let parts = split_payload(&payload, part);
            assert_eq!(parts.len() as u64, 100u64.div_ceil(part), "part {part}");
            let mut got = Vec::new();
            for (i, p) in parts.iter().enumerate() {
                let want = if i + 1 < parts.len() {
                    part
                } else {
                    100 - part * (parts.len() as u64 - 1)
                };
                assert_eq!(p.content_length() as u64, want, "part {part}, #{i}");
                for b in p.iter() {
                    // A slice of the original allocation, not a copy.
                    let at = b.as_ptr() as usize - buf.as_ptr() as usize;
                    assert!(at + b.len() <= buf.len(), "part {part}: a copy");
                    got.extend_from_slice(b);
                }
            }
            assert_eq!(got, whole, "part {part}");
        }
    }

    #[test]
    fn slice_parts_covers_exactly_the_range() {
        let parts: Vec<Bytes> = [&b"abc"[..], b"", b"defgh", b"i"]
            .iter()
            .map(|p| Bytes::copy_from_slice(p))
            .collect();
        let whole = b"abcdefghi";
        for a in 0..=whole.len() as u64 {
            for b in a..=whole.len() as u64 {
                let got: Vec<u8> = slice_parts(&parts, a..b).concat();
                assert_eq!(got, &whole[a as usize..b as usize], "{a}..{b}");
            }
        }
    }
}

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
//!    [`crate::StoreConfig::part_bytes`] is a multipart upload instead
//!    (HEAD, then upload if absent; see [`crate::backend`]), its parts
//!    zero-copy slices of the payload, at most
//!    [`crate::StoreConfig::parts_in_flight`] parts of the publication in
//!    flight at once.
//! 5. Only when every object is durable, create the root (create-if-absent).
//!    Losing that race to another writer is resolved as in step 2.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use deltapack_format::layer_digest;
use deltapack_format::root::{self, RootMeta, MAX_CHAIN_HINTS};
use deltapack_format::{
    BaseRef, CacheIdentity, ChainHints, ContextDigest, DecodedRoot, DeltaLayout, Digest,
    DigestState, ExtentPlan, Namespace, Snapshot,
};
use futures::{FutureExt, StreamExt};
use object_store::PutPayload;

mod payload;
mod receipt;
mod request;
mod turn;

pub(crate) use payload::Payload;
use payload::{slice_parts, split_payload, LateDigest};
pub(crate) use receipt::{CheckedBase, ResultDigest};
pub use receipt::{PublishOutcome, PublishReceipt, Turn};
pub use request::{BaseInput, PublishRequest, RootFormat, TurnRequest};

use crate::backend::{put_create, BackendKind, PutOutcome};
use crate::error::{Result, StoreError};
use crate::gc::{AbortOnDrop, ProtectGuard};
use crate::keys;
use crate::stats::Stats;
use crate::store::{RootStatus, Store};
use object_store::ObjectStoreExt;

/// Most object payloads written (and held) at once by one publication.
pub const PUBLISH_BATCH: usize = 2;

/// One object to write: its key and its stored bytes (possibly in parts).
struct PendingObject {
    key: object_store::path::Path,
    payload: PutPayload,
    len: u64,
}

impl Store {
    /// Publishes a snapshot (flat or as a delta). See the module docs.
    pub async fn publish(&self, req: PublishRequest) -> Result<PublishReceipt> {
        self.publish_with_progress(req, &|_, _| {}).await
    }

    /// [`Store::publish`] reporting `(bytes done, bytes total)` as objects
    /// become durable.
    #[tracing::instrument(level = "info", name = "publish", skip_all, fields(
        namespace = %crate::metrics::short_hex(&req.identity.namespace().hex()),
        context = %crate::metrics::short_hex(&req.context.hex()),
        delta = req.base.is_some(),
        schema = tracing::field::Empty,
        outcome = tracing::field::Empty,
        bytes = tracing::field::Empty,
    ))]
    pub async fn publish_with_progress(
        &self,
        req: PublishRequest,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<PublishReceipt> {
        let start = Instant::now();
        let asked = req.format.schema();
        let out = self.publish_uncounted(req, progress).await;
        let span = tracing::Span::current();
        let seconds = start.elapsed().as_secs_f64();
        match &out {
            Ok(r) => {
                let outcome = match r.outcome {
                    PublishOutcome::Created => "created",
                    PublishOutcome::AlreadyPresent => "already_present",
                    PublishOutcome::Conflict => "conflict",
                };
                let bytes = (r.outcome == PublishOutcome::Created).then_some(r.payload_len);
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

    /// The publication itself (`publish_with_progress` counts it).
    async fn publish_uncounted(
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
    /// which the caller ends.
    async fn publish_guarded(
        &self,
        req: PublishRequest,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
        slot: &mut Option<ProtectGuard>,
    ) -> Result<PublishReceipt> {
        let start = Instant::now();
        let id = &req.identity;
        id.validate()?;
        let ns = id.namespace();
        let ct = u64::from(id.chunk_tokens);
        let snap = &req.snapshot;
        let boundary = snap.boundary();
        if boundary == 0 || boundary % ct != 0 {
            return Err(StoreError::Invalid(format!(
                "boundary {boundary} is not a positive multiple of chunk_tokens {ct}"
            )));
        }
        // Only the store's own ledger may publish: a publication relies on
        // objects it finds present, which another ledger may be collecting.
        self.require_owner("publish").await?;
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
        let checked = match &req.base {
            None => None,
            Some(b) => Some(self.check_base(&ns, id, b, snap).await?),
        };
        // v2 roots carry the layered digest (v2.2) when the layout allows.
        let layered = req.format == RootFormat::V2 && layer_digest::supported(snap.header());
        // Lay a delta out now (the header's length does not depend on the
        // result digest, so a stand-in serves): its size decides, with the
        // chain below the base, whether the chain policy rebases.
        let mut layout: Option<DeltaLayout> = None;
        let mut chain: Option<ChainHints> = None;
        let mut rebased = false;
        if let (Some(b), Some(CheckedBase { base: r, below, .. })) = (&req.base, &checked) {
            let (base, result, chunk) = (b.snapshot.clone(), snap.clone(), id.chunk_tokens);
            let base_digest = r.snapshot_digest;
            // A stand-in for the result digest, of the kind the root will
            // record (the header's length depends on the kind only).
            let alg = if layered {
                deltapack_format::Algorithm::Blake3Layers
            } else {
                deltapack_format::Algorithm::Blake3
            };
            let stand_in = Digest::new(alg, [0; 32]);
            let l = tokio::task::spawn_blocking(move || {
                DeltaLayout::new(chunk, &base, &result, base_digest, stand_in)
            })
            .await
            .map_err(|e| StoreError::task("delta layout", e))??;
            let delta_len = l.header_bytes()?.len() as u64 + l.tails_len();
            if req.format == RootFormat::V2 {
                match below {
                    Some((ancestors, bytes)) => {
                        let hints = ChainHints {
                            ancestors: ancestors.clone(),
                            payload_bytes: bytes + delta_len,
                            // Filled in once the result digest is known.
                            delta_header: Vec::new(),
                        };
                        rebased = self.config().chain.rebases(
                            hints.ancestors.len() as u64 + 1,
                            hints.payload_bytes,
                            snap.encoded().len() as u64,
                        );
                        chain = Some(hints);
                    }
                    // The chain below the base cannot be followed to a flat
                    // root: a delta on it could never be restored.
                    None => rebased = true,
                }
            }
            if rebased {
                tracing::info!(context = %req.context, "chain policy: publishing flat");
                chain = None;
            } else {
                layout = Some(l);
            }
        }
        let (base_ref, base_state) = match checked.filter(|_| !rebased) {
            Some(c) => (Some(c.base), c.state),
            None => (None, None),
        };
        let base_in = req.base.as_ref().filter(|_| !rebased);
        // The result digest starts now on blocking threads and is awaited
        // only where it is needed: a delta's header (written last, see
        // `write_v2`), an existing root's comparison, the root. A layered
        // digest extends the base's state when the result keeps the base's
        // settled pages (compared byte for byte by the delta's layout), so
        // only the new pages are hashed; otherwise the whole result is
        // hashed. A flat snapshot's `blake3:` digest is its payload digest,
        // which the extent names give for free.
        let reused = layout.as_ref().map(|l| l.header.reused_pages.clone());
        let digest: Option<LateDigest> = (layered || base_ref.is_some()).then(|| {
            let s = snap.clone();
            let stats = self.clone();
            // Hashing runs beside the extent writes, whose copy and naming
            // threads need a core too.
            let h = tokio::task::spawn_blocking(move || {
                let extend = base_state.filter(|st| {
                    reused.as_ref().is_some_and(|r| {
                        r.iter().zip(st.settled()).all(|(have, need)| have >= need)
                    })
                });
                let out = if !layered {
                    Stats::add(
                        &stats.stats_ref().snapshot_bytes_hashed,
                        s.encoded().len() as u64,
                    );
                    ResultDigest {
                        digest: Digest::blake3(s.encoded()),
                        layered: None,
                    }
                } else {
                    let (d, st) = match &extend {
                        Some(st) => {
                            let tail =
                                s.payload().len() as u64 - settled_bytes(s.header(), st.settled());
                            Stats::add(&stats.stats_ref().snapshot_bytes_hashed, tail);
                            st.extend_to(&s)
                        }
                        None => {
                            Stats::add(
                                &stats.stats_ref().snapshot_bytes_hashed,
                                s.encoded().len() as u64,
                            );
                            DigestState::capture(&s)
                        }
                    }
                    .map_err(|e| e.to_string())?;
                    ResultDigest {
                        digest: d.snapshot,
                        layered: Some((d, Arc::new(st))),
                    }
                };
                Ok::<_, String>(Arc::new(out))
            });
            async move { h.await.map_err(|e| format!("digest task: {e}"))? }
                .boxed()
                .shared()
        });
        let snapshot_digest = || async {
            match &digest {
                Some(d) => d
                    .clone()
                    .await
                    .map(|r| r.digest)
                    .map_err(StoreError::Internal),
                None => {
                    let s = snap.clone();
                    tokio::task::spawn_blocking(move || s.digest())
                        .await
                        .map_err(|e| StoreError::task("digest", e))
                }
            }
        };

        // An existing root decides the outcome without writing anything.
        if !matches!(self.read_root(&ns, &req.context).await?, RootStatus::Absent) {
            let mut receipt = PublishReceipt::empty(ns, req.context, snapshot_digest().await?);
            if req.format == RootFormat::V1 {
                receipt.schema = root::SCHEMA_V1.into();
            }
            if let Some(done) = self
                .existing_outcome(&ns, &req.context, &mut receipt, Some(&req.snapshot))
                .await?
            {
                if done == PublishOutcome::AlreadyPresent {
                    self.ledger_touch(&ns, &req.context).await;
                    // The caller's snapshot is the one the root names: a
                    // delta on it (the same `Arc`) is not hashed again.
                    let state = match &digest {
                        Some(d) => d
                            .clone()
                            .await
                            .ok()
                            .and_then(|r| r.layered.as_ref().map(|(_, st)| st.clone())),
                        None => None,
                    };
                    receipt.turn = self.remember_published(
                        ns,
                        req.context,
                        receipt.snapshot_digest,
                        &req.snapshot,
                        state,
                    );
                }
                if let Some(g) = slot.take() {
                    g.finish().await;
                }
                receipt.total_time = start.elapsed();
                return Ok(done_receipt(receipt, done));
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
        let _base_pin = base_in.map(|b| self.pin(ns, b.context));

        // The payload as parts of the caller's snapshot: nothing is copied.
        let t_encode = Instant::now();
        let whole = snap.encoded_bytes();
        let mut header_template = None;
        let payload = match (layout, &digest) {
            (Some(layout), Some(d)) => {
                let stand_in = Bytes::from(layout.header_bytes()?);
                let mut parts = vec![stand_in.clone()];
                parts.extend(layout.tails.iter().map(|r| whole.slice(r.clone())));
                header_template = Some(layout.header.clone());
                let (d, mut late) = (d.clone(), layout.header);
                let header = async move {
                    late.result_digest = d.await?.digest;
                    let bytes = DeltaLayout {
                        header: late,
                        tails: Vec::new(),
                    }
                    .header_bytes()
                    .map_err(|e| e.to_string())?;
                    if bytes.len() != stand_in.len() {
                        return Err("the delta header changed length".to_string());
                    }
                    Ok(Bytes::from(bytes))
                }
                .boxed()
                .shared();
                Payload {
                    parts,
                    header: Some(header),
                }
            }
            _ => Payload::from(whole),
        };
        receipt.encode_time = t_encode.elapsed();
        receipt.payload_len = payload.len();

        // Capacity first: evict or refuse before anything is written.
        let objects = match req.format {
            RootFormat::V2 => receipt.payload_len.div_ceil(self.config().max_extent_bytes),
            RootFormat::V1 => boundary / ct,
        };
        // Upper bound of what this publication adds: the payload (objects
        // already present are not subtracted) and a generous root estimate.
        let guard = match slot {
            Some(g) => &*g,
            None => &*slot.insert(ProtectGuard::new(self).await?),
        };
        self.make_room(receipt.payload_len + 4096 + 256 * objects, guard)
            .await?;

        let t_write = Instant::now();
        let mut result_state: Option<Arc<DigestState>> = None;
        let root_bytes = match req.format {
            RootFormat::V2 => {
                let (entries, payload_digest) = self
                    .write_v2(payload, &mut receipt, progress, guard)
                    .await?;
                receipt.snapshot_digest = match &digest {
                    Some(_) => snapshot_digest().await?,
                    None => payload_digest,
                };
                let meta = result_meta(&req, base_ref, receipt.snapshot_digest);
                if let (Some(c), Some(h)) = (chain.as_mut(), header_template.take()) {
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
                receipt.rebased = rebased;
                let layers = match &digest {
                    Some(d) => d
                        .clone()
                        .await
                        .map_err(StoreError::Internal)?
                        .layered
                        .as_ref()
                        .map(|(l, st)| {
                            result_state = Some(st.clone());
                            (l.streams.clone(), st.clone())
                        }),
                    None => None,
                };
                receipt.schema = match (&layers, &chain) {
                    (Some(_), _) => root::SCHEMA_V2_2,
                    (None, Some(_)) => root::SCHEMA_V2_1,
                    (None, None) => root::SCHEMA_V2,
                }
                .into();
                self.encode_v2(
                    &meta,
                    layers.as_ref().map(|(l, st)| (l.as_slice(), st.as_ref())),
                    receipt.payload_len,
                    payload_digest,
                    entries,
                    chain,
                )?
            }
            RootFormat::V1 => {
                let whole = payload.assemble().await?;
                let (chunks, payload_digest) = self
                    .write_v1(&req, whole, &mut receipt, progress, guard)
                    .await?;
                receipt.snapshot_digest = match &digest {
                    Some(_) => snapshot_digest().await?,
                    None => payload_digest,
                };
                let meta = result_meta(&req, base_ref, receipt.snapshot_digest);
                let manifest = deltapack_format::ManifestV1::new(
                    &meta,
                    receipt.payload_len,
                    payload_digest,
                    chunks,
                )?;
                Bytes::from(root::encode_v1(&manifest, self.inner.mac_key.as_ref())?)
            }
        };
        self.create_root(
            &ns,
            &req.context,
            root_bytes,
            &mut receipt,
            Some(&req.snapshot),
        )
        .await?;
        if let Some(g) = slot.take() {
            g.finish().await;
        }
        receipt.write_time = t_write.elapsed();
        receipt.total_time = start.elapsed();
        if receipt.outcome != PublishOutcome::Conflict {
            // The caller's snapshot is now what this root names: a delta on
            // it, given the same `Arc`, is not hashed again.
            receipt.turn = self.remember_published(
                ns,
                req.context,
                receipt.snapshot_digest,
                &req.snapshot,
                result_state,
            );
        }
        if receipt.outcome == PublishOutcome::Conflict {
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
        Ok(receipt)
    }

    /// Creates the root of a publication whose objects are durable (their
    /// protection is the caller's), records it in the ledger, and settles
    /// the receipt's outcome: created, or whatever an existing root implies.
    pub(crate) async fn create_root(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        root_bytes: Bytes,
        receipt: &mut PublishReceipt,
        snapshot: Option<&Arc<Snapshot>>,
    ) -> Result<()> {
        let entry = match root::decode(&root_bytes, self.inner.mac_key.as_ref())?.summary() {
            Some(s) => crate::ledger::RootEntry::from_summary(&s, root_bytes.len() as u64),
            None => {
                return Err(StoreError::Internal(
                    "a root just encoded does not decode".into(),
                ))
            }
        };

        let key = keys::root_key(ns, ctx);
        let root_len = root_bytes.len() as u64;
        let root_digest = Digest::blake3(&root_bytes);
        // An I/O error on the root write may hide a PUT that landed but whose
        // response was lost: read the root back before reporting failure.
        // Root creation holds the root lock (local disk), so a sweep judging
        // this context under the lock sees it either absent or complete.
        // A create can lose to a root that another process then removes
        // (eviction, prune, invalidation) before this one reads it back. That
        // is an ordinary race, not a broken invariant: this publication's
        // objects are still protected by `guard`, so it simply creates again.
        // Bounded, because each retry needs another writer to create and
        // another to delete the same context in between.
        const CREATE_ATTEMPTS: usize = 8;
        let mut attempt = 0;
        loop {
            attempt += 1;
            // The lock also covers the ledger record: a removal of this
            // context (root deleted, then forgotten in the ledger) cannot
            // interleave with the creation and record of the new root.
            let lock = self.root_lock().await?;
            let put = put_create(self.object_store().as_ref(), &key, root_bytes.clone()).await;
            if matches!(put, Ok(PutOutcome::Created)) {
                self.ledger_record(&entry).await;
            }
            drop(lock);
            let created = match put {
                Ok(o) => o,
                Err(e @ StoreError::Io { .. }) => {
                    tracing::warn!(error = %e, %key, "root write failed; reading the root back");
                    match self.existing_outcome(ns, ctx, receipt, snapshot).await {
                        Ok(Some(_)) => PutOutcome::Existed,
                        _ => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            match created {
                PutOutcome::Created => {
                    receipt.outcome = PublishOutcome::Created;
                    receipt.root_digest = Some(root_digest);
                    receipt.bytes_written += root_len;
                    Stats::add(&self.stats_ref().roots_written, 1);
                    Stats::add(&self.stats_ref().bytes_written, root_len);
                    break;
                }
                PutOutcome::Existed => {
                    // Lost a race (or an earlier attempt whose response was
                    // lost landed): the root that is there decides.
                    match self.existing_outcome(ns, ctx, receipt, snapshot).await? {
                        Some(done) => {
                            if done == PublishOutcome::AlreadyPresent {
                                self.ledger_touch(ns, ctx).await;
                            }
                            receipt.outcome = done;
                            break;
                        }
                        None if attempt < CREATE_ATTEMPTS => {
                            tracing::info!(
                                %key,
                                attempt,
                                "the root this publication lost to is gone again; creating it again"
                            );
                        }
                        // Not a broken invariant: other writers keep
                        // creating and removing this context. A typed,
                        // retryable outcome; nothing of this publication's
                        // is visible.
                        None => {
                            return Err(StoreError::Concurrent(format!(
                                "root {key} existed at create but was removed before it could \
                                 be read, {CREATE_ATTEMPTS} times in a row (other processes \
                                 keep publishing and evicting this context); publish again"
                            )))
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Validates a delta's base against its root; returns the reference and
    /// what lies below the base (see [`Store::chain_below`]).
    async fn check_base(
        &self,
        ns: &Namespace,
        id: &CacheIdentity,
        b: &BaseInput,
        result: &Snapshot,
    ) -> Result<CheckedBase> {
        let mismatch = |detail: String| StoreError::BaseMismatch {
            namespace: *ns,
            context: b.context,
            detail,
        };
        let ct = u64::from(id.chunk_tokens);
        let bb = b.snapshot.boundary();
        if bb == 0 || bb % ct != 0 {
            return Err(StoreError::Invalid(format!(
                "base boundary {bb} is not a positive multiple of {ct}"
            )));
        }
        if bb >= result.boundary() {
            return Err(StoreError::Invalid(format!(
                "base boundary {bb} must be below the result boundary {}",
                result.boundary()
            )));
        }
        if b.snapshot.layout() != result.layout() {
            return Err(StoreError::Invalid("base and result layouts differ".into()));
        }
        let (digest, state, below) = match self.read_root(ns, &b.context).await? {
            RootStatus::Found(root) => {
                let s = root
                    .summary()
                    .ok_or_else(|| StoreError::Internal("summary".into()))?;
                if s.boundary != bb {
                    return Err(mismatch(format!(
                        "base root boundary {} != {bb}",
                        s.boundary
                    )));
                }
                let want = s.result_snapshot_digest;
                let (digest, state) = self
                    .verify_base(ns, &b.context, &b.snapshot, want, &root)
                    .await?;
                if digest != want {
                    return Err(mismatch(format!(
                        "the base root holds {want} but the given base snapshot is {digest}"
                    )));
                }
                (digest, state, self.chain_below(&root).await?)
            }
            RootStatus::Absent => return Err(mismatch("no base root is published".into())),
            RootStatus::Unusable(r) => {
                return Err(mismatch(format!("the base root is unusable: {r}")))
            }
        };
        Ok(CheckedBase {
            base: BaseRef {
                namespace: *ns,
                context: b.context,
                snapshot_digest: digest,
                boundary: bb,
            },
            below,
            state,
        })
    }

    /// The digest of a caller's base snapshot by the definition of `want`
    /// (its root's), and the base's digest state when there is one. A
    /// snapshot this handle published or restored under that root and the
    /// caller still holds (the same `Arc`) was verified then: it is not
    /// hashed again. Any other base is hashed (for a layered digest keeping
    /// the state, so the result's digest extends it).
    async fn verify_base(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        snapshot: &Arc<Snapshot>,
        want: Digest,
        root: &DecodedRoot,
    ) -> Result<(Digest, Option<Arc<DigestState>>)> {
        let key = (*ns, *ctx, want);
        let held = match self.inner.base_cache.lock() {
            Ok(c) if c.holds(&key, snapshot) => Some(c.state(&key)),
            _ => None,
        };
        match held {
            Some(Some(state)) => return Ok((want, Some(state))),
            // Verified when handed out, but without a state (a restore does
            // not build one): the root's recorded turn state, proven with
            // about a page per stream, or none.
            Some(None) => {
                let state = self.resume_state(*ns, *ctx, root, snapshot).await;
                return Ok((want, state));
            }
            None => {}
        }
        let s = snapshot.clone();
        let layered = want.algorithm() == deltapack_format::Algorithm::Blake3Layers;
        let hashed = s.encoded().len() as u64;
        let (digest, state) = tokio::task::spawn_blocking(move || {
            if layered {
                DigestState::capture(&s).map(|(d, st)| (d.snapshot, Some(Arc::new(st))))
            } else {
                Ok((s.digest(), None))
            }
        })
        .await
        .map_err(|e| StoreError::task("base digest", e))??;
        Stats::add(&self.stats_ref().snapshot_bytes_hashed, hashed);
        if digest == want {
            if let (Ok(mut c), Some(st)) = (self.inner.base_cache.lock(), &state) {
                c.put_handed_out(key, snapshot);
                c.put_state(key, st.clone());
            }
        }
        Ok((digest, state))
    }

    /// The chain a delta on `base` would sit on: the roots below `base`,
    /// nearest first, down to the flat root, and the payload bytes of
    /// `base` and all of them. From `base`'s own hints when it has them,
    /// else by reading the roots link by link (a chain written before v2.1,
    /// or through legacy roots). `None` if the chain cannot be followed to
    /// a flat root within `max_base_depth`.
    async fn chain_below(&self, base: &DecodedRoot) -> Result<Option<(Vec<BaseRef>, u64)>> {
        let Some(s) = base.summary() else {
            return Ok(None);
        };
        let Some(next) = s.base else {
            return Ok(Some((Vec::new(), s.payload_len)));
        };
        if let DecodedRoot::V2(m) = base {
            if let Some(c) = &m.chain {
                let mut ancestors = Vec::with_capacity(c.ancestors.len() + 1);
                ancestors.push(next);
                ancestors.extend_from_slice(&c.ancestors);
                return Ok(Some((ancestors, c.payload_bytes)));
            }
        }
        let mut ancestors = Vec::new();
        let mut bytes = s.payload_len;
        let mut link = Some(next);
        while let Some(b) = link {
            if ancestors.len() >= self.config().max_base_depth.min(MAX_CHAIN_HINTS) {
                return Ok(None);
            }
            let summary = match self.peek_root(&b.namespace, &b.context).await? {
                RootStatus::Found(d) => match d.summary() {
                    Some(x) => x,
                    None => return Ok(None),
                },
                _ => return Ok(None),
            };
            if summary.result_snapshot_digest != b.snapshot_digest
                || summary.boundary != b.boundary
                || ancestors
                    .last()
                    .is_some_and(|a: &BaseRef| a.boundary <= b.boundary)
            {
                return Ok(None);
            }
            ancestors.push(b);
            bytes += summary.payload_len;
            link = summary.base;
        }
        Ok(Some((ancestors, bytes)))
    }

    /// If a root exists at `(ns, ctx)`, the outcome it implies for this
    /// request. A damaged existing root is quarantined and treated as absent.
    async fn existing_outcome(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        receipt: &mut PublishReceipt,
        snapshot: Option<&Arc<Snapshot>>,
    ) -> Result<Option<PublishOutcome>> {
        match self.read_root(ns, ctx).await? {
            RootStatus::Absent => Ok(None),
            RootStatus::Unusable(reason) => {
                // Corrupt roots were already quarantined by read_root; an
                // incompatible or unauthenticated root is left alone and wins.
                match reason {
                    crate::MissReason::Corrupt { .. } => Ok(None),
                    other => {
                        receipt.schema = format!("unusable ({other})");
                        Ok(Some(PublishOutcome::Conflict))
                    }
                }
            }
            RootStatus::Found(root) => {
                let s = root
                    .summary()
                    .ok_or_else(|| StoreError::Internal("summary".into()))?;
                receipt.schema = s.schema.to_string();
                receipt.root_digest = None;
                let existing = s.result_snapshot_digest;
                // A root written with the other digest definition (a v1 or
                // v2.1 root of the same bytes, say) is the same snapshot if
                // the caller's bytes hash to its digest by its definition.
                let same = existing == receipt.snapshot_digest
                    || match snapshot {
                        Some(snap)
                            if existing.algorithm() != receipt.snapshot_digest.algorithm() =>
                        {
                            let snap = snap.clone();
                            tokio::task::spawn_blocking(move || {
                                deltapack_format::layer_digest::digest_like(&snap, &existing)
                            })
                            .await
                            .map_err(|e| StoreError::task("digest", e))??
                                == existing
                        }
                        _ => false,
                    };
                if same {
                    Ok(Some(PublishOutcome::AlreadyPresent))
                } else {
                    receipt.existing_snapshot_digest = Some(s.result_snapshot_digest);
                    Ok(Some(PublishOutcome::Conflict))
                }
            }
        }
    }

    /// Extents of `m` bytes written at once: [`PUBLISH_BATCH`] on local disk
    /// and in memory; on a remote store as many as their multipart parts
    /// fill [`StoreConfig::parts_in_flight`](crate::StoreConfig) (one
    /// connection carries little, so the parts of two extents cannot fill a
    /// node's bandwidth), at least [`PUBLISH_BATCH`], at most 16.
    fn extent_writers(&self, m: u64) -> usize {
        if !self.backend_kind().is_remote() {
            return PUBLISH_BATCH;
        }
        let c = &self.inner.config;
        let per_extent = if m > c.part_bytes {
            m.div_ceil(c.part_bytes.max(1))
        } else {
            1
        };
        (c.parts_in_flight as u64)
            .div_ceil(per_extent)
            .clamp(PUBLISH_BATCH as u64, 16) as usize
    }

    /// Names and writes `payload`'s extents; returns their entries (in
    /// order) and the payload digest.
    ///
    /// Pipelined: a producer task names (hashes) extents ahead of the
    /// writes, and [`Store::extent_writers`] writes are in flight. (On local disk
    /// that is two direct-I/O streams, measured faster than one; with
    /// buffered writes two streams had been slower than one.) Extents that
    /// overlap a late header (a delta's, which waits for the result digest)
    /// go last, so hashing the result overlaps the other writes.
    #[tracing::instrument(level = "debug", name = "write_v2", skip_all)]
    pub(crate) async fn write_v2(
        &self,
        payload: Payload,
        receipt: &mut PublishReceipt,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
        guard: &ProtectGuard,
    ) -> Result<(Vec<deltapack_format::ExtentEntry>, Digest)> {
        let m = self.inner.config.max_extent_bytes;
        let total = payload.len();
        let plan = ExtentPlan::new(total, m)?;
        let level = self.inner.config.compression;
        let late = payload
            .header
            .as_ref()
            .map_or(0, |_| payload.parts[0].len() as u64);
        let (early, waiting): (Vec<u64>, Vec<u64>) =
            (0..plan.count()).partition(|&i| plan.range(i).start >= late);
        let writers = self.extent_writers(m);
        let parts = Arc::new(payload.parts);
        let header = payload.header;
        // A producer task names (and maybe compresses) extents ahead of the
        // writes, at most `writers` ahead: it runs on its own, so hashing
        // extent i+1 overlaps writing extent i.
        let (tx, rx) = tokio::sync::mpsc::channel(writers);
        let order: Vec<u64> = early.into_iter().chain(waiting).collect();
        // The producer also protects each extent's key before handing it
        // to the writers: the protection's ledger commit (a WAL flush on
        // PostgreSQL) overlaps the writes already in flight instead of
        // holding up the write it guards.
        let protector = guard.protector();
        // One budget of parts in flight for all of this publication's
        // multipart extents (memory stays within parts × part size, and the
        // parts are slices of the payload, not copies).
        let parts_in_flight = tokio::sync::Semaphore::new(
            self.inner
                .config
                .parts_in_flight
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        );
        let parts_in_flight = &parts_in_flight;
        let mut producer = AbortOnDrop(tokio::spawn(async move {
            for i in order {
                let r = plan.range(i);
                let raw = match &header {
                    Some(h) if r.start < late => match h.clone().await {
                        Ok(h) => {
                            let mut with = parts.as_ref().clone();
                            with[0] = h;
                            slice_parts(&with, r)
                        }
                        Err(e) => {
                            let _ = tx.send(Err(StoreError::Internal(e))).await;
                            return;
                        }
                    },
                    _ => slice_parts(&parts, r),
                };
                let mut prepared =
                    tokio::task::spawn_blocking(move || prepare_extent(&plan, i, raw, level))
                        .await
                        .map_err(|e| StoreError::task("extent", e))
                        .and_then(|r| r)
                        .map(|(entry, obj)| (i, entry, obj));
                if let Ok((_, _, obj)) = &prepared {
                    if let Err(e) = protector.protect(vec![obj.key.to_string()]).await {
                        prepared = Err(e);
                    }
                }
                let failed = prepared.is_err();
                if tx.send(prepared).await.is_err() || failed {
                    return;
                }
            }
        }));
        let prepared = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let written = prepared
            .map(|p| async move {
                // Protected by the producer.
                let (i, entry, obj) = p?;
                let outcome = self
                    .write_object(&obj.key, obj.payload, Some(parts_in_flight))
                    .await?;
                Ok::<_, StoreError>((i, entry, outcome, obj.len))
            })
            .buffered(writers);
        let mut written = std::pin::pin!(written);
        let mut entries = Vec::with_capacity(plan.count() as usize);
        let mut done = 0u64;
        while let Some(w) = written.next().await {
            let (i, entry, outcome, len) = w?;
            self.count_write(receipt, outcome, len);
            done += entry.raw_len;
            entries.push((i, entry));
            progress(done, total);
        }
        // The stream ended: the producer has sent everything.
        (&mut producer.0)
            .await
            .map_err(|e| StoreError::task("extent producer", e))?;
        entries.sort_by_key(|(i, _)| *i);
        let entries: Vec<_> = entries.into_iter().map(|(_, e)| e).collect();
        let names: Vec<Digest> = entries.iter().map(|e| e.raw_digest).collect();
        let payload_digest = plan.merge(&names)?;
        Ok((entries, payload_digest))
    }

    /// Encodes (and, on keyed stores, MACs) a v2 root.
    pub(crate) fn encode_v2(
        &self,
        meta: &RootMeta,
        layers: Option<(&[layer_digest::StreamDigest], &DigestState)>,
        payload_len: u64,
        payload_digest: Digest,
        entries: Vec<deltapack_format::ExtentEntry>,
        chain: Option<ChainHints>,
    ) -> Result<Bytes> {
        let m = self.inner.config.max_extent_bytes;
        let mut manifest = match layers {
            // A layered root records the result's turn state, so whoever
            // holds the result later publishes the next turn without
            // hashing it (`Store::turn_from`).
            Some((l, state)) => deltapack_format::ManifestV2::new_layered(
                meta,
                l,
                payload_len,
                payload_digest,
                m,
                entries,
            )?
            .with_turn_state(&state.stored())?,
            None => {
                deltapack_format::ManifestV2::new(meta, payload_len, payload_digest, m, entries)?
            }
        };
        if let Some(c) = chain {
            manifest = manifest.with_chain(c)?;
        }
        Ok(Bytes::from(root::encode_v2(
            &manifest,
            self.inner.mac_key.as_ref(),
        )?))
    }

    /// Writes a contiguous payload as v1 chunk objects (legacy layout);
    /// returns the chunk entries and the payload digest.
    #[tracing::instrument(level = "debug", name = "write_v1", skip_all)]
    async fn write_v1(
        &self,
        req: &PublishRequest,
        payload: Bytes,
        receipt: &mut PublishReceipt,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
        guard: &ProtectGuard,
    ) -> Result<(Vec<deltapack_format::root::ChunkEntryV1>, Digest)> {
        let p2 = payload.clone();
        let (boundary, ct) = (req.snapshot.boundary(), req.identity.chunk_tokens);
        let (chunks, payload_digest) = tokio::task::spawn_blocking(move || {
            let chunks = root::v1_chunks(&p2, boundary, ct)?;
            let d = deltapack_format::snapshot::digest_of_encoding(&p2);
            Ok::<_, deltapack_format::Error>((chunks, d))
        })
        .await
        .map_err(|e| StoreError::Internal(format!("v1 hashing task: {e}")))??;
        let ranges = root::v1_chunk_ranges(payload.len() as u64, chunks.len() as u64);
        let total = payload.len() as u64;
        let mut done = 0;
        let all: Vec<_> = chunks.iter().zip(ranges).collect();
        for batch in all.chunks(PUBLISH_BATCH) {
            let objs: Vec<PendingObject> = batch
                .iter()
                .map(|(c, r)| PendingObject {
                    key: keys::object_key(&c.digest),
                    payload: PutPayload::from_bytes(
                        payload.slice(r.start as usize..r.end as usize),
                    ),
                    len: r.end - r.start,
                })
                .collect();
            guard
                .protect(
                    objs.iter()
                        .map(|o: &PendingObject| o.key.to_string())
                        .collect(),
                )
                .await?;
            self.write_batch(objs, receipt).await?;
            done += batch.iter().map(|(c, _)| c.bytes).sum::<u64>();
            progress(done, total);
        }
        Ok((chunks, payload_digest))
    }

    fn count_write(&self, receipt: &mut PublishReceipt, outcome: PutOutcome, len: u64) {
        match outcome {
            PutOutcome::Created => {
                receipt.objects_written += 1;
                receipt.bytes_written += len;
                Stats::add(&self.stats_ref().objects_written, 1);
                Stats::add(&self.stats_ref().bytes_written, len);
            }
            PutOutcome::Existed => {
                receipt.objects_reused += 1;
                Stats::add(&self.stats_ref().objects_reused, 1);
            }
        }
    }

    /// Writes one durability batch concurrently; returns when all are durable.
    async fn write_batch(
        &self,
        objs: Vec<PendingObject>,
        receipt: &mut PublishReceipt,
    ) -> Result<()> {
        let results = futures::stream::iter(objs)
            .map(|o| async move {
                let outcome = self.write_object(&o.key, o.payload, None).await?;
                Ok::<_, StoreError>((outcome, o.len))
            })
            .buffer_unordered(PUBLISH_BATCH)
            .collect::<Vec<_>>()
            .await;
        for r in results {
            let (outcome, len) = r?;
            self.count_write(receipt, outcome, len);
        }
        Ok(())
    }

    /// Create-if-absent for a content-addressed object. An existing object
    /// of the wrong size is damaged: quarantine it and write ours.
    ///
    /// With `parts` (a v2 extent), on a remote backend, an object larger
    /// than [`crate::StoreConfig::part_bytes`] is a multipart upload whose
    /// parts take permits of `parts` (see [`Store::write_multipart`]).
    async fn write_object(
        &self,
        key: &object_store::path::Path,
        payload: PutPayload,
        parts: Option<&tokio::sync::Semaphore>,
    ) -> Result<PutOutcome> {
        let store = self.object_store().as_ref();
        let len = payload.content_length() as u64;
        if let Some(parts) = parts {
            if self.backend_kind().is_remote() && len > self.inner.config.part_bytes {
                return self.write_multipart(key, payload, parts).await;
            }
        }
        // The memory backend keeps the very `Bytes` it is given, and these
        // are slices of the caller's snapshot, which may be memory deltapack
        // does not own (a Python buffer): a stored object must never alias
        // memory its owner may change after the call, so copy it here.
        let payload = if matches!(self.backend_kind(), BackendKind::Memory) {
            let mut owned = Vec::with_capacity(payload.content_length());
            for part in payload.iter() {
                owned.extend_from_slice(part);
            }
            PutPayload::from(owned)
        } else {
            payload
        };
        match put_create(store, key, payload.clone()).await? {
            PutOutcome::Created => Ok(PutOutcome::Created),
            PutOutcome::Existed => match store.head(key).await {
                Ok(meta) if meta.size == len => Ok(PutOutcome::Existed),
                Ok(meta) => {
                    tracing::warn!(%key, size = meta.size, want = len, "existing object has the wrong size");
                    self.quarantine(key).await;
                    put_create(store, key, payload).await
                }
                // Deleted between the two calls (e.g. by GC): write it again.
                Err(object_store::Error::NotFound { .. }) => put_create(store, key, payload).await,
                Err(e) => Err(StoreError::io(key, e)),
            },
        }
    }
}

impl Store {
    /// Writes a large extent as a multipart upload, create-if-absent by
    /// HEAD-then-write: object_store's multipart `complete` has no
    /// `PutMode::Create` (it overwrites), so the key is looked up first. An
    /// object of the right size is reused, as [`Store::write_object`]
    /// reuses one, and one of the wrong size is quarantined and replaced.
    /// The key is the content's digest, so another writer completing an
    /// upload of the same key between the HEAD and our `complete` wrote the
    /// same bytes: the last `complete` replaces an object with an identical
    /// one, and a reader sees one or the other, never a mixture. (A
    /// collector cannot delete the key meanwhile: the producer protected it
    /// before the write.) A completed upload is durable on S3 as a PUT is;
    /// a failed part or `complete` aborts the upload, so nothing is visible
    /// and the publication fails before its root is written.
    async fn write_multipart(
        &self,
        key: &object_store::path::Path,
        payload: PutPayload,
        parts: &tokio::sync::Semaphore,
    ) -> Result<PutOutcome> {
        let store = self.object_store().as_ref();
        let len = payload.content_length() as u64;
        match store.head(key).await {
            Ok(meta) if meta.size == len => return Ok(PutOutcome::Existed),
            Ok(meta) => {
                tracing::warn!(%key, size = meta.size, want = len, "existing object has the wrong size");
                self.quarantine(key).await;
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(StoreError::io(key, e)),
        }
        let pieces = split_payload(&payload, self.inner.config.part_bytes);
        tracing::debug!(%key, bytes = len, parts = pieces.len(), "multipart upload");
        crate::backend::put_multipart(self.object_store(), key, pieces, parts).await?;
        Ok(PutOutcome::Created)
    }
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

/// The payload bytes of a snapshot that lie in the first `settled[g]`
/// pages of every group.
fn settled_bytes(h: &deltapack_format::SnapshotHeader, settled: &[u64]) -> u64 {
    h.layout
        .groups
        .iter()
        .zip(settled)
        .map(|(g, &k)| g.page_bytes() * k)
        .sum()
}

fn done_receipt(mut r: PublishReceipt, outcome: PublishOutcome) -> PublishReceipt {
    r.outcome = outcome;
    r
}

/// Names (and optionally compresses) one extent given as parts.
fn prepare_extent(
    plan: &ExtentPlan,
    index: u64,
    raw: Vec<Bytes>,
    level: Option<i32>,
) -> Result<(deltapack_format::ExtentEntry, PendingObject)> {
    use deltapack_format::{ExtentCodec, ExtentEntry};
    let mut h = plan.hasher(index);
    for p in &raw {
        h.update(p);
    }
    let raw_digest = h.finish()?;
    let r = plan.range(index);
    let raw_len = r.end - r.start;
    if let Some(level) = level {
        let c = deltapack_format::extent::compress(&raw.concat(), level)?;
        if (c.len() as u64) < raw_len - raw_len / 16 {
            let stored_digest = Digest::blake3(&c);
            let entry = ExtentEntry {
                offset: r.start,
                raw_len,
                raw_digest,
                codec: ExtentCodec::Zstd,
                stored_len: c.len() as u64,
                stored_digest: Some(stored_digest),
            };
            return Ok((
                entry,
                PendingObject {
                    key: keys::object_key(&stored_digest),
                    len: c.len() as u64,
                    payload: PutPayload::from(c),
                },
            ));
        }
    }
    let entry = ExtentEntry {
        offset: r.start,
        raw_len,
        raw_digest,
        codec: ExtentCodec::Raw,
        stored_len: raw_len,
        stored_digest: None,
    };
    Ok((
        entry,
        PendingObject {
            key: keys::object_key(&raw_digest),
            len: raw_len,
            payload: raw.into_iter().collect(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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

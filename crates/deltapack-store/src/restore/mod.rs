//! Restore: verify everything, hand over nothing unverified.
//!
//! The pipeline for one context (docs/design.md §6):
//!
//! 1. Read the root envelope; check its length bound, body hash, MAC (keyed
//!    stores) and schema. Unknown → `incompatible` miss; damaged twice →
//!    `corrupt` miss and quarantine (one bad read is read again).
//! 2. The root must name the requested namespace and context.
//! 3. Resolve the plan from roots alone: a flat v2 root; a v2 delta chain,
//!    walked link by link down to its flat bottom (each link's boundary and
//!    digest checked, cycles refused, depth bounded; v2.1 roots list their
//!    ancestors, so the chain's roots are fetched in one concurrent round,
//!    which starts with the requested root's own read when the ledger is
//!    open and names them first — see `EarlyChain`); or a legacy v1 root,
//!    whose base is restored the old way.
//! 4. Rebuild: a flat root's extents are read, checked against their BLAKE3
//!    names and placed; a chain is composed into one plan (`compose`) and
//!    each needed extent is read once, checked and placed straight into the
//!    final buffer — no intermediate snapshot. The result is hashed in the
//!    loop and compared with the root's snapshot digest. A pass that fails
//!    on an object runs once more before anything is quarantined.
//! 5. On any miss after bytes were placed, the caller's buffer is zeroed.
//!
//! Concurrent restores of one root share one fetch+verify (*single flight*,
//! `cache`): the first caller spawns the work as a task and later callers
//! await the same result. The work runs to completion even if a caller
//! gives up at its deadline. Snapshots handed to callers are remembered
//! weakly, so a caller that still holds turn N restores turn N+1 from its
//! delta alone.

use std::sync::Arc;
use std::time::Instant;

use deltapack_format::{ContextDigest, Namespace, PageDelta, Snapshot};
use futures::FutureExt;

use crate::backend::BackendKind;
use crate::error::{MissReason, Result, StoreError};
use crate::keys::RootKey;
use crate::stats::Stats;
use crate::store::Store;

mod base;
pub(crate) mod cache;
mod compose;
mod layer_pass;
mod layers;
mod outcome;
mod plan;
pub(crate) mod read;
pub(crate) mod reassembly;
mod result;
mod sink;
mod tap;
mod v1;

use cache::{Flight, SharedRestore};
pub use layers::{LayerEvent, LayerOrder, LayerProof, LayerReady, LayerStream};
pub use outcome::{
    Restoration, RestoreIntoOutcome, RestoreOptions, RestoreOutcome, Restored, Target,
    RESTORE_IN_FLIGHT,
};
use plan::{Plan, Visited};
pub(crate) use tap::{Tap, Tapped};

type Inner = std::result::Result<Flight, Arc<StoreError>>;

/// Fields every restore span carries; namespace and context are set when
/// the key is known, the rest once the outcome is.
fn record_key(ns: &Namespace, ctx: &ContextDigest) {
    let span = tracing::Span::current();
    span.record("namespace", crate::metrics::short_hex(&ns.hex()));
    span.record("context", crate::metrics::short_hex(&ctx.hex()));
}

impl Store {
    /// The restore: the root `key` names — `(&identity, context)` or
    /// `(namespace, context)` — verified end to end and put where `target`
    /// says. [`Store::restore`] and [`Store::restore_into`] are this call
    /// with a fixed target; their docs give the details of each.
    ///
    /// A hit carries the verified snapshot (or says the caller's buffer
    /// holds it), a miss its reason. Errors are failures of the backend or
    /// of the process, or a wrong-sized buffer, never of the data.
    pub async fn restore_to(
        &self,
        key: impl Into<RootKey>,
        target: Target<'_>,
        opts: RestoreOptions,
    ) -> Result<Restoration> {
        Ok(match target {
            Target::New => Restoration::New(self.restore(key, opts).await?),
            Target::Into(buf) => Restoration::Into(self.restore_into(key, buf, opts).await?),
        })
    }

    /// Restores the root `key` names — `(&identity, context)` or
    /// `(namespace, context)` — verified end to end: a hit carries the
    /// snapshot, a miss its reason (absent, corrupt, incompatible,
    /// base-missing, deadline-exceeded, unauthenticated). Errors are
    /// failures of the backend or of the process, never of the data.
    /// The result is allocated with [`crate::fresh_buffer`] (huge pages,
    /// faulted in where the workers write).
    #[tracing::instrument(level = "info", name = "restore", skip_all, fields(
        namespace = tracing::field::Empty,
        context = tracing::field::Empty,
        schema = tracing::field::Empty,
        outcome = tracing::field::Empty,
        reason = tracing::field::Empty,
        bytes = tracing::field::Empty,
    ))]
    pub async fn restore(
        &self,
        key: impl Into<RootKey>,
        opts: RestoreOptions,
    ) -> Result<RestoreOutcome> {
        let key = key.into();
        record_key(&key.namespace, &key.context);
        let start = Instant::now();
        if opts.deadline_passed() {
            let reason = MissReason::DeadlineExceeded;
            self.record_restore(start, None, Err(&reason));
            return Ok(RestoreOutcome::Miss(reason));
        }
        if let Some(hit) = self.tier_restore(key, opts).await {
            let (boundary, len) = (hit.snapshot.boundary(), hit.snapshot.encoded().len());
            self.record_restore(start, Some(hit.schema), Ok((boundary, len as u64)));
            return Ok(RestoreOutcome::Hit(hit));
        }
        self.restore_origin(key, opts, start)
            .await
            .map_err(|e| self.origin_failed(e))
    }

    /// [`Store::restore`] from this store itself (not its tier); a hit
    /// starts the tier's fill.
    async fn restore_origin(
        &self,
        key: RootKey,
        opts: RestoreOptions,
        start: Instant,
    ) -> Result<RestoreOutcome> {
        let (ns, context) = (key.namespace, key.context);
        // Open while the restore runs and its fill is scheduled.
        let _tap = self.tier().and_then(|t| t.open_tap(key));
        let fut = self.restore_root(ns, context, Vec::new());
        let out = match opts.deadline {
            None => fut.await,
            Some(d) => match tokio::time::timeout_at(d, fut).await {
                Ok(r) => r,
                Err(_) => Ok((RestoreOutcome::Miss(MissReason::DeadlineExceeded), None)),
            },
        };
        let (out, schema) = out.map_err(|e| match Arc::try_unwrap(e) {
            Ok(e) => e,
            Err(shared) => StoreError::Internal(format!("shared restore failed: {shared}")),
        })?;
        match &out {
            RestoreOutcome::Hit(r) => {
                self.after_origin_hit(key, r.digest);
                self.record_restore(
                    start,
                    Some(r.schema),
                    Ok((r.snapshot.boundary(), r.snapshot.encoded().len() as u64)),
                )
            }
            RestoreOutcome::Miss(m) => self.record_restore(start, schema, Err(m)),
        }
        Ok(out)
    }

    /// Counts one restore's outcome — latency, hit (with its boundary, for
    /// the comparison with prefill, and its bytes) or miss by reason — in
    /// the counters, the metrics and the current span.
    fn record_restore(
        &self,
        start: Instant,
        schema: Option<&'static str>,
        outcome: std::result::Result<(u64, u64), &MissReason>,
    ) {
        let st = self.stats_ref();
        let span = tracing::Span::current();
        span.record("schema", schema.unwrap_or(crate::metrics::UNKNOWN_SCHEMA));
        self.metrics().restore(
            start.elapsed().as_secs_f64(),
            schema,
            outcome.map(|(_, bytes)| bytes),
        );
        match outcome {
            Ok((boundary, bytes)) => {
                span.record("outcome", "hit");
                span.record("bytes", bytes);
                Stats::add(&st.hits, 1);
                if let Some(rate) = self
                    .config()
                    .restore
                    .prefill_tokens_per_s
                    .filter(|r| *r > 0.0)
                {
                    let recompute = boundary as f64 / rate;
                    if start.elapsed().as_secs_f64() < recompute {
                        Stats::add(&st.hits_cheaper_than_prefill, 1);
                    } else {
                        Stats::add(&st.hits_dearer_than_prefill, 1);
                    }
                }
            }
            Err(m) => {
                span.record("outcome", "miss");
                span.record("reason", crate::metrics::reason_label(m));
                Stats::add(
                    match m {
                        MissReason::Absent => &st.miss_absent,
                        MissReason::Corrupt { .. } => &st.miss_corrupt,
                        MissReason::Incompatible { .. } => &st.miss_incompatible,
                        MissReason::BaseMissing { .. } => &st.miss_base_missing,
                        MissReason::DeadlineExceeded => &st.miss_deadline,
                        MissReason::Unauthenticated { .. } => &st.miss_unauthenticated,
                    },
                    1,
                )
            }
        }
    }

    /// Restores into a caller-provided buffer of exactly the snapshot's
    /// encoded length.
    ///
    /// **Contract:** on a hit the buffer holds the verified snapshot
    /// encoding. After a miss (or an error) it holds no byte of unverified
    /// data: if the restore had placed any bytes, the whole buffer is zeroed;
    /// a miss found before anything was placed (no root, an unusable root,
    /// the deadline already past) leaves it as the caller gave it.
    ///
    /// For a v2 root the verified extent bytes are reconstructed directly in
    /// `buf`: no result buffer is allocated, so a caller that restores into
    /// the same resident memory each turn pays no page faults, and peak
    /// memory is `buf` plus a 256 KiB piece per worker (a buffer that is
    /// new rather than resident is best allocated with
    /// [`crate::fresh_buffer`]). The work runs on the
    /// calling thread and worker threads (`block_in_place` on a
    /// multi-thread runtime), and does not join a concurrent
    /// [`Store::restore`] of the same root; the base is restored once and
    /// shared through the verified-base cache as usual. A wrong-sized `buf`
    /// is an error found from the root, before any payload byte is read.
    ///
    /// v1 roots, and non-local backends on a current-thread runtime, restore
    /// through [`Store::restore`] and copy into `buf`.
    #[tracing::instrument(level = "info", name = "restore_into", skip_all, fields(
        namespace = tracing::field::Empty,
        context = tracing::field::Empty,
        schema = tracing::field::Empty,
        outcome = tracing::field::Empty,
        reason = tracing::field::Empty,
        bytes = tracing::field::Empty,
    ))]
    pub async fn restore_into(
        &self,
        key: impl Into<RootKey>,
        buf: &mut [u8],
        opts: RestoreOptions,
    ) -> Result<RestoreIntoOutcome> {
        let RootKey {
            namespace: ns,
            context,
        } = key.into();
        record_key(&ns, &context);
        let start = Instant::now();
        let miss = |reason: MissReason, schema: Option<&'static str>| {
            self.record_restore(start, schema, Err(&reason));
            Ok(RestoreIntoOutcome::Miss { reason })
        };
        if opts.deadline_passed() {
            return miss(MissReason::DeadlineExceeded, None);
        }
        if let Some(hit) = self
            .tier_restore_into((ns, context).into(), buf, opts)
            .await
        {
            if let RestoreIntoOutcome::Hit { len, .. } = &hit {
                let boundary =
                    deltapack_format::snapshot::decode_prefix(buf).map_or(0, |(h, _)| h.boundary);
                self.record_restore(start, None, Ok((boundary, *len)));
            }
            return Ok(hit);
        }
        self.restore_into_origin(ns, context, buf, opts, start)
            .await
            .map_err(|e| self.origin_failed(e))
    }

    /// [`Store::restore_into`] from this store itself (not its tier); a
    /// hit starts the tier's fill.
    async fn restore_into_origin(
        &self,
        ns: Namespace,
        context: ContextDigest,
        buf: &mut [u8],
        opts: RestoreOptions,
        start: Instant,
    ) -> Result<RestoreIntoOutcome> {
        let miss = |reason: MissReason, schema: Option<&'static str>| {
            self.record_restore(start, schema, Err(&reason));
            Ok(RestoreIntoOutcome::Miss { reason })
        };
        let (multi_thread, direct) = self.restore_in_place();
        if !direct {
            return self.restore_copy(ns, context, buf, opts).await;
        }
        let _pin = self.pin(ns, context);
        let r = match self.resolve_within(ns, context, opts).await? {
            Err((reason, schema)) => return miss(reason, schema),
            Ok(r) => r,
        };
        if let Plan::V1 { .. } = r.what {
            // Legacy roots: restore, then copy.
            return self.restore_copy(ns, context, buf, opts).await;
        }
        if buf.len() as u64 != r.result_len {
            return Err(StoreError::Invalid(format!(
                "buffer is {} bytes, the snapshot is {}",
                buf.len(),
                r.result_len
            )));
        }
        let deadline = opts.deadline.map(|d| d.into_std());
        let tally = read::ReadTally::default();
        // The objects this restore verifies go into the tier as it goes
        // (the fill that follows finds them there).
        let tap = self.tier().and_then(|t| t.open_tap((ns, context).into()));
        let tapped = tap.as_deref().map(|t| t as &dyn Tap);
        let out = if multi_thread {
            tokio::task::block_in_place(|| {
                self.rebuild(&r.what, Some(&mut *buf), deadline, &tally, tapped)
            })
        } else {
            // A current-thread runtime with a local store: the work needs no
            // runtime, so it runs here.
            self.rebuild(&r.what, Some(&mut *buf), deadline, &tally, tapped)
        };
        match out {
            Ok(_) => {
                self.count_reads(&r.what, &tally);
                self.ledger_touch(&ns, &context).await;
                self.after_origin_hit((ns, context).into(), r.want);
                self.record_restore(start, Some(r.schema), Ok((r.boundary, r.result_len)));
                Ok(RestoreIntoOutcome::Hit {
                    len: r.result_len,
                    digest: r.want,
                })
            }
            Err(failed) => {
                // No unverified byte stays in the caller's memory, whether
                // this ends as a miss or as an error.
                buf.fill(0);
                let reason = self.damage_outcome(failed).await?;
                miss(reason, Some(r.schema))
            }
        }
    }

    /// Whether this call runs on a multi-thread runtime, and whether a
    /// restore can rebuild straight into a caller's buffer here (a
    /// multi-thread runtime, or a local store, whose reads need no
    /// runtime).
    fn restore_in_place(&self) -> (bool, bool) {
        let multi_thread = tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::MultiThread;
        let direct = multi_thread || matches!(self.backend_kind(), BackendKind::Local { .. });
        (multi_thread, direct)
    }

    /// Resolves the root of `(ns, context)` within the call's deadline: its
    /// plan, or the miss (with the root's schema once it was read).
    async fn resolve_within(
        &self,
        ns: Namespace,
        context: ContextDigest,
        opts: RestoreOptions,
    ) -> Result<std::result::Result<plan::Resolved, (MissReason, Option<&'static str>)>> {
        let mut schema = None;
        let fut = self.resolve(ns, context, Vec::new(), &mut schema);
        let resolved = match opts.deadline {
            None => fut.await?,
            Some(d) => match tokio::time::timeout_at(d, fut).await {
                Ok(r) => r?,
                Err(_) => return Ok(Err((MissReason::DeadlineExceeded, schema))),
            },
        };
        Ok(resolved.map_err(|reason| (reason, schema)))
    }

    /// `restore_into` by restoring into a new buffer and copying.
    async fn restore_copy(
        &self,
        ns: Namespace,
        context: ContextDigest,
        buf: &mut [u8],
        opts: RestoreOptions,
    ) -> Result<RestoreIntoOutcome> {
        match self
            .restore_origin((ns, context).into(), opts, Instant::now())
            .await?
        {
            RestoreOutcome::Miss(reason) => Ok(RestoreIntoOutcome::Miss { reason }),
            RestoreOutcome::Hit(r) => {
                let enc = r.snapshot.encoded();
                if buf.len() != enc.len() {
                    return Err(StoreError::Invalid(format!(
                        "buffer is {} bytes, the snapshot is {}",
                        buf.len(),
                        enc.len()
                    )));
                }
                buf.copy_from_slice(enc);
                Ok(RestoreIntoOutcome::Hit {
                    len: enc.len() as u64,
                    digest: r.digest,
                })
            }
        }
    }

    /// Joins or starts the single-flight restore of `(ns, ctx)`. `visited`
    /// are the roots above it on a base chain (a v1 chain restored the old
    /// way), so a cycle is a miss rather than a task awaiting itself.
    fn restore_root(
        &self,
        ns: Namespace,
        ctx: ContextDigest,
        visited: Visited,
    ) -> futures::future::BoxFuture<'static, Inner> {
        let key = (ns, ctx);
        let mut map = match self.inner.inflight.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        if let Some(s) = map.get(&key) {
            Stats::add(&self.stats_ref().restores_shared, 1);
            return s.clone().boxed();
        }
        let this = self.clone();
        // The work is one task whatever the number of callers; its spans
        // belong to the first caller's.
        let span = tracing::debug_span!("restore_flight");
        let handle = tokio::spawn(tracing::Instrument::instrument(
            async move {
                let mut schema = None;
                let r = this
                    .restore_uncached(ns, ctx, visited, &mut schema)
                    .await
                    .map(|out| (out, schema))
                    .map_err(Arc::new);
                match this.inner.inflight.lock() {
                    Ok(mut m) => m.remove(&key),
                    Err(p) => p.into_inner().remove(&key),
                };
                r
            },
            span,
        ));
        let shared = async move {
            handle.await.unwrap_or_else(|e| {
                Err(Arc::new(StoreError::Internal(format!(
                    "restore task failed: {e}"
                ))))
            })
        }
        .boxed()
        .shared();
        map.insert(key, shared.clone());
        shared.boxed()
    }

    /// The single-flight restore of `(ns, ctx)` if one is running.
    fn inflight(&self, ns: Namespace, ctx: ContextDigest) -> Option<SharedRestore> {
        let map = match self.inner.inflight.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        map.get(&(ns, ctx)).cloned()
    }

    async fn restore_uncached(
        &self,
        ns: Namespace,
        ctx: ContextDigest,
        visited: Visited,
        schema: &mut Option<&'static str>,
    ) -> Result<RestoreOutcome> {
        let _pin = self.pin(ns, ctx);
        let r = match self.resolve(ns, ctx, visited, schema).await? {
            Ok(r) => r,
            Err(miss) => return Ok(RestoreOutcome::Miss(miss)),
        };
        let built: std::result::Result<Snapshot, MissReason> = match r.what {
            Plan::V1 { m, base } => {
                let payload = match self.fetch_v1(&m).await? {
                    Ok(p) => p,
                    Err(reason) => return Ok(RestoreOutcome::Miss(reason)),
                };
                let want = r.want;
                let base = base.map(|(s, _)| s);
                tokio::task::spawn_blocking(move || -> std::result::Result<Snapshot, String> {
                    match base {
                        None => Snapshot::from_encoded(payload).map_err(|e| e.to_string()),
                        Some(base) => {
                            // The delta header must name the same result as the
                            // root; `apply` then verifies the rebuilt bytes.
                            let (h, _) = deltapack_format::delta::decode_header(&payload)
                                .map_err(|e| e.to_string())?;
                            if h.result_digest != want {
                                return Err(format!(
                                    "delta names result {}, the root {want}",
                                    h.result_digest
                                ));
                            }
                            PageDelta::apply(&base, &payload).map_err(|e| e.to_string())
                        }
                    }
                })
                .await
                .map_err(|e| StoreError::task("reconstruction", e))?
                .map_err(|e| {
                    MissReason::damaged(format!(
                        "reconstruction of {ns}/{ctx} failed verification: {e}"
                    ))
                })
            }
            what => {
                let this = self.clone();
                // The tap [`Store::restore`] opened for this root, if any.
                let tap = self.tier().and_then(|t| t.tap_of((ns, ctx).into()));
                let out = tokio::task::spawn_blocking(move || {
                    let tally = read::ReadTally::default();
                    let tapped = tap.as_deref().map(|t| t as &dyn Tap);
                    let out = this.rebuild(&what, None, None, &tally, tapped);
                    (what, out, tally)
                })
                .await
                .map_err(|e| StoreError::task("restore", e))?;
                match out {
                    (what, Ok(reassembly::Output::Snapshot(s)), tally) => {
                        self.count_reads(&what, &tally);
                        Ok(s)
                    }
                    (_, Ok(reassembly::Output::Written), _) => {
                        return Err(StoreError::Internal(
                            "an owned restore reported a borrowed buffer".into(),
                        ))
                    }
                    (_, Err(d), _) => Err(self.damage_outcome(d).await?),
                }
            }
        };
        match built {
            Ok(snapshot) => {
                self.ledger_touch(&ns, &ctx).await;
                let snapshot = Arc::new(snapshot);
                // While the caller holds it, the next turn's restore starts
                // from here (its delta only).
                if let Ok(mut c) = self.inner.base_cache.lock() {
                    c.put_handed_out((ns, ctx, r.want), &snapshot);
                }
                Ok(RestoreOutcome::Hit(Restored {
                    snapshot,
                    digest: r.want,
                    schema: r.schema,
                }))
            }
            Err(reason) => Ok(RestoreOutcome::Miss(reason)),
        }
    }

    /// Where this store's v2 restores read extents from.
    fn reassembly_source(&self) -> read::Source {
        match self.backend_kind() {
            BackendKind::Local { root } => read::Source::Local(root.clone()),
            _ => read::Source::Remote(read::Remote {
                store: self.object_store().clone(),
                handle: tokio::runtime::Handle::current(),
                range_bytes: self.config().remote.range_bytes,
                permits: Arc::new(tokio::sync::Semaphore::new(
                    self.config().remote.ranges_in_flight.max(1),
                )),
            }),
        }
    }

    /// Queues the move of a damaged key to quarantine and returns at once
    /// (`quarantine_queue.rs`): the read path never waits for the ledger's
    /// judgement of ownership. The job tries to open a ledger that cannot
    /// be opened now again, with growing pauses, for up to
    /// [`crate::quarantine_queue::PATIENCE`], then judges and moves.
    pub(crate) fn queue_quarantine(&self, job: crate::quarantine_queue::Job) {
        use crate::quarantine_queue::{Job, PATIENCE};
        let (store, key) = (self.clone(), job.key().clone());
        self.inner.quarantines.submit(&key, async move {
            let patience = std::time::Instant::now() + PATIENCE;
            let mut pause = std::time::Duration::from_millis(250);
            while store.ledger().await.is_err() && std::time::Instant::now() < patience {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(5));
            }
            match job {
                Job::Object(k) => store.quarantine(&k).await,
                Job::Root { key, expected } => {
                    if let Err(e) = store.quarantine_root_if_unchanged(&key, &expected).await {
                        tracing::warn!(%key, error = %e, "damaged root not quarantined");
                    }
                }
            }
        });
    }

    /// Turns a reassembly failure into a miss (quarantining a damaged
    /// object) or an error (the backend failed).
    async fn damage_outcome(&self, d: reassembly::ObjectFault) -> Result<MissReason> {
        use reassembly::FaultKind;
        match d.kind {
            FaultKind::Deadline => Ok(MissReason::DeadlineExceeded),
            FaultKind::Io(e) => Err(*e),
            FaultKind::Missing => Ok(d.miss()),
            FaultKind::Corrupt => {
                if let Some(key) = &d.key {
                    self.queue_quarantine(crate::quarantine_queue::Job::Object(key.clone()));
                }
                Ok(d.miss())
            }
        }
    }

    /// Counts the objects and bytes a rebuild read: every extent of a flat
    /// root, whole; for a chain, what its passes actually read (`tally`),
    /// which is the extents still holding result bytes, and of those only
    /// the needed ranges when the pass was deferred — not every extent of
    /// every turn.
    fn count_reads(&self, what: &Plan, tally: &read::ReadTally) {
        let (objects, bytes) = match what {
            Plan::Flat(m) => (
                m.extents.len() as u64,
                m.extents.iter().map(|e| e.stored_len).sum(),
            ),
            Plan::Chain { .. } => tally.get(),
            Plan::V1 { .. } => (0, 0),
        };
        Stats::add(&self.stats_ref().objects_read, objects);
        Stats::add(&self.stats_ref().bytes_read, bytes);
    }
}

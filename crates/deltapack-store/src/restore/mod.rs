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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use deltapack_format::snapshot::digest_of_encoding;
use deltapack_format::{
    BaseRef, ContextDigest, DecodedRoot, Digest, ManifestV1, ManifestV2, Namespace, PageDelta,
    Snapshot,
};
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use object_store::ObjectStoreExt;

use crate::backend::BackendKind;
use crate::error::{MissReason, Result, StoreError};
use crate::keys::{self, RootKey};
use crate::stats::Stats;
use crate::store::{RootStatus, Store};

pub(crate) mod cache;
mod compose;
mod outcome;
pub(crate) mod reassembly;

use crate::fault::{FaultKind, ObjectFault};
use cache::{Flight, SharedRestore};
pub use outcome::{RestoreIntoOutcome, RestoreOptions, RestoreOutcome, Restored};

/// Most workers of a local-disk restore (one per core, up to this) and
/// legacy v1 chunks fetched at once. A remote flat restore reads as many
/// extents at once as their ranges fill
/// [`crate::StoreConfig::ranges_in_flight`].
pub const RESTORE_IN_FLIGHT: usize = 4;

type Inner = std::result::Result<Flight, Arc<StoreError>>;

/// Fields every restore span carries; namespace and context are set when
/// the key is known, the rest once the outcome is.
fn record_key(ns: &Namespace, ctx: &ContextDigest) {
    let span = tracing::Span::current();
    span.record("namespace", crate::metrics::short_hex(&ns.hex()));
    span.record("context", crate::metrics::short_hex(&ctx.hex()));
}

/// A readable root and everything its payload restore needs: the chain
/// below it resolved from roots alone.
struct Resolved {
    what: Plan,
    schema: &'static str,
    want: Digest,
    result_len: u64,
    boundary: u64,
}

/// How a resolved root is rebuilt.
enum Plan {
    /// A flat v2 root: its payload is the snapshot.
    Flat(ManifestV2),
    /// A v2 delta chain (oldest delta first) over its bottom: one composed
    /// pass (see `compose`).
    Chain {
        bottom: compose::Bottom,
        deltas: Vec<ManifestV2>,
    },
    /// A legacy v1 root, with its base (if any) restored the old way.
    V1 {
        m: ManifestV1,
        base: Option<(Arc<Snapshot>, Digest)>,
    },
}

/// Roots already on the base chain being resolved (a repeat is a cycle).
type Visited = Vec<(Namespace, ContextDigest)>;

/// A root's identity: its namespace and context.
type RootId = (Namespace, ContextDigest);

/// Roots of a chain being fetched on the ledger's word while the requested
/// root is still being read, so that a long chain costs one round trip for
/// its roots, not two (the requested root, then the ancestors it names).
///
/// Only a hint: each root is read, hashed and authenticated like any other,
/// and the walk follows the roots' own base links, so a stale or forged
/// ledger costs reads, never a wrong result. Dropping it aborts the reads.
struct EarlyChain {
    /// The roots the ledger named, once it answered.
    named: tokio::sync::oneshot::Receiver<Vec<RootId>>,
    /// Their reads (roots that could not be read are left out).
    task: tokio::task::JoinHandle<HashMap<RootId, RootStatus>>,
}

impl Drop for EarlyChain {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Store {
    /// Restores the root `key` names — `(&identity, context)` or
    /// `(namespace, context)` — verified end to end: a hit carries the
    /// snapshot, a miss its reason (absent, corrupt, incompatible,
    /// base-missing, deadline-exceeded, unauthenticated). Errors are
    /// failures of the backend or of the process, never of the data.
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
        let RootKey {
            namespace: ns,
            context,
        } = key.into();
        record_key(&ns, &context);
        let start = Instant::now();
        if opts
            .deadline
            .is_some_and(|d| d <= tokio::time::Instant::now())
        {
            let reason = MissReason::DeadlineExceeded;
            self.record_restore(start, None, Err(&reason));
            return Ok(RestoreOutcome::Miss(reason));
        }
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
            RestoreOutcome::Hit(r) => self.record_restore(
                start,
                Some(r.schema),
                Ok((r.snapshot.boundary(), r.snapshot.encoded().len() as u64)),
            ),
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
                if let Some(rate) = self.config().prefill_tokens_per_s.filter(|r| *r > 0.0) {
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
    /// memory is `buf` plus a 256 KiB piece per worker. The work runs on the
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
        if opts
            .deadline
            .is_some_and(|d| d <= tokio::time::Instant::now())
        {
            return miss(MissReason::DeadlineExceeded, None);
        }
        let multi_thread = tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::MultiThread;
        let direct = multi_thread || matches!(self.backend_kind(), BackendKind::Local { .. });
        if !direct {
            return self.restore_copy(ns, context, buf, opts).await;
        }
        let _pin = self.pin(ns, context);
        let mut schema = None;
        let fut = self.resolve(ns, context, Vec::new(), &mut schema);
        let resolved = match opts.deadline {
            None => fut.await?,
            Some(d) => match tokio::time::timeout_at(d, fut).await {
                Ok(r) => r?,
                Err(_) => return miss(MissReason::DeadlineExceeded, schema),
            },
        };
        let r = match resolved {
            Err(reason) => return miss(reason, schema),
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
        let tally = reassembly::ReadTally::default();
        let out = if multi_thread {
            tokio::task::block_in_place(|| self.rebuild(&r.what, Some(&mut *buf), deadline, &tally))
        } else {
            // A current-thread runtime with a local store: the work needs no
            // runtime, so it runs here.
            self.rebuild(&r.what, Some(&mut *buf), deadline, &tally)
        };
        match out {
            Ok(_) => {
                self.count_reads(&r.what, &tally);
                self.ledger_touch(&ns, &context).await;
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

    /// `restore_into` by restoring into a new buffer and copying.
    async fn restore_copy(
        &self,
        ns: Namespace,
        context: ContextDigest,
        buf: &mut [u8],
        opts: RestoreOptions,
    ) -> Result<RestoreIntoOutcome> {
        match self.restore((ns, context), opts).await? {
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

    /// Reads and checks the root of `(ns, ctx)` and resolves what its
    /// payload restore needs — for a v2 delta the whole chain below it, from
    /// roots alone — or the miss that ends it.
    /// `schema` is set as soon as the root is read (a miss below it still
    /// has one).
    #[tracing::instrument(level = "debug", name = "resolve", skip_all, fields(
        namespace = %crate::metrics::short_hex(&ns.hex()),
        context = %crate::metrics::short_hex(&ctx.hex()),
    ))]
    async fn resolve(
        &self,
        ns: Namespace,
        ctx: ContextDigest,
        mut visited: Visited,
        schema: &mut Option<&'static str>,
    ) -> Result<std::result::Result<Resolved, MissReason>> {
        // While the requested root is read, the roots the ledger records
        // below it are already being fetched (a hint; see `EarlyChain`).
        let early = self.early_chain(ns, ctx, &visited);
        let root = match self.read_root(&ns, &ctx).await? {
            RootStatus::Absent => return Ok(Err(MissReason::Absent)),
            RootStatus::Unusable(r) => return Ok(Err(r)),
            RootStatus::Found(d) => *d,
        };
        let summary = match root.summary() {
            Some(s) => {
                *schema = Some(s.schema);
                s
            }
            None => {
                return Ok(Err(MissReason::Incompatible {
                    detail: match &root {
                        DecodedRoot::Incompatible { reason } => reason.clone(),
                        _ => "unreadable root".into(),
                    },
                }))
            }
        };
        let limit = self.config().max_restore_bytes;
        if summary.payload_len > limit || summary.result_snapshot_len > limit {
            return Ok(Err(MissReason::Corrupt {
                what: format!(
                    "root {} declares {} payload / {} result bytes, above this store's restore limit {limit}",
                    keys::root_key(&ns, &ctx),
                    summary.payload_len,
                    summary.result_snapshot_len
                ),
            }));
        }
        visited.push((ns, ctx));
        let what = match root {
            DecodedRoot::V2(m) if m.base.is_none() => Plan::Flat(m),
            DecodedRoot::V2(m) => match self.walk_chain(m, visited, early).await? {
                Ok((bottom, deltas)) => Plan::Chain { bottom, deltas },
                Err(miss) => return Ok(Err(miss)),
            },
            DecodedRoot::V1(m) => {
                let base = match m.base {
                    None => None,
                    Some(b) => match self.base_snapshot(b, visited).await? {
                        Ok(s) => Some((s, b.snapshot_digest)),
                        Err(miss) => return Ok(Err(miss)),
                    },
                };
                Plan::V1 { m, base }
            }
            DecodedRoot::Incompatible { reason } => {
                return Ok(Err(MissReason::Incompatible { detail: reason }))
            }
        };
        Ok(Ok(Resolved {
            what,
            schema: summary.schema,
            want: summary.result_snapshot_digest,
            result_len: summary.result_snapshot_len,
            boundary: summary.boundary,
        }))
    }

    /// Follows the base links of the v2 delta `top` down to the chain's
    /// bottom: a flat v2 root, a verified snapshot in the base cache (or
    /// being restored right now by another caller), or a legacy root
    /// restored the old way. Every link is checked from the roots: the base
    /// root must exist, name the boundary and snapshot digest its child
    /// needs, and not repeat (a cycle), within `max_base_depth`.
    async fn walk_chain(
        &self,
        top: ManifestV2,
        mut visited: Visited,
        early: Option<EarlyChain>,
    ) -> Result<std::result::Result<(compose::Bottom, Vec<ManifestV2>), MissReason>> {
        let max_depth = self.config().max_base_depth;
        let started = Instant::now();
        let mut prefetched = self.prefetch_chain(&top, &visited, early).await?;
        tracing::debug!(
            roots = prefetched.len(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "read the chain's roots"
        );
        let mut deltas = vec![top];
        let corrupt = |what: String| Ok(Err(MissReason::Corrupt { what }));
        let gone = |b: &BaseRef, detail: String| {
            Ok(Err(MissReason::BaseMissing {
                detail: format!("base {}: {detail}", b.context),
            }))
        };
        let bottom = loop {
            let Some(b) = deltas.last().and_then(|m| m.base) else {
                return Err(StoreError::Internal("a chain link without a base".into()));
            };
            if visited.contains(&(b.namespace, b.context)) {
                return corrupt(format!(
                    "the base chain of {} loops back to {}",
                    visited[0].1, b.context
                ));
            }
            if deltas.len() >= max_depth {
                return corrupt(format!("base chain deeper than {max_depth}"));
            }
            if let Some(s) = self.cached_base(&b).await? {
                break compose::Bottom::Memory(s, b.snapshot_digest);
            }
            let status = match prefetched.remove(&(b.namespace, b.context)) {
                Some(s) => s,
                None => self.read_root(&b.namespace, &b.context).await?,
            };
            let m = match status {
                RootStatus::Absent => return gone(&b, "absent".into()),
                RootStatus::Unusable(r) => return gone(&b, r.to_string()),
                RootStatus::Found(d) => match *d {
                    DecodedRoot::V2(m) => m,
                    DecodedRoot::V1(_) => {
                        // A legacy base: restored the old way, then the
                        // bottom of the composed pass.
                        match self.base_snapshot(b, visited).await? {
                            Ok(s) => break compose::Bottom::Memory(s, b.snapshot_digest),
                            Err(miss) => return Ok(Err(miss)),
                        }
                    }
                    DecodedRoot::Incompatible { reason } => return gone(&b, reason),
                },
            };
            if m.result_snapshot_digest != b.snapshot_digest || m.boundary != b.boundary {
                return gone(
                    &b,
                    format!(
                        "the root holds {} at {} tokens, the delta needs {} at {}",
                        m.result_snapshot_digest, m.boundary, b.snapshot_digest, b.boundary
                    ),
                );
            }
            // Another caller is restoring this very base: share its work.
            // (Safe from waiting on ourselves: its chain lies strictly
            // below this link's boundary, checked just above.)
            if let Some(running) = self.inflight(b.namespace, b.context) {
                Stats::add(&self.stats_ref().restores_shared, 1);
                match running.await {
                    Ok((RestoreOutcome::Hit(r), _)) if r.digest == b.snapshot_digest => {
                        break compose::Bottom::Memory(r.snapshot, b.snapshot_digest)
                    }
                    Ok((RestoreOutcome::Hit(r), _)) => {
                        return gone(&b, format!("restores to {}", r.digest))
                    }
                    Ok((RestoreOutcome::Miss(miss), _)) => return gone(&b, miss.to_string()),
                    Err(e) => {
                        return Err(StoreError::Internal(format!(
                            "shared base restore failed: {e}"
                        )))
                    }
                }
            }
            visited.push((b.namespace, b.context));
            if m.base.is_none() {
                break compose::Bottom::Flat(Box::new(m));
            }
            deltas.push(m);
        };
        deltas.reverse();
        Ok(Ok((bottom, deltas)))
    }

    /// Starts fetching the roots the ledger records below `(ns, ctx)`, if
    /// this process has its ledger open (a restore never opens it) and the
    /// ledger's connection is free right now (a restore never waits for
    /// it). See [`EarlyChain`].
    fn early_chain(
        &self,
        ns: Namespace,
        ctx: ContextDigest,
        visited: &Visited,
    ) -> Option<EarlyChain> {
        let ledger = self.inner.ledger.get()?.clone();
        let limit = self.config().max_base_depth as u64;
        let (tx, named) = tokio::sync::oneshot::channel();
        let this = self.clone();
        let mut skip = visited.clone();
        skip.push((ns, ctx));
        let task = tokio::spawn(async move {
            let answer =
                tokio::task::spawn_blocking(move || ledger.try_bases_below(&ns, &ctx, limit)).await;
            let found = match answer {
                Ok(Ok(Some(found))) => found,
                // Busy: the walk goes by the root's own hints.
                Ok(Ok(None)) => return HashMap::new(),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "ledger chain lookup failed; going by the root's hints");
                    return HashMap::new();
                }
                Err(e) => {
                    tracing::debug!(error = %e, "ledger chain lookup task failed");
                    return HashMap::new();
                }
            };
            let found: Vec<RootId> = found.into_iter().filter(|r| !skip.contains(r)).collect();
            if tx.send(found.clone()).is_err() {
                return HashMap::new();
            }
            this.fetch_roots(found, true).await.unwrap_or_default()
        });
        Some(EarlyChain { named, task })
    }

    /// Reads, concurrently, the base and the roots a v2.1 root's chain
    /// hints name (nothing for roots written without hints): one round trip
    /// for the whole chain instead of one per turn. The roots `early`
    /// already fetches on the ledger's word are not read twice; it gives up
    /// (and the hints alone count) if the ledger had not answered by the
    /// time the requested root was read. The walk checks every root it
    /// uses.
    async fn prefetch_chain(
        &self,
        top: &ManifestV2,
        visited: &Visited,
        early: Option<EarlyChain>,
    ) -> Result<HashMap<(Namespace, ContextDigest), RootStatus>> {
        let hinted: Vec<RootId> = if top.chain.is_none() {
            Vec::new()
        } else {
            top.base
                .iter()
                .chain(top.chain_hints())
                .map(|b| (b.namespace, b.context))
                .filter(|r| !visited.contains(r))
                .take(self.config().max_base_depth)
                .collect()
        };
        let mut running = None;
        let mut covered = std::collections::HashSet::new();
        if let Some(mut e) = early {
            match e.named.try_recv() {
                Ok(named) => {
                    covered = named.into_iter().collect();
                    running = Some(e);
                }
                // Not answered yet (or failed): dropping `e` aborts it.
                Err(_) => tracing::debug!("the ledger had not named the chain's roots in time"),
            }
        }
        let missing: Vec<RootId> = hinted
            .into_iter()
            .filter(|r| !covered.contains(r))
            .collect();
        tracing::debug!(
            from_ledger = covered.len(),
            from_hints = missing.len(),
            "prefetching the chain's roots"
        );
        let Some(mut e) = running else {
            return self.fetch_roots(missing, false).await;
        };
        let (out, early) = tokio::join!(self.fetch_roots(missing, false), &mut e.task);
        let mut out = out?;
        match early {
            Ok(found) => {
                for (k, v) in found {
                    out.entry(k).or_insert(v);
                }
            }
            Err(e) => return Err(StoreError::task("chain root read", e)),
        }
        Ok(out)
    }

    /// Reads the roots `refs` names, `roots_in_flight` at once, each as its
    /// own task, so that decoding them (a long chain's roots add up to
    /// megabytes of CBOR) runs on every runtime thread, not only on the
    /// one polling the walk. The set aborts whatever is still running if
    /// the restore is dropped (a deadline, a caller gone). `lenient`: a
    /// root that cannot be read is left out (the walk reads it again if it
    /// needs it) instead of failing the whole set.
    async fn fetch_roots(
        &self,
        refs: Vec<RootId>,
        lenient: bool,
    ) -> Result<HashMap<(Namespace, ContextDigest), RootStatus>> {
        let mut out = HashMap::new();
        if refs.is_empty() {
            return Ok(out);
        }
        // Local disk: one blocking pass per core reads and checks the
        // roots straight from the directory; what it does not settle
        // (damage, read errors) takes the general path below.
        let mut refs = refs;
        if let BackendKind::Local { root } = self.backend_kind() {
            let lanes = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(refs.len());
            let mut set = tokio::task::JoinSet::new();
            for part in refs.chunks(refs.len().div_ceil(lanes)) {
                let (this, dir, part) = (self.clone(), root.clone(), part.to_vec());
                set.spawn_blocking(move || this.read_chain_roots_local(&dir, &part));
            }
            while let Some(settled) = set.join_next().await {
                let settled = settled.map_err(|e| StoreError::task("chain root read", e))?;
                out.extend(settled);
            }
            refs.retain(|id| !out.contains_key(id));
        }
        let width = self.config().roots_in_flight.max(1);
        let mut pending = refs.into_iter();
        let mut set = tokio::task::JoinSet::new();
        loop {
            while set.len() < width {
                let Some((ns, ctx)) = pending.next() else {
                    break;
                };
                let this = self.clone();
                set.spawn(async move {
                    // The requested root's hints name every root below it:
                    // their own lists of ancestors are not needed.
                    let s = this.read_chain_root(&ns, &ctx).await;
                    ((ns, ctx), s)
                });
            }
            match set.join_next().await {
                None => return Ok(out),
                Some(Ok((id, Ok(s)))) => {
                    out.insert(id, s);
                }
                Some(Ok((id, Err(e)))) if lenient => {
                    tracing::debug!(error = %e, root = %id.1, "prefetch of a root the ledger named failed");
                }
                Some(Ok((_, Err(e)))) => return Err(e),
                Some(Err(e)) => return Err(StoreError::task("chain root read", e)),
            }
        }
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
                .map_err(|e| MissReason::Corrupt {
                    what: format!("reconstruction of {ns}/{ctx} failed verification: {e}"),
                })
            }
            what => {
                let this = self.clone();
                let out = tokio::task::spawn_blocking(move || {
                    let tally = reassembly::ReadTally::default();
                    let out = this.rebuild(&what, None, None, &tally);
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

    /// Rebuilds a resolved v2 root (flat or chain) into `into` or a new
    /// buffer, on blocking threads. A pass that fails on an object's bytes
    /// or a read error runs once more: damage in transit, or an error that
    /// passed, is not damage at rest; a digest mismatch of the same object
    /// twice is (the caller quarantines it).
    fn rebuild(
        &self,
        what: &Plan,
        mut into: Option<&mut [u8]>,
        deadline: Option<std::time::Instant>,
        tally: &reassembly::ReadTally,
    ) -> std::result::Result<reassembly::Output, reassembly::ObjectFault> {
        let source = self.reassembly_source();
        let threads = match (&source, what) {
            // A remote flat root: enough extents at once that their ranges
            // fill the budget of ranges in flight.
            (reassembly::Source::Remote(r), Plan::Flat(m)) => {
                r.extent_workers(m.max_extent_bytes.min(m.payload_len.max(1)))
            }
            _ => source.threads(RESTORE_IN_FLIGHT),
        };
        let chain_threads = source.threads(self.config().chain_gets_in_flight.max(1));
        let pass = |into: Option<&mut [u8]>, deferred: bool| match what {
            Plan::Flat(m) => reassembly::restore_flat(&source, m, into, threads, deadline),
            Plan::Chain { bottom, deltas } => compose::restore_chain(
                &source,
                bottom,
                deltas,
                into,
                chain_threads,
                deadline,
                deferred,
                tally,
            ),
            Plan::V1 { .. } => Err(reassembly::ObjectFault::plain(
                "internal: a v1 root reached the v2 rebuild",
            )),
        };
        if matches!(what, Plan::Flat(_)) {
            // A flat restore applies the quarantine rule per extent itself.
            return pass(into, false);
        }
        // A composed pass that fails on an object (or a read) runs again;
        // the object is quarantined only if it fails its check twice. Only
        // the first pass may be deferred (extents read unchecked, the
        // result digest checking every placed byte): a later pass must check
        // every object it reads, or an unchecked read between two failed
        // checks of one object could hide a clean read, and the "two
        // consecutive failed reads" the quarantine rule needs would not be.
        let mut proof = reassembly::Proof::default();
        let mut deferred = true;
        loop {
            match pass(into.as_deref_mut(), deferred) {
                Ok(o) => return Ok(o),
                Err(d) => {
                    deferred = false;
                    tracing::warn!(what = %d.what, "composed restore failed");
                    if let Some(f) = proof.record(d) {
                        return Err(f);
                    }
                }
            }
        }
    }

    /// Where this store's v2 restores read extents from.
    fn reassembly_source(&self) -> reassembly::Source {
        match self.backend_kind() {
            BackendKind::Local { root } => reassembly::Source::Local(root.clone()),
            _ => reassembly::Source::Remote(reassembly::Remote {
                store: self.object_store().clone(),
                handle: tokio::runtime::Handle::current(),
                range_bytes: self.config().range_bytes,
                permits: Arc::new(tokio::sync::Semaphore::new(
                    self.config().ranges_in_flight.max(1),
                )),
            }),
        }
    }

    /// Turns a reassembly failure into a miss (quarantining a damaged
    /// object) or an error (the backend failed).
    async fn damage_outcome(&self, d: reassembly::ObjectFault) -> Result<MissReason> {
        use reassembly::FaultKind;
        let miss = |what: String| {
            if d.in_base {
                MissReason::BaseMissing { detail: what }
            } else {
                MissReason::Corrupt { what }
            }
        };
        match d.kind {
            FaultKind::Deadline => Ok(MissReason::DeadlineExceeded),
            FaultKind::Io(e) => Err(*e),
            FaultKind::Missing => Ok(miss(d.what)),
            FaultKind::Corrupt => {
                if let Some(key) = &d.key {
                    self.quarantine(key).await;
                }
                Ok(miss(d.what))
            }
        }
    }

    /// Counts the objects and bytes a rebuild read: every extent of a flat
    /// root, whole; for a chain, what its passes actually read (`tally`),
    /// which is the extents still holding result bytes, and of those only
    /// the needed ranges when the pass was deferred — not every extent of
    /// every turn.
    fn count_reads(&self, what: &Plan, tally: &reassembly::ReadTally) {
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

    /// A verified base from the cache, if its root still exists (an
    /// evicted or invalidated base must not keep serving deltas).
    async fn cached_base(&self, b: &BaseRef) -> Result<Option<Arc<Snapshot>>> {
        let key = (b.namespace, b.context, b.snapshot_digest);
        let cached = self
            .inner
            .base_cache
            .lock()
            .ok()
            .and_then(|mut c| c.get(&key));
        let Some(s) = cached else { return Ok(None) };
        let rk = keys::root_key(&b.namespace, &b.context);
        match self.object_store().head(&rk).await {
            Ok(_) => {
                Stats::add(&self.stats_ref().base_cache_hits, 1);
                Ok(Some(s))
            }
            Err(object_store::Error::NotFound { .. }) => {
                if let Ok(mut c) = self.inner.base_cache.lock() {
                    c.remove(&key);
                }
                Ok(None)
            }
            Err(e) => Err(StoreError::io(&rk, e)),
        }
    }

    /// Restores (or takes from cache) a whole base snapshot — the old way,
    /// for legacy v1 links — and checks its digest. The base root is read
    /// and checked against the reference *before* its restore is joined, so
    /// links only ever lead to strictly smaller boundaries and no restore
    /// can end up awaiting itself.
    async fn base_snapshot(
        &self,
        b: BaseRef,
        visited: Visited,
    ) -> Result<std::result::Result<Arc<Snapshot>, MissReason>> {
        let gone = |detail: String| {
            Ok(Err(MissReason::BaseMissing {
                detail: format!("base {}: {detail}", b.context),
            }))
        };
        if visited.contains(&(b.namespace, b.context)) {
            return Ok(Err(MissReason::Corrupt {
                what: format!("the base chain loops back to {}", b.context),
            }));
        }
        if visited.len() >= self.config().max_base_depth {
            return Ok(Err(MissReason::Corrupt {
                what: format!("base chain deeper than {}", self.config().max_base_depth),
            }));
        }
        if let Some(s) = self.cached_base(&b).await? {
            return Ok(Ok(s));
        }
        match self.peek_root(&b.namespace, &b.context).await? {
            RootStatus::Found(d) => match d.summary() {
                Some(s)
                    if s.result_snapshot_digest == b.snapshot_digest
                        && s.boundary == b.boundary => {}
                Some(s) => {
                    return gone(format!(
                        "the root holds {} at {} tokens, the delta needs {} at {}",
                        s.result_snapshot_digest, s.boundary, b.snapshot_digest, b.boundary
                    ))
                }
                None => return gone("incompatible".into()),
            },
            RootStatus::Absent => return gone("absent".into()),
            RootStatus::Unusable(r) => return gone(r.to_string()),
        }
        let (out, _) = self
            .restore_root(b.namespace, b.context, visited)
            .await
            .map_err(|e| match Arc::try_unwrap(e) {
                Ok(e) => e,
                Err(shared) => {
                    StoreError::Internal(format!("shared base restore failed: {shared}"))
                }
            })?;
        match out {
            RestoreOutcome::Hit(r) if r.digest == b.snapshot_digest => {
                // A base materialised the old way is kept for its next delta.
                if let Ok(mut c) = self.inner.base_cache.lock() {
                    c.put(
                        (b.namespace, b.context, b.snapshot_digest),
                        r.snapshot.clone(),
                        self.config().base_cache_bytes,
                    );
                }
                Ok(Ok(r.snapshot))
            }
            RestoreOutcome::Hit(r) => gone(format!("restores to {}", r.digest)),
            RestoreOutcome::Miss(m) => gone(m.to_string()),
        }
    }
    /// Fetches and verifies one object; quarantines it if damaged. `Err`
    /// is an error (the backend failed); `Ok(Err(fault))` a missing or
    /// corrupt object.
    async fn fetch_verified(
        &self,
        key: Path,
        stored_len: u64,
        verify: impl Fn(Bytes) -> std::result::Result<Bytes, String> + Send + Sync + Clone + 'static,
    ) -> Result<std::result::Result<Bytes, ObjectFault>> {
        // A bad read may be damage in transit (a proxy, a flaky link) rather
        // than at rest: the object is quarantined only if it fails its
        // check twice (the quarantine rule, `Proof`).
        let mut proof = reassembly::Proof::default();
        loop {
            let fault = match self.fetch_exact(&key, stored_len).await {
                Ok(bytes) => {
                    let v = verify.clone();
                    let checked = tokio::task::spawn_blocking(move || v(bytes))
                        .await
                        .map_err(|e| StoreError::task("verify", e))?;
                    match checked {
                        Ok(b) => return Ok(Ok(b)),
                        Err(what) => ObjectFault::of(&key, FaultKind::Corrupt, what),
                    }
                }
                Err(f) => f,
            };
            tracing::warn!(%key, what = %fault.what, "object failed a read or its check");
            let Some(f) = proof.record(fault) else {
                continue;
            };
            let f = f.into_error()?;
            if matches!(f.kind, FaultKind::Corrupt) && f.key.is_some() {
                self.quarantine(&key).await;
            }
            return Ok(Err(f));
        }
    }

    pub(crate) async fn fetch_v1(
        &self,
        m: &ManifestV1,
    ) -> Result<std::result::Result<Vec<u8>, MissReason>> {
        // Lazily committed zero pages: a forged root declaring a huge payload
        // costs nothing until verified chunk bytes are written, and an
        // impossible size is a corrupt miss, not an error.
        let mut payload = match usize::try_from(m.payload_len)
            .map_err(|_| format!("{} bytes do not fit in memory", m.payload_len))
            .and_then(reassembly::zeroed_buffer)
        {
            Ok(p) => p,
            Err(what) => {
                return Ok(Err(MissReason::Corrupt {
                    what: format!("v1 root declares an unusable payload: {what}"),
                }))
            }
        };
        let ranges = deltapack_format::root::v1_chunk_ranges(m.payload_len, m.chunks.len() as u64);
        let mut stream = futures::stream::iter(m.chunks.iter().copied().zip(ranges))
            .map(|(c, r)| {
                let key = keys::object_key(&c.digest);
                self.fetch_verified(key, c.bytes, move |b| {
                    let found = Digest::sha256(&b);
                    if found == c.digest {
                        Ok(b)
                    } else {
                        Err(format!("SHA-256 {found} != {}", c.digest))
                    }
                })
                .map(move |x| x.map(|x| (r, x)))
            })
            .buffered(RESTORE_IN_FLIGHT);
        while let Some(item) = stream.next().await {
            let (r, x) = item?;
            match x {
                Ok(b) => payload[r.start as usize..r.end as usize].copy_from_slice(&b),
                Err(fault) => {
                    return Ok(Err(MissReason::Corrupt { what: fault.what }));
                }
            }
        }
        let want = m.payload_digest;
        let (payload, found) = tokio::task::spawn_blocking(move || {
            let d = digest_of_encoding(&payload);
            (payload, d)
        })
        .await
        .map_err(|e| StoreError::task("hash", e))?;
        if found != want {
            return Ok(Err(MissReason::Corrupt {
                what: format!("v1 payload digest {found} != {want}"),
            }));
        }
        Ok(Ok(payload))
    }
}

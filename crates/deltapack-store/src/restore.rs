//! Restore: verify everything, hand over nothing unverified.
//!
//! The pipeline for one context (SPEC §4.3):
//!
//! 1. Read the root envelope; check its length bound, body hash, MAC (keyed
//!    stores) and schema. Unknown → `incompatible` miss; damaged → `corrupt`
//!    miss and quarantine.
//! 2. The root must name the requested namespace and context.
//! 3. For a delta, restore the base first (recursively, through the same
//!    single-flight table and a bounded cache of verified bases) and check
//!    its snapshot digest against the base reference.
//! 4. Fetch the payload's objects in order with at most
//!    [`RESTORE_IN_FLIGHT`] object payloads in flight. Each object's size is
//!    checked from metadata before its body is read, and its digest before its
//!    bytes are used: v2 extents by their BLAKE3 subtree chaining value (so
//!    the merged names authenticate the whole payload without a second
//!    pass), v1 chunks by SHA-256 (then one BLAKE3 pass over the payload).
//! 5. Reconstruct (base pages + tails) and verify the result snapshot digest.
//!
//! Concurrent restores of one root share one fetch+verify (*single flight*):
//! the first caller spawns the work as a task and later callers await the
//! same result. The work runs to completion even if a caller gives up at its
//! deadline, so a slow restore still warms the base cache for the next one.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use deltapack_format::snapshot::digest_of_encoding;
use deltapack_format::{
    BaseRef, CacheIdentity, ContextDigest, DecodedRoot, Digest, ManifestV1, ManifestV2, Namespace,
    PageDelta, Snapshot,
};
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use serde::Serialize;

use crate::backend::BackendKind;
use crate::error::{MissReason, Result, StoreError};
use crate::keys;
use crate::reassembly;
use crate::stats::Stats;
use crate::store::{RootStatus, Store};

/// Most object payloads a restore holds in flight.
pub const RESTORE_IN_FLIGHT: usize = 4;

/// A verified snapshot.
#[derive(Debug, Clone)]
pub struct Restored {
    /// The snapshot (verified against its root's result snapshot digest).
    pub snapshot: Arc<Snapshot>,
    /// Its digest.
    pub digest: Digest,
    /// Schema of the root it came from.
    pub schema: &'static str,
}

/// The result of a restore: a verified snapshot or a miss with a reason.
#[derive(Debug, Clone)]
pub enum RestoreOutcome {
    /// The verified snapshot.
    Hit(Restored),
    /// No usable state; the caller recomputes.
    Miss(MissReason),
}

impl RestoreOutcome {
    /// The snapshot on a hit.
    pub fn hit(&self) -> Option<&Restored> {
        match self {
            RestoreOutcome::Hit(r) => Some(r),
            RestoreOutcome::Miss(_) => None,
        }
    }

    /// The reason on a miss.
    pub fn miss(&self) -> Option<&MissReason> {
        match self {
            RestoreOutcome::Hit(_) => None,
            RestoreOutcome::Miss(m) => Some(m),
        }
    }
}

/// Options of one restore call.
#[derive(Debug, Clone, Copy, Default)]
pub struct RestoreOptions {
    /// Past this instant the call returns a `deadline-exceeded` miss.
    pub deadline: Option<tokio::time::Instant>,
}

/// The result of [`Store::restore_into`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum RestoreIntoOutcome {
    /// The buffer holds the verified snapshot encoding.
    Hit {
        /// Bytes written.
        len: u64,
        /// Snapshot digest.
        digest: String,
    },
    /// The buffer's contents are unspecified.
    Miss {
        /// Why.
        #[serde(flatten)]
        reason: MissReason,
    },
}

type Inner = std::result::Result<RestoreOutcome, Arc<StoreError>>;

/// A readable root with its base restored: ready for the payload.
struct Resolved {
    root: DecodedRoot,
    base: Option<(Arc<Snapshot>, Digest)>,
    want: Digest,
    result_len: u64,
    boundary: u64,
}

/// Why fetching an object did not produce verified bytes.
enum Damage {
    Missing(String),
    Corrupt(String),
}

impl Store {
    /// Restores the state of `context` under `identity`'s namespace.
    pub async fn restore(
        &self,
        identity: &CacheIdentity,
        context: ContextDigest,
    ) -> Result<RestoreOutcome> {
        self.restore_with(identity.namespace(), context, RestoreOptions::default())
            .await
    }

    /// Restores with options (deadline).
    pub async fn restore_with(
        &self,
        ns: Namespace,
        context: ContextDigest,
        opts: RestoreOptions,
    ) -> Result<RestoreOutcome> {
        let start = Instant::now();
        if opts
            .deadline
            .is_some_and(|d| d <= tokio::time::Instant::now())
        {
            Stats::add(&self.stats_ref().miss_deadline, 1);
            return Ok(RestoreOutcome::Miss(MissReason::DeadlineExceeded));
        }
        let fut = self.restore_root(ns, context, 0);
        let out = match opts.deadline {
            None => fut.await,
            Some(d) => match tokio::time::timeout_at(d, fut).await {
                Ok(r) => r,
                Err(_) => Ok(RestoreOutcome::Miss(MissReason::DeadlineExceeded)),
            },
        };
        let out = out.map_err(|e| match Arc::try_unwrap(e) {
            Ok(e) => e,
            Err(shared) => StoreError::Internal(format!("shared restore failed: {shared}")),
        })?;
        match &out {
            RestoreOutcome::Hit(r) => self.record_restore(start, Ok(r.snapshot.boundary())),
            RestoreOutcome::Miss(m) => self.record_restore(start, Err(m)),
        }
        Ok(out)
    }

    /// Counts one restore's outcome: latency, hit (with its boundary, for
    /// the comparison with prefill) or miss by reason.
    fn record_restore(&self, start: Instant, outcome: std::result::Result<u64, &MissReason>) {
        let st = self.stats_ref();
        st.record_latency(start.elapsed().as_micros() as u64);
        match outcome {
            Ok(boundary) => {
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
            Err(m) => Stats::add(
                match m {
                    MissReason::Absent => &st.miss_absent,
                    MissReason::Corrupt { .. } => &st.miss_corrupt,
                    MissReason::Incompatible { .. } => &st.miss_incompatible,
                    MissReason::BaseMissing { .. } => &st.miss_base_missing,
                    MissReason::DeadlineExceeded => &st.miss_deadline,
                    MissReason::Unauthenticated { .. } => &st.miss_unauthenticated,
                },
                1,
            ),
        }
    }

    /// Restores into a caller-provided buffer of exactly the snapshot's
    /// encoded length. The buffer is meaningful only on a hit.
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
    /// through [`Store::restore_with`] and copy into `buf`.
    pub async fn restore_into(
        &self,
        identity: &CacheIdentity,
        context: ContextDigest,
        buf: &mut [u8],
        opts: RestoreOptions,
    ) -> Result<RestoreIntoOutcome> {
        self.restore_into_with(identity.namespace(), context, buf, opts)
            .await
    }

    /// [`Store::restore_into`] by namespace (as [`Store::restore_with`]).
    pub async fn restore_into_with(
        &self,
        ns: Namespace,
        context: ContextDigest,
        buf: &mut [u8],
        opts: RestoreOptions,
    ) -> Result<RestoreIntoOutcome> {
        let start = Instant::now();
        let miss = |reason: MissReason| {
            self.record_restore(start, Err(&reason));
            Ok(RestoreIntoOutcome::Miss { reason })
        };
        if opts
            .deadline
            .is_some_and(|d| d <= tokio::time::Instant::now())
        {
            return miss(MissReason::DeadlineExceeded);
        }
        let multi_thread = tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::MultiThread;
        let direct = multi_thread || matches!(self.backend_kind(), BackendKind::Local { .. });
        let _pin = self.pin(ns, context);
        let resolved = if direct {
            let fut = self.resolve(ns, context, 0);
            match opts.deadline {
                None => fut.await?,
                Some(d) => match tokio::time::timeout_at(d, fut).await {
                    Ok(r) => r?,
                    Err(_) => return miss(MissReason::DeadlineExceeded),
                },
            }
        } else {
            Err(MissReason::Absent)
        };
        let (m, r) = match resolved {
            Ok(Resolved {
                root: DecodedRoot::V2(m),
                base,
                want,
                result_len,
                boundary,
            }) => (m, (base, want, result_len, boundary)),
            Err(reason) if direct => return miss(reason),
            // v1 (or no direct path): restore, then copy.
            _ => return self.restore_copy(ns, context, buf, opts).await,
        };
        let (base, want, result_len, boundary) = r;
        if buf.len() as u64 != result_len {
            return Err(StoreError::Invalid(format!(
                "buffer is {} bytes, the snapshot is {result_len}",
                buf.len()
            )));
        }
        let source = self.reassembly_source();
        let deadline = opts.deadline.map(|d| d.into_std());
        let work = || {
            let threads = source.threads(RESTORE_IN_FLIGHT);
            reassembly::restore_v2(&source, &m, base, Some(buf), threads, deadline)
        };
        let r = if multi_thread {
            tokio::task::block_in_place(work)
        } else {
            // A current-thread runtime with a local store: the work needs no
            // runtime, so it runs here.
            work()
        };
        match r {
            Ok(_) => {
                self.count_v2_read(&m);
                self.ledger_touch(&ns, &context).await;
                self.record_restore(start, Ok(boundary));
                Ok(RestoreIntoOutcome::Hit {
                    len: result_len,
                    digest: want.to_string(),
                })
            }
            Err(d) => {
                let reason = self.damage_outcome(d).await?;
                miss(reason)
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
        match self.restore_with(ns, context, opts).await? {
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
                    digest: r.digest.to_string(),
                })
            }
        }
    }

    /// Joins or starts the single-flight restore of `(ns, ctx)`.
    fn restore_root(
        &self,
        ns: Namespace,
        ctx: ContextDigest,
        depth: usize,
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
        let handle = tokio::spawn(async move {
            let r = this
                .restore_uncached(ns, ctx, depth)
                .await
                .map_err(Arc::new);
            match this.inner.inflight.lock() {
                Ok(mut m) => m.remove(&key),
                Err(p) => p.into_inner().remove(&key),
            };
            r
        });
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

    /// Reads and checks the root of `(ns, ctx)` and restores its base: all
    /// a payload restore needs, or the miss that ends it.
    async fn resolve(
        &self,
        ns: Namespace,
        ctx: ContextDigest,
        depth: usize,
    ) -> Result<std::result::Result<Resolved, MissReason>> {
        let root = match self.read_root(&ns, &ctx).await? {
            RootStatus::Absent => return Ok(Err(MissReason::Absent)),
            RootStatus::Unusable(r) => return Ok(Err(r)),
            RootStatus::Found(d) => *d,
        };
        if let DecodedRoot::Incompatible { reason } = &root {
            return Ok(Err(MissReason::Incompatible {
                detail: reason.clone(),
            }));
        }
        let summary = root
            .summary()
            .ok_or_else(|| StoreError::Internal("summary of a readable root".into()))?;
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
        let base = match summary.base {
            None => None,
            Some(b) => {
                if depth + 1 > self.config().max_base_depth {
                    return Ok(Err(MissReason::Corrupt {
                        what: format!(
                            "base chain deeper than {} (or a cycle)",
                            self.config().max_base_depth
                        ),
                    }));
                }
                match self.base_snapshot(b, depth + 1).await? {
                    Ok(s) => Some((s, b.snapshot_digest)),
                    Err(detail) => return Ok(Err(MissReason::BaseMissing { detail })),
                }
            }
        };
        Ok(Ok(Resolved {
            want: summary.result_snapshot_digest,
            result_len: summary.result_snapshot_len,
            boundary: summary.boundary,
            root,
            base,
        }))
    }

    async fn restore_uncached(
        &self,
        ns: Namespace,
        ctx: ContextDigest,
        depth: usize,
    ) -> Result<RestoreOutcome> {
        let _pin = self.pin(ns, ctx);
        let Resolved {
            root,
            base: base_pair,
            want,
            ..
        } = match self.resolve(ns, ctx, depth).await? {
            Ok(r) => r,
            Err(miss) => return Ok(RestoreOutcome::Miss(miss)),
        };
        let built: std::result::Result<Snapshot, MissReason> = match &root {
            DecodedRoot::V2(m) => match self.restore_v2(m, base_pair).await? {
                Ok(s) => Ok(s),
                Err(reason) => return Ok(RestoreOutcome::Miss(reason)),
            },
            DecodedRoot::V1(m) => {
                let payload = match self.fetch_v1(m).await? {
                    Ok(p) => p,
                    Err(reason) => return Ok(RestoreOutcome::Miss(reason)),
                };
                let base = base_pair.map(|(s, _)| s);
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
                .map_err(|e| StoreError::Internal(format!("reconstruction task: {e}")))?
                .map_err(|e| MissReason::Corrupt {
                    what: format!("reconstruction of {ns}/{ctx} failed verification: {e}"),
                })
            }
            DecodedRoot::Incompatible { reason } => {
                return Ok(RestoreOutcome::Miss(MissReason::Incompatible {
                    detail: reason.clone(),
                }))
            }
        };
        let schema = match &root {
            DecodedRoot::V1(_) => deltapack_format::SCHEMA_V1,
            _ => deltapack_format::SCHEMA_V2,
        };
        match built {
            Ok(snapshot) => {
                self.ledger_touch(&ns, &ctx).await;
                Ok(RestoreOutcome::Hit(Restored {
                    snapshot: Arc::new(snapshot),
                    digest: want,
                    schema,
                }))
            }
            Err(reason) => Ok(RestoreOutcome::Miss(reason)),
        }
    }

    /// Where this store's v2 restores read extents from.
    fn reassembly_source(&self) -> reassembly::Source {
        match self.backend_kind() {
            BackendKind::Local { root } => reassembly::Source::Local(root.clone()),
            _ => reassembly::Source::Remote {
                store: self.object_store().clone(),
                handle: tokio::runtime::Handle::current(),
            },
        }
    }

    /// Turns a reassembly failure into a miss (quarantining a damaged
    /// object) or an error (the backend failed).
    async fn damage_outcome(&self, d: reassembly::Damage) -> Result<MissReason> {
        use reassembly::DamageKind;
        match d.kind {
            DamageKind::Deadline => Ok(MissReason::DeadlineExceeded),
            DamageKind::Io(e) => Err(*e),
            DamageKind::Missing => Ok(MissReason::Corrupt { what: d.what }),
            DamageKind::Corrupt => {
                if let Some(key) = &d.key {
                    self.quarantine(key).await;
                }
                Ok(MissReason::Corrupt { what: d.what })
            }
        }
    }

    fn count_v2_read(&self, m: &ManifestV2) {
        Stats::add(&self.stats_ref().objects_read, m.extents.len() as u64);
        Stats::add(
            &self.stats_ref().bytes_read,
            m.extents.iter().map(|e| e.stored_len).sum(),
        );
    }

    /// v2: stream verified extents into a new result buffer.
    async fn restore_v2(
        &self,
        m: &ManifestV2,
        base: Option<(Arc<Snapshot>, Digest)>,
    ) -> Result<std::result::Result<Snapshot, MissReason>> {
        let source = self.reassembly_source();
        let m2 = m.clone();
        let r = tokio::task::spawn_blocking(move || {
            let threads = source.threads(RESTORE_IN_FLIGHT);
            reassembly::restore_v2(&source, &m2, base, None, threads, None)
        })
        .await
        .map_err(|e| StoreError::Internal(format!("restore task: {e}")))?;
        match r {
            Ok(reassembly::Output::Snapshot(s)) => {
                self.count_v2_read(m);
                Ok(Ok(s))
            }
            Ok(reassembly::Output::Written) => Err(StoreError::Internal(
                "an owned restore reported a borrowed buffer".into(),
            )),
            Err(d) => Ok(Err(self.damage_outcome(d).await?)),
        }
    }

    /// Restores (or takes from cache) a base and checks its digest.
    async fn base_snapshot(
        &self,
        b: BaseRef,
        depth: usize,
    ) -> Result<std::result::Result<Arc<Snapshot>, String>> {
        let key = (b.namespace, b.context, b.snapshot_digest);
        let cached = self
            .inner
            .base_cache
            .lock()
            .ok()
            .and_then(|mut c| c.get(&key));
        if let Some(s) = cached {
            // Verified bytes stay valid, but the base root must still exist:
            // an evicted or invalidated base must not keep serving deltas.
            let rk = keys::root_key(&b.namespace, &b.context);
            match self.object_store().head(&rk).await {
                Ok(_) => {
                    Stats::add(&self.stats_ref().base_cache_hits, 1);
                    return Ok(Ok(s));
                }
                Err(object_store::Error::NotFound { .. }) => {
                    if let Ok(mut c) = self.inner.base_cache.lock() {
                        c.remove(&key);
                    }
                }
                Err(e) => return Err(StoreError::io(&rk, e)),
            }
        }
        let out = self
            .restore_root(b.namespace, b.context, depth)
            .await
            .map_err(|e| match Arc::try_unwrap(e) {
                Ok(e) => e,
                Err(shared) => {
                    StoreError::Internal(format!("shared base restore failed: {shared}"))
                }
            })?;
        match out {
            RestoreOutcome::Hit(r) if r.digest == b.snapshot_digest => {
                if let Ok(mut c) = self.inner.base_cache.lock() {
                    c.put(key, r.snapshot.clone(), self.config().base_cache_bytes);
                }
                Ok(Ok(r.snapshot))
            }
            RestoreOutcome::Hit(r) => Ok(Err(format!(
                "base root {} restores to {}, the delta needs {}",
                b.context, r.digest, b.snapshot_digest
            ))),
            RestoreOutcome::Miss(m) => Ok(Err(format!("base {}: {m}", b.context))),
        }
    }

    /// Fetches and verifies one object; quarantines it if damaged.
    async fn fetch_verified(
        &self,
        key: Path,
        stored_len: u64,
        verify: impl Fn(Bytes) -> std::result::Result<Bytes, String> + Send + Sync + Clone + 'static,
    ) -> Result<std::result::Result<Bytes, Damage>> {
        // A bad read may be damage in transit (a proxy, a flaky link) rather
        // than at rest: read once more before quarantining a healthy object.
        let mut last = String::new();
        for attempt in 0..2 {
            let bytes = match self.fetch_exact(&key, stored_len).await? {
                Ok(b) => b,
                Err(what) if what.ends_with("is missing") => return Ok(Err(Damage::Missing(what))),
                Err(what) => {
                    last = what;
                    continue;
                }
            };
            let v = verify.clone();
            let checked = tokio::task::spawn_blocking(move || v(bytes))
                .await
                .map_err(|e| StoreError::Internal(format!("verify task: {e}")))?;
            match checked {
                Ok(b) => return Ok(Ok(b)),
                Err(what) => {
                    tracing::warn!(%key, %what, attempt, "object failed verification");
                    last = format!("{key}: {what}");
                }
            }
        }
        self.quarantine(&key).await;
        Ok(Err(Damage::Corrupt(last)))
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
            .and_then(crate::reassembly::zeroed_buffer)
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
                Err(Damage::Missing(what)) | Err(Damage::Corrupt(what)) => {
                    return Ok(Err(MissReason::Corrupt { what }));
                }
            }
        }
        let want = m.payload_digest;
        let (payload, found) = tokio::task::spawn_blocking(move || {
            let d = digest_of_encoding(&payload);
            (payload, d)
        })
        .await
        .map_err(|e| StoreError::Internal(format!("hash task: {e}")))?;
        if found != want {
            return Ok(Err(MissReason::Corrupt {
                what: format!("v1 payload digest {found} != {want}"),
            }));
        }
        Ok(Ok(payload))
    }
}

//! The [`Store`] handle: opening, root reads, object fetches,
//! quarantine, listing and lookup. Publication lives in `publish/`,
//! restore in `restore/`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use deltapack_format::root::{self, RootSummary};
use deltapack_format::{ContextDigest, DecodedRoot, Namespace};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::backend::{Backend, BackendKind};
use crate::config::StoreConfig;
use crate::error::{MissReason, Result, StoreError, Unsupported};
use crate::fault::{FaultKind, ObjectFault};
use crate::keys;
use crate::object_check::ObjectCheck;
use crate::restore::cache::{BaseCache, SharedRestore};
use crate::stats::Stats;

/// Largest root object accepted from storage (envelope header + body + MAC).
pub(crate) const MAX_ROOT_OBJECT: u64 = root::ENVELOPE_HEADER_LEN as u64 + root::MAX_ROOT_BODY + 32;

pub(crate) struct Inner {
    pub(crate) backend: Backend,
    pub(crate) config: StoreConfig,
    pub(crate) mac_key: Option<[u8; 32]>,
    pub(crate) stats: Stats,
    /// Labelled metrics, histograms and ledger gauges.
    pub(crate) metrics: crate::metrics::Metrics,
    pub(crate) inflight: Mutex<HashMap<(Namespace, ContextDigest), SharedRestore>>,
    pub(crate) base_cache: Mutex<BaseCache>,
    pub(crate) ledger: tokio::sync::OnceCell<crate::ledger::Ledger>,
    pub(crate) pins: Mutex<HashMap<(Namespace, ContextDigest), usize>>,
    /// Accesses not yet written to the ledger (latest ms per root).
    pub(crate) touches: Mutex<HashMap<(Namespace, ContextDigest), u64>>,
    /// Whether a task to write `touches` is already on its way.
    pub(crate) touch_flush_scheduled: std::sync::atomic::AtomicBool,
    /// The task writing `touches`, if one was started ([`Store::close`]
    /// waits for it).
    pub(crate) touch_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Whether this handle has warned that its ledger is down (reset when
    /// the ledger answers again).
    pub(crate) ledger_down_logged: std::sync::atomic::AtomicBool,
    /// Until when reads skip the ledger after it failed (see
    /// [`crate::LEDGER_RETRY`]).
    pub(crate) ledger_rest_until: Mutex<Option<std::time::Instant>>,
    /// Set once the ledger has been reconciled with the store by this
    /// handle (see [`Store::reconcile_ledger`]).
    pub(crate) reconciled: tokio::sync::OnceCell<()>,
    /// Whether that reconciliation reads every root (a ledger new to the
    /// store) or only the ones it does not know.
    pub(crate) reconcile_full: std::sync::atomic::AtomicBool,
    /// The root lock of object-store backends (see [`Store::root_lock`]).
    pub(crate) root_mutex: Arc<tokio::sync::Mutex<()>>,
    pub(crate) flushed: Mutex<crate::stats::StatsSnapshot>,
    /// The node-local tier in front of this store, if configured: its
    /// store and what this handle knows of it (`tier/`).
    pub(crate) tier_store: Option<Store>,
    pub(crate) tier: Option<Arc<crate::tier::TierState>>,
    /// Moves to quarantine the read path queued (`quarantine_queue.rs`).
    pub(crate) quarantines: Arc<crate::quarantine_queue::QuarantineQueue>,
}

/// Persists this handle's counters into the ledger when the last clone of
/// the handle goes away (so `deltapack stats` sees every process's work).
impl Drop for Inner {
    fn drop(&mut self) {
        let Some(ledger) = self.ledger.get() else {
            return;
        };
        let now = self.stats.snapshot();
        let last = match self.flushed.lock() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let deltas = crate::stats::counter_deltas(&now, &last);
        if let Err(e) = ledger.add_counters(&deltas) {
            tracing::warn!(error = %e, "could not persist counters");
        }
        // Accesses still queued (a process about to exit).
        let touches: Vec<_> = match self.touches.lock() {
            Ok(mut t) => t.drain().collect(),
            Err(p) => p.into_inner().drain().collect(),
        };
        if let Err(e) = ledger.touch_many(&touches) {
            tracing::warn!(error = %e, "could not persist root accesses");
        }
    }
}

/// The root lock as held (see [`Store::root_lock`]); released on drop.
#[derive(Debug)]
pub(crate) enum RootGuard {
    /// The store's cross-process lock file (local disk).
    #[allow(dead_code)] // held for its Drop
    File(crate::local::RootLock),
    /// This process's lock (object stores).
    #[allow(dead_code)] // held for its Drop
    Process(tokio::sync::OwnedMutexGuard<()>),
}

/// A handle on one deltapack store. Cheap to clone; clones share counters,
/// the single-flight table and the base cache.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.inner.backend.kind)
            .finish()
    }
}

/// What is stored under a root key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootStatus {
    /// No root.
    Absent,
    /// A readable v1 or v2 root.
    Found(Box<DecodedRoot>),
    /// A root that cannot be used, and why.
    Unusable(MissReason),
}

/// One line of `inspect`: a root and what it references.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct RootInfo {
    /// Namespace hex.
    pub namespace: String,
    /// Context hex.
    pub context: String,
    /// Schema, or the reason it is unusable.
    pub schema: String,
    /// `snapshot` or `delta`.
    pub kind: String,
    /// Result boundary (tokens).
    pub boundary: u64,
    /// Result snapshot digest.
    pub result_snapshot_digest: String,
    /// Result snapshot length.
    pub result_snapshot_len: u64,
    /// Payload length.
    pub payload_len: u64,
    /// Objects referenced.
    pub objects: usize,
    /// Stored bytes of the referenced objects.
    pub stored_bytes: u64,
    /// Base context hex (deltas).
    pub base_context: Option<String>,
    /// Size of the root object itself.
    pub root_bytes: u64,
    /// Where the root lives, on a store with a tier: `origin`, `tier`,
    /// `origin+tier` or `tier (upload pending)`; `None` without a tier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

impl Store {
    /// The backend's object store.
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.backend.store
    }

    /// The backend kind.
    pub fn backend_kind(&self) -> &BackendKind {
        &self.inner.backend.kind
    }

    /// The configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// The live counters.
    pub fn stats(&self) -> crate::stats::StatsSnapshot {
        self.inner.stats.snapshot()
    }

    pub(crate) fn stats_ref(&self) -> &Stats {
        &self.inner.stats
    }

    pub(crate) fn metrics(&self) -> &crate::metrics::Metrics {
        &self.inner.metrics
    }

    /// Registers this handle's metrics (shared by its clones) in
    /// `registry`, prefixed `deltapack_`; encode the registry with
    /// `prometheus_client::encoding::text::encode` to serve them:
    ///
    /// * `deltapack_restore_total{outcome, reason, schema}` — restores:
    ///   `outcome` `hit` or `miss`; `reason` `none`, `absent`, `corrupt`,
    ///   `incompatible`, `base_missing`, `deadline` or `unauthenticated`;
    ///   `schema` the root's schema, `unknown` if it was not read;
    /// * `deltapack_publish_total{outcome, schema}` — `created`,
    ///   `already_present`, `conflict` or `error`;
    /// * `deltapack_objects_read_total`, `deltapack_read_bytes_total`,
    ///   `deltapack_objects_written_total`, `deltapack_objects_reused_total`,
    ///   `deltapack_written_bytes_total`, `deltapack_roots_written_total`,
    ///   `deltapack_quarantined_total`, `deltapack_evictions_total`;
    /// * histograms `deltapack_restore_duration_seconds`,
    ///   `deltapack_publish_duration_seconds`, `deltapack_restore_size_bytes`,
    ///   `deltapack_publish_size_bytes`;
    /// * ledger gauges `deltapack_ledger_used_bytes`,
    ///   `deltapack_ledger_object_bytes`, `deltapack_ledger_roots`,
    ///   `deltapack_ledger_objects`, `deltapack_ledger_condemned_objects`,
    ///   `deltapack_ledger_condemned_bytes`,
    ///   `deltapack_ledger_namespace_bytes{namespace}`,
    ///   `deltapack_ledger_accumulated{counter}` (counters accumulated by
    ///   every process), and `deltapack_budget_bytes` (if a budget is set)
    ///   and `deltapack_free_bytes` (local disk).
    ///
    /// Counters and histograms are live. The ledger gauges are **as of
    /// their last update** — a publication's budget check, an eviction
    /// plan, or [`Store::stats_report`] (the ledger is not queried at
    /// scrape time); call `stats_report` before encoding for fresh ones.
    ///
    /// ```
    /// use deltapack_store::prometheus_client::{encoding::text::encode, registry::Registry};
    /// # use deltapack_store::{Store, StoreConfig};
    /// let store = Store::open("memory://", StoreConfig::default())?;
    /// let mut registry = Registry::default();
    /// store.register_metrics(&mut registry);
    /// let mut text = String::new();
    /// encode(&mut text, &registry)?;
    /// assert!(text.contains("# TYPE deltapack_restore_duration_seconds histogram"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.inner.metrics.register(
            &self.inner.stats,
            self.config().capacity.budget_bytes,
            matches!(self.backend_kind(), BackendKind::Local { .. }),
            registry,
        );
        if let Some(t) = &self.inner.tier {
            t.register_metrics(registry);
        }
    }

    /// Fetches an object whose stored size must be exactly `expected_len`
    /// (checked from metadata before the body is read). A fault says which:
    /// missing, the wrong size (corrupt), or the backend failed (I/O).
    pub(crate) async fn fetch_exact(
        &self,
        key: &Path,
        expected_len: u64,
    ) -> std::result::Result<Bytes, ObjectFault> {
        let got = self
            .object_store()
            .get(key)
            .await
            .map_err(|e| ObjectFault::backend(key, e))?;
        if got.meta.size != expected_len {
            return Err(ObjectFault::of(
                key,
                FaultKind::Corrupt,
                format!("is {} bytes, expected {expected_len}", got.meta.size),
            )
            .with_check(ObjectCheck::Size {
                expected: expected_len,
                found: got.meta.size,
            }));
        }
        let bytes = got
            .bytes()
            .await
            .map_err(|e| ObjectFault::backend(key, e))?;
        if bytes.len() as u64 != expected_len {
            return Err(ObjectFault::of(
                key,
                FaultKind::Corrupt,
                format!("returned {} bytes, expected {expected_len}", bytes.len()),
            )
            .with_check(ObjectCheck::Size {
                expected: expected_len,
                found: bytes.len() as u64,
            }));
        }
        Stats::add(&self.inner.stats.objects_read, 1);
        Stats::add(&self.inner.stats.bytes_read, bytes.len() as u64);
        Ok(bytes)
    }

    /// Reads and decodes the root at `(ns, ctx)`. Damaged roots are
    /// quarantined and reported as unusable.
    pub async fn read_root(&self, ns: &Namespace, ctx: &ContextDigest) -> Result<RootStatus> {
        self.read_root_with(ns, ctx, true).await
    }

    /// Reads and decodes a root without side effects: a damaged root is
    /// reported but left where it is (for `inspect` and dry runs).
    pub async fn peek_root(&self, ns: &Namespace, ctx: &ContextDigest) -> Result<RootStatus> {
        self.read_root_with(ns, ctx, false).await
    }

    async fn read_root_with(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        quarantine: bool,
    ) -> Result<RootStatus> {
        Ok(self.read_root_bytes(ns, ctx, quarantine).await?.0)
    }

    /// [`Store::read_root`] for a root below the requested one of a chain
    /// restore: the same reads, checks and quarantine, but a v2.1 root's
    /// list of ancestors is not decoded (it comes back empty; see
    /// `root::decode_without_ancestors`). The restore needs each root below
    /// the requested one for its own fields alone.
    pub(crate) async fn read_chain_root(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
    ) -> Result<RootStatus> {
        Ok(self.read_root_decoded(ns, ctx, true, false).await?.0)
    }

    /// [`Store::read_root`] (or, without `quarantine`, [`Store::peek_root`])
    /// that also returns the bytes the status was decoded from, so a caller
    /// acting on the root later can check it still holds them.
    pub(crate) async fn read_root_bytes(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        quarantine: bool,
    ) -> Result<(RootStatus, Option<Bytes>)> {
        self.read_root_decoded(ns, ctx, quarantine, true).await
    }

    /// [`Store::read_root_bytes`]; `ancestors`: whether a v2.1 root's list
    /// of ancestors is decoded (else it is skipped and left empty).
    async fn read_root_decoded(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        quarantine: bool,
        ancestors: bool,
    ) -> Result<(RootStatus, Option<Bytes>)> {
        let (status, damaged, bytes) = self.read_root_once(ns, ctx, ancestors).await?;
        if !(damaged && quarantine) {
            return Ok((status, bytes));
        }
        // Quarantine needs proof: a bad read may be damage in transit, so
        // the root is read once more and moved aside only if it is damaged
        // again — and still holds the damaged bytes when it is moved.
        let (again, damaged, bytes) = self.read_root_once(ns, ctx, ancestors).await?;
        if let (true, Some(b)) = (damaged, &bytes) {
            self.queue_quarantine(crate::quarantine_queue::Job::Root {
                key: keys::root_key(ns, ctx),
                expected: b.clone(),
            });
        }
        Ok((again, bytes))
    }

    /// One read and decode of a root; `true` with an unusable status when
    /// the bytes read are damaged (not when they are unknown or forged).
    async fn read_root_once(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        ancestors: bool,
    ) -> Result<(RootStatus, bool, Option<Bytes>)> {
        let key = keys::root_key(ns, ctx);
        let store = self.object_store();
        let got = match store.get(&key).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => {
                return Ok((RootStatus::Absent, false, None))
            }
            Err(e) => return Err(StoreError::io(&key, e)),
        };
        if got.meta.size > MAX_ROOT_OBJECT {
            let what = format!(
                "root {key} is {} bytes, limit {MAX_ROOT_OBJECT}",
                got.meta.size
            );
            return Ok((RootStatus::Unusable(MissReason::damaged(what)), true, None));
        }
        let bytes = got.bytes().await.map_err(|e| StoreError::io(&key, e))?;
        let (status, damaged) = self.judge_root(&key, ns, ctx, &bytes, ancestors)?;
        Ok((status, damaged, Some(bytes)))
    }

    /// Decodes and checks the bytes read for the root `(ns, ctx)` (under
    /// `key`); `true` with an unusable status when they are damaged (not
    /// when they are unknown or forged). `ancestors`: see
    /// [`Store::read_root_bytes`].
    fn judge_root(
        &self,
        key: &Path,
        ns: &Namespace,
        ctx: &ContextDigest,
        bytes: &[u8],
        ancestors: bool,
    ) -> Result<(RootStatus, bool)> {
        let decoded = if ancestors {
            root::decode(bytes, self.inner.mac_key.as_ref())
        } else {
            root::decode_without_ancestors(bytes, self.inner.mac_key.as_ref())
        };
        Ok(match decoded {
            Ok(DecodedRoot::Incompatible { reason }) => (
                RootStatus::Unusable(MissReason::Incompatible { detail: reason }),
                false,
            ),
            Ok(decoded) => {
                let s = decoded
                    .summary()
                    .ok_or_else(|| StoreError::Internal("summary of a readable root".into()))?;
                if s.namespace != *ns || s.context != *ctx {
                    let what = format!(
                        "root {key} names {}/{} (stored under another key)",
                        s.namespace.hex(),
                        s.context.hex()
                    );
                    tracing::warn!(%what, "refusing misplaced root");
                    (RootStatus::Unusable(MissReason::damaged(what)), true)
                } else {
                    (RootStatus::Found(Box::new(decoded)), false)
                }
            }
            Err(deltapack_format::Error::Unauthenticated(detail)) => (
                RootStatus::Unusable(MissReason::Unauthenticated { detail }),
                false,
            ),
            Err(e) => {
                let what = format!("root {key}: {e}");
                tracing::warn!(%what, "corrupt root");
                (RootStatus::Unusable(MissReason::damaged(what)), true)
            }
        })
    }

    /// Local disk: reads and checks the roots `ids` below a chain's
    /// requested one (without their ancestor lists, as
    /// [`Store::read_chain_root`]) in one blocking pass, `std::fs` straight
    /// from the store's directory — not two blocking-pool hand-offs per
    /// root through `object_store`, which for a 256-turn chain cost more
    /// than the reading and decoding itself. Returns what it settled: a
    /// sound root, or an absent one. A root that reads damaged or fails to
    /// read is left out, for [`Store::read_chain_root`] to read again (a
    /// damaged root is quarantined only on proof, as everywhere).
    pub(crate) fn read_chain_roots_local(
        &self,
        dir: &std::path::Path,
        ids: &[(Namespace, ContextDigest)],
    ) -> Vec<((Namespace, ContextDigest), RootStatus)> {
        let mut out = Vec::with_capacity(ids.len());
        for (ns, ctx) in ids {
            let key = keys::root_key(ns, ctx);
            let bytes = match crate::local::read_small(dir, &key, MAX_ROOT_OBJECT) {
                Ok(Some(b)) => b,
                Ok(None) => {
                    out.push(((*ns, *ctx), RootStatus::Absent));
                    continue;
                }
                Err(_) => continue,
            };
            match self.judge_root(&key, ns, ctx, &bytes, false) {
                Ok((status, false)) => out.push(((*ns, *ctx), status)),
                _ => continue,
            }
        }
        out
    }

    /// Takes the store's root lock, held across the check and the act of
    /// every root change — and, for root creation and root removal, across
    /// the ledger update too, so a removal's "delete the root, forget it in
    /// the ledger" never interleaves with a republication's "create the
    /// root, record it". On local disk it is the cross-process
    /// [`crate::local::RootLock`]; elsewhere a lock of this handle's
    /// process (the ledger of an object store is this process's own), with
    /// conditional writes and re-reads narrowing the windows between
    /// processes. Not re-entrant: a holder calls the `_locked` variants.
    pub(crate) async fn root_lock(&self) -> Result<Option<RootGuard>> {
        let BackendKind::Local { root } = self.backend_kind() else {
            let g = Arc::clone(&self.inner.root_mutex).lock_owned().await;
            return Ok(Some(RootGuard::Process(g)));
        };
        let root = root.clone();
        let lock = tokio::task::spawn_blocking(move || crate::local::RootLock::acquire(&root))
            .await
            .map_err(|e| StoreError::task("root lock", e))?
            .map_err(|e| StoreError::local_io(&Path::from("ledger/roots.lock"), e))?;
        Ok(Some(RootGuard::File(lock)))
    }

    /// Deletes a root object; the caller holds the root lock
    /// ([`Store::root_lock`]). On local disk the deletion is made durable, so it cannot interleave with a
    /// conditional replacement ([`Store::replace_root_if_unchanged`]) in
    /// any process. An absent root is not an error.
    pub(crate) async fn delete_root_object_locked(&self, key: &Path) -> Result<()> {
        if let BackendKind::Local { root } = self.backend_kind() {
            return crate::local::delete_durably(root, key)
                .map_err(|e| StoreError::local_io(key, e));
        }
        match self.object_store().delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(StoreError::io(key, e)),
        }
    }

    /// Replaces the root object at `key` with `new` only if it still holds
    /// exactly `expected` (the bytes the caller read and verified). Returns
    /// whether it did; `Changed` if the root was removed or rewritten in
    /// between (nothing is written then: a removed root is never brought
    /// back).
    ///
    /// Local disk: compare and rename under the store's root lock, which every
    /// root deletion takes too. S3 and memory: a conditional PUT on the
    /// object's ETag (`If-Match`); a backend that cannot do one gets
    /// [`StoreError::Unsupported`] and the root stays as it was.
    pub(crate) async fn replace_root_if_unchanged(
        &self,
        key: &Path,
        expected: &[u8],
        new: Bytes,
    ) -> Result<crate::local::Replaced> {
        use crate::local::Replaced;
        if let BackendKind::Local { root } = self.backend_kind() {
            let _lock = self.root_lock().await?;
            return crate::local::replace_if_unchanged(root, key, expected, &new)
                .map_err(|e| StoreError::local_io(key, e));
        }
        let store = self.object_store();
        let current = match store.get(key).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(Replaced::Changed),
            Err(e) => return Err(StoreError::io(key, e)),
        };
        let version = object_store::UpdateVersion {
            e_tag: current.meta.e_tag.clone(),
            version: current.meta.version.clone(),
        };
        let bytes = current.bytes().await.map_err(|e| StoreError::io(key, e))?;
        if bytes.as_ref() != expected {
            return Ok(Replaced::Changed);
        }
        if version.e_tag.is_none() && version.version.is_none() {
            return Err(StoreError::Unsupported(Unsupported::NoVersion {
                key: key.to_string(),
            }));
        }
        let opts = object_store::PutOptions {
            mode: object_store::PutMode::Update(version),
            ..Default::default()
        };
        match store.put_opts(key, new.into(), opts).await {
            Ok(_) => Ok(Replaced::Yes),
            Err(object_store::Error::Precondition { .. })
            | Err(object_store::Error::NotFound { .. }) => Ok(Replaced::Changed),
            Err(e @ object_store::Error::NotImplemented { .. }) => Err(StoreError::Unsupported(
                Unsupported::NoConditionalOverwrite {
                    key: key.to_string(),
                    source: e,
                },
            )),
            Err(e) => Err(StoreError::io(key, e)),
        }
    }

    /// Moves the root at `key` to `quarantine/…` only if it still holds
    /// exactly `expected` — the bytes its judge (a restore, the sweep) read.
    /// A root removed or republished since then is left alone: quarantine
    /// is for the damaged bytes, never for whatever replaced them. Returns
    /// whether it moved the root.
    ///
    /// Local disk: compare, copy and delete under the store's root lock, which
    /// every root deletion and replacement takes. Other backends: compare
    /// on a fresh read, then copy and delete (object stores have no
    /// conditional delete; the window is one round trip).
    pub(crate) async fn quarantine_root_if_unchanged(
        &self,
        key: &Path,
        expected: &[u8],
    ) -> Result<bool> {
        let _lock = self.root_lock().await?;
        self.quarantine_root_locked(key, expected).await
    }

    /// [`Store::quarantine_root_if_unchanged`] for a caller that already
    /// holds the root lock ([`Store::root_lock`]).
    pub(crate) async fn quarantine_root_locked(&self, key: &Path, expected: &[u8]) -> Result<bool> {
        if !self.may_quarantine().await {
            tracing::warn!(%key, "damaged root not quarantined: this handle's ledger is not the store's");
            return Ok(false);
        }
        let dest = keys::quarantine_key(key);
        let moved = if let BackendKind::Local { root } = self.backend_kind() {
            crate::local::quarantine_if_unchanged(root, key, &dest, expected)
                .map_err(|e| StoreError::local_io(key, e))?
        } else {
            let current = match self.object_store().get(key).await {
                Ok(g) => g.bytes().await.map_err(|e| StoreError::io(key, e))?,
                Err(object_store::Error::NotFound { .. }) => return Ok(false),
                Err(e) => return Err(StoreError::io(key, e)),
            };
            if current.as_ref() != expected {
                false
            } else {
                self.quarantine(key).await;
                return Ok(true);
            }
        };
        if moved {
            Stats::add(&self.inner.stats.quarantined, 1);
            tracing::warn!(%key, quarantine = %dest, "quarantined");
        } else {
            tracing::info!(%key, "root changed since it was judged; not quarantined");
        }
        Ok(moved)
    }

    /// Waits until the moves to quarantine that reads queued are done (a
    /// restore refuses a damaged object at once and moves it aside in the
    /// background, when the ledger confirms this handle may). `close`
    /// waits for them too.
    pub async fn settle_quarantines(&self) {
        self.inner.quarantines.settled().await
    }

    /// Moves a damaged key to `quarantine/…` (copy, then delete) and counts
    /// it. Failures are logged, never fatal: the restore is a miss anyway.
    pub(crate) async fn quarantine(&self, key: &Path) {
        // A move out of the live key is a deletion: only a handle whose
        // ledger owns the store (or of a store nobody has bound) makes it.
        if !self.may_quarantine().await {
            tracing::warn!(%key, "damaged object not quarantined: this handle's ledger is not the store's");
            return;
        }
        let store = self.object_store();
        let dest = keys::quarantine_key(key);
        let copied = store.copy(key, &dest).await;
        if let Err(e) = &copied {
            if !matches!(e, object_store::Error::NotFound { .. }) {
                tracing::warn!(%key, error = %e, "quarantine copy failed");
            }
        }
        match store.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => tracing::warn!(%key, error = %e, "quarantine delete failed"),
        }
        if copied.is_ok() {
            Stats::add(&self.inner.stats.quarantined, 1);
            tracing::warn!(%key, quarantine = %dest, "quarantined");
        }
    }

    /// Quarantines the object `key` only by way of a copy: copied to
    /// quarantine first, then removed; `false` (and the object left where
    /// it is) if it could not be copied. For a caller that replaces the
    /// object next and must not delete what it could not keep.
    pub(crate) async fn quarantine_kept(&self, key: &Path) -> bool {
        if !self.may_quarantine().await {
            tracing::warn!(%key, "damaged object not quarantined: this handle's ledger is not the store's");
            return false;
        }
        let store = self.object_store();
        let dest = keys::quarantine_key(key);
        if let Err(e) = store.copy(key, &dest).await {
            tracing::warn!(%key, error = %e, "quarantine copy failed: the object stays");
            return false;
        }
        match store.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(%key, error = %e, "quarantine delete failed");
                return false;
            }
        }
        Stats::add(&self.inner.stats.quarantined, 1);
        tracing::warn!(%key, quarantine = %dest, "quarantined");
        true
    }

    /// Every object under `prefix`, listed in full.
    pub(crate) async fn list_all(&self, prefix: &Path) -> Result<Vec<object_store::ObjectMeta>> {
        self.object_store()
            .list(Some(prefix))
            .try_collect()
            .await
            .map_err(|e| StoreError::io(prefix, e))
    }

    /// Every root key in the store (optionally one namespace), sorted.
    pub async fn list_roots(
        &self,
        ns: Option<&Namespace>,
    ) -> Result<Vec<(Namespace, ContextDigest)>> {
        let prefix = match ns {
            Some(n) => keys::namespace_prefix(n),
            None => Path::from(keys::ROOTS),
        };
        let mut out: Vec<_> = self
            .list_all(&prefix)
            .await?
            .iter()
            .filter_map(|m| keys::parse_root_key(&m.location))
            .collect();
        out.sort();
        Ok(out)
    }

    /// [`Store::inspect`] of this store alone (not its tier).
    pub(crate) async fn inspect_here(&self, ns: Option<&Namespace>) -> Result<Vec<RootInfo>> {
        let roots = self.list_roots(ns).await?;
        let mut out = Vec::with_capacity(roots.len());
        for (n, c) in roots {
            let key = keys::root_key(&n, &c);
            let root_bytes = self
                .object_store()
                .head(&key)
                .await
                .map(|m| m.size)
                .unwrap_or(0);
            let info = match self.peek_root(&n, &c).await? {
                RootStatus::Found(d) => {
                    let s: RootSummary = d
                        .summary()
                        .ok_or_else(|| StoreError::Internal("summary of a readable root".into()))?;
                    RootInfo {
                        namespace: n.hex(),
                        context: c.hex(),
                        schema: s.schema.to_string(),
                        kind: format!("{:?}", s.kind).to_lowercase(),
                        boundary: s.boundary,
                        result_snapshot_digest: s.result_snapshot_digest.to_string(),
                        result_snapshot_len: s.result_snapshot_len,
                        payload_len: s.payload_len,
                        objects: s.objects.len(),
                        stored_bytes: s.objects.iter().map(|o| o.1).sum(),
                        base_context: s.base.map(|b| b.context.hex()),
                        root_bytes,
                        location: None,
                    }
                }
                RootStatus::Absent => continue,
                RootStatus::Unusable(r) => RootInfo {
                    namespace: n.hex(),
                    context: c.hex(),
                    schema: format!("unusable ({r})"),
                    kind: String::new(),
                    boundary: 0,
                    result_snapshot_digest: String::new(),
                    result_snapshot_len: 0,
                    payload_len: 0,
                    objects: 0,
                    stored_bytes: 0,
                    base_context: None,
                    root_bytes,
                    location: None,
                },
            };
            out.push(info);
        }
        Ok(out)
    }
}

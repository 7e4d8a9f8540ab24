//! A node-local tier in front of the origin store.
//!
//! Owns the read path from the nearest copy, the background fill of the
//! tier from verified origin reads, write-through publication and the
//! coherence rule. Must never let the tier change the origin: nothing here
//! writes, quarantines or deletes in the origin.
//!
//! **Shape.** The tier is an ordinary local [`Store`] (`file://`, fsync'd)
//! with its own ledger (the SQLite file inside the tier directory, shared
//! by every process of the node) and its own budget; publications into it
//! evict its least recently used roots as any store's do. The handle the
//! caller holds is the origin's; [`Store::restore`], [`Store::restore_into`]
//! and [`Store::publish_with`] consult the tier when one is configured
//! ([`crate::StoreConfig::tier`]).
//!
//! **Read path.** A restore asks the tier first, verified exactly as any
//! restore is (root, objects, assembled payload, snapshot digest). A miss
//! there — absent, a damaged object (quarantined in the tier by the usual
//! two-failed-reads rule), any tier error — falls through to the origin and
//! is counted. A hit is served only if the coherence rule allows it.
//!
//! **Coherence.** Roots and extents are immutable and content-addressed, so
//! a tier copy never holds wrong bytes; what can go stale is *whether* a
//! root should be served at all, after the origin invalidated, evicted or
//! quarantined it. Rule: a tier hit for a root is served only if the origin
//! was seen holding that root within the last
//! [`TierConfig::check_interval`]; otherwise the origin root is looked up
//! (one HEAD, concurrently with the tier's restore, bounded by
//! [`TierConfig::check_timeout`]). An origin without the root refuses the
//! hit: the tier's copy is removed and the restore goes to the origin. An
//! origin that does not answer in time cannot refuse: the verified tier
//! copy is served and counted as unchecked (availability over freshness,
//! for at most the outage).
//!
//! **Fill.** After a hit from the origin, the root (with every chain link
//! the tier lacks, bottom first) is copied in the background: each object
//! is read from the origin, checked against its root's record, written to
//! the tier (create-if-absent, durable), and the root last — so the tier,
//! like any store, never shows a root before its objects. The restore never
//! waits for it. Fills are bounded: [`TierConfig::fill_roots_in_flight`]
//! roots at once (a fill beyond that is skipped and counted, never queued
//! without bound), and [`TierConfig::fill_objects_in_flight`] objects in
//! memory at once across all fills. A fill the tier's budget cannot take
//! fails quietly (counted): the origin still has the root.
//!
//! **Publication.** Write-through ([`TierAck::Origin`], the default): the
//! same publication goes to the tier and to the origin concurrently, and
//! the caller's receipt is the origin's: a root is acknowledged when it is
//! durable in the origin. A tier failure is counted and logged, never
//! returned. Behind ([`TierAck::Tier`]): acknowledged when durable in the
//! tier and journaled there; uploaded in the background (`upload.rs`).

mod copy;
mod fill;
mod read;
mod upload;
mod write;

pub use upload::{UploadReport, UPLOAD_HOLD};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deltapack_format::{ContextDigest, Namespace};
use object_store::ObjectStoreExt;
use prometheus_client::metrics::counter::Counter;
use serde::Serialize;

use crate::backend::BackendKind;
use crate::error::{Result, StoreError};
use crate::keys::RootKey;
use crate::store::Store;

/// A node-local tier in front of the store: where it is and what it may
/// hold. Part of [`crate::StoreConfig`] (`tier`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TierConfig {
    /// The tier's directory: `file:///nvme/deltapack` or a plain path.
    /// Only local disk: a tier is the node's own copy.
    pub url: String,
    /// The tier's hard budget in bytes (its least recently used roots are
    /// evicted to stay within it); `None` = unbounded.
    pub budget_bytes: Option<u64>,
    /// How long the origin's answer that it holds a root is trusted before
    /// a tier hit for it is checked again (5 s by default).
    pub check_interval: Duration,
    /// How long that check may take; an origin that has not answered by
    /// then cannot refuse the hit (1 s by default).
    pub check_timeout: Duration,
    /// Roots filled at once; a fill beyond that is skipped (2 by default).
    pub fill_roots_in_flight: usize,
    /// Objects held in memory at once across all fills and uploads (4 by
    /// default; each at most one extent, so 4 × 64 MiB at the production
    /// extent size).
    pub fill_objects_in_flight: usize,
    /// When a publication is acknowledged: durable in the origin (the
    /// default) or in the tier, uploaded behind.
    pub ack: TierAck,
    /// Roots uploaded to the origin at once (2 by default).
    pub uploads_in_flight: usize,
    /// Pending uploads beyond which a publication is written through
    /// instead of queued (256 by default).
    pub max_upload_backlog: usize,
}

/// When a publication through a tiered store is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TierAck {
    /// When it is durable in the origin (write-through; the default).
    #[default]
    Origin,
    /// When it is durable in the tier; the upload to the origin is
    /// journaled in the tier and runs behind.
    Tier,
}

impl TierConfig {
    /// A tier at `url` with the default bounds and no budget.
    pub fn new(url: impl Into<String>) -> Self {
        TierConfig {
            url: url.into(),
            budget_bytes: None,
            check_interval: Duration::from_secs(5),
            check_timeout: Duration::from_secs(1),
            fill_roots_in_flight: 2,
            fill_objects_in_flight: 4,
            ack: TierAck::Origin,
            uploads_in_flight: 2,
            max_upload_backlog: 256,
        }
    }

    /// Sets when publications are acknowledged (builder style).
    #[must_use]
    pub fn with_ack(mut self, ack: TierAck) -> Self {
        self.ack = ack;
        self
    }

    /// Sets the budget (builder style).
    #[must_use]
    pub fn with_budget_bytes(mut self, budget: Option<u64>) -> Self {
        self.budget_bytes = budget;
        self
    }

    /// Sets the coherence check interval (builder style).
    #[must_use]
    pub fn with_check_interval(mut self, interval: Duration) -> Self {
        self.check_interval = interval;
        self
    }
}

/// Counters of a handle's tier (see [`TierStats`]).
#[derive(Debug, Default)]
pub(crate) struct TierCounters {
    pub(crate) hits: Counter,
    pub(crate) misses: Counter,
    pub(crate) fall_throughs: Counter,
    pub(crate) refused: Counter,
    pub(crate) unchecked: Counter,
    pub(crate) fills: Counter,
    pub(crate) fill_bytes: Counter,
    pub(crate) fills_failed: Counter,
    pub(crate) fills_skipped: Counter,
    pub(crate) publish_failures: Counter,
    pub(crate) uploads: Counter,
    pub(crate) upload_bytes: Counter,
    pub(crate) upload_failures: Counter,
    pub(crate) upload_conflicts: Counter,
    pub(crate) uploads_inline: Counter,
}

/// What a handle's tier did (process-local counters).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierStats {
    /// Restores served from the tier.
    pub hits: u64,
    /// Restores the tier had no root for.
    pub misses: u64,
    /// Restores the tier had a root for but could not serve (a damaged or
    /// missing object, a tier error): served by the origin instead.
    pub fall_throughs: u64,
    /// Tier hits refused because the origin no longer holds the root.
    pub refused: u64,
    /// Tier hits served while the origin did not answer the check.
    pub unchecked: u64,
    /// Roots copied into the tier from the origin.
    pub fills: u64,
    /// Bytes copied into the tier (objects and roots).
    pub fill_bytes: u64,
    /// Fills that failed (the tier's budget, an origin or tier error).
    pub fills_failed: u64,
    /// Fills not started because enough were already running.
    pub fills_skipped: u64,
    /// Write-through publications the tier did not take.
    pub publish_failures: u64,
    /// Roots uploaded to the origin (acknowledged in the tier before).
    pub uploads: u64,
    /// Bytes those uploads wrote to the origin.
    pub upload_bytes: u64,
    /// Upload attempts that failed (the root stays journaled).
    pub upload_failures: u64,
    /// Uploads that found another snapshot in the origin (origin wins).
    pub upload_conflicts: u64,
    /// Publications written through because the upload backlog was full.
    pub uploads_inline: u64,
    /// Publications journaled in the tier and not yet in the origin, as
    /// last seen by this handle.
    pub upload_backlog: u64,
}

impl TierCounters {
    fn snapshot(&self) -> TierStats {
        let g = |c: &Counter| c.get();
        TierStats {
            hits: g(&self.hits),
            misses: g(&self.misses),
            fall_throughs: g(&self.fall_throughs),
            refused: g(&self.refused),
            unchecked: g(&self.unchecked),
            fills: g(&self.fills),
            fill_bytes: g(&self.fill_bytes),
            fills_failed: g(&self.fills_failed),
            fills_skipped: g(&self.fills_skipped),
            publish_failures: g(&self.publish_failures),
            uploads: g(&self.uploads),
            upload_bytes: g(&self.upload_bytes),
            upload_failures: g(&self.upload_failures),
            upload_conflicts: g(&self.upload_conflicts),
            uploads_inline: g(&self.uploads_inline),
            upload_backlog: 0,
        }
    }
}

/// A handle's tier: the tier store and what the handle knows of it.
pub(crate) struct Tier {
    /// The tier store (local disk, its own ledger and budget, no tier).
    pub(crate) store: Store,
    pub(crate) config: TierConfig,
    pub(crate) counters: TierCounters,
    /// When the origin was last seen holding each root.
    checked: Mutex<HashMap<(Namespace, ContextDigest), Instant>>,
    /// Roots being filled (one fill per root).
    filling: Mutex<HashSet<(Namespace, ContextDigest)>>,
    /// Permits for objects held in memory by copies (fills and uploads).
    copy_objects: Arc<tokio::sync::Semaphore>,
    /// Running fills ([`Store::tier_settle`] waits for them).
    fill_tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// This handle's uploader (`upload.rs`).
    uploader: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Wakes the uploader (a publication was journaled).
    upload_wake: Arc<tokio::sync::Notify>,
    /// Pending uploads as last counted.
    backlog: std::sync::atomic::AtomicU64,
    /// One upload round at a time in this process (the uploader's, or a
    /// caller's [`Store::tier_upload`]).
    upload_round: tokio::sync::Mutex<()>,
}

impl Drop for Tier {
    fn drop(&mut self) {
        if let Some(t) = lock(&self.uploader).take() {
            t.abort();
        }
    }
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tier")
            .field("url", &self.config.url)
            .finish()
    }
}

/// What the coherence rule says of a tier hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coherence {
    /// The origin holds the root (now or within the interval).
    Serve,
    /// The origin did not answer in time: serve, counted as unchecked.
    Unchecked,
    /// The origin no longer holds the root.
    Refuse,
}

impl Tier {
    /// Opens the tier a store's configuration names: a local store with the
    /// origin's publication, restore and key settings, its own budget and
    /// its own ledger (the default one inside the tier directory).
    pub(crate) fn open(origin: &crate::StoreConfig, tc: &TierConfig) -> Result<Tier> {
        let backend = crate::backend::open(&tc.url)?;
        if !matches!(backend.kind, BackendKind::Local { .. }) {
            return Err(StoreError::Invalid(format!(
                "tier {}: a tier is a local directory (file:///path or a plain path)",
                tc.url
            )));
        }
        if tc.fill_roots_in_flight == 0
            || tc.fill_objects_in_flight == 0
            || tc.uploads_in_flight == 0
        {
            return Err(StoreError::Invalid(
                "tier fill_roots_in_flight, fill_objects_in_flight and uploads_in_flight must be \
                 at least 1"
                    .into(),
            ));
        }
        let mut config = origin.clone();
        config.tier = None;
        config.capacity.budget_bytes = tc.budget_bytes;
        config.capacity.ledger = None;
        let store = Store::from_backend(backend, config)?;
        Ok(Tier {
            store,
            config: tc.clone(),
            counters: TierCounters::default(),
            checked: Mutex::new(HashMap::new()),
            filling: Mutex::new(HashSet::new()),
            copy_objects: Arc::new(tokio::sync::Semaphore::new(tc.fill_objects_in_flight)),
            fill_tasks: Mutex::new(Vec::new()),
            uploader: Mutex::new(None),
            upload_wake: Arc::new(tokio::sync::Notify::new()),
            backlog: std::sync::atomic::AtomicU64::new(0),
            upload_round: tokio::sync::Mutex::new(()),
        })
    }

    /// The coherence rule for a tier hit on `key` (module docs).
    pub(crate) async fn coherence(&self, origin: &Store, key: RootKey) -> Coherence {
        let k = (key.namespace, key.context);
        let fresh = lock(&self.checked)
            .get(&k)
            .is_some_and(|t| t.elapsed() < self.config.check_interval);
        if fresh {
            return Coherence::Serve;
        }
        let path = crate::keys::root_key(&key.namespace, &key.context);
        let head = origin.object_store().head(&path);
        match tokio::time::timeout(self.config.check_timeout, head).await {
            Ok(Ok(_)) => {
                lock(&self.checked).insert(k, Instant::now());
                Coherence::Serve
            }
            Ok(Err(object_store::Error::NotFound { .. })) => {
                lock(&self.checked).remove(&k);
                // A publication acknowledged in the tier and not uploaded
                // yet is not stale: it is on its way to the origin.
                if self.upload_pending(key).await {
                    Coherence::Serve
                } else {
                    Coherence::Refuse
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, %path, "origin check failed; serving the verified tier copy");
                Coherence::Unchecked
            }
            Err(_) => {
                tracing::warn!(%path, "origin check timed out; serving the verified tier copy");
                Coherence::Unchecked
            }
        }
    }

    /// Notes that the origin holds `key` now (it just served or took it).
    pub(crate) fn seen_in_origin(&self, key: RootKey) {
        lock(&self.checked).insert((key.namespace, key.context), Instant::now());
    }

    /// Removes the tier's copy of a root the origin no longer holds (with
    /// any delta built on it, as an invalidation does). Failures are
    /// logged: the hit is refused either way.
    pub(crate) async fn drop_root(&self, key: RootKey) {
        let out = async {
            let plan = self
                .store
                .invalidate_plan(key.namespace, Some(key.context))
                .await?;
            self.store.execute(plan).await
        }
        .await;
        if let Err(e) = out {
            tracing::warn!(error = %e, "could not remove a stale root from the tier");
        }
    }

    /// Says where each of the origin's `roots` lives, and adds the roots
    /// only the tier holds (`inspect`).
    pub(crate) async fn locate(
        &self,
        roots: &mut Vec<crate::RootInfo>,
        ns: Option<&Namespace>,
    ) -> Result<()> {
        let pending: HashSet<(String, String)> = self
            .pending_uploads()
            .await?
            .into_iter()
            .map(|k| (k.namespace.hex(), k.context.hex()))
            .collect();
        let mut index = HashMap::new();
        for (i, r) in roots.iter_mut().enumerate() {
            r.location = Some("origin".into());
            index.insert((r.namespace.clone(), r.context.clone()), i);
        }
        for mut t in self.store.inspect_here(ns).await? {
            let key = (t.namespace.clone(), t.context.clone());
            match index.get(&key) {
                Some(&i) => roots[i].location = Some("origin+tier".into()),
                None => {
                    let pending = pending.contains(&key);
                    t.location = Some(
                        if pending {
                            "tier (upload pending)"
                        } else {
                            "tier"
                        }
                        .into(),
                    );
                    roots.push(t);
                }
            }
        }
        Ok(())
    }

    /// Registers the tier's counters (`deltapack_tier_*`) and its upload
    /// backlog with `registry`.
    pub(crate) fn register_metrics(
        self: &Arc<Self>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        let c = &self.counters;
        let r = registry.sub_registry_with_prefix("deltapack_tier");
        #[rustfmt::skip]
        let counters: [(&str, &str, &Counter); 13] = [
            ("hits", "Restores served from the tier", &c.hits),
            ("misses", "Restores the tier held no root for", &c.misses),
            ("fall_throughs", "Restores the tier could not serve (damage, errors), served by the origin", &c.fall_throughs),
            ("refused", "Tier hits refused: the origin no longer holds the root", &c.refused),
            ("unchecked", "Tier hits served while the origin did not answer", &c.unchecked),
            ("fills", "Roots copied into the tier from the origin", &c.fills),
            ("fill_bytes", "Bytes copied into the tier", &c.fill_bytes),
            ("fills_failed", "Fills that failed", &c.fills_failed),
            ("fills_skipped", "Fills not started (enough running)", &c.fills_skipped),
            ("publish_failures", "Write-through publications the tier did not take", &c.publish_failures),
            ("uploads", "Roots acknowledged in the tier and uploaded to the origin", &c.uploads),
            ("upload_failures", "Upload attempts that failed (still journaled)", &c.upload_failures),
            ("upload_conflicts", "Uploads that found another snapshot in the origin", &c.upload_conflicts),
        ];
        for (name, help, counter) in counters {
            r.register(name, help, counter.clone());
        }
        let backlog =
            prometheus_client::metrics::gauge::Gauge::<u64, std::sync::atomic::AtomicU64>::default(
            );
        backlog.set(self.backlog.load(std::sync::atomic::Ordering::Relaxed));
        r.register(
            "upload_backlog",
            "Publications journaled in the tier and not yet in the origin (as of registration)",
            backlog,
        );
    }

    /// The counters.
    pub(crate) fn stats(&self) -> TierStats {
        let mut s = self.counters.snapshot();
        s.upload_backlog = self.backlog.load(std::sync::atomic::Ordering::Relaxed);
        s
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Store {
    /// The tier in front of this store, if one is configured.
    pub(crate) fn tier(&self) -> Option<&Arc<Tier>> {
        self.inner.tier.as_ref()
    }

    /// The tier's store, if one is configured (for `stats`, `inspect` and
    /// maintenance of the tier itself).
    pub fn tier_store(&self) -> Option<&Store> {
        self.tier().map(|t| &t.store)
    }

    /// What the tier did, if one is configured.
    pub fn tier_stats(&self) -> Option<TierStats> {
        self.tier().map(|t| t.stats())
    }

    /// Waits until every fill started so far has finished (tests, benches,
    /// and a process about to exit that wants its tier warm).
    pub async fn tier_settle(&self) {
        let Some(t) = self.tier() else { return };
        loop {
            let tasks: Vec<_> = lock(&t.fill_tasks).drain(..).collect();
            if tasks.is_empty() {
                return;
            }
            for task in tasks {
                let _ = task.await;
            }
        }
    }
}

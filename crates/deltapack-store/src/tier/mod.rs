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
//! **Publication.** Write-through: the same publication goes to the tier
//! and to the origin concurrently, and the caller's receipt is the
//! origin's: a root is acknowledged when it is durable in the origin. A
//! tier failure is counted and logged, never returned.

mod fill;
mod read;
mod write;

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
    /// Objects held in memory at once across all fills (4 by default; each
    /// at most one extent, so 4 × 64 MiB at the production extent size).
    pub fill_objects_in_flight: usize,
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
        }
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
    /// Publications waiting to be uploaded to the origin (always 0 in
    /// write-through mode).
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
    /// Permits for objects held by fills.
    fill_objects: Arc<tokio::sync::Semaphore>,
    /// Running fills ([`Store::tier_settle`] waits for them).
    fill_tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
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
        if tc.fill_roots_in_flight == 0 || tc.fill_objects_in_flight == 0 {
            return Err(StoreError::Invalid(
                "tier fill_roots_in_flight and fill_objects_in_flight must be at least 1".into(),
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
            fill_objects: Arc::new(tokio::sync::Semaphore::new(tc.fill_objects_in_flight)),
            fill_tasks: Mutex::new(Vec::new()),
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
                Coherence::Refuse
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

    /// The counters.
    pub(crate) fn stats(&self) -> TierStats {
        self.counters.snapshot()
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

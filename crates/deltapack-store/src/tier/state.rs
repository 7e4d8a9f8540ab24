//! A handle's tier state beside the tier store: configuration, counters,
//! the coherence checks (when the origin was last seen holding a root),
//! the running fills and the uploader.
//!
//! Owns what the tier files share. Must never name the store: the store's
//! handle holds this state (the logic that needs the store is in the
//! other files of `tier/`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use deltapack_format::{ContextDigest, Namespace};
use prometheus_client::metrics::counter::Counter;

use super::config::{TierConfig, TierStats};
use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::keys::RootKey;
use crate::stats::live_counters;

live_counters! {
    /// Counters of a handle's tier (see [`TierStats`]; its upload backlog
    /// is a gauge, filled in by [`TierState::stats`]).
    TierCounters => TierStats {
        hits, misses, fall_throughs, refused, unchecked, fills, fill_bytes, fills_failed,
        fills_skipped, publish_failures, uploads, upload_bytes, upload_failures,
        upload_conflicts, uploads_inline,
    }
}

/// What a handle knows of its tier beside the tier store itself (which
/// the handle holds next to it): configuration, counters, the coherence
/// checks, running fills and the uploader.
pub(crate) struct TierState {
    pub(crate) config: TierConfig,
    pub(crate) counters: TierCounters,
    /// When the origin was last seen holding each root.
    pub(crate) checked: Mutex<HashMap<(Namespace, ContextDigest), Instant>>,
    /// Roots being filled (one fill per root).
    pub(crate) filling: Mutex<HashSet<(Namespace, ContextDigest)>>,
    /// Permits for objects held in memory by copies (fills and uploads).
    pub(crate) copy_objects: Arc<tokio::sync::Semaphore>,
    /// Running fills ([`Store::tier_settle`] waits for them).
    pub(crate) fill_tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// This handle's uploader (`upload.rs`).
    pub(crate) uploader: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Wakes the uploader (a publication was journaled).
    pub(crate) upload_wake: Arc<tokio::sync::Notify>,
    /// Pending uploads as last counted.
    pub(crate) backlog: std::sync::atomic::AtomicU64,
    /// Whether `backlog` was counted from the journal yet.
    pub(crate) backlog_known: std::sync::atomic::AtomicBool,
    /// One upload round at a time in this process (the uploader's, or a
    /// caller's [`Store::tier_upload`]).
    pub(crate) upload_round: tokio::sync::Mutex<()>,
}

impl Drop for TierState {
    fn drop(&mut self) {
        if let Some(t) = lock(&self.uploader).take() {
            t.abort();
        }
    }
}

impl std::fmt::Debug for TierState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierState")
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

impl TierState {
    /// The state of a tier configured by `tc`, and the configuration its
    /// store opens with: the origin's publication, restore and key
    /// settings, the tier's own budget and its own ledger (the default one
    /// inside the tier directory), no tier of its own.
    pub(crate) fn new(origin: &StoreConfig, tc: &TierConfig) -> Result<(TierState, StoreConfig)> {
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
        let state = TierState {
            config: tc.clone(),
            counters: TierCounters::default(),
            checked: Mutex::new(HashMap::new()),
            filling: Mutex::new(HashSet::new()),
            copy_objects: Arc::new(tokio::sync::Semaphore::new(tc.fill_objects_in_flight)),
            fill_tasks: Mutex::new(Vec::new()),
            uploader: Mutex::new(None),
            upload_wake: Arc::new(tokio::sync::Notify::new()),
            backlog: std::sync::atomic::AtomicU64::new(0),
            backlog_known: std::sync::atomic::AtomicBool::new(false),
            upload_round: tokio::sync::Mutex::new(()),
        };
        Ok((state, config))
    }

    /// Notes that the origin holds `key` now (it just served or took it).
    pub(crate) fn seen_in_origin(&self, key: RootKey) {
        lock(&self.checked).insert((key.namespace, key.context), Instant::now());
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

/// A mutex's guard, whether or not a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

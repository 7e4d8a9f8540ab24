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

use deltapack_format::{ContextDigest, Digest, Namespace};
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
        hits, misses, fall_throughs, refused, unchecked, fills, fill_bytes, fill_reused_bytes, fills_failed,
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
    /// The snapshot the origin was last seen holding at each context, and
    /// when (`None`: a root without a summary, e.g. a legacy v1 root).
    pub(crate) checked: Mutex<HashMap<(Namespace, ContextDigest), Seen>>,
    /// Checks of the origin in flight, one per context: every hit waiting
    /// for an answer shares it, each for as long as its own bounds allow;
    /// a check outlives a caller whose deadline cut it short, so its answer
    /// (or its failure: the breaker) still counts.
    pub(crate) checks: Mutex<HashMap<(Namespace, ContextDigest), SharedCheck>>,
    /// When the origin last failed to answer a check (the breaker is open
    /// for [`TierConfig::probe_interval`] after it).
    pub(crate) origin_down: Mutex<Option<Instant>>,
    /// Roots being filled (one fill per root).
    pub(crate) filling: Mutex<HashSet<(Namespace, ContextDigest)>>,
    /// Permits for objects held in memory by copies (fills and uploads).
    pub(crate) copy_objects: Arc<tokio::sync::Semaphore>,
    /// Restores from the origin whose verified objects go into the tier
    /// (`tap.rs`'s taps, weak: a tap lives as long as its restore, its
    /// writes and the fill that takes it; held as `Any` so that this file
    /// names no file that names the store).
    pub(crate) taps: Mutex<HashMap<RootKey, std::sync::Weak<dyn std::any::Any + Send + Sync>>>,
    /// Bytes of restored objects held for the tier at once (permits are
    /// bytes): [`TierConfig::tap_buffer_bytes`] of the origin's extents.
    pub(crate) tap_bytes: Arc<tokio::sync::Semaphore>,
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

/// What the origin was seen holding at a context (its snapshot digest;
/// `None` for a root without a summary), and when.
pub(crate) type Seen = (Option<Digest>, Instant);

/// A check of the origin in flight, shared by every hit waiting for it.
pub(crate) type SharedCheck =
    futures::future::Shared<futures::future::BoxFuture<'static, OriginView>>;

/// What the origin holds at a context, as the coherence rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OriginView {
    /// A root restoring to this snapshot (`None`: a root without a
    /// summary, whose identity cannot be compared), now or within the
    /// check interval.
    Holds(Option<Digest>),
    /// No root.
    Absent,
    /// No answer in time, an error, or the breaker is open: unknown.
    Unknown,
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
            origin_down: Mutex::new(None),
            checks: Mutex::new(HashMap::new()),
            filling: Mutex::new(HashSet::new()),
            copy_objects: Arc::new(tokio::sync::Semaphore::new(tc.fill_objects_in_flight)),
            taps: Mutex::new(HashMap::new()),
            tap_bytes: Arc::new(tokio::sync::Semaphore::new(
                usize::try_from(tc.tap_buffer_bytes(origin.publication.max_extent_bytes))
                    .unwrap_or(usize::MAX)
                    .min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            fill_tasks: Mutex::new(Vec::new()),
            uploader: Mutex::new(None),
            upload_wake: Arc::new(tokio::sync::Notify::new()),
            backlog: std::sync::atomic::AtomicU64::new(0),
            backlog_known: std::sync::atomic::AtomicBool::new(false),
            upload_round: tokio::sync::Mutex::new(()),
        };
        Ok((state, config))
    }

    /// Notes that the origin holds `key`, restoring to `digest`, now (it
    /// just served or took it).
    pub(crate) fn seen_in_origin(&self, key: RootKey, digest: Digest) {
        lock(&self.checked).insert((key.namespace, key.context), (Some(digest), Instant::now()));
    }

    /// Whether the origin is remembered down: it failed to answer a check
    /// less than [`TierConfig::probe_interval`] ago.
    pub(crate) fn origin_down(&self) -> bool {
        lock(&self.origin_down).is_some_and(|t| t.elapsed() < self.config.probe_interval)
    }

    /// Records whether the origin answered a check.
    pub(crate) fn origin_answered(&self, answered: bool) {
        let mut down = lock(&self.origin_down);
        match (answered, down.is_some()) {
            (true, true) => {
                tracing::info!("the origin answers again; tier hits are checked again");
                *down = None;
            }
            (true, false) => {}
            (false, was_down) => {
                if !was_down {
                    tracing::warn!(
                        probe_ms = self.config.probe_interval.as_millis() as u64,
                        "the origin does not answer; tier hits are served unchecked until a probe gets through"
                    );
                }
                *down = Some(Instant::now());
            }
        }
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
        let counters: [(&str, &str, &Counter); 14] = [
            ("hits", "Restores served from the tier", &c.hits),
            ("misses", "Restores the tier held no root for", &c.misses),
            ("fall_throughs", "Restores the tier could not serve (damage, errors), served by the origin", &c.fall_throughs),
            ("refused", "Tier hits refused: the origin no longer holds the root", &c.refused),
            ("unchecked", "Tier hits served while the origin did not answer", &c.unchecked),
            ("fills", "Roots copied into the tier from the origin", &c.fills),
            ("fill_bytes", "Bytes fills downloaded from the origin into the tier", &c.fill_bytes),
            ("fill_reused_bytes", "Bytes written into the tier from a restore's verified objects (not downloaded again)", &c.fill_reused_bytes),
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

/// Waits for every task in `tasks`, including those pushed while it
/// waits, until none is left.
pub(crate) async fn join_all(tasks: &Mutex<Vec<tokio::task::JoinHandle<()>>>) {
    loop {
        let now: Vec<_> = lock(tasks).drain(..).collect();
        if now.is_empty() {
            return;
        }
        for task in now {
            let _ = task.await;
        }
    }
}

/// A mutex's guard, whether or not a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

//! Counters kept by a store handle (process-local; exported by `stats`,
//! persisted into the ledger, and — some of them — registered as metrics by
//! the `metrics` module).

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;

/// Live counters of one store handle. Each is a `prometheus-client`
/// counter, so the ones exported as metrics are registered as they are.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) hits: Counter,
    pub(crate) miss_absent: Counter,
    pub(crate) miss_corrupt: Counter,
    pub(crate) miss_incompatible: Counter,
    pub(crate) miss_base_missing: Counter,
    pub(crate) miss_deadline: Counter,
    pub(crate) miss_unauthenticated: Counter,
    pub(crate) objects_read: Counter,
    pub(crate) bytes_read: Counter,
    pub(crate) objects_written: Counter,
    pub(crate) objects_reused: Counter,
    pub(crate) bytes_written: Counter,
    pub(crate) roots_written: Counter,
    pub(crate) conflicts: Counter,
    pub(crate) quarantined: Counter,
    pub(crate) restores_shared: Counter,
    pub(crate) base_cache_hits: Counter,
    pub(crate) evictions: Counter,
    pub(crate) hits_cheaper_than_prefill: Counter,
    pub(crate) hits_dearer_than_prefill: Counter,
    pub(crate) ledger_fallbacks: Counter,
    pub(crate) touches_dropped: Counter,
    pub(crate) snapshot_bytes_hashed: Counter,
}

/// A point-in-time copy of the store's counters (latency is in the
/// histograms of [`crate::Store::register_metrics`]).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Restores that returned a snapshot.
    pub hits: u64,
    /// Misses: no root.
    pub miss_absent: u64,
    /// Misses: corruption detected.
    pub miss_corrupt: u64,
    /// Misses: unknown schema or envelope.
    pub miss_incompatible: u64,
    /// Misses: base did not restore.
    pub miss_base_missing: u64,
    /// Misses: deadline passed.
    pub miss_deadline: u64,
    /// Misses: root MAC missing or wrong.
    pub miss_unauthenticated: u64,
    /// Objects fetched from the backend.
    pub objects_read: u64,
    /// Bytes fetched from the backend.
    pub bytes_read: u64,
    /// Objects created by publications.
    pub objects_written: u64,
    /// Objects that already existed at publication (content-addressed reuse).
    pub objects_reused: u64,
    /// Bytes of objects and roots created.
    pub bytes_written: u64,
    /// Roots created.
    pub roots_written: u64,
    /// Publications that found a different snapshot already published.
    pub conflicts: u64,
    /// Objects and roots moved to quarantine.
    pub quarantined: u64,
    /// Restores that joined another in-flight restore of the same root.
    pub restores_shared: u64,
    /// Bases served from the verified-base cache.
    pub base_cache_hits: u64,
    /// Roots evicted for capacity.
    pub evictions: u64,
    /// Hits restored faster than recomputing the prefix at the configured
    /// prefill rate.
    pub hits_cheaper_than_prefill: u64,
    /// Hits that took longer than recomputing would have.
    pub hits_dearer_than_prefill: u64,
    /// Reads (lookups) answered from the store because the ledger was
    /// down, failing or slower than its deadline.
    pub ledger_fallbacks: u64,
    /// Root accesses (LRU order) dropped because the ledger could not take
    /// them.
    pub touches_dropped: u64,
    /// Snapshot bytes hashed by publications for snapshot digests (a base's
    /// check, a result's digest): the whole result for a cold publication,
    /// the new pages only for a warm one.
    pub snapshot_bytes_hashed: u64,
}

impl Stats {
    pub(crate) fn add(c: &Counter, n: u64) {
        c.inc_by(n);
    }

    /// Copies the counters.
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let g = |c: &Counter| c.get();
        StatsSnapshot {
            hits: g(&self.hits),
            miss_absent: g(&self.miss_absent),
            miss_corrupt: g(&self.miss_corrupt),
            miss_incompatible: g(&self.miss_incompatible),
            miss_base_missing: g(&self.miss_base_missing),
            miss_deadline: g(&self.miss_deadline),
            miss_unauthenticated: g(&self.miss_unauthenticated),
            objects_read: g(&self.objects_read),
            bytes_read: g(&self.bytes_read),
            objects_written: g(&self.objects_written),
            objects_reused: g(&self.objects_reused),
            bytes_written: g(&self.bytes_written),
            roots_written: g(&self.roots_written),
            conflicts: g(&self.conflicts),
            quarantined: g(&self.quarantined),
            restores_shared: g(&self.restores_shared),
            base_cache_hits: g(&self.base_cache_hits),
            evictions: g(&self.evictions),
            hits_cheaper_than_prefill: g(&self.hits_cheaper_than_prefill),
            hits_dearer_than_prefill: g(&self.hits_dearer_than_prefill),
            ledger_fallbacks: g(&self.ledger_fallbacks),
            touches_dropped: g(&self.touches_dropped),
            snapshot_bytes_hashed: g(&self.snapshot_bytes_hashed),
        }
    }
}

/// Ledger gauges, persisted and live counters, and free space.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct StatsReport {
    /// Ledger totals.
    pub ledger: crate::ledger::Totals,
    /// Free bytes on the store's filesystem (local disk only).
    pub free_bytes: Option<u64>,
    /// Configured budget.
    pub budget_bytes: Option<u64>,
    /// Counters accumulated by every process that used this store (local
    /// disk; for other backends, this process only).
    pub counters: Vec<(String, u64)>,
    /// This process's live counters.
    pub process: StatsSnapshot,
    /// The node-local tier, if one is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<TierReport>,
}

/// The tier's part of a [`StatsReport`].
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct TierReport {
    /// The tier's directory.
    pub url: String,
    /// The tier ledger's totals.
    pub ledger: crate::ledger::Totals,
    /// The tier's budget.
    pub budget_bytes: Option<u64>,
    /// Free bytes on the tier's filesystem.
    pub free_bytes: Option<u64>,
    /// Publications journaled in the tier and not yet in the origin.
    pub upload_backlog: u64,
    /// This process's tier counters.
    pub process: crate::TierStats,
}

/// What accumulated between two snapshots of the counters, by name.
pub(crate) fn counter_deltas(
    now: &StatsSnapshot,
    last: &StatsSnapshot,
) -> Vec<(&'static str, u64)> {
    counter_pairs(now)
        .into_iter()
        .zip(counter_pairs(last))
        .map(|((n, v), (_, b))| (n, v.saturating_sub(b)))
        .collect()
}

/// The counters persisted in the ledger, by name.
fn counter_pairs(s: &StatsSnapshot) -> Vec<(&'static str, u64)> {
    vec![
        ("hits", s.hits),
        ("misses_absent", s.miss_absent),
        ("misses_corrupt", s.miss_corrupt),
        ("misses_incompatible", s.miss_incompatible),
        ("misses_base_missing", s.miss_base_missing),
        ("misses_deadline_exceeded", s.miss_deadline),
        ("misses_unauthenticated", s.miss_unauthenticated),
        ("objects_read", s.objects_read),
        ("bytes_read", s.bytes_read),
        ("objects_written", s.objects_written),
        ("bytes_written", s.bytes_written),
        ("roots_written", s.roots_written),
        ("evictions", s.evictions),
        ("quarantined", s.quarantined),
        ("conflicts", s.conflicts),
        ("hits_cheaper_than_prefill", s.hits_cheaper_than_prefill),
        ("hits_dearer_than_prefill", s.hits_dearer_than_prefill),
    ]
}

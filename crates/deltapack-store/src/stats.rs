//! Counters kept by a store handle (process-local; exported by `stats`,
//! persisted into the ledger, and — some of them — registered as metrics by
//! the `metrics` module).

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;

/// Declares a handle's live counters: a struct of `prometheus-client`
/// counters, one per field of the public snapshot type it copies into, and
/// that copy (`snapshot`). The fields are listed once, so the live struct
/// and its snapshot cannot drift apart; fields of the snapshot that are not
/// counters keep their defaults.
macro_rules! live_counters {
    ($(#[$doc:meta])* $name:ident => $snap:ident { $($field:ident),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Default)]
        pub(crate) struct $name {
            $(pub(crate) $field: prometheus_client::metrics::counter::Counter,)+
        }

        impl $name {
            /// Copies the counters.
            #[allow(clippy::needless_update)]
            pub(crate) fn snapshot(&self) -> $snap {
                $snap {
                    $($field: self.$field.get(),)+
                    ..Default::default()
                }
            }
        }
    };
}
pub(crate) use live_counters;

live_counters! {
    /// Live counters of one store handle. Each is a `prometheus-client`
    /// counter, so the ones exported as metrics are registered as they are.
    Stats => StatsSnapshot {
        hits, miss_absent, miss_corrupt, miss_incompatible, miss_base_missing, miss_deadline,
        miss_unauthenticated, objects_read, bytes_read, objects_written, objects_reused,
        bytes_written, roots_written, conflicts, quarantined, restores_shared, base_cache_hits,
        evictions, hits_cheaper_than_prefill, hits_dearer_than_prefill, ledger_fallbacks,
        touches_dropped, snapshot_bytes_hashed,
    }
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

//! Counters kept by a store handle (process-local; exported by `stats`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::Serialize;

/// Live counters of one store handle.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) hits: AtomicU64,
    pub(crate) miss_absent: AtomicU64,
    pub(crate) miss_corrupt: AtomicU64,
    pub(crate) miss_incompatible: AtomicU64,
    pub(crate) miss_base_missing: AtomicU64,
    pub(crate) miss_deadline: AtomicU64,
    pub(crate) miss_unauthenticated: AtomicU64,
    pub(crate) objects_read: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) objects_written: AtomicU64,
    pub(crate) objects_reused: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) roots_written: AtomicU64,
    pub(crate) conflicts: AtomicU64,
    pub(crate) quarantined: AtomicU64,
    pub(crate) restores_shared: AtomicU64,
    pub(crate) base_cache_hits: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) hits_cheaper_than_prefill: AtomicU64,
    pub(crate) hits_dearer_than_prefill: AtomicU64,
    pub(crate) restore_latencies_us: Mutex<Vec<u64>>,
}

/// A point-in-time copy of the store's counters and latency figures.
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
    /// Restore latency percentiles in microseconds: p50, p90, p99, max.
    pub restore_latency_us: [u64; 4],
}

impl Stats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn record_latency(&self, us: u64) {
        if let Ok(mut v) = self.restore_latencies_us.lock() {
            if v.len() >= 100_000 {
                v.drain(..50_000);
            }
            v.push(us);
        }
    }

    /// Copies the counters.
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut lat = self
            .restore_latencies_us
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default();
        lat.sort_unstable();
        let pct = |p: f64| -> u64 {
            if lat.is_empty() {
                0
            } else {
                lat[((lat.len() - 1) as f64 * p).round() as usize]
            }
        };
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
            restore_latency_us: [
                pct(0.5),
                pct(0.9),
                pct(0.99),
                lat.last().copied().unwrap_or(0),
            ],
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
    /// This process's live counters and latency figures.
    pub process: StatsSnapshot,
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

/// Prometheus text exposition of a stats report.
pub fn prometheus(r: &StatsReport) -> String {
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, v: u64| {
        out.push_str(&format!(
            "# HELP deltapack_{name} {help}\n# TYPE deltapack_{name} gauge\ndeltapack_{name} {v}\n"
        ));
    };
    gauge(
        "ledger_used_bytes",
        "Bytes counted against the budget (live + condemned + roots).",
        r.ledger.used_bytes,
    );
    gauge(
        "ledger_object_bytes",
        "Bytes of live objects, each counted once.",
        r.ledger.object_bytes,
    );
    gauge(
        "ledger_condemned_bytes",
        "Bytes of condemned objects awaiting deletion.",
        r.ledger.condemned_bytes,
    );
    gauge("ledger_roots", "Roots in the ledger.", r.ledger.roots);
    gauge(
        "ledger_objects",
        "Live objects in the ledger.",
        r.ledger.objects,
    );
    if let Some(f) = r.free_bytes {
        gauge("free_bytes", "Free bytes on the store's filesystem.", f);
    }
    if let Some(b) = r.budget_bytes {
        gauge("budget_bytes", "Configured byte budget.", b);
    }
    out.push_str("# HELP deltapack_namespace_bytes Physical bytes per namespace.\n# TYPE deltapack_namespace_bytes gauge\n");
    for (ns, b) in &r.ledger.per_namespace {
        out.push_str(&format!(
            "deltapack_namespace_bytes{{namespace=\"{ns}\"}} {b}\n"
        ));
    }
    for (name, v) in &r.counters {
        out.push_str(&format!(
            "# HELP deltapack_{name}_total Accumulated {name} (all processes).\n# TYPE deltapack_{name}_total counter\ndeltapack_{name}_total {v}\n"
        ));
    }
    let lat = r.process.restore_latency_us;
    out.push_str("# HELP deltapack_restore_latency_seconds Restore latency quantiles of this process.\n# TYPE deltapack_restore_latency_seconds summary\n");
    for (q, v) in [("0.5", lat[0]), ("0.9", lat[1]), ("0.99", lat[2])] {
        out.push_str(&format!(
            "deltapack_restore_latency_seconds{{quantile=\"{q}\"}} {}\n",
            v as f64 / 1e6
        ));
    }
    out
}

//! The metrics a store handle exposes through a `prometheus-client`
//! registry ([`crate::Store::register_metrics`]; `deltapack stats
//! --prometheus` prints the same registry).
//!
//! Every name carries the prefix `deltapack_`. Counters and histograms are
//! this handle's (clones of a [`crate::Store`] share them; another process
//! has its own); the text encoder appends `_total` to counters and the unit
//! to the names registered with one.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `deltapack_restore_total` | counter | `outcome` (`hit`, `miss`), `reason` (`none` on a hit; `absent`, `corrupt`, `incompatible`, `base_missing`, `deadline`, `unauthenticated`), `schema` | restores (`restore` and `restore_into`) by outcome |
//! | `deltapack_publish_total` | counter | `outcome` (`created`, `already_present`, `conflict`, `error`), `schema` | publications by outcome |
//! | `deltapack_objects_read_total`, `deltapack_read_bytes_total` | counter | | objects and bytes fetched from the backend |
//! | `deltapack_objects_written_total`, `deltapack_written_bytes_total` | counter | | objects and roots created, and their bytes |
//! | `deltapack_objects_reused_total` | counter | | objects a publication found already stored |
//! | `deltapack_roots_written_total`, `deltapack_quarantined_total`, `deltapack_evictions_total` | counter | | roots created, objects and roots quarantined, roots evicted for capacity |
//! | `deltapack_restore_duration_seconds`, `deltapack_publish_duration_seconds` | histogram | | latency of each restore (hit or miss) and publication (1 ms to ~65 s) |
//! | `deltapack_restore_size_bytes`, `deltapack_publish_size_bytes` | histogram | | bytes of each restored snapshot (hits) and of each publication's payload |
//! | `deltapack_ledger_used_bytes`, `deltapack_ledger_object_bytes`, `deltapack_ledger_roots`, `deltapack_ledger_objects`, `deltapack_ledger_condemned_objects`, `deltapack_ledger_condemned_bytes` | gauge | | the capacity ledger's totals (see below) |
//! | `deltapack_ledger_namespace_bytes` | gauge | `namespace` | physical bytes per namespace (full totals only) |
//! | `deltapack_ledger_accumulated` | gauge | `counter` | counters accumulated in the ledger by every process that used the store (local disk; other backends: this process) |
//! | `deltapack_budget_bytes` | gauge | | the configured budget (registered only when one is set) |
//! | `deltapack_free_bytes` | gauge | | free bytes on a local store's filesystem |
//! | `deltapack_ledger_fallback_total` | counter | `op` (`lookup`) | calls answered from the store because the ledger was down, failing or slower than `ledger_deadline` |
//! | `deltapack_ledger_touches_dropped_total` | counter | | root accesses (LRU order) dropped because the ledger could not take them |
//! | `deltapack_ledger_last_reachable_timestamp_seconds` | gauge | | Unix time of this handle's last successful ledger call (0: none yet); time since = now − this |
//!
//! `schema` is the root's schema string (`deltapack-page-delta-manifest/v2`,
//! `…/v2.1`, `…/v1`) once the root was read, else `unknown` (no root, a
//! damaged or foreign one, a deadline before the root was read). A
//! publication that failed is labelled with the schema it asked for.
//!
//! **Ledger gauges are as of their last update.** Ledger queries are async
//! (and may be a PostgreSQL round trip), so the gauges are not read at
//! scrape time: they are set wherever the store learns the totals anyway —
//! a publication's budget check, an eviction plan, and
//! [`crate::Store::stats_report`] (which also sets the per-namespace bytes,
//! the accumulated counters and the free space). A scraper that wants them
//! fresh calls `stats_report` before encoding, as `deltapack stats
//! --prometheus` does.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::error::MissReason;
use crate::ledger::Totals;
use crate::stats::Stats;

/// Registers one metric (a clone of its handle, which shares the value) in
/// one line: `reg!(registry, name, help, metric)`, or with a unit,
/// `reg!(registry, name, help, Bytes, metric)`.
macro_rules! reg {
    ($r:expr, $name:expr, $help:expr, $metric:expr) => {
        $r.register($name, $help, $metric.clone())
    };
    ($r:expr, $name:expr, $help:expr, $unit:ident, $metric:expr) => {
        $r.register_with_unit($name, $help, Unit::$unit, $metric.clone())
    };
}

/// A gauge of a non-negative quantity.
type U64Gauge = Gauge<u64, AtomicU64>;

/// The `schema` label when the root was never read.
pub(crate) const UNKNOWN_SCHEMA: &str = "unknown";

/// Labels of `deltapack_restore_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestoreLabels {
    outcome: &'static str,
    reason: &'static str,
    schema: String,
}

/// Labels of `deltapack_publish_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PublishLabels {
    outcome: &'static str,
    schema: String,
}

/// Labels of `deltapack_ledger_namespace_bytes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabels {
    namespace: String,
}

/// Labels of `deltapack_ledger_accumulated`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CounterLabels {
    counter: String,
}

/// The `reason` label of a miss.
pub(crate) fn reason_label(m: &MissReason) -> &'static str {
    match m {
        MissReason::Absent => "absent",
        MissReason::Corrupt { .. } => "corrupt",
        MissReason::Incompatible { .. } => "incompatible",
        MissReason::BaseMissing { .. } => "base_missing",
        MissReason::DeadlineExceeded => "deadline",
        MissReason::Unauthenticated { .. } => "unauthenticated",
    }
}

/// The first 12 hex digits of a namespace or context, for span fields.
pub(crate) fn short_hex(hex: &str) -> &str {
    hex.get(..12).unwrap_or(hex)
}

/// Latency buckets: 1 ms doubling to ~65 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Size buckets: 4 KiB quadrupling to 16 GiB.
fn size_histogram() -> Histogram {
    Histogram::new(exponential_buckets(4096.0, 4.0, 12))
}

/// The labelled metrics, histograms and ledger gauges of one store handle
/// (the plain counters live in [`Stats`]). Every metric is a shared handle:
/// registering it in a registry registers the live value.
#[derive(Debug)]
pub(crate) struct Metrics {
    restores: Family<RestoreLabels, Counter>,
    publishes: Family<PublishLabels, Counter>,
    restore_seconds: Histogram,
    publish_seconds: Histogram,
    restore_bytes: Histogram,
    publish_bytes: Histogram,
    used_bytes: U64Gauge,
    object_bytes: U64Gauge,
    roots: U64Gauge,
    objects: U64Gauge,
    condemned_objects: U64Gauge,
    condemned_bytes: U64Gauge,
    namespace_bytes: Family<NamespaceLabels, U64Gauge>,
    accumulated: Family<CounterLabels, U64Gauge>,
    budget_bytes: U64Gauge,
    free_bytes: U64Gauge,
    ledger_fallbacks: Family<OpLabels, Counter>,
    ledger_reachable: U64Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            restores: Family::default(),
            publishes: Family::default(),
            restore_seconds: latency_histogram(),
            publish_seconds: latency_histogram(),
            restore_bytes: size_histogram(),
            publish_bytes: size_histogram(),
            used_bytes: U64Gauge::default(),
            object_bytes: U64Gauge::default(),
            roots: U64Gauge::default(),
            objects: U64Gauge::default(),
            condemned_objects: U64Gauge::default(),
            condemned_bytes: U64Gauge::default(),
            namespace_bytes: Family::default(),
            accumulated: Family::default(),
            budget_bytes: U64Gauge::default(),
            free_bytes: U64Gauge::default(),
            ledger_fallbacks: Family::default(),
            ledger_reachable: U64Gauge::default(),
        }
    }
}

impl Metrics {
    /// Counts one restore: `Ok(bytes)` a hit of that many bytes, `Err` a
    /// miss; `schema` once the root was read.
    pub(crate) fn restore(
        &self,
        seconds: f64,
        schema: Option<&str>,
        outcome: std::result::Result<u64, &MissReason>,
    ) {
        let schema = schema.unwrap_or(UNKNOWN_SCHEMA).to_string();
        let labels = match outcome {
            Ok(bytes) => {
                self.restore_bytes.observe(bytes as f64);
                RestoreLabels {
                    outcome: "hit",
                    reason: "none",
                    schema,
                }
            }
            Err(m) => RestoreLabels {
                outcome: "miss",
                reason: reason_label(m),
                schema,
            },
        };
        self.restores.get_or_create(&labels).inc();
        self.restore_seconds.observe(seconds);
    }

    /// Counts one publication: its outcome label (`error` if it failed),
    /// schema and payload bytes (`None` if it wrote nothing).
    pub(crate) fn publish(
        &self,
        seconds: f64,
        outcome: &'static str,
        schema: &str,
        bytes: Option<u64>,
    ) {
        self.publishes
            .get_or_create(&PublishLabels {
                outcome,
                schema: schema.to_string(),
            })
            .inc();
        self.publish_seconds.observe(seconds);
        if let Some(b) = bytes {
            self.publish_bytes.observe(b as f64);
        }
    }

    /// Sets the ledger gauges from totals the store just read (the
    /// per-namespace gauges only from full totals, which list them).
    pub(crate) fn ledger_totals(&self, t: &Totals, full: bool) {
        self.used_bytes.set(t.used_bytes);
        self.object_bytes.set(t.object_bytes);
        self.roots.set(t.roots);
        self.objects.set(t.objects);
        self.condemned_objects.set(t.condemned_objects);
        self.condemned_bytes.set(t.condemned_bytes);
        if full {
            self.namespace_bytes.clear();
            for (ns, b) in &t.per_namespace {
                self.namespace_bytes
                    .get_or_create(&NamespaceLabels {
                        namespace: ns.clone(),
                    })
                    .set(*b);
            }
        }
    }

    /// Sets the gauges only `stats_report` learns: counters accumulated in
    /// the ledger, the budget and the free space.
    pub(crate) fn report(
        &self,
        counters: &[(String, u64)],
        budget: Option<u64>,
        free: Option<u64>,
    ) {
        for (name, v) in counters {
            self.accumulated
                .get_or_create(&CounterLabels {
                    counter: name.clone(),
                })
                .set(*v);
        }
        if let Some(b) = budget {
            self.budget_bytes.set(b);
        }
        if let Some(f) = free {
            self.free_bytes.set(f);
        }
    }

    /// Registers every metric under the prefix `deltapack`. One line per
    /// metric (name, help, unit, handle): a table, kept as one by
    /// `rustfmt::skip`.
    #[rustfmt::skip]
    pub(crate) fn register(&self, stats: &Stats, budget: Option<u64>, local: bool, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("deltapack");
        reg!(r, "restore", "Restores by outcome, miss reason and root schema", self.restores);
        reg!(r, "publish", "Publications by outcome and root schema", self.publishes);
        reg!(r, "objects_read", "Objects fetched from the backend", stats.objects_read);
        reg!(r, "read", "Bytes fetched from the backend", Bytes, stats.bytes_read);
        reg!(r, "objects_written", "Objects created by publications", stats.objects_written);
        reg!(r, "objects_reused", "Objects a publication found already stored (content-addressed reuse)", stats.objects_reused);
        reg!(r, "written", "Bytes of objects and roots created", Bytes, stats.bytes_written);
        reg!(r, "roots_written", "Roots created", stats.roots_written);
        reg!(r, "quarantined", "Objects and roots moved to quarantine", stats.quarantined);
        reg!(r, "evictions", "Roots evicted for capacity", stats.evictions);
        reg!(r, "restore_duration", "Latency of each restore, hit or miss", Seconds, self.restore_seconds);
        reg!(r, "publish_duration", "Latency of each publication", Seconds, self.publish_seconds);
        reg!(r, "restore_size", "Bytes of each restored snapshot", Bytes, self.restore_bytes);
        reg!(r, "publish_size", "Payload bytes of each publication that wrote one", Bytes, self.publish_bytes);
        self.register_ledger(stats, budget, local, r);
    }

    /// The ledger's gauges (bytes, counts, per namespace, accumulated), the
    /// budget and free space, and the ledger's reachability. A table like
    /// `register`.
    #[rustfmt::skip]
    fn register_ledger(&self, stats: &Stats, budget: Option<u64>, local: bool, r: &mut Registry) {
        reg!(r, "ledger_used", "Bytes counted against the budget: live, condemned, roots, reserved (as of the last ledger update)", Bytes, self.used_bytes);
        reg!(r, "ledger_object", "Bytes of live objects, each counted once (as of the last ledger update)", Bytes, self.object_bytes);
        reg!(r, "ledger_condemned", "Bytes of condemned objects awaiting deletion (as of the last ledger update)", Bytes, self.condemned_bytes);
        reg!(r, "ledger_roots", "Roots in the ledger (as of the last ledger update)", self.roots);
        reg!(r, "ledger_objects", "Live objects in the ledger (as of the last ledger update)", self.objects);
        reg!(r, "ledger_condemned_objects", "Condemned objects awaiting deletion (as of the last ledger update)", self.condemned_objects);
        reg!(r, "ledger_namespace", "Physical bytes per namespace (as of the last stats report)", Bytes, self.namespace_bytes);
        reg!(r, "ledger_accumulated", "Counters accumulated in the ledger by every process that used this store (as of the last stats report)", self.accumulated);
        if let Some(b) = budget {
            self.budget_bytes.set(b);
            reg!(r, "budget", "Configured byte budget", Bytes, self.budget_bytes);
        }
        if local {
            reg!(r, "free", "Free bytes on the store's filesystem (as of the last stats report)", Bytes, self.free_bytes);
        }
        reg!(r, "ledger_fallback", "Calls answered from the store because the ledger was down, failing or too slow", self.ledger_fallbacks);
        reg!(r, "ledger_touches_dropped", "Root accesses dropped because the ledger could not take them", stats.touches_dropped);
        reg!(r, "ledger_last_reachable_timestamp_seconds", "Unix time of this handle's last successful ledger call (0: none yet)", self.ledger_reachable);
    }

    /// A call (`op`) answered without the ledger (also counted in
    /// `stats.ledger_fallbacks`).
    pub(crate) fn ledger_fallback(&self, stats: &Stats, op: &'static str) {
        self.ledger_fallbacks.get_or_create(&OpLabels { op }).inc();
        stats.ledger_fallbacks.inc();
    }

    /// A ledger call succeeded now.
    pub(crate) fn ledger_reached(&self) {
        self.ledger_reachable.set(unix_now());
    }

    /// What the ledger calls after each call that succeeded: sets the
    /// "last reachable" gauge (shared with this registry's).
    pub(crate) fn ledger_reached_hook(&self) -> Box<dyn Fn() + Send + Sync> {
        let gauge = self.ledger_reachable.clone();
        Box::new(move || {
            gauge.set(unix_now());
        })
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

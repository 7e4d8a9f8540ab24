//! The `layers` suite's report: the medians of every measure
//! ([`Measure`]), the targets of each store ([`verdicts`]), `results.json`
//! and `results.md`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use crate::job::Acc;
use crate::report::{markdown_table, Machine};
use crate::workload::MIB;

/// The first layer one run handed out.
#[derive(Debug, Clone, Copy, Serialize)]
struct FirstHanded {
    group: u64,
    layer: u64,
    bytes: u64,
}

impl FirstHanded {
    /// The first entry of a run's `handed` timeline.
    fn of(info: &BTreeMap<String, serde_json::Value>) -> Option<Self> {
        let h = info.get("handed")?.get(0)?;
        let n = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_u64());
        let range = h.get("range")?;
        Some(FirstHanded {
            group: n(h, "group")?,
            layer: n(h, "layer")?,
            bytes: n(range, "end")?.checked_sub(n(range, "start")?)?,
        })
    }
}

/// The medians of one measure.
#[derive(Debug, Serialize)]
pub(super) struct Measure {
    /// Scenario id.
    id: String,
    /// Median time, ms (see `job_measure`).
    median_ms: f64,
    /// Every repetition, ms.
    times_ms: Vec<f64>,
    /// The child's `VmHWM` above its RSS at start, largest of the runs.
    peak_bytes: u64,
    /// The timed section's peak above its own start, largest of the runs.
    timed_peak_bytes: u64,
    /// Median CPU time of the timed section, ms.
    cpu_ms: Option<f64>,
    /// Median other load, cores.
    others_cores: Option<f64>,
    /// Median time to the first handed-out layer, ms (layer API rows).
    first_layer_ms: Option<f64>,
    /// The first layer the last run handed out.
    first_handed: Option<FirstHanded>,
    /// Median time to the first layer of the order asked for (layer 0 of
    /// group 0), ms (layer API rows).
    first_in_order_ms: Option<f64>,
    /// Median time to the last handed-out layer, ms (layer API rows).
    last_layer_ms: Option<f64>,
    /// Median time the consumer spent copying, ms (consumer rows).
    consumer_copy_ms: Option<f64>,
    /// Median time the consumer spent waiting for its rate, ms.
    consumer_wait_ms: Option<f64>,
    /// Layers handed out (layer API rows).
    layers: Option<u64>,
    /// Of those, proven by their own stream digest.
    layers_own_digest: Option<u64>,
    /// The last run's full figures (per-layer timeline, counters).
    last_run: BTreeMap<String, serde_json::Value>,
}

impl Measure {
    /// The measure of the runs `acc` collected under `id`.
    fn of((id, acc): &(String, Acc)) -> Self {
        let timed_peak = acc
            .infos
            .iter()
            .filter_map(|i| i.get("timed_peak_bytes").and_then(|v| v.as_u64()))
            .max()
            .unwrap_or(0);
        let count = |k: &str| acc.info.get(k).and_then(|v| v.as_u64());
        Measure {
            id: id.clone(),
            median_ms: acc.median(),
            times_ms: acc.times.clone(),
            peak_bytes: acc.peak.saturating_sub(acc.baseline),
            timed_peak_bytes: timed_peak,
            cpu_ms: acc.info_median("cpu_ms"),
            others_cores: acc.info_median("others_cores"),
            first_layer_ms: acc.info_median("first_layer_ms"),
            first_handed: FirstHanded::of(&acc.info),
            first_in_order_ms: acc.info_median("first_in_order_ms"),
            last_layer_ms: acc.info_median("last_layer_ms"),
            consumer_copy_ms: acc.info_median("consumer_copy_ms"),
            consumer_wait_ms: acc.info_median("consumer_wait_ms"),
            layers: count("layers"),
            layers_own_digest: count("layers_own_digest"),
            last_run: acc.info.clone(),
        }
    }
}

/// One store's measures and verdicts.
#[derive(Debug, Serialize)]
pub(super) struct StoreRow {
    /// `local`, `s3like` or `shaped`.
    store: String,
    /// One request's latency on this store, ms (0 for local disk).
    request_latency_ms: f64,
    /// `restore_into` (the baseline).
    restore_into: Measure,
    /// The layer API without a consumer.
    layers: Measure,
    /// The layer API with the consumer in its callback.
    layers_consumer: Measure,
    /// The consumer alone.
    consumer_alone: Measure,
    /// The targets.
    verdicts: Vec<Verdict>,
}

impl StoreRow {
    /// The row of one store from its four measures' runs (in
    /// [`crate::job::LayersMode::ALL`]'s order) and today's memory bound.
    pub(super) fn new(
        store: &str,
        request_latency_ms: f64,
        [into, layers, with, alone]: &[(String, Acc); 4],
        bound: u64,
    ) -> Self {
        let (into, layers) = (Measure::of(into), Measure::of(layers));
        let (with, alone) = (Measure::of(with), Measure::of(alone));
        let inputs = Inputs {
            restore_into_ms: into.median_ms,
            first_layer_ms: layers.first_layer_ms.unwrap_or(f64::NAN),
            first_in_order_ms: layers.first_in_order_ms.unwrap_or(f64::NAN),
            layers_done_ms: layers.median_ms,
            with_consumer_ms: with.median_ms,
            consumer_alone_ms: alone.median_ms,
            layers: layers.layers.unwrap_or(0),
            request_latency_ms,
            peak_restore_into: into.peak_bytes,
            peak_layers: layers.peak_bytes,
            memory_bound: bound,
        };
        StoreRow {
            store: store.into(),
            request_latency_ms,
            verdicts: verdicts(&inputs),
            restore_into: into,
            layers,
            layers_consumer: with,
            consumer_alone: alone,
        }
    }

    /// The largest median other load of the store's measures, cores.
    fn other_load(&self) -> Option<f64> {
        [
            &self.restore_into,
            &self.layers,
            &self.layers_consumer,
            &self.consumer_alone,
        ]
        .iter()
        .filter_map(|m| m.others_cores)
        .reduce(f64::max)
    }
}

/// What the verdicts of one store are computed from (medians, ms; peaks,
/// bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inputs {
    /// `restore_into`.
    pub(crate) restore_into_ms: f64,
    /// The layer API's first handed-out layer.
    pub(crate) first_layer_ms: f64,
    /// The layer API's layer 0 of group 0 (the first of the order asked
    /// for).
    pub(crate) first_in_order_ms: f64,
    /// The layer API's outcome (every layer out, the snapshot verified).
    pub(crate) layers_done_ms: f64,
    /// The layer API with the consumer in its callback, to the outcome.
    pub(crate) with_consumer_ms: f64,
    /// The consumer alone.
    pub(crate) consumer_alone_ms: f64,
    /// Layers (streams) handed out.
    pub(crate) layers: u64,
    /// One request's latency of the store.
    pub(crate) request_latency_ms: f64,
    /// `restore_into`'s peak above the child's start.
    pub(crate) peak_restore_into: u64,
    /// The layer API's peak above the child's start.
    pub(crate) peak_layers: u64,
    /// Today's restore bound: result + 5 × M.
    pub(crate) memory_bound: u64,
}

/// One target of one store.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Verdict {
    /// Short name.
    pub(crate) name: &'static str,
    /// One of the issue's targets (`false`: the same check on another
    /// figure, reported beside them).
    pub(crate) issue_target: bool,
    /// The exact condition checked.
    pub(crate) formula: String,
    /// The ratio compared with `target`.
    pub(crate) ratio: f64,
    /// The ratio's bound.
    pub(crate) target: f64,
    /// `ratio ≤ target`.
    pub(crate) met: bool,
    /// How far over the target, as a fraction of it (0 when met).
    pub(crate) miss_by: f64,
    /// Other figures of the verdict (what was compared).
    pub(crate) detail: String,
}

/// A verdict `ratio ≤ target` (an issue target).
fn verdict(
    name: &'static str,
    formula: String,
    ratio: f64,
    target: f64,
    detail: String,
) -> Verdict {
    let met = ratio <= target;
    Verdict {
        name,
        issue_target: true,
        formula,
        ratio,
        target,
        met,
        miss_by: if met || !ratio.is_finite() {
            0.0
        } else {
            ratio / target - 1.0
        },
        detail,
    }
}

/// The first-layer check of a layer handed out `at_ms` after the call:
/// `at ≤ 1.5 × (restore_into ÷ layers) + latency`.
fn first_layer(name: &'static str, what: &str, at_ms: f64, m: &Inputs) -> Verdict {
    let per_layer = m.restore_into_ms / m.layers.max(1) as f64;
    let budget = 1.5 * per_layer + m.request_latency_ms;
    verdict(
        name,
        format!(
            "{what} ≤ 1.5 × (restore_into ÷ layers) + one request latency, \
             i.e. ({what} − latency) ÷ (restore_into ÷ layers) ≤ 1.5"
        ),
        (at_ms - m.request_latency_ms) / per_layer,
        1.5,
        format!(
            "{what} {at_ms:.1} ms, budget {budget:.1} ms = 1.5 × {per_layer:.1} ms + {} ms \
             ({} layers); {what} ÷ (restore_into ÷ layers + latency) = {:.2}",
            m.request_latency_ms,
            m.layers,
            at_ms / (per_layer + m.request_latency_ms)
        ),
    )
}

/// The targets of one store.
///
/// 1. `first-layer`: first ≤ 1.5 × (restore_into ÷ layers) + latency, as
///    the ratio (first − latency) ÷ (restore_into ÷ layers) ≤ 1.5; the
///    detail also gives first ÷ (restore_into ÷ layers + latency).
/// 2. `layer-0` (not an issue target): the same check for layer 0 of
///    group 0, the first layer of the order asked for.
/// 3. `overlap`: with consumer ÷ max(layer API alone, consumer alone)
///    ≤ 1.15.
/// 4. `all-layers`: the layer API's outcome ÷ restore_into ≤ 1.05.
/// 5. `memory`: the layer API's peak ÷ today's restore bound ≤ 1 (the
///    detail gives its ratio to restore_into's peak).
pub(crate) fn verdicts(m: &Inputs) -> Vec<Verdict> {
    let slowest = m.layers_done_ms.max(m.consumer_alone_ms);
    let mib = |b: u64| b as f64 / MIB as f64;
    vec![
        first_layer("first-layer", "first", m.first_layer_ms, m),
        Verdict {
            issue_target: false,
            ..first_layer("layer-0", "layer 0", m.first_in_order_ms, m)
        },
        verdict(
            "overlap",
            "(restore + consumer) ÷ max(restore alone, consumer alone) ≤ 1.15".into(),
            m.with_consumer_ms / slowest,
            1.15,
            format!(
                "{:.1} ms with the consumer; layer API alone {:.1} ms, consumer alone {:.1} ms",
                m.with_consumer_ms, m.layers_done_ms, m.consumer_alone_ms
            ),
        ),
        verdict(
            "all-layers",
            "layer API (outcome) ÷ restore_into ≤ 1.05".into(),
            m.layers_done_ms / m.restore_into_ms,
            1.05,
            format!("{:.1} ms vs {:.1} ms", m.layers_done_ms, m.restore_into_ms),
        ),
        verdict(
            "memory",
            "layer API peak ÷ today's restore bound (result + 5 × M) ≤ 1".into(),
            m.peak_layers as f64 / m.memory_bound.max(1) as f64,
            1.0,
            format!(
                "{:.0} MiB ≤ {:.0} MiB; restore_into {:.0} MiB (layer API ÷ restore_into = {:.3})",
                mib(m.peak_layers),
                mib(m.memory_bound),
                mib(m.peak_restore_into),
                m.peak_layers as f64 / m.peak_restore_into.max(1) as f64
            ),
        ),
    ]
}

/// Everything `results.json` holds.
#[derive(Debug, Serialize)]
pub(super) struct Results {
    /// `--scale`.
    pub(super) scale: f64,
    /// Tokens of the result.
    pub(super) result_tokens: u64,
    /// Bytes of the result (its encoding).
    pub(super) result_bytes: u64,
    /// Payload bytes of the flat root.
    pub(super) payload_bytes: u64,
    /// Extent size M.
    pub(super) extent_bytes: u64,
    /// Extents of the flat root.
    pub(super) objects: u64,
    /// The root's schema (`…/v2.2` records the stream digests).
    pub(super) schema: String,
    /// `--repeats`.
    pub(super) repeats: u32,
    /// `--consumer-gbps`.
    pub(super) consumer_gbps: f64,
    /// The S3-like emulation's latency per GET.
    pub(super) s3like_latency_ms: u64,
    /// The shaped emulation's parameters.
    pub(super) shaping: String,
    /// Today's restore bound above the child's start: result + 5 × M.
    pub(super) memory_bound_bytes: u64,
    /// Per store.
    pub(super) stores: Vec<StoreRow>,
    /// The machine.
    pub(super) machine: Option<Machine>,
    /// Wall time of the suite, s.
    pub(super) total_s: f64,
}

/// The head of the measures table.
const MEASURES_HEAD: &str = "\
| store | restore_into | layer API: first layer | layer 0 | last layer | outcome | with consumer | consumer alone (copy / wait) | peak restore_into | peak layer API | peak with consumer | other load |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

/// The head of the targets table.
const TARGETS_HEAD: &str = "\
| store | target | ratio | bound | met | miss by | measured |
|---|---|---:|---:|---|---:|---|";

/// What results.md says the suite measured (its top).
fn explanation(r: &Results) -> String {
    let mib = |b: u64| format!("{:.0} MiB", b as f64 / MIB as f64);
    let layers = r.stores.first().and_then(|s| s.layers.layers).unwrap_or(0);
    let own = r
        .stores
        .iter()
        .filter_map(|s| s.layers.layers_own_digest)
        .min()
        .unwrap_or(0);
    format!(
        "# Layer-wise restore: first layer, overlap with a consumer, memory\n\n\
         What was measured: the workload's result ({} tokens, {:.1} MB, {layers} layer \
         streams) published flat ({}, {} extents of {} MiB), restored on three stores — \
         local disk (page cache warm), the S3-like emulation ({} ms per GET) and the \
         shaped S3 emulation ({}) — each measure in its own child process, round-robin \
         per store, median of {}. Every child first restores once, untimed and unshaped, \
         through the API it times.\n\n\
         * **restore_into**: `Store::restore_into` a resident caller buffer (today's \
           restore; the baseline).\n\
         * **layer API**: `Store::restore_layers_with` (default layer-major order) into \
           the same kind of buffer, with a callback that only notes the time: *first \
           layer* and *last layer* are when the callback was called for the first and the \
           last time (in brackets: which layer came first, group/layer, and its size), \
           *layer 0* when it was called for layer 0 of group 0 (the first of the order \
           asked for, which need not be the first handed out), *outcome* when the call \
           returned (a hit with the root's digest; the buffer is hashed afterwards). \
           {own} of {layers} layers were proven by their own stream digest (the rest, if \
           any, after the whole snapshot).\n\
         * **with consumer**: the same, the callback copying each layer into a second \
           resident buffer and pacing so that it never exceeds {} GB/s since its first \
           byte (a PCIe 5 upload); time to the outcome. **consumer alone**: that paced \
           copy of every layer from an already-restored buffer (copy / wait: the median \
           time spent copying and waiting for the rate).\n\
         * **peak**: the child's VmHWM above its RSS at start (its buffers — the \
           caller's, and the consumer's where there is one — plus the timed section), \
           largest of the runs; in brackets, MiB the timed section added above its own \
           start (`VmHWM` is reset after the untimed restore).\n\
         * **other load**: the largest median, over the store's four measures, of the \
           cores other processes kept busy during the timed section.\n\n\
         Targets: first layer ≤ 1.5 × (restore_into ÷ layers) + one request latency of \
         the store (0 locally), reported as (first − latency) ÷ (restore_into ÷ layers) \
         ≤ 1.5 (`layer-0`, not an issue target, applies the same formula to layer 0 of \
         group 0); (restore + consumer) ÷ max(layer API alone, consumer alone) ≤ 1.15; \
         layer API outcome ÷ restore_into ≤ 1.05; layer API peak within today's restore \
         bound (base + result + 5 × M; the root is flat, so no base): {}. *Miss by* is \
         how far the ratio is over its bound.\n\n",
        r.result_tokens,
        r.result_bytes as f64 / 1e6,
        r.schema,
        r.objects,
        r.extent_bytes / MIB,
        r.s3like_latency_ms,
        r.shaping,
        r.repeats,
        r.consumer_gbps,
        mib(r.memory_bound_bytes),
    )
}

/// Writes results.json and results.md.
pub(super) fn report(out: &Path, r: &Results) -> Result<()> {
    let mib = |b: u64| format!("{:.0} MiB", b as f64 / MIB as f64);
    let t = |x: Option<f64>| x.map_or(String::new(), |x| format!("{x:.1}"));
    let peak = |m: &Measure| {
        format!(
            "{} (+{:.1})",
            mib(m.peak_bytes),
            m.timed_peak_bytes as f64 / MIB as f64
        )
    };
    let mut md = explanation(r);
    md.push_str("## Measures (median, ms)\n\n");
    md.push_str(&markdown_table(MEASURES_HEAD, &r.stores, |s| {
        let first = match s.layers.first_handed {
            Some(f) => format!(
                "{} (g{} l{}, {:.1} MB)",
                t(s.layers.first_layer_ms),
                f.group,
                f.layer,
                f.bytes as f64 / 1e6
            ),
            None => t(s.layers.first_layer_ms),
        };
        vec![
            s.store.clone(),
            format!("{:.1}", s.restore_into.median_ms),
            first,
            t(s.layers.first_in_order_ms),
            t(s.layers.last_layer_ms),
            format!("{:.1}", s.layers.median_ms),
            format!("{:.1}", s.layers_consumer.median_ms),
            format!(
                "{:.1} ({} / {})",
                s.consumer_alone.median_ms,
                t(s.consumer_alone.consumer_copy_ms),
                t(s.consumer_alone.consumer_wait_ms)
            ),
            peak(&s.restore_into),
            peak(&s.layers),
            peak(&s.layers_consumer),
            s.other_load().map_or(String::new(), |x| format!("{x:.2}")),
        ]
    }));
    md.push_str("\n## Targets\n\n");
    let rows: Vec<(&StoreRow, &Verdict)> = r
        .stores
        .iter()
        .flat_map(|s| s.verdicts.iter().map(move |v| (s, v)))
        .collect();
    md.push_str(&markdown_table(TARGETS_HEAD, rows, |(s, v)| {
        vec![
            s.store.clone(),
            if v.issue_target {
                v.name.to_string()
            } else {
                format!("{} (extra)", v.name)
            },
            format!("{:.3}", v.ratio),
            format!("≤ {}", v.target),
            if v.met { "pass" } else { "**miss**" }.to_string(),
            if v.met {
                String::new()
            } else {
                format!("{:+.0} %", v.miss_by * 100.0)
            },
            v.detail.clone(),
        ]
    }));
    if let Some(m) = &r.machine {
        md.push_str(&format!(
            "\nMachine: {} cores ({}), {:.1} GiB, kernel {}; load {} → {}. Total {:.0} s.\n",
            m.nproc,
            m.cpu_model,
            m.mem_total_bytes as f64 / (1u64 << 30) as f64,
            m.kernel,
            m.loadavg_start,
            m.loadavg_end,
            r.total_s
        ));
    }
    crate::scenarios::write_study(out, r, &md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> Inputs {
        Inputs {
            restore_into_ms: 700.0,
            first_layer_ms: 50.0,
            first_in_order_ms: 100.0,
            layers_done_ms: 720.0,
            with_consumer_ms: 800.0,
            consumer_alone_ms: 400.0,
            layers: 28,
            request_latency_ms: 20.0,
            peak_restore_into: 1600 * MIB,
            peak_layers: 1610 * MIB,
            memory_bound: 1900 * MIB,
        }
    }

    #[test]
    fn verdicts_follow_the_formulas() {
        let v = verdicts(&inputs());
        let names: Vec<&str> = v.iter().map(|v| v.name).collect();
        assert_eq!(
            names,
            ["first-layer", "layer-0", "overlap", "all-layers", "memory"]
        );
        assert!(!v[1].issue_target && v.iter().filter(|v| v.issue_target).count() == 4);
        // Layer 0 at 100 ms: (100 − 20) / 25 = 3.2, over the 57.5 ms budget.
        assert!((v[1].ratio - 3.2).abs() < 1e-9 && !v[1].met);
        let v: Vec<Verdict> = v.into_iter().filter(|v| v.issue_target).collect();
        // Budget 1.5 × 25 + 20 = 57.5 ms; (50 − 20) / 25 = 1.2.
        assert!((v[0].ratio - 1.2).abs() < 1e-9);
        assert!(v[0].met && v[0].miss_by == 0.0);
        assert!(v[0].detail.contains("budget 57.5 ms"), "{}", v[0].detail);
        // 800 / max(720, 400).
        assert!((v[1].ratio - 800.0 / 720.0).abs() < 1e-9);
        assert!(v[1].met);
        assert!((v[2].ratio - 720.0 / 700.0).abs() < 1e-9);
        assert!(v[2].met);
        assert!(v[3].met);
    }

    #[test]
    fn misses_say_by_how_much() {
        let m = Inputs {
            first_layer_ms: 95.0,
            layers_done_ms: 840.0,
            with_consumer_ms: 1100.0,
            consumer_alone_ms: 900.0,
            peak_layers: 2000 * MIB,
            ..inputs()
        };
        let v: Vec<Verdict> = verdicts(&m)
            .into_iter()
            .filter(|v| v.issue_target)
            .collect();
        // (95 − 20) / 25 = 3.0: twice the 1.5 allowed.
        assert!(!v[0].met);
        assert!((v[0].miss_by - 1.0).abs() < 1e-9);
        // 1100 / 900 = 1.222 > 1.15.
        assert!(!v[1].met);
        assert!((v[1].ratio - 1100.0 / 900.0).abs() < 1e-9);
        // 840 / 700 = 1.2: 14 % over 1.05.
        assert!(!v[2].met);
        assert!((v[2].miss_by - (1.2 / 1.05 - 1.0)).abs() < 1e-9);
        assert!(!v[3].met);
        // Locally the latency is 0: the budget is 1.5 × the per-layer share.
        let local = Inputs {
            request_latency_ms: 0.0,
            first_layer_ms: 37.5,
            ..inputs()
        };
        let v = verdicts(&local);
        assert_eq!(v[0].name, "first-layer");
        assert!((v[0].ratio - 1.5).abs() < 1e-9 && v[0].met);
    }
}

//! report/types.rs: the report's types — [`Report`] and what it is made
//! of (scenario rows, targets, the machine, the zstd and chain sections) —
//! shared by `report/mod.rs`, `report/chain.rs` and `report/plot.rs`. A
//! leaf of the report: it never imports `report/mod.rs`, `chain.rs` or
//! `plot.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::job::Acc;
use crate::shaped::Shaping;

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Scenario {
    /// Stable identifier.
    pub(crate) id: String,
    /// Human label.
    pub(crate) label: String,
    /// `floor`, `restore` or `publish`.
    pub(crate) group: &'static str,
    /// Median time (ms).
    pub(crate) median_ms: f64,
    /// Every repetition (ms).
    pub(crate) times_ms: Vec<f64>,
    /// Bytes moved (payload).
    pub(crate) bytes: u64,
    /// bytes / median, GB/s.
    pub(crate) gb_per_s: f64,
    /// Objects read or written.
    pub(crate) objects: Option<u64>,
    /// Floor this scenario is compared with.
    pub(crate) floor_id: Option<String>,
    /// That floor's median (ms).
    pub(crate) floor_ms: Option<f64>,
    /// median / floor (1.0 = at the floor).
    pub(crate) ratio: Option<f64>,
    /// Median CPU time (all threads of the child) of the timed section (ms):
    /// unlike wall time, barely affected by other load on a shared machine.
    pub(crate) cpu_ms: Option<f64>,
    /// cpu_ms / the floor's cpu_ms (restores only).
    pub(crate) cpu_ratio: Option<f64>,
    /// Peak resident memory of the child (VmHWM, bytes).
    pub(crate) peak_bytes: Option<u64>,
    /// Resident memory when the child started.
    pub(crate) baseline_bytes: Option<u64>,
    /// Bound the peak is held against.
    pub(crate) bound_bytes: Option<u64>,
    /// Extra figures (breakdowns).
    pub(crate) info: BTreeMap<String, serde_json::Value>,
    /// Notes.
    pub(crate) note: String,
}

/// The floor a scenario row is compared with.
pub(crate) struct FloorRef<'a> {
    /// Its scenario id.
    pub(crate) id: String,
    /// Its time as compared (ms), if it ran.
    pub(crate) ms: Option<f64>,
    /// Its runs, if it ran.
    pub(crate) runs: Option<&'a Acc>,
}

/// What a scenario row is made of besides its runs (see
/// [`Scenario::from_runs`]).
pub(crate) struct Row<'a> {
    /// Stable identifier.
    pub(crate) id: String,
    /// `floor`, `restore` or `publish`.
    pub(crate) group: &'static str,
    /// Human label.
    pub(crate) label: String,
    /// Bytes moved.
    pub(crate) bytes: u64,
    /// Objects read or written.
    pub(crate) objects: Option<u64>,
    /// The floor it is compared with.
    pub(crate) floor: Option<FloorRef<'a>>,
    /// Whether the runs' peak memory is their own (not a floor measured in
    /// another scenario's child).
    pub(crate) own_peak: bool,
    /// Bound the peak is held against.
    pub(crate) bound_bytes: Option<u64>,
    /// Notes.
    pub(crate) note: String,
}

impl Scenario {
    /// The rows of the scenarios in `ids` that ran (have runs in `accs`),
    /// in that order: `row` describes each from its runs (`None`: not a row
    /// of this report), [`Scenario::from_runs`] makes it, with the medians
    /// of the `info_keys` figures.
    pub(crate) fn rows<'a, I: AsRef<str>>(
        ids: impl IntoIterator<Item = I>,
        accs: &'a BTreeMap<String, Acc>,
        info_keys: &[&str],
        mut row: impl FnMut(&str, &'a Acc) -> Option<Row<'a>>,
    ) -> Vec<Scenario> {
        ids.into_iter()
            .filter_map(|id| {
                let a = accs.get(id.as_ref())?;
                Some(Scenario::from_runs(row(id.as_ref(), a)?, a, info_keys))
            })
            .collect()
    }

    /// A report row from a scenario's runs: the median and every
    /// repetition, throughput, the ratio to the floor, CPU time (for a
    /// restore also its ratio to the floor's), the peak memory, and the
    /// medians of the `info_keys` figures.
    pub(crate) fn from_runs(row: Row<'_>, a: &Acc, info_keys: &[&str]) -> Scenario {
        let m = a.median();
        let mut info = BTreeMap::new();
        for k in info_keys {
            if let Some(v) = a.info_median(k) {
                info.insert(k.to_string(), serde_json::json!(v));
            }
        }
        let cpu_ms = a.info_median("cpu_ms");
        let (floor_id, floor_ms, floor_runs) = match row.floor {
            Some(f) => (Some(f.id), f.ms, f.runs),
            None => (None, None, None),
        };
        Scenario {
            id: row.id,
            label: row.label,
            group: row.group,
            median_ms: m,
            times_ms: a.times.clone(),
            bytes: row.bytes,
            gb_per_s: row.bytes as f64 / 1e6 / m,
            objects: row.objects,
            floor_id,
            floor_ms,
            ratio: floor_ms.map(|f| m / f),
            cpu_ms,
            cpu_ratio: match (row.group, cpu_ms, floor_runs) {
                ("restore", Some(c), Some(fa)) => fa.info_median("cpu_ms").map(|fc| c / fc),
                _ => None,
            },
            peak_bytes: row.own_peak.then_some(a.peak),
            baseline_bytes: row.own_peak.then_some(a.baseline),
            bound_bytes: row.bound_bytes,
            info,
            note: row.note,
        }
    }
}

/// One target of the issue.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Target {
    /// What is asked.
    pub(crate) target: String,
    /// What was measured.
    pub(crate) measured: String,
    /// Whether it is met (`None`: informational).
    pub(crate) met: Option<bool>,
}

/// Machine description.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Machine {
    /// Cores.
    pub(crate) nproc: usize,
    /// Memory.
    pub(crate) mem_total_bytes: u64,
    /// `/proc/cpuinfo`'s model name.
    pub(crate) cpu_model: String,
    /// Kernel release.
    pub(crate) kernel: String,
    /// `/proc/loadavg` at the start.
    pub(crate) loadavg_start: String,
    /// `/proc/loadavg` at the end.
    pub(crate) loadavg_end: String,
    /// Where the stores were.
    pub(crate) work_dir: String,
    /// The work dir's filesystem (and, with the zstd study, BLAKE3's speed).
    pub(crate) filesystem: String,
    /// How the store backs fresh result buffers in this run
    /// (`deltapack_store::fresh_backing`), e.g. `huge pages (auto: no free
    /// page reporting)`.
    pub(crate) fresh_buffers: String,
}

/// zstd figures for one data set and level.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ZstdRow {
    /// The data set.
    pub(crate) data: String,
    /// zstd level.
    pub(crate) level: i32,
    /// Bytes before.
    pub(crate) raw_bytes: u64,
    /// Bytes after.
    pub(crate) stored_bytes: u64,
    /// raw / stored.
    pub(crate) ratio: f64,
    /// Compression speed, one core.
    pub(crate) compress_mb_s: f64,
    /// Decompression speed, one core.
    pub(crate) decompress_mb_s: f64,
    /// Whether the library's rule (saves ≥ 1/16) would store it as zstd.
    pub(crate) stored_as_zstd: bool,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    /// The workspace version.
    pub(crate) deltapack_version: &'static str,
    /// `restore`, `publish`, `chain` or `all`.
    pub(crate) suite: String,
    /// `--scale`.
    pub(crate) scale: f64,
    /// Base tokens.
    pub(crate) base_tokens: u64,
    /// Result tokens.
    pub(crate) result_tokens: u64,
    /// Base snapshot bytes.
    pub(crate) base_bytes: u64,
    /// Result snapshot bytes.
    pub(crate) result_bytes: u64,
    /// The delta's payload bytes.
    pub(crate) payload_bytes: u64,
    /// Extent size M.
    pub(crate) extent_bytes: u64,
    /// Extents of the v2 delta.
    pub(crate) v2_extents: u64,
    /// Chunk objects of the v1 delta.
    pub(crate) v1_chunks: u64,
    /// `--repeats`.
    pub(crate) repeats: u32,
    /// `--latency-ms`.
    pub(crate) latency_ms: u64,
    /// The shaped S3 emulation's parameters, if its scenarios ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) shaped: Option<Shaping>,
    /// The real S3 server's figures, if one was used.
    pub(crate) s3: Option<serde_json::Value>,
    /// The machine.
    pub(crate) machine: Machine,
    /// Every scenario row, in report order.
    pub(crate) scenarios: Vec<Scenario>,
    /// The targets.
    pub(crate) targets: Vec<Target>,
    /// The zstd study (`all`).
    pub(crate) zstd: Vec<ZstdRow>,
    /// The chain scenario (restore cost against the number of turns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) chain: Option<ChainSummary>,
    /// Wall time of the whole run.
    pub(crate) total_s: f64,
}

/// Per-N figures of the report (medians, ms).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ChainRow {
    /// N.
    pub(crate) turns: u32,
    /// Tokens of the last turn's delta.
    pub(crate) last_turn_tokens: u64,
    /// Payload of the last turn's publication.
    pub(crate) last_payload_bytes: u64,
    /// Bytes of every object in the conversation's store.
    pub(crate) store_bytes: u64,
    /// Publication of the last turn.
    pub(crate) publish_ms: Option<f64>,
    /// Its durable write floor.
    pub(crate) floor_write_ms: Option<f64>,
    /// Restore, new buffer, local, warm.
    pub(crate) warm_ms: Option<f64>,
    /// `warm_ms` / the flat root's.
    pub(crate) warm_ratio: Option<f64>,
    /// `restore_into`, local, warm.
    pub(crate) into_ms: Option<f64>,
    /// `into_ms` / the flat root's.
    pub(crate) into_ratio: Option<f64>,
    /// Restore, S3-like.
    pub(crate) s3like_ms: Option<f64>,
    /// `s3like_ms` − the flat root's.
    pub(crate) s3like_minus_flat_ms: Option<f64>,
    /// The same in GET latencies.
    pub(crate) s3like_minus_flat_latencies: Option<f64>,
    /// Largest peak memory (VmHWM − start) of the three restores.
    pub(crate) peak_bytes: Option<u64>,
    /// `peak_bytes` / the bound.
    pub(crate) peak_over_bound: Option<f64>,
}

/// The chain part of the report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ChainSummary {
    /// Tokens of the final snapshot (every N).
    pub(crate) final_tokens: u64,
    /// Tokens per chunk.
    pub(crate) chunk_tokens: u64,
    /// Bytes of the final snapshot.
    pub(crate) result_bytes: u64,
    /// Its digest.
    pub(crate) result_digest: String,
    /// Extent size M.
    pub(crate) extent_bytes: u64,
    /// S3-like latency per GET.
    pub(crate) latency_ms: u64,
    /// result + 4 × M + M.
    pub(crate) bound_bytes: u64,
    /// The N that ran.
    pub(crate) turns: Vec<u32>,
    /// Conversation lengths asked for but not run, and why.
    pub(crate) skipped: Vec<String>,
    /// The flat root's restore, new buffer.
    pub(crate) flat_warm_ms: Option<f64>,
    /// The flat root's `restore_into`.
    pub(crate) flat_into_ms: Option<f64>,
    /// The flat root's restore, S3-like.
    pub(crate) flat_s3like_ms: Option<f64>,
    /// One row per N.
    pub(crate) rows: Vec<ChainRow>,
}

//! job.rs: the types a parent process and a child job exchange — the job
//! ([`Job`] and what its variants carry), the child's result ([`JobOutput`])
//! and the parent's collected repetitions ([`Acc`]). A leaf: it imports
//! nothing from runner, bench_one, floors, scenarios or report (only the
//! workload, the store emulations and measure.rs's units).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use deltapack_store::{Store, StoreConfig};
use serde::{Deserialize, Serialize};

use crate::measure::{median, CpuSample};
use crate::s3like::throttled_store;
use crate::shaped::{shaped_local_store, Shaper, Shaping};
use crate::workload::{open_local_with, open_store, Conversation, Fmt, Workload};

/// One unit of work for a child process.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "kebab-case")]
pub(crate) enum Job {
    /// Durable publication of the delta as v2 and v1 and the durable write
    /// floor, interleaved round by round in one process (the snapshots are
    /// synthesized once); the stores of the last round are kept.
    PublishSuite {
        /// The workload.
        w: Workload,
        /// Where the last round's v2 store is kept.
        keep_v2: PathBuf,
        /// Where the last round's v1 store is kept.
        keep_v1: PathBuf,
        /// Scratch space.
        scratch: PathBuf,
        /// Rounds.
        rounds: u32,
    },
    /// One read floor over the v2 store's extent files.
    ReadFloor {
        /// The workload.
        w: Workload,
        /// The v2 store.
        store_v2: PathBuf,
        /// Which floor.
        floor: ReadFloor,
        /// Evict the files from the page cache first.
        cold: bool,
    },
    /// One restore of the workload's delta.
    Restore {
        /// The workload.
        w: Workload,
        /// v2 or v1.
        format: Fmt,
        /// Where it reads from.
        source: Source,
        /// Restore into a caller-provided, already resident buffer
        /// (`Store::restore_into`) instead of a new one.
        #[serde(default)]
        into: bool,
    },
    /// Publication on a real S3 server (scaled workload).
    S3Publish {
        /// The workload.
        w: Workload,
        /// The v2 store's URL.
        url_v2: String,
        /// The v1 store's URL.
        url_v1: String,
    },
    /// v2 publication through the bandwidth-shaped S3 emulation (and the
    /// same in-memory sink unshaped), `rounds` rounds.
    ShapedPublish {
        /// The workload.
        w: Workload,
        /// The emulation's parameters.
        shaping: Shaping,
        /// Rounds.
        rounds: u32,
    },
    /// Deletes every object under the given S3 URLs.
    S3Cleanup {
        /// Store URLs.
        urls: Vec<String>,
    },
    /// The zstd study on one extent of the v2 store.
    Zstd {
        /// The workload.
        w: Workload,
        /// The v2 store.
        store_v2: PathBuf,
        /// Repetitions.
        repeats: u32,
    },
    /// Publication of one conversation of the chain scenario.
    ChainPublish {
        /// The job.
        spec: ChainPublishSpec,
    },
    /// One restore of the last turn of a chain scenario conversation.
    ChainRestore {
        /// The job.
        spec: ChainRestoreSpec,
    },
    /// The `layers` suite's store: the workload's result published flat
    /// (v2, no base) into a local directory.
    LayersPublish {
        /// The workload.
        w: Workload,
        /// The store's directory.
        dir: PathBuf,
    },
    /// One timed measure of the `layers` suite.
    Layers {
        /// The job.
        spec: LayersSpec,
    },
}

/// What a `layers` child measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum LayersMode {
    /// `Store::restore_into` the caller's resident buffer (the baseline).
    RestoreInto,
    /// `Store::restore_layers_with`, default order, a callback that only
    /// notes when each layer was handed out.
    Layers,
    /// The same, with a consumer in the callback: each layer copied into a
    /// second resident buffer at most at the consumer's rate.
    LayersConsumer,
    /// The consumer alone: the same paced copy of every layer, from a
    /// buffer restored before the clock starts.
    ConsumerAlone,
}

impl LayersMode {
    /// Every mode, in the order a round runs them.
    pub(crate) const ALL: [LayersMode; 4] = [
        LayersMode::RestoreInto,
        LayersMode::Layers,
        LayersMode::LayersConsumer,
        LayersMode::ConsumerAlone,
    ];

    /// The scenario id's prefix.
    pub(crate) fn prefix(self) -> &'static str {
        match self {
            LayersMode::RestoreInto => "restore-into",
            LayersMode::Layers => "layers",
            LayersMode::LayersConsumer => "layers-consumer",
            LayersMode::ConsumerAlone => "consumer-alone",
        }
    }
}

/// A `layers` measure job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LayersSpec {
    /// The workload.
    pub(crate) w: Workload,
    /// Where the restore reads from (the flat store's directory).
    pub(crate) source: Source,
    /// What is measured.
    pub(crate) mode: LayersMode,
    /// The simulated consumer's rate, bytes per second.
    pub(crate) consumer_bytes_per_s: f64,
}

/// Which read floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ReadFloor {
    /// Read + hash + copy of the payload into a resident buffer.
    Raw,
    /// The spec floor, fresh result buffer.
    Spec,
    /// The spec floor, resident result buffer.
    SpecTouched,
}

/// Where a restore reads from.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub(crate) enum Source {
    /// Local store, page cache warm.
    Warm {
        /// The store's directory.
        dir: PathBuf,
    },
    /// Local store, its files evicted from the page cache before each run.
    Cold {
        /// The store's directory.
        dir: PathBuf,
    },
    /// Local files through `object_store` with a per-GET latency.
    Throttled {
        /// The store's directory.
        dir: PathBuf,
        /// Latency per GET.
        latency_ms: u64,
    },
    /// Local files through the bandwidth-shaped S3 emulation.
    Shaped {
        /// The store's directory.
        dir: PathBuf,
        /// Latency, per-connection and aggregate caps.
        shaping: Shaping,
    },
    /// A real S3-compatible store.
    S3 {
        /// Its URL.
        url: String,
    },
}

impl Source {
    /// Opens the store this source reads.
    pub(crate) fn open(&self, config: StoreConfig) -> Result<Store> {
        Ok(self.open_probed(config)?.0)
    }

    /// Opens the store this source reads, with the shaper of a shaped one
    /// (its counters; shaping can be switched off for untimed set-up).
    pub(crate) fn open_probed(&self, config: StoreConfig) -> Result<(Store, Option<Arc<Shaper>>)> {
        Ok(match self {
            Source::Warm { dir } | Source::Cold { dir } => (open_local_with(dir, config)?, None),
            Source::Throttled { dir, latency_ms } => {
                (throttled_store(dir, *latency_ms, config)?, None)
            }
            Source::Shaped { dir, shaping } => {
                let (store, shaper) = shaped_local_store(dir, *shaping, config)?;
                (store, Some(shaper))
            }
            Source::S3 { url } => (open_store(url, config)?, None),
        })
    }
}

/// How a chain restore child reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ChainMode {
    /// `Store::restore`, local, warm page cache.
    Warm,
    /// `Store::restore_into` a resident caller buffer, local, warm.
    Into,
    /// `Store::restore` through the S3-like emulation.
    S3like,
}

impl ChainMode {
    /// The scenario id's suffix.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            ChainMode::Warm => "warm",
            ChainMode::Into => "warm-into",
            ChainMode::S3like => "s3like",
        }
    }
}

/// A chain restore job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ChainRestoreSpec {
    /// The conversation.
    pub(crate) c: Conversation,
    /// Its store.
    pub(crate) dir: PathBuf,
    /// How the child reads.
    pub(crate) mode: ChainMode,
    /// S3-like latency per GET.
    pub(crate) latency_ms: u64,
    /// Bytes of the final snapshot.
    pub(crate) result_bytes: u64,
    /// Its digest.
    pub(crate) result_digest: String,
}

/// A chain publication job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ChainPublishSpec {
    /// The conversation.
    pub(crate) c: Conversation,
    /// Where the last round's store is kept.
    pub(crate) keep: PathBuf,
    /// Scratch space.
    pub(crate) scratch: PathBuf,
    /// Rounds.
    pub(crate) rounds: u32,
}

/// What a child reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct JobOutput {
    /// Timed repetitions, milliseconds.
    pub(crate) times_ms: Vec<f64>,
    /// VmRSS when the job started.
    pub(crate) rss_start: u64,
    /// VmHWM when the job ended.
    pub(crate) peak: u64,
    /// Job-specific figures.
    pub(crate) info: BTreeMap<String, serde_json::Value>,
    /// Results of several scenarios run by one job: scenario id → runs.
    #[serde(default)]
    pub(crate) sub: BTreeMap<String, Vec<JobOutput>>,
}

impl JobOutput {
    /// Sets an info figure.
    pub(crate) fn put(&mut self, k: &str, v: impl Serialize) {
        self.info.insert(
            k.to_string(),
            serde_json::to_value(v).unwrap_or(serde_json::Value::Null),
        );
    }

    /// Adds a run of scenario `id` to the runs of several scenarios this job
    /// reports ([`JobOutput::sub`]).
    pub(crate) fn push_sub(&mut self, id: String, run: JobOutput) {
        self.sub.entry(id).or_default().push(run);
    }

    /// A numeric info figure.
    pub(crate) fn num(&self, k: &str) -> Option<f64> {
        self.info.get(k).and_then(|v| v.as_f64())
    }

    /// Adds `cpu_ms` (this process) and `others_cores` (average cores other
    /// processes kept busy) for the section since `cpu` started (see
    /// [`CpuSample::finish`]).
    pub(crate) fn record_cpu(&mut self, cpu: &CpuSample) {
        let f = cpu.finish();
        self.put("cpu_ms", f.cpu_ms);
        if let Some(cores) = f.others_cores {
            self.put("others_cores", cores);
        }
    }
}

/// Collected repetitions of one scenario.
#[derive(Debug, Default)]
pub(crate) struct Acc {
    /// Every repetition's times (ms).
    pub(crate) times: Vec<f64>,
    /// VmHWM of the run that grew the most.
    pub(crate) peak: u64,
    /// Start RSS of that run.
    pub(crate) baseline: u64,
    /// The last run's info.
    pub(crate) info: BTreeMap<String, serde_json::Value>,
    /// Every run's info.
    pub(crate) infos: Vec<BTreeMap<String, serde_json::Value>>,
}

impl Acc {
    /// Adds one run.
    pub(crate) fn add(&mut self, o: JobOutput) {
        self.times.extend(o.times_ms);
        if o.peak.saturating_sub(o.rss_start) >= self.peak.saturating_sub(self.baseline) {
            self.peak = o.peak;
            self.baseline = o.rss_start;
        }
        self.infos.push(o.info.clone());
        self.info = o.info;
    }

    /// Adds the runs of several scenarios one job reported.
    pub(crate) fn add_sub(accs: &mut BTreeMap<String, Acc>, sub: BTreeMap<String, Vec<JobOutput>>) {
        for (id, runs) in sub {
            let acc = accs.entry(id).or_default();
            for r in runs {
                acc.add(r);
            }
        }
    }

    /// The median time (ms).
    pub(crate) fn median(&self) -> f64 {
        median(&self.times)
    }

    /// Median of a numeric info field over the repetitions.
    pub(crate) fn info_median(&self, k: &str) -> Option<f64> {
        let v: Vec<f64> = self
            .infos
            .iter()
            .filter_map(|i| i.get(k).and_then(|v| v.as_f64()))
            .collect();
        (!v.is_empty()).then(|| median(&v))
    }
}

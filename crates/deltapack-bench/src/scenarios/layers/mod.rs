//! `deltapack-bench layers`: the layer-wise restore
//! (`Store::restore_layers_with`) against today's `restore_into`, on the
//! three stores of the other suites — local disk (page cache warm), the
//! S3-like emulation (a latency per GET, [`crate::s3like`]) and the
//! bandwidth-shaped S3 emulation ([`crate::shaped`]).
//!
//! The workload's result (the reference: 262,144 tokens of the `default`
//! preset, 24 full-attention and 4 recurrent layers, 28 layer streams,
//! ≈ 1.6 GB) is published flat (v2, no base) into one local directory,
//! which every store reads. Then, per store, round-robin in child
//! processes (one repetition of each per round, `--repeats` rounds, the
//! median reported), each child first restoring once, untimed and
//! unshaped, through the API it times (runtime, page cache):
//!
//! * `restore-into-<store>`: `Store::restore_into` the caller's resident
//!   buffer — the baseline;
//! * `layers-<store>`: `Store::restore_layers_with` (default order,
//!   layer-major) into the same kind of buffer, a callback that only notes
//!   when each layer was handed out: the time to the first layer, to the
//!   last one and to the outcome (which must be a hit with the root's
//!   digest; the buffer is hashed afterwards);
//! * `layers-consumer-<store>`: the same with a simulated consumer in the
//!   callback (a device upload): each layer copied into a second buffer,
//!   allocated and touched before the clock starts, then paced so that the
//!   consumer never exceeds `--consumer-gbps` since its first byte
//!   ([`child::Pacer`]);
//! * `consumer-alone-<store>`: that paced copy of every layer, in the same
//!   order, from a buffer restored before the clock starts.
//!
//! Peak memory is the child's `VmHWM` above its RSS at start, as the other
//! suites record it, with the peak reset (`clear_refs`) after the untimed
//! restore, so that it is the caller's buffers plus the timed section's.
//!
//! Targets per store ([`report::verdicts`]): first layer ≤ 1.5 ×
//! (restore_into ÷ layers) + one request latency of the store; restore +
//! consumer ≤ 1.15 × max(restore alone, consumer alone); the layer API's
//! outcome ≤ 1.05 × restore_into; the layer API's peak memory within
//! today's restore bound (result + 5 × M above the child's start). Beside
//! them, not an issue target, the first-layer check for layer 0 of group 0
//! (the first of the order asked for; the first handed out is often a
//! small recurrent layer). Results: `results.json` and `results.md` under
//! `--out`.
//!
//! Submodules: [`mod@child`] (the child jobs and the simulated consumer),
//! [`mod@report`] (medians, verdicts, the files).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};

use crate::job::{Acc, Job, LayersMode, LayersSpec, Source};
use crate::report::machine;
use crate::runner::{child, pin_exe, round_robin, set_wait_idle};
use crate::shaped::{Shaping, ShapingArgs};
use crate::workload::{Workload, MIB};

mod child;
mod report;

pub(crate) use child::{job_measure, job_publish};
use report::{report, Results, StoreRow};

/// Options of `layers`.
#[derive(Debug, clap::Args)]
pub(crate) struct LayersArgs {
    /// Workload scale: 1 is the reference (result at 262,144 tokens,
    /// ≈ 1.6 GB); F multiplies the result tokens.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Extent size M of the store (power of two).
    #[arg(long, value_name = "BYTES", default_value_t = deltapack_format::DEFAULT_MAX_EXTENT_BYTES)]
    extent_bytes: u64,
    /// Repetitions of every measure, round-robin (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=25))]
    repeats: u32,
    /// The simulated consumer's rate (a device upload), GB/s (10⁹ bytes).
    #[arg(long, value_name = "GB_S", default_value_t = 25.0)]
    consumer_gbps: f64,
    /// S3-like emulation: latency per GET, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 20)]
    latency_ms: u64,
    /// The shaped S3 emulation's options.
    #[command(flatten)]
    shaped: ShapingArgs,
    /// Before each timed child, wait up to this many seconds for the
    /// machine to be idle (as the other suites' `--wait-idle`).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    wait_idle: u64,
    /// Directory for the store (default: the temporary directory).
    #[arg(long, value_name = "DIR")]
    scratch: Option<PathBuf>,
    /// Directory for results.json and results.md.
    #[arg(long, value_name = "DIR", default_value = "benches/results/layers")]
    out: PathBuf,
}

impl LayersArgs {
    /// The consumer's rate in bytes per second, checked.
    fn consumer_bytes_per_s(&self) -> Result<f64> {
        if !(0.001..=10_000.0).contains(&self.consumer_gbps) {
            bail!(
                "--consumer-gbps must be between 0.001 and 10,000 GB/s, got {}",
                self.consumer_gbps
            );
        }
        Ok(self.consumer_gbps * 1e9)
    }
}

// ------------------------------------------------------------------ parent

/// The stores every measure runs on: name, source, one request's latency
/// (ms).
fn stores(a: &LayersArgs, dir: &Path, shaping: Shaping) -> [(&'static str, Source, u64); 3] {
    [
        (
            "local",
            Source::Warm {
                dir: dir.to_path_buf(),
            },
            0,
        ),
        (
            "s3like",
            Source::Throttled {
                dir: dir.to_path_buf(),
                latency_ms: a.latency_ms,
            },
            a.latency_ms,
        ),
        (
            "shaped",
            Source::Shaped {
                dir: dir.to_path_buf(),
                shaping,
            },
            shaping.latency_ms,
        ),
    ]
}

/// Runs `deltapack-bench layers`.
pub(crate) async fn run(a: LayersArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let w = Workload::from_scale(a.scale, a.extent_bytes)?;
    let shaping = a.shaped.shaping()?;
    let consumer = a.consumer_bytes_per_s()?;
    set_wait_idle(a.wait_idle);
    super::in_work_dir(a.scratch.as_deref(), "layers", async |work| {
        pin_exe(work)?;
        let mut mach = machine(work);
        let mut results = measure_all(&a, w, shaping, consumer, work).await?;
        mach.loadavg_end = std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
            .to_string();
        results.machine = Some(mach);
        results.total_s = started.elapsed().as_secs_f64();
        report(&a.out, &results)?;
        Ok(ExitCode::SUCCESS)
    })
    .await
}

/// Publishes the store and runs every measure; the results.
async fn measure_all(
    a: &LayersArgs,
    w: Workload,
    shaping: Shaping,
    consumer_bytes_per_s: f64,
    work: &Path,
) -> Result<Results> {
    let dir = work.join("store");
    eprintln!(
        "bench: layers at scale {} — result {} tokens, extents {} MiB, {} repetition(s), consumer {} GB/s; work dir {}",
        a.scale,
        w.result_tokens,
        w.extent_bytes / MIB,
        a.repeats,
        a.consumer_gbps,
        work.display()
    );
    let published = child(
        &Job::LayersPublish {
            w,
            dir: dir.clone(),
        },
        "layers: publish the result flat (v2)",
    )
    .await?;
    let stores = stores(a, &dir, shaping);
    let blocks: Vec<Vec<(String, Job)>> = stores
        .iter()
        .map(|(name, source, _)| {
            LayersMode::ALL
                .iter()
                .map(|&mode| {
                    let spec = LayersSpec {
                        w,
                        source: source.clone(),
                        mode,
                        consumer_bytes_per_s,
                    };
                    (format!("{}-{name}", mode.prefix()), Job::Layers { spec })
                })
                .collect()
        })
        .collect();
    let mut accs: BTreeMap<String, Acc> = BTreeMap::new();
    round_robin(&blocks, a.repeats, &mut accs).await?;

    let get = |k: &str| published.info.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let result_bytes = get("result_bytes");
    let bound = result_bytes + 5 * w.extent_bytes;
    let mut rows = Vec::new();
    for (name, _, latency_ms) in &stores {
        let mut take = |mode: LayersMode| {
            let id = format!("{}-{name}", mode.prefix());
            accs.remove(&id)
                .ok_or_else(|| anyhow!("no runs of {id}"))
                .map(|a| (id, a))
        };
        let runs = [
            take(LayersMode::RestoreInto)?,
            take(LayersMode::Layers)?,
            take(LayersMode::LayersConsumer)?,
            take(LayersMode::ConsumerAlone)?,
        ];
        rows.push(StoreRow::new(name, *latency_ms as f64, &runs, bound));
    }
    Ok(Results {
        scale: a.scale,
        result_tokens: w.result_tokens,
        result_bytes,
        payload_bytes: get("payload_bytes"),
        extent_bytes: w.extent_bytes,
        objects: get("objects"),
        schema: published
            .info
            .get("schema")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string(),
        repeats: a.repeats,
        consumer_gbps: a.consumer_gbps,
        s3like_latency_ms: a.latency_ms,
        shaping: shaping.describe(),
        memory_bound_bytes: bound,
        stores: rows,
        machine: None,
        total_s: 0.0,
    })
}

//! Child processes: every timed job runs in a fresh process of this binary
//! (`deltapack-bench bench-one --job JSON`, one JSON result line out), so
//! that its peak memory is its own `VmHWM` and no state leaks between
//! scenarios; repetitions are collected per scenario id. With
//! `DELTAPACK_BENCH_SHOW_JOBS` set, every job's command line is printed, so
//! that one job can be rerun alone (under `perf`, say; with `--keep`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::floors::{self, ReadFloor};
use crate::measure::{machine_busy_jiffies, median, proc_status};
use crate::report::{mib, secs};
use crate::scenarios::{chain, publish, restore, zstd, Source};
use crate::shaped::Shaping;
use crate::workload::{Fmt, Workload};
use crate::BenchOneArgs;

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
        spec: chain::PublishSpec,
    },
    /// One restore of the last turn of a chain scenario conversation.
    ChainRestore {
        /// The job.
        spec: chain::RestoreSpec,
    },
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

    /// A numeric info figure.
    pub(crate) fn num(&self, k: &str) -> Option<f64> {
        self.info.get(k).and_then(|v| v.as_f64())
    }
}

/// Runs `deltapack-bench bench-one`: one job, its result as one JSON line.
pub(crate) async fn run_one(args: BenchOneArgs) -> Result<ExitCode> {
    let job: Job = serde_json::from_str(&args.job).context("bench-one: bad --job JSON")?;
    let rss_start = proc_status("VmRSS");
    let mut out = match job {
        Job::PublishSuite {
            w,
            keep_v2,
            keep_v1,
            scratch,
            rounds,
        } => publish::job_publish_suite(w, &keep_v2, &keep_v1, &scratch, rounds).await?,
        Job::ReadFloor {
            w,
            store_v2,
            floor,
            cold,
        } => floors::job_read_floor(w, &store_v2, floor, cold).await?,
        Job::Restore {
            w,
            format,
            source,
            into,
        } => restore::job_restore(w, format, source, into).await?,
        Job::S3Publish { w, url_v2, url_v1 } => {
            publish::job_s3_publish(w, &url_v2, &url_v1).await?
        }
        Job::S3Cleanup { urls } => publish::job_s3_cleanup(&urls).await?,
        Job::ShapedPublish { w, shaping, rounds } => {
            publish::job_shaped_publish(w, shaping, rounds).await?
        }
        Job::Zstd {
            w,
            store_v2,
            repeats,
        } => zstd::job_zstd(w, &store_v2, repeats).await?,
        Job::ChainPublish { spec } => chain::job_publish(spec).await?,
        Job::ChainRestore { spec } => chain::job_restore(spec).await?,
    };
    out.rss_start = rss_start;
    out.peak = proc_status("VmHWM");
    println!("{}", serde_json::to_string(&out)?);
    Ok(ExitCode::SUCCESS)
}

/// The binary children run: a link (or copy) of this executable in the work
/// dir, so that a `cargo build` replacing it during a long run is harmless.
static CHILD_EXE: OnceLock<PathBuf> = OnceLock::new();

/// Links (or copies) this executable into `work` for the children.
pub(crate) fn pin_exe(work: &Path) -> Result<()> {
    let exe = std::env::current_exe().context("locating the deltapack-bench binary")?;
    let pinned = work.join("deltapack-bench-child");
    if std::fs::hard_link(&exe, &pinned).is_err() {
        std::fs::copy(&exe, &pinned)
            .with_context(|| format!("copying {} to the work dir", exe.display()))?;
    }
    let _ = CHILD_EXE.set(pinned);
    Ok(())
}

/// Seconds to wait for an idle machine before each child (`--wait-idle`).
static WAIT_IDLE: AtomicU64 = AtomicU64::new(0);

/// Sets `--wait-idle`.
pub(crate) fn set_wait_idle(secs: u64) {
    WAIT_IDLE.store(secs, Ordering::Relaxed);
}

/// Waits (up to `WAIT_IDLE` seconds) until the machine's busy time over one
/// second is below 0.3 cores. Returns the busy cores last seen.
async fn wait_idle() -> f64 {
    let max = Duration::from_secs(WAIT_IDLE.load(Ordering::Relaxed));
    if max.is_zero() {
        return f64::NAN;
    }
    let start = Instant::now();
    loop {
        let (a, t) = (machine_busy_jiffies(), Instant::now());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let busy =
            machine_busy_jiffies().saturating_sub(a) as f64 / 100.0 / t.elapsed().as_secs_f64();
        if busy < 0.3 || start.elapsed() >= max {
            return busy;
        }
    }
}

/// Runs one child job and parses its result; prints a progress line on
/// stderr.
pub(crate) async fn child(job: &Job, what: &str) -> Result<JobOutput> {
    let busy_before = wait_idle().await;
    let exe = match CHILD_EXE.get() {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("locating the deltapack-bench binary")?,
    };
    let json = serde_json::to_string(job)?;
    if std::env::var_os("DELTAPACK_BENCH_SHOW_JOBS").is_some() {
        // To profile one job alone: `deltapack-bench bench-one --job '…'`
        // (with `--keep`, so that its store still exists).
        eprintln!("bench: {what}: bench-one --job '{json}'");
    }
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("bench-one")
        .arg("--job")
        .arg(json)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none()
        && std::env::var_os("DELTAPACK_TEST_S3_ENDPOINT").is_some()
    {
        cmd.env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing");
    }
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none()
    {
        cmd.env("AWS_REGION", "us-east-1");
    }
    let t = Instant::now();
    let out = cmd.output().await.context("running bench-one")?;
    if !out.status.success() {
        bail!("bench job {what} failed ({})", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow!("bench job {what} printed no result"))?;
    let r: JobOutput =
        serde_json::from_str(line).with_context(|| format!("bench job {what}: bad result"))?;
    let others: Vec<String> = std::iter::once(&r)
        .chain(r.sub.values().flatten())
        .filter_map(|o| o.num("others_cores"))
        .map(|x| format!("{x:.2}"))
        .collect();
    eprintln!(
        "bench: {what:<42} {:>10}  (child {:.1} s, peak {}, other load {} cores{})",
        r.times_ms
            .iter()
            .map(|t| secs(*t))
            .collect::<Vec<_>>()
            .join(" "),
        t.elapsed().as_secs_f64(),
        mib(r.peak),
        others.join("/"),
        if busy_before.is_nan() {
            String::new()
        } else {
            format!(", {busy_before:.2} before")
        }
    );
    Ok(r)
}

/// Runs blocks of `(scenario id, job)` round-robin: within a block, one
/// repetition of every scenario per round, `repeats` rounds, so that drift
/// on a shared machine hits every scenario of a block alike.
pub(crate) async fn round_robin(
    blocks: &[Vec<(String, Job)>],
    repeats: u32,
    accs: &mut BTreeMap<String, Acc>,
) -> Result<()> {
    for plan in blocks {
        for round in 0..repeats {
            for (id, job) in plan {
                let o = child(job, &format!("{id} [{}/{repeats}]", round + 1)).await?;
                accs.entry(id.clone()).or_default().add(o);
            }
        }
    }
    Ok(())
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

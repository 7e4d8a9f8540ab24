//! Child processes, the parent's side: every timed job runs in a fresh
//! process of this binary (`deltapack-bench bench-one --job JSON`, one JSON
//! result line out; the child's side is [`crate::bench_one`]), so that its
//! peak memory is its own `VmHWM` and no state leaks between scenarios;
//! repetitions are collected per scenario id. With
//! `DELTAPACK_BENCH_SHOW_JOBS` set, every job's command line is printed, so
//! that one job can be rerun alone (under `perf`, say; with `--keep`).
//! Imports only the job types, units and report formatting: never the
//! scenarios or floors it runs (the child dispatches to those).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::job::{Acc, Job, JobOutput};
use crate::measure::machine_busy_jiffies;
use crate::report::{mib, secs};

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

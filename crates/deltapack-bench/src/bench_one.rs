//! bench_one.rs: the hidden `bench-one` command, the child's side of
//! [`crate::runner`]: decodes one [`Job`], runs it in this process (it
//! dispatches to floors and scenarios) and prints its result as one JSON
//! line. Only main.rs imports it; nothing it dispatches to may import it
//! (jobs and results are in [`crate::job`]).

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::args::BenchOneArgs;
use crate::floors;
use crate::job::Job;
use crate::measure::proc_status;
use crate::scenarios::{chain, layers, publish, restore, zstd};

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
        Job::LayersPublish { w, dir } => layers::job_publish(w, &dir).await?,
        Job::Layers { spec } => layers::job_measure(spec).await?,
    };
    out.rss_start = rss_start;
    out.peak = proc_status("VmHWM");
    println!("{}", serde_json::to_string(&out)?);
    Ok(ExitCode::SUCCESS)
}

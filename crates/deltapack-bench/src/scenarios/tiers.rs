//! `deltapack-bench tiers`: a node-local tier in front of the
//! bandwidth-shaped S3 emulation (the `shaped` suite's parameters).
//!
//! The reference workload's result (flat) and a conversation of
//! `--chain-turns` turns ending in it are published into an origin
//! directory, which restores read through the shaped emulation. Then, with
//! medians of `--repeats`, each ratio against a measure of the same run:
//!
//! * restore from the shaped origin without a tier (today's);
//! * the first restore on a node with an empty tier (the call's time; the
//!   fill runs after it returns and is timed apart), and the second restore
//!   on that node, from its tier, against a plain local-disk restore of the
//!   same root from the same files (the tier's directory, right after);
//! * publication of the result to the shaped origin: without a tier
//!   (today's), written through a tier, and acknowledged in the tier (the
//!   upload afterwards, timed apart) against a local-disk publication.
//!
//! Targets (issue "Tiers"): first restore ≤ 1.05 × shaped; second ≤ 1.15 ×
//! local (flat and chain); write-through ≤ 1.1 × shaped publication;
//! behind ≤ 1.15 × local publication. Peak memory is reported with the
//! fill buffer (4 objects of at most one extent each). Results:
//! `results.json` and `results.md` under `--out`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use deltapack_format::{ContextDigest, Snapshot};
use deltapack_store::{RestoreIntoOutcome, Store, StoreConfig, TierAck, TierConfig};
use serde::Serialize;

use crate::measure::{median_duration as median, ms, proc_status};
use crate::shaped::{shaped_local_store, shaped_memory_store, Shaping};
use crate::workload::{
    evict, open_local_with, synth_at, touched_buffer, turn_request, warm_page_cache, Conversation,
    Fmt, Workload, MIB,
};

/// Options of `tiers`.
#[derive(Debug, clap::Args)]
pub(crate) struct TiersArgs {
    /// Size of the workload relative to the reference (1 = the 262,144-token,
    /// 1.6 GB result).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Turns of the chain measured beside the flat root.
    #[arg(long, default_value_t = 64)]
    chain_turns: u32,
    /// Extent size of the stores.
    #[arg(long, value_name = "BYTES", default_value_t = 64 * MIB)]
    extent_bytes: u64,
    /// Samples per measure (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=51))]
    repeats: u32,
    /// Latency of every request of the shaped emulation.
    #[arg(long, value_name = "MS", default_value_t = 20)]
    shaped_latency_ms: u64,
    /// Bandwidth cap of one connection.
    #[arg(long, value_name = "MB_S", default_value_t = 25.0)]
    shaped_conn_mb_s: f64,
    /// Bandwidth cap of all connections together.
    #[arg(long, value_name = "MB_S", default_value_t = 400.0)]
    shaped_aggregate_mb_s: f64,
    /// Directory for the stores (default: a temporary directory).
    #[arg(long, value_name = "DIR")]
    scratch: Option<PathBuf>,
    /// Directory for results.json and results.md.
    #[arg(long, value_name = "DIR", default_value = "benches/results/tiers")]
    out: PathBuf,
}

/// One measured row.
#[derive(Debug, Serialize)]
struct Row {
    id: String,
    median_ms: f64,
    /// Against `against`, when the row has a target.
    ratio: Option<f64>,
    against: Option<String>,
    target: Option<f64>,
    met: Option<bool>,
}

#[derive(Debug, Serialize)]
struct Results {
    result_tokens: u64,
    result_bytes: u64,
    chain_turns: u32,
    extent_bytes: u64,
    repeats: u32,
    shaping: String,
    fill_buffer_bytes: u64,
    peak_rss_bytes: u64,
    rows: Vec<Row>,
}

/// Where and how every measure runs.
#[derive(Clone, Copy)]
struct Env<'a> {
    dir: &'a Path,
    shaping: Shaping,
    config: &'a StoreConfig,
    repeats: u32,
}

/// What one restore measurement is of.
struct Subject<'a> {
    name: &'static str,
    origin: &'a Path,
    context: ContextDigest,
    len: usize,
}

pub(crate) async fn run(a: TiersArgs) -> Result<ExitCode> {
    if a.shaped_conn_mb_s <= 0.0 || a.shaped_aggregate_mb_s <= 0.0 {
        bail!("the shaped bandwidths must be positive");
    }
    let parent = a.scratch.clone().unwrap_or_else(std::env::temp_dir);
    let work = parent.join(format!(
        "deltapack-tiers-{}-{}",
        std::process::id(),
        crate::workload::unique()
    ));
    std::fs::create_dir_all(&work)?;
    let out = measure_all(&a, &work).await;
    let _ = std::fs::remove_dir_all(&work);
    out
}

/// The suite in `dir` (removed by the caller).
async fn measure_all(a: &TiersArgs, dir: &Path) -> Result<ExitCode> {
    let w = Workload::from_scale(a.scale, a.extent_bytes)?;
    let shaping = Shaping {
        latency_ms: a.shaped_latency_ms,
        conn_bytes_per_s: (a.shaped_conn_mb_s * 1e6) as u64,
        aggregate_bytes_per_s: (a.shaped_aggregate_mb_s * 1e6) as u64,
    };
    let conv = Conversation::new(a.chain_turns, &w);
    let config = conv.config();
    let result = synth_at(w.result_tokens).await?;
    let (_, rctx) = w.contexts()?;

    // The origins: the result flat, and the chain ending in it.
    let flat_dir = dir.join("origin-flat");
    open_local_with(&flat_dir, config.clone())?
        .publish(flat_result(&w, &result, rctx)?)
        .await?;
    let chain_dir = dir.join("origin-chain");
    let final_ctx = publish_chain(&chain_dir, &conv, config.clone()).await?;

    let mut rows = Vec::new();
    let env = Env {
        dir,
        shaping,
        config: &config,
        repeats: a.repeats,
    };
    for subject in [
        Subject {
            name: "flat",
            origin: &flat_dir,
            context: rctx,
            len: result.encoded().len(),
        },
        Subject {
            name: "chain",
            origin: &chain_dir,
            context: final_ctx,
            len: result.encoded().len(),
        },
    ] {
        restore_rows(&subject, &env, &mut rows).await?;
    }
    publish_rows((&w, &result, rctx), &env, &mut rows).await?;

    let results = Results {
        result_tokens: w.result_tokens,
        result_bytes: result.encoded().len() as u64,
        chain_turns: a.chain_turns,
        extent_bytes: w.extent_bytes,
        repeats: a.repeats,
        shaping: shaping.describe(),
        fill_buffer_bytes: TierConfig::new("").fill_objects_in_flight as u64 * w.extent_bytes,
        peak_rss_bytes: proc_status("VmHWM"),
        rows,
    };
    report(&a.out, &results)?;
    Ok(ExitCode::SUCCESS)
}

/// The workload's result published flat under its own context `ctx`.
fn flat_result(
    w: &Workload,
    result: &Arc<Snapshot>,
    ctx: ContextDigest,
) -> Result<deltapack_store::PublishRequest> {
    let mut req = w.request(Fmt::V2, result, None)?;
    req.context = ctx;
    Ok(req)
}

/// Publishes the conversation's turns as a chain into `dir`; the last
/// turn's context.
async fn publish_chain(
    dir: &Path,
    conv: &Conversation,
    config: StoreConfig,
) -> Result<ContextDigest> {
    let store = open_local_with(dir, config)?;
    let hasher = conv.hasher()?;
    let tokens = deltapack_format::synth::tokens(crate::workload::SEED, conv.final_tokens as usize);
    let mut prev: Option<(ContextDigest, Arc<Snapshot>)> = None;
    for b in conv.boundaries()? {
        let snap = synth_at(b).await?;
        let ctx = hasher.digest(&tokens[..b as usize]);
        store
            .publish(turn_request(&snap, ctx, prev.as_ref()))
            .await?;
        prev = Some((ctx, snap));
    }
    Ok(prev.context("a conversation has turns")?.0)
}

/// Restores `ctx` into `buf` through `store`; the time.
async fn timed_restore(store: &Store, ctx: ContextDigest, buf: &mut [u8]) -> Result<Duration> {
    let t = Instant::now();
    let out = store
        .restore_into((&Workload::identity(), ctx), buf, Default::default())
        .await?;
    let took = t.elapsed();
    if let RestoreIntoOutcome::Miss { reason } = out {
        bail!("restore missed: {reason}");
    }
    Ok(took)
}

/// The restore rows of one subject.
async fn restore_rows(s: &Subject<'_>, env: &Env<'_>, rows: &mut Vec<Row>) -> Result<()> {
    let Env {
        dir,
        shaping,
        config,
        repeats,
    } = *env;
    let mut buf = touched_buffer(s.len);
    let (plain, _) = shaped_local_store(s.origin, shaping, config.clone())?;
    let mut today = Vec::new();
    for _ in 0..repeats {
        today.push(timed_restore(&plain, s.context, &mut buf).await?);
    }
    let (mut first, mut fill) = (vec![], vec![]);
    let (mut second, mut local, mut second_cold, mut local_cold) = (vec![], vec![], vec![], vec![]);
    for i in 0..repeats {
        let tier_dir = dir.join(format!("tier-{}-{i}", s.name));
        let tiered = config.clone().with_tier(Some(TierConfig::new(format!(
            "file://{}",
            tier_dir.display()
        ))));
        let (node, _) = shaped_local_store(s.origin, shaping, tiered)?;
        first.push(timed_restore(&node, s.context, &mut buf).await?);
        let t = Instant::now();
        node.tier_settle().await;
        fill.push(t.elapsed());
        let stats = node.tier_stats().context("tier stats")?;
        if stats.fills_failed > 0 || stats.fills == 0 {
            bail!("the tier fill did not complete: {stats:?}");
        }
        // The fill wrote with direct I/O (nothing in the page cache); the
        // two restores compared start from the same cache state, warm (as
        // the committed local-disk restores) and cold.
        let files = open_local_with(&tier_dir, config.clone())?;
        for (tiered, plain, cold) in [
            (&mut second, &mut local, false),
            (&mut second_cold, &mut local_cold, true),
        ] {
            let hits = node.tier_stats().map_or(0, |t| t.hits);
            prepare(&tier_dir, cold)?;
            tiered.push(timed_restore(&node, s.context, &mut buf).await?);
            if node.tier_stats().map_or(0, |t| t.hits) != hits + 1 {
                bail!("the second restore was not served by the tier");
            }
            prepare(&tier_dir, cold)?;
            plain.push(timed_restore(&files, s.context, &mut buf).await?);
        }
        drop((node, files));
        let _ = std::fs::remove_dir_all(&tier_dir);
    }
    let (today, local) = (median(today), median(local));
    let n = s.name;
    rows.push(row(format!("restore-{n}-shaped"), today, None));
    rows.push(row(
        format!("restore-{n}-tier-first"),
        median(first),
        Some((format!("restore-{n}-shaped"), today, 1.05)),
    ));
    rows.push(row(format!("fill-{n}"), median(fill), None));
    rows.push(row(format!("restore-{n}-local"), local, None));
    rows.push(row(
        format!("restore-{n}-tier-second"),
        median(second),
        Some((format!("restore-{n}-local"), local, 1.15)),
    ));
    let local_cold = median(local_cold);
    rows.push(row(format!("restore-{n}-local-cold"), local_cold, None));
    rows.push(row(
        format!("restore-{n}-tier-second-cold"),
        median(second_cold),
        Some((format!("restore-{n}-local-cold"), local_cold, 1.15)),
    ));
    Ok(())
}

/// Puts a store's files in the page cache (`cold`: drops them from it).
fn prepare(dir: &Path, cold: bool) -> Result<()> {
    if cold {
        evict(dir)?;
    } else {
        warm_page_cache(dir)?;
    }
    Ok(())
}

/// The publication rows.
async fn publish_rows(
    (w, result, ctx): (&Workload, &Arc<Snapshot>, ContextDigest),
    env: &Env<'_>,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let Env {
        dir,
        shaping,
        config,
        repeats,
    } = *env;
    let req = || flat_result(w, result, ctx);
    let (mut today, mut through, mut behind, mut upload, mut local) =
        (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..repeats {
        let tier = |ack| {
            Some(
                TierConfig::new(format!(
                    "file://{}",
                    dir.join(format!("pt-{i}-{ack:?}")).display()
                ))
                .with_ack(ack),
            )
        };
        // Each store is dropped (its memory, its directory) before the next.
        {
            let (plain, _) = shaped_memory_store(Some(shaping), config.clone())?;
            let t = Instant::now();
            plain.publish(req()?).await?;
            today.push(t.elapsed());
        }
        {
            let with_tier = config.clone().with_tier(tier(TierAck::Origin));
            let (node, _) = shaped_memory_store(Some(shaping), with_tier)?;
            let t = Instant::now();
            node.publish(req()?).await?;
            through.push(t.elapsed());
        }
        let _ = std::fs::remove_dir_all(dir.join(format!("pt-{i}-Origin")));
        {
            let with_tier = config.clone().with_tier(tier(TierAck::Tier));
            let (node, _) = shaped_memory_store(Some(shaping), with_tier)?;
            let t = Instant::now();
            node.publish(req()?).await?;
            behind.push(t.elapsed());
            let t = Instant::now();
            let r = node.tier_upload().await?;
            if r.remaining > 0 || r.failed > 0 {
                bail!("the upload did not complete: {r:?}");
            }
            upload.push(t.elapsed());
        }
        let _ = std::fs::remove_dir_all(dir.join(format!("pt-{i}-Tier")));
        let local_dir = dir.join(format!("local-publish-{i}"));
        {
            let plain = open_local_with(&local_dir, config.clone())?;
            let t = Instant::now();
            plain.publish(req()?).await?;
            local.push(t.elapsed());
        }
        let _ = std::fs::remove_dir_all(&local_dir);
    }
    let (today, local) = (median(today), median(local));
    rows.push(row("publish-shaped".into(), today, None));
    rows.push(row(
        "publish-tier-write-through".into(),
        median(through),
        Some(("publish-shaped".into(), today, 1.1)),
    ));
    rows.push(row("publish-local".into(), local, None));
    rows.push(row(
        "publish-tier-behind".into(),
        median(behind),
        Some(("publish-local".into(), local, 1.15)),
    ));
    rows.push(row("upload-behind".into(), median(upload), None));
    Ok(())
}

fn row(id: String, d: Duration, against: Option<(String, Duration, f64)>) -> Row {
    let median_ms = ms(d);
    match against {
        None => Row {
            id,
            median_ms,
            ratio: None,
            against: None,
            target: None,
            met: None,
        },
        Some((name, base, target)) => {
            let ratio = median_ms / ms(base).max(1e-9);
            Row {
                id,
                median_ms,
                ratio: Some(ratio),
                against: Some(name),
                target: Some(target),
                met: Some(ratio <= target),
            }
        }
    }
}

/// Writes results.json and results.md.
fn report(out: &Path, r: &Results) -> Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(r)?)?;
    let mut md = format!(
        "# Tiers: a local tier in front of the shaped S3 emulation\n\n\
         Result {} tokens ({:.1} MB), a {}-turn chain ending in it, {} MiB extents, \
         median of {}. Shaped origin: {}. Fill buffer: {:.0} MiB; peak RSS {:.0} MiB.\n\n\
         | measure | median ms | ratio | against | target | met |\n|---|---:|---:|---|---:|---|\n",
        r.result_tokens,
        r.result_bytes as f64 / 1e6,
        r.chain_turns,
        r.extent_bytes / MIB,
        r.repeats,
        r.shaping,
        r.fill_buffer_bytes as f64 / MIB as f64,
        r.peak_rss_bytes as f64 / MIB as f64,
    );
    for row in &r.rows {
        md.push_str(&format!(
            "| {} | {:.1} | {} | {} | {} | {} |\n",
            row.id,
            row.median_ms,
            row.ratio.map_or("".into(), |x| format!("{x:.2}")),
            row.against.clone().unwrap_or_default(),
            row.target.map_or("".into(), |x| format!("≤ {x}")),
            row.met.map_or("", |m| if m { "yes" } else { "no" }),
        ));
    }
    std::fs::write(out.join("results.md"), md)?;
    print!("{}", std::fs::read_to_string(out.join("results.md"))?);
    Ok(())
}

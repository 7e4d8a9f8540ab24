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
//!   same root from the same files (the tier's directory), the two
//!   alternated (tier, local, local, tier) with the page cache warm, and
//!   again cold;
//! * publication of the result to the shaped origin: without a tier
//!   (today's), written through a tier, and acknowledged in the tier (the
//!   upload afterwards, timed apart) against a local-disk publication;
//! * the same four ways, one 512-token turn on the result from its new
//!   pages alone (`publish_turn`).
//!
//! Targets: first restore ≤ 1.05 × shaped; second ≤ 1.15 × local (flat and
//! chain); write-through ≤ 1.1 × shaped publication; behind ≤ 1.15 × local
//! publication (whole results and turns); a first restore and its fill
//! download ≤ 1.05 × the subject's stored bytes (flat and chain); the
//! chain's fill ≤ 2 × the flat download fill. Every measure records its peak
//! resident memory above its start; a compared row is bounded by its
//! comparison's peak plus the fill buffer (the tier's objects in flight,
//! each at most one extent, with the staging of its local write:
//! `TierConfig::fill_buffer_bytes`). Results: `results.json` and `results.md`
//! under `--out`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use deltapack_format::{ContextDigest, Snapshot};
use deltapack_store::{RestoreIntoOutcome, Store, StoreConfig, TierAck, TierConfig, TurnRequest};
use serde::Serialize;

use crate::report::markdown_table;

use crate::measure::{median_duration as median, ms, PeakWindow};
use crate::shaped::{shaped_local_store, shaped_memory_store, Shaping, ShapingArgs};
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
    /// The shaped S3 emulation's options.
    #[command(flatten)]
    shaped: ShapingArgs,
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
    /// Largest peak resident memory of the samples above their start.
    peak_bytes: u64,
    /// The row's memory bound: its comparison's peak plus the fill buffer.
    peak_bound_bytes: Option<u64>,
    peak_met: Option<bool>,
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
    turn_tokens: u64,
    rows: Vec<Row>,
    /// What a node's first restore and its fill downloaded.
    egress: Vec<Egress>,
}

/// What a node's first restore through an empty tier, and the fill after
/// it, downloaded from the shaped origin (the most of the samples),
/// against the stored bytes of every root the subject's origin holds
/// (objects and roots: what one full copy of the subject costs).
#[derive(Debug, Serialize)]
struct Egress {
    id: String,
    stored_bytes: u64,
    downloaded_bytes: u64,
    ratio: f64,
    target: Option<f64>,
    met: Option<bool>,
}

/// The samples of one measure: times, and the largest peak memory.
#[derive(Default)]
struct Samples {
    times: Vec<Duration>,
    peak: u64,
}

impl Samples {
    fn push(&mut self, (took, peak): (Duration, u64)) {
        self.times.push(took);
        self.peak = self.peak.max(peak);
    }

    fn median(&self) -> Duration {
        median(self.times.clone())
    }
}

/// Times `f` with the peak memory above its start.
async fn sampled<T>(
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<(T, (Duration, u64))> {
    let window = PeakWindow::open();
    let t = Instant::now();
    let out = f.await?;
    Ok((out, (t.elapsed(), window.peak())))
}

/// Where and how every measure runs.
#[derive(Clone, Copy)]
struct Env<'a> {
    dir: &'a Path,
    shaping: Shaping,
    config: &'a StoreConfig,
    repeats: u32,
    /// The tier's fill buffer (bytes), the memory bound's allowance.
    fill_buffer: u64,
}

/// The workload's result and its context, which the publication rows
/// publish.
#[derive(Clone, Copy)]
struct Published<'a> {
    w: &'a Workload,
    result: &'a Arc<Snapshot>,
    ctx: ContextDigest,
}

/// What one restore measurement is of.
struct Subject<'a> {
    name: &'static str,
    origin: &'a Path,
    context: ContextDigest,
    len: usize,
}

pub(crate) async fn run(a: TiersArgs) -> Result<ExitCode> {
    let shaping = a.shaped.shaping()?;
    super::in_work_dir(a.scratch.as_deref(), "tiers", async |work| {
        measure_all(&a, shaping, work).await
    })
    .await
}

/// The suite in `dir` (removed by the caller).
async fn measure_all(a: &TiersArgs, shaping: Shaping, dir: &Path) -> Result<ExitCode> {
    let w = Workload::from_scale(a.scale, a.extent_bytes)?;
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
    let mut egress = Vec::new();
    // The memory allowance: a fill's objects in flight, or a restore's
    // copies on their way into the tier, whichever bound is larger.
    let fill_buffer = TierConfig::new("").tap_buffer_bytes(w.extent_bytes);
    let env = Env {
        dir,
        shaping,
        config: &config,
        repeats: a.repeats,
        fill_buffer,
    };
    // The flat subject's fill without the restore's bytes (a download of
    // every object), which the chain's fill is compared with.
    let mut download: Option<Samples> = None;
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
        let out = restore_rows(&subject, &env, download.as_ref(), &mut rows).await?;
        egress.push(out.egress);
        if let Some(d) = out.download {
            download = Some(d);
        }
    }
    let published = Published {
        w: &w,
        result: &result,
        ctx: rctx,
    };
    publish_rows(published, &env, &mut rows).await?;
    turn_rows(published, &env, &mut rows).await?;

    let results = Results {
        result_tokens: w.result_tokens,
        result_bytes: result.encoded().len() as u64,
        chain_turns: a.chain_turns,
        extent_bytes: w.extent_bytes,
        repeats: a.repeats,
        shaping: shaping.describe(),
        fill_buffer_bytes: fill_buffer,
        turn_tokens: TURN_TOKENS,
        rows,
        egress,
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

/// Restores `ctx` into `buf` through `store`; the time and the peak
/// memory above the start.
async fn timed_restore(
    store: &Store,
    ctx: ContextDigest,
    buf: &mut [u8],
) -> Result<(Duration, u64)> {
    let (out, sample) = sampled(async {
        Ok(store
            .restore_into((&Workload::identity(), ctx), buf, Default::default())
            .await?)
    })
    .await?;
    if let RestoreIntoOutcome::Miss { reason } = out {
        bail!("restore missed: {reason}");
    }
    Ok(sample)
}

/// What [`restore_rows`] returns beside its rows.
struct RestoreOut {
    /// The first restore's and the fill's download.
    egress: Egress,
    /// For the flat subject: fills with the restore's bytes unused.
    download: Option<Samples>,
}

/// Stored bytes of every root in the origin at `dir` (objects and roots).
async fn stored_bytes(dir: &Path, config: &StoreConfig) -> Result<u64> {
    let roots = open_local_with(dir, config.clone())?.inspect(None).await?;
    Ok(roots.iter().map(|r| r.stored_bytes + r.root_bytes).sum())
}

/// A node on `origin` (shaped) with an empty tier in `tier_dir`; the fill
/// from the restore's bytes on or off.
fn node_at(
    origin: &Path,
    tier_dir: &Path,
    env: &Env<'_>,
    from_restore: bool,
) -> Result<(Store, Arc<crate::shaped::Shaper>)> {
    let mut tc = TierConfig::new(format!("file://{}", tier_dir.display()));
    tc.fill_from_restore = from_restore;
    shaped_local_store(origin, env.shaping, env.config.clone().with_tier(Some(tc)))
}

/// A first restore on `node` and its fill: the fill's time and the
/// node's peak from the restore's start, and the bytes both downloaded.
async fn first_and_fill(
    node: &Store,
    shaper: &crate::shaped::Shaper,
    ctx: ContextDigest,
    buf: &mut [u8],
    first: &mut Samples,
) -> Result<((Duration, u64), u64)> {
    let down = || {
        shaper
            .stats
            .bytes_down
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = down();
    // The first restore's own peak, and the node's peak from its start
    // until the fill it started has finished.
    let node_window = PeakWindow::open();
    first.push(timed_restore(node, ctx, buf).await?);
    let t = Instant::now();
    node.tier_settle().await;
    let fill = (t.elapsed(), node_window.peak());
    let stats = node.tier_stats().context("tier stats")?;
    if stats.fills_failed > 0 || stats.fills == 0 {
        bail!("the tier fill did not complete: {stats:?}");
    }
    Ok((fill, down() - before))
}

/// The restore rows of one subject (`download`: the flat subject's fills
/// without the restore's bytes, which a chain's fill is compared with).
async fn restore_rows(
    s: &Subject<'_>,
    env: &Env<'_>,
    download: Option<&Samples>,
    rows: &mut Vec<Row>,
) -> Result<RestoreOut> {
    let Env {
        dir,
        shaping,
        config,
        repeats,
        fill_buffer,
    } = *env;
    let mut buf = touched_buffer(s.len);
    let (plain, _) = shaped_local_store(s.origin, shaping, config.clone())?;
    let mut today = Samples::default();
    for _ in 0..repeats {
        today.push(timed_restore(&plain, s.context, &mut buf).await?);
    }
    drop(plain);
    let (mut first, mut fill) = (Samples::default(), Samples::default());
    let (mut second, mut local) = (Samples::default(), Samples::default());
    let (mut second_cold, mut local_cold) = (Samples::default(), Samples::default());
    let (mut first_download, mut fill_download) = (Samples::default(), Samples::default());
    let mut downloaded = 0u64;
    for i in 0..repeats {
        if s.name == "flat" {
            // The fill as it was: every object downloaded again.
            let tier_dir = dir.join(format!("tier-{}-{i}-download", s.name));
            let (node, shaper) = node_at(s.origin, &tier_dir, env, false)?;
            let (f, _) =
                first_and_fill(&node, &shaper, s.context, &mut buf, &mut first_download).await?;
            fill_download.push(f);
            drop(node);
            let _ = std::fs::remove_dir_all(&tier_dir);
        }
        let tier_dir = dir.join(format!("tier-{}-{i}", s.name));
        let (node, shaper) = node_at(s.origin, &tier_dir, env, true)?;
        let (f, down) = first_and_fill(&node, &shaper, s.context, &mut buf, &mut first).await?;
        fill.push(f);
        downloaded = downloaded.max(down);
        // The fill wrote with direct I/O (nothing in the page cache); the
        // two restores compared start from the same cache state, warm (as
        // the committed local-disk restores) and cold. Each pair runs in
        // both orders (tier, local, local, tier): `fadvise` drops the page
        // cache but not the kernel's directory and inode caches, so the
        // second restore after an eviction is the cheaper one (measured:
        // swapping the order swapped which side looked slower).
        let files = open_local_with(&tier_dir, config.clone())?;
        for (tiered, plain, cold) in [
            (&mut second, &mut local, false),
            (&mut second_cold, &mut local_cold, true),
        ] {
            for tier_first in [true, false, false, true] {
                prepare(&tier_dir, cold)?;
                if tier_first {
                    let hits = node.tier_stats().map_or(0, |t| t.hits);
                    tiered.push(timed_restore(&node, s.context, &mut buf).await?);
                    if node.tier_stats().map_or(0, |t| t.hits) != hits + 1 {
                        bail!("the second restore was not served by the tier");
                    }
                } else {
                    plain.push(timed_restore(&files, s.context, &mut buf).await?);
                }
            }
        }
        drop((node, files));
        let _ = std::fs::remove_dir_all(&tier_dir);
    }
    let n = s.name;
    let rows_of = Rows { fill_buffer };
    let shaped = format!("restore-{n}-shaped");
    rows.push(rows_of.plain(&shaped, &today));
    rows.push(rows_of.against(
        &format!("restore-{n}-tier-first"),
        &first,
        (&shaped, &today),
        Some(1.05),
    ));
    match download {
        // A chain's fill (its links at once) against the flat fill that
        // downloads every object: ≤ 2 ×.
        Some(d) => rows.push(rows_of.against(
            &format!("fill-{n}"),
            &fill,
            ("fill-flat-download", d),
            Some(2.0),
        )),
        None => rows.push(rows_of.against(&format!("fill-{n}"), &fill, (&shaped, &today), None)),
    }
    if s.name == "flat" {
        rows.push(rows_of.against(
            "fill-flat-download",
            &fill_download,
            (&shaped, &today),
            None,
        ));
    }
    for (cold, tiered, plain) in [("", &second, &local), ("-cold", &second_cold, &local_cold)] {
        let base = format!("restore-{n}-local{cold}");
        rows.push(rows_of.plain(&base, plain));
        rows.push(rows_of.against(
            &format!("restore-{n}-tier-second{cold}"),
            tiered,
            (&base, plain),
            Some(1.15),
        ));
    }
    let stored = stored_bytes(s.origin, config).await?;
    let ratio = downloaded as f64 / stored.max(1) as f64;
    // A flat root's objects are read whole and verified by the restore,
    // and written into the tier as they verify; a chain's first pass reads
    // the ranges the result needs without each extent's name, and keeps
    // them on the tier's disk for the fill to complete and check whole.
    let target = Some(1.05);
    Ok(RestoreOut {
        egress: Egress {
            id: format!("egress-{n}"),
            stored_bytes: stored,
            downloaded_bytes: downloaded,
            ratio,
            target,
            met: target.map(|t| ratio <= t),
        },
        download: (s.name == "flat").then_some(fill_download),
    })
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
async fn publish_rows(subject: Published<'_>, env: &Env<'_>, rows: &mut Vec<Row>) -> Result<()> {
    let Published { w, result, ctx } = subject;
    let (dir, shaping, config) = (env.dir, env.shaping, env.config);
    let req = || flat_result(w, result, ctx);
    let (mut today, mut through, mut behind) =
        (Samples::default(), Samples::default(), Samples::default());
    let (mut upload, mut local) = (Samples::default(), Samples::default());
    for i in 0..env.repeats {
        let tier = |ack| tier_at(dir, &format!("pt-{i}-{ack:?}"), ack);
        // Each store is dropped (its memory, its directory) before the next.
        {
            let (plain, _) = shaped_memory_store(Some(shaping), config.clone())?;
            today.push(sampled(async { Ok(plain.publish(req()?).await?) }).await?.1);
        }
        {
            let (node, _) = shaped_memory_store(
                Some(shaping),
                config.clone().with_tier(tier(TierAck::Origin)),
            )?;
            through.push(sampled(async { Ok(node.publish(req()?).await?) }).await?.1);
        }
        let _ = std::fs::remove_dir_all(dir.join(format!("pt-{i}-Origin")));
        {
            let (node, _) =
                shaped_memory_store(Some(shaping), config.clone().with_tier(tier(TierAck::Tier)))?;
            behind.push(sampled(async { Ok(node.publish(req()?).await?) }).await?.1);
            let (r, sample) = sampled(async { Ok(node.tier_upload().await?) }).await?;
            if r.remaining > 0 || r.failed > 0 {
                bail!("the upload did not complete: {r:?}");
            }
            upload.push(sample);
        }
        let _ = std::fs::remove_dir_all(dir.join(format!("pt-{i}-Tier")));
        let local_dir = dir.join(format!("local-publish-{i}"));
        {
            let plain = open_local_with(&local_dir, config.clone())?;
            local.push(sampled(async { Ok(plain.publish(req()?).await?) }).await?.1);
        }
        let _ = std::fs::remove_dir_all(&local_dir);
    }
    let r = Rows {
        fill_buffer: env.fill_buffer,
    };
    rows.extend(r.publications("publish", [&today, &through, &local, &behind]));
    // The shaped origin is in memory: the upload's peak includes the bytes
    // the origin keeps, so it has no bound.
    rows.push(r.plain("upload-behind", &upload));
    Ok(())
}

/// Tokens of the turn the turn rows publish on top of the result.
const TURN_TOKENS: u64 = 512;

/// A tier in `dir/name` acknowledging by `ack`.
fn tier_at(dir: &Path, name: &str, ack: TierAck) -> Option<TierConfig> {
    Some(TierConfig::new(format!("file://{}", dir.join(name).display())).with_ack(ack))
}

/// The turn rows: one [`TURN_TOKENS`]-token turn published from its new
/// pages alone (`publish_turn`) on the result, through the shaped origin
/// without a tier, written through a tier, acknowledged in the tier, and
/// into a local directory. The result is published first, untimed, the
/// same way (so a tier holds it, as on a node that published the
/// conversation so far).
async fn turn_rows(subject: Published<'_>, env: &Env<'_>, rows: &mut Vec<Row>) -> Result<()> {
    let Published { w, result, ctx } = subject;
    let (dir, shaping, config) = (env.dir, env.shaping, env.config);
    let next_tokens = w.result_tokens + TURN_TOKENS;
    let next = synth_at(next_tokens).await?;
    let id = Workload::identity();
    let tokens = deltapack_format::synth::tokens(crate::workload::SEED, next_tokens as usize);
    let next_ctx =
        deltapack_format::ContextHasher::new(id.namespace(), id.chunk_tokens)?.digest(&tokens);
    let mut samples: [Samples; 4] = Default::default();
    for i in 0..env.repeats {
        for (k, sample) in samples.iter_mut().enumerate() {
            let name = format!("turn-{i}-{k}");
            let cfg = match k {
                1 => config
                    .clone()
                    .with_tier(tier_at(dir, &name, TierAck::Origin)),
                2 => config.clone().with_tier(tier_at(dir, &name, TierAck::Tier)),
                _ => config.clone(),
            };
            let store = match k {
                3 => open_local_with(&dir.join(format!("{name}-local")), cfg)?,
                _ => shaped_memory_store(Some(shaping), cfg)?.0,
            };
            let base = store.publish(flat_result(w, result, ctx)?).await?;
            let turn = base.turn.context("a v2.2 publication returns a turn")?;
            let req = TurnRequest {
                identity: id.clone(),
                context: next_ctx,
                boundary: next_tokens,
                tail: turn.tail_of(&next)?,
            };
            let (r, s) = sampled(async { Ok(store.publish_turn(&turn, req).await?) }).await?;
            if r.outcome != deltapack_store::PublishOutcome::Created {
                bail!("the turn was not created: {:?}", r.outcome);
            }
            sample.push(s);
            if k == 2 {
                let r = store.tier_upload().await?;
                if r.remaining > 0 || r.failed > 0 {
                    bail!("the upload did not complete: {r:?}");
                }
            }
            drop(store);
            let _ = std::fs::remove_dir_all(dir.join(&name));
            let _ = std::fs::remove_dir_all(dir.join(format!("{name}-local")));
        }
    }
    let [today, through, behind, local] = &samples;
    let r = Rows {
        fill_buffer: env.fill_buffer,
    };
    rows.extend(r.publications("turn", [today, through, local, behind]));
    Ok(())
}

/// Builds rows; a row compared with another is bounded in memory by the
/// other's peak plus the fill buffer.
struct Rows {
    fill_buffer: u64,
}

impl Rows {
    /// A row without a target.
    fn plain(&self, id: &str, s: &Samples) -> Row {
        Row {
            id: id.into(),
            median_ms: ms(s.median()),
            ratio: None,
            against: None,
            target: None,
            met: None,
            peak_bytes: s.peak,
            peak_bound_bytes: None,
            peak_met: None,
        }
    }

    /// The four rows of one kind of publication (`what`): to the shaped
    /// origin, written through a tier (≤ 1.1 × shaped), locally, and
    /// acknowledged in a tier (≤ 1.15 × local).
    fn publications(
        &self,
        what: &str,
        [shaped, through, local, behind]: [&Samples; 4],
    ) -> [Row; 4] {
        let (s, l) = (format!("{what}-shaped"), format!("{what}-local"));
        [
            self.plain(&s, shaped),
            self.against(
                &format!("{what}-tier-write-through"),
                through,
                (&s, shaped),
                Some(1.1),
            ),
            self.plain(&l, local),
            self.against(
                &format!("{what}-tier-behind"),
                behind,
                (&l, local),
                Some(1.15),
            ),
        ]
    }

    /// A row compared with `base`: a time target (`None`: reported only)
    /// and the memory bound.
    fn against(
        &self,
        id: &str,
        s: &Samples,
        (name, base): (&str, &Samples),
        target: Option<f64>,
    ) -> Row {
        let median_ms = ms(s.median());
        let bound = base.peak + self.fill_buffer;
        let ratio = target.map(|_| median_ms / ms(base.median()).max(1e-9));
        Row {
            id: id.into(),
            median_ms,
            ratio,
            against: Some(name.into()),
            target,
            met: ratio.zip(target).map(|(r, t)| r <= t),
            peak_bytes: s.peak,
            peak_bound_bytes: Some(bound),
            peak_met: Some(s.peak <= bound),
        }
    }
}

/// The head of the `results.md` table.
const TABLE_HEAD: &str = "\
| measure | median ms | ratio | against | target | met | peak MiB | bound MiB | met |
|---|---:|---:|---|---:|---|---:|---:|---|";

/// The head of the egress table.
const EGRESS_HEAD: &str = "\
| subject | stored MB | downloaded MB | ratio | target | met |
|---|---:|---:|---:|---:|---|";

/// Writes results.json and results.md.
fn report(out: &Path, r: &Results) -> Result<()> {
    let mib = |b: u64| format!("{:.0}", b as f64 / MIB as f64);
    let mut md = format!(
        "# Tiers: a local tier in front of the shaped S3 emulation\n\n\
         Result {} tokens ({:.1} MB), a {}-turn chain ending in it, {} MiB extents, \
         median of {}; turns of {} tokens on the result. Shaped origin: {}. \
         Fill buffer: {} MiB. Peak memory: the largest of the samples, resident \
         memory above the measure's start (the caller's buffer is resident \
         before it); a compared row's bound is its comparison's peak plus the \
         fill buffer (`TierConfig::tap_buffer_bytes`: a fill's objects in flight \
         with their write staging, or a restore's copies on their way into the \
         tier). `fill-*` is the node from its first restore until the fill \
         finished; `fill-flat-download` the same with the restore's copies off \
         (`fill_from_restore = false`: every object downloaded again), which \
         the chain's fill is compared with. The \
         publications' shaped origin is in memory: `upload-behind`'s peak \
         includes the uploaded bytes the origin keeps.\n\n",
        r.result_tokens,
        r.result_bytes as f64 / 1e6,
        r.chain_turns,
        r.extent_bytes / MIB,
        r.repeats,
        r.turn_tokens,
        r.shaping,
        mib(r.fill_buffer_bytes),
    );
    md.push_str(&markdown_table(TABLE_HEAD, &r.rows, |row| {
        let yes = |m: Option<bool>| m.map_or("", |m| if m { "yes" } else { "no" }).to_string();
        vec![
            row.id.clone(),
            format!("{:.1}", row.median_ms),
            row.ratio.map_or("".into(), |x| format!("{x:.2}")),
            row.against.clone().unwrap_or_default(),
            row.target.map_or("".into(), |x| format!("≤ {x}")),
            yes(row.met),
            mib(row.peak_bytes),
            row.peak_bound_bytes.map_or("".into(), mib),
            yes(row.peak_met),
        ]
    }));
    md.push_str(
        "\n\nFirst-restore egress: what a node's first restore through an empty tier and \
         the fill after it downloaded from the shaped origin (the most of the samples), \
         against the stored bytes of every root of the subject (one full copy).\n\n",
    );
    md.push_str(&markdown_table(EGRESS_HEAD, &r.egress, |e| {
        vec![
            e.id.clone(),
            format!("{:.1}", e.stored_bytes as f64 / 1e6),
            format!("{:.1}", e.downloaded_bytes as f64 / 1e6),
            format!("{:.3}", e.ratio),
            e.target.map_or("".into(), |x| format!("≤ {x}")),
            e.met
                .map_or("", |m| if m { "yes" } else { "no" })
                .to_string(),
        ]
    }));
    super::write_study(out, r, &md)
}

//! `deltapack bench chain`: restore cost against the number of turns.
//!
//! A conversation is a chain of deltas: turn 1 is a flat root, turn k+1 a
//! `page-tail-cow-v1` delta against turn k. Conversations of N turns (1, 4,
//! 16, 64, and 256 where the final snapshot has at least 256 chunks) all end
//! in the *same* final snapshot — the workload's result at `--scale` — so the
//! only variable is N. Turn k ends at `round_to_chunk(k × final / N)`; every
//! turn is the workload's synthetic conversation (`synth::snapshot`, same
//! seed), so turn k+1 extends turn k: every full page of turn k is
//! byte-identical in turn k+1, only the recurrent checkpoint page differs,
//! and turn k+1's delta is ≈ 1/N of the result.
//!
//! Each conversation is published into its own fresh local store with
//! rebasing off (`ChainPolicy::unbounded()`). The N = 1 conversation is the
//! flat store every N is compared with.
//!
//! Measured per N, each repetition in a fresh child process (no base cache;
//! the store's files are read once, untimed, so the page cache is warm):
//! `Store::restore` of the last turn (new buffer), `Store::restore_into` a
//! caller buffer allocated and touched before timing, and `Store::restore`
//! through the S3-like emulation (per-GET latency over the same files); the
//! same three for the flat store. Peak memory is the child's VmHWM above its
//! RSS at start. Publication: the last turn of each conversation (a delta of
//! ≈ 1/N of the result) into a hard-linked clone of the store holding turns
//! 1..N−1, against a durable write floor of the same payload bytes measured
//! in the same child, round by round.
//!
//! Scenario ids: `chain-flat-warm`, `chain-flat-warm-into`,
//! `chain-flat-s3like`, `chain-n{N}-warm`, `chain-n{N}-warm-into`,
//! `chain-n{N}-s3like`, `chain-n{N}-floor-write`, `chain-n{N}-publish`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use deltapack_format::delta;
use deltapack_format::snapshot::digest_of_encoding;
use deltapack_format::synth::{self, Preset};
use deltapack_format::{ContextDigest, ContextHasher, Snapshot};
use deltapack_store::{
    BaseInput, ChainPolicy, PublishOutcome, PublishRequest, RestoreIntoOutcome, RestoreOptions,
    RestoreOutcome, RootFormat, RootStatus, StoreConfig,
};
use serde::{Deserialize, Serialize};

use super::{
    child, durable_write, durable_write_direct, median, mib, proc_status, reset_peak, secs,
    throttled_store, touched_buffer, Acc, BenchArgs, CpuSample, Job, JobOutput, Report, Scenario,
    Target, Workload, SEED,
};
use crate::common;

/// Conversation lengths measured by default (256 only where it fits).
pub(super) const DEFAULT_TURNS: [u32; 5] = [1, 4, 16, 64, 256];
/// Allowed slowdown of a chain restore over the flat one (local, warm).
const LOCAL_RATIO_TARGET: f64 = 1.15;
/// Allowed S3-like excess of a chain restore over the flat one, in GETs'
/// latencies.
const S3_LATENCIES_TARGET: f64 = 3.0;

/// One conversation: `turns` turns ending at `final_tokens`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(super) struct Conversation {
    turns: u32,
    final_tokens: u64,
    chunk_tokens: u64,
    extent_bytes: u64,
}

impl Conversation {
    fn new(turns: u32, w: &Workload) -> Self {
        Conversation {
            turns,
            final_tokens: w.result_tokens,
            chunk_tokens: u64::from(Workload::identity().chunk_tokens),
            extent_bytes: w.extent_bytes,
        }
    }

    /// Turn boundaries: turn k ends at `round_to_chunk(k × final / N)`, the
    /// last turn at `final`. Fails unless they strictly increase.
    fn boundaries(&self) -> Result<Vec<u64>> {
        let (n, f, c) = (u64::from(self.turns), self.final_tokens, self.chunk_tokens);
        if n == 0 || f % c != 0 {
            bail!("{n} turns of a {f}-token conversation in {c}-token chunks");
        }
        let b: Vec<u64> = (1..=n)
            .map(|k| {
                ((u128::from(k) * u128::from(f) + u128::from(n * c / 2)) / u128::from(n * c)) as u64
                    * c
            })
            .collect();
        if b[0] == 0 || b.windows(2).any(|p| p[0] >= p[1]) || b[b.len() - 1] != f {
            bail!(
                "{n} turns do not fit a {f}-token conversation ({} chunks of {c} tokens)",
                f / c
            );
        }
        Ok(b)
    }

    /// The store configuration: the workload's extents, rebasing off.
    fn config(&self) -> StoreConfig {
        StoreConfig {
            chain: ChainPolicy::unbounded(),
            max_extent_bytes: self.extent_bytes,
            ..Default::default()
        }
    }

    fn hasher(&self) -> Result<ContextHasher> {
        let id = Workload::identity();
        Ok(ContextHasher::new(id.namespace(), id.chunk_tokens)?)
    }

    fn final_context(&self) -> Result<ContextDigest> {
        let n = usize::try_from(self.final_tokens)?;
        Ok(self.hasher()?.digest(&synth::tokens(SEED, n)))
    }
}

/// How a chain restore child reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Mode {
    /// `Store::restore`, local, warm page cache.
    Warm,
    /// `Store::restore_into` a resident caller buffer, local, warm.
    Into,
    /// `Store::restore` through the S3-like emulation.
    S3like,
}

impl Mode {
    fn suffix(self) -> &'static str {
        match self {
            Mode::Warm => "warm",
            Mode::Into => "warm-into",
            Mode::S3like => "s3like",
        }
    }
}

/// A chain restore job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct RestoreSpec {
    c: Conversation,
    dir: PathBuf,
    mode: Mode,
    latency_ms: u64,
    result_bytes: u64,
    result_digest: String,
}

/// A chain publication job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct PublishSpec {
    c: Conversation,
    keep: PathBuf,
    scratch: PathBuf,
    rounds: u32,
}

/// Per-N figures of the report (medians, ms).
#[derive(Debug, Clone, Serialize)]
pub(super) struct ChainRow {
    turns: u32,
    /// Tokens of the last turn's delta.
    last_turn_tokens: u64,
    /// Payload of the last turn's publication.
    last_payload_bytes: u64,
    /// Bytes of every object in the conversation's store.
    store_bytes: u64,
    publish_ms: Option<f64>,
    floor_write_ms: Option<f64>,
    warm_ms: Option<f64>,
    warm_ratio: Option<f64>,
    into_ms: Option<f64>,
    into_ratio: Option<f64>,
    s3like_ms: Option<f64>,
    s3like_minus_flat_ms: Option<f64>,
    s3like_minus_flat_latencies: Option<f64>,
    /// Largest peak memory (VmHWM − start) of the three restores.
    peak_bytes: Option<u64>,
    peak_over_bound: Option<f64>,
}

/// The chain part of the report.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ChainSummary {
    pub(super) final_tokens: u64,
    chunk_tokens: u64,
    pub(super) result_bytes: u64,
    result_digest: String,
    extent_bytes: u64,
    latency_ms: u64,
    /// result + 4 × M + M.
    bound_bytes: u64,
    pub(super) turns: Vec<u32>,
    /// Conversation lengths asked for but not run, and why.
    skipped: Vec<String>,
    flat_warm_ms: Option<f64>,
    flat_into_ms: Option<f64>,
    flat_s3like_ms: Option<f64>,
    rows: Vec<ChainRow>,
}

// ------------------------------------------------------------------ children

/// Synthesizes the conversation's snapshot at `tokens` on a blocking thread.
async fn synth_at(tokens: u64) -> Result<Arc<Snapshot>> {
    tokio::task::spawn_blocking(move || -> Result<_> {
        Ok(Arc::new(synth::snapshot(Preset::Default, SEED, tokens)?))
    })
    .await
    .context("synthesis task")?
}

/// Copies a local store for another publication of the same last turn:
/// immutable objects and roots hard-linked, everything else (the ledger)
/// copied. Falls back to copying where hard links fail.
fn clone_store(from: &FsPath, to: &FsPath) -> Result<()> {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        std::fs::create_dir_all(to.join(&rel))?;
        for entry in std::fs::read_dir(from.join(&rel))? {
            let entry = entry?;
            let r = rel.join(entry.file_name());
            let ft = entry.file_type()?;
            if ft.is_dir() {
                stack.push(r);
            } else if ft.is_file() {
                let immutable = matches!(
                    r.components().next().and_then(|c| c.as_os_str().to_str()),
                    Some("objects" | "roots")
                );
                if !(immutable && std::fs::hard_link(from.join(&r), to.join(&r)).is_ok()) {
                    std::fs::copy(from.join(&r), to.join(&r))
                        .with_context(|| format!("cloning {}", r.display()))?;
                }
            }
        }
    }
    Ok(())
}

/// Total bytes of the files under `dir/objects`.
fn objects_bytes(dir: &FsPath) -> u64 {
    let mut n = 0;
    let counted = super::for_each_file(&dir.join("objects"), |p| {
        n += std::fs::metadata(p)?.len();
        Ok(())
    });
    if counted.is_err() {
        return 0;
    }
    n
}

/// Reads every file of a store once (objects, roots, ledger), so that the
/// timed restore finds the page cache warm. Returns the bytes read.
fn warm_page_cache(dir: &FsPath) -> Result<u64> {
    use std::io::Read;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    super::for_each_file(dir, |p| {
        let mut f = std::fs::File::open(p)?;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            total += n as u64;
        }
    })?;
    Ok(total)
}

/// Deltas between the root of `ctx` and its flat root, following base
/// references.
async fn chain_depth(store: &deltapack_store::Store, mut ctx: ContextDigest) -> Result<u32> {
    let ns = Workload::identity().namespace();
    let mut depth = 0u32;
    loop {
        let summary = match store.read_root(&ns, &ctx).await? {
            RootStatus::Found(d) => d.summary().ok_or_else(|| anyhow!("unreadable root"))?,
            _ => bail!("a root of the chain is missing or unusable"),
        };
        match summary.base {
            Some(b) => {
                depth += 1;
                ctx = b.context;
            }
            None => return Ok(depth),
        }
    }
}

/// One turn's publication request.
fn request(
    snap: &Arc<Snapshot>,
    ctx: ContextDigest,
    base: Option<&(ContextDigest, Arc<Snapshot>)>,
) -> PublishRequest {
    PublishRequest {
        identity: Workload::identity(),
        context: ctx,
        snapshot: snap.clone(),
        base: base.map(|(c, s)| BaseInput {
            context: *c,
            snapshot: s.clone(),
        }),
        format: RootFormat::V2,
    }
}

/// Publishes turns 1..N−1 once, then, round by round, the durable write
/// floor of the last turn's payload and the timed publication of the last
/// turn into a clone of that store. The last round's store is kept.
pub(super) async fn job_publish(s: PublishSpec) -> Result<JobOutput> {
    let c = s.c;
    let n = c.turns;
    let bounds = c.boundaries()?;
    let tokens = synth::tokens(SEED, usize::try_from(c.final_tokens)?);
    let h = c.hasher()?;
    let ctx_at = |b: u64| h.digest(&tokens[..b as usize]);
    let prefix = s.scratch.join(format!("chain-n{n}-prefix"));
    if prefix.exists() {
        std::fs::remove_dir_all(&prefix)?;
    }
    std::fs::create_dir_all(&prefix)?;
    let t_prefix = Instant::now();
    let mut prev: Option<(ContextDigest, Arc<Snapshot>)> = None;
    {
        let store = super::open_local_with(&prefix, c.config())?;
        for (i, &b) in bounds[..bounds.len() - 1].iter().enumerate() {
            let snap = synth_at(b).await?;
            let ctx = ctx_at(b);
            let receipt = store.publish(request(&snap, ctx, prev.as_ref())).await?;
            if receipt.outcome != PublishOutcome::Created || receipt.rebased {
                bail!(
                    "turn {} of {n}: publication {:?}{}",
                    i + 1,
                    receipt.outcome,
                    if receipt.rebased { ", rebased" } else { "" }
                );
            }
            prev = Some((ctx, snap));
        }
    }
    let prefix_ms = common::ms(t_prefix.elapsed());
    let last = synth_at(c.final_tokens).await?;
    let last_ctx = ctx_at(c.final_tokens);
    let mut out = JobOutput::default();
    let mut sub: BTreeMap<String, Vec<JobOutput>> = BTreeMap::new();
    for round in 0..s.rounds {
        // The floor: the same payload bytes, cut into extent-sized files,
        // written durably (buffered one stream; direct I/O one and two).
        let (p, l, m, ct) = (
            prev.as_ref().map(|(_, s)| s.clone()),
            last.clone(),
            c.extent_bytes as usize,
            c.chunk_tokens as u32,
        );
        let chunks = tokio::task::spawn_blocking(move || -> Result<Vec<Vec<u8>>> {
            let d = match &p {
                Some(b) => delta::encode(ct, b, &l)?,
                None => l.encoded().to_vec(),
            };
            Ok(d.chunks(m).map(<[u8]>::to_vec).collect())
        })
        .await
        .context("delta encoder task")??;
        let floor_bytes: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        let dir = s.scratch.join(format!("chain-n{n}-floor-{round}"));
        let o = tokio::task::block_in_place(|| -> Result<JobOutput> {
            let mut o = JobOutput::default();
            let t = Instant::now();
            durable_write(&dir, &chunks, 1)?;
            o.times_ms.push(common::ms(t.elapsed()));
            std::fs::remove_dir_all(&dir)?;
            Ok(o)
        })?;
        sub.entry(format!("chain-n{n}-floor-write-1"))
            .or_default()
            .push(o);
        let aligned: Vec<(Vec<u8>, usize)> =
            chunks.iter().map(|c| super::aligned_copy(c)).collect();
        drop(chunks);
        for streams in [1usize, 2] {
            let o = tokio::task::block_in_place(|| -> Result<Option<JobOutput>> {
                let mut o = JobOutput::default();
                let t = Instant::now();
                let supported = durable_write_direct(&dir, &aligned, streams)?;
                o.times_ms.push(common::ms(t.elapsed()));
                std::fs::remove_dir_all(&dir)?;
                Ok(supported.then_some(o))
            })?;
            if let Some(mut o) = o {
                o.put("payload_bytes", floor_bytes);
                sub.entry(format!("chain-n{n}-floor-write-{streams}-direct"))
                    .or_default()
                    .push(o);
            }
        }
        drop(aligned);

        // The timed publication of the last turn, into a clone of the store
        // holding turns 1..N−1 (steady state: fan-out directories exist).
        let dir = s.scratch.join(format!("chain-n{n}-{round}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        clone_store(&prefix, &dir)?;
        for b in 0..=255u8 {
            std::fs::create_dir_all(dir.join("objects/blake3").join(format!("{b:02x}")))?;
        }
        for d in [dir.join("objects/blake3"), dir.join("objects")] {
            std::fs::File::open(&d)?.sync_all()?;
        }
        let store = super::open_local_with(&dir, c.config())?;
        store.ledger_totals().await?;
        let mut o = JobOutput::default();
        reset_peak();
        o.rss_start = proc_status("VmRSS");
        let cpu = CpuSample::now();
        let t = Instant::now();
        let receipt = store
            .publish(request(&last, last_ctx, prev.as_ref()))
            .await?;
        o.times_ms.push(common::ms(t.elapsed()));
        cpu.record(&mut o);
        o.peak = proc_status("VmHWM");
        if receipt.outcome != PublishOutcome::Created || receipt.rebased {
            bail!(
                "last turn of {n}: publication {:?}{}",
                receipt.outcome,
                if receipt.rebased { ", rebased" } else { "" }
            );
        }
        o.put("encode_ms", common::ms(receipt.encode_time));
        o.put("write_ms", common::ms(receipt.write_time));
        o.put("objects", receipt.objects_written);
        o.put("payload_bytes", receipt.payload_len);
        o.put("floor_payload_bytes", floor_bytes);
        // Rebasing is off: the last turn's root must lead back through
        // every turn (N − 1 deltas) to a flat root.
        let depth = chain_depth(&store, last_ctx).await?;
        if depth + 1 != n {
            bail!(
                "the last turn of {n} is {depth} deltas from its flat root, expected {}",
                n - 1
            );
        }
        o.put("root_chain_depth", depth);
        sub.entry(format!("chain-n{n}-publish"))
            .or_default()
            .push(o);
        drop(store);
        if round + 1 == s.rounds {
            if s.keep.exists() {
                std::fs::remove_dir_all(&s.keep)?;
            }
            std::fs::rename(&dir, &s.keep)?;
        } else {
            std::fs::remove_dir_all(&dir)?;
        }
    }
    std::fs::remove_dir_all(&prefix)?;
    out.sub = sub;
    out.put("turns", n);
    out.put("boundaries", &bounds);
    out.put("prefix_publish_ms", prefix_ms);
    out.put("result_bytes", last.encoded().len());
    out.put("result_digest", last.digest().to_string());
    out.put(
        "last_turn_tokens",
        c.final_tokens - bounds.len().checked_sub(2).map_or(0, |i| bounds[i]),
    );
    out.put("store_bytes", objects_bytes(&s.keep));
    Ok(out)
}

/// A fresh child restoring the last turn: no base cache, page cache warm.
pub(super) async fn job_restore(s: RestoreSpec) -> Result<JobOutput> {
    let mut out = JobOutput::default();
    let dir = s.dir.clone();
    let warmed = tokio::task::spawn_blocking(move || warm_page_cache(&dir))
        .await
        .context("page cache task")??;
    out.put("warmed_bytes", warmed);
    let store = match s.mode {
        Mode::Warm | Mode::Into => super::open_local_with(&s.dir, s.c.config())?,
        Mode::S3like => throttled_store(&s.dir, s.latency_ms, s.c.config())?,
    };
    // Untimed: open the ledger (an S3-like store rebuilds it by listing).
    store.ledger_totals().await?;
    let ns = Workload::identity().namespace();
    let ctx = s.c.final_context()?;
    let len = usize::try_from(s.result_bytes)?;
    let before = store.stats();
    if s.mode == Mode::Into {
        let mut buf = touched_buffer(len);
        let cpu = CpuSample::now();
        let t = Instant::now();
        let outcome = store
            .restore_into_with(ns, ctx, &mut buf, RestoreOptions::default())
            .await?;
        out.times_ms.push(common::ms(t.elapsed()));
        cpu.record(&mut out);
        match outcome {
            RestoreIntoOutcome::Hit { digest, .. } if digest == s.result_digest => {}
            RestoreIntoOutcome::Hit { .. } => bail!("restore_into returned the wrong snapshot"),
            RestoreIntoOutcome::Miss { reason } => bail!("restore_into missed: {reason}"),
        }
        if digest_of_encoding(&buf).to_string() != s.result_digest {
            bail!("the buffer does not hash to the snapshot digest");
        }
    } else {
        let cpu = CpuSample::now();
        let t = Instant::now();
        let outcome = store
            .restore_with(ns, ctx, RestoreOptions::default())
            .await?;
        out.times_ms.push(common::ms(t.elapsed()));
        cpu.record(&mut out);
        let r = match outcome {
            RestoreOutcome::Hit(r) => r,
            RestoreOutcome::Miss(m) => bail!("restore missed: {m}"),
        };
        if r.digest.to_string() != s.result_digest || r.snapshot.encoded().len() != len {
            bail!("restore returned the wrong snapshot");
        }
        let t = Instant::now();
        drop(r);
        out.put("drop_ms", common::ms(t.elapsed()));
    }
    let after = store.stats();
    out.put(
        "objects_read_counter",
        after.objects_read - before.objects_read,
    );
    out.put("bytes_read_counter", after.bytes_read - before.bytes_read);
    out.put("result_bytes", s.result_bytes);
    Ok(out)
}

// ------------------------------------------------------------------ parent

/// Publishes every conversation and runs the restores, round-robin; adds
/// the runs to `accs`.
pub(super) async fn run(
    args: &BenchArgs,
    w: Workload,
    work: &FsPath,
    accs: &mut BTreeMap<String, Acc>,
) -> Result<ChainSummary> {
    let repeats = args.repeats;
    let chunk = u64::from(Workload::identity().chunk_tokens);
    let chunks = w.result_tokens / chunk;
    let asked: Vec<u32> = match &args.chain_turns {
        Some(v) => v.clone(),
        None => DEFAULT_TURNS.to_vec(),
    };
    let mut turns = vec![1u32];
    let mut skipped = Vec::new();
    for &n in &asked {
        if turns.contains(&n) || n == 0 {
            continue;
        }
        if u64::from(n) > chunks {
            skipped.push(format!(
                "N = {n}: the final snapshot has {chunks} chunks of {chunk} tokens (fewer than N turn boundaries)"
            ));
            continue;
        }
        turns.push(n);
    }
    turns.sort_unstable();
    eprintln!(
        "bench: chain — final snapshot {} tokens, conversations of {:?} turns{}",
        w.result_tokens,
        turns,
        if skipped.is_empty() {
            String::new()
        } else {
            format!(" ({} skipped)", skipped.len())
        }
    );
    let scratch = work.join("chain-scratch");
    std::fs::create_dir_all(&scratch)?;
    let mut stores = BTreeMap::new();
    let mut pubs: BTreeMap<u32, JobOutput> = BTreeMap::new();
    for &n in &turns {
        let keep = work.join(format!("chain-n{n}"));
        let mut o = child(
            &Job::ChainPublish {
                spec: PublishSpec {
                    c: Conversation::new(n, &w),
                    keep: keep.clone(),
                    scratch: scratch.clone(),
                    rounds: repeats,
                },
            },
            &format!("chain: publish {n} turn(s)"),
        )
        .await?;
        for (id, runs) in std::mem::take(&mut o.sub) {
            let acc = accs.entry(id).or_default();
            for r in runs {
                acc.add(r);
            }
        }
        // The write floor is the fastest variant (by median).
        let best = ["1", "1-direct", "2-direct"]
            .iter()
            .filter_map(|k| {
                let id = format!("chain-n{n}-floor-write-{k}");
                accs.get(&id).map(|a| (id, median(&a.times)))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((id, _)) = best {
            if let Some(a) = accs.get(&id) {
                let mut f = Acc {
                    times: a.times.clone(),
                    ..Default::default()
                };
                f.info.insert("variant".into(), serde_json::json!(id));
                for k in ["1", "1-direct", "2-direct"] {
                    if let Some(x) = accs.get(&format!("chain-n{n}-floor-write-{k}")) {
                        f.info.insert(
                            format!("median_ms_{}_stream", k.replace('-', "_")),
                            serde_json::json!(median(&x.times)),
                        );
                    }
                }
                f.infos = vec![f.info.clone()];
                accs.insert(format!("chain-n{n}-floor-write"), f);
            }
        }
        stores.insert(n, keep);
        pubs.insert(n, o);
    }
    let flat = pubs
        .get(&1)
        .ok_or_else(|| anyhow!("no flat conversation"))?;
    let result_bytes = flat.num("result_bytes").unwrap_or(0.0) as u64;
    let result_digest = flat
        .info
        .get("result_digest")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    for (n, o) in &pubs {
        if o.info.get("result_digest").and_then(|v| v.as_str()) != Some(result_digest.as_str()) {
            bail!("the {n}-turn conversation does not end in the flat snapshot");
        }
    }
    let job = |n: u32, mode: Mode| Job::ChainRestore {
        spec: RestoreSpec {
            c: Conversation::new(n, &w),
            dir: stores[&n].clone(),
            mode,
            latency_ms: args.latency_ms,
            result_bytes,
            result_digest: result_digest.clone(),
        },
    };
    // Two blocks (local, S3-like); in each, one repetition of every
    // scenario per round.
    let mut blocks: Vec<Vec<(String, Job)>> = Vec::new();
    for modes in [&[Mode::Warm, Mode::Into][..], &[Mode::S3like][..]] {
        let mut plan = Vec::new();
        for &mode in modes {
            plan.push((format!("chain-flat-{}", mode.suffix()), job(1, mode)));
        }
        for &n in &turns {
            for &mode in modes {
                plan.push((format!("chain-n{n}-{}", mode.suffix()), job(n, mode)));
            }
        }
        blocks.push(plan);
    }
    for plan in &blocks {
        for round in 0..repeats {
            for (id, job) in plan {
                let o = child(job, &format!("{id} [{}/{repeats}]", round + 1)).await?;
                accs.entry(id.clone()).or_default().add(o);
            }
        }
    }
    if !args.keep {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    let m = |id: &str| accs.get(id).map(|a| median(&a.times));
    let bound = result_bytes + 5 * w.extent_bytes;
    let (fw, fi, fs) = (
        m("chain-flat-warm"),
        m("chain-flat-warm-into"),
        m("chain-flat-s3like"),
    );
    let rows = turns
        .iter()
        .map(|&n| {
            let p = &pubs[&n];
            let warm = m(&format!("chain-n{n}-warm"));
            let into = m(&format!("chain-n{n}-warm-into"));
            let s3 = m(&format!("chain-n{n}-s3like"));
            let peak = [Mode::Warm, Mode::Into, Mode::S3like]
                .iter()
                .filter_map(|mode| accs.get(&format!("chain-n{n}-{}", mode.suffix())))
                .map(|a| a.peak.saturating_sub(a.baseline))
                .max();
            let diff = s3.zip(fs).map(|(a, b)| a - b);
            ChainRow {
                turns: n,
                last_turn_tokens: p.num("last_turn_tokens").unwrap_or(0.0) as u64,
                last_payload_bytes: accs
                    .get(&format!("chain-n{n}-publish"))
                    .and_then(|a| a.info.get("payload_bytes"))
                    .and_then(|v| v.as_u64())
                    .unwrap_or(0),
                store_bytes: p.num("store_bytes").unwrap_or(0.0) as u64,
                publish_ms: m(&format!("chain-n{n}-publish")),
                floor_write_ms: m(&format!("chain-n{n}-floor-write")),
                warm_ms: warm,
                warm_ratio: warm.zip(fw).map(|(a, b)| a / b),
                into_ms: into,
                into_ratio: into.zip(fi).map(|(a, b)| a / b),
                s3like_ms: s3,
                s3like_minus_flat_ms: diff,
                s3like_minus_flat_latencies: diff.map(|d| d / args.latency_ms.max(1) as f64),
                peak_bytes: peak,
                peak_over_bound: peak.map(|p| p as f64 / bound as f64),
            }
        })
        .collect();
    Ok(ChainSummary {
        final_tokens: w.result_tokens,
        chunk_tokens: chunk,
        result_bytes,
        result_digest,
        extent_bytes: w.extent_bytes,
        latency_ms: args.latency_ms,
        bound_bytes: bound,
        turns,
        skipped,
        flat_warm_ms: fw,
        flat_into_ms: fi,
        flat_s3like_ms: fs,
        rows,
    })
}

/// Group, label and floor of a chain scenario id.
pub(super) fn describe(
    id: &str,
    latency_ms: u64,
) -> Option<(&'static str, String, Option<String>)> {
    let rest = id.strip_prefix("chain-")?;
    let (who, what) = rest.split_once('-')?;
    let (turns, floor) = match who {
        "flat" => ("flat root".to_string(), None),
        _ => {
            let n: u32 = who.strip_prefix('n')?.parse().ok()?;
            let t = format!("{n}-turn chain");
            let floor = match what {
                "warm" | "warm-into" | "s3like" => Some(format!("chain-flat-{what}")),
                "publish" => Some(format!("chain-n{n}-floor-write")),
                _ => None,
            };
            (t, floor)
        }
    };
    Some(match what {
        "warm" => (
            "restore",
            format!("chain: restore last turn, {turns}, local, warm, fresh process"),
            floor,
        ),
        "warm-into" => (
            "restore",
            format!("chain: restore_into last turn, {turns}, local, warm, fresh process"),
            floor,
        ),
        "s3like" => (
            "restore",
            format!(
                "chain: restore last turn, {turns}, S3-like ({latency_ms} ms/GET), fresh process"
            ),
            floor,
        ),
        "publish" => (
            "publish",
            format!("chain: publish last turn of a {turns}, durable, local"),
            floor,
        ),
        "floor-write" => (
            "floor",
            format!("chain: floor (c) durable write of the last turn's payload, {turns}"),
            None,
        ),
        _ => return None,
    })
}

/// Scenario rows of the chain runs, in report order.
pub(super) fn scenarios(c: &ChainSummary, accs: &BTreeMap<String, Acc>) -> Vec<Scenario> {
    let mut ids: Vec<String> = ["warm", "warm-into", "s3like"]
        .iter()
        .map(|w| format!("chain-flat-{w}"))
        .collect();
    for n in &c.turns {
        for w in ["warm", "warm-into", "s3like"] {
            ids.push(format!("chain-n{n}-{w}"));
        }
    }
    for n in &c.turns {
        ids.push(format!("chain-n{n}-floor-write"));
        ids.push(format!("chain-n{n}-publish"));
    }
    let mut out = Vec::new();
    for id in ids {
        let Some(a) = accs.get(&id) else { continue };
        let Some((group, label, floor_id)) = describe(&id, c.latency_ms) else {
            continue;
        };
        let m = median(&a.times);
        let floor = floor_id
            .as_deref()
            .and_then(|f| accs.get(f).map(|fa| (median(&fa.times), fa)));
        let bytes = a
            .info
            .get(if group == "restore" {
                "result_bytes"
            } else {
                "payload_bytes"
            })
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        let mut info = BTreeMap::new();
        for k in [
            "encode_ms",
            "write_ms",
            "cpu_ms",
            "others_cores",
            "drop_ms",
            "objects_read_counter",
            "bytes_read_counter",
            "warmed_bytes",
            "root_chain_depth",
            "median_ms_1_stream",
            "median_ms_1_direct_stream",
            "median_ms_2_direct_stream",
        ] {
            if let Some(v) = a.info_median(k) {
                info.insert(k.to_string(), serde_json::json!(v));
            }
        }
        let mut note = String::new();
        if group == "restore" && floor.is_some() {
            note = "floor = the same restore of the flat root (ratio: chain / flat)".into();
        }
        if group == "publish" {
            note = "floor = durable write of the same payload bytes in the same child".into();
        }
        if let Some(v) = a.info.get("variant").and_then(|v| v.as_str()) {
            note = format!("fastest variant: {v}");
        }
        let is_floor = group == "floor";
        out.push(Scenario {
            id: id.clone(),
            label,
            group,
            median_ms: m,
            times_ms: a.times.clone(),
            bytes,
            gb_per_s: bytes as f64 / 1e6 / m,
            objects: a
                .info_median(if group == "restore" {
                    "objects_read_counter"
                } else {
                    "objects"
                })
                .map(|x| x as u64),
            floor_id: floor.as_ref().and(floor_id.clone()),
            floor_ms: floor.as_ref().map(|f| f.0),
            ratio: floor.as_ref().map(|f| m / f.0),
            cpu_ms: a.info_median("cpu_ms"),
            cpu_ratio: match (group, a.info_median("cpu_ms"), &floor) {
                ("restore", Some(x), Some((_, fa))) => fa.info_median("cpu_ms").map(|f| x / f),
                _ => None,
            },
            peak_bytes: (!is_floor).then_some(a.peak),
            baseline_bytes: (!is_floor).then_some(a.baseline),
            bound_bytes: (group == "restore").then_some(c.bound_bytes),
            info,
            note,
        });
    }
    out
}

/// The chain targets: chain ≤ 1.15 × flat (local, warm) for every N;
/// S3-like chain ≤ flat + 3 × latency; peak memory ≤ result + 4 × M + M.
pub(super) fn targets(c: &ChainSummary) -> Vec<Target> {
    let mut t = Vec::new();
    let lat = c.latency_ms as f64;
    for r in &c.rows {
        let mut parts = Vec::new();
        let mut met = None;
        for (what, ms, ratio, flat) in [
            ("new buffer", r.warm_ms, r.warm_ratio, c.flat_warm_ms),
            ("`restore_into`", r.into_ms, r.into_ratio, c.flat_into_ms),
        ] {
            if let (Some(ms), Some(x), Some(f)) = (ms, ratio, flat) {
                parts.push(format!("{what} {x:.2}× ({} vs {})", secs(ms), secs(f)));
                met = Some(met.unwrap_or(true) && x <= LOCAL_RATIO_TARGET);
            }
        }
        if !parts.is_empty() {
            t.push(Target {
                target: format!(
                    "chain of {} turn(s): restore ≤ {LOCAL_RATIO_TARGET} × flat, local, warm",
                    r.turns
                ),
                measured: parts.join("; "),
                met,
            });
        }
    }
    for r in &c.rows {
        if let (Some(s3), Some(d), Some(f)) =
            (r.s3like_ms, r.s3like_minus_flat_ms, c.flat_s3like_ms)
        {
            t.push(Target {
                target: format!(
                    "chain of {} turn(s): restore S3-like ≤ flat + {S3_LATENCIES_TARGET} × {} ms",
                    r.turns, c.latency_ms
                ),
                measured: format!(
                    "{:+.0} ms = {:+.1} × latency ({} vs {})",
                    d,
                    d / lat.max(1.0),
                    secs(s3),
                    secs(f)
                ),
                met: Some(d <= S3_LATENCIES_TARGET * lat),
            });
        }
    }
    for r in &c.rows {
        if let Some(p) = r.peak_bytes {
            t.push(Target {
                target: format!(
                    "chain of {} turn(s): restore peak memory ≤ result + 4×M + M",
                    r.turns
                ),
                measured: format!(
                    "{} ≤ {} ({:.2} × bound; largest of new buffer, `restore_into`, S3-like)",
                    mib(p),
                    mib(c.bound_bytes),
                    p as f64 / c.bound_bytes as f64
                ),
                met: Some(p <= c.bound_bytes),
            });
        }
    }
    t
}

/// The chain section of `results.md`.
pub(super) fn markdown(c: &ChainSummary, s: &mut String) {
    let _ = writeln!(s, "\n## Chain: restore cost against the number of turns\n");
    let _ = writeln!(
        s,
        "Final snapshot {} tokens ({}), the same for every N; turn k ends at round_to_chunk(k × {} / N) ({}-token chunks); rebasing off. Every restore runs in a fresh child (no base cache), page cache warm. Flat: local {} (`restore_into` {}), S3-like {}. Bound: result + 4×M + M = {}.\n",
        c.final_tokens,
        mib(c.result_bytes),
        c.final_tokens,
        c.chunk_tokens,
        c.flat_warm_ms.map(secs).unwrap_or_default(),
        c.flat_into_ms.map(secs).unwrap_or_default(),
        c.flat_s3like_ms.map(secs).unwrap_or_default(),
        mib(c.bound_bytes),
    );
    let _ = writeln!(
        s,
        "| turns | last turn (tokens) | last turn payload | store objects | publish last turn | write floor | restore local | / flat | `restore_into` | / flat | S3-like | − flat | in latencies | peak / bound |"
    );
    let _ = writeln!(
        s,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let f = |x: Option<f64>| x.map(secs).unwrap_or_default();
    let x = |x: Option<f64>| x.map(|v| format!("{v:.2}×")).unwrap_or_default();
    for r in &c.rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.turns,
            r.last_turn_tokens,
            mib(r.last_payload_bytes),
            mib(r.store_bytes),
            f(r.publish_ms),
            f(r.floor_write_ms),
            f(r.warm_ms),
            x(r.warm_ratio),
            f(r.into_ms),
            x(r.into_ratio),
            f(r.s3like_ms),
            r.s3like_minus_flat_ms
                .map(|d| format!("{d:+.0} ms"))
                .unwrap_or_default(),
            r.s3like_minus_flat_latencies
                .map(|d| format!("{d:+.1}"))
                .unwrap_or_default(),
            r.peak_over_bound
                .map(|v| format!("{v:.2}"))
                .unwrap_or_default(),
        );
    }
    for k in &c.skipped {
        let _ = writeln!(s, "\nNot run: {k}.");
    }
}

/// Restore time against the number of turns (x: log2 N, labelled N), two
/// panels: local (chain new buffer and `restore_into`) and S3-like; the
/// flat restores are dashed horizontal references in the same colours.
pub(super) fn plot(r: &Report, c: &ChainSummary) -> Result<String> {
    use plotters::prelude::*;
    type Line = (&'static str, RGBColor, Vec<Option<f64>>, Option<f64>);
    let e = |e: &dyn std::fmt::Display| anyhow!("chain plot: {e}");
    let xs: Vec<f64> = c.rows.iter().map(|r| f64::from(r.turns).log2()).collect();
    let (x0, x1) = (-0.5, xs.iter().copied().fold(0.0, f64::max) + 0.9);
    let local: Vec<Line> = vec![
        (
            "local, warm, new buffer",
            RGBColor(60, 140, 80),
            c.rows.iter().map(|r| r.warm_ms).collect(),
            c.flat_warm_ms,
        ),
        (
            "local, warm, restore_into",
            RGBColor(70, 110, 180),
            c.rows.iter().map(|r| r.into_ms).collect(),
            c.flat_into_ms,
        ),
    ];
    let s3: Vec<Line> = vec![(
        "S3-like",
        RGBColor(210, 110, 40),
        c.rows.iter().map(|r| r.s3like_ms).collect(),
        c.flat_s3like_ms,
    )];
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1200, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let root = root
            .titled(
                &format!(
                    "deltapack bench chain, scale {} ({} MiB result): restore of the last turn, fresh process",
                    r.scale,
                    c.result_bytes / MIB_U64
                ),
                ("sans-serif", 18),
            )
            .map_err(|x| e(&x))?;
        let (left, right) = root.split_horizontally(600);
        let s3_title = format!("S3-like ({} ms per GET)", c.latency_ms);
        for (area, title, lines) in [
            (&left, "local disk, warm page cache", &local),
            (&right, s3_title.as_str(), &s3),
        ] {
            let ymax = lines
                .iter()
                .flat_map(|l| l.2.iter().copied().chain([l.3]))
                .flatten()
                .fold(1.0f64, f64::max)
                / 1000.0
                * 1.25;
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 15))
                .margin(14)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(x0..x1, 0.0..ymax)
                .map_err(|x| e(&x))?;
            let labels = xs.clone();
            chart
                .configure_mesh()
                .light_line_style(WHITE)
                .x_desc("turns (log scale; dashed: the flat root)")
                .y_desc("seconds (median)")
                .x_labels(((x1 - x0) * 2.0) as usize)
                .x_label_formatter(&|v| {
                    labels
                        .iter()
                        .find(|x| (*x - v).abs() < 0.05)
                        .map(|x| format!("{:.0}", x.exp2()))
                        .unwrap_or_default()
                })
                .draw()
                .map_err(|x| e(&x))?;
            for (name, colour, ys, flat) in lines.iter() {
                let pts: Vec<(f64, f64)> = xs
                    .iter()
                    .zip(ys)
                    .filter_map(|(x, y)| y.map(|y| (*x, y / 1000.0)))
                    .collect();
                let colour = *colour;
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        pts.clone(),
                        colour.stroke_width(2),
                    )))
                    .map_err(|x| e(&x))?
                    .label(format!("chain, {name}"))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                    });
                chart
                    .draw_series(pts.iter().map(|p| Circle::new(*p, 4, colour.filled())))
                    .map_err(|x| e(&x))?;
                chart
                    .draw_series(pts.iter().map(|&(x, y)| {
                        Text::new(secs(y * 1000.0), (x + 0.08, y), ("sans-serif", 12))
                    }))
                    .map_err(|x| e(&x))?;
                if let Some(f) = flat {
                    let f = f / 1000.0;
                    // Dashed by hand (the build has no series features).
                    let dash = (x1 - x0) / 60.0;
                    chart
                        .draw_series((0..60).step_by(2).map(|i| {
                            let a = x0 + i as f64 * dash;
                            PathElement::new(vec![(a, f), (a + dash, f)], colour.stroke_width(1))
                        }))
                        .map_err(|x| e(&x))?
                        .label(format!("flat root, {name}: {}", secs(f * 1000.0)))
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 8, y)], colour.stroke_width(1))
                        });
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|x| e(&x))?;
        }
        root.present().map_err(|x| e(&x))?;
    }
    Ok(svg)
}

const MIB_U64: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_boundaries_split_on_chunks_and_end_at_the_final_snapshot() {
        let c = |turns, final_tokens| Conversation {
            turns,
            final_tokens,
            chunk_tokens: 256,
            extent_bytes: 1 << 20,
        };
        assert_eq!(c(1, 4352).boundaries().expect("1"), vec![4352]);
        assert_eq!(
            c(4, 4352).boundaries().expect("4"),
            vec![1024, 2304, 3328, 4352]
        );
        let b = c(256, 262_144).boundaries().expect("256");
        assert_eq!(b.len(), 256);
        assert!(b.iter().all(|x| x % 256 == 0));
        assert_eq!(b[0], 1024);
        assert_eq!(*b.last().expect("last"), 262_144);
        let b = c(17, 4352).boundaries().expect("17 of 17 chunks");
        assert_eq!(b[0], 256);
        assert!(c(18, 4352).boundaries().is_err());
        assert!(c(256, 32_768).boundaries().is_err());
    }

    #[test]
    fn chain_ids_are_described() {
        let (g, _, f) = describe("chain-n16-warm", 20).expect("warm");
        assert_eq!((g, f.as_deref()), ("restore", Some("chain-flat-warm")));
        let (_, _, f) = describe("chain-n16-warm-into", 20).expect("into");
        assert_eq!(f.as_deref(), Some("chain-flat-warm-into"));
        let (g, _, f) = describe("chain-n4-publish", 20).expect("publish");
        assert_eq!((g, f.as_deref()), ("publish", Some("chain-n4-floor-write")));
        let (g, _, f) = describe("chain-flat-s3like", 20).expect("flat");
        assert_eq!((g, f), ("restore", None));
        assert_eq!(
            describe("chain-n4-floor-write", 20).expect("floor").0,
            "floor"
        );
        assert!(describe("restore-v2-warm", 20).is_none());
    }
}

//! The chain scenario (`chain`, also part of `all`): restore cost against
//! the number of turns.
//!
//! A conversation is a chain of deltas: turn 1 is a flat root, turn k+1 a
//! `page-tail-cow-v1` delta against turn k. Conversations of N turns (1, 4,
//! 16, 64, and 256 where the final snapshot has at least 256 chunks) all end
//! in the *same* final snapshot — the workload's result at `--scale` — so the
//! only variable is N (see [`Conversation`]): every full page of turn k is
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
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use deltapack_format::{ContextDigest, Digest, Snapshot};
use deltapack_store::{PublishOutcome, RootStatus, Store};

use super::publish::timed_publish;
use super::restore::{measure, timed_drop, Expected};
use crate::args::BenchArgs;
use crate::floors::{fastest_write_floor, payload_chunks, write_floors};
use crate::job::{Acc, ChainMode, ChainPublishSpec, ChainRestoreSpec, Job, JobOutput, Source};
use crate::measure::{median, ms};
use crate::report::{ChainRow, ChainSummary};
use crate::runner::{child, round_robin};
use crate::workload::{
    clone_store, fan_out, objects_bytes, open_local_with, synth_at, turn_request, warm_page_cache,
    Conversation, Workload, SEED,
};

/// Conversation lengths measured by default (256 only where it fits).
const DEFAULT_TURNS: [u32; 5] = [1, 4, 16, 64, 256];

// ------------------------------------------------------------------ children

/// Deltas between the root of `ctx` and its flat root, following base
/// references.
async fn chain_depth(store: &Store, mut ctx: ContextDigest) -> Result<u32> {
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

/// Publishes turns 1..N−1 once, then, round by round, the durable write
/// floor of the last turn's payload and the timed publication of the last
/// turn into a clone of that store. The last round's store is kept.
pub(crate) async fn job_publish(s: ChainPublishSpec) -> Result<JobOutput> {
    let c = s.c;
    let n = c.turns;
    let bounds = c.boundaries()?;
    let tokens = deltapack_format::synth::tokens(SEED, usize::try_from(c.final_tokens)?);
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
        let store = open_local_with(&prefix, c.config())?;
        for (i, &b) in bounds[..bounds.len() - 1].iter().enumerate() {
            let snap = synth_at(b).await?;
            let ctx = ctx_at(b);
            let receipt = store
                .publish(turn_request(&snap, ctx, prev.as_ref()))
                .await?;
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
    let prefix_ms = ms(t_prefix.elapsed());
    let last = synth_at(c.final_tokens).await?;
    let last_ctx = ctx_at(c.final_tokens);
    let mut out = JobOutput::default();
    for round in 0..s.rounds {
        // The floor: the same payload bytes, cut into extent-sized files,
        // written durably (buffered one stream; direct I/O one and two).
        let base = prev.as_ref().map(|(_, s)| s.clone());
        let chunks =
            payload_chunks(base, last.clone(), c.chunk_tokens as u32, c.extent_bytes).await?;
        let floor_bytes: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        let dir = s.scratch.join(format!("chain-n{n}-floor-{round}"));
        let floors = tokio::task::block_in_place(|| write_floors(&dir, chunks, &[1], &[1, 2]))?;
        for (variant, o) in floors {
            out.push_sub(format!("chain-n{n}-floor-write-{variant}"), o);
        }

        // The timed publication of the last turn, into a clone of the store
        // holding turns 1..N−1 (steady state: fan-out directories exist).
        let dir = s.scratch.join(format!("chain-n{n}-{round}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        clone_store(&prefix, &dir)?;
        fan_out(&dir, &["blake3"])?;
        let store = open_local_with(&dir, c.config())?;
        store.ledger_totals().await?;
        let (mut o, receipt) =
            timed_publish(&store, || Ok(turn_request(&last, last_ctx, prev.as_ref()))).await?;
        if receipt.outcome != PublishOutcome::Created || receipt.rebased {
            bail!(
                "last turn of {n}: publication {:?}{}",
                receipt.outcome,
                if receipt.rebased { ", rebased" } else { "" }
            );
        }
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
        out.push_sub(format!("chain-n{n}-publish"), o);
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
    out.put("turns", n);
    out.put("boundaries", &bounds);
    out.put("prefix_publish_ms", prefix_ms);
    out.put("result_bytes", last.encoded().len());
    // The digest its root records: layered (v2.2) when the layout allows.
    let recorded = deltapack_format::layer_digest::of_snapshot(&last)
        .map(|d| d.snapshot)
        .unwrap_or_else(|_| last.digest());
    out.put("result_digest", recorded.to_string());
    out.put(
        "last_turn_tokens",
        c.final_tokens - bounds.len().checked_sub(2).map_or(0, |i| bounds[i]),
    );
    out.put("store_bytes", objects_bytes(&s.keep));
    Ok(out)
}

/// A fresh child restoring the last turn: no base cache, page cache warm.
pub(crate) async fn job_restore(s: ChainRestoreSpec) -> Result<JobOutput> {
    let mut out = JobOutput::default();
    let dir = s.dir.clone();
    let warmed = tokio::task::spawn_blocking(move || warm_page_cache(&dir))
        .await
        .context("page cache task")??;
    out.put("warmed_bytes", warmed);
    let source = match s.mode {
        ChainMode::Warm | ChainMode::Into => Source::Warm { dir: s.dir.clone() },
        ChainMode::S3like => Source::Throttled {
            dir: s.dir.clone(),
            latency_ms: s.latency_ms,
        },
    };
    let store = source.open(s.c.config())?;
    // Untimed: open the ledger (an S3-like store rebuilds it by listing).
    store.ledger_totals().await?;
    let ns = Workload::identity().namespace();
    let ctx = s.c.final_context()?;
    let want = Expected {
        digest: s
            .result_digest
            .parse::<Digest>()
            .context("the flat conversation's result digest")?,
        len: s.result_bytes,
    };
    if let Some(r) = measure(&store, ns, ctx, s.mode == ChainMode::Into, &want, &mut out).await? {
        timed_drop(r, &mut out);
    }
    out.put("result_bytes", s.result_bytes);
    Ok(out)
}

// ------------------------------------------------------------------ parent

/// The chain lengths to measure (always 1, the flat conversation) and the
/// ones skipped because the final snapshot has fewer turn boundaries.
fn chain_lengths(args: &BenchArgs, chunks: u64, chunk: u64) -> (Vec<u32>, Vec<String>) {
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
    (turns, skipped)
}

/// Publishes each conversation in a child process (its store kept under
/// `work`) and records the fastest write floor of each.
async fn publish_all(
    args: &BenchArgs,
    w: &Workload,
    turns: &[u32],
    work: &Path,
    scratch: &Path,
    accs: &mut BTreeMap<String, Acc>,
) -> Result<(BTreeMap<u32, PathBuf>, BTreeMap<u32, JobOutput>)> {
    let repeats = args.repeats;
    let mut stores = BTreeMap::new();
    let mut pubs: BTreeMap<u32, JobOutput> = BTreeMap::new();
    for &n in turns {
        let keep = work.join(format!("chain-n{n}"));
        let mut o = child(
            &Job::ChainPublish {
                spec: ChainPublishSpec {
                    c: Conversation::new(n, w),
                    keep: keep.clone(),
                    scratch: scratch.to_path_buf(),
                    rounds: repeats,
                },
            },
            &format!("chain: publish {n} turn(s)"),
        )
        .await?;
        Acc::add_sub(accs, std::mem::take(&mut o.sub));
        // The write floor is the fastest variant (by median).
        let prefix = format!("chain-n{n}-floor-write");
        if let Some((id, best, medians)) =
            fastest_write_floor(accs, &prefix, &["1", "1-direct", "2-direct"])
        {
            let mut f = Acc {
                times: best.times.clone(),
                ..Default::default()
            };
            f.info.insert("variant".into(), serde_json::json!(id));
            f.info.extend(medians);
            f.infos = vec![f.info.clone()];
            accs.insert(prefix, f);
        }
        stores.insert(n, keep);
        pubs.insert(n, o);
    }
    Ok((stores, pubs))
}

/// One row per chain length: its publication, its restores against the
/// flat conversation's (`flat`: warm, into, S3-like medians) and its peak.
fn summary_rows(
    args: &BenchArgs,
    turns: &[u32],
    pubs: &BTreeMap<u32, JobOutput>,
    accs: &BTreeMap<String, Acc>,
    (fw, fi, fs): (Option<f64>, Option<f64>, Option<f64>),
    bound: u64,
) -> Vec<ChainRow> {
    let m = |id: &str| accs.get(id).map(|a| median(&a.times));
    turns
        .iter()
        .map(|&n| {
            let p = &pubs[&n];
            let warm = m(&format!("chain-n{n}-warm"));
            let into = m(&format!("chain-n{n}-warm-into"));
            let s3 = m(&format!("chain-n{n}-s3like"));
            let peak = [ChainMode::Warm, ChainMode::Into, ChainMode::S3like]
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
        .collect()
}

/// Publishes every conversation and runs the restores, round-robin; adds
/// the runs to `accs`.
pub(crate) async fn run(
    args: &BenchArgs,
    w: Workload,
    work: &Path,
    accs: &mut BTreeMap<String, Acc>,
) -> Result<ChainSummary> {
    let repeats = args.repeats;
    let chunk = u64::from(Workload::identity().chunk_tokens);
    let chunks = w.result_tokens / chunk;
    let (turns, skipped) = chain_lengths(args, chunks, chunk);
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
    let (stores, pubs) = publish_all(args, &w, &turns, work, &scratch, accs).await?;
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
    let job = |n: u32, mode: ChainMode| Job::ChainRestore {
        spec: ChainRestoreSpec {
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
    for modes in [
        &[ChainMode::Warm, ChainMode::Into][..],
        &[ChainMode::S3like][..],
    ] {
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
    round_robin(&blocks, repeats, accs).await?;
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
    let rows = summary_rows(args, &turns, &pubs, accs, (fw, fi, fs), bound);
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

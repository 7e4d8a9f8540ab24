//! `deltapack-bench turn`: what publishing one more turn of a conversation
//! costs, against the durable write floor of the bytes it writes.
//!
//! For each conversation length (default preset; by default 4,096, 16,384,
//! 65,536 and 262,144 tokens) a flat root is published on local disk, then
//! one more turn of each size (256 and 2,048 tokens) is published, `repeats`
//! times, each time with new page bytes and a new context (so every
//! repetition writes its objects):
//!
//! * **warm tail-only**: `Store::publish_turn` from the previous turn's
//!   `Turn` and the new pages alone;
//! * **warm full snapshot**: `Store::publish` of the whole next snapshot on
//!   the base `Arc` this handle published (the base's pages are compared,
//!   not hashed; the new pages are);
//! * **cold**: a fresh `Store` handle, the base given as bytes it has never
//!   seen (it is hashed once to check it against its root), the whole next
//!   snapshot published.
//!
//! Each row's floor is measured in the same run: the same number of bytes
//! (objects and root, from the receipt) written as that many files with
//! `fsync` and a directory `fsync`, in the same directory. Target (the turn
//! publication issue): warm tail-only ≤ 2.0 × floor + 5 ms at every length,
//! its ratio at the longest within 1.25 × the ratio at the shortest.
//! Results: `results.json` and `results.md` under `--out`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use deltapack_format::synth::{self, Preset};
use deltapack_format::{CacheIdentity, ContextDigest, ContextHasher, Snapshot, SnapshotHeader};
use deltapack_store::{
    BaseInput, ChainPolicy, PublishOutcome, PublishReceipt, PublishRequest, RootFormat, Store,
    StoreConfig, Turn, TurnRequest,
};
use serde::Serialize;

/// Options of `turn`.
#[derive(Debug, clap::Args)]
pub(crate) struct TurnArgs {
    /// Conversation lengths in tokens (multiples of 256).
    #[arg(long, value_delimiter = ',', default_values_t = [4096u64, 16384, 65536, 262144])]
    tokens: Vec<u64>,
    /// Turn sizes in tokens (multiples of 256).
    #[arg(long, value_delimiter = ',', default_values_t = [256u64, 2048])]
    turns: Vec<u64>,
    /// Samples per measure (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=101))]
    repeats: u32,
    /// Directory the stores are created in (a local disk; removed after).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Directory for results.json and results.md.
    #[arg(long, value_name = "DIR", default_value = "benches/results/turn")]
    out: PathBuf,
}

#[derive(Debug, Serialize)]
struct Row {
    conversation_tokens: u64,
    turn_tokens: u64,
    mode: &'static str,
    median_ms: f64,
    floor_ms: f64,
    ratio: f64,
    bytes_written: u64,
    objects_written: u64,
    bytes_hashed: u64,
    target: &'static str,
    met: bool,
}

#[derive(Debug, Serialize)]
struct Results {
    repeats: u32,
    profile: &'static str,
    rows: Vec<Row>,
    tail_ratio_longest_over_shortest: Vec<(u64, f64)>,
}

/// Runs the scenario and writes its results.
pub(crate) async fn run(a: TurnArgs) -> Result<ExitCode> {
    if a.tokens.is_empty() || a.turns.is_empty() {
        bail!("--tokens and --turns need at least one value each");
    }
    if a.tokens
        .iter()
        .chain(&a.turns)
        .any(|t| *t == 0 || t % 256 != 0)
    {
        bail!("--tokens and --turns must be positive multiples of 256");
    }
    let parent = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let work = parent.join(format!(
        "deltapack-turn-{}-{}",
        std::process::id(),
        crate::workload::unique()
    ));
    std::fs::create_dir_all(&work)?;
    let result = measure(&a, &work).await;
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn config() -> StoreConfig {
    let mut c = StoreConfig::default();
    // Every turn is a delta on the flat root (no rebasing decides for us).
    c.chain = ChainPolicy::unbounded();
    c
}

/// Token ids of the conversation up to `base`, then `extra` new ones drawn
/// from `salt` (a new context each repetition).
fn tokens(base: &[u32], extra: u64, salt: u64) -> Vec<u32> {
    let mut t = base.to_vec();
    t.extend(synth::tokens(salt, extra as usize));
    t
}

/// Fills `n` bytes from `seed` (xorshift; cheap, incompressible enough).
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = vec![0u8; n];
    for c in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
    out
}

/// The next snapshot: the base's kept pages, then `tail`.
fn assemble(base: &Snapshot, turn: &Turn, boundary: u64, tail: &[u8]) -> Result<Arc<Snapshot>> {
    let header = SnapshotHeader::new(base.layout().clone(), boundary);
    let mut payload = Vec::with_capacity(header.validate()? as usize);
    let mut at = 0usize;
    for (gi, g) in header.layout.groups.iter().enumerate() {
        let kept = turn.kept_pages()[gi];
        for (li, l) in g.layers.iter().enumerate() {
            let r = base.layer_range(gi, li).context("layer")?;
            let keep = (kept * l.bytes_per_page) as usize;
            payload.extend_from_slice(&base.payload()[r.start..r.start + keep]);
            let n = ((header.block_counts[gi] - kept) * l.bytes_per_page) as usize;
            payload.extend_from_slice(&tail[at..at + n]);
            at += n;
        }
    }
    Ok(Arc::new(Snapshot::from_parts(header, &payload)?))
}

/// Writes `bytes` as `files` durable files (fsync each, then the
/// directory), as a publication of that many objects would.
fn write_floor(dir: &Path, bytes: u64, files: u64, seed: u64) -> Result<Duration> {
    let d = dir.join(format!("floor-{seed}"));
    std::fs::create_dir_all(&d)?;
    let files = files.max(1);
    let per = (bytes / files) as usize;
    let data = noise(seed, per + (bytes % files) as usize);
    let t = Instant::now();
    for i in 0..files {
        let n = if i + 1 == files {
            per + (bytes % files) as usize
        } else {
            per
        };
        let mut f = std::fs::File::create(d.join(format!("{i}")))?;
        f.write_all(&data[..n])?;
        f.sync_all()?;
    }
    std::fs::File::open(&d)?.sync_all()?;
    let e = t.elapsed();
    std::fs::remove_dir_all(&d)?;
    Ok(e)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Sample {
    time: Duration,
    floor: Duration,
    receipt: PublishReceipt,
    hashed: u64,
}

async fn measure(a: &TurnArgs, work: &Path) -> Result<ExitCode> {
    let id = CacheIdentity::example();
    let hasher = ContextHasher::new(id.namespace(), id.chunk_tokens)?;
    let ctx = |t: &[u32]| -> ContextDigest { hasher.digest(t) };
    let mut rows = Vec::new();
    for &n in &a.tokens {
        let dir = work.join(format!("store-{n}"));
        std::fs::create_dir_all(&dir)?;
        let url = format!("file://{}", dir.display());
        let store = Store::open(&url, config())?;
        let seed = 29;
        let base_tokens = synth::tokens(seed, n as usize);
        let base = Arc::new(synth::snapshot(Preset::Default, seed, n)?);
        let r = store
            .publish(PublishRequest {
                identity: id.clone(),
                context: ctx(&base_tokens),
                snapshot: base.clone(),
                base: None,
                format: RootFormat::V2,
            })
            .await?;
        let turn = r.turn.context("a v2.2 publication returns a turn")?;
        eprintln!(
            "turn: conversation of {n} tokens published ({} bytes)",
            base.encoded().len()
        );
        for &t in &a.turns {
            let boundary = n + t;
            let tail_len = turn.tail_len(boundary)? as usize;
            let mut samples: [Vec<Sample>; 3] = [Vec::new(), Vec::new(), Vec::new()];
            for rep in 0..a.repeats {
                for (mode, out) in samples.iter_mut().enumerate() {
                    let salt = 1000 + u64::from(rep) * 10 + mode as u64 + t * 7;
                    let toks = tokens(&base_tokens, t, salt);
                    let tail = Bytes::from(noise(salt, tail_len));
                    let (s, before) = match mode {
                        0 | 1 => (store.clone(), store.stats().snapshot_bytes_hashed),
                        _ => {
                            let fresh = Store::open(&url, config())?;
                            let h = fresh.stats().snapshot_bytes_hashed;
                            (fresh, h)
                        }
                    };
                    let (time, receipt) = match mode {
                        0 => {
                            let req = TurnRequest {
                                identity: id.clone(),
                                context: ctx(&toks),
                                boundary,
                                tail,
                            };
                            let started = Instant::now();
                            let r = s.publish_turn(&turn, req).await?;
                            (started.elapsed(), r)
                        }
                        _ => {
                            let next = assemble(&base, &turn, boundary, &tail)?;
                            let given = if mode == 1 {
                                base.clone()
                            } else {
                                Arc::new(Snapshot::from_encoded(base.encoded().to_vec())?)
                            };
                            let req = PublishRequest {
                                identity: id.clone(),
                                context: ctx(&toks),
                                snapshot: next,
                                base: Some(BaseInput {
                                    context: ctx(&base_tokens),
                                    snapshot: given,
                                }),
                                format: RootFormat::V2,
                            };
                            let started = Instant::now();
                            let r = s.publish(req).await?;
                            (started.elapsed(), r)
                        }
                    };
                    if receipt.outcome != PublishOutcome::Created {
                        bail!("turn {mode} of {n}+{t}: {:?}", receipt.outcome);
                    }
                    let hashed = s.stats().snapshot_bytes_hashed - before;
                    if mode == 2 {
                        s.close().await?;
                    }
                    let floor = write_floor(
                        &dir,
                        receipt.bytes_written,
                        receipt.objects_written + 1,
                        salt,
                    )?;
                    out.push(Sample {
                        time,
                        floor,
                        receipt,
                        hashed,
                    });
                }
            }
            for (mode, s) in samples.into_iter().enumerate() {
                let name = ["warm tail-only", "warm full snapshot", "cold"][mode];
                let last = &s[s.len() - 1].receipt;
                let (bytes, objects) = (last.bytes_written, last.objects_written);
                let hashed = s[s.len() - 1].hashed;
                let time = median(s.iter().map(|x| x.time).collect());
                let floor = median(s.iter().map(|x| x.floor).collect());
                let ratio = time.as_secs_f64() / floor.as_secs_f64().max(1e-9);
                let (target, met) = match mode {
                    0 => ("<= 2.0 x floor + 5 ms", ms(time) <= 2.0 * ms(floor) + 5.0),
                    1 => ("no hashing of unchanged pages", hashed as usize <= tail_len),
                    _ => ("reported", true),
                };
                eprintln!(
                    "turn: {n}+{t} {name}: {:.1} ms, floor {:.1} ms, {ratio:.2}x, hashed {hashed}",
                    ms(time),
                    ms(floor)
                );
                rows.push(Row {
                    conversation_tokens: n,
                    turn_tokens: t,
                    mode: name,
                    median_ms: ms(time),
                    floor_ms: ms(floor),
                    ratio,
                    bytes_written: bytes,
                    objects_written: objects,
                    bytes_hashed: hashed,
                    target,
                    met,
                });
            }
        }
        store.close().await?;
        std::fs::remove_dir_all(&dir)?;
    }
    // The tail-only ratio at the longest conversation over the shortest.
    let (short, long) = (
        a.tokens.iter().min().copied().unwrap_or(0),
        a.tokens.iter().max().copied().unwrap_or(0),
    );
    let tail_ratio = |n: u64, t: u64| {
        rows.iter()
            .find(|r| {
                r.conversation_tokens == n && r.turn_tokens == t && r.mode == "warm tail-only"
            })
            .map(|r| r.ratio)
    };
    let spread: Vec<(u64, f64)> = a
        .turns
        .iter()
        .filter_map(|&t| Some((t, tail_ratio(long, t)? / tail_ratio(short, t)?)))
        .collect();
    let results = Results {
        repeats: a.repeats,
        profile: if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        },
        rows,
        tail_ratio_longest_over_shortest: spread,
    };
    std::fs::create_dir_all(&a.out)?;
    std::fs::write(
        a.out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    let mut md = format!(
        "# Publishing one more turn\n\n\
         Default preset, local disk, medians of {}; each row's floor is the durable write of \
         the bytes it wrote (as many files as objects + root, fsync each, then the directory), \
         measured in the same run. Binary profile: {}.\n\n\
         | conversation | turn | mode | median | floor | ratio | written | hashed | target | met |\n\
         |---:|---:|---|---:|---:|---:|---:|---:|---|---|\n",
        results.repeats, results.profile
    );
    for r in &results.rows {
        md.push_str(&format!(
            "| {} | {} | {} | {:.1} ms | {:.1} ms | {:.2}× | {} B | {} B | {} | {} |\n",
            r.conversation_tokens,
            r.turn_tokens,
            r.mode,
            r.median_ms,
            r.floor_ms,
            r.ratio,
            r.bytes_written,
            r.bytes_hashed,
            r.target,
            if r.met { "yes" } else { "**no**" }
        ));
    }
    for (t, x) in &results.tail_ratio_longest_over_shortest {
        md.push_str(&format!(
            "\nWarm tail-only ratio, {long} over {short} tokens, {t}-token turn: {x:.2}× \
             (target ≤ 1.25×).\n"
        ));
    }
    std::fs::write(a.out.join("results.md"), &md)?;
    print!("{md}");
    Ok(ExitCode::SUCCESS)
}

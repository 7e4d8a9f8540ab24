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
//!   snapshot published;
//! * **cold tail-only**: a fresh `Store` handle, `Store::turn_from` the base
//!   given as bytes (the root's recorded turn state proven with about a
//!   page per stream, not the base hashed), then `Store::publish_turn` of
//!   the new pages: what a library caller pays for the CLI's publication;
//! * **cli tail-only**: `deltapack publish --tail` in a fresh process, from
//!   files (the base snapshot mapped, of which only about a page per stream
//!   is read; tokens; the tail), the page cache warm. Target: ≤ 1.3 × the
//!   library's time for the same publication from the same inputs in a
//!   fresh handle, from `Store::open` to `Store::close` (the cold tail-only
//!   row's open → close column; its publication alone is reported too).
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

use crate::measure::{median_duration as median, ms};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use deltapack_format::synth::{self, Preset};
use deltapack_format::{CacheIdentity, ContextDigest, ContextHasher, Snapshot, SnapshotHeader};
use deltapack_store::{
    BaseInput, ChainPolicy, PublishOutcome, PublishReceipt, PublishRequest, RootFormat, Store,
    StoreConfig, Turn, TurnRequest,
};
use serde::Serialize;

use crate::report::markdown_table;

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
    /// Rows to measure (default: all).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Mode::ALL)]
    modes: Vec<Mode>,
    /// The `deltapack` binary for the cli row (default: next to this
    /// binary, as cargo builds them).
    #[arg(long, value_name = "FILE")]
    cli: Option<PathBuf>,
}

/// One way of publishing the next turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    /// `publish_turn` from the previous turn's handle.
    Tail,
    /// `publish` of the whole next snapshot on the base `Arc` published.
    Full,
    /// `publish` of the whole next snapshot, fresh handle, base as bytes.
    Cold,
    /// `turn_from` the base as bytes, then `publish_turn`, fresh handle.
    ColdTail,
    /// `deltapack publish --tail` in a fresh process, from files.
    Cli,
}

impl Mode {
    const ALL: [Mode; 5] = [
        Mode::Tail,
        Mode::Full,
        Mode::Cold,
        Mode::ColdTail,
        Mode::Cli,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Tail => "warm tail-only",
            Mode::Full => "warm full snapshot",
            Mode::Cold => "cold",
            Mode::ColdTail => "cold tail-only",
            Mode::Cli => "cli tail-only",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
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
    /// Snapshot bytes hashed by the publishing process (`None` when it is
    /// another process).
    bytes_hashed: Option<u64>,
    /// Cold rows: median time from `Store::open` to `Store::close`
    /// returning, the publication included (the cli row: its wall time).
    open_to_close_ms: Option<f64>,
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
    let cli = if a.modes.contains(&Mode::Cli) {
        let path = match &a.cli {
            Some(p) => p.clone(),
            None => std::env::current_exe()?.with_file_name("deltapack"),
        };
        if !path.is_file() {
            bail!(
                "the cli row needs the deltapack binary: {} is not a file (build it with \
                 `cargo build --release -p deltapack-cli`, give --cli, or leave cli out of --modes)",
                path.display()
            );
        }
        Some(path)
    } else {
        None
    };
    super::in_work_dir(a.dir.as_deref(), "turn", async |work| {
        measure(&a, work, cli.as_deref()).await
    })
    .await
}

fn config() -> StoreConfig {
    let mut c = StoreConfig::default();
    // Every turn is a delta on the flat root (no rebasing decides for us).
    c.publication.chain = ChainPolicy::unbounded();
    c
}

/// Token ids of the conversation up to `base`, then `extra` new ones drawn
/// from `salt` (a new context each repetition).
fn tokens(base: &[u32], extra: u64, salt: u64) -> Vec<u32> {
    let mut t = base.to_vec();
    t.extend(synth::tokens(salt, extra as usize));
    t
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
    let data = synth::bytes(seed, per + (bytes % files) as usize);
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

struct Sample {
    time: Duration,
    floor: Duration,
    bytes: u64,
    objects: u64,
    hashed: Option<u64>,
    /// Cold rows: from `Store::open` to `Store::close` returning (what a
    /// fresh process pays through the library, its own start aside).
    whole: Option<Duration>,
}

/// Runs `deltapack publish --tail` for one turn; its wall time and the
/// receipt's (bytes written, objects written).
fn publish_cli(
    cli: &Path,
    dir: &Path,
    url: &str,
    files: [&Path; 4],
) -> Result<(Duration, u64, u64)> {
    let [id, toks, tail, base_tokens] = files;
    let started = Instant::now();
    let out = std::process::Command::new(cli)
        .current_dir(dir)
        .env_remove("DELTAPACK_STORE")
        .env_remove("DELTAPACK_CONFIG")
        .env_remove("DELTAPACK_LEDGER")
        .args(["publish", "--store", url, "--identity"])
        .arg(id)
        .arg("--tokens")
        .arg(toks)
        .arg("--tail")
        .arg(tail)
        .arg("--base-snapshot")
        .arg(dir.join("base.snap"))
        .arg("--base-tokens")
        .arg(base_tokens)
        .arg("--json")
        .output()
        .with_context(|| format!("cannot run {}", cli.display()))?;
    let time = started.elapsed();
    if !out.status.success() {
        bail!(
            "{} publish --tail failed ({}): {}",
            cli.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("the receipt of publish --json")?;
    if v["outcome"] != "created" {
        bail!("publish --tail: outcome {}", v["outcome"]);
    }
    let n = |k: &str| v[k].as_u64().with_context(|| format!("receipt field {k}"));
    Ok((time, n("bytes_written")?, n("objects_written")?))
}

/// One library publication of the next turn in `mode`; its time and
/// receipt. `base` is (the base snapshot, its tokens, its turn); `next` is
/// (the new context, the new boundary, the tail).
async fn publish_lib(
    s: &Store,
    mode: Mode,
    id: &CacheIdentity,
    base: (&Arc<Snapshot>, &[u32], &Turn),
    next: (ContextDigest, u64, Bytes),
    ctx: &dyn Fn(&[u32]) -> ContextDigest,
) -> Result<(Duration, PublishReceipt)> {
    let (base, base_tokens, turn) = base;
    let (context, boundary, tail) = next;
    let req = |tail: Bytes| TurnRequest {
        identity: id.clone(),
        context,
        boundary,
        tail,
    };
    Ok(match mode {
        Mode::Tail => {
            let started = Instant::now();
            let r = s.publish_turn(turn, req(tail)).await?;
            (started.elapsed(), r)
        }
        Mode::ColdTail => {
            let given = Arc::new(Snapshot::from_encoded(base.encoded().to_vec())?);
            let started = Instant::now();
            let from = s.turn_from(id, ctx(base_tokens), &given).await?;
            let r = s.publish_turn(&from, req(tail)).await?;
            (started.elapsed(), r)
        }
        Mode::Full | Mode::Cold => {
            let next = assemble(base, turn, boundary, &tail)?;
            let given = if mode == Mode::Full {
                base.clone()
            } else {
                Arc::new(Snapshot::from_encoded(base.encoded().to_vec())?)
            };
            let req = PublishRequest {
                identity: id.clone(),
                context,
                snapshot: next,
                base: Some(BaseInput {
                    context: ctx(base_tokens),
                    snapshot: given,
                }),
                format: RootFormat::V2,
            };
            let started = Instant::now();
            let r = s.publish(req).await?;
            (started.elapsed(), r)
        }
        Mode::Cli => bail!("the cli row runs in another process"),
    })
}

/// Every conversation length in turn, then the report.
async fn measure(a: &TurnArgs, work: &Path, cli: Option<&Path>) -> Result<ExitCode> {
    let id = CacheIdentity::example();
    let hasher = ContextHasher::new(id.namespace(), id.chunk_tokens)?;
    let mut rows = Vec::new();
    for &n in &a.tokens {
        let c = Conversation::publish(work, &id, &hasher, n, cli.is_some()).await?;
        for &t in &a.turns {
            let tail_len = c.turn.tail_len(n + t)? as usize;
            let mut samples: Vec<Vec<Sample>> = a.modes.iter().map(|_| Vec::new()).collect();
            for rep in 0..a.repeats {
                for (slot, &mode) in a.modes.iter().enumerate() {
                    let salt = 1000 + u64::from(rep) * 10 + mode as u64 + t * 7;
                    samples[slot].push(c.sample(mode, t, tail_len, salt, cli).await?);
                }
            }
            rows.extend(turn_rows(a, (n, t, tail_len), samples));
        }
        c.close().await?;
    }
    report(a, rows)
}

/// One conversation of `n` tokens published as a base in its own store,
/// and the files the cli row reads.
struct Conversation<'a> {
    n: u64,
    id: &'a CacheIdentity,
    hasher: &'a ContextHasher,
    dir: PathBuf,
    url: String,
    store: Store,
    base: Arc<Snapshot>,
    base_tokens: Vec<u32>,
    turn: Turn,
    /// The cli row's inputs (`None`: no cli row).
    files: Option<PathBuf>,
}

impl<'a> Conversation<'a> {
    async fn publish(
        work: &Path,
        id: &'a CacheIdentity,
        hasher: &'a ContextHasher,
        n: u64,
        with_files: bool,
    ) -> Result<Self> {
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
                context: hasher.digest(&base_tokens),
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
        let files = if with_files {
            // The base once per conversation.
            let files = work.join(format!("files-{n}"));
            std::fs::create_dir_all(&files)?;
            std::fs::write(files.join("id.json"), id.to_json_pretty())?;
            std::fs::write(files.join("base.snap"), base.encoded())?;
            std::fs::write(
                files.join("base.tok"),
                deltapack_format::context::tokens_to_le_bytes(&base_tokens),
            )?;
            Some(files)
        } else {
            None
        };
        Ok(Conversation {
            n,
            id,
            hasher,
            dir,
            url,
            store,
            base,
            base_tokens,
            turn,
            files,
        })
    }

    /// One publication of a `t`-token turn in `mode`, and its floor.
    async fn sample(
        &self,
        mode: Mode,
        t: u64,
        tail_len: usize,
        salt: u64,
        cli: Option<&Path>,
    ) -> Result<Sample> {
        let toks = tokens(&self.base_tokens, t, salt);
        let tail = Bytes::from(synth::bytes(salt, tail_len));
        let (time, bytes, objects, hashed, whole) = match mode {
            Mode::Cli => {
                let cli = cli.context("the cli row needs the deltapack binary")?;
                let files = self
                    .files
                    .as_deref()
                    .context("the cli row needs its files")?;
                let tok = files.join(format!("t{salt}.tok"));
                let tl = files.join(format!("t{salt}.tail"));
                std::fs::write(&tok, deltapack_format::context::tokens_to_le_bytes(&toks))?;
                std::fs::write(&tl, &tail)?;
                let (time, bytes, objects) = publish_cli(
                    cli,
                    files,
                    &self.url,
                    [&files.join("id.json"), &tok, &tl, &files.join("base.tok")],
                )?;
                std::fs::remove_file(&tok)?;
                std::fs::remove_file(&tl)?;
                (time, bytes, objects, None, None)
            }
            _ => self.sample_lib(mode, t, (toks, tail)).await?,
        };
        let floor = write_floor(&self.dir, bytes, objects + 1, salt)?;
        Ok(Sample {
            time,
            floor,
            bytes,
            objects,
            hashed,
            whole,
        })
    }

    /// A library row: (time, bytes, objects, bytes hashed, open to close).
    #[allow(clippy::type_complexity)]
    async fn sample_lib(
        &self,
        mode: Mode,
        t: u64,
        (toks, tail): (Vec<u32>, Bytes),
    ) -> Result<(Duration, u64, u64, Option<u64>, Option<Duration>)> {
        let n = self.n;
        let ctx = |t: &[u32]| -> ContextDigest { self.hasher.digest(t) };
        let opening = Instant::now();
        let s = match mode {
            Mode::Tail | Mode::Full => self.store.clone(),
            _ => Store::open(&self.url, config())?,
        };
        let open_time = opening.elapsed();
        let before = s.stats().snapshot_bytes_hashed;
        let (time, receipt) = publish_lib(
            &s,
            mode,
            self.id,
            (&self.base, &self.base_tokens, &self.turn),
            (ctx(&toks), n + t, tail),
            &ctx,
        )
        .await
        .with_context(|| format!("{mode} of {n}+{t}"))?;
        if receipt.outcome != PublishOutcome::Created {
            bail!("{mode} of {n}+{t}: {:?}", receipt.outcome);
        }
        let hashed = s.stats().snapshot_bytes_hashed - before;
        // Open, the publication (its inputs are made outside its timing),
        // close.
        let whole = if !matches!(mode, Mode::Tail | Mode::Full) {
            let closing = Instant::now();
            s.close().await?;
            Some(open_time + time + closing.elapsed())
        } else {
            None
        };
        Ok((
            time,
            receipt.bytes_written,
            receipt.objects_written,
            Some(hashed),
            whole,
        ))
    }

    async fn close(self) -> Result<()> {
        if let Some(files) = &self.files {
            std::fs::remove_dir_all(files)?;
        }
        self.store.close().await?;
        std::fs::remove_dir_all(&self.dir)?;
        Ok(())
    }
}

/// The rows of one (conversation, turn): one per mode, medians of its
/// samples against their floors, with each mode's target.
fn turn_rows(
    a: &TurnArgs,
    (n, t, tail_len): (u64, u64, usize),
    samples: Vec<Vec<Sample>>,
) -> Vec<Row> {
    let cold_tail_slot = a.modes.iter().position(|m| *m == Mode::ColdTail);
    let cold_tail = cold_tail_slot.map(|i| median(samples[i].iter().map(|x| x.time).collect()));
    // The same publication through the library in a fresh handle, from
    // `Store::open` to `Store::close` (as the CLI process does).
    let cold_tail_whole =
        cold_tail_slot.map(|i| median(samples[i].iter().filter_map(|x| x.whole).collect()));
    let mut rows = Vec::new();
    for (slot, s) in samples.into_iter().enumerate() {
        let mode = a.modes[slot];
        let name = mode.name();
        let last = &s[s.len() - 1];
        let (bytes, objects, hashed) = (last.bytes, last.objects, last.hashed);
        let time = median(s.iter().map(|x| x.time).collect());
        let floor = median(s.iter().map(|x| x.floor).collect());
        let wholes: Vec<Duration> = s.iter().filter_map(|x| x.whole).collect();
        let open_to_close = match mode {
            Mode::Cli => Some(ms(time)),
            _ if wholes.is_empty() => None,
            _ => Some(ms(median(wholes))),
        };
        let ratio = time.as_secs_f64() / floor.as_secs_f64().max(1e-9);
        let (target, met) = match mode {
            Mode::Tail => ("<= 2.0 x floor + 5 ms", ms(time) <= 2.0 * ms(floor) + 5.0),
            Mode::Full => (
                "no hashing of unchanged pages",
                hashed.is_some_and(|h| h as usize <= tail_len),
            ),
            Mode::Cli => match cold_tail_whole {
                Some(c) => (
                    "<= 1.3 x cold tail-only open to close",
                    time.as_secs_f64() <= 1.3 * c.as_secs_f64(),
                ),
                None => ("reported (no cold tail-only row)", true),
            },
            Mode::Cold | Mode::ColdTail => ("reported", true),
        };
        let vs = match (mode, cold_tail, cold_tail_whole) {
            (Mode::Cli, Some(c), Some(w)) => format!(
                ", {:.2}x cold tail-only, {:.2}x its open to close ({:.1} ms)",
                time.as_secs_f64() / c.as_secs_f64(),
                time.as_secs_f64() / w.as_secs_f64(),
                ms(w)
            ),
            _ => String::new(),
        };
        eprintln!(
            "turn: {n}+{t} {name}: {:.1} ms, floor {:.1} ms, {ratio:.2}x{vs}, hashed {hashed:?}",
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
            open_to_close_ms: open_to_close,
            target,
            met,
        });
    }
    rows
}

/// The head of the `results.md` table.
const TABLE_HEAD: &str = "\
| conversation | turn | mode | median | floor | ratio | written | hashed | open → close | target | met |
|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|";

/// Writes `results.json` and `results.md` (and prints the table).
fn report(a: &TurnArgs, rows: Vec<Row>) -> Result<ExitCode> {
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
    let mut md = format!(
        "# Publishing one more turn\n\n\
         Default preset, local disk, medians of {}; each row's floor is the durable write of \
         the bytes it wrote (as many files as objects + root, fsync each, then the directory), \
         measured in the same run. Binary profile: {}.\n\n\
         The open → close column is what a fresh process pays through the library (the cold \
         rows: `Store::open`, the publication, `Store::close`; the cli row: its wall time).\n\n",
        results.repeats, results.profile
    );
    md.push_str(&markdown_table(TABLE_HEAD, &results.rows, |r| {
        vec![
            r.conversation_tokens.to_string(),
            r.turn_tokens.to_string(),
            r.mode.to_string(),
            format!("{:.1} ms", r.median_ms),
            format!("{:.1} ms", r.floor_ms),
            format!("{:.2}×", r.ratio),
            format!("{} B", r.bytes_written),
            r.bytes_hashed
                .map_or_else(|| "-".to_string(), |h| format!("{h} B")),
            r.open_to_close_ms
                .map_or_else(|| "-".to_string(), |t| format!("{t:.1} ms")),
            r.target.to_string(),
            if r.met { "yes" } else { "**no**" }.to_string(),
        ]
    }));
    for (t, x) in &results.tail_ratio_longest_over_shortest {
        md.push_str(&format!(
            "\nWarm tail-only ratio, {long} over {short} tokens, {t}-token turn: {x:.2}× \
             (target ≤ 1.25×).\n"
        ));
    }
    super::write_study(&a.out, &results, &md)?;
    Ok(ExitCode::SUCCESS)
}

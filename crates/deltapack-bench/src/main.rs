//! `deltapack-bench`: deltapack's macro benchmarks on real stores, with the
//! machine's floors measured in the same run on the same bytes.
//!
//! ```text
//! cargo run --release -p deltapack-bench -- all --scale 1 --wait-idle 30
//! cargo run --release -p deltapack-bench -- chain --scale 1
//! cargo run --release -p deltapack-bench -- shaped --scale 1
//! ```
//!
//! The reference workload (`--scale 1`): a conversation of the `default`
//! synth preset with a base at 4,096 tokens and a result at 262,144 tokens;
//! the delta is ≈ 1.576 GB, published as v2 (24 extents of 64 MiB) and as
//! legacy v1 (1,024 SHA-256 chunk objects). `--scale F` multiplies the result
//! tokens (rounded to a multiple of 256, at least base + 256).
//!
//! Every timed scenario runs in a child process of this binary (the hidden
//! `bench-one` command, one JSON job in, one JSON result out) so that its
//! peak memory is that child's `VmHWM`. Restore scenarios and read floors
//! run round-robin, one repetition per child per round, so that drift on a
//! shared machine hits all of them alike; the median is reported.
//!
//! Modules, by concern:
//! * [`workload`] — the synthetic conversation and its snapshots, chain
//!   conversations, store set-up (local stores, their files);
//!   [`s3like`] — the S3-like emulation (per-GET latency, streamed bodies);
//!   [`shaped`] — the bandwidth-shaped S3 emulation (latency per request,
//!   a cap per connection and an aggregate cap);
//! * [`floors`] — the read, spec and durable write floors every ratio is
//!   measured against;
//! * [`scenarios`] — the measured restores and publications (flat, v1,
//!   cold, S3-like, real S3, zstd, chains) and the order they run in;
//! * [`runner`] and [`measure`] — child processes, repetitions, CPU and
//!   peak-memory accounting;
//! * [`report`] — `results.json`, `results.md`, `results.svg`, `chain.svg`
//!   and `machine.txt` (under `--out`).
//!
//! Not published: a workspace member for developers and CI (`.ci/smoke`
//! runs every suite at a tiny scale), not part of the `deltapack` CLI.

mod floors;
mod measure;
mod report;
mod runner;
mod s3like;
mod scenarios;
mod shaped;
mod workload;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Macro benchmarks of deltapack: restore and publication (v2 vs v1) on
/// real stores against floors measured in the same run; writes JSON,
/// markdown and SVG.
#[derive(Debug, Parser)]
#[command(name = "deltapack-bench", version, long_about = None)]
#[command(after_help = "Logs go to stderr (RUST_LOG filters them; default warn).")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// v2 and v1 restores (warm, cold, S3-like latency, real S3 if given)
    /// and the read floors.
    Restore(BenchArgs),
    /// Durable v2 and v1 publication and the durable write floor.
    Publish(BenchArgs),
    /// Restore cost against the number of turns of a conversation (chains
    /// of 1, 4, 16, 64 and 256 deltas ending in the same snapshot) and the
    /// publication of each conversation's last turn.
    Chain(BenchArgs),
    /// v2 and v1 restore and v2 publication through the bandwidth-shaped
    /// S3 emulation (latency per request, a cap per connection, an
    /// aggregate cap), against the aggregate-bandwidth floor.
    Shaped(BenchArgs),
    /// Restore and publish, the shaped scenarios, the zstd study and chain.
    All(BenchArgs),
    /// Lookup and restore with the capacity ledger up and down (S3-like
    /// latency), in request rounds.
    LedgerDown(scenarios::ledger_down::LedgerDownArgs),
    /// Publishing one more turn of conversations of several lengths (warm
    /// tail-only, warm full snapshot, cold, cold tail-only, and the CLI's
    /// `publish --tail` in a fresh process) against the durable write floor
    /// of the bytes written.
    Turn(scenarios::turn::TurnArgs),
    /// One benchmark job in a child process (used by the suites).
    #[command(hide = true)]
    BenchOne(BenchOneArgs),
}

/// Which scenarios to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Suite {
    /// `restore`.
    Restore,
    /// `publish`.
    Publish,
    /// `chain`.
    Chain,
    /// `shaped`.
    Shaped,
    /// `all`.
    All,
}

/// The options of every suite.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// Workload scale: 1 is the reference (result at 262,144 tokens, a
    /// ≈ 1.576 GB delta); F multiplies the result tokens.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) scale: f64,
    /// `s3://bucket/prefix` (with `?endpoint=…` for a local server): also
    /// publish and restore there (at --s3-scale). Without it,
    /// DELTAPACK_TEST_S3_ENDPOINT (+ DELTAPACK_TEST_S3_BUCKET) is used if set.
    /// A `file://` URL or a path instead chooses where the temporary local
    /// stores are created (default: the system temp dir).
    #[arg(long, value_name = "URL")]
    pub(crate) store: Option<String>,
    /// Print the report as JSON on stdout (the files are written either way).
    #[arg(long)]
    pub(crate) json: bool,
    /// Directory for results.json, results.md, results.svg and machine.txt.
    #[arg(long, value_name = "DIR", default_value = "benches/results")]
    pub(crate) out: PathBuf,
    /// Repetitions of every timing (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=25))]
    pub(crate) repeats: u32,
    /// Simulated per-GET latency of the S3-like scenario, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 20)]
    pub(crate) latency_ms: u64,
    /// Shaped S3 emulation: latency before the first byte of every
    /// request (GET, HEAD, PUT, multipart part), in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 20)]
    pub(crate) shaped_latency_ms: u64,
    /// Shaped S3 emulation: bandwidth cap C of one connection (a GET body,
    /// a PUT, a part), MB/s (10⁶ bytes).
    #[arg(long, value_name = "MB_S", default_value_t = 25.0)]
    pub(crate) shaped_conn_mb_s: f64,
    /// Shaped S3 emulation: aggregate bandwidth cap A shared by all
    /// connections, MB/s (10⁶ bytes).
    #[arg(long, value_name = "MB_S", default_value_t = 400.0)]
    pub(crate) shaped_aggregate_mb_s: f64,
    /// Scale of the real-S3 scenario (default: min(--scale, 1/16)).
    #[arg(long, value_name = "F")]
    pub(crate) s3_scale: Option<f64>,
    /// Extent size M of the v2 stores (power of two; default 64 MiB).
    #[arg(long, value_name = "BYTES")]
    pub(crate) extent_bytes: Option<u64>,
    /// Keep the temporary stores (their path is printed).
    #[arg(long)]
    pub(crate) keep: bool,
    /// Conversation lengths of the chain scenario (comma-separated; default
    /// 1,4,16,64,256). N = 1 (the flat root) always runs; an N larger than
    /// the final snapshot's number of chunks is skipped.
    #[arg(long, value_name = "N,N,…", value_delimiter = ',')]
    pub(crate) chain_turns: Option<Vec<u32>>,
    /// Before each timed child, wait up to this many seconds for the
    /// machine to be idle (other processes using < 0.3 cores over 1 s), so
    /// that a shared machine's load disturbs the figures less.
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub(crate) wait_idle: u64,
}

impl BenchArgs {
    /// The shaped S3 emulation's parameters (`--shaped-*`), checked.
    pub(crate) fn shaping(&self) -> anyhow::Result<shaped::Shaping> {
        let rate = |flag: &str, mb_s: f64| -> anyhow::Result<u64> {
            if !(0.001..=1e6).contains(&mb_s) {
                anyhow::bail!("{flag} must be between 0.001 and 1,000,000 MB/s, got {mb_s}");
            }
            Ok((mb_s * 1e6).round() as u64)
        };
        Ok(shaped::Shaping {
            latency_ms: self.shaped_latency_ms,
            conn_bytes_per_s: rate("--shaped-conn-mb-s", self.shaped_conn_mb_s)?,
            aggregate_bytes_per_s: rate("--shaped-aggregate-mb-s", self.shaped_aggregate_mb_s)?,
        })
    }
}

/// The hidden child command.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchOneArgs {
    /// The job, as JSON (written by the parent `deltapack-bench`).
    #[arg(long)]
    pub(crate) job: String,
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    // Fails only if a subscriber is already installed, which cannot happen here.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Restores the default SIGPIPE action so that `deltapack-bench … | head`
/// ends quietly instead of panicking on a closed stdout.
#[cfg(unix)]
fn default_sigpipe() {
    // SAFETY: called first thing in main, before any other thread exists;
    // setting a signal disposition to SIG_DFL has no other preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn default_sigpipe() {}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the tokio runtime: {e}"))?;
    rt.block_on(async move {
        match cli.command {
            Command::Restore(a) => scenarios::run(Suite::Restore, a).await,
            Command::Publish(a) => scenarios::run(Suite::Publish, a).await,
            Command::Chain(a) => scenarios::run(Suite::Chain, a).await,
            Command::Shaped(a) => scenarios::run(Suite::Shaped, a).await,
            Command::All(a) => scenarios::run(Suite::All, a).await,
            Command::LedgerDown(a) => scenarios::ledger_down::run(a).await,
            Command::Turn(a) => scenarios::turn::run(a).await,
            Command::BenchOne(a) => runner::run_one(a).await,
        }
    })
}

fn main() -> ExitCode {
    default_sigpipe();
    // Usage errors exit with clap's code 2 (and --help/--version with 0).
    let cli = Cli::parse();
    init_tracing();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

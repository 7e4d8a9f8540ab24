//! `deltapack-bench`: deltapack's macro benchmarks on real stores, with the
//! machine's floors measured in the same run on the same bytes.
//!
//! ```text
//! cargo run --release -p deltapack-bench -- all --scale 1 --wait-idle 30
//! cargo run --release -p deltapack-bench -- chain --scale 1
//! cargo run --release -p deltapack-bench -- shaped --scale 1
//! cargo run --release -p deltapack-bench -- layers --scale 1
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
//!   cold, S3-like, real S3, zstd, chains), the studies (`layers`,
//!   `ledger-down`, `tiers`, `turn`) and the order they run in;
//! * [`runner`] (the parent's side), [`bench_one`] (the child's side),
//!   [`job`] (what they exchange) and [`measure`] — child processes,
//!   repetitions, CPU and peak-memory accounting;
//! * [`args`] — the options of the suites and of the child command;
//! * [`report`] — `results.json`, `results.md`, `results.svg`, `chain.svg`
//!   and `machine.txt` (under `--out`).
//!
//! Not published: a workspace member for developers and CI (`.ci/smoke`
//! runs every suite at a tiny scale), not part of the `deltapack` CLI.

mod args;
mod bench_one;
mod floors;
mod job;
mod measure;
mod report;
mod runner;
mod s3like;
mod scenarios;
mod shaped;
mod workload;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::args::{BenchArgs, BenchOneArgs, Suite};

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
    /// A node-local tier in front of the bandwidth-shaped S3 emulation: the
    /// first and second restore on a node (flat and a chain) against the
    /// shaped and the local-disk restore, and write-through and behind
    /// publication against the shaped and the local publication.
    Tiers(scenarios::tiers::TiersArgs),
    /// The layer-wise restore (`Store::restore_layers_with`) on local disk,
    /// the S3-like and the shaped emulation: time to the first layer and to
    /// the outcome against `restore_into`, overlap with a paced consumer
    /// (a simulated device upload), peak memory.
    Layers(scenarios::layers::LayersArgs),
    /// One benchmark job in a child process (used by the suites).
    #[command(hide = true)]
    BenchOne(BenchOneArgs),
}

/// Logs to stderr at `warn` unless `RUST_LOG` says otherwise (plain text:
/// bench output is usually captured to a file).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false);
    let _ = fmt.with_writer(std::io::stderr).try_init();
}

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
            Command::Tiers(a) => scenarios::tiers::run(a).await,
            Command::Layers(a) => scenarios::layers::run(a).await,
            Command::BenchOne(a) => bench_one::run_one(a).await,
        }
    })
}

fn main() -> ExitCode {
    // `deltapack-bench … | head` ends quietly instead of panicking on a
    // closed stdout. SAFETY: first thing in main, before any other thread.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
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

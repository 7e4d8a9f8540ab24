//! `deltapack` — the command-line tool of the deltapack store.
//!
//! Commands: `identity`, `synth`, `publish`, `restore`, `inspect`, `sweep`,
//! `evict`, `hold`, `release`, `prune`, `clear`, `invalidate`, `ledger`,
//! `stats`, `migrate` (`--check` proves it without writing), `compat`
//! (`check`, `record`, `fixtures`, `freeze`: compatibility checks for a
//! downstream CI), `config`, `completions`, `demo` (see
//! `deltapack --help`). The benchmarks are
//! a separate, unpublished binary: `deltapack-bench` (crates/deltapack-bench).
//!
//! Exit codes: 0 success (or a restore hit), 1 error (including a publication
//! conflict), 2 usage error (clap's default), 3 miss (no usable state: the
//! reason is printed, as a JSON object with `--json`), 4 damage found by
//! `sweep`. Errors go to stderr, each cause once; with `--json` as one JSON
//! object `{"error": {"kind", "message", "causes", "hint"}}` whose `kind`
//! is stable (see `errors.rs`).
//!
//! Store options come from flags, `DELTAPACK_*` environment variables and a
//! TOML file (`--config`), in that order of precedence (`settings.rs`).
//!
//! Logs go to stderr through `tracing` (filter with `RUST_LOG`, default
//! `warn`); results go to stdout. Progress bars are drawn on stderr only when
//! it is a terminal.

mod common;
mod compat;
mod demo;
mod errors;
mod exit;
mod inspect;
mod lookup;
mod ops;
mod provenance;
mod publish;
mod restore;
mod settings;
mod sweep;
mod synth;
mod tier;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgGroup, CommandFactory, FromArgMatches, Parser, Subcommand};

use exit::{Usage, EXIT_ERROR, EXIT_USAGE};

/// Authenticated macro-object delta store for paged prefix state.
#[derive(Debug, Parser)]
#[command(name = "deltapack", version, long_about = None)]
#[command(
    after_help = "Exit codes: 0 success/hit, 1 error or conflict, 2 usage, 3 miss, 4 sweep found damage.\n\
Store options: flag > DELTAPACK_* environment > --config FILE (TOML) > default\n\
(`deltapack config show` prints each with its source).\n\
Logs go to stderr (RUST_LOG filters them; default warn)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the example cache identity, or check an identity file and print
    /// its namespace.
    Identity(IdentityArgs),
    /// Synthesize a deterministic snapshot (and its token ids).
    Synth(synth::SynthArgs),
    /// Publish a snapshot (flat, or as a delta against a published base).
    Publish(publish::PublishArgs),
    /// Restore and verify the snapshot of a context into a file.
    Restore(restore::RestoreArgs),
    /// The longest stored boundary of a token sequence (from the ledger's
    /// root index, confirmed with one HEAD). Exits 3 when none is stored.
    Lookup(lookup::LookupArgs),
    /// List the roots of a store, or show one root in detail.
    Inspect(inspect::InspectArgs),
    /// Verify every object roots reference, quarantine corrupt ones,
    /// invalidate roots that need them, reclaim orphans past the grace period.
    /// Exits 4 if damage was found.
    #[command(alias = "verify")]
    Sweep(sweep::SweepArgs),
    /// Evict least recently used roots until the store fits a byte target
    /// (pins and holds respected; a base goes only with its deltas).
    Evict(ops::EvictArgs),
    /// Place a named, persistent hold on a root (protects it from eviction
    /// and prune).
    Hold(ops::HoldArgs),
    /// Release a named hold.
    Release(ops::HoldArgs),
    /// Remove roots matching filters (namespace, schema, idle time).
    Prune(ops::PruneArgs),
    /// Remove every root (or one namespace's), holds included.
    Clear(ops::ClearArgs),
    /// Invalidate a namespace (e.g. the model changed) or one context.
    Invalidate(ops::InvalidateArgs),
    /// Rebuild the capacity ledger from the store, or show its totals.
    Ledger(ops::LedgerArgs),
    /// Ledger gauges and counters (`--prometheus` for the text exposition).
    Stats(ops::StatsArgs),
    /// The node-local tier (`--tier`): upload what was acknowledged in it
    /// (`upload`), or show what it holds (`status`).
    Tier(tier::TierCmdArgs),
    /// Migrate legacy v1 roots to v2 (each replaced atomically after its
    /// snapshot digest is proven unchanged); `--check` proves it for every
    /// v1 root without writing anything (exits 3 if one would not migrate).
    Migrate(ops::MigrateArgs),
    /// Compatibility checks for CI: every root decodes, verifies, restores
    /// bit-exactly and re-encodes identically (`check`, `record`), over a
    /// store or a frozen fixture directory (`fixtures`, `freeze`). Never
    /// writes to the store checked. Exits 3 on any failure.
    Compat(compat::CompatArgs),
    /// Show the store settings in effect (`config show`): each option's
    /// value and whether it came from a flag, the environment, the
    /// configuration file or the default.
    Config(settings::ConfigArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish,
    /// powershell) on stdout, e.g. `deltapack completions bash >
    /// /etc/bash_completion.d/deltapack`.
    Completions(CompletionsArgs),
    /// Run the main job end to end: a multi-turn conversation published as
    /// v2 deltas and as legacy v1 roots, restored and verified.
    Demo(demo::DemoArgs),
}

#[derive(Debug, clap::Args)]
#[command(group(ArgGroup::new("what").args(["example", "file"]).required(true)))]
struct IdentityArgs {
    /// Print the example identity (a template for your own) as JSON.
    #[arg(long)]
    example: bool,
    /// An identity JSON file to validate; prints its namespace.
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

fn completions(a: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut cmd = Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "deltapack", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}

fn identity(args: IdentityArgs) -> anyhow::Result<ExitCode> {
    if args.example {
        println!(
            "{}",
            deltapack_format::CacheIdentity::example().to_json_pretty()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let Some(path) = args.file else {
        anyhow::bail!("give --example or an identity FILE");
    };
    let id = common::read_identity(&path)?;
    if args.json {
        common::print_json(&serde_json::json!({
            "namespace": id.namespace().hex(),
            "chunk_tokens": id.chunk_tokens,
            "publication_schema": id.publication_schema,
        }))?;
    } else {
        println!("namespace     {}", id.namespace().hex());
        println!("chunk_tokens  {}", id.chunk_tokens);
        println!("schema        {}", id.publication_schema);
    }
    Ok(ExitCode::SUCCESS)
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Fails only if a subscriber is already installed, which cannot happen here.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Identity(a) => identity(a),
        Command::Synth(a) => synth::run(a),
        Command::Config(a) => settings::run(a),
        Command::Completions(a) => completions(a),
        command => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(|e| anyhow::anyhow!("cannot start the tokio runtime: {e}"))?;
            let out = rt.block_on(async move {
                let out = match command {
                    Command::Publish(a) => publish::run(a).await,
                    Command::Restore(a) => restore::run(a).await,
                    Command::Inspect(a) => inspect::run(a).await,
                    Command::Lookup(a) => lookup::run(a).await,
                    Command::Demo(a) => demo::run(a).await,
                    Command::Sweep(a) => sweep::run(a).await,
                    Command::Evict(a) => ops::evict(a).await,
                    Command::Hold(a) => ops::hold(a, false).await,
                    Command::Release(a) => ops::hold(a, true).await,
                    Command::Prune(a) => ops::prune(a).await,
                    Command::Clear(a) => ops::clear(a).await,
                    Command::Invalidate(a) => ops::invalidate(a).await,
                    Command::Ledger(a) => ops::ledger(a).await,
                    Command::Stats(a) => ops::stats(a).await,
                    Command::Tier(a) => tier::run(a).await,
                    Command::Migrate(a) => ops::migrate(a).await,
                    Command::Compat(a) => compat::run(a).await,
                    Command::Identity(_)
                    | Command::Synth(_)
                    | Command::Config(_)
                    | Command::Completions(_) => {
                        unreachable!("handled without a runtime")
                    }
                };
                common::close_stores().await;
                out
            });
            // The stores are closed and their work flushed: what still
            // runs is a straggler (a ledger connection a read gave up
            // waiting for, to a server that does not answer). Exit within
            // a quarter of a second instead of waiting for it.
            rt.shutdown_timeout(std::time::Duration::from_millis(250));
            out
        }
    }
}

/// Restores the default SIGPIPE action so that `deltapack … | head` ends
/// quietly like other Unix tools instead of panicking on a closed stdout.
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

fn main() -> ExitCode {
    default_sigpipe();
    // Usage errors exit with clap's code 2 (and --help/--version with 0).
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    provenance::set_matches(&matches);
    init_tracing();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            errors::report(&e, provenance::json_requested());
            if e.downcast_ref::<Usage>().is_some() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::from(EXIT_ERROR)
            }
        }
    }
}

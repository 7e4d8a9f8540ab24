//! `deltapack restore`: restore and verify one context into a file.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::ArgGroup;
use deltapack_format::ContextHasher;
use deltapack_store::{MissReason, RestoreOptions, RestoreOutcome};

use crate::common;

#[derive(Debug, clap::Args)]
#[command(group(ArgGroup::new("target").args(["context", "tokens"]).required(true)))]
pub(crate) struct RestoreArgs {
    #[command(flatten)]
    store: crate::settings::StoreArgs,
    /// Cache identity JSON file.
    #[arg(long, value_name = "FILE")]
    identity: PathBuf,
    /// Context digest (64 hex).
    #[arg(long, value_name = "HEX")]
    context: Option<String>,
    /// Token ids (u32 LE) whose context to restore, instead of --context.
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// Where to write the verified snapshot encoding: FILE is written as
    /// FILE.tmp and renamed, so it is never seen half written (nothing is
    /// written on a miss); `-` streams it to stdout, and the report goes to
    /// stderr.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Also fsync the output file and its directory before reporting, so it
    /// survives a power cut (off by default: the page cache writes it back).
    #[arg(long)]
    durable: bool,
    /// Give up (a deadline-exceeded miss) after this long, e.g. 500ms, 2s.
    #[arg(long, value_name = "DURATION", env = "DELTAPACK_DEADLINE",
          value_parser = crate::settings::parse_duration, conflicts_with = "deadline_ms")]
    deadline: Option<Duration>,
    /// Deprecated: --deadline in milliseconds (kept for one release).
    #[arg(long, value_name = "N", hide = true)]
    deadline_ms: Option<u64>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// Runs `deltapack restore`.
pub(crate) async fn run(args: RestoreArgs) -> Result<ExitCode> {
    let identity = common::read_identity(&args.identity)?;
    let ns = identity.namespace();
    let context = match (&args.context, &args.tokens) {
        (Some(hex), _) => common::parse_context(hex)?,
        (None, Some(path)) => {
            let t = common::read_tokens(path)?;
            ContextHasher::new(ns, identity.chunk_tokens)?.digest(&t)
        }
        (None, None) => bail!("give --context or --tokens"),
    };
    let store = args.store.open()?;
    let deadline = args
        .deadline
        .or(args.deadline_ms.map(Duration::from_millis));
    let opts =
        RestoreOptions::default().with_deadline(deadline.map(|d| tokio::time::Instant::now() + d));
    let to_stdout = args.out.as_os_str() == "-";
    let pb = common::spinner(format!("restoring {}", common::short(&context.hex())));
    let start = Instant::now();
    let outcome = store.restore((ns, context), opts).await;
    let elapsed = start.elapsed();
    pb.finish_and_clear();
    common::persist_counters(&store).await;

    match outcome? {
        RestoreOutcome::Hit(r) => {
            let bytes = r.snapshot.encoded();
            let t_write = Instant::now();
            if to_stdout {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes)
                    .and_then(|()| out.flush())
                    .context("cannot write the snapshot to stdout")?;
            } else {
                common::write_atomic_with(&args.out, bytes, args.durable)?;
            }
            let write_time = t_write.elapsed();
            // With `--out -` stdout carries the snapshot: the report goes to
            // stderr.
            let say = |line: String| say(line, to_stdout);
            if args.json {
                let report = serde_json::json!({
                    "outcome": "hit",
                    "namespace": ns.hex(),
                    "context": context.hex(),
                    "digest": r.digest.to_string(),
                    "bytes": bytes.len(),
                    "boundary": r.snapshot.boundary(),
                    "schema": r.schema,
                    "restore_ms": common::ms(elapsed),
                    "write_ms": common::ms(write_time),
                    "out": args.out,
                    "durable": args.durable,
                });
                say(serde_json::to_string_pretty(&report)?);
            } else {
                say(format!("hit       {}", context.hex()));
                say(format!("digest    {}", r.digest));
                say(format!(
                    "bytes     {} ({}), {} tokens",
                    bytes.len(),
                    common::human_bytes(bytes.len() as u64),
                    r.snapshot.boundary()
                ));
                say(format!("schema    {}", r.schema));
                say(format!(
                    "time      {:.1} ms restore+verify, {:.1} ms write{}",
                    common::ms(elapsed),
                    common::ms(write_time),
                    if args.durable { " (durable)" } else { "" }
                ));
                say(format!("out       {}", args.out.display()));
            }
            // A restore the store served fills the node's tier in the
            // background; this process waits for it before it exits (the
            // report above is already out).
            store.tier_settle().await;
            Ok(ExitCode::SUCCESS)
        }
        RestoreOutcome::Miss(reason) => {
            print_miss_to(
                &reason,
                &ns.hex(),
                &context.hex(),
                args.json,
                Some(elapsed),
                to_stdout,
            )?;
            Ok(ExitCode::from(crate::exit::EXIT_MISS))
        }
    }
}

/// Prints a miss: `{"outcome":"miss","reason":…}` with `--json`, a line
/// otherwise.
pub(crate) fn print_miss(
    reason: &MissReason,
    namespace: &str,
    context: &str,
    json: bool,
    elapsed: Option<Duration>,
) -> Result<()> {
    print_miss_to(reason, namespace, context, json, elapsed, false)
}

/// [`print_miss`], on stderr when `to_stderr` (stdout carries data).
fn print_miss_to(
    reason: &MissReason,
    namespace: &str,
    context: &str,
    json: bool,
    elapsed: Option<Duration>,
    to_stderr: bool,
) -> Result<()> {
    let say = |line: String| say(line, to_stderr);
    if json {
        let mut v = serde_json::to_value(reason)?;
        if let Some(obj) = v.as_object_mut() {
            obj.insert("outcome".into(), "miss".into());
            obj.insert("namespace".into(), namespace.into());
            obj.insert("context".into(), context.into());
            if let Some(d) = elapsed {
                obj.insert("restore_ms".into(), common::ms(d).into());
            }
        }
        say(serde_json::to_string_pretty(&v)?);
    } else {
        say(format!("miss      {context}"));
        say(format!("reason    {reason}"));
        if let Some(d) = elapsed {
            say(format!("time      {:.1} ms", common::ms(d)));
        }
    }
    Ok(())
}

/// Prints a report line on stdout, or on stderr when stdout carries data.
fn say(line: String, to_stderr: bool) {
    if to_stderr {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

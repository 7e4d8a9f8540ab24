//! `deltapack restore`: restore and verify one context into a file.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::ArgGroup;
use deltapack_format::ContextHasher;
use deltapack_store::{MissReason, RestoreOptions, RestoreOutcome};

use crate::common;

#[derive(Debug, clap::Args)]
#[command(group(ArgGroup::new("target").args(["context", "tokens"]).required(true)))]
pub(crate) struct RestoreArgs {
    #[command(flatten)]
    store: common::StoreArgs,
    /// Cache identity JSON file.
    #[arg(long, value_name = "FILE")]
    identity: PathBuf,
    /// Context digest (64 hex).
    #[arg(long, value_name = "HEX")]
    context: Option<String>,
    /// Token ids (u32 LE) whose context to restore, instead of --context.
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// Where to write the verified snapshot encoding (via FILE.tmp + rename;
    /// nothing is written on a miss).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Give up (a deadline-exceeded miss) after this many milliseconds.
    #[arg(long, value_name = "N")]
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
    let opts = RestoreOptions::default().with_deadline(
        args.deadline_ms
            .map(|n| tokio::time::Instant::now() + Duration::from_millis(n)),
    );
    let pb = common::spinner(format!("restoring {}", common::short(&context.hex())));
    let start = Instant::now();
    let outcome = store.restore((ns, context), opts).await;
    let elapsed = start.elapsed();
    pb.finish_and_clear();

    match outcome? {
        RestoreOutcome::Hit(r) => {
            let bytes = r.snapshot.encoded();
            let t_write = Instant::now();
            common::write_atomic(&args.out, bytes)?;
            let write_time = t_write.elapsed();
            if args.json {
                common::print_json(&serde_json::json!({
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
                }))?;
            } else {
                println!("hit       {}", context.hex());
                println!("digest    {}", r.digest);
                println!(
                    "bytes     {} ({}), {} tokens",
                    bytes.len(),
                    common::human_bytes(bytes.len() as u64),
                    r.snapshot.boundary()
                );
                println!("schema    {}", r.schema);
                println!(
                    "time      {:.1} ms restore+verify, {:.1} ms write",
                    common::ms(elapsed),
                    common::ms(write_time)
                );
                println!("out       {}", args.out.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        RestoreOutcome::Miss(reason) => {
            print_miss(&reason, &ns.hex(), &context.hex(), args.json, Some(elapsed))?;
            Ok(ExitCode::from(crate::EXIT_MISS))
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
        common::print_json(&v)?;
    } else {
        println!("miss      {context}");
        println!("reason    {reason}");
        if let Some(d) = elapsed {
            println!("time      {:.1} ms", common::ms(d));
        }
    }
    Ok(())
}

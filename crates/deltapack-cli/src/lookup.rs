//! `deltapack lookup`: the longest stored boundary of a token sequence.
//!
//! A placement layer asks this before it decides where to run a request:
//! which prefix of the prompt is already stored, and under which context.
//! The store answers from its ledger's root index and confirms the chosen
//! root with one HEAD; nothing is read or verified (use `restore` for
//! that). With the ledger down or slower than `--ledger-deadline`, the
//! answer comes from the store itself (the candidates' roots probed by
//! name); `source` says which.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use deltapack_format::ContextHasher;

use crate::common;

#[derive(Debug, clap::Args)]
pub(crate) struct LookupArgs {
    #[command(flatten)]
    store: crate::settings::StoreArgs,
    /// Cache identity JSON file.
    #[arg(long, value_name = "FILE")]
    identity: PathBuf,
    /// Token ids (u32 LE) of the request.
    #[arg(long, value_name = "FILE")]
    tokens: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// Runs `deltapack lookup`: exit 0 with the boundary and context on a hit,
/// 3 when no boundary of the request is stored.
pub(crate) async fn run(args: LookupArgs) -> Result<ExitCode> {
    let identity = common::read_identity(&args.identity)?;
    let ns = identity.namespace();
    let tokens = common::read_tokens(&args.tokens)?;
    let candidates = ContextHasher::new(ns, identity.chunk_tokens)?.boundaries(&tokens);
    let store = args.store.open()?;
    let start = Instant::now();
    let answer = store.lookup_detailed(&identity, &candidates).await;
    let elapsed = start.elapsed();
    common::persist_counters(&store).await;
    let answer = answer?;
    let source = match answer.source {
        deltapack_store::LookupSource::Ledger => "ledger",
        _ => "store",
    };
    let base = serde_json::json!({
        "namespace": ns.hex(),
        "tokens": tokens.len(),
        "candidates": candidates.len(),
        "lookup_ms": common::ms(elapsed),
        "source": source,
    });
    match answer.found {
        Some((boundary, context)) => {
            if args.json {
                let mut v = base;
                if let Some(o) = v.as_object_mut() {
                    o.insert("outcome".into(), "hit".into());
                    o.insert("boundary".into(), boundary.into());
                    o.insert("context".into(), context.hex().into());
                }
                common::print_json(&v)?;
            } else {
                println!("hit       {}", context.hex());
                println!("boundary  {boundary} of {} tokens", tokens.len());
                println!("source    {source}");
                println!("time      {:.1} ms", common::ms(elapsed));
            }
            Ok(ExitCode::SUCCESS)
        }
        None => {
            if args.json {
                let mut v = base;
                if let Some(o) = v.as_object_mut() {
                    o.insert("outcome".into(), "miss".into());
                }
                common::print_json(&v)?;
            } else {
                println!(
                    "miss      no stored boundary among {} candidates",
                    candidates.len()
                );
                println!("time      {:.1} ms", common::ms(elapsed));
            }
            Ok(ExitCode::from(crate::exit::EXIT_MISS))
        }
    }
}

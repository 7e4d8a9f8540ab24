//! `deltapack tier`: the node-local tier in front of a store — its upload
//! journal (`upload`, `abandon`) and what it holds and did (`status`).

use std::process::ExitCode;

use anyhow::{bail, Result};

use crate::common::{human_bytes, print_json};
use crate::settings::StoreArgs;

/// `deltapack tier upload|status|abandon`.
#[derive(Debug, clap::Args)]
pub(crate) struct TierCmdArgs {
    /// `upload` copies every publication acknowledged in the tier (by any
    /// process of this node, including one that was killed) to the store
    /// now, objects before roots, and exits 1 if any is still pending;
    /// `status` shows the tier's contents, budget and upload backlog;
    /// `abandon` gives up the journal entries (pending or in conflict) of
    /// `--namespace`/`--context` and of every delta on it in the tier,
    /// removes them from the tier, and says which are lost (not in the
    /// store).
    #[arg(value_parser = ["upload", "status", "abandon"])]
    action: String,
    /// `abandon`: the namespace (hex).
    #[arg(long, value_name = "HEX", required_if_eq("action", "abandon"))]
    namespace: Option<String>,
    /// `abandon`: the context (hex).
    #[arg(long, value_name = "HEX", required_if_eq("action", "abandon"))]
    context: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// Runs `deltapack tier`.
pub(crate) async fn run(a: TierCmdArgs) -> Result<ExitCode> {
    let store = a.store.open()?;
    if store.tier_store().is_none() {
        bail!("no tier configured: give --tier (or DELTAPACK_TIER, or `tier` in the config file)");
    }
    if a.action == "abandon" {
        let (Some(ns), Some(ctx)) = (&a.namespace, &a.context) else {
            bail!("tier abandon needs --namespace and --context");
        };
        let ns = ns
            .parse()
            .map_err(|e| anyhow::anyhow!("--namespace: {e}"))?;
        let ctx = crate::common::parse_context(ctx)?;
        let r = store.tier_abandon(ns, ctx).await?;
        if a.json {
            print_json(&r)?;
        } else {
            println!(
                "abandoned {} journal entries; removed {} roots from the tier",
                r.abandoned.len(),
                r.removed
            );
            for e in &r.abandoned {
                let fate = if e.in_origin {
                    "in the store: nothing lost"
                } else {
                    "LOST: not in the store"
                };
                println!("  - {} ({}): {fate}", e.root, e.state);
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    if a.action == "upload" {
        let r = store.tier_upload().await?;
        if a.json {
            print_json(&r)?;
        } else {
            println!(
                "uploaded {}, conflicts {}, failed {}, still pending {}",
                r.uploaded, r.conflicts, r.failed, r.remaining
            );
            for k in &r.conflicted {
                println!(
                    "  kept as a conflict: {k}: the store holds another snapshot there; \
                     `deltapack tier abandon` drops the tier's copy"
                );
            }
        }
        return Ok(if r.remaining == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let report = store.stats_report().await?;
    let Some(t) = report.tier else {
        bail!("no tier configured");
    };
    if a.json {
        print_json(&t)?;
    } else {
        println!("tier       {}", t.url);
        println!(
            "used       {} of budget {}",
            human_bytes(t.ledger.used_bytes),
            t.budget_bytes
                .map(human_bytes)
                .unwrap_or_else(|| "none".into())
        );
        println!("roots      {}", t.ledger.roots);
        println!(
            "backlog    {} publications not yet in the store",
            t.upload_backlog
        );
    }
    Ok(ExitCode::SUCCESS)
}

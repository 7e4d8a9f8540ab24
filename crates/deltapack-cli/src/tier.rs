//! `deltapack tier`: the node-local tier in front of a store — its upload
//! journal (`upload`) and what it holds and did (`status`).

use std::process::ExitCode;

use anyhow::{bail, Result};

use crate::common::{human_bytes, print_json};
use crate::settings::StoreArgs;

/// `deltapack tier upload|status`.
#[derive(Debug, clap::Args)]
pub(crate) struct TierCmdArgs {
    /// `upload` copies every publication acknowledged in the tier (by any
    /// process of this node, including one that was killed) to the store
    /// now, objects before roots, and exits 1 if any is still pending;
    /// `status` shows the tier's contents, budget and upload backlog.
    #[arg(value_parser = ["upload", "status"])]
    action: String,
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
    if a.action == "upload" {
        let r = store.tier_upload().await?;
        if a.json {
            print_json(&r)?;
        } else {
            println!(
                "uploaded {}, conflicts {}, failed {}, still pending {}",
                r.uploaded, r.conflicts, r.failed, r.remaining
            );
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

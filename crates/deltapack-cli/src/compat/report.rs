//! Output of the checks: one line (text or JSON) per root, and the summary.

use std::process::ExitCode;

use anyhow::{Context, Result};

use super::root_check::RootResult;
use crate::common;

/// Prints one root's line (text, or a JSON line).
pub(super) fn print_result(r: &RootResult, json: bool) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string(r).context("serializing JSON output")?
        );
        return Ok(());
    }
    let schema = r.schema.as_deref().map(common::short_schema).unwrap_or("?");
    let name = format!(
        "{}/{}",
        common::short(&r.namespace),
        common::short(&r.context)
    );
    let label = r
        .label
        .as_deref()
        .map(|l| format!(" [{l}]"))
        .unwrap_or_default();
    match r.status {
        "ok" => {
            let note = match (r.mac, r.expected) {
                (Some("unchecked"), _) => " (keyed: MAC not checked, no key given)",
                (_, Some(false)) => " (not in --expect)",
                _ => "",
            };
            println!(
                "ok       {schema:<5} {name}  {}{label}{note}",
                r.snapshot_digest.as_deref().unwrap_or("")
            );
        }
        status => {
            let object = r
                .object
                .as_deref()
                .map(|o| format!(" {o}"))
                .unwrap_or_default();
            println!(
                "{:<8} {schema:<5} {name}{label}  {}{object}: {}",
                status.to_uppercase(),
                r.check.unwrap_or("?"),
                r.detail.as_deref().unwrap_or("")
            );
        }
    }
    Ok(())
}

/// Prints the summary (stdout in text mode, stderr with --json) and
/// returns the exit code: 0 when every root passed, 3 otherwise.
pub(super) fn finish(what: &str, results: &[RootResult], refused: u64, json: bool) -> ExitCode {
    let failed = results.iter().filter(|r| r.failed()).count();
    let mut line = format!(
        "{what}: {} roots, {} ok, {failed} failed",
        results.len(),
        results.len() - failed
    );
    if refused > 0 {
        line.push_str(&format!(
            "; {refused} writes refused (a restore's quarantine of damaged data: the store was not changed)"
        ));
    }
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::EXIT_MISS)
    }
}

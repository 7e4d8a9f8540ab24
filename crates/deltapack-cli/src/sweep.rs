//! `deltapack sweep` (alias `verify`): the integrity sweep.

use std::process::ExitCode;

use anyhow::{bail, Result};
use deltapack_store::SweepOptions;

use crate::common::{dry_run_note, human_bytes, print_json, spinner};
use crate::settings::StoreArgs;

/// Arguments of `deltapack sweep`.
#[derive(Debug, clap::Args)]
pub(crate) struct SweepArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Verify only objects whose first digest byte is n modulo m ("n/m");
    /// m runs with n = 0..m-1 cover everything.
    #[arg(long, value_name = "N/M", value_parser = parse_subset)]
    subset: Option<(u8, u8)>,
    /// Pace verification to at most this size per second (e.g. 200MiB).
    #[arg(long, value_name = "SIZE", value_parser = crate::settings::parse_size)]
    rate: Option<u64>,
    /// Report what would be done without changing anything.
    #[arg(long)]
    dry_run: bool,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

fn parse_subset(s: &str) -> std::result::Result<(u8, u8), String> {
    let (n, m) = s.split_once('/').ok_or("expected N/M, e.g. 0/4")?;
    let n: u8 = n.parse().map_err(|_| "N must be 0..255")?;
    let m: u8 = m.parse().map_err(|_| "M must be 1..255")?;
    if m == 0 || n >= m {
        return Err("need 0 <= N < M".into());
    }
    Ok((n, m))
}

pub(crate) async fn run(a: SweepArgs) -> Result<ExitCode> {
    let resolved = a.store.resolve()?;
    let url = resolved.url()?;
    let store = resolved.open()?;
    let bar = spinner("sweeping");
    let opts = SweepOptions::default()
        .with_grace(resolved.config.capacity.grace)
        .with_subset(a.subset)
        .with_bytes_per_second(a.rate)
        .with_dry_run(a.dry_run);
    let report = store.sweep(&opts).await;
    bar.finish_and_clear();
    let report = match report {
        Ok(r) => r,
        Err(e) => bail!("sweep of {} failed: {e}", url),
    };
    if a.json {
        print_json(&report)?;
    } else {
        println!("sweep of {}{}", url, dry_run_note(a.dry_run));
        let count = |keys: &[String]| keys.len() as u64;
        let rows: [(&str, u64, Option<String>); 10] = [
            ("roots", report.roots, None),
            ("unusable roots", count(&report.unusable_roots), None),
            (
                "checked",
                report.checked,
                Some(human_bytes(report.checked_bytes)),
            ),
            ("corrupt", count(&report.corrupt), None),
            ("missing", count(&report.missing), None),
            ("quarantined", report.quarantined, None),
            ("invalidated roots", count(&report.invalidated_roots), None),
            (
                "orphans deleted",
                report.orphans_deleted,
                Some(format!("{} reclaimed", human_bytes(report.reclaimed_bytes))),
            ),
            ("orphans in grace", report.orphans_in_grace, None),
            ("staging removed", report.staging_removed, None),
        ];
        for (label, n, note) in rows {
            match note {
                Some(note) => println!("  {label:<17} {n:>10}  ({note})"),
                None => println!("  {label:<17} {n:>10}"),
            }
        }
        for k in report
            .corrupt
            .iter()
            .chain(&report.missing)
            .chain(&report.invalidated_roots)
        {
            println!("  ! {k}");
        }
    }
    let damaged = !report.corrupt.is_empty() || !report.missing.is_empty();
    Ok(if damaged {
        ExitCode::from(crate::exit::EXIT_DAMAGE)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsets() {
        assert_eq!(parse_subset("1/4"), Ok((1, 4)));
        assert!(parse_subset("4/4").is_err());
        assert!(parse_subset("1").is_err());
    }
}

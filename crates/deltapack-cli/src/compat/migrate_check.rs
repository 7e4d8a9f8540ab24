//! `deltapack migrate --check`: every v1 root would migrate without
//! changing its snapshot, proven through a read-only handle.

use std::process::ExitCode;

use anyhow::{Context, Result};
use deltapack_format::Namespace;
use deltapack_store::StoreConfig;

use super::handles::open_read_only;
use crate::common;
use crate::settings::StoreArgs;

/// `deltapack migrate --check`: proves every v1 root would migrate to a v2
/// root with the same snapshot digest, through a read-only handle.
pub(crate) async fn migrate_check(
    s: &StoreArgs,
    namespace: Option<Namespace>,
    json: bool,
) -> Result<ExitCode> {
    let resolved = s.resolve()?;
    let config = StoreConfig::default().with_mac_secret(resolved.config.mac_secret.clone());
    let (store, refused) = open_read_only(&resolved.url()?, config)?;
    let proofs = store.migrate_check(namespace).await?;
    let mut failed = 0;
    for p in &proofs {
        if !p.proven {
            failed += 1;
        }
        if json {
            println!(
                "{}",
                serde_json::to_string(p).context("serializing JSON output")?
            );
        } else if p.proven {
            println!(
                "proven   {}/{}  {}  → v2 with {} extents ({} B root)",
                common::short(&p.namespace),
                common::short(&p.context),
                p.snapshot_digest,
                p.extents,
                p.v2_root_bytes
            );
        } else {
            println!(
                "FAIL     {}/{}  {}: {}",
                common::short(&p.namespace),
                common::short(&p.context),
                p.snapshot_digest,
                p.reason.as_deref().unwrap_or("")
            );
        }
    }
    let refused = refused.count();
    let mut line = format!(
        "migrate --check (nothing written): {} v1 roots, {} proven, {failed} would not migrate identically",
        proofs.len(),
        proofs.len() - failed
    );
    if refused > 0 {
        line.push_str(&format!("; {refused} writes refused"));
    }
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::EXIT_MISS)
    })
}

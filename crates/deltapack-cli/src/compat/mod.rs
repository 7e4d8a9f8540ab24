//! `deltapack compat check|record|fixtures|freeze` and `deltapack migrate
//! --check`: proof, for a downstream project's CI, that its stored roots and
//! frozen fixtures still decode, restore bit-exactly to their recorded
//! snapshot digests and would migrate without changing a snapshot.
//!
//! Every check reads the store through `handles::open_read_only`: the
//! store's read-only backend (`Backend::read_only`: it refuses every write
//! — put, copy, rename, delete — and counts them), a handle that believes
//! it is a `memory://` store (so no local fast path writes
//! behind the wrapper's back, e.g. the restore's quarantine on local disk
//! or its root lock file) and an in-memory capacity ledger (so the store's
//! `ledger/` file, or the state directory's, is never opened). A restore
//! that finds a damaged object tries to quarantine it; the backend refuses,
//! and the number of refused writes is reported. Objects are checked by
//! the store's own `Store::verify_root`, and a failure names its object
//! from the typed miss (`MissReason::object`), never from error text.
//!
//! Files: `handles` (read-only handles), `root_check` (one root's checks),
//! `report` (output), `expect` (check and record), `fixtures` (fixture
//! sets and freeze), `migrate_check` (`migrate --check`).

use std::process::ExitCode;

use anyhow::Result;

mod expect;
mod fixtures;
mod handles;
mod migrate_check;
mod report;
mod root_check;

use expect::{check, record, CheckArgs, RecordArgs};
use fixtures::{fixtures, freeze, FixturesArgs, FreezeArgs};
pub(crate) use migrate_check::migrate_check;

/// `deltapack compat`.
#[derive(Debug, clap::Args)]
pub(crate) struct CompatArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Check every root of a store: it decodes (schema, envelope, MAC with
    /// a key), every object it references verifies, it restores bit-exactly
    /// to its recorded snapshot digest (and to --expect's), and its body
    /// re-encodes byte-identically. Never writes to the store. Exits 3 on
    /// any failure.
    Check(CheckArgs),
    /// Check every root, then write the digests `check --expect` compares
    /// with (written only if every root passed).
    Record(RecordArgs),
    /// The same checks over a frozen fixture directory (expected.json,
    /// inputs/, store/), against its expected digests and input snapshots.
    Fixtures(FixturesArgs),
    /// Check a store, then freeze it as a fixture directory that
    /// `compat fixtures` checks (refuses an existing non-empty DIR).
    Freeze(FreezeArgs),
}

pub(crate) async fn run(a: CompatArgs) -> Result<ExitCode> {
    match a.action {
        Action::Check(a) => check(a).await,
        Action::Record(a) => record(a).await,
        Action::Fixtures(a) => fixtures(a).await,
        Action::Freeze(a) => freeze(a).await,
    }
}

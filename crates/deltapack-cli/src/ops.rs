//! Operator commands over the capacity ledger: `evict`, `hold`, `release`,
//! `prune`, `clear`, `invalidate`, `ledger rebuild|show|adopt`, `stats`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use deltapack_format::{CacheIdentity, Namespace};
use deltapack_store::{Ownership, PruneFilter, RemovalReport, Store};

use crate::common::{self, dry_run_note, human_bytes, print_json};
use crate::exit::{Usage, EXIT_ERROR, EXIT_MISS, EXIT_USAGE};
use crate::settings::StoreArgs;

/// Options every operator command shares: the store, and JSON output.
#[derive(Debug, clap::Args)]
pub(crate) struct OpArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

impl OpArgs {
    fn open(&self) -> Result<Store> {
        self.store.open()
    }
}

/// `deltapack evict`.
#[derive(Debug, clap::Args)]
pub(crate) struct EvictArgs {
    #[command(flatten)]
    s: OpArgs,
    /// Evict least recently used roots until the store fits this size, e.g.
    /// 40GiB (default: the `--budget`).
    #[arg(long = "to", value_name = "SIZE", value_parser = crate::settings::parse_size)]
    target: Option<u64>,
    /// Print the plan without changing anything.
    #[arg(long)]
    dry_run: bool,
}

/// `deltapack hold` / `release`.
#[derive(Debug, clap::Args)]
pub(crate) struct HoldArgs {
    #[command(flatten)]
    s: OpArgs,
    /// Hold name (1–64 of [A-Za-z0-9._-]).
    #[arg(long)]
    name: String,
    /// Namespace hex (or give --identity).
    #[arg(long, value_name = "HEX", required_unless_present = "identity")]
    namespace: Option<String>,
    /// Identity file giving the namespace.
    #[arg(long, value_name = "FILE")]
    identity: Option<std::path::PathBuf>,
    /// Context hex.
    #[arg(
        long,
        value_name = "HEX",
        required_unless_present = "tokens",
        conflicts_with = "tokens"
    )]
    context: Option<String>,
    /// Token ids (u32 LE) whose context to name, instead of --context
    /// (needs --identity).
    #[arg(long, value_name = "FILE", requires = "identity")]
    tokens: Option<std::path::PathBuf>,
}

/// `deltapack prune`.
#[derive(Debug, clap::Args)]
pub(crate) struct PruneArgs {
    #[command(flatten)]
    s: OpArgs,
    /// Only this namespace (hex).
    #[arg(long, value_name = "HEX")]
    namespace: Option<String>,
    /// Only roots of this schema (v1 or v2).
    #[arg(long)]
    schema: Option<String>,
    /// Only roots not accessed for this long (e.g. 7d, 12h).
    #[arg(long, value_name = "DURATION", value_parser = crate::settings::parse_duration)]
    idle: Option<Duration>,
    /// Print the plan without changing anything.
    #[arg(long)]
    dry_run: bool,
}

/// `deltapack clear`.
#[derive(Debug, clap::Args)]
pub(crate) struct ClearArgs {
    #[command(flatten)]
    s: OpArgs,
    /// Only this namespace (hex); default everything.
    #[arg(long, value_name = "HEX")]
    namespace: Option<String>,
    /// Print the plan without changing anything.
    #[arg(long)]
    dry_run: bool,
    /// Confirm: delete every root and object in scope (required unless
    /// --dry-run).
    #[arg(long)]
    yes: bool,
}

/// `deltapack invalidate`.
#[derive(Debug, clap::Args)]
pub(crate) struct InvalidateArgs {
    #[command(flatten)]
    s: OpArgs,
    /// Namespace hex (e.g. of an identity whose model changed).
    #[arg(
        long,
        value_name = "HEX",
        required_unless_present = "identity",
        conflicts_with = "identity"
    )]
    namespace: Option<String>,
    /// Identity file giving the namespace, instead of --namespace.
    #[arg(long, value_name = "FILE")]
    identity: Option<std::path::PathBuf>,
    /// Only this context (hex) and the deltas above it.
    #[arg(long, value_name = "HEX", conflicts_with = "tokens")]
    context: Option<String>,
    /// Only the context of these token ids (u32 LE; needs --identity) and
    /// the deltas above it.
    #[arg(long, value_name = "FILE", requires = "identity")]
    tokens: Option<std::path::PathBuf>,
    /// Print the plan without changing anything.
    #[arg(long)]
    dry_run: bool,
}

/// `deltapack ledger`.
#[derive(Debug, clap::Args)]
pub(crate) struct LedgerArgs {
    #[command(flatten)]
    s: OpArgs,
    /// `show` prints the ledger's totals and which ledger the store names
    /// (its binding); `rebuild` recomputes this ledger from the store;
    /// `adopt` makes this handle's ledger the one that accounts for the
    /// store (e.g. after losing a node's state directory, or moving a store
    /// from SQLite to PostgreSQL), then rebuilds it.
    #[arg(value_parser = ["rebuild", "show", "adopt"])]
    action: String,
    /// `adopt`: how long to wait, after taking the store over, for
    /// deletions the previous ledger's processes started just before (they
    /// re-check the binding before each batch and stop).
    #[arg(long, value_name = "DURATION", value_parser = crate::settings::parse_duration)]
    fence: Option<Duration>,
    /// `adopt`: the previous ledger's processes are known to be stopped
    /// (its node is gone, its state directory lost): do not wait.
    #[arg(long, conflicts_with = "fence")]
    old_owner_gone: bool,
}

/// `deltapack stats`.
#[derive(Debug, clap::Args)]
pub(crate) struct StatsArgs {
    #[command(flatten)]
    s: OpArgs,
    /// The metrics registry in the Prometheus/OpenMetrics text format
    /// (ledger gauges as of now; counters of this process only).
    #[arg(long, conflicts_with = "json")]
    prometheus: bool,
}

/// The namespace a command names: `--namespace` if given, else the
/// `--identity` file's (which is returned too, for `--tokens`).
fn namespace_of(
    namespace: Option<&str>,
    identity: Option<&std::path::Path>,
) -> Result<(Namespace, Option<CacheIdentity>)> {
    let identity = identity.map(common::read_identity).transpose()?;
    let namespace = match (namespace, &identity) {
        (Some(h), _) => ns(h)?,
        (None, Some(id)) => id.namespace(),
        (None, None) => anyhow::bail!("give --namespace or --identity"),
    };
    Ok((namespace, identity))
}

fn ns(hex: &str) -> Result<Namespace> {
    hex.parse().map_err(|e| anyhow::anyhow!("--namespace: {e}"))
}

fn print_removal(what: &str, r: &RemovalReport, json: bool) -> Result<ExitCode> {
    if json {
        print_json(r)?;
    } else {
        println!("{what}{}: {} roots", dry_run_note(r.dry_run), r.roots.len());
        for k in &r.roots {
            println!("  - {k}");
        }
        if !r.overridden_holds.is_empty() {
            println!(
                "{} {} held root(s) ({what} overrides holds; their markers go with them):",
                if r.dry_run { "would remove" } else { "removed" },
                r.overridden_holds.len()
            );
            for h in &r.overridden_holds {
                println!("  - {h}");
            }
        }
        let grace = deltapack_store::units::format_duration(std::time::Duration::from_secs(
            r.grace_seconds,
        ));
        if !r.dry_run {
            println!(
                "condemned {} objects ({}); deleted {} objects ({})",
                r.condemned_objects,
                human_bytes(r.condemned_bytes),
                r.deleted_objects,
                human_bytes(r.deleted_bytes)
            );
        }
        let left = r.dry_run || r.condemned_bytes > r.deleted_bytes;
        if left && r.grace_seconds > 0 && !r.roots.is_empty() {
            println!(
                "the objects only these roots used stay in the store until the grace period \
                 ({grace}) ends; `sweep --grace 0s` deletes them now"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Shows a removal plan (dry run) or carries it out, then reports.
async fn carry_out(
    store: &deltapack_store::Store,
    plan: deltapack_store::RemovalPlan,
    dry_run: bool,
    what: &str,
    json: bool,
) -> Result<ExitCode> {
    let r = if dry_run {
        plan.preview()
    } else {
        store.execute(plan).await?
    };
    print_removal(what, &r, json)
}

pub(crate) async fn evict(a: EvictArgs) -> Result<ExitCode> {
    let resolved = a.s.store.resolve()?;
    let Some(target) = a.target.or(resolved.config.capacity.budget_bytes) else {
        anyhow::bail!("give --budget SIZE (or --to SIZE)");
    };
    let store = resolved.open()?;
    let plan = store.evict_plan(target).await?;
    carry_out(&store, plan, a.dry_run, "evict", a.s.json).await
}

pub(crate) async fn hold(a: HoldArgs, release: bool) -> Result<ExitCode> {
    let (namespace, identity) = namespace_of(a.namespace.as_deref(), a.identity.as_deref())?;
    let Some(context) =
        common::context_of(identity.as_ref(), a.context.as_deref(), a.tokens.as_deref())?
    else {
        anyhow::bail!("give --context or --tokens");
    };
    let store = a.s.open()?;
    if release {
        let existed = store.release(&a.name, namespace, context).await?;
        if a.s.json {
            print_json(&serde_json::json!({ "released": existed }))?;
        } else if existed {
            println!("released");
        } else {
            println!("no hold {:?} on {context}: nothing released", a.name);
        }
        if !existed {
            // Like a miss: a typo in --name must not pass for a release.
            return Ok(ExitCode::from(EXIT_MISS));
        }
    } else {
        store.hold(&a.name, namespace, context).await?;
        if a.s.json {
            print_json(&serde_json::json!({ "held": true }))?;
        } else {
            println!("held {} as {:?}", context, a.name);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn prune(a: PruneArgs) -> Result<ExitCode> {
    let store = a.s.open()?;
    let filter = PruneFilter::default()
        .with_namespace(a.namespace.as_deref().map(ns).transpose()?)
        .with_schema(a.schema.clone())
        .with_idle_for(a.idle);
    let plan = store.prune_plan(&filter).await?;
    carry_out(&store, plan, a.dry_run, "prune", a.s.json).await
}

pub(crate) async fn clear(a: ClearArgs) -> Result<ExitCode> {
    if !a.yes && !a.dry_run {
        eprintln!(
            "error: `deltapack clear` deletes every root and object{}; run it again with --yes \
             (or see what it would remove with --dry-run)",
            if a.namespace.is_some() {
                " of the namespace"
            } else {
                " of the store"
            }
        );
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let store = a.s.open()?;
    let plan = store
        .clear_plan(a.namespace.as_deref().map(ns).transpose()?)
        .await?;
    carry_out(&store, plan, a.dry_run, "clear", a.s.json).await
}

pub(crate) async fn invalidate(a: InvalidateArgs) -> Result<ExitCode> {
    let (namespace, identity) = namespace_of(a.namespace.as_deref(), a.identity.as_deref())?;
    let context = common::context_of(identity.as_ref(), a.context.as_deref(), a.tokens.as_deref())?;
    let store = a.s.open()?;
    let plan = store.invalidate_plan(namespace, context).await?;
    carry_out(&store, plan, a.dry_run, "invalidate", a.s.json).await
}

pub(crate) async fn ledger(a: LedgerArgs) -> Result<ExitCode> {
    if a.action != "adopt" && (a.fence.is_some() || a.old_owner_gone) {
        return Err(Usage("--fence and --old-owner-gone go with `ledger adopt`".into()).into());
    }
    let store = a.s.open()?;
    if a.action == "adopt" {
        let fence = if a.old_owner_gone {
            Duration::ZERO
        } else {
            a.fence.unwrap_or(deltapack_store::DEFAULT_FENCE)
        };
        if !fence.is_zero() && !a.s.json {
            eprintln!(
                "adopting: if another ledger owns the store, waiting {}s for deletions its \
                 processes started before the adoption (--old-owner-gone skips this)",
                fence.as_secs()
            );
        }
        let report = store.adopt(fence).await?;
        if a.s.json {
            print_json(&report)?;
        } else {
            match (&report.previous, report.changed) {
                (_, false) => println!("this ledger already accounts for the store"),
                (None, true) => match &report.replaced_unreadable {
                    Some(what) => println!(
                        "replaced an unreadable binding ({what}) and bound the store to this ledger"
                    ),
                    None => println!("bound the store to this ledger"),
                },
                (Some(p), true) => println!(
                    "adopted the store from {} ({}, id {}, generation {}); that ledger is refused from now on",
                    p.description, p.engine, p.ledger_id, p.generation
                ),
            }
            let b = &report.binding;
            println!(
                "store ledger      {} ({}, id {}, generation {})",
                b.description, b.engine, b.ledger_id, b.generation
            );
            let m = &report.merge;
            println!(
                "rebuilt           {} roots added, {} replaced, {} kept, {} removed",
                m.added, m.replaced, m.kept, m.removed
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let totals = if a.action == "rebuild" {
        store.rebuild_ledger().await?
    } else {
        // A short-lived process must not report an account the background
        // reconciliation had no time to finish (e.g. a node's first use
        // of a bucket with a fresh ledger).
        store.reconcile_ledger().await?;
        store.ledger_totals().await?
    };
    let location = store.ledger_location().await?;
    let binding = store.binding_status().await?;
    if a.s.json {
        #[derive(serde::Serialize)]
        struct Shown<'a> {
            engine: &'a str,
            location: &'a str,
            persisted: bool,
            binding: &'a deltapack_store::BindingStatus,
            #[serde(flatten)]
            totals: &'a deltapack_store::Totals,
        }
        print_json(&Shown {
            engine: location.engine,
            location: &location.location,
            persisted: location.persisted,
            binding: &binding,
            totals: &totals,
        })?;
    } else {
        println!(
            "engine            {:>12}  ({})",
            location.engine, location.location
        );
        println!("ledger id         {}", binding.this_ledger.ledger_id);
        match (&binding.store_ledger, &binding.ownership) {
            (_, Ownership::Owner) => {
                println!("store's ledger    this one (generation {})", binding.this_ledger.generation)
            }
            (_, Ownership::Unbound) => {
                println!("store's ledger    none yet (the first publication binds it to this one)")
            }
            (Some(b), _) => println!(
                "store's ledger    ANOTHER: {} ({}, id {}, generation {}): this handle may read, not publish or delete",
                b.description, b.engine, b.ledger_id, b.generation
            ),
            (None, Ownership::Foreign { detail }) => {
                println!("store's ledger    unusable: {detail}")
            }
            (None, _) => println!("store's ledger    unknown"),
        }
        println!("roots             {:>12}", totals.roots);
        println!(
            "objects           {:>12}  ({})",
            totals.objects,
            human_bytes(totals.object_bytes)
        );
        println!(
            "condemned         {:>12}  ({})",
            totals.condemned_objects,
            human_bytes(totals.condemned_bytes)
        );
        println!("root bytes        {:>12}", human_bytes(totals.root_bytes));
        println!("used (budgeted)   {:>12}", human_bytes(totals.used_bytes));
        for (n, b) in &totals.per_namespace {
            println!("  {}  {}", common::short(n), human_bytes(*b));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn stats(a: StatsArgs) -> Result<ExitCode> {
    let store = a.s.open()?;
    store.reconcile_ledger().await?;
    if a.prometheus {
        // The registry a process that called `register_metrics` serves:
        // this process's counters (zero but for the reconciliation's
        // reads) and the ledger gauges, which `stats_report` refreshes.
        use deltapack_store::prometheus_client::{encoding::text, registry::Registry};
        let mut registry = Registry::default();
        store.register_metrics(&mut registry);
        store.stats_report().await?;
        let mut out = String::new();
        text::encode(&mut out, &registry)?;
        print!("{out}");
        return Ok(ExitCode::SUCCESS);
    }
    let report = store.stats_report().await?;
    if a.s.json {
        print_json(&report)?;
    } else {
        println!(
            "used       {} of budget {}",
            human_bytes(report.ledger.used_bytes),
            report
                .budget_bytes
                .map(human_bytes)
                .unwrap_or_else(|| "none".into())
        );
        println!("roots      {}", report.ledger.roots);
        println!(
            "objects    {} ({})",
            report.ledger.objects,
            human_bytes(report.ledger.object_bytes)
        );
        println!(
            "condemned  {} ({})",
            report.ledger.condemned_objects,
            human_bytes(report.ledger.condemned_bytes)
        );
        if let Some(f) = report.free_bytes {
            println!("free       {}", human_bytes(f));
        }
        for (name, v) in &report.counters {
            println!("{name:<28} {v}");
        }
        if let Some(t) = &report.tier {
            println!(
                "tier       {} ({} roots, {} of budget {}, {} to upload)",
                t.url,
                t.ledger.roots,
                human_bytes(t.ledger.used_bytes),
                t.budget_bytes
                    .map(human_bytes)
                    .unwrap_or_else(|| "none".into()),
                t.upload_backlog
            );
            let p = &t.process;
            println!(
                "tier hits {}, misses {}, fall-throughs {}, refused {}, fills {} ({} downloaded, {} from restores)",
                p.hits,
                p.misses,
                p.fall_throughs,
                p.refused,
                p.fills,
                human_bytes(p.fill_bytes),
                human_bytes(p.fill_reused_bytes)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `deltapack migrate`.
#[derive(Debug, clap::Args)]
pub(crate) struct MigrateArgs {
    #[command(flatten)]
    s: OpArgs,
    /// Only this namespace (hex).
    #[arg(long, value_name = "HEX")]
    namespace: Option<String>,
    /// Print the plan without changing anything.
    #[arg(long)]
    dry_run: bool,
    /// Prove, writing nothing (through a read-only handle), that each v1
    /// root would migrate to a v2 root with the same snapshot digest: the
    /// v2 root is built in memory and its result rebuilt and hashed. One
    /// line per root; exits 3 if any would not migrate identically.
    #[arg(long, conflicts_with = "dry_run")]
    check: bool,
}

pub(crate) async fn migrate(a: MigrateArgs) -> Result<ExitCode> {
    if a.check {
        let namespace = a.namespace.as_deref().map(ns).transpose()?;
        return crate::compat::migrate_check(&a.s.store, namespace, a.s.json).await;
    }
    let store = a.s.open()?;
    let r = store
        .migrate(a.namespace.as_deref().map(ns).transpose()?, a.dry_run)
        .await?;
    if a.s.json {
        print_json(&r)?;
    } else {
        println!(
            "migrate v1 → v2{}: {} v1 roots, {} migrated, {} skipped",
            dry_run_note(r.dry_run),
            r.v1_roots,
            r.migrated.len(),
            r.skipped.len()
        );
        println!(
            "objects before {} → after {}; {} written",
            r.objects_before,
            r.objects_after,
            human_bytes(r.bytes_written)
        );
        for s in &r.skipped {
            println!("  ! {s}");
        }
    }
    Ok(if r.skipped.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_ERROR)
    })
}

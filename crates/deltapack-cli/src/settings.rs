//! Store settings from flags, `DELTAPACK_*` environment variables and a
//! TOML configuration file, layered in that order over the defaults.
//!
//! Every store option is a flag whose environment variable is
//! `DELTAPACK_` + the flag's name in capitals (`--budget` and
//! `DELTAPACK_BUDGET`, `--min-free` and `DELTAPACK_MIN_FREE`) and a key of
//! the same name in the file given by `--config FILE` or `DELTAPACK_CONFIG`
//! (`budget = "50GiB"`; the chain policy in a `[chain]` table). A value
//! given on the command line wins over the environment, which wins over the
//! file, which wins over the built-in default. `deltapack config show`
//! prints every option with its value and where it came from.
//!
//! The sources are told apart with clap's `ArgMatches::value_source`: the
//! parsed arguments keep `None` for an option not given, and [`crate::provenance::set_matches`]
//! keeps the command's matches so that [`crate::provenance::source_of`] can tell a flag from an
//! environment variable.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::parser::ValueSource;
use deltapack_store::units;
use deltapack_store::{ChainPolicy, ConfigFile, Store, StoreConfig};

use crate::provenance::{pick, source_of, Setting, Shown, Source};

/// Environment variable holding the root MAC secret itself.
pub(crate) const ROOT_KEY_ENV: &str = "DELTAPACK_ROOT_KEY";

/// Parses a size with units (`50GiB`, `1.5TB`, `64M`, `1000`) for clap.
pub(crate) fn parse_size(s: &str) -> std::result::Result<u64, String> {
    units::parse_size(s)
}

/// Parses a duration with units (`500ms`, `90s`, `1h30m`, `90`) for clap.
pub(crate) fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    units::parse_duration(s)
}

/// The ledger cold-start policies a command may choose: the library's
/// `ColdStart::Clear` deletes every root and object, so no command offers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ColdStartArg {
    /// Trust the persisted ledger after a consistency check.
    Load,
    /// Rebuild the ledger from the store.
    Rebuild,
}

impl ColdStartArg {
    /// The library policy.
    pub(crate) fn policy(self) -> deltapack_store::ColdStart {
        match self {
            ColdStartArg::Load => deltapack_store::ColdStart::Load,
            ColdStartArg::Rebuild => deltapack_store::ColdStart::Rebuild,
        }
    }

    fn from_file(c: deltapack_store::FileColdStart) -> Self {
        match c {
            deltapack_store::FileColdStart::Rebuild => ColdStartArg::Rebuild,
            _ => ColdStartArg::Load,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ColdStartArg::Load => "load",
            ColdStartArg::Rebuild => "rebuild",
        }
    }
}

/// Which store to open and how: the options every store-opening command
/// shares (flattened into each command's arguments). Each is also a
/// `DELTAPACK_*` environment variable and a key of the `--config` file.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StoreArgs {
    /// Store URL: file:///dir (or a plain path), s3://bucket/prefix,
    /// memory://.
    #[arg(long, value_name = "URL", env = "DELTAPACK_STORE")]
    pub(crate) store: Option<String>,
    /// TOML file with store settings (keys named as these flags, e.g.
    /// budget = "50GiB"); flags and DELTAPACK_* variables override it.
    #[arg(long, value_name = "FILE", env = "DELTAPACK_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) key: KeyArgs,
    /// Hard size budget of the store (objects + roots), e.g. 50GiB or 1.5TB;
    /// publications evict least recently used roots to stay within it.
    #[arg(long, value_name = "SIZE", env = "DELTAPACK_BUDGET", value_parser = parse_size)]
    pub(crate) budget: Option<u64>,
    /// Minimum free space to keep on the store's filesystem (local disk),
    /// e.g. 10GiB.
    #[arg(long, value_name = "SIZE", env = "DELTAPACK_MIN_FREE", value_parser = parse_size)]
    pub(crate) min_free: Option<u64>,
    /// Grace period before condemned or unreferenced objects are deleted
    /// (e.g. 0s, 15m, 1h30m; default 1h). Zero is only safe for a store
    /// used by one process.
    #[arg(long, value_name = "DURATION", env = "DELTAPACK_GRACE", value_parser = parse_duration)]
    pub(crate) grace: Option<Duration>,
    /// How long a lookup waits for the ledger before it answers from the
    /// store (probing the roots by name), e.g. 50ms (the default), 1s.
    #[arg(long, value_name = "DURATION", env = "DELTAPACK_LEDGER_DEADLINE", value_parser = parse_duration)]
    pub(crate) ledger_deadline: Option<Duration>,
    /// What to do with the persisted ledger at open: load (check it against
    /// a listing, rebuild if it disagrees; the default) or rebuild. Emptying
    /// a store is `deltapack clear --yes`, never a side effect of another
    /// command.
    #[arg(long, value_name = "POLICY", value_enum, env = "DELTAPACK_COLD_START")]
    pub(crate) cold_start: Option<ColdStartArg>,
    /// Prefill rate in tokens/s, to count hits that beat recomputation.
    #[arg(long, value_name = "TOKENS_PER_S", env = "DELTAPACK_PREFILL_RATE")]
    pub(crate) prefill_rate: Option<f64>,
    /// The capacity ledger's database: sqlite:///path/ledger.sqlite3, or
    /// postgres://user@host/db for a ledger every node of a fleet shares.
    /// Default: the store's own file for file:// stores; for s3:// stores a
    /// SQLite file under the state directory ($DELTAPACK_STATE_DIR, else
    /// $XDG_STATE_HOME/deltapack, else ~/.local/state/deltapack).
    #[arg(long, value_name = "URL", env = "DELTAPACK_LEDGER")]
    pub(crate) ledger: Option<String>,
    /// Memory for decoded base snapshots kept for later deltas (default
    /// 4GiB).
    #[arg(long, value_name = "SIZE", env = "DELTAPACK_BASE_CACHE_BYTES", value_parser = parse_size)]
    pub(crate) base_cache_bytes: Option<u64>,
    /// Longest chain of bases a restore follows before it is a miss
    /// (default 1024).
    #[arg(long, value_name = "N", env = "DELTAPACK_MAX_BASE_DEPTH")]
    pub(crate) max_base_depth: Option<usize>,
    /// Extents a delta-chain restore reads at once from a remote store
    /// (default 32).
    #[arg(long, value_name = "N", env = "DELTAPACK_CHAIN_GETS_IN_FLIGHT")]
    pub(crate) chain_gets_in_flight: Option<usize>,
    /// Roots of a delta chain read at once (default 256): a chain of up to
    /// this many turns costs one round trip for its roots.
    #[arg(long, value_name = "N", env = "DELTAPACK_ROOTS_IN_FLIGHT")]
    pub(crate) roots_in_flight: Option<usize>,
    /// Ranged GETs in flight across a restore from a remote store (default
    /// 32); each extent is read as concurrent ranges of --range-bytes.
    #[arg(long, value_name = "N", env = "DELTAPACK_RANGES_IN_FLIGHT")]
    pub(crate) ranges_in_flight: Option<usize>,
    /// Size of one ranged GET inside an extent (a power of two from 1KiB to
    /// 1GiB; default 8MiB).
    #[arg(long, value_name = "SIZE", env = "DELTAPACK_RANGE_BYTES", value_parser = parse_size)]
    pub(crate) range_bytes: Option<u64>,
    /// Largest snapshot a restore accepts (default 256GiB); a root claiming
    /// more is refused before anything is allocated.
    #[arg(long, value_name = "SIZE", env = "DELTAPACK_MAX_RESTORE_BYTES", value_parser = parse_size)]
    pub(crate) max_restore_bytes: Option<u64>,
    /// Parts uploaded at once across all extents of one publication to a
    /// remote store (S3), whose extents larger than --part-bytes are
    /// multipart uploads (default 32).
    #[arg(long, value_name = "N", env = "DELTAPACK_PARTS_IN_FLIGHT")]
    pub(crate) parts_in_flight: Option<usize>,
    /// Part size of a multipart extent upload to a remote store, from 5MiB
    /// to 5GiB (default 8MiB); a smaller extent is one PUT.
    #[arg(long, value_name = "SIZE", env = "DELTAPACK_PART_BYTES", value_parser = parse_size)]
    pub(crate) part_bytes: Option<u64>,
    #[command(flatten)]
    pub(crate) tier: TierArgs,
}

/// A node-local tier in front of the store: restores read it first (the
/// same verification), fill it from the store, and publications write
/// through it.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TierArgs {
    /// A node-local tier in front of the store: a local directory
    /// (file:///nvme/deltapack or a path) with its own ledger and budget.
    #[arg(long, value_name = "URL", env = "DELTAPACK_TIER")]
    pub(crate) tier: Option<String>,
    /// The tier's size budget, e.g. 500GiB (its least recently used roots
    /// are evicted to stay within it; default: none).
    #[arg(long, value_name = "SIZE", env = "DELTAPACK_TIER_BUDGET", value_parser = parse_size)]
    pub(crate) tier_budget: Option<u64>,
    /// When a publication is acknowledged: origin (durable in the store;
    /// the default) or tier (durable in the tier, uploaded behind; see
    /// `deltapack tier upload`).
    #[arg(long, value_name = "WHEN", value_enum, env = "DELTAPACK_TIER_ACK")]
    pub(crate) tier_ack: Option<TierAckArg>,
    /// How long the store's answer that it holds a root is trusted before a
    /// tier hit for it is checked again (default 5s).
    #[arg(long, value_name = "DURATION", env = "DELTAPACK_TIER_CHECK_INTERVAL", value_parser = parse_duration)]
    pub(crate) tier_check_interval: Option<Duration>,
}

/// When a publication through a tier is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TierAckArg {
    /// Durable in the store (write-through).
    Origin,
    /// Durable in the tier; uploaded to the store behind.
    Tier,
}

impl TierAckArg {
    fn ack(self) -> deltapack_store::TierAck {
        match self {
            TierAckArg::Origin => deltapack_store::TierAck::Origin,
            TierAckArg::Tier => deltapack_store::TierAck::Tier,
        }
    }

    fn from_file(a: deltapack_store::TierAck) -> Self {
        match a {
            deltapack_store::TierAck::Tier => TierAckArg::Tier,
            _ => TierAckArg::Origin,
        }
    }

    fn name(self) -> &'static str {
        match self {
            TierAckArg::Origin => "origin",
            TierAckArg::Tier => "tier",
        }
    }
}

/// How a publishing command lays out v2 payloads: extent size and codec
/// (flattened into `publish`, `demo` and `config show`).
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct ExtentArgs {
    /// Extent size for v2 roots (a power of two from 1KiB to 1GiB; 64MiB
    /// by default — smaller values are for tests).
    #[arg(long, value_name = "SIZE", env = "DELTAPACK_MAX_EXTENT_BYTES", value_parser = parse_size)]
    pub(crate) max_extent_bytes: Option<u64>,
    /// zstd-compress v2 extents at this level (1–22); raw by default.
    #[arg(long, value_name = "LEVEL", env = "DELTAPACK_COMPRESS",
          value_parser = clap::value_parser!(i32).range(1..=22))]
    pub(crate) compress: Option<i32>,
}

/// The delta chain policy of a publication (flattened into `publish` and
/// `config show`; in the file, the `[chain]` table's `max-depth` and
/// `max-read-overhead`).
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct ChainArgs {
    /// Chain policy: publish flat instead of a delta that would sit more
    /// than N deltas above its flat root (0 = no limit).
    #[arg(long, value_name = "N", env = "DELTAPACK_MAX_CHAIN_DEPTH")]
    pub(crate) max_chain_depth: Option<u32>,
    /// Chain policy: publish flat instead of a delta whose chain would hold
    /// more payload than (1 + F) × the result (a composed restore's read
    /// overhead; negative = no limit).
    #[arg(
        long,
        value_name = "F",
        env = "DELTAPACK_MAX_READ_OVERHEAD",
        allow_negative_numbers = true
    )]
    pub(crate) max_read_overhead: Option<f64>,
}

/// The root key option: flattened into [`StoreArgs`], and alone into the
/// commands that take no other store option (`compat`): `--root-key-file
/// FILE` (or `DELTAPACK_ROOT_KEY_FILE`), else the secret in
/// `DELTAPACK_ROOT_KEY`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct KeyArgs {
    /// File holding the secret that authenticates roots (keyed stores). One
    /// trailing newline is ignored. Overrides the DELTAPACK_ROOT_KEY
    /// environment variable (the secret itself). The secret is never
    /// printed or logged.
    #[arg(long, value_name = "FILE", env = "DELTAPACK_ROOT_KEY_FILE")]
    pub(crate) root_key_file: Option<PathBuf>,
}

impl KeyArgs {
    /// The MAC secret, if any source gives one.
    pub(crate) fn mac_secret(&self) -> Result<Option<Vec<u8>>> {
        let secret = match &self.root_key_file {
            Some(p) => read_secret_file(p)?,
            None => match std::env::var_os(ROOT_KEY_ENV) {
                Some(v) => v.into_encoded_bytes(),
                None => return Ok(None),
            },
        };
        Ok(Some(trim_secret(secret)?))
    }
}

/// A store URL, configuration and the provenance of every option.
pub(crate) struct Resolved {
    /// The store URL (None when no source names one).
    pub(crate) url: Option<String>,
    /// The configuration to open it with.
    pub(crate) config: StoreConfig,
    /// Every option with its value and source, for `config show`.
    pub(crate) shown: Vec<Setting>,
}

/// How `config` shows a size: exact, in human units.
fn shown_size(v: &u64) -> String {
    units::format_size_exact(*v)
}

/// How `config` shows an optional size.
fn shown_optional_size(v: Option<&u64>) -> String {
    v.map_or_else(|| "none".into(), shown_size)
}

/// How `config` shows a duration: in human units.
fn shown_duration(d: &Duration) -> String {
    units::format_duration(*d)
}

/// Resolves store options (and, when given, the extent and chain options)
/// over the configuration file and the defaults.
pub(crate) fn resolve(
    s: &StoreArgs,
    extents: Option<&ExtentArgs>,
    chain: Option<&ChainArgs>,
) -> Result<Resolved> {
    let file = match &s.config {
        Some(p) => ConfigFile::load(p)?,
        None => ConfigFile::default(),
    };
    let mut shown = Shown::default();
    let mut c = StoreConfig::default();

    let config_src = match (&s.config, source_of("config")) {
        (None, _) => Source::Default,
        (Some(_), Some(ValueSource::EnvVariable)) => Source::Env,
        (Some(_), _) => Source::Flag,
    };
    shown.push(
        "config",
        s.config
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "none".into()),
        config_src,
    );

    let url = pick("store", &s.store, &file.store);
    shown.push(
        "store",
        url.as_ref()
            .map(|(u, _)| u.clone())
            .unwrap_or_else(|| "none".into()),
        url.as_ref().map_or(Source::Default, |(_, s)| *s),
    );

    resolve_root_key(s, &file, &mut c, &mut shown)?;
    resolve_capacity(s, &file, &mut c, &mut shown)?;
    resolve_reads(s, &file, &mut c, &mut shown)?;
    resolve_publication(extents, chain, &file, &mut c, &mut shown)?;
    resolve_tier(&s.tier, &file, &mut c, &mut shown)?;

    Ok(Resolved {
        url: url.map(|(u, _)| u),
        config: c,
        shown: shown.0,
    })
}

/// The root key: `--root-key-file` / `DELTAPACK_ROOT_KEY_FILE`, else the
/// secret in `DELTAPACK_ROOT_KEY`, else the file's `root-key-file`.
fn resolve_root_key(
    s: &StoreArgs,
    file: &ConfigFile,
    c: &mut StoreConfig,
    shown: &mut Shown,
) -> Result<()> {
    // The root key: --root-key-file / DELTAPACK_ROOT_KEY_FILE, else the
    // secret in DELTAPACK_ROOT_KEY, else the file's root-key-file.
    let key_file = pick("root_key_file", &s.key.root_key_file, &None);
    let secret_env = std::env::var_os(ROOT_KEY_ENV);
    let (secret, key_shown, key_src) = match (key_file, secret_env, &file.root_key_file) {
        (Some((p, src)), _, _) => (Some(read_secret_file(&p)?), p.display().to_string(), src),
        (None, Some(v), _) => (
            Some(v.into_encoded_bytes()),
            format!("(secret from {ROOT_KEY_ENV})"),
            Source::Env,
        ),
        (None, None, Some(p)) => (
            Some(read_secret_file(p)?),
            p.display().to_string(),
            Source::File,
        ),
        (None, None, None) => (None, "none".into(), Source::Default),
    };
    c.mac_secret = match secret {
        Some(s) => Some(trim_secret(s)?),
        None => None,
    };
    shown.push("root-key-file", key_shown, key_src);
    Ok(())
}

/// Budget, free space, grace, the ledger and its deadline, the cold start
/// and the prefill rate, in the order `config` shows them.
fn resolve_capacity(
    s: &StoreArgs,
    file: &ConfigFile,
    c: &mut StoreConfig,
    shown: &mut Shown,
) -> Result<()> {
    let d = StoreConfig::default();
    c.capacity.budget_bytes =
        shown.optional("budget", &s.budget, &file.budget, shown_optional_size);
    c.capacity.min_free_bytes =
        shown.optional("min-free", &s.min_free, &file.min_free, shown_optional_size);
    c.capacity.grace = shown.value(
        "grace",
        &s.grace,
        &file.grace,
        d.capacity.grace,
        shown_duration,
    );
    c.capacity.ledger_deadline = shown.value(
        "ledger-deadline",
        &s.ledger_deadline,
        &file.ledger_deadline,
        d.capacity.ledger_deadline,
        shown_duration,
    );
    let cold = shown.value(
        "cold-start",
        &s.cold_start,
        &file.cold_start.map(ColdStartArg::from_file),
        ColdStartArg::Load,
        |c| c.name().into(),
    );
    c.capacity.cold_start = cold.policy();

    let rate = shown.optional("prefill-rate", &s.prefill_rate, &file.prefill_rate, |r| {
        r.map_or_else(|| "none".into(), |r| r.to_string())
    });
    if let Some(r) = rate {
        if !(r.is_finite() && r > 0.0) {
            bail!("--prefill-rate {r}: a positive number of tokens/s");
        }
    }
    c.restore.prefill_tokens_per_s = rate;

    c.capacity.ledger = shown.optional("ledger", &s.ledger, &file.ledger, |l| {
        l.map(|u| deltapack_store::redact_ledger_url(u))
            .unwrap_or_else(|| "default (next to the store)".into())
    });
    Ok(())
}

/// The node-local tier, its budget, when publications are acknowledged and
/// the coherence check interval, in the order `config` shows them.
fn resolve_tier(
    t: &TierArgs,
    file: &ConfigFile,
    c: &mut StoreConfig,
    shown: &mut Shown,
) -> Result<()> {
    let ack_file = file.tier_ack.map(TierAckArg::from_file);
    let Some((url, src)) = pick("tier", &t.tier, &file.tier) else {
        let given = t.tier_budget.is_some()
            || t.tier_ack.is_some()
            || t.tier_check_interval.is_some()
            || file.tier_budget.is_some()
            || file.tier_ack.is_some()
            || file.tier_check_interval.is_some();
        if given {
            bail!("--tier-budget, --tier-ack and --tier-check-interval need --tier");
        }
        shown.push("tier", "none".into(), Source::Default);
        return Ok(());
    };
    let mut tier = deltapack_store::TierConfig::new(url.clone());
    shown.push("tier", url, src);
    tier.budget_bytes = shown.optional(
        "tier-budget",
        &t.tier_budget,
        &file.tier_budget,
        shown_optional_size,
    );
    let ack = shown.value(
        "tier-ack",
        &t.tier_ack,
        &ack_file,
        TierAckArg::Origin,
        |a| a.name().into(),
    );
    tier.ack = ack.ack();
    tier.check_interval = shown.value(
        "tier-check-interval",
        &t.tier_check_interval,
        &file.tier_check_interval,
        tier.check_interval,
        shown_duration,
    );
    c.tier = Some(tier);
    Ok(())
}

/// The restore's memory bounds and the remote I/O in flight, in the order
/// `config` shows them.
fn resolve_reads(
    s: &StoreArgs,
    file: &ConfigFile,
    c: &mut StoreConfig,
    shown: &mut Shown,
) -> Result<()> {
    let d = StoreConfig::default();
    c.restore.base_cache_bytes = shown.value(
        "base-cache-bytes",
        &s.base_cache_bytes,
        &file.base_cache_bytes,
        d.restore.base_cache_bytes,
        shown_size,
    );
    c.restore.max_base_depth = shown.value(
        "max-base-depth",
        &s.max_base_depth,
        &file.max_base_depth,
        d.restore.max_base_depth,
        |v| v.to_string(),
    );
    c.remote.chain_gets_in_flight = shown.count(
        "chain-gets-in-flight",
        &s.chain_gets_in_flight,
        &file.chain_gets_in_flight,
        d.remote.chain_gets_in_flight,
    )?;
    c.remote.roots_in_flight = shown.count(
        "roots-in-flight",
        &s.roots_in_flight,
        &file.roots_in_flight,
        d.remote.roots_in_flight,
    )?;
    c.remote.ranges_in_flight = shown.count(
        "ranges-in-flight",
        &s.ranges_in_flight,
        &file.ranges_in_flight,
        d.remote.ranges_in_flight,
    )?;

    let v = shown.value(
        "range-bytes",
        &s.range_bytes,
        &file.range_bytes,
        d.remote.range_bytes,
        shown_size,
    );
    if !v.is_power_of_two() || !(1 << 10..=1 << 30).contains(&v) {
        bail!("range-bytes {v} must be a power of two from 1KiB to 1GiB");
    }
    c.remote.range_bytes = v;

    c.restore.max_restore_bytes = shown.value(
        "max-restore-bytes",
        &s.max_restore_bytes,
        &file.max_restore_bytes,
        d.restore.max_restore_bytes,
        shown_size,
    );
    c.remote.parts_in_flight = shown.count(
        "parts-in-flight",
        &s.parts_in_flight,
        &file.parts_in_flight,
        d.remote.parts_in_flight,
    )?;

    let v = shown.value(
        "part-bytes",
        &s.part_bytes,
        &file.part_bytes,
        d.remote.part_bytes,
        shown_size,
    );
    if !(5 << 20..=5 << 30).contains(&v) {
        bail!(
            "part-bytes {}: from 5MiB to 5GiB (the S3 multipart limits)",
            units::format_size_exact(v)
        );
    }
    c.remote.part_bytes = v;
    Ok(())
}

/// Extent size, compression and the chain policy (their flags exist only
/// on the commands that publish).
fn resolve_publication(
    extents: Option<&ExtentArgs>,
    chain: Option<&ChainArgs>,
    file: &ConfigFile,
    c: &mut StoreConfig,
    shown: &mut Shown,
) -> Result<()> {
    let d = StoreConfig::default();
    let e = extents.cloned().unwrap_or_default();
    c.publication.max_extent_bytes = shown.value(
        "max-extent-bytes",
        &e.max_extent_bytes,
        &file.max_extent_bytes,
        d.publication.max_extent_bytes,
        shown_size,
    );
    c.publication.compression = shown.optional("compress", &e.compress, &file.compress, |l| {
        l.map_or_else(|| "none (raw)".into(), |l| format!("zstd level {l}"))
    });

    let ch = chain.cloned().unwrap_or_default();
    let dc = ChainPolicy::default();
    let depth = shown.value(
        "max-chain-depth",
        &ch.max_chain_depth,
        &file.chain.max_depth,
        dc.max_depth.unwrap_or(0),
        |depth| {
            if *depth == 0 {
                "0 (no limit)".into()
            } else {
                depth.to_string()
            }
        },
    );
    c.publication.chain.max_depth = (depth > 0).then_some(depth);
    let over = shown.value(
        "max-read-overhead",
        &ch.max_read_overhead,
        &file.chain.max_read_overhead,
        dc.max_read_overhead.unwrap_or(-1.0),
        |over| {
            if *over < 0.0 {
                "no limit".into()
            } else {
                over.to_string()
            }
        },
    );
    if over.is_nan() {
        bail!("max-read-overhead is not a number");
    }
    c.publication.chain.max_read_overhead = (over >= 0.0).then_some(over);
    Ok(())
}

fn read_secret_file(p: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(p).with_context(|| format!("cannot read the root key file {}", p.display()))
}

/// Drops one trailing newline (and a CR before it); refuses an empty secret.
fn trim_secret(mut secret: Vec<u8>) -> Result<Vec<u8>> {
    if secret.last() == Some(&b'\n') {
        secret.pop();
        if secret.last() == Some(&b'\r') {
            secret.pop();
        }
    }
    if secret.is_empty() {
        bail!("the root key (from --root-key-file or {ROOT_KEY_ENV}) is empty");
    }
    Ok(secret)
}

impl Resolved {
    /// The store URL, or the usage error that no source names one.
    pub(crate) fn url(&self) -> Result<String> {
        match &self.url {
            Some(u) => Ok(u.clone()),
            None => Err(crate::exit::Usage(
                "no store given: pass --store URL, set DELTAPACK_STORE, or put store = \"URL\" in the --config file"
                    .into(),
            )
            .into()),
        }
    }

    /// Opens the store with the resolved configuration; errors name the URL.
    pub(crate) fn open(&self) -> Result<Store> {
        crate::common::open_store(&self.url()?, self.config.clone())
    }
}

impl StoreArgs {
    /// Resolves these options over the file and the defaults (reads the
    /// configuration and root key files once; a command that needs the URL
    /// or configuration besides the opened store keeps the result).
    pub(crate) fn resolve(&self) -> Result<Resolved> {
        resolve(self, None, None)
    }

    /// Opens the store these options describe.
    pub(crate) fn open(&self) -> Result<Store> {
        self.resolve()?.open()
    }
}

/// `deltapack config show`: every store option's value and source.
#[derive(Debug, clap::Args)]
pub(crate) struct ConfigArgs {
    /// What to do: `show` prints every option with its value and source
    /// (flag, env, file, default).
    #[arg(value_parser = ["show"])]
    action: String,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    extents: ExtentArgs,
    #[command(flatten)]
    chain: ChainArgs,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// Runs `deltapack config show`.
pub(crate) fn run(a: ConfigArgs) -> Result<std::process::ExitCode> {
    let r = resolve(&a.store, Some(&a.extents), Some(&a.chain))?;
    if a.json {
        let map: serde_json::Map<String, serde_json::Value> = r
            .shown
            .iter()
            .map(|s| {
                (
                    s.name.to_string(),
                    serde_json::json!({"value": s.value, "source": s.source, "env": s.env}),
                )
            })
            .collect();
        crate::common::print_json(&map)?;
    } else {
        let rows: Vec<Vec<String>> = r
            .shown
            .iter()
            .map(|s| {
                vec![
                    s.name.to_string(),
                    s.value.clone(),
                    s.source.label().to_string(),
                    s.env.clone(),
                ]
            })
            .collect();
        print!(
            "{}",
            crate::common::table(&["option", "value", "source", "environment"], &rows, &[])
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}

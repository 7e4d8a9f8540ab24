//! Helpers shared by the commands: reading inputs, opening stores, output.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use deltapack_format::{CacheIdentity, ContextDigest, Snapshot};
use deltapack_store::{Store, StoreConfig};
use indicatif::{ProgressBar, ProgressStyle};

/// Environment variable holding the root MAC secret.
pub(crate) const ROOT_KEY_ENV: &str = "DELTAPACK_ROOT_KEY";

/// Options every store-opening command shares.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct KeyArgs {
    /// File holding the secret that authenticates roots (keyed stores). One
    /// trailing newline is ignored. Overrides the DELTAPACK_ROOT_KEY
    /// environment variable. The secret is never printed or logged.
    #[arg(long, value_name = "FILE")]
    pub(crate) root_key_file: Option<PathBuf>,
}

impl KeyArgs {
    /// The MAC secret from `--root-key-file` or `DELTAPACK_ROOT_KEY`, if any.
    pub(crate) fn mac_secret(&self) -> Result<Option<Vec<u8>>> {
        let mut secret = match &self.root_key_file {
            Some(p) => std::fs::read(p)
                .with_context(|| format!("cannot read the root key file {}", p.display()))?,
            None => match std::env::var_os(ROOT_KEY_ENV) {
                Some(v) => v.into_encoded_bytes(),
                None => return Ok(None),
            },
        };
        if secret.last() == Some(&b'\n') {
            secret.pop();
            if secret.last() == Some(&b'\r') {
                secret.pop();
            }
        }
        if secret.is_empty() {
            bail!("the root key (from --root-key-file or {ROOT_KEY_ENV}) is empty");
        }
        Ok(Some(secret))
    }
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
}

/// Capacity options shared by the commands that open a store.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CapacityArgs {
    /// Hard byte budget of the store (objects + roots); publications evict
    /// least recently used roots to stay within it.
    #[arg(long, value_name = "BYTES")]
    pub(crate) budget: Option<u64>,
    /// Minimum free space to keep on the store's filesystem (local disk).
    #[arg(long, value_name = "BYTES")]
    pub(crate) min_free: Option<u64>,
    /// Grace period before condemned or unreferenced objects are deleted
    /// (e.g. 0s, 15m, 1h).
    /// Zero is only safe for a store used by one process.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    pub(crate) grace: Duration,
    /// What to do with the persisted ledger at open: load (check it against
    /// a listing, rebuild if it disagrees) or rebuild. Emptying a store is
    /// `deltapack clear --yes`, never a side effect of another command.
    #[arg(long, value_name = "POLICY", value_enum, default_value = "load")]
    pub(crate) cold_start: ColdStartArg,
    /// Prefill rate in tokens/s, to count hits that beat recomputation.
    #[arg(long, value_name = "TOKENS_PER_S")]
    pub(crate) prefill_rate: Option<f64>,
    /// The capacity ledger's database: sqlite:///path/ledger.sqlite3, or
    /// postgres://user@host/db for a ledger every node of a fleet shares.
    /// Default: the store's own file for file:// stores; for s3:// stores a
    /// SQLite file under the state directory ($DELTAPACK_STATE_DIR, else
    /// $XDG_STATE_HOME/deltapack, else ~/.local/state/deltapack).
    #[arg(long, value_name = "URL", env = "DELTAPACK_LEDGER")]
    pub(crate) ledger: Option<String>,
}

impl CapacityArgs {
    /// Applies the options to a configuration.
    pub(crate) fn apply(&self, c: StoreConfig) -> StoreConfig {
        c.with_budget_bytes(self.budget)
            .with_min_free_bytes(self.min_free)
            .with_grace(self.grace)
            .with_cold_start(self.cold_start.policy())
            .with_prefill_tokens_per_s(self.prefill_rate)
            .with_ledger(self.ledger.clone())
    }
}

/// The store `deltapack demo` uses when `--store` is not given: an embedded
/// local store in the working directory. Every other command names its
/// store explicitly (an operator command acting on a default store by
/// accident is the kind of surprise a storage tool must not have).
pub(crate) const DEMO_STORE: &str = "./deltapack-data";

/// How a publishing command lays out v2 payloads: extent size and codec
/// (flattened into `publish` and `demo`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ExtentArgs {
    /// Extent size for v2 roots (a power of two from 1 KiB to 1 GiB; 64 MiB
    /// by default — smaller values are for tests).
    #[arg(long, value_name = "N")]
    pub(crate) max_extent_bytes: Option<u64>,
    /// zstd-compress v2 extents at this level (1–22); raw by default.
    #[arg(long, value_name = "LEVEL", value_parser = clap::value_parser!(i32).range(1..=22))]
    pub(crate) compress: Option<i32>,
}

impl ExtentArgs {
    /// Applies the options to a configuration.
    pub(crate) fn apply(&self, c: StoreConfig) -> StoreConfig {
        c.with_max_extent_bytes(
            self.max_extent_bytes
                .unwrap_or(deltapack_format::DEFAULT_MAX_EXTENT_BYTES),
        )
        .with_compression(self.compress)
    }
}

/// Which store to open and how: the options every store-opening command
/// shares (flattened into each command's arguments).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StoreArgs {
    /// Store URL: file:///dir (or a plain path), s3://bucket/prefix,
    /// memory://.
    #[arg(long, value_name = "URL")]
    pub(crate) store: String,
    #[command(flatten)]
    pub(crate) key: KeyArgs,
    #[command(flatten)]
    pub(crate) capacity: CapacityArgs,
}

impl StoreArgs {
    /// The configuration these options describe (root key, capacity).
    pub(crate) fn config(&self) -> Result<StoreConfig> {
        Ok(self
            .capacity
            .apply(StoreConfig::default())
            .with_mac_secret(self.key.mac_secret()?))
    }

    /// Opens the store with [`StoreArgs::config`].
    pub(crate) fn open(&self) -> Result<Store> {
        self.open_with(self.config()?)
    }

    /// Opens the store with a configuration the command refined from
    /// [`StoreArgs::config`]; errors name the URL.
    pub(crate) fn open_with(&self, config: StoreConfig) -> Result<Store> {
        open_store(&self.store, config)
    }
}

/// Opens a store, naming the URL in errors.
pub(crate) fn open_store(url: &str, config: StoreConfig) -> Result<Store> {
    Store::open(url, config).with_context(|| format!("cannot open store {url}"))
}

/// Reads and validates a cache identity JSON file.
pub(crate) fn read_identity(path: &Path) -> Result<CacheIdentity> {
    let text = std::fs::read(path)
        .with_context(|| format!("cannot read identity file {}", path.display()))?;
    CacheIdentity::from_json(&text).with_context(|| format!("identity file {}", path.display()))
}

/// Parses a context digest given as 64 lowercase hex characters.
pub(crate) fn parse_context(hex: &str) -> Result<ContextDigest> {
    hex.parse::<ContextDigest>()
        .with_context(|| "a context is 64 lowercase hex characters".to_string())
}

/// Reads a token file (u32 little-endian ids).
pub(crate) fn read_tokens(path: &Path) -> Result<Vec<u32>> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("cannot read token file {}", path.display()))?;
    deltapack_format::context::tokens_from_le_bytes(&bytes)
        .with_context(|| format!("token file {}", path.display()))
}

/// Reads and validates an encoded snapshot file.
pub(crate) async fn read_snapshot(path: &Path) -> Result<Snapshot> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let bytes = std::fs::read(&p)
            .with_context(|| format!("cannot read snapshot file {}", p.display()))?;
        Snapshot::from_encoded(bytes).with_context(|| format!("snapshot file {}", p.display()))
    })
    .await
    .context("snapshot reader task")?
}

/// Writes `bytes` to `path` atomically: `path.tmp`, fsync, rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut name = path
        .file_name()
        .with_context(|| format!("{} is not a file path", path.display()))?
        .to_os_string();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}

/// Prints a value as pretty JSON on stdout.
pub(crate) fn print_json(v: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(v).context("serializing JSON output")?;
    println!("{text}");
    Ok(())
}

/// Milliseconds of a duration, with microsecond resolution.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// `12.3 MiB`-style size.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The first 12 characters of a hex string.
pub(crate) fn short(hex: &str) -> &str {
    hex.get(..12).unwrap_or(hex)
}

/// `v2` / `v1` for the known manifest schemas, the schema text otherwise.
pub(crate) fn short_schema(schema: &str) -> &str {
    match schema {
        deltapack_format::SCHEMA_V2 => "v2",
        deltapack_format::SCHEMA_V2_1 => "v2.1",
        deltapack_format::SCHEMA_V1 => "v1",
        other => other,
    }
}

/// Whether progress bars should be drawn (stderr is a terminal).
pub(crate) fn show_progress() -> bool {
    std::io::stderr().is_terminal()
}

/// A byte progress bar on stderr, hidden unless stderr is a terminal.
pub(crate) fn byte_bar(message: impl Into<String>) -> ProgressBar {
    if !show_progress() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::no_length();
    if let Ok(style) = ProgressStyle::with_template(
        "{msg:>14} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} {elapsed}",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(message.into());
    pb
}

/// A spinner on stderr for work without a progress hook, hidden unless
/// stderr is a terminal.
pub(crate) fn spinner(message: impl Into<String>) -> ProgressBar {
    if !show_progress() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
        pb.set_style(style);
    }
    pb.set_message(message.into());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// Renders rows as an aligned text table. Columns listed in `right` are
/// right-aligned.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>], right: &[usize]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            let pad = w.saturating_sub(cell.chars().count());
            if i > 0 {
                out.push_str("  ");
            }
            if right.contains(&i) {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                if i + 1 < cells.len() {
                    out.push_str(&" ".repeat(pad));
                }
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// Parses `90`, `90s`, `15m`, `2h`, `1d`.
pub(crate) fn parse_duration(s: &str) -> std::result::Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (e.g. 0s, 90s, 15m, 2h)"))?;
    let unit_secs: u64 = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("unknown duration unit {unit:?} (s, m, h, d)")),
    };
    let secs = n
        .checked_mul(unit_secs)
        .ok_or_else(|| format!("duration {s:?} is too long"))?;
    Ok(std::time::Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_tables() {
        assert_eq!(human_bytes(10), "10 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(short("0123456789abcdef"), "0123456789ab");
        let t = table(
            &["a", "bb"],
            &[
                vec!["xxx".into(), "1".into()],
                vec!["y".into(), "22".into()],
            ],
            &[1],
        );
        assert_eq!(t, "a    bb\nxxx   1\ny    22\n");
    }
}

#[cfg(test)]
mod duration_tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("x").is_err());
        assert!(
            parse_duration("18446744073709551615d").is_err(),
            "overflow is an error"
        );
    }
}

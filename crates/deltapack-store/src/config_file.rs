//! Store settings from a TOML file.
//!
//! A [`ConfigFile`] holds every [`StoreConfig`] option an operator sets,
//! under the name of its command-line flag (`budget`, `min-free`, `grace`,
//! …), plus the store URL and the root key file, which a program passes
//! separately. Every key is optional; an unknown key is an error (a typo
//! must not silently fall back to a default). Sizes are integers (bytes) or
//! strings with units (`"50GiB"`, `"1.5TB"`), durations strings
//! (`"500ms"`, `"1h30m"`) or integer seconds; see [`crate::units`].
//!
//! ```toml
//! store = "s3://bucket/prefix"
//! ledger = "postgres://deltapack@db.internal/deltapack"
//! budget = "50GiB"
//! grace = "1h"
//! cold-start = "load"
//!
//! tier = "file:///nvme/deltapack"
//! tier-budget = "500GiB"
//!
//! [chain]
//! max-depth = 16
//! ```
//!
//! `cold-start` accepts `load` and `rebuild` only: a file cannot ask for
//! [`ColdStart::Clear`], which empties the store (a setting left in a file
//! must never delete data). The command-line tool layers flags over
//! `DELTAPACK_*` environment variables over this file over the defaults.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use crate::{ChainPolicy, ColdStart, StoreConfig};

/// The `cold-start` policies a file may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileColdStart {
    /// [`ColdStart::Load`].
    Load,
    /// [`ColdStart::Rebuild`].
    Rebuild,
}

impl From<FileColdStart> for ColdStart {
    fn from(c: FileColdStart) -> Self {
        match c {
            FileColdStart::Load => ColdStart::Load,
            FileColdStart::Rebuild => ColdStart::Rebuild,
        }
    }
}

/// The `[chain]` table: the delta chain policy ([`ChainPolicy`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
#[non_exhaustive]
pub struct FileChainPolicy {
    /// [`ChainPolicy::max_depth`]; 0 means no limit.
    pub max_depth: Option<u32>,
    /// [`ChainPolicy::max_read_overhead`]; negative means no limit.
    pub max_read_overhead: Option<f64>,
}

/// Store settings read from a TOML file (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
#[non_exhaustive]
pub struct ConfigFile {
    /// Store URL (`file:///dir`, `s3://bucket/prefix`, `memory://`).
    pub store: Option<String>,
    /// File holding the root MAC secret ([`StoreConfig::mac_secret`]).
    pub root_key_file: Option<PathBuf>,
    /// [`StoreConfig::capacity.ledger`](crate::CapacityConfig::ledger).
    pub ledger: Option<String>,
    /// [`StoreConfig::capacity.budget_bytes`](crate::CapacityConfig::budget_bytes).
    #[serde(default, deserialize_with = "de_size")]
    pub budget: Option<u64>,
    /// [`StoreConfig::capacity.min_free_bytes`](crate::CapacityConfig::min_free_bytes).
    #[serde(default, deserialize_with = "de_size")]
    pub min_free: Option<u64>,
    /// [`StoreConfig::capacity.grace`](crate::CapacityConfig::grace).
    #[serde(
        default,
        deserialize_with = "de_duration",
        serialize_with = "se_duration"
    )]
    pub grace: Option<Duration>,
    /// [`StoreConfig::capacity.ledger_deadline`](crate::CapacityConfig::ledger_deadline).
    #[serde(
        default,
        deserialize_with = "de_duration",
        serialize_with = "se_duration"
    )]
    pub ledger_deadline: Option<Duration>,
    /// [`StoreConfig::capacity.cold_start`](crate::CapacityConfig::cold_start).
    pub cold_start: Option<FileColdStart>,
    /// [`StoreConfig::restore.prefill_tokens_per_s`](crate::RestoreConfig::prefill_tokens_per_s).
    pub prefill_rate: Option<f64>,
    /// [`StoreConfig::publication.max_extent_bytes`](crate::PublicationConfig::max_extent_bytes).
    #[serde(default, deserialize_with = "de_size")]
    pub max_extent_bytes: Option<u64>,
    /// [`StoreConfig::publication.compression`](crate::PublicationConfig::compression) (zstd level 1–22).
    pub compress: Option<i32>,
    /// [`StoreConfig::remote.parts_in_flight`](crate::RemoteIoConfig::parts_in_flight).
    pub parts_in_flight: Option<usize>,
    /// [`StoreConfig::remote.part_bytes`](crate::RemoteIoConfig::part_bytes).
    #[serde(default, deserialize_with = "de_size")]
    pub part_bytes: Option<u64>,
    /// [`StoreConfig::restore.base_cache_bytes`](crate::RestoreConfig::base_cache_bytes).
    #[serde(default, deserialize_with = "de_size")]
    pub base_cache_bytes: Option<u64>,
    /// [`StoreConfig::restore.max_base_depth`](crate::RestoreConfig::max_base_depth).
    pub max_base_depth: Option<usize>,
    /// [`StoreConfig::remote.chain_gets_in_flight`](crate::RemoteIoConfig::chain_gets_in_flight).
    pub chain_gets_in_flight: Option<usize>,
    /// [`StoreConfig::remote.roots_in_flight`](crate::RemoteIoConfig::roots_in_flight).
    pub roots_in_flight: Option<usize>,
    /// [`StoreConfig::remote.ranges_in_flight`](crate::RemoteIoConfig::ranges_in_flight).
    pub ranges_in_flight: Option<usize>,
    /// [`StoreConfig::remote.range_bytes`](crate::RemoteIoConfig::range_bytes).
    #[serde(default, deserialize_with = "de_size")]
    pub range_bytes: Option<u64>,
    /// [`StoreConfig::restore.max_restore_bytes`](crate::RestoreConfig::max_restore_bytes).
    #[serde(default, deserialize_with = "de_size")]
    pub max_restore_bytes: Option<u64>,
    /// [`StoreConfig::publication.chain`](crate::PublicationConfig::chain).
    #[serde(default)]
    pub chain: FileChainPolicy,
    /// [`StoreConfig::tier`]: the node-local tier's directory
    /// ([`crate::TierConfig::url`]).
    pub tier: Option<String>,
    /// [`crate::TierConfig::budget_bytes`] (needs `tier`).
    #[serde(default, deserialize_with = "de_size")]
    pub tier_budget: Option<u64>,
    /// [`crate::TierConfig::ack`]: `origin` or `tier` (needs `tier`).
    pub tier_ack: Option<crate::TierAck>,
    /// [`crate::TierConfig::check_interval`] (needs `tier`).
    #[serde(
        default,
        deserialize_with = "de_duration",
        serialize_with = "se_duration"
    )]
    pub tier_check_interval: Option<Duration>,
}

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigFileError {
    /// The file could not be read.
    #[error("cannot read the configuration file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has a wrong key or value.
    #[error("configuration file {path}: {message}")]
    Invalid {
        /// The file (empty when parsed from text).
        path: PathBuf,
        /// What is wrong, with the line and key.
        message: String,
    },
}

/// Files larger than this are refused before parsing (a configuration is a
/// few hundred bytes; a huge file is a mistake).
const MAX_FILE_BYTES: u64 = 1 << 20;

impl ConfigFile {
    /// Parses TOML text.
    ///
    /// # Errors
    /// [`ConfigFileError::Invalid`] naming the offending key and line.
    pub fn parse(text: &str) -> Result<ConfigFile, ConfigFileError> {
        Self::parse_at(text, Path::new(""))
    }

    fn parse_at(text: &str, path: &Path) -> Result<ConfigFile, ConfigFileError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| ConfigFileError::Invalid {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        file.validate()
            .map_err(|message| ConfigFileError::Invalid {
                path: path.to_path_buf(),
                message,
            })?;
        Ok(file)
    }

    /// Reads and parses a file.
    ///
    /// # Errors
    /// [`ConfigFileError::Read`] or [`ConfigFileError::Invalid`].
    pub fn load(path: &Path) -> Result<ConfigFile, ConfigFileError> {
        let read_err = |source| ConfigFileError::Read {
            path: path.to_path_buf(),
            source,
        };
        let len = std::fs::metadata(path).map_err(read_err)?.len();
        if len > MAX_FILE_BYTES {
            return Err(ConfigFileError::Invalid {
                path: path.to_path_buf(),
                message: format!("{len} bytes; a configuration file is at most 1 MiB"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        Self::parse_at(&text, path)
    }

    /// Checks value ranges the types do not express.
    fn validate(&self) -> Result<(), String> {
        if let Some(level) = self.compress {
            if !(1..=22).contains(&level) {
                return Err(format!("compress = {level}: a zstd level is 1 to 22"));
            }
        }
        if let Some(m) = self.max_extent_bytes {
            if !m.is_power_of_two() || !(1 << 10..=1 << 30).contains(&m) {
                return Err(format!(
                    "max-extent-bytes = {m}: a power of two from 1 KiB to 1 GiB"
                ));
            }
        }
        if let Some(m) = self.range_bytes {
            if !m.is_power_of_two() || !(1 << 10..=1 << 30).contains(&m) {
                return Err(format!(
                    "range-bytes = {m}: a power of two from 1 KiB to 1 GiB"
                ));
            }
        }
        if self.ranges_in_flight == Some(0) {
            return Err("ranges-in-flight = 0: at least one request".into());
        }
        if self.roots_in_flight == Some(0) {
            return Err("roots-in-flight = 0: at least one request".into());
        }
        if self.parts_in_flight == Some(0) {
            return Err("parts-in-flight = 0: at least 1".into());
        }
        if let Some(p) = self.part_bytes {
            if !(5 << 20..=5 << 30).contains(&p) {
                return Err(format!(
                    "part-bytes = {p}: from 5 MiB to 5 GiB (the S3 multipart limits)"
                ));
            }
        }
        if let Some(r) = self.prefill_rate {
            if !(r.is_finite() && r > 0.0) {
                return Err(format!("prefill-rate = {r}: a positive number of tokens/s"));
            }
        }
        if self.tier.is_none()
            && (self.tier_budget.is_some()
                || self.tier_ack.is_some()
                || self.tier_check_interval.is_some())
        {
            return Err("tier-budget, tier-ack and tier-check-interval need tier".into());
        }
        if self.chain.max_read_overhead.is_some_and(f64::is_nan) {
            return Err("chain.max-read-overhead is not a number".into());
        }
        Ok(())
    }

    /// The configuration with every option this file sets applied over
    /// `config` (the store URL and root key file are not part of a
    /// [`StoreConfig`]; the caller opens the one and reads the other).
    #[must_use]
    pub fn apply(&self, mut c: StoreConfig) -> StoreConfig {
        if let Some(url) = &self.tier {
            let mut t = crate::TierConfig::new(url.clone());
            t.budget_bytes = self.tier_budget;
            if let Some(a) = self.tier_ack {
                t.ack = a;
            }
            if let Some(i) = self.tier_check_interval {
                t.check_interval = i;
            }
            c.tier = Some(t);
        }
        if let Some(v) = &self.ledger {
            c.capacity.ledger = Some(v.clone());
        }
        if let Some(v) = self.budget {
            c.capacity.budget_bytes = Some(v);
        }
        if let Some(v) = self.min_free {
            c.capacity.min_free_bytes = Some(v);
        }
        if let Some(v) = self.grace {
            c.capacity.grace = v;
        }
        if let Some(v) = self.ledger_deadline {
            c.capacity.ledger_deadline = v;
        }
        if let Some(v) = self.cold_start {
            c.capacity.cold_start = v.into();
        }
        if let Some(v) = self.prefill_rate {
            c.restore.prefill_tokens_per_s = Some(v);
        }
        if let Some(v) = self.max_extent_bytes {
            c.publication.max_extent_bytes = v;
        }
        if let Some(v) = self.compress {
            c.publication.compression = Some(v);
        }
        if let Some(v) = self.parts_in_flight {
            c.remote.parts_in_flight = v;
        }
        if let Some(v) = self.part_bytes {
            c.remote.part_bytes = v;
        }
        if let Some(v) = self.base_cache_bytes {
            c.restore.base_cache_bytes = v;
        }
        if let Some(v) = self.max_base_depth {
            c.restore.max_base_depth = v;
        }
        if let Some(v) = self.chain_gets_in_flight {
            c.remote.chain_gets_in_flight = v;
        }
        if let Some(v) = self.roots_in_flight {
            c.remote.roots_in_flight = v;
        }
        if let Some(v) = self.ranges_in_flight {
            c.remote.ranges_in_flight = v;
        }
        if let Some(v) = self.range_bytes {
            c.remote.range_bytes = v;
        }
        if let Some(v) = self.max_restore_bytes {
            c.restore.max_restore_bytes = v;
        }
        c.publication.chain = apply_chain(&self.chain, c.publication.chain);
        c
    }
}

fn apply_chain(f: &FileChainPolicy, mut p: ChainPolicy) -> ChainPolicy {
    if let Some(d) = f.max_depth {
        p.max_depth = (d > 0).then_some(d);
    }
    if let Some(o) = f.max_read_overhead {
        p.max_read_overhead = (o >= 0.0).then_some(o);
    }
    p
}

/// Reads a size: a byte count or a string with a unit; anything else is an
/// error that says what was expected (not serde's "did not match any
/// variant").
struct SizeVisitor;

impl serde::de::Visitor<'_> for SizeVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a size like \"50GiB\" or a byte count")
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<u64, E> {
        crate::units::parse_size(v).map_err(|e| {
            E::custom(format!(
                "{e}; expected a size like \"50GiB\" or a byte count"
            ))
        })
    }
}

/// Reads a duration: a number of seconds or a string such as `90s`.
struct DurationVisitor;

impl serde::de::Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a duration like \"90s\", \"15m\" or \"1h30m\", or a number of seconds")
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Duration, E> {
        Ok(Duration::from_secs(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Duration, E> {
        u64::try_from(v)
            .map(Duration::from_secs)
            .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
        crate::units::parse_duration(v).map_err(E::custom)
    }
}

fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    d.deserialize_any(SizeVisitor).map(Some)
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    d.deserialize_any(DurationVisitor).map(Some)
}

fn se_duration<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&crate::units::format_duration(*d)),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_parses_and_applies() {
        let f = ConfigFile::parse(
            r#"
store = "s3://b/p"
root-key-file = "/etc/deltapack/key"
ledger = "sqlite:///tmp/l.sqlite3"
budget = "50GiB"
min-free = 1000
grace = "1h30m"
cold-start = "rebuild"
prefill-rate = 5000.0
max-extent-bytes = "16MiB"
compress = 3
parts-in-flight = 4
part-bytes = "16MiB"
base-cache-bytes = "1G"
max-base-depth = 64
chain-gets-in-flight = 8
roots-in-flight = 64
ranges-in-flight = 12
range-bytes = "4MiB"
max-restore-bytes = "2TiB"
[chain]
max-depth = 0
max-read-overhead = 0.5
"#,
        )
        .expect("valid file");
        let c = f.apply(StoreConfig::default());
        assert_eq!(c.capacity.budget_bytes, Some(50 << 30));
        assert_eq!(c.capacity.min_free_bytes, Some(1000));
        assert_eq!(c.capacity.grace, Duration::from_secs(5400));
        assert_eq!(c.capacity.cold_start, ColdStart::Rebuild);
        assert_eq!(c.restore.prefill_tokens_per_s, Some(5000.0));
        assert_eq!(c.publication.max_extent_bytes, 16 << 20);
        assert_eq!(c.publication.compression, Some(3));
        assert_eq!(c.remote.parts_in_flight, 4);
        assert_eq!(c.remote.part_bytes, 16 << 20);
        assert_eq!(c.restore.base_cache_bytes, 1_000_000_000);
        assert_eq!(c.restore.max_base_depth, 64);
        assert_eq!(c.remote.chain_gets_in_flight, 8);
        assert_eq!(c.remote.roots_in_flight, 64);
        assert_eq!(c.remote.ranges_in_flight, 12);
        assert_eq!(c.remote.range_bytes, 4 << 20);
        assert_eq!(c.restore.max_restore_bytes, 2 << 40);
        assert_eq!(c.publication.chain.max_depth, None);
        assert_eq!(c.publication.chain.max_read_overhead, Some(0.5));
        assert_eq!(
            c.capacity.ledger.as_deref(),
            Some("sqlite:///tmp/l.sqlite3")
        );
        assert_eq!(f.store.as_deref(), Some("s3://b/p"));
    }

    #[test]
    fn an_empty_file_changes_nothing() {
        let f = ConfigFile::parse("").expect("empty is valid");
        let d = StoreConfig::default();
        let c = f.apply(d.clone());
        assert_eq!(format!("{c:?}"), format!("{d:?}"));
    }

    #[test]
    fn bad_files_are_refused_with_the_key() {
        for (text, needle) in [
            ("budgett = 1", "budgett"),
            ("budget = \"lots\"", "lots"),
            ("grace = \"soon\"", "soon"),
            ("cold-start = \"clear\"", "clear"),
            ("compress = 40", "compress"),
            ("max-extent-bytes = 3000", "max-extent-bytes"),
            ("range-bytes = \"3KB\"", "range-bytes"),
            ("ranges-in-flight = 0", "ranges-in-flight"),
            ("roots-in-flight = 0", "roots-in-flight"),
            ("parts-in-flight = 0", "parts-in-flight"),
            ("part-bytes = \"4MiB\"", "part-bytes"),
            ("part-bytes = \"6GiB\"", "part-bytes"),
            ("part-bytes = \"a lot\"", "a lot"),
            ("budget = -5", "budget"),
            // A value of the wrong form names the key and the form expected
            // (it said "did not match any variant of untagged enum").
            (
                "budget = 1.5",
                "expected a size like \"50GiB\" or a byte count",
            ),
            ("budget = 1.5", "budget"),
            ("budget = true", "expected a size like"),
            ("grace = 2.5", "expected a duration like"),
            ("grace = -1", "expected a duration like"),
            ("[chain]\nmax-depthh = 1", "max-depthh"),
            ("store = ", "store"),
        ] {
            let e = ConfigFile::parse(text).expect_err(text).to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }
}

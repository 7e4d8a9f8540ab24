//! How a store handle is configured: [`StoreConfig`] (budgets, grace,
//! extents, remote I/O, ledger, keys) and [`ChainPolicy`] (when a delta is
//! published as a flat root instead).
//!
//! Plain data with defaults; builder setters are in `options.rs`. The MAC
//! secret is never printed.

/// Tunables of a store handle, grouped by the part of the store they tune.
/// Built from `Default` and the `with_*` setters (`options.rs`), which keep
/// one flat name per tunable.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct StoreConfig {
    /// Publication: extent size, compression, chain policy.
    pub publication: PublicationConfig,
    /// Restore: memory bounds, chain depth, the prefill comparison.
    pub restore: RestoreConfig,
    /// Capacity: budget, free space, grace, the ledger.
    pub capacity: CapacityConfig,
    /// Remote I/O: requests and ranges in flight.
    pub remote: RemoteIoConfig,
    /// Secret for keyed root authentication (never logged).
    pub mac_secret: Option<Vec<u8>>,
    /// A node-local tier in front of this store (`None`: no tier).
    pub tier: Option<crate::TierConfig>,
}

/// How a publication lays out what it writes. Part of [`StoreConfig`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PublicationConfig {
    /// Extent size M for v2 publication (power of two; 64 MiB in production).
    pub max_extent_bytes: u64,
    /// zstd level for extents, or `None` to store raw (the default; see
    /// `docs/design.md` for the measurements behind it).
    pub compression: Option<i32>,
    /// When a delta publication starts a new chain (publishes a flat root)
    /// instead of growing the current one.
    pub chain: ChainPolicy,
}

/// What a restore may hold and follow. Part of [`StoreConfig`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RestoreConfig {
    /// Bytes of verified base snapshots kept in memory for delta restores.
    pub base_cache_bytes: u64,
    /// Longest base chain followed by a restore (a longer chain, or a
    /// cycle, is a `corrupt` miss).
    pub max_base_depth: usize,
    /// Largest payload or result a restore will allocate.
    pub max_restore_bytes: u64,
    /// Prefill rate (tokens/s) to judge whether hits beat recomputation.
    pub prefill_tokens_per_s: Option<f64>,
}

/// The capacity budget and the ledger that accounts for it. Part of [`StoreConfig`].
/// Its `Debug` shows the ledger URL with its secrets redacted
/// ([`crate::redact_ledger_url`]).
#[derive(Clone)]
#[non_exhaustive]
pub struct CapacityConfig {
    /// Hard budget in bytes (live + condemned objects + roots); `None` =
    /// unbounded.
    pub budget_bytes: Option<u64>,
    /// Minimum free space to keep on the store's filesystem (local disk;
    /// ignored where free space cannot be measured).
    pub min_free_bytes: Option<u64>,
    /// Grace period before condemned objects are deleted. Zero is only safe
    /// for a store used by one process.
    pub grace: std::time::Duration,
    /// What to do with a persisted ledger at open.
    pub cold_start: crate::ledger::ColdStart,
    /// The capacity ledger's database: `sqlite:///path/ledger.sqlite3` or
    /// `postgres://user@host/db` (a fleet's shared ledger). `None`: the
    /// store's own file for `file://`, a SQLite file under
    /// [`crate::state_dir`] for `s3://`, in memory for `memory://`.
    pub ledger: Option<String>,
    /// How long a read may wait for the ledger before answering from the
    /// store (lookup; 50 ms by default). Reads never need the ledger; this
    /// bounds how long they try it.
    pub ledger_deadline: std::time::Duration,
}

/// Requests in flight against a remote backend (local disk uses one worker
/// per core and ignores these). Part of [`StoreConfig`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RemoteIoConfig {
    /// Objects a delta-chain restore reads at once from a remote backend.
    /// A chain has many small extents (one or more per turn), so it needs
    /// more requests in flight than a flat root's few large ones to hide
    /// per-request latency; each one streams through a 256 KiB piece, so
    /// memory stays bounded by this × 256 KiB. Local disk uses one worker
    /// per core.
    pub chain_gets_in_flight: usize,
    /// Roots of a delta chain read at once (256 by default). A root written
    /// since manifest v2.1 names every root below it (its chain hints), so
    /// a restore reads them all concurrently: a chain of up to this many
    /// turns costs one round trip for its roots, not one per turn. Roots
    /// are small (a few KiB plus ~70 bytes per hint), so memory is not the
    /// bound; the backend's request rate is (S3 answers bursts above a few
    /// thousand GETs per second per prefix with `SlowDown`, which the
    /// client retries). The roots the ledger names before the requested
    /// root is read and those its hints add afterwards (only when the
    /// ledger missed some) are two such rounds, which may overlap.
    pub roots_in_flight: usize,
    /// Ranged GETs in flight at once across all extents of one restore from
    /// a remote backend (32 by default). Object stores cap the bandwidth of
    /// one connection (roughly 50–100 MB/s on S3), so an extent is read as
    /// aligned ranges of [`RemoteIoConfig::range_bytes`], fetched
    /// concurrently and each hashed as its own BLAKE3 subtree; bytes go
    /// straight into the result, so memory is bounded by the body chunks in
    /// flight, not by extents. Local disk ignores it (one worker per core).
    pub ranges_in_flight: usize,
    /// Size of one ranged GET inside an extent (a power of two, at least
    /// 1 KiB; 8 MiB by default, the size AWS recommends for parallel
    /// ranged GETs). An extent no larger than this is one GET.
    pub range_bytes: u64,
    /// Parts uploaded at once across all extents of one publication to a
    /// remote backend (multipart uploads).
    pub parts_in_flight: usize,
    /// Size of one part of a multipart extent upload (S3 needs at least
    /// 5 MiB for every part but the last; 8 MiB by default). An extent no
    /// larger than this is one PUT.
    pub part_bytes: u64,
}

/// When a delta publication rebases: publishes the result as a flat root
/// (starting a new chain) instead of a delta on top of a long chain.
///
/// A composed restore reads each turn's root and delta header and every
/// extent that still holds bytes of the result, so its cost grows with the
/// chain's depth only through those small reads, and with the bytes of the
/// chain that later turns replaced (each turn's boundary page, recurrent
/// checkpoints). The policy bounds both; `docs/design.md` has the numbers
/// behind the defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct ChainPolicy {
    /// Most deltas between a root and its flat root; a delta that would be
    /// deeper is published flat. `None`: unbounded (up to
    /// [`RestoreConfig::max_base_depth`], which restore enforces).
    pub max_depth: Option<u32>,
    /// Largest read overhead of a composed restore: the bytes of every
    /// payload in the chain (flat root included) over the result's size,
    /// minus one. A delta whose chain would exceed it is published flat.
    /// `None`: unbounded.
    pub max_read_overhead: Option<f64>,
}

impl ChainPolicy {
    /// Never rebase (benchmarks, tests of deep chains).
    pub fn unbounded() -> Self {
        ChainPolicy {
            max_depth: None,
            max_read_overhead: None,
        }
    }
}

impl ChainPolicy {
    /// Whether a delta that would sit `depth` deltas above its flat root,
    /// with `chain_bytes` of payload in its chain (flat root included), for
    /// a result of `result_len` bytes, is published flat instead.
    pub fn rebases(&self, depth: u64, chain_bytes: u64, result_len: u64) -> bool {
        let too_deep = self.max_depth.is_some_and(|k| depth > u64::from(k));
        let too_wide = self
            .max_read_overhead
            .is_some_and(|x| chain_bytes as f64 > (1.0 + x) * result_len as f64);
        too_deep || too_wide
    }
}

impl Default for ChainPolicy {
    fn default() -> Self {
        ChainPolicy {
            max_depth: Some(64),
            max_read_overhead: Some(0.25),
        }
    }
}

/// The MAC secret is never printed.
impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("publication", &self.publication)
            .field("restore", &self.restore)
            .field("capacity", &self.capacity)
            .field("remote", &self.remote)
            .field("tier", &self.tier)
            .field(
                "mac_secret",
                &self.mac_secret.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl Default for PublicationConfig {
    fn default() -> Self {
        PublicationConfig {
            max_extent_bytes: deltapack_format::DEFAULT_MAX_EXTENT_BYTES,
            compression: None,
            chain: ChainPolicy::default(),
        }
    }
}

impl Default for RestoreConfig {
    fn default() -> Self {
        RestoreConfig {
            base_cache_bytes: 4 << 30,
            max_base_depth: 1024,
            max_restore_bytes: 1 << 38,
            prefill_tokens_per_s: None,
        }
    }
}

impl std::fmt::Debug for CapacityConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapacityConfig")
            .field("budget_bytes", &self.budget_bytes)
            .field("min_free_bytes", &self.min_free_bytes)
            .field("grace", &self.grace)
            .field("cold_start", &self.cold_start)
            .field(
                "ledger",
                &self.ledger.as_deref().map(crate::redact_ledger_url),
            )
            .field("ledger_deadline", &self.ledger_deadline)
            .finish()
    }
}

impl Default for CapacityConfig {
    fn default() -> Self {
        CapacityConfig {
            budget_bytes: None,
            min_free_bytes: None,
            grace: std::time::Duration::from_secs(3600),
            cold_start: crate::ledger::ColdStart::Load,
            ledger: None,
            ledger_deadline: std::time::Duration::from_millis(50),
        }
    }
}

impl Default for RemoteIoConfig {
    fn default() -> Self {
        RemoteIoConfig {
            chain_gets_in_flight: 32,
            roots_in_flight: 256,
            ranges_in_flight: 32,
            range_bytes: 8 << 20,
            parts_in_flight: 32,
            part_bytes: 8 << 20,
        }
    }
}

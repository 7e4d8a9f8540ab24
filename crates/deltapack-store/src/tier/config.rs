//! What a tier is configured with ([`TierConfig`], [`TierAck`]) and what
//! it reports ([`TierStats`]): plain data with defaults.
//!
//! Owns the tier's tunables and counters' public shape. Must never do I/O
//! or name the store (the store's configuration names this file).

use std::time::Duration;

use serde::Serialize;

/// A node-local tier in front of the store: where it is and what it may
/// hold. Part of [`crate::StoreConfig`] (`tier`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TierConfig {
    /// The tier's directory: `file:///nvme/deltapack` or a plain path.
    /// Only local disk: a tier is the node's own copy.
    pub url: String,
    /// The tier's hard budget in bytes (its least recently used roots are
    /// evicted to stay within it); `None` = unbounded.
    pub budget_bytes: Option<u64>,
    /// How long the origin's answer that it holds a root is trusted before
    /// a tier hit for it is checked again (5 s by default).
    pub check_interval: Duration,
    /// How long that check may take; an origin that has not answered by
    /// then cannot refuse the hit (1 s by default). A check never outlasts
    /// the restore's own deadline.
    pub check_timeout: Duration,
    /// After a check the origin did not answer, how long tier hits are
    /// served unchecked without asking it again (the circuit breaker's
    /// probe interval; 5 s by default): an outage costs one check timeout
    /// per interval, not one per restore.
    pub probe_interval: Duration,
    /// Roots filled at once; a fill beyond that is skipped (2 by default).
    pub fill_roots_in_flight: usize,
    /// Objects held in memory at once across all fills and uploads (4 by
    /// default; each at most one extent, with its write staging: see
    /// [`TierConfig::fill_buffer_bytes`]).
    pub fill_objects_in_flight: usize,
    /// Whether a restore from the origin writes the objects it verified
    /// into the tier as it goes (true by default), so that the fill after
    /// it downloads only what the restore did not keep; memory bound:
    /// [`TierConfig::tap_buffer_bytes`]. Off, every fill downloads its
    /// root again.
    pub fill_from_restore: bool,
    /// When a publication is acknowledged: durable in the origin (the
    /// default) or in the tier, uploaded behind.
    pub ack: TierAck,
    /// Roots uploaded to the origin at once (2 by default).
    pub uploads_in_flight: usize,
    /// Pending uploads beyond which a publication is written through
    /// instead of queued (256 by default).
    pub max_upload_backlog: usize,
}

/// When a publication through a tiered store is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TierAck {
    /// When it is durable in the origin (write-through; the default).
    #[default]
    Origin,
    /// When it is durable in the tier; the upload to the origin is
    /// journaled in the tier and runs behind.
    Tier,
}

impl TierConfig {
    /// A tier at `url` with the default bounds and no budget.
    pub fn new(url: impl Into<String>) -> Self {
        TierConfig {
            url: url.into(),
            budget_bytes: None,
            check_interval: Duration::from_secs(5),
            check_timeout: Duration::from_secs(1),
            probe_interval: Duration::from_secs(5),
            fill_roots_in_flight: 2,
            fill_objects_in_flight: 4,
            fill_from_restore: true,
            ack: TierAck::Origin,
            uploads_in_flight: 2,
            max_upload_backlog: 256,
        }
    }

    /// Sets when publications are acknowledged (builder style).
    #[must_use]
    pub fn with_ack(mut self, ack: TierAck) -> Self {
        self.ack = ack;
        self
    }

    /// Sets the budget (builder style).
    #[must_use]
    pub fn with_budget_bytes(mut self, budget: Option<u64>) -> Self {
        self.budget_bytes = budget;
        self
    }

    /// Sets the coherence check interval (builder style).
    #[must_use]
    pub fn with_check_interval(mut self, interval: Duration) -> Self {
        self.check_interval = interval;
        self
    }

    /// The most memory fills and uploads hold at once, for objects of at
    /// most `extent_bytes`: [`TierConfig::fill_objects_in_flight`] objects,
    /// each with the staging a local write of it uses (two direct-I/O
    /// bounce buffers of 32 MiB, or the object's size if smaller). At the
    /// defaults and 64 MiB extents: 4 × (64 + 64) MiB = 512 MiB.
    pub fn fill_buffer_bytes(&self, extent_bytes: u64) -> u64 {
        let staging = (2 * crate::local::BOUNCE as u64).min(extent_bytes);
        self.fill_objects_in_flight as u64 * (extent_bytes + staging)
    }

    /// The most memory the copies of a handle's restores hold at once on
    /// their way into the tier (the fill from a restore's verified bytes):
    /// [`TierConfig::fill_buffer_bytes`], and at least 64 MiB, so that
    /// small extents read many at a time are kept too. At the defaults and
    /// 64 MiB extents: 512 MiB.
    pub fn tap_buffer_bytes(&self, extent_bytes: u64) -> u64 {
        self.fill_buffer_bytes(extent_bytes).max(TAP_BUFFER_FLOOR)
    }
}

/// The least memory [`TierConfig::tap_buffer_bytes`] allows.
const TAP_BUFFER_FLOOR: u64 = 64 << 20;

/// What a handle's tier did (process-local counters).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierStats {
    /// Restores served from the tier.
    pub hits: u64,
    /// Restores the tier had no root for.
    pub misses: u64,
    /// Restores the tier had a root for but could not serve (a damaged or
    /// missing object, a tier error): served by the origin instead.
    pub fall_throughs: u64,
    /// Tier hits refused because the origin no longer holds the root.
    pub refused: u64,
    /// Tier hits served while the origin did not answer the check.
    pub unchecked: u64,
    /// Roots copied into the tier from the origin.
    pub fills: u64,
    /// Bytes fills downloaded from the origin into the tier (objects and
    /// roots).
    pub fill_bytes: u64,
    /// Bytes written into the tier from the objects a restore from the
    /// origin had just verified (no second download; `tier/tap.rs`).
    pub fill_reused_bytes: u64,
    /// Fills that failed (the tier's budget, an origin or tier error).
    pub fills_failed: u64,
    /// Fills not started because enough were already running.
    pub fills_skipped: u64,
    /// Write-through publications the tier did not take.
    pub publish_failures: u64,
    /// Roots uploaded to the origin (acknowledged in the tier before).
    pub uploads: u64,
    /// Bytes those uploads wrote to the origin.
    pub upload_bytes: u64,
    /// Upload attempts that failed (the root stays journaled).
    pub upload_failures: u64,
    /// Uploads that found another snapshot in the origin (origin wins).
    pub upload_conflicts: u64,
    /// Publications written through because the upload backlog was full.
    pub uploads_inline: u64,
    /// Publications journaled in the tier and not yet in the origin, as
    /// last seen by this handle.
    pub upload_backlog: u64,
}

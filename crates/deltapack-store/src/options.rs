//! Builder-style setters for the option structs.
//!
//! The option structs ([`crate::StoreConfig`], [`crate::ChainPolicy`],
//! [`crate::RestoreOptions`], [`crate::SweepOptions`], [`crate::PruneFilter`])
//! are `#[non_exhaustive]`: a new tunable is not a breaking change, so code
//! outside this crate cannot build them with a struct literal. It starts from
//! `Default` (or a named constructor) and either assigns the public fields or
//! chains these setters:
//!
//! ```
//! use std::time::Duration;
//! use deltapack_store::{ChainPolicy, StoreConfig};
//!
//! let config = StoreConfig::default()
//!     .with_grace(Duration::from_secs(60))
//!     .with_budget_bytes(Some(50 << 30))
//!     .with_chain(ChainPolicy::default().with_max_depth(Some(16)));
//! assert_eq!(config.publication.chain.max_depth, Some(16));
//! ```

/// Writes one `with_<field>(self, value) -> Self` setter per listed field.
macro_rules! setters {
    ($ty:ty { $($setter:ident => $($field:ident).+ : $fty:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("Sets `", stringify!($($field).+), "` (builder style).")]
                #[must_use]
                pub fn $setter(mut self, value: $fty) -> Self {
                    self.$($field).+ = value;
                    self
                }
            )*
        }
    };
}

setters!(crate::StoreConfig {
    with_max_extent_bytes => publication.max_extent_bytes: u64,
    with_compression => publication.compression: Option<i32>,
    with_mac_secret => mac_secret: Option<Vec<u8>>,
    with_base_cache_bytes => restore.base_cache_bytes: u64,
    with_max_base_depth => restore.max_base_depth: usize,
    with_chain => publication.chain: crate::ChainPolicy,
    with_chain_gets_in_flight => remote.chain_gets_in_flight: usize,
    with_roots_in_flight => remote.roots_in_flight: usize,
    with_ranges_in_flight => remote.ranges_in_flight: usize,
    with_range_bytes => remote.range_bytes: u64,
    with_parts_in_flight => remote.parts_in_flight: usize,
    with_part_bytes => remote.part_bytes: u64,
    with_max_restore_bytes => restore.max_restore_bytes: u64,
    with_budget_bytes => capacity.budget_bytes: Option<u64>,
    with_min_free_bytes => capacity.min_free_bytes: Option<u64>,
    with_grace => capacity.grace: std::time::Duration,
    with_cold_start => capacity.cold_start: crate::ColdStart,
    with_ledger => capacity.ledger: Option<String>,
    with_prefill_tokens_per_s => restore.prefill_tokens_per_s: Option<f64>,
    with_ledger_deadline => capacity.ledger_deadline: std::time::Duration,
    with_tier => tier: Option<crate::TierConfig>,
});

setters!(crate::ChainPolicy {
    with_max_depth => max_depth: Option<u32>,
    with_max_read_overhead => max_read_overhead: Option<f64>,
});

setters!(crate::RestoreOptions {
    with_deadline => deadline: Option<tokio::time::Instant>,
});

setters!(crate::SweepOptions {
    with_grace => grace: std::time::Duration,
    with_subset => subset: Option<(u8, u8)>,
    with_bytes_per_second => bytes_per_second: Option<u64>,
    with_dry_run => dry_run: bool,
});

setters!(crate::PruneFilter {
    with_namespace => namespace: Option<deltapack_format::Namespace>,
    with_schema => schema: Option<String>,
    with_idle_for => idle_for: Option<std::time::Duration>,
});

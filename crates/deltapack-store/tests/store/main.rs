//! deltapack-store's integration tests, against real components: real files with fsync, the S3-compatible
//! server `.ci/run` starts, real corruption of real bytes, real processes.
//!
//! One test binary for the whole crate (`cargo test -p deltapack-store --test store`),
//! one module per property it guards; each module opens with why.

mod common;

mod backward_compatibility;
mod bad_input;
mod capacity_ledger;
mod chain_restore;
mod chaos_faults;
mod claim_liveness;
mod concurrency;
mod conformance;
mod corruption_matrix;
mod crash_consistency;
mod disk_full;
mod file_publication;
mod fleet_campaign;
mod fleet_node_process;
mod gc_concurrency;
mod hostile_input;
mod integrity_sweep;
mod keyed_roots;
mod layer_wise_restore;
mod ledger_binding;
mod ledger_down;
mod ledger_engines;
mod ledger_half_open;
mod ledger_races;
mod ledger_tls;
mod metrics;
mod migration;
mod multipart_publication;
mod object_names;
mod one_core_call;
mod quarantine_needs_proof;
mod ranged_reads;
mod restore_into_contract;
mod root_verification;
mod s3_faults;
mod tier_fill_egress;
mod tier_trust;
mod tiers;
mod turn_publication;
mod write_behind;

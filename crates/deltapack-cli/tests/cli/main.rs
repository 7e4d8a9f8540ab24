//! The CLI's tests: the real `deltapack` binary run as a user (and an operator, and a crash) would.
//!
//! One test binary for the whole crate (`cargo test -p deltapack-cli --test cli`),
//! one module per property it guards; each module opens with why.

mod common;

mod chaos_kill9;
mod cli_end_to_end;
mod compat;
mod configuration;
mod crash_kill9;
mod dead_collector;
mod destructive_commands;
mod errors_say_what_to_do;
mod fleet_kill9;
mod ledger_down;
mod ledger_half_open;
mod ledger_postgres_conventions;
mod ledger_secrets;
mod multi_process_ledger;
mod one_bucket_one_ledger;
mod output_contract;
mod stats_prometheus;
mod tier_trust;
mod tiers;
mod turn_publication;

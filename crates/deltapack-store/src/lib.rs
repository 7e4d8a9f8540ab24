//! # deltapack-store — durable publication and verified restore
//!
//! This crate is deltapack's I/O layer. It stores the byte formats of
//! [`deltapack_format`] in any `object_store` backend — local disk (with
//! fsync), S3-compatible buckets, or memory — following the key layout in
//! [`keys`] and the invariants of docs/design.md §5:
//!
//! * **Durable before visible** — [`Store::publish`] writes every object with
//!   create-if-absent through the single durable write helper
//!   `put_create` helper and creates the root only after all of them
//!   returned.
//! * **Immutable roots** — roots are created with create-if-absent; an
//!   existing root with the same snapshot is idempotent success, a different
//!   one is a reported conflict.
//! * **Verify before use** — [`Store::restore`] checks the root envelope and
//!   schema, each object digest before its bytes are used, the payload
//!   digest, and the reconstructed snapshot digest.
//! * **Bounded memory** — at most [`RESTORE_IN_FLIGHT`] object
//!   payloads in flight on restore, [`PUBLISH_BATCH`] per
//!   publication batch; every length from storage is bounded before use.
//! * **Misses are not errors** — [`RestoreOutcome::Miss`] carries a
//!   [`MissReason`]; corrupt objects are quarantined and counted.

mod backend;
mod base_graph;
mod capacity;
mod error;
mod fault;
pub mod keys;
mod ledger;
mod local;
mod migrate;
mod publish;
mod restore;
mod stats;
mod store;
mod sweep;
mod write_behind;

pub use backend::{is_storage_full, open as open_backend, Backend, BackendKind};
pub use capacity::{free_space, Pin, PruneFilter, RemovalKind, RemovalPlan, RemovalReport};
pub use error::{MissReason, OpenError, Result, StoreError};
pub use ledger::{ColdStart, LedgerError, LedgerImage, Totals};
pub use migrate::MigrationReport;
pub use publish::{
    BaseInput, PublishOutcome, PublishReceipt, PublishRequest, RootFormat, PUBLISH_BATCH,
};
pub use restore::{
    RestoreIntoOutcome, RestoreOptions, RestoreOutcome, Restored, RESTORE_IN_FLIGHT,
};
pub use stats::{prometheus, StatsReport, StatsSnapshot};
pub use store::{ChainPolicy, RootInfo, RootStatus, Store, StoreConfig};
pub use sweep::{SweepOptions, SweepReport};
pub use write_behind::{WriteBehind, WriteBehindReport};

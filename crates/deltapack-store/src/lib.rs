//! # deltapack-store — durable publication and verified restore
//!
//! This crate is deltapack's I/O layer. It stores the byte formats of
//! [`deltapack_format`] in any `object_store` backend — local disk (with
//! fsync), S3-compatible buckets, or memory — following the key layout in
//! [`keys`] and the invariants of SPEC §4:
//!
//! * **Durable before visible** — [`Store::publish`] writes every object with
//!   create-if-absent through the single durable write helper
//!   [`backend::put_create`] and creates the root only after all of them
//!   returned.
//! * **Immutable roots** — roots are created with create-if-absent; an
//!   existing root with the same snapshot is idempotent success, a different
//!   one is a reported conflict.
//! * **Verify before use** — [`Store::restore`] checks the root envelope and
//!   schema, each object digest before its bytes are used, the payload
//!   digest, and the reconstructed snapshot digest.
//! * **Bounded memory** — at most [`restore::RESTORE_IN_FLIGHT`] object
//!   payloads in flight on restore, [`publish::PUBLISH_BATCH`] per
//!   publication batch; every length from storage is bounded before use.
//! * **Misses are not errors** — [`RestoreOutcome::Miss`] carries a
//!   [`MissReason`]; corrupt objects are quarantined and counted.

pub mod backend;
pub mod capacity;
pub mod error;
mod fault;
pub mod keys;
pub mod ledger;
pub mod local;
pub mod migrate;
pub mod publish;
pub mod restore;
pub mod stats;
pub mod store;
pub mod sweep;
pub mod write_behind;

pub use backend::{Backend, BackendKind};
pub use capacity::{Pin, PruneFilter, RemovalReport};
pub use error::{MissReason, OpenError, Result, StoreError};
pub use ledger::{ColdStart, Totals};
pub use migrate::MigrationReport;
pub use publish::{BaseInput, PublishOutcome, PublishReceipt, PublishRequest, RootFormat};
pub use restore::{RestoreIntoOutcome, RestoreOptions, RestoreOutcome, Restored};
pub use stats::{prometheus, StatsReport, StatsSnapshot};
pub use store::{ChainPolicy, RootInfo, RootStatus, Store, StoreConfig};
pub use sweep::{SweepOptions, SweepReport};
pub use write_behind::{WriteBehind, WriteBehindReport};

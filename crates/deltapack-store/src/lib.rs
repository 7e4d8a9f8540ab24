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
//!   digest, and the reconstructed snapshot digest. A delta chain planned
//!   from v2.1 roots alone is first restored in one deferred pass: every
//!   byte it places is checked by the reconstructed snapshot digest (the
//!   extents' own names are checked only if that fails), so the result is
//!   hashed once whatever the chain's depth (docs/design.md §6.2).
//! * **Bounded memory** — a restore streams verified bytes straight into
//!   the result: beyond it, one 256 KiB piece per worker, or on a remote
//!   backend the body chunks of at most
//!   [`StoreConfig::remote.ranges_in_flight`](crate::RemoteIoConfig::ranges_in_flight) ranged GETs; [`PUBLISH_BATCH`]
//!   objects per publication batch; every length from storage is bounded
//!   before use.
//! * **Misses are not errors** — [`RestoreOutcome::Miss`] carries a
//!   [`MissReason`]; corrupt objects are quarantined and counted.
//!
//! ## Example
//!
//! Publish two turns of a conversation (the second as a page delta over
//! the first), restore the second into a new buffer and into the caller's
//! own memory, and see a miss for a context never published:
//!
//! ```
//! use std::sync::Arc;
//! use deltapack_format::synth::{self, Preset};
//! use deltapack_format::{CacheIdentity, ContextHasher};
//! use deltapack_store::{
//!     BaseInput, MissReason, PublishRequest, RestoreIntoOutcome, RestoreOutcome, RootFormat,
//!     Store, StoreConfig,
//! };
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(&format!("file://{}", dir.path().display()), StoreConfig::default())?;
//! let id = CacheIdentity::example();
//! let hasher = ContextHasher::new(id.namespace(), id.chunk_tokens)?;
//!
//! // Two turns: 1,024 tokens, then 2,048 (synthetic KV pages).
//! let turn1 = Arc::new(synth::snapshot(Preset::Tiny, 7, 1024)?);
//! let turn2 = Arc::new(synth::snapshot(Preset::Tiny, 7, 2048)?);
//! let ctx1 = hasher.digest(&synth::tokens(7, 1024));
//! let ctx2 = hasher.digest(&synth::tokens(7, 2048));
//! store
//!     .publish(PublishRequest {
//!         identity: id.clone(),
//!         context: ctx1,
//!         snapshot: turn1.clone(),
//!         base: None,
//!         format: RootFormat::V2,
//!     })
//!     .await?;
//! store
//!     .publish(PublishRequest {
//!         identity: id.clone(),
//!         context: ctx2,
//!         snapshot: turn2.clone(),
//!         base: Some(BaseInput { context: ctx1, snapshot: turn1 }),
//!         format: RootFormat::V2,
//!     })
//!     .await?;
//!
//! // Restore turn 2: the rebuilt snapshot is verified against its digest
//! // before the bytes are handed over.
//! match store.restore((&id, ctx2), Default::default()).await? {
//!     RestoreOutcome::Hit(hit) => assert_eq!(hit.snapshot.encoded(), turn2.encoded()),
//!     RestoreOutcome::Miss(reason) => panic!("unexpected miss: {reason}"),
//! }
//!
//! // Or straight into memory the caller owns (e.g. a pinned host pool).
//! let mut pool = vec![0u8; turn2.encoded().len()];
//! let out = store.restore_into((&id, ctx2), &mut pool, Default::default()).await?;
//! assert!(matches!(out, RestoreIntoOutcome::Hit { .. }));
//! assert_eq!(pool, turn2.encoded());
//!
//! // A context nobody published is a miss with a reason, not an error.
//! let unknown = hasher.digest(&synth::tokens(8, 1024));
//! let miss = store.restore((&id, unknown), Default::default()).await?;
//! assert_eq!(miss.miss(), Some(&MissReason::Absent));
//! # Ok(())
//! # }
//! ```

mod backend;
mod base_graph;
pub mod buffer;
mod capacity;
mod config;
mod config_file;
mod error;
mod failpoint;
mod fault;
mod gc;
mod holds;
pub mod keys;
mod ledger;
mod local;
mod lookup;
mod metrics;
mod migrate_v1;
mod object_check;
mod open;
mod options;
mod ownership;
mod paths;
mod publish;
mod quarantine_queue;
mod raw;
mod read_only;
mod reconcile;
mod removal;
mod restore;
mod stats;
mod store;
mod sweep;
mod tier;
pub mod units;
mod verify;
pub mod wrap;
mod write_behind;

pub use backend::{is_storage_full, open as open_backend, Backend, BackendKind};
pub use buffer::{fresh_backing, fresh_buffer, FreshBacking, FreshBackingReason};
pub use capacity::free_space;
pub use config_file::{ConfigFile, ConfigFileError, FileChainPolicy, FileColdStart};
pub use error::{CapacityError, MissReason, OpenError, Result, StoreError, Unsupported};
pub use gc::GcReport;
pub use holds::Pin;
pub use keys::{HoldName, ObjectKey, RootKey};
pub use ledger::{
    redact_ledger_url, ColdStart, EngineError, ImageHold, ImageObject, ImageRoot, LedgerError,
    LedgerImage, LedgerLocation, MergeReport, Totals,
};
pub use removal::{PruneFilter, RemovalKind, RemovalPlan, RemovalReport};

pub use config::{
    CapacityConfig, ChainPolicy, PublicationConfig, RemoteIoConfig, RestoreConfig, StoreConfig,
};
pub use lookup::{Lookup, LookupSource, LEDGER_RETRY, LOOKUP_PROBES_IN_FLIGHT};
pub use migrate_v1::{MigrationProof, MigrationReport};
pub use object_check::ObjectCheck;
pub use ownership::{AdoptReport, BindingStatus, BindingView, Ownership, DEFAULT_FENCE};
pub use paths::state_dir;
/// The `prometheus-client` crate this one registers its metrics with (see
/// [`Store::register_metrics`]), re-exported so callers use the same version.
pub use prometheus_client;
pub use publish::{
    BaseInput, Progress, PublishOptions, PublishOutcome, PublishReceipt, PublishRequest,
    RootFormat, SnapshotFile, TailFile, Turn, TurnRequest, PUBLISH_BATCH,
};
pub use read_only::Refusals;
pub use restore::{
    LayerEvent, LayerOrder, LayerProof, LayerReady, LayerStream, Restoration, RestoreIntoOutcome,
    RestoreOptions, RestoreOutcome, Restored, Target, RESTORE_IN_FLIGHT,
};
pub use stats::{StatsReport, StatsSnapshot, TierReport};
pub use store::{RootInfo, RootStatus, Store};
pub use sweep::{SweepOptions, SweepReport};
pub use tier::{
    AbandonReport, AbandonedRoot, TierAck, TierConfig, TierStats, UploadReport, CONFLICT_HOLD,
    UPLOAD_HOLD,
};
pub use verify::{ObjectVerdict, RootVerdict};
pub use write_behind::{WriteBehind, WriteBehindReport};

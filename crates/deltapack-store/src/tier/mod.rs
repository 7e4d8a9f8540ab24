//! A node-local tier in front of the origin store.
//!
//! Owns the read path from the nearest copy, the background fill of the
//! tier from verified origin reads, write-through publication and the
//! coherence rule. Must never let the tier change the origin: nothing here
//! writes, quarantines or deletes in the origin.
//!
//! **Shape.** The tier is an ordinary local [`Store`] (`file://`, fsync'd)
//! with its own ledger (the SQLite file inside the tier directory, shared
//! by every process of the node) and its own budget; publications into it
//! evict its least recently used roots as any store's do. The handle the
//! caller holds is the origin's; [`Store::restore`], [`Store::restore_into`]
//! and [`Store::publish_with`] consult the tier when one is configured
//! ([`crate::StoreConfig::tier`]).
//!
//! **Read path.** A restore asks the tier first, verified exactly as any
//! restore is (root, objects, assembled payload, snapshot digest). A miss
//! there — absent, a damaged object (quarantined in the tier by the usual
//! two-failed-reads rule), any tier error — falls through to the origin and
//! is counted. A hit is served only if the coherence rule allows it.
//!
//! **Coherence.** Roots and extents are immutable and content-addressed, so
//! a tier copy never holds wrong bytes; what can go stale is *whether* a
//! root should be served at all, after the origin invalidated, evicted or
//! quarantined it. Rule: a tier hit for a root is served only if the origin
//! was seen holding that root within the last
//! [`TierConfig::check_interval`]; otherwise the origin root is looked up
//! (one HEAD, concurrently with the tier's restore, bounded by
//! [`TierConfig::check_timeout`]). An origin without the root refuses the
//! hit: the tier's copy is removed and the restore goes to the origin. An
//! origin that does not answer in time cannot refuse: the verified tier
//! copy is served and counted as unchecked (availability over freshness,
//! for at most the outage).
//!
//! **Fill.** After a hit from the origin, the root (with every chain link
//! the tier lacks, bottom first) is copied in the background: each object
//! is read from the origin, checked against its root's record, written to
//! the tier (create-if-absent, durable), and the root last — so the tier,
//! like any store, never shows a root before its objects. The restore never
//! waits for it. Fills are bounded: [`TierConfig::fill_roots_in_flight`]
//! roots at once (a fill beyond that is skipped and counted, never queued
//! without bound), and [`TierConfig::fill_objects_in_flight`] objects in
//! memory at once across all fills. A fill the tier's budget cannot take
//! fails quietly (counted): the origin still has the root. What the
//! restore before it already read is not downloaded again: objects it
//! verified whole are written into the tier as it goes (`tap.rs`), parts a
//! chain's pass read unchecked are kept on the tier's disk and completed
//! by the fill, then checked whole (`staging.rs`).
//!
//! **Publication.** Write-through ([`TierAck::Origin`], the default): the
//! same publication goes to the tier and to the origin concurrently, and
//! the caller's receipt is the origin's: a root is acknowledged when it is
//! durable in the origin. A tier failure is counted and logged, never
//! returned. Behind ([`TierAck::Tier`]): acknowledged when durable in the
//! tier and journaled there; uploaded in the background (`upload.rs`).
//! A turn ([`Store::publish_turn`]) goes the same two ways from its new
//! pages alone: the tier publishes its own turn on its copy of the
//! previous root, so nothing is read back from the origin. A tier that no
//! longer holds the previous root cannot take a tail alone: write-through
//! then copies the new root in from the origin (a fill), and behind mode
//! writes that turn through.

mod config;
mod copy;
mod fill;
mod handle;
mod journal;
mod read;
mod staging;
mod state;
mod tap;
mod upload;
mod write;

pub use config::{TierAck, TierConfig, TierStats};
pub use journal::{AbandonReport, AbandonedRoot, CONFLICT_HOLD, UPLOAD_HOLD};
pub(crate) use state::TierState;
pub use upload::UploadReport;

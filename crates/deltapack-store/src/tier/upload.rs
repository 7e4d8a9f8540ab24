//! Publication acknowledged in the tier ([`super::TierAck::Tier`]), and
//! the upload behind it.
//!
//! Owns the upload journal and the uploader. Must never drop an
//! acknowledged publication, let the tier evict it before the origin has
//! it, or show it in the origin before its objects.
//!
//! **Journal.** A publication acknowledged in the tier is durable there
//! (objects, then root, fsync'd) and carries a persistent hold named
//! [`UPLOAD_HOLD`] (a marker file under the tier's `holds/`, written with
//! fsync before the call returns). The hold is the journal entry: it keeps
//! the root — and every base below it — out of the tier's eviction, a
//! restarted process finds it by listing the tier's holds, and it is
//! released only once the origin holds the root. While it is there, the
//! coherence rule serves the tier's copy without asking the origin.
//!
//! **Upload.** Each pending root is copied into the origin by `copy.rs`:
//! objects checked and durable first, base links before deltas, the root
//! last — so the origin never shows a root before its objects. A failed
//! upload (the origin down) stays in the journal and is tried again with a
//! backoff (up to 10 s); nothing is dropped. A root the origin already
//! holds with another snapshot (another node published first) is a
//! conflict: the origin wins, the tier's copy is removed, and it is
//! counted.
//!
//! **Bounds.** At most [`super::TierConfig::uploads_in_flight`] roots are
//! uploaded at once, through the tier's object permits. When
//! [`super::TierConfig::max_upload_backlog`] roots are pending, the next
//! publication is written through (acknowledged by the origin) instead of
//! queued, and counted. The count is the handle's: the journal as listed
//! before its first publication and at every upload round, plus its own
//! publications since — so the bound is soft across the node's processes
//! (another process's entries count from the next round), and a
//! publication does not list the journal.

use std::sync::{Arc, Weak};
use std::time::Duration;

use std::collections::HashSet;

use deltapack_format::CacheIdentity;
use futures::StreamExt;
use serde::Serialize;

use super::copy::Copy;
use super::handle::Tier;
use super::journal::UPLOAD_HOLD;
use super::state::{lock, OriginView};
use crate::error::{Result, StoreError};
use crate::keys::{self, RootKey};
use crate::publish::{Progress, PublishOutcome, PublishReceipt, PublishRequest, Turn, TurnRequest};
use crate::stats::Stats;
use crate::store::{Inner, RootStatus, Store};

/// Longest pause between upload rounds while uploads fail.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// What one upload round did.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct UploadReport {
    /// Roots now in the origin (uploaded, or found there).
    pub uploaded: u64,
    /// Roots the origin holds with another snapshot (the tier's copy was
    /// removed).
    pub conflicts: u64,
    /// Roots whose upload failed this round (still journaled).
    pub failed: u64,
    /// Roots still pending after the round.
    pub remaining: u64,
    /// Every root the tier keeps as a conflict after the round, found by
    /// this round or an earlier one (any process's): the origin holds
    /// another snapshot there; the tier keeps its copy until `tier
    /// abandon` (`roots/<namespace>/<context>`).
    pub conflicted: Vec<String>,
}

impl Tier<'_> {
    /// Whether a new publication must be written through because the
    /// upload backlog is full (counted when it is; starts the uploader).
    pub(crate) async fn backlog_full(&self) -> Result<bool> {
        let full = self.backlog_as_counted().await? >= self.config.max_upload_backlog;
        if full {
            Stats::add(&self.counters.uploads_inline, 1);
        }
        Ok(full)
    }

    /// The upload backlog for the bound of a new publication (and starts
    /// the uploader): as this handle last counted it — every upload round
    /// recounts the journal, and this handle's own publications add to it —
    /// or counted now, by listing the journal, before anything counted it. The
    /// bound is soft across processes: another process's entries count
    /// from the next round.
    async fn backlog_as_counted(&self) -> Result<usize> {
        self.start_uploader();
        if !self
            .backlog_known
            .load(std::sync::atomic::Ordering::Acquire)
        {
            let n = self.pending_uploads().await?.len();
            self.backlog
                .store(n as u64, std::sync::atomic::Ordering::Relaxed);
            self.backlog_known
                .store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(self.backlog.load(std::sync::atomic::Ordering::Relaxed) as usize)
    }

    /// Starts this handle's uploader if it is not running (it needs a
    /// runtime; without one it starts at the first async call).
    pub(crate) fn start_uploader(&self) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let mut slot = lock(&self.uploader);
        if slot.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        *slot = Some(tokio::spawn(uploader(Arc::downgrade(&self.origin.inner))));
    }

    /// One upload round: every pending root, [`super::TierConfig::uploads_in_flight`]
    /// at a time.
    pub(crate) async fn upload_round(&self) -> Result<UploadReport> {
        let origin = self.origin;
        let _one = self.upload_round.lock().await;
        let pending = self.pending_uploads().await?;
        let journaled: HashSet<RootKey> = pending.iter().copied().collect();
        let parts = tokio::sync::Semaphore::new(origin.config().remote.parts_in_flight.max(1));
        let parts = origin.backend_kind().is_remote().then_some(&parts);
        let outcomes: Vec<_> = futures::stream::iter(pending)
            .map(|key| self.upload_one(key, &journaled, parts))
            .buffer_unordered(self.config.uploads_in_flight.max(1))
            .collect()
            .await;
        let mut report = UploadReport::default();
        for o in outcomes {
            match o {
                Upload::Done => report.uploaded += 1,
                Upload::Conflict => report.conflicts += 1,
                Upload::Failed => report.failed += 1,
                Upload::Waiting => {}
            }
        }
        report.remaining = self.pending_uploads().await?.len() as u64;
        report.conflicted = self
            .conflicted_uploads()
            .await?
            .into_iter()
            .map(|k| keys::root_key(&k.namespace, &k.context).to_string())
            .collect();
        report.conflicted.sort();
        self.backlog
            .store(report.remaining, std::sync::atomic::Ordering::Relaxed);
        self.backlog_known
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(report)
    }

    /// Uploads one root and settles its journal entry.
    async fn upload_one(
        &self,
        key: RootKey,
        journaled: &HashSet<RootKey>,
        parts: Option<&tokio::sync::Semaphore>,
    ) -> Upload {
        match self.try_upload(key, journaled, parts).await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(error = %e, "upload to the origin failed; it stays journaled and is tried again");
                Stats::add(&self.counters.upload_failures, 1);
                Upload::Failed
            }
        }
    }

    /// [`Tier::upload_one`]: the tier's root, what the origin holds at its
    /// context, then the copy — each base proven (the origin holds the
    /// snapshot the delta was built on, or the base is itself journaled
    /// and goes first), else the turn goes up flat.
    async fn try_upload(
        &self,
        key: RootKey,
        journaled: &HashSet<RootKey>,
        parts: Option<&tokio::sync::Semaphore>,
    ) -> Result<Upload> {
        let (ns, ctx) = (key.namespace, key.context);
        let ours = match self.store.peek_root(&ns, &ctx).await? {
            RootStatus::Found(r) => r.snapshot_digest(),
            RootStatus::Absent => {
                let released = self.journal_unfinished(key).await?;
                return Ok(if released {
                    Upload::Done
                } else {
                    Upload::Waiting
                });
            }
            RootStatus::Unusable(why) => {
                return Err(StoreError::Invalid(format!(
                    "the tier's root {ns}/{ctx} is unusable: {why}"
                )));
            }
        };
        match self.origin.peek_root(&ns, &ctx).await? {
            RootStatus::Found(r) if r.snapshot_digest() == ours => {
                return self.uploaded(key, 0, ours).await;
            }
            RootStatus::Found(_) => return self.conflict(key).await,
            RootStatus::Unusable(why) => {
                return Err(StoreError::Invalid(format!(
                    "the origin's root {ns}/{ctx} is unusable: {why}"
                )));
            }
            RootStatus::Absent => {}
        }
        let copy = Copy {
            from: self.store,
            to: self.origin,
            objects: &self.copy_objects,
            in_flight: self.config.fill_objects_in_flight,
            parts,
            what: "tier upload",
            journaled: Some(journaled),
            staged: None,
        };
        let copied = copy.root(key, None).await?;
        if copied.conflict && copied.conflict_at_top {
            return self.conflict(key).await;
        }
        if copied.conflict {
            // A journaled base below met another snapshot in the origin
            // (created meanwhile): the next round proves the base again
            // and sends this turn flat.
            return Err(StoreError::Invalid(format!(
                "a base below {ns}/{ctx} was taken by another snapshot during the upload"
            )));
        }
        self.uploaded(key, copied.bytes, ours).await
    }

    /// Settles the journal entry of a root the origin now holds.
    async fn uploaded(
        &self,
        key: RootKey,
        bytes: u64,
        digest: Option<deltapack_format::Digest>,
    ) -> Result<Upload> {
        // Another process of the node may have uploaded and released it
        // meanwhile: counted by whoever releases it.
        let released = match self
            .store
            .release(UPLOAD_HOLD, key.namespace, key.context)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "uploaded, but the journal entry stays (uploaded again later, idempotently)");
                false
            }
        };
        if released {
            Stats::add(&self.counters.uploads, 1);
        }
        Stats::add(&self.counters.upload_bytes, bytes);
        if let Some(d) = digest {
            self.seen_in_origin(key, d);
        }
        Ok(Upload::Done)
    }

    /// The origin holds another snapshot at `key`: the origin wins, the
    /// tier keeps its copy journaled as a conflict, and it is counted.
    async fn conflict(&self, key: RootKey) -> Result<Upload> {
        tracing::warn!(root = %keys::root_key(&key.namespace, &key.context), "the origin holds another snapshot for a root acknowledged in the tier; the origin wins, the tier keeps its copy as a conflict (`tier abandon` drops it)");
        self.journal_conflict(key).await?;
        Stats::add(&self.counters.upload_conflicts, 1);
        Ok(Upload::Conflict)
    }
}

/// How a behind publication in the tier ended.
enum Behind {
    /// The receipt to return.
    Done(Box<PublishReceipt>),
    /// The tier holds a root the origin replaced (now dropped): write the
    /// publication through.
    Stale,
}

/// How one upload ended.
enum Upload {
    /// The origin holds the root (uploaded, or found there).
    Done,
    /// The origin holds another snapshot there.
    Conflict,
    /// It failed (still journaled, tried again).
    Failed,
    /// Its publication is still being made (still journaled).
    Waiting,
}

/// The background uploader of one handle: rounds while anything is
/// pending (with a backoff while they fail), woken by publications; it ends
/// with the handle.
async fn uploader(origin: Weak<Inner>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(inner) = origin.upgrade() else {
            return;
        };
        let origin = Store { inner };
        let Some(t) = origin.tier() else { return };
        let round = t.upload_round().await;
        let wake = t.upload_wake.clone();
        drop(origin);
        let idle = match round {
            Ok(r) if r.remaining == 0 => {
                backoff = Duration::from_millis(100);
                Duration::from_secs(30)
            }
            Ok(r) if r.failed == 0 => Duration::ZERO,
            Ok(_) | Err(_) => {
                backoff = (backoff * 2).min(MAX_BACKOFF);
                backoff
            }
        };
        if !idle.is_zero() {
            let _ = tokio::time::timeout(idle, wake.notified()).await;
        }
    }
}

impl Store {
    /// A publication acknowledged in the tier: journaled, then durable
    /// there, when this returns (the receipt is the tier's). With the
    /// backlog full it is written through instead; so is one the tier
    /// refuses only because it holds a root the origin replaced.
    pub(crate) async fn publish_behind(
        &self,
        tier: &Tier<'_>,
        req: PublishRequest,
        progress: Progress<'_>,
    ) -> Result<PublishReceipt> {
        if tier.backlog_full().await? {
            return self.publish_through(tier, req, progress).await;
        }
        let key = RootKey::from((req.identity.namespace(), req.context));
        let placed = tier.journal_begin(key, &req.identity).await?;
        let tier_req = self.tier_request(&req).await;
        let out = tier.store.publish_uncounted(tier_req, progress).await;
        let identity = req.identity.clone();
        match self
            .settle_behind(tier, (key, &identity), placed, out)
            .await?
        {
            Behind::Done(r) => Ok(*r),
            Behind::Stale => self.publish_through(tier, req, progress).await,
        }
    }

    /// The turn after `prev`, acknowledged in the tier (as
    /// [`Store::publish_behind`]). A tier without `prev`'s root (evicted
    /// once uploaded) cannot take the tail alone: the turn is written
    /// through instead, and the origin decides.
    pub(crate) async fn turn_behind(
        &self,
        tier: &Tier<'_>,
        prev: &Turn,
        req: TurnRequest,
    ) -> Result<PublishReceipt> {
        if tier.backlog_full().await? {
            return self.turn_through(tier, prev, req).await;
        }
        let key = RootKey::from((req.identity.namespace(), req.context));
        let placed = tier.journal_begin(key, &req.identity).await?;
        let out = tier
            .store
            .publish_turn_here(&prev.for_store(tier.store), req.clone())
            .await;
        if let Err(StoreError::BaseMismatch { .. }) = out {
            tier.journal_cancel(key, placed).await;
            return self.turn_through(tier, prev, req).await;
        }
        match self
            .settle_behind(tier, (key, &req.identity), placed, out)
            .await?
        {
            Behind::Done(r) => Ok(*r),
            Behind::Stale => self.turn_through(tier, prev, req).await,
        }
    }

    /// After a behind publication in the tier: a created (or present) root
    /// stays journaled, the uploader is woken, and the receipt's turn is
    /// handed out as one on this handle. A failure releases the entry this
    /// call placed. A conflict is the caller's answer — unless the tier's
    /// root there is not journaled and the origin, asked, does not hold
    /// it: a root the origin replaced, dropped here (`Stale`: the caller
    /// writes the publication through).
    async fn settle_behind(
        &self,
        tier: &Tier<'_>,
        (key, identity): (RootKey, &CacheIdentity),
        placed: bool,
        out: Result<PublishReceipt>,
    ) -> Result<Behind> {
        let mut receipt = match out {
            Ok(r) => r,
            Err(e) => {
                tier.journal_cancel(key, placed).await;
                return Err(e);
            }
        };
        if receipt.outcome == PublishOutcome::Created {
            crate::failpoint::reached("tier.behind.created");
        }
        if receipt.outcome == PublishOutcome::Conflict {
            tier.journal_cancel(key, placed).await;
            let held = receipt.existing_snapshot_digest;
            if !tier.upload_pending(key).await {
                let view = tier.origin_view(key, None).await;
                let stale = match view {
                    OriginView::Holds(d) => d.is_some() && d != held,
                    OriginView::Absent => true,
                    OriginView::Unknown => false,
                };
                if stale {
                    tier.drop_root(key).await;
                    return Ok(Behind::Stale);
                }
            }
            return Ok(Behind::Done(Box::new(receipt)));
        }
        if !placed {
            // The entry was another publication's (of the same snapshot);
            // it may have been released since: journal this one again.
            tier.journal_begin(key, identity).await?;
        }
        tier.backlog
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tier.upload_wake.notify_one();
        receipt.turn = receipt.turn.map(|t| t.for_store(self));
        Ok(Behind::Done(Box::new(receipt)))
    }

    /// Uploads every publication journaled in the tier now (any process's,
    /// including one that was killed), and says what happened. A failed
    /// upload stays journaled. `Ok` with an empty report without a tier.
    pub async fn tier_upload(&self) -> Result<UploadReport> {
        match self.tier() {
            Some(t) => t.upload_round().await,
            None => Ok(UploadReport::default()),
        }
    }

    /// Gives up the tier's journal entries of `(ns, ctx)` and of every
    /// delta built on it in the tier — pending uploads and conflicts alike
    /// — and removes those roots from the tier. Says what was given up and
    /// whether the origin holds each (if not, it is lost). `Ok` with an
    /// empty report without a tier.
    pub async fn tier_abandon(
        &self,
        ns: deltapack_format::Namespace,
        ctx: deltapack_format::ContextDigest,
    ) -> Result<super::journal::AbandonReport> {
        match self.tier() {
            Some(t) => t.abandon(ns, ctx).await,
            None => Ok(Default::default()),
        }
    }

    /// The publications journaled in the tier and not yet in the origin.
    pub async fn tier_backlog(&self) -> Result<u64> {
        match self.tier() {
            Some(t) => Ok(t.pending_uploads().await?.len() as u64),
            None => Ok(0),
        }
    }
}

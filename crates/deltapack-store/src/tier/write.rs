//! Write-through publication: the tier takes the same publication as the
//! origin, and the caller's receipt is the origin's.
//!
//! Owns what the tier is given and what happens when the two disagree.
//! Must never acknowledge a root the origin has not made durable, or keep
//! a tier root the origin refused.

use super::handle::Tier;
use crate::error::{Result, StoreError};
use crate::keys::{self, RootKey};
use crate::publish::{
    BaseInput, Progress, PublishOutcome, PublishReceipt, PublishRequest, Turn, TurnRequest,
};
use crate::stats::Stats;
use crate::store::{RootStatus, Store};

impl Store {
    /// Publishes `req` to the origin and, concurrently, to the tier. The
    /// origin's result is returned; the tier's failure is counted, a tier
    /// root the origin did not take (a conflict there, an error) is
    /// removed again, and a stale tier root (the tier refused the
    /// publication as a conflict, the origin took it: the origin replaced
    /// the root the tier still held) is replaced by the new one.
    pub(crate) async fn publish_through(
        &self,
        tier: &Tier<'_>,
        req: PublishRequest,
        progress: Progress<'_>,
    ) -> Result<PublishReceipt> {
        let key = RootKey::from((req.identity.namespace(), req.context));
        let tier_req = self.tier_request(&req).await;
        let (origin, in_tier) = tokio::join!(
            self.publish_uncounted(req, progress),
            tier.store.publish_uncounted(tier_req.clone(), &|_, _| {})
        );
        let (tier_created, stale) = tier_answer(tier, &in_tier);
        match &origin {
            Ok(r) if r.outcome != PublishOutcome::Conflict => {
                tier.seen_in_origin(key, r.snapshot_digest);
                if stale {
                    tier.drop_root(key).await;
                    match tier.store.publish_uncounted(tier_req, &|_, _| {}).await {
                        Ok(t) if t.outcome != PublishOutcome::Conflict => {}
                        Ok(_) => tracing::warn!("the tier keeps a stale root it cannot drop (journaled for upload); it is not served"),
                        Err(e) => tracing::warn!(error = %e, "the tier did not take the replacement of a stale root"),
                    }
                }
            }
            _ if tier_created => tier.drop_root(key).await,
            _ => {}
        }
        origin
    }

    /// The request the tier publishes: the caller's, flat when the tier
    /// does not hold the base (evicted, or published before the tier was
    /// there), so the tier starts a chain of its own instead of failing.
    pub(super) async fn tier_request(&self, req: &PublishRequest) -> PublishRequest {
        let mut out = req.clone();
        if let (Some(tier), Some(BaseInput { context, .. })) = (self.tier(), &req.base) {
            let ns = req.identity.namespace();
            let held = matches!(
                tier.store.peek_root(&ns, context).await,
                Ok(RootStatus::Found(_))
            );
            if !held {
                tracing::debug!(base = %keys::root_key(&ns, context), "tier lacks the base: publishing the turn flat there");
                out.base = None;
            }
        }
        out
    }

    /// Publishes the turn after `prev` to the origin and, concurrently, to
    /// the tier (the same new pages; the tier's root is its own turn on its
    /// copy of `prev`). The origin's result is returned. A tier without
    /// `prev`'s root (evicted, or never filled) cannot take a tail alone:
    /// the new root is then copied in from the origin in the background, as
    /// after a restore. A tier root the origin did not take is removed.
    pub(crate) async fn turn_through(
        &self,
        tier: &Tier<'_>,
        prev: &Turn,
        req: TurnRequest,
    ) -> Result<PublishReceipt> {
        let key = RootKey::from((req.identity.namespace(), req.context));
        let in_tier = prev.for_store(tier.store);
        let (origin, in_tier) = tokio::join!(
            self.publish_turn_here(prev, req.clone()),
            tier.store.publish_turn_here(&in_tier, req)
        );
        let (tier_holds, tier_created, stale) = match &in_tier {
            Err(StoreError::BaseMismatch { .. }) => (false, false, false),
            other => {
                let (created, stale) = tier_answer(tier, other);
                (
                    matches!(other, Ok(r) if r.outcome != PublishOutcome::Conflict),
                    created,
                    stale,
                )
            }
        };
        match &origin {
            Ok(r) if r.outcome != PublishOutcome::Conflict => {
                tier.seen_in_origin(key, r.snapshot_digest);
                if stale {
                    // The tier's root at this context is one the origin
                    // replaced: dropped, and the origin's copied in.
                    tier.drop_root(key).await;
                }
                if !tier_holds {
                    tier.schedule_fill(key);
                }
            }
            _ if tier_created => tier.drop_root(key).await,
            _ => {}
        }
        origin
    }
}

/// What the tier's side of a write-through publication says: whether it
/// created the root, and whether it refused it as a conflict (the tier
/// holds another snapshot there: stale, if the origin takes the new one).
/// A conflict or an error is counted as a publication the tier did not
/// take.
fn tier_answer(tier: &Tier<'_>, in_tier: &Result<PublishReceipt>) -> (bool, bool) {
    match in_tier {
        Ok(r) if r.outcome == PublishOutcome::Conflict => {
            Stats::add(&tier.counters.publish_failures, 1);
            (false, true)
        }
        Ok(r) => (r.outcome == PublishOutcome::Created, false),
        Err(e) => {
            tracing::warn!(error = %e, "the tier did not take a publication (the origin decides)");
            Stats::add(&tier.counters.publish_failures, 1);
            (false, false)
        }
    }
}

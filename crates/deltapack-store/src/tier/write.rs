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
    /// origin's result is returned; the tier's failure is counted, and a
    /// tier root the origin did not take (a conflict there, an error) is
    /// removed again.
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
            tier.store.publish_uncounted(tier_req, &|_, _| {})
        );
        let tier_created = match &in_tier {
            Ok(r) if r.outcome == PublishOutcome::Conflict => {
                Stats::add(&tier.counters.publish_failures, 1);
                false
            }
            Ok(r) => r.outcome == PublishOutcome::Created,
            Err(e) => {
                tracing::warn!(error = %e, "the tier did not take a publication (the origin decides)");
                Stats::add(&tier.counters.publish_failures, 1);
                false
            }
        };
        match &origin {
            Ok(r) if r.outcome != PublishOutcome::Conflict => tier.seen_in_origin(key),
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
        let (tier_holds, tier_created) = match &in_tier {
            Ok(r) if r.outcome == PublishOutcome::Conflict => {
                Stats::add(&tier.counters.publish_failures, 1);
                (false, false)
            }
            Ok(r) => (true, r.outcome == PublishOutcome::Created),
            Err(StoreError::BaseMismatch { .. }) => (false, false),
            Err(e) => {
                tracing::warn!(error = %e, "the tier did not take a turn (the origin decides)");
                Stats::add(&tier.counters.publish_failures, 1);
                (false, false)
            }
        };
        match &origin {
            Ok(r) if r.outcome != PublishOutcome::Conflict => {
                tier.seen_in_origin(key);
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

//! The read path from the nearest copy: the tier first, under the
//! coherence rule, then the origin.
//!
//! Owns the decision whether a tier answer is served or falls through.
//! Must never hand over a byte the tier's own restore has not verified, or
//! leave bytes of a refused tier copy in the caller's buffer.

use futures::future::{BoxFuture, FutureExt};

use deltapack_format::Digest;

use deltapack_format::{CacheIdentity, ContextDigest};

use super::handle::Tier;
use super::state::OriginView;
use crate::error::{MissReason, Result, StoreError};
use crate::keys::RootKey;
use crate::lookup::{Lookup, LookupSource};
use crate::restore::{RestoreIntoOutcome, RestoreOptions, RestoreOutcome, Restored};
use crate::stats::Stats;
use crate::store::Store;

impl Tier<'_> {
    /// [`Store::lookup_detailed`] on a tiered handle: the origin (given at
    /// most twice [`super::TierConfig::check_timeout`], and not asked while
    /// it is remembered down) and the tier, concurrently. The origin's
    /// answer stands, unless the tier's is longer and journaled for upload
    /// (acknowledged, on its way to the origin); when the origin does not
    /// answer, the tier's is the answer (a failure of the origin is
    /// returned only if the tier has none either).
    pub(crate) async fn lookup(
        &self,
        identity: &CacheIdentity,
        candidates: &[(u64, ContextDigest)],
    ) -> Result<Lookup> {
        let bound = self.config.check_timeout * 2;
        let origin = async {
            if self.origin_down() {
                return Err(StoreError::OriginUnavailable {
                    origin: self.origin.origin_name(),
                    source: Box::new(StoreError::Invalid(
                        "the origin did not answer a recent check".into(),
                    )),
                });
            }
            match tokio::time::timeout(bound, self.origin.lookup_here(identity, candidates)).await {
                Ok(Ok(l)) => {
                    self.origin_answered(true);
                    Ok(l)
                }
                Ok(Err(e)) => {
                    if matches!(e, StoreError::Io { .. }) {
                        self.origin_answered(false);
                    }
                    Err(self.origin.origin_failed(e))
                }
                Err(_) => {
                    self.origin_answered(false);
                    Err(StoreError::OriginUnavailable {
                        origin: self.origin.origin_name(),
                        source: Box::new(StoreError::Invalid(format!(
                            "no answer within {} ms",
                            bound.as_millis()
                        ))),
                    })
                }
            }
        };
        let (origin, here) = tokio::join!(origin, self.store.lookup_here(identity, candidates));
        let here = here.ok().and_then(|l| l.found);
        let tier_answer = |found| Lookup {
            found,
            source: LookupSource::Tier,
        };
        match (origin, here) {
            (Ok(o), Some((b, c))) if o.found.is_none_or(|(ob, _)| b > ob) => {
                let key = RootKey::from((identity.namespace(), c));
                Ok(if self.upload_pending(key).await {
                    tier_answer(Some((b, c)))
                } else {
                    o
                })
            }
            (Ok(o), _) => Ok(o),
            (Err(_), Some(found)) => Ok(tier_answer(Some(found))),
            (Err(e), None) => Err(e),
        }
    }
}

impl Store {
    /// A restore from the tier, if one is configured and may serve `key`:
    /// `None` sends the restore to the origin (and says why in the tier's
    /// counters).
    ///
    /// Boxed: the tier's own restore is a call of [`Store::restore`] one
    /// level down (the tier has no tier, but the future's type would
    /// contain itself).
    pub(crate) fn tier_restore(
        &self,
        key: RootKey,
        opts: RestoreOptions,
    ) -> BoxFuture<'_, Option<Restored>> {
        async move { self.tier_restore_boxed(key, opts).await }.boxed()
    }

    async fn tier_restore_boxed(&self, key: RootKey, opts: RestoreOptions) -> Option<Restored> {
        let tier = self.tier()?;
        let (out, view) = tokio::join!(
            tier.store.restore(key, opts),
            tier.origin_view(key, opts.deadline)
        );
        match out {
            Ok(RestoreOutcome::Hit(hit)) => self
                .serve_tier_hit(key, hit.digest, view)
                .await
                .then_some(hit),
            Ok(RestoreOutcome::Miss(reason)) => self.not_served(Ok(&reason)),
            Err(e) => self.not_served(Err(&e)),
        }
    }

    /// [`Store::tier_restore`] into the caller's buffer. On `None` the
    /// buffer holds no tier byte that was not verified (a refused copy is
    /// zeroed), as [`Store::restore_into`]'s contract asks.
    /// Boxed, as [`Store::tier_restore`] is.
    pub(crate) fn tier_restore_into<'a>(
        &'a self,
        key: RootKey,
        buf: &'a mut [u8],
        opts: RestoreOptions,
    ) -> BoxFuture<'a, Option<RestoreIntoOutcome>> {
        async move { self.tier_restore_into_boxed(key, buf, opts).await }.boxed()
    }

    async fn tier_restore_into_boxed(
        &self,
        key: RootKey,
        buf: &mut [u8],
        opts: RestoreOptions,
    ) -> Option<RestoreIntoOutcome> {
        let tier = self.tier()?;
        let (out, view) = tokio::join!(
            tier.store.restore_into(key, &mut *buf, opts),
            tier.origin_view(key, opts.deadline)
        );
        match out {
            Ok(hit @ RestoreIntoOutcome::Hit { digest, .. }) => {
                if self.serve_tier_hit(key, digest, view).await {
                    Some(hit)
                } else {
                    buf.fill(0);
                    None
                }
            }
            Ok(RestoreIntoOutcome::Miss { reason }) => self.not_served(Ok(&reason)),
            Err(e) => self.not_served(Err(&e)),
        }
    }

    /// Whether a verified tier hit of the snapshot `digest` is served, by
    /// the coherence rule: the origin holds the same snapshot (served),
    /// holds another or none (refused, and the tier's copy dropped unless
    /// it is journaled for upload or needed by a delta that is — a
    /// journaled root the origin lacks is served: it is on its way there),
    /// or did not answer (served, counted as unchecked).
    async fn serve_tier_hit(&self, key: RootKey, digest: Digest, view: OriginView) -> bool {
        let Some(tier) = self.tier() else {
            return false;
        };
        let refuse = match view {
            OriginView::Holds(held) => held.is_some_and(|d| d != digest),
            OriginView::Absent => !tier.upload_pending(key).await,
            OriginView::Unknown => {
                Stats::add(&tier.counters.unchecked, 1);
                false
            }
        };
        if refuse {
            Stats::add(&tier.counters.refused, 1);
            tier.drop_root(key).await;
            return false;
        }
        Stats::add(&tier.counters.hits, 1);
        true
    }

    /// Counts a tier answer that sends the restore to the origin: absent
    /// is a miss, anything else (damage, a missing object, the deadline, a
    /// tier error) a fall-through. Always `None`.
    fn not_served<T>(&self, why: std::result::Result<&MissReason, &StoreError>) -> Option<T> {
        if let Some(tier) = self.tier() {
            let c = match why {
                Ok(MissReason::Absent) => &tier.counters.misses,
                Ok(_) => &tier.counters.fall_throughs,
                Err(e) => {
                    tracing::warn!(error = %e, "tier restore failed; reading from the origin");
                    &tier.counters.fall_throughs
                }
            };
            Stats::add(c, 1);
        }
        None
    }

    /// After the origin served `key`: it holds the root now, and the tier
    /// is filled with it in the background.
    pub(crate) fn after_origin_hit(&self, key: RootKey, digest: Digest) {
        if let Some(tier) = self.tier() {
            tier.seen_in_origin(key, digest);
            tier.schedule_fill(key);
        }
    }

    /// The error of a restore the tier did not serve: a backend failure of
    /// the origin says so (the origin is down, the tier lacks the root);
    /// without a tier, or for any other error, it is returned as it is.
    pub(crate) fn origin_failed(&self, e: StoreError) -> StoreError {
        match (self.tier(), &e) {
            (Some(_), StoreError::Io { .. }) => StoreError::OriginUnavailable {
                origin: self.origin_name(),
                source: Box::new(e),
            },
            _ => e,
        }
    }

    /// This store as its errors name it when it is a tier's origin.
    fn origin_name(&self) -> String {
        self.backend_kind().identity()
    }
}

//! The read path from the nearest copy: the tier first, under the
//! coherence rule, then the origin.
//!
//! Owns the decision whether a tier answer is served or falls through.
//! Must never hand over a byte the tier's own restore has not verified, or
//! leave bytes of a refused tier copy in the caller's buffer.

use futures::future::{BoxFuture, FutureExt};

use super::state::Coherence;
use crate::error::{MissReason, StoreError};
use crate::keys::RootKey;
use crate::restore::{RestoreIntoOutcome, RestoreOptions, RestoreOutcome, Restored};
use crate::stats::Stats;
use crate::store::Store;

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
        let (out, coherence) = tokio::join!(tier.store.restore(key, opts), tier.coherence(key));
        match out {
            Ok(RestoreOutcome::Hit(hit)) => {
                self.serve_tier_hit(key, coherence).await.then_some(hit)
            }
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
        let (out, coherence) = tokio::join!(
            tier.store.restore_into(key, &mut *buf, opts),
            tier.coherence(key)
        );
        match out {
            Ok(hit @ RestoreIntoOutcome::Hit { .. }) => {
                if self.serve_tier_hit(key, coherence).await {
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

    /// Whether a verified tier hit is served, by the coherence rule; a
    /// refused one is removed from the tier.
    async fn serve_tier_hit(&self, key: RootKey, coherence: Coherence) -> bool {
        let Some(tier) = self.tier() else {
            return false;
        };
        match coherence {
            Coherence::Refuse => {
                Stats::add(&tier.counters.refused, 1);
                tier.drop_root(key).await;
                false
            }
            Coherence::Unchecked => {
                Stats::add(&tier.counters.unchecked, 1);
                Stats::add(&tier.counters.hits, 1);
                true
            }
            Coherence::Serve => {
                Stats::add(&tier.counters.hits, 1);
                true
            }
        }
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
    pub(crate) fn after_origin_hit(&self, key: RootKey) {
        if let Some(tier) = self.tier() {
            tier.seen_in_origin(key);
            tier.schedule_fill(key);
        }
    }

    /// The error of a restore the tier did not serve: a backend failure of
    /// the origin says so (the origin is down, the tier lacks the root);
    /// without a tier, or for any other error, it is returned as it is.
    pub(crate) fn origin_failed(&self, e: StoreError) -> StoreError {
        match (self.tier(), &e) {
            (Some(_), StoreError::Io { .. }) => StoreError::OriginUnavailable {
                origin: match self.backend_kind() {
                    crate::BackendKind::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
                    crate::BackendKind::Local { root } => format!("file://{}", root.display()),
                    other => format!("{other:?}"),
                },
                source: Box::new(e),
            },
            _ => e,
        }
    }
}

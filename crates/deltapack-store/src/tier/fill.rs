//! The fill: a root the origin just served is copied into the tier in the
//! background, with the chain links the tier lacks.
//!
//! Owns when a fill starts and how many run. Must never delay the restore
//! that started it or run without bound (the copy itself is `copy.rs`'s;
//! what a restore already put in the tier, `tap.rs`'s).

use super::copy::Copy;
use super::handle::Tier;
use super::state::lock;
use crate::keys::RootKey;
use crate::stats::Stats;

impl Tier<'_> {
    /// Starts the background fill of `key` from `origin`, unless the root
    /// is already being filled or [`super::TierConfig::fill_roots_in_flight`]
    /// fills are running (then it is skipped and counted).
    pub(crate) fn schedule_fill(&self, key: RootKey) {
        let k = (key.namespace, key.context);
        {
            let mut filling = lock(&self.filling);
            if filling.contains(&k) {
                return;
            }
            if filling.len() >= self.config.fill_roots_in_flight {
                Stats::add(&self.counters.fills_skipped, 1);
                return;
            }
            filling.insert(k);
        }
        let origin = self.origin.clone();
        // The restore that started this fill may have written its verified
        // objects into the tier already (`tap.rs`).
        let tap = self.tap_of(key);
        let task = tokio::spawn(async move {
            let Some(tier) = origin.tier() else { return };
            let (guard, staged) = match tap {
                Some(tap) => tap.settle().await,
                None => (None, None),
            };
            let copy = Copy {
                from: &origin,
                to: tier.store,
                objects: &tier.copy_objects,
                in_flight: tier.config.fill_objects_in_flight,
                parts: None,
                what: "tier fill",
                journaled: None,
                staged: staged.as_deref(),
            };
            match copy.root(key, guard).await {
                Ok(c) if c.conflict => {
                    // The tier holds another snapshot for a link (published
                    // there and refused by the origin); the coherence rule
                    // removes it when it is next asked for.
                    Stats::add(&tier.counters.fills_failed, 1);
                }
                Ok(c) => {
                    if c.bytes + c.reused > 0 {
                        Stats::add(&tier.counters.fills, 1);
                        Stats::add(&tier.counters.fill_bytes, c.bytes);
                        Stats::add(&tier.counters.fill_reused_bytes, c.reused);
                    }
                }
                Err(e) => {
                    Stats::add(&tier.counters.fills_failed, 1);
                    tracing::info!(error = %e, "tier fill failed (the origin still has the root)");
                }
            }
            lock(&tier.filling).remove(&k);
        });
        let mut tasks = lock(&self.fill_tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }
}

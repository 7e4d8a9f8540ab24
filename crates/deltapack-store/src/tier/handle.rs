//! The tier as the origin's handle sees it ([`Tier`]: the origin, the
//! tier store and the state), the coherence rule, and the tier's public
//! face on [`Store`] (`tier_store`, `tier_stats`, `tier_settle`, and
//! `inspect` with locations).
//!
//! Owns the coherence rule. Must never change the origin.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use deltapack_format::Namespace;
use futures::FutureExt;

use super::config::TierStats;
use super::state::{lock, OriginView, TierState};
use crate::error::Result;
use crate::keys::RootKey;
use crate::store::{RootInfo, RootStatus, Store};

/// A handle's tier: the origin handle, the tier store and the state.
#[derive(Clone, Copy)]
pub(crate) struct Tier<'a> {
    /// The handle the caller holds.
    pub(crate) origin: &'a Store,
    /// The tier store (local disk, its own ledger and budget, no tier).
    pub(crate) store: &'a Store,
    /// What the handle knows of the tier.
    pub(crate) state: &'a Arc<TierState>,
}

impl std::ops::Deref for Tier<'_> {
    type Target = TierState;

    fn deref(&self) -> &TierState {
        self.state
    }
}

impl Tier<'_> {
    /// What the origin holds at `key`, for the coherence rule (module
    /// docs): the answer cached within [`super::TierConfig::check_interval`],
    /// else one read of the origin's root, bounded by
    /// [`super::TierConfig::check_timeout`] and by `deadline`. While the
    /// origin is remembered down (the breaker), `Unknown` at once.
    pub(crate) async fn origin_view(
        &self,
        key: RootKey,
        deadline: Option<tokio::time::Instant>,
    ) -> OriginView {
        let k = (key.namespace, key.context);
        let cached = lock(&self.checked)
            .get(&k)
            .filter(|(_, t)| t.elapsed() < self.config.check_interval)
            .map(|(d, _)| *d);
        if let Some(d) = cached {
            return OriginView::Holds(d);
        }
        if self.origin_down() {
            return OriginView::Unknown;
        }
        let mut bound = self.config.check_timeout;
        if let Some(d) = deadline {
            bound = bound.min(d.saturating_duration_since(tokio::time::Instant::now()));
        }
        let check = {
            let mut checks = lock(&self.checks);
            checks
                .entry(k)
                .or_insert_with(|| {
                    let origin = self.origin.clone();
                    let task = tokio::spawn(async move {
                        let Some(tier) = origin.tier() else {
                            return OriginView::Unknown;
                        };
                        let view = tier.check_origin(key).await;
                        lock(&tier.checks).remove(&(key.namespace, key.context));
                        view
                    });
                    async move { task.await.unwrap_or(OriginView::Unknown) }
                        .boxed()
                        .shared()
                })
                .clone()
        };
        tokio::time::timeout(bound, check)
            .await
            .unwrap_or(OriginView::Unknown)
    }

    /// One check of the origin's root at `key`, bounded by
    /// [`super::TierConfig::check_timeout`]; its answer is cached, and a
    /// failure to answer opens the breaker.
    async fn check_origin(&self, key: RootKey) -> OriginView {
        let k = (key.namespace, key.context);
        let path = crate::keys::root_key(&key.namespace, &key.context);
        let read = self.origin.peek_root(&key.namespace, &key.context);
        match tokio::time::timeout(self.config.check_timeout, read).await {
            Ok(Ok(RootStatus::Found(root))) => {
                self.origin_answered(true);
                let digest = root.snapshot_digest();
                lock(&self.checked).insert(k, (digest, Instant::now()));
                OriginView::Holds(digest)
            }
            Ok(Ok(RootStatus::Absent)) => {
                self.origin_answered(true);
                lock(&self.checked).remove(&k);
                OriginView::Absent
            }
            Ok(Ok(RootStatus::Unusable(why))) => {
                self.origin_answered(true);
                tracing::warn!(%path, %why, "the origin's root is unusable; serving the verified tier copy unchecked");
                OriginView::Unknown
            }
            Ok(Err(e)) => {
                self.origin_answered(false);
                tracing::warn!(error = %e, %path, "origin check failed; serving the verified tier copy");
                OriginView::Unknown
            }
            Err(_) => {
                self.origin_answered(false);
                tracing::warn!(%path, "origin check timed out; serving the verified tier copy");
                OriginView::Unknown
            }
        }
    }

    /// Removes the tier's copy of a root the origin no longer holds (or
    /// holds with another snapshot), with any delta built on it — unless
    /// any of them is pinned or held: a root journaled for upload, or one
    /// an unuploaded delta needs, is never removed by a read (it is only
    /// not served). Failures are logged: the hit is refused either way.
    pub(crate) async fn drop_root(&self, key: RootKey) {
        let out = async {
            let plan = self.store.drop_plan(key.namespace, key.context).await?;
            self.store.execute(plan).await
        }
        .await;
        match out {
            Ok(r) if r.roots.is_empty() => {
                tracing::info!(root = %crate::keys::root_key(&key.namespace, &key.context), "a stale tier root is kept: it or a delta on it waits for its upload");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not remove a stale root from the tier"),
        }
    }

    /// Says where each of the origin's `roots` lives, and adds the roots
    /// only the tier holds (`inspect`).
    pub(crate) async fn locate(
        &self,
        roots: &mut Vec<RootInfo>,
        ns: Option<&Namespace>,
    ) -> Result<()> {
        let hex = |k: RootKey| (k.namespace.hex(), k.context.hex());
        let pending: HashSet<(String, String)> =
            self.pending_uploads().await?.into_iter().map(hex).collect();
        let conflicted: HashSet<(String, String)> = self
            .conflicted_uploads()
            .await?
            .into_iter()
            .map(hex)
            .collect();
        let mut index = HashMap::new();
        for (i, r) in roots.iter_mut().enumerate() {
            r.location = Some("origin".into());
            index.insert((r.namespace.clone(), r.context.clone()), i);
        }
        for mut t in self.store.inspect_here(ns).await? {
            let key = (t.namespace.clone(), t.context.clone());
            let here = if conflicted.contains(&key) {
                // Another snapshot than the origin's: listed on its own.
                "tier (upload conflict)"
            } else if let Some(&i) = index.get(&key) {
                roots[i].location = Some("origin+tier".into());
                continue;
            } else if pending.contains(&key) {
                "tier (upload pending)"
            } else {
                "tier"
            };
            t.location = Some(here.into());
            roots.push(t);
        }
        Ok(())
    }
}

impl Store {
    /// The tier in front of this store, if one is configured.
    pub(crate) fn tier(&self) -> Option<Tier<'_>> {
        match (&self.inner.tier_store, &self.inner.tier) {
            (Some(store), Some(state)) => Some(Tier {
                origin: self,
                store,
                state,
            }),
            _ => None,
        }
    }

    /// The tier's store, if one is configured (for `stats`, `inspect` and
    /// maintenance of the tier itself).
    pub fn tier_store(&self) -> Option<&Store> {
        self.inner.tier_store.as_ref()
    }

    /// What the tier did, if one is configured.
    pub fn tier_stats(&self) -> Option<TierStats> {
        self.tier().map(|t| t.stats())
    }

    /// Waits until every fill started so far has finished (tests, benches,
    /// and a process about to exit that wants its tier warm).
    pub async fn tier_settle(&self) {
        let Some(t) = self.tier() else { return };
        super::state::join_all(&t.fill_tasks).await;
    }

    /// Every root and what it references (`deltapack inspect`); on a store
    /// with a tier, also where each lives (`RootInfo::location`) and the
    /// roots only the tier holds.
    pub async fn inspect(&self, ns: Option<&Namespace>) -> Result<Vec<RootInfo>> {
        let mut out = self.inspect_here(ns).await?;
        if let Some(tier) = self.tier() {
            tier.locate(&mut out, ns).await?;
        }
        Ok(out)
    }
}

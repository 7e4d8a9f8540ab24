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
use object_store::ObjectStoreExt;

use super::config::TierStats;
use super::state::{lock, Coherence, TierState};
use crate::error::Result;
use crate::keys::RootKey;
use crate::store::{RootInfo, Store};

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
    /// The coherence rule for a tier hit on `key` (module docs).
    pub(crate) async fn coherence(&self, key: RootKey) -> Coherence {
        let k = (key.namespace, key.context);
        let fresh = lock(&self.checked)
            .get(&k)
            .is_some_and(|t| t.elapsed() < self.config.check_interval);
        if fresh {
            return Coherence::Serve;
        }
        let path = crate::keys::root_key(&key.namespace, &key.context);
        let head = self.origin.object_store().head(&path);
        match tokio::time::timeout(self.config.check_timeout, head).await {
            Ok(Ok(_)) => {
                lock(&self.checked).insert(k, Instant::now());
                Coherence::Serve
            }
            Ok(Err(object_store::Error::NotFound { .. })) => {
                lock(&self.checked).remove(&k);
                // A publication acknowledged in the tier and not uploaded
                // yet is not stale: it is on its way to the origin.
                if self.upload_pending(key).await {
                    Coherence::Serve
                } else {
                    Coherence::Refuse
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, %path, "origin check failed; serving the verified tier copy");
                Coherence::Unchecked
            }
            Err(_) => {
                tracing::warn!(%path, "origin check timed out; serving the verified tier copy");
                Coherence::Unchecked
            }
        }
    }

    /// Removes the tier's copy of a root the origin no longer holds (with
    /// any delta built on it, as an invalidation does). Failures are
    /// logged: the hit is refused either way.
    pub(crate) async fn drop_root(&self, key: RootKey) {
        let out = async {
            let plan = self
                .store
                .invalidate_plan(key.namespace, Some(key.context))
                .await?;
            self.store.execute(plan).await
        }
        .await;
        if let Err(e) = out {
            tracing::warn!(error = %e, "could not remove a stale root from the tier");
        }
    }

    /// Says where each of the origin's `roots` lives, and adds the roots
    /// only the tier holds (`inspect`).
    pub(crate) async fn locate(
        &self,
        roots: &mut Vec<RootInfo>,
        ns: Option<&Namespace>,
    ) -> Result<()> {
        let pending: HashSet<(String, String)> = self
            .pending_uploads()
            .await?
            .into_iter()
            .map(|k| (k.namespace.hex(), k.context.hex()))
            .collect();
        let mut index = HashMap::new();
        for (i, r) in roots.iter_mut().enumerate() {
            r.location = Some("origin".into());
            index.insert((r.namespace.clone(), r.context.clone()), i);
        }
        for mut t in self.store.inspect_here(ns).await? {
            let key = (t.namespace.clone(), t.context.clone());
            match index.get(&key) {
                Some(&i) => roots[i].location = Some("origin+tier".into()),
                None => {
                    let pending = pending.contains(&key);
                    t.location = Some(
                        if pending {
                            "tier (upload pending)"
                        } else {
                            "tier"
                        }
                        .into(),
                    );
                    roots.push(t);
                }
            }
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
        loop {
            let tasks: Vec<_> = lock(&t.fill_tasks).drain(..).collect();
            if tasks.is_empty() {
                return;
            }
            for task in tasks {
                let _ = task.await;
            }
        }
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

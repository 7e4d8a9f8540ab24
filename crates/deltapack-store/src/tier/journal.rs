//! The upload journal of a tier: which publications acknowledged in the
//! tier are not in the origin yet, which the origin refused (conflicts),
//! and what it takes to give one up (`tier abandon`).
//!
//! Owns the journal's entries: hold markers under the tier's `holds/`
//! named [`UPLOAD_HOLD`] (pending) or [`CONFLICT_HOLD`] (the origin holds
//! another snapshot at the context). Each marker holds the publication's
//! [`CacheIdentity`] as JSON, so an upload that must go up flat can be
//! published under it. Must never release an entry whose root the origin
//! does not hold, except by an explicit abandon that says what is lost.
//!
//! **From creation.** An entry is written (durable, and in the tier's
//! ledger) *before* the behind publication creates its root: a root
//! acknowledged in the tier is pinned from the instant it exists, and a
//! process killed between the two leaves a journaled root, never an
//! unjournaled one. A publication that fails releases the entry it
//! placed; an entry left by a process killed before its root was made
//! durable names nothing — the upload skips it while it is young and
//! releases it after [`UNFINISHED_AFTER`] (that publication was never
//! acknowledged).

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use deltapack_format::{CacheIdentity, ContextDigest, Namespace};
use object_store::ObjectStoreExt;
use serde::Serialize;

use super::handle::Tier;
use crate::error::{Result, StoreError};
use crate::keys::{self, HoldName, RootKey};
use crate::store::{RootStatus, Store};

/// The name of the tier hold that journals a pending upload.
pub const UPLOAD_HOLD: &str = "deltapack-upload";

/// The name of the tier hold that keeps a publication the origin refused
/// (it holds another snapshot at the context) until it is abandoned.
pub const CONFLICT_HOLD: &str = "deltapack-upload-conflict";

/// How long a journal entry without its root is taken for a publication
/// still being made, before it is released as one that never finished.
pub(crate) const UNFINISHED_AFTER: Duration = Duration::from_secs(600);

pub(crate) fn upload_hold() -> HoldName {
    HoldName::new(UPLOAD_HOLD).unwrap_or_else(|| unreachable!("a valid constant hold name"))
}

fn conflict_hold() -> HoldName {
    HoldName::new(CONFLICT_HOLD).unwrap_or_else(|| unreachable!("a valid constant hold name"))
}

/// One root given up by [`Store::tier_abandon`].
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct AbandonedRoot {
    /// The root's key (`roots/<namespace>/<context>`).
    pub root: String,
    /// Whether it was journaled as pending (`pending`) or as a conflict
    /// (`conflict`).
    pub state: &'static str,
    /// Whether the origin holds this very snapshot (nothing is lost).
    pub in_origin: bool,
}

/// What [`Store::tier_abandon`] gave up.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct AbandonReport {
    /// The journal entries released (the root and every delta on it that
    /// had one).
    pub abandoned: Vec<AbandonedRoot>,
    /// Roots removed from the tier.
    pub removed: u64,
}

/// The identity a journal entry of `store` (a tier) records for `key`.
pub(crate) async fn journaled_identity(store: &Store, key: RootKey) -> Result<CacheIdentity> {
    for name in [upload_hold(), conflict_hold()] {
        let marker = keys::hold_key(&name, &key.namespace, &key.context);
        let bytes = match store.object_store().get(&marker).await {
            Ok(g) => g.bytes().await.map_err(|e| StoreError::io(&marker, e))?,
            Err(object_store::Error::NotFound { .. }) => continue,
            Err(e) => return Err(StoreError::io(&marker, e)),
        };
        if bytes.is_empty() {
            break;
        }
        let id: CacheIdentity = serde_json::from_slice(&bytes).map_err(|e| {
            StoreError::Invalid(format!("journal entry {marker}: not an identity: {e}"))
        })?;
        if id.namespace() != key.namespace {
            return Err(StoreError::Invalid(format!(
                "journal entry {marker}: its identity names another namespace"
            )));
        }
        return Ok(id);
    }
    Err(StoreError::Invalid(format!(
        "{}/{}: the journal entry records no identity (written by an earlier version); \
         it can go up only onto the base it was built on",
        key.namespace, key.context
    )))
}

impl Tier<'_> {
    /// The roots journaled for upload (by any process of this node).
    pub(crate) async fn pending_uploads(&self) -> Result<Vec<RootKey>> {
        self.journal_of(&upload_hold()).await
    }

    /// The roots the origin refused, kept in the tier until abandoned.
    pub(crate) async fn conflicted_uploads(&self) -> Result<Vec<RootKey>> {
        self.journal_of(&conflict_hold()).await
    }

    async fn journal_of(&self, name: &HoldName) -> Result<Vec<RootKey>> {
        Ok(self
            .store
            .list_holds()
            .await?
            .into_iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, ns, ctx)| RootKey::from((ns, ctx)))
            .collect())
    }

    /// Whether `key` is journaled for upload (its origin copy may not
    /// exist yet, and that is not staleness).
    pub(crate) async fn upload_pending(&self, key: RootKey) -> bool {
        let marker = keys::hold_key(&upload_hold(), &key.namespace, &key.context);
        self.store.object_store().head(&marker).await.is_ok()
    }

    /// Journals `key` for upload before its root is created: the marker
    /// (with `identity`) durable and the tier's ledger row written. Whether
    /// this call placed it (`false`: an entry was there already, another
    /// publication's, which this one must not release).
    pub(crate) async fn journal_begin(
        &self,
        key: RootKey,
        identity: &CacheIdentity,
    ) -> Result<bool> {
        let json = serde_json::to_vec(identity)
            .map_err(|e| StoreError::Internal(format!("identity as JSON: {e}")))?;
        self.store
            .hold_root_with(
                &upload_hold(),
                key.namespace,
                key.context,
                Bytes::from(json),
            )
            .await
    }

    /// Releases an entry [`Tier::journal_begin`] placed for a publication
    /// that did not create its root (logged if it cannot be: the upload
    /// releases it later as unfinished).
    pub(crate) async fn journal_cancel(&self, key: RootKey, placed: bool) {
        if !placed {
            return;
        }
        if let Err(e) = self
            .store
            .release(UPLOAD_HOLD, key.namespace, key.context)
            .await
        {
            tracing::warn!(error = %e, "could not release the journal entry of a publication that failed");
        }
    }

    /// Moves `key`'s entry from pending to conflict: the origin holds
    /// another snapshot there. The tier keeps its copy (pinned, not served)
    /// until `tier abandon`.
    pub(crate) async fn journal_conflict(&self, key: RootKey) -> Result<()> {
        let (ns, ctx) = (key.namespace, key.context);
        let marker = keys::hold_key(&upload_hold(), &ns, &ctx);
        let contents = match self.store.object_store().get(&marker).await {
            Ok(g) => g.bytes().await.map_err(|e| StoreError::io(&marker, e))?,
            Err(object_store::Error::NotFound { .. }) => Bytes::new(),
            Err(e) => return Err(StoreError::io(&marker, e)),
        };
        self.store
            .hold_root_with(&conflict_hold(), ns, ctx, contents)
            .await?;
        self.store.release(UPLOAD_HOLD, ns, ctx).await?;
        Ok(())
    }

    /// A journal entry whose root the tier does not hold: a publication in
    /// progress (left pending), or one whose process died before the root
    /// was durable, released after [`UNFINISHED_AFTER`]. Whether it was
    /// released.
    pub(crate) async fn journal_unfinished(&self, key: RootKey) -> Result<bool> {
        let marker = keys::hold_key(&upload_hold(), &key.namespace, &key.context);
        let meta = match self.store.object_store().head(&marker).await {
            Ok(m) => m,
            Err(object_store::Error::NotFound { .. }) => return Ok(true),
            Err(e) => return Err(StoreError::io(&marker, e)),
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let age = Duration::from_millis(
            u64::try_from(now_ms - meta.last_modified.timestamp_millis()).unwrap_or(0),
        );
        if age < UNFINISHED_AFTER {
            return Ok(false);
        }
        tracing::warn!(%marker, "releasing a journal entry whose publication never finished (never acknowledged)");
        self.store
            .release(UPLOAD_HOLD, key.namespace, key.context)
            .await
    }
}

impl Tier<'_> {
    /// [`Store::tier_abandon`].
    pub(crate) async fn abandon(&self, ns: Namespace, ctx: ContextDigest) -> Result<AbandonReport> {
        let tier = self;
        let _one = tier.upload_round.lock().await;
        let plan = tier.store.invalidate_plan(ns, Some(ctx)).await?;
        let pending: HashSet<RootKey> = tier.pending_uploads().await?.into_iter().collect();
        let conflicted: HashSet<RootKey> = tier.conflicted_uploads().await?.into_iter().collect();
        let mut report = AbandonReport::default();
        for (rns, rctx) in plan.targets() {
            let key = RootKey::from((rns, rctx));
            let state = match (pending.contains(&key), conflicted.contains(&key)) {
                (true, _) => "pending",
                (_, true) => "conflict",
                _ => continue,
            };
            let digest = match tier.store.peek_root(&rns, &rctx).await? {
                RootStatus::Found(r) => r.snapshot_digest(),
                _ => None,
            };
            let in_origin = match self.origin.peek_root(&rns, &rctx).await {
                Ok(RootStatus::Found(r)) => digest.is_some() && r.snapshot_digest() == digest,
                _ => false,
            };
            tier.store.release(UPLOAD_HOLD, rns, rctx).await?;
            tier.store.release(CONFLICT_HOLD, rns, rctx).await?;
            report.abandoned.push(AbandonedRoot {
                root: keys::root_key(&rns, &rctx).to_string(),
                state,
                in_origin,
            });
        }
        report.removed = tier.store.execute(plan).await?.roots.len() as u64;
        let left = tier.pending_uploads().await?.len() as u64;
        tier.backlog
            .store(left, std::sync::atomic::Ordering::Relaxed);
        Ok(report)
    }
}

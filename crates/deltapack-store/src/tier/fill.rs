//! The fill: copying a root the origin just served, with the chain links
//! the tier lacks, into the tier in the background.
//!
//! Owns the copy's order (objects checked and durable before their root,
//! base links before the deltas on them) and its bounds. Must never write
//! to the origin or copy a byte it has not checked against its root.

use std::sync::Arc;

use bytes::Bytes;
use deltapack_format::root::DecodedRoot;
use deltapack_format::Digest;
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;

use super::{lock, Tier};
use crate::error::{Result, StoreError};
use crate::gc::ProtectGuard;
use crate::keys::RootKey;
use crate::publish::{PublishOutcome, PublishReceipt};
use crate::stats::Stats;
use crate::store::{RootStatus, Store};
use crate::verify::{check_object, Expected};

/// One chain link to copy: its key, the origin's root bytes, decoded.
struct Link {
    key: RootKey,
    bytes: Bytes,
    root: DecodedRoot,
}

impl Tier {
    /// Starts the background fill of `key` from `origin`, unless the root
    /// is already being filled or [`super::TierConfig::fill_roots_in_flight`]
    /// fills are running (then it is skipped and counted).
    pub(crate) fn schedule_fill(self: &Arc<Self>, origin: &Store, key: RootKey) {
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
        let (tier, origin) = (self.clone(), origin.clone());
        let task = tokio::spawn(async move {
            match tier.fill(&origin, key).await {
                Ok(bytes) => {
                    if bytes > 0 {
                        Stats::add(&tier.counters.fills, 1);
                        Stats::add(&tier.counters.fill_bytes, bytes);
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

    /// Copies `key` and the links below it the tier lacks; the bytes
    /// written.
    async fn fill(&self, origin: &Store, key: RootKey) -> Result<u64> {
        let links = self.links_to_copy(origin, key).await?;
        let mut written = 0;
        for link in links.into_iter().rev() {
            written += self.copy_link(origin, link).await?;
        }
        Ok(written)
    }

    /// The chain from `key` down to the first link below it the tier
    /// already holds (or the flat bottom), top first, read from the origin
    /// without side effects there.
    async fn links_to_copy(&self, origin: &Store, key: RootKey) -> Result<Vec<Link>> {
        let mut links = Vec::new();
        let mut at = Some(key);
        let max_depth = origin.config().restore.max_base_depth;
        while let Some(key) = at.take() {
            let (ns, ctx) = (key.namespace, key.context);
            // The requested root is copied even if the tier has it: its
            // objects may be gone (quarantined there); below it, a link the
            // tier holds ends the walk.
            let below = !links.is_empty();
            if below && matches!(self.store.peek_root(&ns, &ctx).await?, RootStatus::Found(_)) {
                break;
            }
            if links.len() > max_depth {
                return Err(StoreError::Invalid(format!(
                    "tier fill: the chain below {ns}/{ctx} is deeper than {max_depth}"
                )));
            }
            let (status, bytes) = origin.read_root_bytes(&ns, &ctx, false).await?;
            let (RootStatus::Found(root), Some(bytes)) = (status, bytes) else {
                return Err(StoreError::Invalid(format!(
                    "tier fill: the origin no longer holds a usable root at {ns}/{ctx}"
                )));
            };
            at = root
                .summary()
                .and_then(|s| s.base)
                .map(|b| RootKey::from((b.namespace, b.context)));
            links.push(Link {
                key,
                bytes,
                root: *root,
            });
        }
        Ok(links)
    }

    /// Copies one link: every object it names (checked against the root),
    /// then the root. The objects are protected in the tier's ledger from
    /// before they are written until the root is recorded.
    async fn copy_link(&self, origin: &Store, link: Link) -> Result<u64> {
        let tier = &self.store;
        let wanted = Expected::of_root(&link.root)
            .map_err(|e| StoreError::Invalid(format!("tier fill: extent plan: {e}")))?;
        let guard = ProtectGuard::new(tier).await?;
        let out = async {
            let need =
                wanted.iter().map(Expected::stored_len).sum::<u64>() + link.bytes.len() as u64;
            tier.make_room(need, &guard).await?;
            let protector = guard.protector();
            let written = futures::stream::iter(wanted)
                .map(|want| {
                    let protector = &protector;
                    async move {
                        let key = want.object().path();
                        protector.protect(vec![key.to_string()]).await?;
                        if let Ok(meta) = tier.object_store().head(&key).await {
                            if meta.size == want.stored_len() {
                                return Ok(0);
                            }
                        }
                        let _permit = self
                            .fill_objects
                            .acquire()
                            .await
                            .map_err(|e| StoreError::Internal(format!("fill permits: {e}")))?;
                        let stored = verified(origin, want).await?;
                        let len = stored.len() as u64;
                        tier.write_object(&key, stored.into(), None).await?;
                        Ok::<u64, StoreError>(len)
                    }
                })
                .buffer_unordered(self.config.fill_objects_in_flight)
                .try_fold(0u64, |a, b| async move { Ok(a + b) })
                .await?;
            let (ns, ctx) = (link.key.namespace, link.key.context);
            // Another fill (of a turn above) may create this root first:
            // the same snapshot digest makes that idempotent success.
            let digest = link
                .root
                .summary()
                .map_or_else(|| Digest::blake3(&[]), |s| s.result_snapshot_digest);
            let mut receipt = PublishReceipt::empty(ns, ctx, digest);
            tier.create_root(&ns, &ctx, link.bytes.clone(), &mut receipt, None)
                .await?;
            if receipt.outcome == PublishOutcome::Conflict {
                return Err(StoreError::Invalid(format!(
                    "tier fill: the tier holds another snapshot at {ns}/{ctx}"
                )));
            }
            let root = match receipt.outcome {
                PublishOutcome::Created => link.bytes.len() as u64,
                _ => 0,
            };
            Ok(written + root)
        }
        .await;
        guard.finish().await;
        out
    }
}

/// Reads one object from the origin and checks it against its root's
/// record; the stored bytes, as the tier must hold them.
async fn verified(origin: &Store, want: Expected) -> Result<Bytes> {
    let key = want.object().path();
    let stored = match origin.fetch_exact(&key, want.stored_len()).await {
        Ok(b) => b,
        Err(fault) => {
            let fault = fault.into_error()?;
            return Err(StoreError::Invalid(format!(
                "tier fill: origin object {key}: {}",
                fault.check.map_or(crate::ObjectCheck::Missing, |c| *c)
            )));
        }
    };
    let check = stored.clone();
    tokio::task::spawn_blocking(move || check_object(&want, check).map(|_| ()))
        .await
        .map_err(|e| StoreError::task("tier fill check", e))?
        .map_err(|c| StoreError::Invalid(format!("tier fill: origin object {key}: {c}")))?;
    Ok(stored)
}

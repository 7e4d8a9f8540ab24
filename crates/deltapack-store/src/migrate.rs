//! Migration of legacy v1 roots to v2, one root at a time, never unreadable.
//!
//! For each v1 root: restore it (full verification, including the rebuilt
//! snapshot digest), fetch its verified payload, write that payload as v2
//! extents (durable), build the v2 manifest from the same metadata — so the
//! result snapshot digest and the payload digest are provably unchanged — and
//! only then replace the root object atomically — and only if it still holds
//! exactly the bytes read at the start. On local disk the comparison and the
//! rename happen under the store's root lock, which every root deletion
//! (eviction, pruning, invalidation) also takes; on S3 the overwrite is a
//! conditional PUT on the root's ETag (`If-Match`), and a backend without
//! conditional overwrites makes migration fail with a clear error instead of
//! risking an unconditional one. So a root evicted, invalidated or
//! republished while it was being migrated is never brought back. A keyed
//! root is migrated only by a store that has the key (without it the new
//! root would carry no MAC). Readers see the v1 root or the v2 root at every
//! moment, never neither. The v1 chunk objects are then condemned in the
//! ledger and reclaimed after the grace period. Deltas based on a migrated
//! root keep working: the base reference names the snapshot digest, which
//! did not change.

use bytes::Bytes;
use deltapack_format::root::{self, RootMeta};
use deltapack_format::{DecodedRoot, Digest, SnapshotHeader};
use object_store::ObjectStoreExt;
use serde::Serialize;

use crate::error::{Result, StoreError};
use crate::keys;
use crate::ledger::{now_ms, RootEntry};
use crate::local::Replaced;
use crate::publish::{ProtectGuard, PublishReceipt};
use crate::restore::RestoreOutcome;
use crate::store::{RootStatus, Store};

/// What a migration did (or would do).
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct MigrationReport {
    /// v1 roots found.
    pub v1_roots: u64,
    /// Roots replaced by v2 roots.
    pub migrated: Vec<String>,
    /// Roots skipped, with the reason (e.g. they did not restore).
    pub skipped: Vec<String>,
    /// Objects the migrated roots referenced before (v1 chunks).
    pub objects_before: u64,
    /// Objects they reference after (v2 extents).
    pub objects_after: u64,
    /// Bytes of v2 objects written.
    pub bytes_written: u64,
    /// Whether nothing was changed.
    pub dry_run: bool,
}

impl Store {
    /// Migrates every v1 root (optionally of one namespace) to v2.
    pub async fn migrate(
        &self,
        namespace: Option<deltapack_format::Namespace>,
        dry_run: bool,
    ) -> Result<MigrationReport> {
        let mut report = MigrationReport {
            dry_run,
            ..Default::default()
        };
        for (ns, ctx) in self.list_roots(namespace.as_ref()).await? {
            let key = keys::root_key(&ns, &ctx);
            let RootStatus::Found(decoded) = self.peek_root(&ns, &ctx).await? else {
                continue;
            };
            let DecodedRoot::V1(m) = *decoded else {
                continue;
            };
            report.v1_roots += 1;
            // The root's bytes as read now: the replacement at the end
            // happens only if the root still holds exactly these.
            let raw = match self.object_store().get(&key).await {
                Ok(g) => g.bytes().await.map_err(|e| StoreError::io(&key, e))?,
                Err(object_store::Error::NotFound { .. }) => {
                    report
                        .skipped
                        .push(format!("{key}: removed during migration"));
                    continue;
                }
                Err(e) => return Err(StoreError::io(&key, e)),
            };
            match root::decode(&raw, self.inner.mac_key.as_ref()) {
                Ok(DecodedRoot::V1(again)) if again == m => {}
                _ => {
                    report
                        .skipped
                        .push(format!("{key}: changed during migration"));
                    continue;
                }
            }
            // A keyed root migrated without the key would lose its MAC:
            // keyed readers would then refuse it, and publication would
            // treat it as a permanent conflict.
            if self.inner.mac_key.is_none() && root::has_mac(&raw) {
                report.skipped.push(format!(
                    "{key}: a keyed root; migrate with the store's root key"
                ));
                continue;
            }
            if dry_run {
                report.migrated.push(key.to_string());
                report.objects_before += m.chunks.len() as u64;
                report.objects_after += m.payload_len.div_ceil(self.config().max_extent_bytes);
                continue;
            }
            // 1. Prove the root restores, bit for bit.
            match self.restore((ns, ctx), Default::default()).await? {
                RestoreOutcome::Hit(h) if h.digest == m.result_snapshot_digest => {}
                RestoreOutcome::Hit(h) => {
                    report.skipped.push(format!(
                        "{key}: restored {} but the root names {}",
                        h.digest, m.result_snapshot_digest
                    ));
                    continue;
                }
                RestoreOutcome::Miss(reason) => {
                    report
                        .skipped
                        .push(format!("{key}: does not restore ({reason})"));
                    continue;
                }
            }
            // 2. Its verified payload, written as v2 extents.
            let payload = match self.fetch_v1(&m).await? {
                Ok(p) => p,
                Err(reason) => {
                    report
                        .skipped
                        .push(format!("{key}: payload does not verify ({reason})"));
                    continue;
                }
            };
            let meta = RootMeta {
                namespace: m.namespace,
                context: m.context,
                chunk_tokens: m.logical_chunk_tokens,
                result_header: SnapshotHeader {
                    layout: m.layout.clone(),
                    boundary: m.boundary,
                    block_counts: m.block_counts.clone(),
                },
                result_snapshot_digest: m.result_snapshot_digest,
                result_snapshot_len: m.result_snapshot_len,
                base: m.base,
            };
            let mut receipt = PublishReceipt::empty(ns, ctx, m.result_snapshot_digest);
            let guard = ProtectGuard::new(self).await?;
            let payload_len = payload.len() as u64;
            let (entries, payload_digest) = self
                .write_v2(
                    Bytes::from(payload).into(),
                    &mut receipt,
                    &|_, _| {},
                    &guard,
                )
                .await?;
            let new_root = self.encode_v2(&meta, payload_len, payload_digest, entries, None)?;
            let v2 = match root::decode(&new_root, self.inner.mac_key.as_ref())? {
                DecodedRoot::V2(v2) => v2,
                _ => return Err(StoreError::Internal("migrated root is not v2".into())),
            };
            if v2.payload_digest != m.payload_digest
                || v2.result_snapshot_digest != m.result_snapshot_digest
            {
                return Err(StoreError::Internal(format!(
                    "{key}: migration changed a digest"
                )));
            }
            // 3. Replace atomically, only if the root still holds the bytes
            //    read at the start: an eviction, invalidation or
            //    republication in between wins, and is never undone.
            let root_len = new_root.len() as u64;
            match self
                .replace_root_if_unchanged(&key, &raw, new_root.clone())
                .await?
            {
                Replaced::Yes => {}
                Replaced::Changed => {
                    report
                        .skipped
                        .push(format!("{key}: changed during migration"));
                    continue;
                }
            }
            guard.finish().await;
            // 4. Ledger: the v1 chunks are condemned, the extents recorded.
            let ledger = self.ledger().await?;
            let entry = DecodedRoot::V2(v2.clone())
                .summary()
                .map(|s| RootEntry::from_summary(&s, root_len));
            // One transaction: the root is never missing from the ledger
            // (a removal plan made meanwhile would miss it).
            ledger
                .run(move |l| {
                    match entry {
                        Some(e) => {
                            l.replace_root(&e, now_ms())?;
                        }
                        None => {
                            l.remove_root(&ns, &ctx, now_ms())?;
                        }
                    }
                    Ok(())
                })
                .await?;
            report.objects_before += m.chunks.len() as u64;
            report.objects_after += v2.extents.len() as u64;
            report.bytes_written += receipt.bytes_written + root_len;
            report.migrated.push(key.to_string());
            tracing::info!(root = %key, digest = %Digest::blake3(&new_root), "migrated v1 → v2");
        }
        if !dry_run {
            self.collect_garbage().await?;
        }
        Ok(report)
    }
}

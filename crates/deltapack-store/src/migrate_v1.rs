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
use deltapack_format::{DecodedRoot, Digest, ManifestV1, ManifestV2, SnapshotHeader};
use object_store::ObjectStoreExt;
use serde::Serialize;

use crate::error::{Result, StoreError};
use crate::gc::ProtectGuard;
use crate::keys;
use crate::ledger::{now_ms, RootEntry};
use crate::local::Replaced;
use crate::publish::PublishReceipt;
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
        if !dry_run {
            self.require_owner("migrate").await?;
        }
        let mut report = MigrationReport {
            dry_run,
            ..Default::default()
        };
        for (ns, ctx) in self.list_roots(namespace.as_ref()).await? {
            let RootStatus::Found(decoded) = self.peek_root(&ns, &ctx).await? else {
                continue;
            };
            let DecodedRoot::V1(m) = *decoded else {
                continue;
            };
            report.v1_roots += 1;
            let key = keys::root_key(&ns, &ctx);
            if let Err(skip) = self.migrate_root(&key, &m, dry_run, &mut report).await? {
                report.skipped.push(format!("{key}: {skip}"));
            }
        }
        if !dry_run {
            self.collect_garbage().await?;
        }
        Ok(report)
    }

    /// Migrates the v1 root `m` stored under `key` (or counts it, on a dry
    /// run). The inner error is why it was skipped; nothing was changed
    /// then.
    async fn migrate_root(
        &self,
        key: &object_store::path::Path,
        m: &ManifestV1,
        dry_run: bool,
        report: &mut MigrationReport,
    ) -> Result<std::result::Result<(), String>> {
        let raw = match self.migration_source(key, m).await? {
            Ok(raw) => raw,
            Err(skip) => return Ok(Err(skip)),
        };
        if dry_run {
            report.migrated.push(key.to_string());
            report.objects_before += m.chunks.len() as u64;
            report.objects_after += m
                .payload_len
                .div_ceil(self.config().publication.max_extent_bytes);
            return Ok(Ok(()));
        }
        // 1. Prove the root restores, bit for bit, and 2. take its verified
        //    payload.
        let payload = match self.proven_payload(m).await? {
            Ok(p) => p,
            Err(skip) => return Ok(Err(skip)),
        };
        // 3. Write it as v2 and replace the root if unchanged.
        let Some((new_root, v2, bytes_written)) =
            self.write_migrated(key, &raw, m, payload).await?
        else {
            return Ok(Err("changed during migration".into()));
        };
        // 4. Ledger: the v1 chunks are condemned, the extents recorded.
        let root_len = new_root.len() as u64;
        let ledger = self.ledger().await?;
        let entry = DecodedRoot::V2(v2.clone())
            .summary()
            .map(|s| RootEntry::from_summary(&s, root_len));
        let (ns, ctx) = (m.namespace, m.context);
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
        report.bytes_written += bytes_written + root_len;
        report.migrated.push(key.to_string());
        tracing::info!(root = %key, digest = %Digest::blake3(&new_root), "migrated v1 → v2");
        Ok(Ok(()))
    }

    /// The root's bytes as read now, if they still decode to `m` and this
    /// handle may migrate them: the replacement at the end happens only if
    /// the root still holds exactly these.
    async fn migration_source(
        &self,
        key: &object_store::path::Path,
        m: &ManifestV1,
    ) -> Result<std::result::Result<Bytes, String>> {
        let raw = match self.object_store().get(key).await {
            Ok(g) => g.bytes().await.map_err(|e| StoreError::io(key, e))?,
            Err(object_store::Error::NotFound { .. }) => {
                return Ok(Err("removed during migration".into()))
            }
            Err(e) => return Err(StoreError::io(key, e)),
        };
        match root::decode(&raw, self.inner.mac_key.as_ref()) {
            Ok(DecodedRoot::V1(again)) if again == *m => {}
            _ => return Ok(Err("changed during migration".into())),
        }
        // A keyed root migrated without the key would lose its MAC: keyed
        // readers would then refuse it, and publication would treat it as a
        // permanent conflict.
        if self.inner.mac_key.is_none() && root::has_mac(&raw) {
            return Ok(Err("a keyed root; migrate with the store's root key".into()));
        }
        Ok(Ok(raw))
    }

    /// Restores `m`'s root (full verification, rebuilt snapshot digest
    /// included) and returns its verified payload.
    async fn proven_payload(&self, m: &ManifestV1) -> Result<std::result::Result<Vec<u8>, String>> {
        match self
            .restore((m.namespace, m.context), Default::default())
            .await?
        {
            RestoreOutcome::Hit(h) if h.digest == m.result_snapshot_digest => {}
            RestoreOutcome::Hit(h) => {
                return Ok(Err(format!(
                    "restored {} but the root names {}",
                    h.digest, m.result_snapshot_digest
                )))
            }
            RestoreOutcome::Miss(reason) => return Ok(Err(format!("does not restore ({reason})"))),
        }
        Ok(self
            .fetch_v1(m)
            .await?
            .map_err(|reason| format!("payload does not verify ({reason})")))
    }

    /// Writes `payload` as v2 extents under a publication lease, builds the
    /// v2 root from `m`'s metadata (checking both digests are unchanged)
    /// and replaces the root at `key` only if it still holds `raw`: an
    /// eviction, invalidation or republication in between wins and is never
    /// undone (`None` then). Returns the new root, its manifest and the
    /// bytes of objects written.
    async fn write_migrated(
        &self,
        key: &object_store::path::Path,
        raw: &Bytes,
        m: &ManifestV1,
        payload: Vec<u8>,
    ) -> Result<Option<(Bytes, ManifestV2, u64)>> {
        let meta = v2_meta(m);
        let mut receipt = PublishReceipt::empty(m.namespace, m.context, m.result_snapshot_digest);
        // The lease ends before the next root, on every path (a guard
        // merely dropped ends it later, on a blocking thread).
        let guard = ProtectGuard::new(self).await?;
        let written: Result<_> = async {
            let payload_len = payload.len() as u64;
            let (entries, payload_digest) = self
                .write_v2(
                    Bytes::from(payload).into(),
                    &mut receipt,
                    &|_, _| {},
                    &guard,
                )
                .await?;
            let new_root =
                self.encode_v2(&meta, None, payload_len, payload_digest, entries, None)?;
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
            let replaced = self
                .replace_root_if_unchanged(key, raw, new_root.clone())
                .await?;
            Ok((replaced, new_root, v2))
        }
        .await;
        guard.finish().await;
        let (replaced, new_root, v2) = written?;
        Ok(match replaced {
            Replaced::Changed => None,
            Replaced::Yes => Some((new_root, v2, receipt.bytes_written)),
        })
    }
}

/// What `Store::migrate_check` proved about one v1 root.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct MigrationProof {
    /// The root's key (`roots/<namespace>/<context>`).
    pub root: String,
    /// Namespace hex.
    pub namespace: String,
    /// Context hex.
    pub context: String,
    /// The snapshot digest the v1 root records.
    pub snapshot_digest: String,
    /// Whether the v2 root built in memory restores to that same digest.
    pub proven: bool,
    /// Extents of the v2 root built in memory (0 when not proven).
    pub extents: u64,
    /// Bytes of the v2 root envelope built in memory (0 when not proven).
    pub v2_root_bytes: u64,
    /// Why it would not migrate identically (when not proven).
    pub reason: Option<String>,
}

impl Store {
    /// Proves, writing nothing, that every v1 root (optionally of one
    /// namespace) would migrate to a v2 root with the same snapshot digest:
    /// each root is restored (full verification), its verified payload is
    /// cut into v2 extents in memory exactly as [`Store::migrate`] would
    /// write them, the v2 root is encoded (with this store's key) and
    /// decoded again, the payload is rebuilt from those in-memory extents
    /// (each checked against its name) and the result snapshot is
    /// reconstructed from it — on its own, or over the restored base for a
    /// delta — and hashed. A root is `proven` only if that digest is the
    /// one the v1 root records.
    ///
    /// A v1 root that does not decode, a keyed root without the key and a
    /// root that does not restore are reported as not proven. This method
    /// writes nothing itself; the restores it runs quarantine a damaged
    /// object as every restore does, unless the handle's object store
    /// refuses writes (`deltapack migrate --check` opens it so).
    pub async fn migrate_check(
        &self,
        namespace: Option<deltapack_format::Namespace>,
    ) -> Result<Vec<MigrationProof>> {
        let mut out = Vec::new();
        for (ns, ctx) in self.list_roots(namespace.as_ref()).await? {
            let key = keys::root_key(&ns, &ctx);
            let mut proof = MigrationProof {
                root: key.to_string(),
                namespace: ns.hex(),
                context: ctx.hex(),
                snapshot_digest: String::new(),
                proven: false,
                extents: 0,
                v2_root_bytes: 0,
                reason: None,
            };
            let raw = match self.object_store().get(&key).await {
                Ok(g) => g.bytes().await.map_err(|e| StoreError::io(&key, e))?,
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(StoreError::io(&key, e)),
            };
            // Undecodable roots are checked whatever their schema: the
            // migration would leave them behind.
            let m = match self.peek_root(&ns, &ctx).await? {
                RootStatus::Found(d) => match *d {
                    DecodedRoot::V1(m) => m,
                    _ => continue,
                },
                RootStatus::Absent => continue,
                RootStatus::Unusable(r) => {
                    proof.reason = Some(format!("the root does not decode ({r})"));
                    out.push(proof);
                    continue;
                }
            };
            proof.snapshot_digest = m.result_snapshot_digest.to_string();
            match self.prove_migration(&m, &raw).await? {
                Ok((extents, bytes)) => {
                    proof.proven = true;
                    proof.extents = extents;
                    proof.v2_root_bytes = bytes;
                }
                Err(reason) => proof.reason = Some(reason),
            }
            out.push(proof);
        }
        Ok(out)
    }

    /// The proof of one v1 root (see [`Store::migrate_check`]): `Ok` with
    /// the v2 root's extent count and size, or why it would not migrate.
    async fn prove_migration(
        &self,
        m: &deltapack_format::ManifestV1,
        raw: &[u8],
    ) -> Result<std::result::Result<(u64, u64), String>> {
        if self.inner.mac_key.is_none() && root::has_mac(raw) {
            return Ok(Err(
                "a keyed root; check with the store's root key".to_string()
            ));
        }
        let want = m.result_snapshot_digest;
        let payload = match self.proven_payload(m).await? {
            Ok(p) => p,
            Err(skip) => return Ok(Err(skip)),
        };
        let meta = v2_meta(m);
        // The extents `migrate` would write, built in memory.
        let publication = &self.config().publication;
        let (max_extent, level) = (publication.max_extent_bytes, publication.compression);
        let payload = std::sync::Arc::new(payload);
        let p = payload.clone();
        let built = tokio::task::spawn_blocking(move || root::v2_extents(&p, max_extent, level))
            .await
            .map_err(|e| StoreError::task("v2 extents", e))?;
        let built = match built {
            Ok(b) => b,
            Err(e) => return Ok(Err(format!("cannot cut the payload into v2 extents: {e}"))),
        };
        let new_root = match self.encode_v2(
            &meta,
            None,
            payload.len() as u64,
            built.payload_digest,
            built.entries.clone(),
            None,
        ) {
            Ok(r) => r,
            Err(e) => return Ok(Err(format!("cannot encode the v2 root: {e}"))),
        };
        let v2 = match root::decode(&new_root, self.inner.mac_key.as_ref()) {
            Ok(DecodedRoot::V2(v2)) => v2,
            Ok(_) => return Ok(Err("the v2 root built decodes as another schema".into())),
            Err(e) => return Ok(Err(format!("the v2 root built does not decode: {e}"))),
        };
        if v2.payload_digest != m.payload_digest
            || v2.result_snapshot_digest != want
            || v2.base != m.base
        {
            return Ok(Err(format!(
                "the v2 root would change a digest: payload {} (v1 {}), result {} (v1 {want})",
                v2.payload_digest, m.payload_digest, v2.result_snapshot_digest
            )));
        }
        // Rebuild the payload from the in-memory extents alone, each one
        // checked against its name, and the result snapshot from it.
        let base = match m.base {
            None => None,
            Some(b) => match self
                .restore((b.namespace, b.context), Default::default())
                .await?
            {
                RestoreOutcome::Hit(h) if h.digest == b.snapshot_digest => Some(h.snapshot),
                RestoreOutcome::Hit(h) => {
                    return Ok(Err(format!(
                        "the base restores to {}, not {}",
                        h.digest, b.snapshot_digest
                    )))
                }
                RestoreOutcome::Miss(r) => {
                    return Ok(Err(format!("the base does not restore ({r})")))
                }
            },
        };
        let extents = v2.extents.len() as u64;
        let root_len = new_root.len() as u64;
        let rebuilt =
            tokio::task::spawn_blocking(move || rebuild_from_extents(&v2, &built, &payload, base))
                .await
                .map_err(|e| StoreError::task("migration proof", e))?;
        Ok(match rebuilt {
            Ok(d) if d == want => Ok((extents, root_len)),
            Ok(d) => Err(format!("the v2 root rebuilds {d}, not {want}")),
            Err(reason) => Err(reason),
        })
    }
}

/// The root metadata of the v2 root that replaces the v1 root `m`: the
/// same namespace, context, result and base, so both digests carry over.
fn v2_meta(m: &ManifestV1) -> RootMeta {
    RootMeta {
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
    }
}

/// Rebuilds the payload of the v2 root `v2` from the extents `built` in
/// memory alone (`payload` supplies the raw ones), each checked against its
/// name, then the result snapshot from it (on `base` for a delta), and
/// returns the result's digest.
fn rebuild_from_extents(
    v2: &ManifestV2,
    built: &root::V2Extents,
    payload: &[u8],
    base: Option<std::sync::Arc<deltapack_format::Snapshot>>,
) -> std::result::Result<Digest, String> {
    let plan = deltapack_format::ExtentPlan::new(v2.payload_len, v2.max_extent_bytes)
        .map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(payload.len());
    for (i, (e, stored)) in v2.extents.iter().zip(&built.compressed).enumerate() {
        let raw = match stored {
            Some(c) => {
                if Some(Digest::blake3(c)) != e.stored_digest {
                    return Err(format!("extent {i}: stored digest mismatch"));
                }
                deltapack_format::extent::decompress(c, e.raw_len)
                    .map_err(|x| format!("extent {i}: {x}"))?
            }
            None => payload
                .get(e.offset as usize..(e.offset + e.raw_len) as usize)
                .ok_or_else(|| format!("extent {i} lies outside the payload"))?
                .to_vec(),
        };
        let name = plan
            .name(i as u64, &raw, false)
            .map_err(|x| format!("extent {i}: {x}"))?;
        if name != e.raw_digest {
            return Err(format!("extent {i} name {name} != {}", e.raw_digest));
        }
        out.extend_from_slice(&raw);
    }
    let found = deltapack_format::snapshot::digest_of_encoding(&out);
    if found != v2.payload_digest {
        return Err(format!(
            "rebuilt payload digest {found} != {}",
            v2.payload_digest
        ));
    }
    let result = match &base {
        None => deltapack_format::Snapshot::from_encoded(out),
        Some(b) => deltapack_format::PageDelta::apply(b, &out),
    }
    .map_err(|x| format!("the result does not rebuild from the v2 payload: {x}"))?;
    Ok(result.digest())
}

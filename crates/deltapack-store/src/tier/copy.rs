//! Copying a root, with the chain links below it the target lacks, from
//! one store to another: the origin into the tier (the fill) and the tier
//! into the origin (the upload of a publication acknowledged in the tier).
//!
//! Owns the copy's order — every object checked against its root's record
//! and durable in the target before the root, base links before the deltas
//! on them — so the target, like any store, never shows a root before its
//! objects. Must never write to the source, or copy a byte it has not
//! checked.

use bytes::Bytes;
use deltapack_format::root::DecodedRoot;
use deltapack_format::Digest;
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;

use super::staging::{Part, Staging};
use crate::error::{Result, StoreError};
use crate::gc::ProtectGuard;
use crate::keys::RootKey;
use crate::publish::{PublishOutcome, PublishReceipt};
use crate::store::{RootStatus, Store};
use crate::verify::{check_object, Expected};

/// One chain link to copy: its key, the source's root bytes, decoded.
struct Link {
    key: RootKey,
    bytes: Bytes,
    root: DecodedRoot,
}

/// A copy from `from` to `to` and its bounds.
pub(crate) struct Copy<'a> {
    pub(crate) from: &'a Store,
    pub(crate) to: &'a Store,
    /// Permits for objects held in memory (shared by every copy of a tier).
    pub(crate) objects: &'a tokio::sync::Semaphore,
    /// Objects of one link copied at once.
    pub(crate) in_flight: usize,
    /// Permits for multipart parts, for a remote target (large extents go
    /// up as concurrent parts, as a publication's do).
    pub(crate) parts: Option<&'a tokio::sync::Semaphore>,
    /// What the copy is, for its errors.
    pub(crate) what: &'static str,
    /// For an upload: the roots journaled in the source. A base the target
    /// lacks is copied only if it is one of them (an acknowledged
    /// publication on its way); any other base the target lacks, or holds
    /// with another snapshot, makes the delta on it go up flattened
    /// ([`Copy::flatten`]). `None` (a fill): a base the target lacks is
    /// copied, and one it holds with another snapshot fails the copy.
    pub(crate) journaled: Option<&'a std::collections::HashSet<RootKey>>,
    /// For a fill: the parts of objects the restore before it read
    /// unchecked (`staging.rs`); such an object is completed from the
    /// source and checked whole instead of downloaded whole.
    pub(crate) staged: Option<&'a Staging>,
}

/// How a chain walk ended below its lowest link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bottom {
    /// A flat link, or the target holds the lowest link's base with the
    /// snapshot it was built on: every link goes as it is.
    Proven,
    /// The target cannot give the lowest link its base (absent and not
    /// journaled, or another snapshot): that link goes up flat.
    Flatten,
}

/// What a copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Copied {
    /// Bytes written to the target (objects and roots it created) that
    /// were read from the source for it.
    pub(crate) bytes: u64,
    /// Bytes written to the target that came from parts a restore had
    /// kept ([`Copy::staged`]), not from the source.
    pub(crate) reused: u64,
    /// Whether the target already held another snapshot at some link
    /// (nothing of that link was made visible; the target's root wins).
    pub(crate) conflict: bool,
    /// Whether that link was the requested root itself.
    pub(crate) conflict_at_top: bool,
}

impl Copy<'_> {
    /// Copies `key` and the links below it the target lacks; a link whose
    /// base the target cannot give it goes up flat (first). The others go
    /// together under one publication in the target (`guard`, if given:
    /// the one protecting objects a restore already copied there, see
    /// `tap.rs`): every object of every link at once (up to
    /// [`Copy::in_flight`]), then the roots, bottom first.
    pub(crate) async fn root(&self, key: RootKey, guard: Option<ProtectGuard>) -> Result<Copied> {
        // Only the target's own ledger may publish into it (as for any
        // publication).
        self.to.require_owner("copy").await?;
        let (mut links, bottom) = self.links(key).await?;
        let mut out = Copied::default();
        if bottom == Bottom::Flatten {
            if let Some(lowest) = links.pop() {
                let (bytes, conflict) = self.flatten(&lowest).await?;
                out.bytes += bytes;
                if conflict {
                    out.conflict = true;
                    out.conflict_at_top = links.is_empty();
                    return Ok(out);
                }
            }
        }
        if links.is_empty() {
            return Ok(out);
        }
        let guard = match guard {
            Some(g) => g,
            None => ProtectGuard::new(self.to).await?,
        };
        let together = self.links_together(links, &guard).await;
        guard.finish().await;
        let c = together?;
        out.bytes += c.bytes;
        out.reused += c.reused;
        out.conflict = c.conflict;
        out.conflict_at_top = c.conflict_at_top;
        Ok(out)
    }

    /// The chain from `key` down to the first link below it the target
    /// already holds with the snapshot the link above was built on (or the
    /// flat bottom), top first, read from the source without side effects
    /// there; and how the walk ended.
    async fn links(&self, key: RootKey) -> Result<(Vec<Link>, Bottom)> {
        let what = self.what;
        let mut links: Vec<Link> = Vec::new();
        let mut at = Some(key);
        let max_depth = self.from.config().restore.max_base_depth;
        while let Some(key) = at.take() {
            let (ns, ctx) = (key.namespace, key.context);
            // The requested root is copied even if the target has it: its
            // objects may be gone (quarantined there). Below it, the base
            // the link above names decides.
            if let Some(above) = links.last() {
                let want = above
                    .root
                    .summary()
                    .and_then(|s| s.base)
                    .map(|b| b.snapshot_digest);
                match (self.to.peek_root(&ns, &ctx).await?, self.journaled) {
                    (RootStatus::Found(r), _) if r.snapshot_digest() == want => {
                        return Ok((links, Bottom::Proven));
                    }
                    (RootStatus::Found(_), Some(_)) => return Ok((links, Bottom::Flatten)),
                    (RootStatus::Found(_), None) => {
                        return Err(StoreError::Invalid(format!(
                            "{what}: the target holds another snapshot at the base {ns}/{ctx}"
                        )));
                    }
                    (_, Some(j)) if !j.contains(&key) => return Ok((links, Bottom::Flatten)),
                    _ => {}
                }
            }
            if links.len() > max_depth {
                return Err(StoreError::Invalid(format!(
                    "{what}: the chain below {ns}/{ctx} is deeper than {max_depth}"
                )));
            }
            let (status, bytes) = self.from.read_root_bytes(&ns, &ctx, false).await?;
            let (RootStatus::Found(root), Some(bytes)) = (status, bytes) else {
                return Err(StoreError::Invalid(format!(
                    "{what}: the source no longer holds a usable root at {ns}/{ctx}"
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
        Ok((links, Bottom::Proven))
    }

    /// Copies one link flat: its snapshot restored (and verified) from the
    /// source, published into the target as a flat root under the identity
    /// its journal entry records. The bytes written, and whether the target
    /// held another snapshot there.
    async fn flatten(&self, link: &Link) -> Result<(u64, bool)> {
        let what = self.what;
        let key = link.key;
        let identity = super::journal::journaled_identity(self.from, key).await?;
        let snapshot = match self.from.restore(key, Default::default()).await? {
            crate::RestoreOutcome::Hit(hit) => hit.snapshot,
            crate::RestoreOutcome::Miss(why) => {
                return Err(StoreError::Invalid(format!(
                    "{what}: cannot compose {}/{} to upload it flat: {why}",
                    key.namespace, key.context
                )));
            }
        };
        tracing::info!(root = %crate::keys::root_key(&key.namespace, &key.context), "the target cannot give this turn its base: copied flat");
        let req = crate::PublishRequest {
            identity,
            context: key.context,
            snapshot,
            base: None,
            format: crate::RootFormat::V2,
        };
        let r = self.to.publish_uncounted(req, &|_, _| {}).await?;
        Ok((r.bytes_written, r.outcome == PublishOutcome::Conflict))
    }

    /// Copies `links` (top first; the lowest one's base, if any, held by
    /// the target with the snapshot it was built on): every object they
    /// name (checked against its root) at once, then the roots, bottom
    /// first. The bytes written, and whether the target held another
    /// snapshot at some link (the links above it are not copied). The
    /// objects are protected in the target's ledger by `guard` from before
    /// they are written until the roots are recorded.
    async fn links_together(&self, links: Vec<Link>, guard: &ProtectGuard) -> Result<Copied> {
        let (tier, what) = (self.to, self.what);
        let links: Vec<Link> = links.into_iter().rev().collect();
        // Every object once (links of one chain may share extents).
        let mut seen = std::collections::HashSet::new();
        let mut wanted = Vec::new();
        let mut need = 0u64;
        for link in &links {
            need += link.bytes.len() as u64;
            let objects = Expected::of_root(&link.root)
                .map_err(|e| StoreError::Invalid(format!("{what}: extent plan: {e}")))?;
            for want in objects {
                if seen.insert(want.object().path()) {
                    need += want.stored_len();
                    wanted.push(want);
                }
            }
        }
        tier.make_room(need, guard).await?;
        let protector = guard.protector();
        // Each link's root, and the lowest link's base, stay in the target
        // until the roots above them are there: protected in the target's
        // ledger (as a publication protects its base), the base then
        // checked present. Without this, another process's eviction of the
        // base (and of the dependents it knew) could run between the walk
        // and the roots, leaving the target a delta over a missing base.
        let mut roots: Vec<String> = links
            .iter()
            .map(|l| crate::keys::root_key(&l.key.namespace, &l.key.context).to_string())
            .collect();
        let base = links
            .first()
            .and_then(|l| l.root.summary())
            .and_then(|s| s.base);
        if let Some(b) = base {
            roots.push(crate::keys::root_key(&b.namespace, &b.context).to_string());
        }
        protector.protect(roots).await?;
        if let Some(b) = base {
            let (bns, bctx) = (b.namespace, b.context);
            let held = match tier.peek_root(&bns, &bctx).await? {
                RootStatus::Found(r) => r.snapshot_digest(),
                _ => None,
            };
            if held != Some(b.snapshot_digest) {
                return Err(StoreError::Invalid(format!(
                    "{what}: the base {bns}/{bctx} left the target (or was replaced) during the copy"
                )));
            }
        }
        let written = futures::stream::iter(wanted)
            .map(|want| {
                let protector = &protector;
                async move {
                    let key = want.object().path();
                    protector.protect(vec![key.to_string()]).await?;
                    if let Ok(meta) = tier.object_store().head(&key).await {
                        if meta.size == want.stored_len() {
                            return Ok((0, 0));
                        }
                    }
                    let _permit = self
                        .objects
                        .acquire()
                        .await
                        .map_err(|e| StoreError::Internal(format!("fill permits: {e}")))?;
                    let (stored, kept) = self.fetch(want).await?;
                    let len = stored.len() as u64;
                    tier.write_object(&key, stored.into(), self.parts).await?;
                    Ok::<(u64, u64), StoreError>((len - kept, kept))
                }
            })
            .buffer_unordered(self.in_flight.max(1))
            .try_fold(
                (0u64, 0u64),
                |a, b| async move { Ok((a.0 + b.0, a.1 + b.1)) },
            )
            .await?;
        let mut out = Copied {
            bytes: written.0,
            reused: written.1,
            ..Copied::default()
        };
        let n = links.len();
        for (i, link) in links.into_iter().enumerate() {
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
            match receipt.outcome {
                PublishOutcome::Created => out.bytes += link.bytes.len() as u64,
                PublishOutcome::Conflict => {
                    out.conflict = true;
                    out.conflict_at_top = i + 1 == n;
                    break;
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

impl Copy<'_> {
    /// One object from the source, checked against its root's record: the
    /// stored bytes, and how many of them came from parts a restore kept.
    /// Completed from those parts where there are any (only the ranges
    /// the restore did not read are downloaded; the whole is checked), else,
    /// or if the completed object fails its check, downloaded whole.
    async fn fetch(&self, want: Expected) -> Result<(Bytes, u64)> {
        if let Some(staged) = self.staged {
            let key = want.object().path();
            // A local read of at most one extent.
            let part = tokio::task::block_in_place(|| staged.take(&key, want.stored_len()));
            if let Some(part) = part {
                match completed(self.from, &want, part).await {
                    Ok(done) => return Ok(done),
                    Err(e) => {
                        tracing::info!(error = %e, %key, "a restore's kept parts did not complete the object: downloading it whole")
                    }
                }
            }
        }
        Ok((verified(self.from, want, self.what).await?, 0))
    }
}

/// The object `want` from the parts a restore kept and the ranges it lacks
/// downloaded from `from`, checked whole against its root's record; the
/// stored bytes and how many of them were kept.
async fn completed(from: &Store, want: &Expected, part: Part) -> Result<(Bytes, u64)> {
    let key = want.object().path();
    let Part {
        mut buf,
        missing,
        kept,
    } = part;
    let got = futures::future::try_join_all(
        missing
            .iter()
            .map(|r| from.object_store().get_range(&key, r.clone())),
    )
    .await
    .map_err(|e| StoreError::Invalid(format!("{key}: ranged read: {e}")))?;
    for (r, bytes) in missing.iter().zip(got) {
        let dst = usize::try_from(r.start)
            .ok()
            .zip(usize::try_from(r.end).ok())
            .and_then(|(a, b)| buf.get_mut(a..b))
            .filter(|d| d.len() == bytes.len())
            .ok_or_else(|| {
                StoreError::Invalid(format!(
                    "{key}: the read of bytes {r:?} returned {} bytes",
                    bytes.len()
                ))
            })?;
        dst.copy_from_slice(&bytes);
    }
    let stored = Bytes::from(buf);
    let (check, want) = (stored.clone(), want.clone());
    tokio::task::spawn_blocking(move || check_object(&want, check).map(|_| ()))
        .await
        .map_err(|e| StoreError::task("copy check", e))?
        .map_err(|c| StoreError::Invalid(format!("{key}: kept parts and download: {c}")))?;
    Ok((stored, kept))
}

/// Reads one object from the origin and checks it against its root's
/// record; the stored bytes, as the tier must hold them.
async fn verified(from: &Store, want: Expected, what: &str) -> Result<Bytes> {
    let key = want.object().path();
    let stored = match from.fetch_exact(&key, want.stored_len()).await {
        Ok(b) => b,
        Err(fault) => {
            let fault = fault.into_error()?;
            return Err(StoreError::Invalid(format!(
                "{what}: source object {key}: {}",
                fault.check.map_or(crate::ObjectCheck::Missing, |c| *c)
            )));
        }
    };
    let check = stored.clone();
    tokio::task::spawn_blocking(move || check_object(&want, check).map(|_| ()))
        .await
        .map_err(|e| StoreError::task("copy check", e))?
        .map_err(|c| StoreError::Invalid(format!("{what}: source object {key}: {c}")))?;
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use deltapack_format::synth::{self, Preset};
    use deltapack_format::{CacheIdentity, ContextHasher};

    use super::*;
    use crate::{PublishRequest, RootFormat, StoreConfig};

    /// A store in `dir` holding one flat root of several extents; what the
    /// root says its objects are.
    async fn one_root(dir: &std::path::Path) -> (Store, Vec<Expected>) {
        let url = format!("file://{}", dir.display());
        let config = StoreConfig::default().with_max_extent_bytes(32 * 1024);
        let store = Store::open(&url, config).expect("store");
        let id = CacheIdentity::example();
        let snapshot = Arc::new(synth::snapshot(Preset::Tiny, 7, 65536).expect("synth"));
        let context = ContextHasher::new(id.namespace(), id.chunk_tokens)
            .expect("hasher")
            .digest(&synth::tokens(7, 65536));
        let req = PublishRequest {
            identity: id.clone(),
            context,
            snapshot,
            base: None,
            format: RootFormat::V2,
        };
        store.publish(req).await.expect("publish");
        let RootStatus::Found(root) = store
            .peek_root(&id.namespace(), &context)
            .await
            .expect("root")
        else {
            panic!("no root");
        };
        let objects = Expected::of_root(&root).expect("objects");
        assert!(objects.len() > 2, "{} objects", objects.len());
        (store, objects)
    }

    /// A kept part is used only if the whole object it completes checks
    /// against its name: a wrong one costs a whole download, never a wrong
    /// object.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kept_parts_complete_an_object_only_if_the_whole_checks() {
        let dir = tempfile::tempdir().expect("dir");
        let (store, objects) = one_root(dir.path()).await;
        let staging = Staging::new(dir.path(), u64::MAX).expect("staging");
        let sem = tokio::sync::Semaphore::new(1);
        let copy = Copy {
            from: &store,
            to: &store,
            objects: &sem,
            in_flight: 1,
            parts: None,
            what: "test",
            journaled: None,
            staged: Some(&staging),
        };
        for (i, want) in objects.into_iter().enumerate() {
            let key = want.object().path();
            let len = want.stored_len();
            let whole = store.fetch_exact(&key, len).await.expect("object");
            // The middle half kept; every second object with a byte wrong.
            let (a, b) = (len / 4, 3 * len / 4);
            let mut part = whole[a as usize..b as usize].to_vec();
            if i % 2 == 1 {
                part[7] ^= 1;
            }
            staging.keep(&key, len, a, &part);
            let (got, kept) = copy.fetch(want).await.expect("fetched");
            assert!(got == whole, "object {i}: the object's own bytes");
            assert_eq!(kept, if i % 2 == 1 { 0 } else { b - a }, "object {i}");
        }
    }
}

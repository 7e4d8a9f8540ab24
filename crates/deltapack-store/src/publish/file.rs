//! Publishing a snapshot straight from a file ([`SnapshotFile`], read with
//! `pread` into the staging buffers, never mapped: see `input_file.rs`).
//!
//! Every byte is read once, with `pread`, into a staging buffer
//! (`staging.rs`); that copy is named, fed to the layered digest
//! ([`StreamFeed`]) and written, so the root's snapshot digest and its
//! objects come from the very same bytes. A file that is shorter than when
//! it was opened is a clean error (`InputChanged`), never a signal; one
//! whose size, change time or identity differ after the last read fails
//! the publication the same way, before its root. (The change time has
//! the file system's granularity, a few milliseconds at worst: a rewrite
//! within the same tick as the open would go unseen, and would give a
//! root of the bytes read, consistent with its objects.)
//!
//! Reading the file costs what the mapping's first touch cost (a kernel
//! copy from the page cache), and no page of fresh memory is faulted in
//! per publication: the staging buffers are reused.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use deltapack_format::layer_digest::StreamFeed;
use deltapack_format::root::RootMeta;
use deltapack_format::{Algorithm, CacheIdentity, ContextDigest, Digest};

use super::input_file::SnapshotFile;
use super::payload::{finish_feed, Payload};
use super::plan;
use super::receipt::{PublishOutcome, PublishReceipt, Turn};
use super::request::RootFormat;
use crate::error::{Result, StoreError};
use crate::gc::ProtectGuard;
use crate::stats::Stats;
use crate::store::{RootStatus, Store};

/// Publishes the snapshot in `file` flat under `context` as a v2.2 root
/// (see the module docs). Not through a tier: a handle with one refuses
/// (read the file into memory and use [`Store::publish`]).
pub(super) async fn publish_file(
    store: &Store,
    identity: &CacheIdentity,
    context: ContextDigest,
    file: Arc<SnapshotFile>,
    progress: &(dyn Fn(u64, u64) + Send + Sync),
) -> Result<PublishReceipt> {
    let start = Instant::now();
    if store.tier().is_some() {
        return Err(StoreError::Invalid(
            "publishing from a file goes to the store alone; through a tier, publish the \
             snapshot from memory"
                .into(),
        ));
    }
    plan::validate(identity, file.boundary())?;
    if !plan::layered(RootFormat::V2, file.header()) {
        return Err(StoreError::Invalid(format!(
            "{}: a layout of more than {} layers is published from memory",
            file.path.display(),
            deltapack_format::layer_digest::MAX_LAYER_STREAMS
        )));
    }
    let ns = identity.namespace();
    store.require_owner("publish").await?;

    // An existing root decides the outcome without writing anything. It
    // may record either digest definition (a v1 or v2.1 root of the same
    // bytes records `blake3:`): the file is compared by the root's own.
    let existing = match store.read_root(&ns, &context).await? {
        RootStatus::Absent => None,
        RootStatus::Found(root) => Some(root.snapshot_digest()),
        RootStatus::Unusable(_) => Some(None),
    };
    if let Some(existing) = existing {
        let f = file.clone();
        let (digests, state, plain) = tokio::task::spawn_blocking(move || f.digests())
            .await
            .map_err(|e| StoreError::task("file digest", e))??;
        Stats::add(&store.stats_ref().snapshot_bytes_hashed, file.len());
        let layered = existing.is_none_or(|d| d.algorithm() == Algorithm::Blake3Layers);
        let mine = if layered { digests.snapshot } else { plain };
        let mut receipt = PublishReceipt::empty(ns, context, mine);
        if let Some(done) = store
            .existing_outcome(&ns, &context, &mut receipt, None)
            .await?
        {
            if done == PublishOutcome::AlreadyPresent {
                store.ledger_touch(&ns, &context).await;
                // A handle for the next turn only over a root that
                // records the layered digest (the turn extends it).
                if layered {
                    receipt.turn = Some(Turn::new(store, ns, context, Arc::new(state)));
                }
            }
            receipt.outcome = done;
            receipt.total_time = start.elapsed();
            return Ok(receipt);
        }
    }

    let mut slot = None;
    let out = write_and_commit(store, identity, context, &file, progress, &mut slot, start).await;
    if let Some(g) = slot.take() {
        g.finish().await;
    }
    out
}

/// The writing half of [`publish_file`]: capacity, the extents (staged from
/// the file, named and fed to the digest), the checks, the root.
async fn write_and_commit(
    store: &Store,
    identity: &CacheIdentity,
    context: ContextDigest,
    file: &Arc<SnapshotFile>,
    progress: &(dyn Fn(u64, u64) + Send + Sync),
    slot: &mut Option<ProtectGuard>,
    start: Instant,
) -> Result<PublishReceipt> {
    let ns = identity.namespace();
    let guard = &*slot.insert(ProtectGuard::new(store).await?);
    let room = plan::room_needed(
        RootFormat::V2,
        file.len(),
        store.config().publication.max_extent_bytes,
        file.boundary() / u64::from(identity.chunk_tokens),
    );
    store.make_room(room, guard).await?;

    // Until the digest is known the receipt carries a placeholder.
    let mut receipt = PublishReceipt::empty(ns, context, Digest::blake3(&[]));
    let t_write = Instant::now();
    let feed = Arc::new(Mutex::new(StreamFeed::new(
        file.header(),
        file.payload_offset,
    )?));
    let payload = Payload::from_file(file.clone(), feed.clone());
    receipt.payload_len = payload.len();
    let (entries, payload_digest) = store
        .write_v2(payload, &mut receipt, progress, guard)
        .await?;
    Stats::add(&store.stats_ref().snapshot_bytes_hashed, file.len());

    // The digest of exactly the bytes written; the file as it was opened.
    file.check_unchanged()?;
    let (digests, state) = finish_feed(feed, &file.path.display().to_string())?;
    receipt.snapshot_digest = digests.snapshot;
    receipt.schema = plan::v2_schema(true, false).into();
    let meta = RootMeta {
        namespace: ns,
        context,
        chunk_tokens: identity.chunk_tokens,
        result_header: file.header().clone(),
        result_snapshot_digest: digests.snapshot,
        result_snapshot_len: file.len(),
        base: None,
    };
    let root_bytes = store.encode_v2(
        &meta,
        Some((&digests.streams, &state)),
        receipt.payload_len,
        payload_digest,
        entries,
        None,
    )?;
    store
        .create_root(&ns, &context, root_bytes, &mut receipt, None)
        .await?;
    if let Some(g) = slot.take() {
        g.finish().await;
    }
    receipt.write_time = t_write.elapsed();
    receipt.total_time = start.elapsed();
    store.settle_turn(state, &mut receipt);
    Ok(receipt)
}

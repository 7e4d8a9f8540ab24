//! Writing a publication's objects durably: extents (v2) or chunks (v1),
//! in batches of at most [`PUBLISH_BATCH`], each created if absent, large
//! ones as multipart uploads of zero-copy parts.
//!
//! Every key is protected (`gc.rs`) before it is relied on; nothing here
//! writes a root.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use deltapack_format::layer_digest::StreamFeed;
use deltapack_format::root::{self};
use deltapack_format::{Digest, ExtentPlan};
use futures::StreamExt;
use object_store::ObjectStoreExt;
use object_store::PutPayload;

use super::input_file::SnapshotFile;
use super::payload::{slice_parts, split_payload, Payload};
use super::receipt::PublishReceipt;
use super::request::PublishRequest;
use crate::backend::{put_create, BackendKind, PutOutcome};
use crate::error::{Result, StoreError};
use crate::gc::{AbortOnDrop, ProtectGuard};
use crate::keys;
use crate::stats::Stats;
use crate::store::Store;

/// Most object payloads written (and held) at once by one publication.
pub const PUBLISH_BATCH: usize = 2;

/// One read of an existing object against the bytes to write.
enum Found {
    /// No object.
    Absent,
    /// Exactly the bytes to write.
    Same,
    /// Other bytes; their BLAKE3.
    Differs(blake3::Hash),
}

/// An existing object that could not be verified or replaced.
fn unverified(key: &object_store::path::Path, why: &str) -> StoreError {
    StoreError::io(
        key,
        object_store::Error::Generic {
            store: "deltapack",
            source: why.to_string().into(),
        },
    )
}

/// What [`Store::check_existing`] found under an object's name.
enum Existing {
    /// Nothing (or nothing any more: a wrong object was quarantined).
    Absent,
    /// An object holding exactly the bytes to write: reused.
    Same,
}

/// One object to write: its key and its stored bytes (possibly in parts).
pub(super) struct PendingObject {
    pub(super) key: object_store::path::Path,
    pub(super) payload: PutPayload,
    pub(super) len: u64,
}

/// Where one extent's bytes come from: parts of memory, a file range, or
/// a buffer this publication staged already.
pub(super) enum ExtentSource {
    /// A slice of a staged buffer (`staging.rs`): used as it is.
    Staged(Bytes),
    /// Slices of the caller's memory, in order.
    Parts(Vec<Bytes>),
    /// `len` bytes of a snapshot file at `offset`.
    File {
        /// The file.
        file: Arc<SnapshotFile>,
        /// Where the extent starts in it.
        offset: u64,
        /// Its length.
        len: usize,
    },
}

/// Stages one extent (`staging.rs`): its bytes copied once, from memory or
/// with `pread` from a file, into a buffer only this publication holds.
fn stage_extent(index: u64, src: ExtentSource) -> Result<Bytes> {
    match src {
        ExtentSource::Staged(b) => Ok(b),
        ExtentSource::Parts(raw) => super::staging::stage(&raw)
            .map_err(|e| StoreError::Internal(format!("staging extent {index}: {e}"))),
        ExtentSource::File { file, offset, len } => {
            let mut err = None;
            let staged = super::staging::stage_with(len, |buf| {
                if let Err(e) = file.read_at(offset, buf) {
                    err = Some(e);
                }
            })
            .map_err(|e| StoreError::Internal(format!("staging extent {index}: {e}")))?;
            match err {
                Some(e) => Err(e),
                None => Ok(staged),
            }
        }
    }
}

/// Stages, names (and optionally compresses) one extent: both the name and
/// the object's bytes come from the staged copy, so the name is the hash
/// of what is written whatever the caller's memory (or file) does
/// meanwhile. With `feed` (a flat payload, extents in order), the staged
/// bytes also feed the layered digest, beside the naming.
pub(super) fn prepare_extent(
    plan: &ExtentPlan,
    index: u64,
    src: ExtentSource,
    level: Option<i32>,
    feed: Option<&Mutex<StreamFeed>>,
) -> Result<(deltapack_format::ExtentEntry, PendingObject)> {
    use deltapack_format::{ExtentCodec, ExtentEntry};
    let staged = stage_extent(index, src)?;
    let name = || {
        let mut h = plan.hasher(index);
        h.update(&staged);
        h.finish()
    };
    let raw_digest = match feed {
        None => name()?,
        Some(feed) => std::thread::scope(|s| {
            let fed = s.spawn(|| match feed.lock() {
                Ok(mut f) => {
                    f.feed(&staged);
                    Ok(())
                }
                Err(_) => Err(StoreError::Internal(
                    "the digest feed's lock was poisoned".into(),
                )),
            });
            let named = name();
            fed.join()
                .map_err(|_| StoreError::Internal("the digest feed panicked".into()))??;
            named.map_err(StoreError::from)
        })?,
    };
    let r = plan.range(index);
    let raw_len = r.end - r.start;
    if let Some(level) = level {
        let c = deltapack_format::extent::compress(&staged, level)?;
        if (c.len() as u64) < raw_len - raw_len / 16 {
            let stored_digest = Digest::blake3(&c);
            let entry = ExtentEntry {
                offset: r.start,
                raw_len,
                raw_digest,
                codec: ExtentCodec::Zstd,
                stored_len: c.len() as u64,
                stored_digest: Some(stored_digest),
            };
            return Ok((
                entry,
                PendingObject {
                    key: keys::object_key(&stored_digest),
                    len: c.len() as u64,
                    payload: PutPayload::from(c),
                },
            ));
        }
    }
    let entry = ExtentEntry {
        offset: r.start,
        raw_len,
        raw_digest,
        codec: ExtentCodec::Raw,
        stored_len: raw_len,
        stored_digest: None,
    };
    Ok((
        entry,
        PendingObject {
            key: keys::object_key(&raw_digest),
            len: raw_len,
            payload: PutPayload::from_bytes(staged),
        },
    ))
}

impl Store {
    /// Extents of `m` bytes written at once: [`PUBLISH_BATCH`] on local disk
    /// and in memory; on a remote store as many as their multipart parts
    /// fill [`StoreConfig::parts_in_flight`](crate::StoreConfig) (one
    /// connection carries little, so the parts of two extents cannot fill a
    /// node's bandwidth), at least [`PUBLISH_BATCH`], at most 16.
    pub(super) fn extent_writers(&self, m: u64) -> usize {
        if !self.backend_kind().is_remote() {
            return PUBLISH_BATCH;
        }
        let c = &self.inner.config;
        let per_extent = if m > c.remote.part_bytes {
            m.div_ceil(c.remote.part_bytes.max(1))
        } else {
            1
        };
        (c.remote.parts_in_flight as u64)
            .div_ceil(per_extent)
            .clamp(PUBLISH_BATCH as u64, 16) as usize
    }

    /// Names and writes `payload`'s extents; returns their entries (in
    /// order) and the payload digest.
    ///
    /// Pipelined: a producer task names (hashes) extents ahead of the
    /// writes, and [`Store::extent_writers`] writes are in flight. (On local disk
    /// that is two direct-I/O streams, measured faster than one; with
    /// buffered writes two streams had been slower than one.) Extents that
    /// overlap a late header (a delta's, which waits for the result digest)
    /// go last, so hashing the result overlaps the other writes.
    #[tracing::instrument(level = "debug", name = "write_v2", skip_all)]
    pub(crate) async fn write_v2(
        &self,
        payload: Payload,
        receipt: &mut PublishReceipt,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
        guard: &ProtectGuard,
    ) -> Result<(Vec<deltapack_format::ExtentEntry>, Digest)> {
        let m = self.inner.config.publication.max_extent_bytes;
        let total = payload.len();
        let plan = ExtentPlan::new(total, m)?;
        let level = self.inner.config.publication.compression;
        let late = payload
            .header
            .as_ref()
            .map_or(0, |_| payload.parts[0].len() as u64);
        let (early, waiting): (Vec<u64>, Vec<u64>) =
            (0..plan.count()).partition(|&i| plan.range(i).start >= late);
        let writers = self.extent_writers(m);
        let parts = Arc::new(payload.parts);
        let header = payload.header;
        // A fed payload (a flat snapshot) is staged strictly in order: it
        // has no late header, so `order` is ascending.
        let (file, feed) = (payload.file, payload.feed);
        // One buffer already staged: extents are slices of it.
        let staged = payload.staged && parts.len() == 1;
        // A producer task names (and maybe compresses) extents ahead of the
        // writes, at most `writers` ahead: it runs on its own, so hashing
        // extent i+1 overlaps writing extent i.
        let (tx, rx) = tokio::sync::mpsc::channel(writers);
        let order: Vec<u64> = early.into_iter().chain(waiting).collect();
        // The producer also protects each extent's key before handing it
        // to the writers: the protection's ledger commit (a WAL flush on
        // PostgreSQL) overlaps the writes already in flight instead of
        // holding up the write it guards.
        let protector = guard.protector();
        // One budget of parts in flight for all of this publication's
        // multipart extents (memory stays within parts × part size, and the
        // parts are slices of the payload, not copies).
        let parts_in_flight = tokio::sync::Semaphore::new(
            self.inner
                .config
                .remote
                .parts_in_flight
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        );
        let parts_in_flight = &parts_in_flight;
        let mut producer = AbortOnDrop(tokio::spawn(async move {
            for i in order {
                let r = plan.range(i);
                let raw = match (&header, &file) {
                    (None, None) if staged => {
                        ExtentSource::Staged(parts[0].slice(r.start as usize..r.end as usize))
                    }
                    (_, Some(f)) => ExtentSource::File {
                        file: f.clone(),
                        offset: r.start,
                        len: (r.end - r.start) as usize,
                    },
                    (Some(h), None) if r.start < late => match h.clone().await {
                        Ok(h) => {
                            let mut with = parts.as_ref().clone();
                            with[0] = h;
                            ExtentSource::Parts(slice_parts(&with, r))
                        }
                        Err(e) => {
                            let _ = tx.send(Err(StoreError::Internal(e))).await;
                            return;
                        }
                    },
                    _ => ExtentSource::Parts(slice_parts(&parts, r)),
                };
                let feed = feed.clone();
                let mut prepared = tokio::task::spawn_blocking(move || {
                    prepare_extent(&plan, i, raw, level, feed.as_deref())
                })
                .await
                .map_err(|e| StoreError::task("extent", e))
                .and_then(|r| r)
                .map(|(entry, obj)| (i, entry, obj));
                if let Ok((_, _, obj)) = &prepared {
                    if let Err(e) = protector.protect(vec![obj.key.to_string()]).await {
                        prepared = Err(e);
                    }
                }
                let failed = prepared.is_err();
                if tx.send(prepared).await.is_err() || failed {
                    return;
                }
            }
        }));
        let prepared = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let written = prepared
            .map(|p| async move {
                // Protected by the producer.
                let (i, entry, obj) = p?;
                let outcome = self
                    .write_object(&obj.key, obj.payload, Some(parts_in_flight))
                    .await?;
                Ok::<_, StoreError>((i, entry, outcome, obj.len))
            })
            .buffered(writers);
        let mut written = std::pin::pin!(written);
        let mut entries = Vec::with_capacity(plan.count() as usize);
        let mut done = 0u64;
        while let Some(w) = written.next().await {
            let (i, entry, outcome, len) = w?;
            self.count_write(receipt, outcome, len);
            done += entry.raw_len;
            entries.push((i, entry));
            progress(done, total);
        }
        // The stream ended: the producer has sent everything.
        (&mut producer.0)
            .await
            .map_err(|e| StoreError::task("extent producer", e))?;
        entries.sort_by_key(|(i, _)| *i);
        let entries: Vec<_> = entries.into_iter().map(|(_, e)| e).collect();
        let names: Vec<Digest> = entries.iter().map(|e| e.raw_digest).collect();
        let payload_digest = plan.merge(&names)?;
        Ok((entries, payload_digest))
    }

    /// Writes a contiguous payload as v1 chunk objects (legacy layout);
    /// returns the chunk entries and the payload digest.
    #[tracing::instrument(level = "debug", name = "write_v1", skip_all)]
    pub(super) async fn write_v1(
        &self,
        req: &PublishRequest,
        payload: Bytes,
        receipt: &mut PublishReceipt,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
        guard: &ProtectGuard,
    ) -> Result<(Vec<deltapack_format::root::ChunkEntryV1>, Digest)> {
        let p2 = payload.clone();
        let (boundary, ct) = (req.snapshot.boundary(), req.identity.chunk_tokens);
        let (chunks, payload_digest) = tokio::task::spawn_blocking(move || {
            let chunks = root::v1_chunks(&p2, boundary, ct)?;
            let d = deltapack_format::snapshot::digest_of_encoding(&p2);
            Ok::<_, deltapack_format::Error>((chunks, d))
        })
        .await
        .map_err(|e| StoreError::Internal(format!("v1 hashing task: {e}")))??;
        let ranges = root::v1_chunk_ranges(payload.len() as u64, chunks.len() as u64);
        let total = payload.len() as u64;
        let mut done = 0;
        let all: Vec<_> = chunks.iter().zip(ranges).collect();
        // Each chunk is staged (`staging.rs`) and written from the staged
        // copy, which must still hash to the name computed above; the
        // staged chunks, in order, must still give the payload digest. A
        // difference means the input changed meanwhile: the publication
        // fails before its root.
        let mut whole = blake3::Hasher::new();
        for batch in all.chunks(PUBLISH_BATCH) {
            let mut objs = Vec::with_capacity(batch.len());
            for (c, r) in batch {
                let staged =
                    super::staging::stage(&[payload.slice(r.start as usize..r.end as usize)])
                        .map_err(|e| StoreError::Internal(format!("staging a chunk: {e}")))?;
                whole.update(&staged);
                if Digest::sha256(&staged) != c.digest {
                    return Err(StoreError::InputChanged(format!(
                        "chunk {}..{} no longer hashes to {}",
                        r.start, r.end, c.digest
                    )));
                }
                objs.push(PendingObject {
                    key: keys::object_key(&c.digest),
                    payload: PutPayload::from_bytes(staged),
                    len: r.end - r.start,
                });
            }
            guard
                .protect(
                    objs.iter()
                        .map(|o: &PendingObject| o.key.to_string())
                        .collect(),
                )
                .await?;
            self.write_batch(objs, receipt).await?;
            done += batch.iter().map(|(c, _)| c.bytes).sum::<u64>();
            progress(done, total);
        }
        if Digest::from(whole.finalize()) != payload_digest {
            return Err(StoreError::InputChanged(
                "the staged chunks no longer give the payload digest".into(),
            ));
        }
        Ok((chunks, payload_digest))
    }

    pub(super) fn count_write(&self, receipt: &mut PublishReceipt, outcome: PutOutcome, len: u64) {
        match outcome {
            PutOutcome::Created => {
                receipt.objects_written += 1;
                receipt.bytes_written += len;
                Stats::add(&self.stats_ref().objects_written, 1);
                Stats::add(&self.stats_ref().bytes_written, len);
            }
            PutOutcome::Existed => {
                receipt.objects_reused += 1;
                Stats::add(&self.stats_ref().objects_reused, 1);
            }
        }
    }

    /// Writes one durability batch concurrently; returns when all are durable.
    pub(super) async fn write_batch(
        &self,
        objs: Vec<PendingObject>,
        receipt: &mut PublishReceipt,
    ) -> Result<()> {
        let results = futures::stream::iter(objs)
            .map(|o| async move {
                let outcome = self.write_object(&o.key, o.payload, None).await?;
                Ok::<_, StoreError>((outcome, o.len))
            })
            .buffer_unordered(PUBLISH_BATCH)
            .collect::<Vec<_>>()
            .await;
        for r in results {
            let (outcome, len) = r?;
            self.count_write(receipt, outcome, len);
        }
        Ok(())
    }

    /// Create-if-absent for a content-addressed object. An existing object
    /// is reused only if it holds exactly `payload`'s bytes; any other is
    /// damaged: quarantined (after a second read) and replaced by ours
    /// ([`Store::check_existing`]).
    ///
    /// With `parts` (a v2 extent), on a remote backend, an object larger
    /// than [`StoreConfig::remote.part_bytes`](crate::RemoteIoConfig::part_bytes) is a multipart upload whose
    /// parts take permits of `parts` (see [`Store::write_multipart`]).
    pub(crate) async fn write_object(
        &self,
        key: &object_store::path::Path,
        payload: PutPayload,
        parts: Option<&tokio::sync::Semaphore>,
    ) -> Result<PutOutcome> {
        let store = self.object_store().as_ref();
        let len = payload.content_length() as u64;
        if let Some(parts) = parts {
            if self.backend_kind().is_remote() && len > self.inner.config.remote.part_bytes {
                return self.write_multipart(key, payload, parts).await;
            }
        }
        // The memory backend keeps the very `Bytes` it is given, and these
        // are slices of the caller's snapshot, which may be memory deltapack
        // does not own (a Python buffer): a stored object must never alias
        // memory its owner may change after the call, so copy it here.
        let payload = if matches!(self.backend_kind(), BackendKind::Memory) {
            let mut owned = Vec::with_capacity(payload.content_length());
            for part in payload.iter() {
                owned.extend_from_slice(part);
            }
            PutPayload::from(owned)
        } else {
            payload
        };
        match put_create(store, key, payload.clone()).await? {
            PutOutcome::Created => Ok(PutOutcome::Created),
            PutOutcome::Existed => match self.check_existing(key, &payload).await? {
                Existing::Same => Ok(PutOutcome::Existed),
                // Gone since (e.g. collected), or quarantined: write ours.
                Existing::Absent => put_create(store, key, payload).await,
            },
        }
    }

    /// What stands under `key`, the name of `payload` (whose bytes this
    /// publication hashed to that name: `staging.rs`). An existing object
    /// is reused only if it holds exactly those bytes: a name is never
    /// trusted because it exists, since an older writer (or one whose input
    /// changed under it, before names came from staged bytes) may have
    /// stored other bytes under it. One that differs is read a second time:
    /// only two reads that saw the *same* other bytes prove damage at rest
    /// (the quarantine rule; two different wrong reads met damage in
    /// transit and prove nothing, so the publication fails and may be
    /// retried). A proven object is quarantined — copied to quarantine
    /// first, kept in place if that fails — and the caller writes ours.
    /// Costs one read of each reused object, streamed and compared piece
    /// by piece (no second copy held).
    async fn check_existing(
        &self,
        key: &object_store::path::Path,
        payload: &PutPayload,
    ) -> Result<Existing> {
        let first = match self.read_against(key, payload).await? {
            Found::Differs(d) => d,
            Found::Same => return Ok(Existing::Same),
            Found::Absent => return Ok(Existing::Absent),
        };
        tracing::warn!(%key, "an existing object does not hold the bytes of its name; reading it again");
        match self.read_against(key, payload).await? {
            Found::Same => return Ok(Existing::Same),
            Found::Absent => return Ok(Existing::Absent),
            Found::Differs(d) if d == first => {}
            Found::Differs(_) => {
                return Err(unverified(
                    key,
                    "two reads of the existing object gave different bytes (damage in transit); \
                     nothing was relied on, try again",
                ))
            }
        }
        tracing::warn!(%key, "an existing object does not hold the bytes of its name: quarantined, ours written");
        if !self.quarantine_kept(key).await {
            return Err(unverified(
                key,
                "a damaged object stands under this name and could not be moved to quarantine; \
                 try again",
            ));
        }
        Ok(Existing::Absent)
    }

    /// Reads the object under `key` as a stream and compares it with
    /// `want` as it arrives; a differing object is read to its end and its
    /// bytes' BLAKE3 returned (two reads of damage at rest agree on it).
    async fn read_against(
        &self,
        key: &object_store::path::Path,
        want: &PutPayload,
    ) -> Result<Found> {
        let got = match self.object_store().get(key).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(Found::Absent),
            Err(e) => return Err(StoreError::io(key, e)),
        };
        let mut same = got.meta.size == want.content_length() as u64;
        let mut seen = blake3::Hasher::new();
        let mut want_parts = want.iter().filter(|p| !p.is_empty());
        let mut cur: &[u8] = &[];
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| StoreError::io(key, e))?;
            seen.update(&chunk);
            let mut have: &[u8] = &chunk;
            while same && !have.is_empty() {
                if cur.is_empty() {
                    match want_parts.next() {
                        Some(p) => cur = p,
                        None => {
                            same = false;
                            break;
                        }
                    }
                }
                let k = cur.len().min(have.len());
                if cur[..k] != have[..k] {
                    same = false;
                    break;
                }
                (cur, have) = (&cur[k..], &have[k..]);
            }
        }
        if same && cur.is_empty() && want_parts.next().is_none() {
            Ok(Found::Same)
        } else {
            Ok(Found::Differs(seen.finalize()))
        }
    }

    /// Writes a large extent as a multipart upload, create-if-absent by
    /// read-then-write: object_store's multipart `complete` has no
    /// `PutMode::Create` (it overwrites), so the key is looked up first. An
    /// object holding exactly our bytes is reused, as
    /// [`Store::write_object`] reuses one; any other is quarantined (after
    /// a second read) and replaced ([`Store::check_existing`]).
    /// The key is the content's digest, so another writer completing an
    /// upload of the same key between the HEAD and our `complete` wrote the
    /// same bytes: the last `complete` replaces an object with an identical
    /// one, and a reader sees one or the other, never a mixture. (A
    /// collector cannot delete the key meanwhile: the producer protected it
    /// before the write.) A completed upload is durable on S3 as a PUT is;
    /// a failed part or `complete` aborts the upload, so nothing is visible
    /// and the publication fails before its root is written.
    pub(super) async fn write_multipart(
        &self,
        key: &object_store::path::Path,
        payload: PutPayload,
        parts: &tokio::sync::Semaphore,
    ) -> Result<PutOutcome> {
        let len = payload.content_length() as u64;
        if let Existing::Same = self.check_existing(key, &payload).await? {
            return Ok(PutOutcome::Existed);
        }
        let pieces = split_payload(&payload, self.inner.config.remote.part_bytes);
        tracing::debug!(%key, bytes = len, parts = pieces.len(), "multipart upload");
        crate::backend::put_multipart(self.object_store(), key, pieces, parts).await?;
        Ok(PutOutcome::Created)
    }
}

//! Publishing a snapshot straight from a file, read with `pread` into the
//! staging buffers (never mapped).
//!
//! Why not map the file: a mapping shares the file's pages, so a file
//! truncated while it is published kills the process with `SIGBUS`, and a
//! file rewritten in place changes bytes between two passes over them.
//! Here every byte is read once, with `pread`, into a staging buffer
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

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use deltapack_format::layer_digest::StreamFeed;
use deltapack_format::root::RootMeta;
use deltapack_format::{CacheIdentity, ContextDigest, Digest, SnapshotHeader};

use super::payload::Payload;
use super::receipt::{PublishOutcome, PublishReceipt, Turn};
use super::{plan, RootFormat};
use crate::error::{Result, StoreError};
use crate::gc::ProtectGuard;
use crate::stats::Stats;
use crate::store::{RootStatus, Store};

/// Bytes read at once by the passes that only hash (the digest of a file
/// whose context already has a root).
const READ_PIECE: usize = 8 << 20;

/// What identifies a file's contents as of a moment: if any of it differs
/// later, the file was changed (or replaced) meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            len: m.len(),
            dev: m.dev(),
            ino: m.ino(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// An encoded snapshot in a file, opened for publication: its header is
/// read and validated (the file's length must be the one the header
/// implies), its bytes are read later, once, by the publication.
#[derive(Debug)]
pub struct SnapshotFile {
    file: std::fs::File,
    path: PathBuf,
    header: SnapshotHeader,
    payload_offset: u64,
    len: u64,
    stamp: Stamp,
}

impl SnapshotFile {
    /// Opens `path` and validates its snapshot header. Reads only the
    /// header.
    pub fn open(path: &Path) -> Result<SnapshotFile> {
        let io = |e: std::io::Error| StoreError::Invalid(format!("{}: {e}", path.display()));
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(StoreError::Invalid(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        let stamp = Stamp::of(&meta);
        // The framing says how long the prefix is; its length is bounded
        // by the format before anything that long is read.
        let mut first = vec![0u8; (stamp.len as usize).min(64 << 10)];
        file.read_exact_at(&mut first, 0).map_err(io)?;
        let need = deltapack_format::snapshot::prefix_len(&first)?;
        let prefix = if need as usize <= first.len() {
            first.truncate(need as usize);
            first
        } else if need <= stamp.len {
            let mut p = vec![0u8; need as usize];
            file.read_exact_at(&mut p, 0).map_err(io)?;
            p
        } else {
            return Err(StoreError::Invalid(format!(
                "{}: the snapshot header claims {need} bytes, the file has {}",
                path.display(),
                stamp.len
            )));
        };
        let (header, payload_offset) = deltapack_format::snapshot::decode_prefix(&prefix)?;
        let payload = header.validate()?;
        let want = payload_offset as u64 + payload;
        if want != stamp.len {
            return Err(StoreError::Invalid(format!(
                "{}: the snapshot header implies {want} bytes, the file has {}",
                path.display(),
                stamp.len
            )));
        }
        Ok(SnapshotFile {
            file,
            path: path.to_path_buf(),
            header,
            payload_offset: payload_offset as u64,
            len: stamp.len,
            stamp,
        })
    }

    /// The snapshot's header.
    pub fn header(&self) -> &SnapshotHeader {
        &self.header
    }

    /// Tokens the snapshot covers.
    pub fn boundary(&self) -> u64 {
        self.header.boundary
    }

    /// The encoding's length in bytes (the file's, when opened).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the encoding is empty (never: a header is always there).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole snapshot, read with `pread` into memory of its own
    /// (deltapack's: later changes to the file do not reach it). Checks
    /// that the file did not change meanwhile.
    pub fn read_all(&self) -> Result<deltapack_format::Snapshot> {
        self.read_ranges(&[0..self.len])
    }

    /// The snapshot as far as [`Store::turn_from`] needs it to prove the
    /// turn state a root records: its prefix and, per (group, layer)
    /// stream, the bytes from the stream's state point on (about a page per
    /// stream), read with `pread`; every other byte is zero, in memory
    /// never touched (so never faulted in). Only for `turn_from`: anything
    /// that reads the settled pages must use [`SnapshotFile::read_all`].
    pub fn read_for_turn(&self) -> Result<deltapack_format::Snapshot> {
        let mut ranges = vec![0..self.payload_offset];
        ranges.extend(deltapack_format::layer_digest::resume_ranges(
            &self.header,
            self.payload_offset,
        )?);
        self.read_ranges(&ranges)
    }

    /// A snapshot of the file's length whose `ranges` are read from the
    /// file (the rest zero and untouched).
    fn read_ranges(&self, ranges: &[std::ops::Range<u64>]) -> Result<deltapack_format::Snapshot> {
        let len = usize::try_from(self.len)
            .map_err(|_| StoreError::Invalid(format!("{}: too large", self.path.display())))?;
        let mut buf = crate::buffer::fresh_buffer(len)
            .map_err(|e| StoreError::Invalid(format!("{}: {e}", self.path.display())))?;
        for r in ranges {
            let (a, b) = (r.start.min(self.len) as usize, r.end.min(self.len) as usize);
            if a < b {
                self.read_at(a as u64, &mut buf[a..b])?;
            }
        }
        self.check_unchanged()?;
        Ok(deltapack_format::Snapshot::from_encoded(buf)?)
    }

    /// Reads `buf.len()` bytes at `offset`; a file that ends sooner was
    /// truncated since it was opened.
    pub(super) fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                StoreError::InputChanged(format!(
                    "{} is shorter than when it was opened ({} bytes)",
                    self.path.display(),
                    self.len
                ))
            } else {
                StoreError::Invalid(format!("reading {}: {e}", self.path.display()))
            }
        })
    }

    /// Fails if the file is not as it was when opened (size, times,
    /// identity).
    fn check_unchanged(&self) -> Result<()> {
        let now = std::fs::metadata(&self.path)
            .map(|m| Stamp::of(&m))
            .map_err(|e| StoreError::InputChanged(format!("{}: {e}", self.path.display())))?;
        let by_fd = self
            .file
            .metadata()
            .map(|m| Stamp::of(&m))
            .map_err(|e| StoreError::InputChanged(format!("{}: {e}", self.path.display())))?;
        if now != self.stamp || by_fd != self.stamp {
            return Err(StoreError::InputChanged(format!(
                "{} was modified or replaced during the publication",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// The layered digest (and state) of the file's bytes, read once in
    /// pieces (nothing written).
    fn digest(
        &self,
    ) -> Result<(
        deltapack_format::layer_digest::LayerDigests,
        deltapack_format::DigestState,
    )> {
        let mut feed = StreamFeed::new(&self.header, self.payload_offset)?;
        let mut buf = vec![0u8; READ_PIECE.min(self.len as usize)];
        let mut at = 0u64;
        while at < self.len {
            let n = (self.len - at).min(buf.len() as u64) as usize;
            self.read_at(at, &mut buf[..n])?;
            feed.feed(&buf[..n]);
            at += n as u64;
        }
        self.check_unchanged()?;
        feed.finish()
            .map_err(|e| StoreError::InputChanged(format!("{}: {e}", self.path.display())))
    }
}

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

    // An existing root decides the outcome without writing anything.
    if !matches!(store.read_root(&ns, &context).await?, RootStatus::Absent) {
        let f = file.clone();
        let (digests, state) = tokio::task::spawn_blocking(move || f.digest())
            .await
            .map_err(|e| StoreError::task("file digest", e))??;
        Stats::add(&store.stats_ref().snapshot_bytes_hashed, file.len());
        let mut receipt = PublishReceipt::empty(ns, context, digests.snapshot);
        if let Some(done) = store
            .existing_outcome(&ns, &context, &mut receipt, None)
            .await?
        {
            if done == PublishOutcome::AlreadyPresent {
                store.ledger_touch(&ns, &context).await;
                receipt.turn = Some(Turn::new(store, ns, context, Arc::new(state)));
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
    let (digests, state) = super::finish_feed(feed, &file.path.display().to_string())?;
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

//! An encoded snapshot in a file, read with `pread` — never mapped — for
//! a publication (`file.rs`) or as the base of a turn (the CLI).
//!
//! Why not map the file: a mapping shares the file's pages, so a file
//! truncated while it is read kills the process with `SIGBUS`, and a file
//! rewritten in place changes bytes between two passes over them. A read
//! that finds the file shorter than when it was opened is a clean error
//! (`InputChanged`), never a signal; so is a file whose size, times or
//! identity changed by the end of the reading.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use deltapack_format::layer_digest::StreamFeed;
use deltapack_format::SnapshotHeader;

use crate::error::{Result, StoreError};

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
    pub(super) path: PathBuf,
    header: SnapshotHeader,
    pub(super) payload_offset: u64,
    len: u64,
    stamp: Stamp,
}

impl SnapshotFile {
    /// Opens `path` and validates its snapshot header. Reads only the
    /// header.
    pub fn open(path: &Path) -> Result<SnapshotFile> {
        let io = |e: std::io::Error| StoreError::Invalid(format!("{}: {e}", path.display()));
        let (file, stamp) = open_regular(path)?;
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
        self.read_ranges(std::iter::once(0..self.len))
    }

    /// The snapshot as far as [`Store::turn_from`](crate::Store::turn_from) needs it to prove the
    /// turn state a root records: its prefix and, per (group, layer)
    /// stream, the bytes from the stream's state point on (about a page per
    /// stream), read with `pread`; every other byte is zero, in memory
    /// never touched (so never faulted in). Only for `turn_from`: anything
    /// that reads the settled pages must use [`SnapshotFile::read_all`].
    pub fn read_for_turn(&self) -> Result<deltapack_format::Snapshot> {
        let streams =
            deltapack_format::layer_digest::resume_ranges(&self.header, self.payload_offset)?;
        self.read_ranges(std::iter::once(0..self.payload_offset).chain(streams))
    }

    /// A snapshot of the file's length whose `ranges` are read from the
    /// file (the rest zero and untouched).
    fn read_ranges(
        &self,
        ranges: impl IntoIterator<Item = std::ops::Range<u64>>,
    ) -> Result<deltapack_format::Snapshot> {
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
        read_exact(&self.file, &self.path, self.len, offset, buf)
    }

    /// Fails if the file is not as it was when opened (size, times,
    /// identity).
    pub(super) fn check_unchanged(&self) -> Result<()> {
        check_stamp(&self.file, &self.path, &self.stamp)
    }

    /// The layered digest (and state) of the file's bytes and their plain
    /// BLAKE3 (`blake3:`, what roots before v2.2 record), read once in
    /// pieces (nothing written).
    pub(super) fn digests(
        &self,
    ) -> Result<(
        deltapack_format::layer_digest::LayerDigests,
        deltapack_format::DigestState,
        deltapack_format::Digest,
    )> {
        let mut feed = StreamFeed::new(&self.header, self.payload_offset)?;
        let mut plain = blake3::Hasher::new();
        let mut buf = vec![0u8; READ_PIECE.min(self.len as usize)];
        let mut at = 0u64;
        while at < self.len {
            let n = (self.len - at).min(buf.len() as u64) as usize;
            self.read_at(at, &mut buf[..n])?;
            feed.feed(&buf[..n]);
            plain.update(&buf[..n]);
            at += n as u64;
        }
        self.check_unchanged()?;
        let (digests, state) = feed
            .finish()
            .map_err(|e| StoreError::InputChanged(format!("{}: {e}", self.path.display())))?;
        Ok((digests, state, plain.finalize().into()))
    }
}

/// Opens `path`, which must be a regular file, and stamps it as it is now.
fn open_regular(path: &Path) -> Result<(std::fs::File, Stamp)> {
    let io = |e: std::io::Error| StoreError::Invalid(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(StoreError::Invalid(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok((file, Stamp::of(&meta)))
}

/// Reads `buf.len()` bytes of `file` (opened at `len` bytes) at `offset`; a
/// file that ends sooner was truncated since it was opened.
fn read_exact(
    file: &std::fs::File,
    path: &Path,
    len: u64,
    offset: u64,
    buf: &mut [u8],
) -> Result<()> {
    file.read_exact_at(buf, offset).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            StoreError::InputChanged(format!(
                "{} is shorter than when it was opened ({len} bytes)",
                path.display(),
            ))
        } else {
            StoreError::Invalid(format!("reading {}: {e}", path.display()))
        }
    })
}

/// Fails if the file at `path`, or the one `file` refers to, is not as
/// `stamp` saw it (size, times, identity).
fn check_stamp(file: &std::fs::File, path: &Path, stamp: &Stamp) -> Result<()> {
    let changed = |e: std::io::Error| StoreError::InputChanged(format!("{}: {e}", path.display()));
    let now = std::fs::metadata(path)
        .map(|m| Stamp::of(&m))
        .map_err(changed)?;
    let by_fd = file.metadata().map(|m| Stamp::of(&m)).map_err(changed)?;
    if now != *stamp || by_fd != *stamp {
        return Err(StoreError::InputChanged(format!(
            "{} was modified or replaced during the publication",
            path.display()
        )));
    }
    Ok(())
}

/// A turn's new pages in a file ([`Store::publish_turn_file`](crate::Store::publish_turn_file)), read once
/// with `pread` straight into the buffer the turn's payload is staged in
/// (never mapped: see the module's note).
#[derive(Debug)]
pub struct TailFile {
    file: std::fs::File,
    path: PathBuf,
    len: u64,
    stamp: Stamp,
}

impl TailFile {
    /// Opens `path`, a regular file; reads nothing yet.
    pub fn open(path: &Path) -> Result<TailFile> {
        let (file, stamp) = open_regular(path)?;
        Ok(TailFile {
            file,
            path: path.to_path_buf(),
            len: stamp.len,
            stamp,
        })
    }

    /// The file's length in bytes, when opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file was empty when opened.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the whole file into `dest` (exactly its length), then checks
    /// that it did not change meanwhile.
    pub(crate) fn read_into(&self, dest: &mut [u8]) -> Result<()> {
        if dest.len() as u64 != self.len {
            return Err(StoreError::Internal(format!(
                "{}: {} bytes asked of a {}-byte file",
                self.path.display(),
                dest.len(),
                self.len
            )));
        }
        read_exact(&self.file, &self.path, self.len, 0, dest)?;
        check_stamp(&self.file, &self.path, &self.stamp)
    }

    /// The whole file, read into memory of its own.
    pub(crate) fn read_bytes(&self) -> Result<bytes::Bytes> {
        let len = usize::try_from(self.len)
            .map_err(|_| StoreError::Invalid(format!("{}: too large", self.path.display())))?;
        let mut v = vec![0u8; len];
        self.read_into(&mut v)?;
        Ok(bytes::Bytes::from(v))
    }
}

//! Streaming v2 restore: verified extent bytes go straight into the result.
//!
//! A naive restore materialises the whole payload (the delta), then copies it
//! into the result: two large fresh allocations and an extra pass over ~1.6 GB.
//! Here the result buffer is the only large buffer, and it may be the
//! caller's own (`Store::restore_into`), so a reader that restores into the
//! same resident memory turn after turn pays no page faults at all. The
//! reconstruction plan of the delta (see `deltapack_format::delta`) maps
//! every tail byte of the payload to one position in the result,
//! monotonically, so each extent owns a disjoint region of the result
//! buffer. Worker threads take extents in order, read each in 256 KiB
//! pieces into a buffer that stays in L2, hash the piece into the extent's
//! BLAKE3 subtree, and copy it to its place while it is still in cache — the
//! fused loop.
//!
//! Nothing is handed over before everything verified: every extent name, the
//! merged payload digest, and — for a delta — the BLAKE3 of the rebuilt
//! result. A failed check drops the restore (an owned buffer is freed; a
//! caller's buffer is declared meaningless by the miss).
//!
//! Two [`Source`]s feed the same loop:
//!
//! * **Local disk**: extent files are read with positioned reads, with no
//!   `object_store` round trip.
//! * **Any backend**: each worker drives its own GET through the runtime's
//!   handle and pulls the body's chunks as they arrive, so at most one
//!   256 KiB piece per worker is buffered, not a whole 64 MiB object. A
//!   failed read or check is retried once (damage in transit) before the
//!   object is blamed.

use std::fs::File;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::{Buf, Bytes};
use deltapack_format::delta;
use deltapack_format::root::ExtentEntry;
use deltapack_format::scatter::{self, Region, Span};
use deltapack_format::{Digest, ExtentCodec, ExtentPlan, ManifestV2, Snapshot};
use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

pub(crate) use crate::fault::{FaultKind, ObjectFault, Proof};
use crate::keys;

/// Piece size of the fused read → hash → copy loop.
pub(crate) const PIECE: usize = 256 * 1024;

/// Largest block of the in-loop result hash (see `compose::ResultHash`); blocks
/// are a quarter of the extent size up to this, so that small extents (as
/// in the tests) still own whole blocks.
pub(crate) const RESULT_BLOCK: u64 = 256 * 1024;

/// Bytes read from the first extent to find the delta header (one request
/// usually suffices).
const HEADER_PROBE: usize = 64 * 1024;

/// Where extent bytes come from.
pub(crate) enum Source {
    /// Files under a local store's root directory.
    Local(PathBuf),
    /// Any `object_store` backend, driven from worker threads through the
    /// runtime `handle` (which must be a multi-thread runtime, or one driven
    /// by another thread).
    Remote {
        /// The backend.
        store: Arc<dyn ObjectStore>,
        /// The runtime the requests run on.
        handle: tokio::runtime::Handle,
    },
}

impl Source {
    /// Worker threads for a restore from this source.
    pub(crate) fn threads(&self, in_flight: usize) -> usize {
        match self {
            // Local reads are CPU-bound (page cache): one worker per core.
            Source::Local(_) => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(in_flight),
            // Remote reads wait on the network: keep `in_flight` requests open.
            Source::Remote { .. } => in_flight,
        }
    }
}

/// The result buffer: allocated here, or the caller's.
pub(crate) enum Dest<'a> {
    Owned(Vec<u8>),
    Borrowed(&'a mut [u8]),
}

impl Dest<'_> {
    pub(crate) fn bytes(&mut self) -> &mut [u8] {
        match self {
            Dest::Owned(v) => v,
            Dest::Borrowed(b) => b,
        }
    }

    pub(crate) fn take(len: usize, into: Option<&mut [u8]>) -> Result<Dest<'_>, String> {
        match into {
            None => Ok(Dest::Owned(zeroed_buffer(len)?)),
            Some(b) if b.len() == len => Ok(Dest::Borrowed(b)),
            Some(b) => Err(format!(
                "the buffer is {} bytes, the snapshot {len}",
                b.len()
            )),
        }
    }
}

/// A verified restore: an owned snapshot, or the caller's buffer filled.
pub(crate) enum Output {
    /// The restore allocated the result.
    Snapshot(Snapshot),
    /// The caller's buffer holds the verified snapshot encoding.
    Written,
}

/// A zero-filled buffer obtained without touching its pages: the page
/// faults happen where the bytes are first written, spread over the worker
/// threads. (Requesting transparent huge pages for it was measured slower
/// here: 1.2–1.5 s instead of 0.5 s for a 193 MiB chain restore, compaction
/// cost outweighing fewer faults.)
pub(crate) fn zeroed_buffer(len: usize) -> Result<Vec<u8>, String> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(len)
        .map_err(|e| format!("cannot allocate {len} bytes: {e}"))?;
    // SAFETY: `layout` has non-zero size. `alloc_zeroed` returns either null
    // (handled) or a zero-initialised block of exactly `len` bytes from the
    // global allocator, which is what `Vec::from_raw_parts` requires for a
    // `Vec<u8>` of length and capacity `len`. Large blocks come from fresh
    // mmap pages that are not touched here, so page faults happen later, in
    // parallel, where the bytes are written.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout);
        if ptr.is_null() {
            return Err(format!("cannot allocate {len} bytes for a restore"));
        }
        Ok(Vec::from_raw_parts(ptr, len, len))
    }
}

/// Where the bytes of one extent go as they are read: a [`Region`] of the
/// result for a flat root, `compose::ItemSink` for a delta chain.
pub(crate) trait Sink {
    /// Places `bytes` found at payload offset `src` of the extent.
    fn place(&mut self, src: u64, bytes: &[u8]);
    /// Every byte of the extent below payload offset `payload_end` has been
    /// placed (a moment to hash finished result blocks while they are in
    /// cache).
    fn placed_upto(&mut self, payload_end: u64);
}

impl Sink for Region<'_, '_> {
    fn place(&mut self, src: u64, bytes: &[u8]) {
        Region::place(self, src, bytes);
    }

    fn placed_upto(&mut self, _payload_end: u64) {}
}

/// Why absorbing an extent stopped.
enum AbsorbError {
    /// The source failed to deliver bytes.
    Read(std::io::Error),
    /// The bytes were wrong (short, wrong name).
    Bad(String),
    /// The bytes verified, but the delta header the plan was made from
    /// differs from them: the plan, not the object, is at fault.
    Plan(String),
    /// The deadline passed.
    Deadline,
}

/// Hashes and places one extent's raw bytes, pulled from `next` in pieces
/// of `scratch`'s size, checking the delta header bytes the plan was made
/// from.
#[allow(clippy::too_many_arguments)]
fn absorb(
    plan: &ExtentPlan,
    index: u64,
    e: &ExtentEntry,
    region: &mut dyn Sink,
    header: Option<&[u8]>,
    deadline: Option<Instant>,
    mut next: impl FnMut(&mut [u8]) -> std::io::Result<usize>,
    scratch: &mut [u8],
) -> Result<(), AbsorbError> {
    let mut h = plan.hasher(index);
    let mut off = e.offset;
    let end = e.offset + e.raw_len;
    let mut header_differs = false;
    while off < end {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(AbsorbError::Deadline);
        }
        let want = ((end - off) as usize).min(scratch.len());
        let buf = &mut scratch[..want];
        let mut got = 0;
        while got < want {
            let n = next(&mut buf[got..]).map_err(AbsorbError::Read)?;
            if n == 0 {
                return Err(AbsorbError::Bad(format!(
                    "extent {index} ended after {} of {} bytes",
                    off - e.offset + got as u64,
                    e.raw_len
                )));
            }
            got += n;
        }
        h.update(buf);
        if let Some(hdr) = header {
            let lo = off as usize;
            if lo < hdr.len() {
                let n = (hdr.len() - lo).min(want);
                header_differs |= buf[..n] != hdr[lo..lo + n];
            }
        }
        region.place(off, buf);
        off += want as u64;
        region.placed_upto(off);
    }
    h.verify(&format!("extent {index}"), &e.raw_digest)
        .map_err(|x| AbsorbError::Bad(x.to_string()))?;
    if header_differs {
        // The extent is what its name says, so the header the plan was
        // made from (read earlier, or taken from the root) is what is wrong.
        return Err(AbsorbError::Plan(
            "the delta header the plan was made from is not the one stored".into(),
        ));
    }
    Ok(())
}

/// Restores a flat v2 root (its payload is the snapshot) from `source` on
/// up to `threads` workers, into `into` (exactly the snapshot's length) or
/// a buffer allocated here. Every extent is verified against its name as it
/// streams in (a failed one is read once more before it is blamed), and the
/// names merge to the payload digest, which for a flat root is the snapshot
/// digest. `Err(damage)` is a miss (or, for [`FaultKind::Io`], an error).
/// Delta roots go through `compose::restore_chain`.
pub(crate) fn restore_flat(
    source: &Source,
    m: &ManifestV2,
    into: Option<&mut [u8]>,
    threads: usize,
    deadline: Option<Instant>,
) -> Result<Output, ObjectFault> {
    if m.base.is_some() {
        return Err(ObjectFault::plain(
            "internal: a delta root reached the flat restore",
        ));
    }
    let plan = ExtentPlan::new(m.payload_len, m.max_extent_bytes)
        .map_err(|e| ObjectFault::plain(e.to_string()))?;
    let len =
        usize::try_from(m.payload_len).map_err(|_| ObjectFault::plain("payload too large"))?;
    let mut result = Dest::take(len, into).map_err(ObjectFault::plain)?;
    // The payload is the snapshot: one span maps it onto the result as it
    // is, and each extent owns the region at its own offsets. (The span is
    // unbounded so that an extent running past the payload runs past the
    // buffer, which `regions` refuses.)
    let whole = [Span {
        src: 0,
        dst: 0,
        len: u64::MAX,
    }];
    let extents = m.extents.iter().map(|e| e.offset..e.offset + e.raw_len);
    let regions: Vec<Mutex<Option<Region<'_, '_>>>> =
        scatter::regions(result.bytes(), &whole, extents)
            .map(|r| r.map(|r| Mutex::new(Some(r))))
            .collect::<Result<_, _>>()
            .map_err(|_| ObjectFault::plain("extents run past the payload"))?;
    let next = AtomicUsize::new(0);
    let failures: Mutex<Vec<ObjectFault>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1).min(m.extents.len().max(1)) {
            s.spawn(|| {
                let mut scratch = vec![0u8; PIECE];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= m.extents.len() {
                        break;
                    }
                    let e = &m.extents[i];
                    let Some(mut region) = regions[i].lock().ok().and_then(|mut r| r.take()) else {
                        break;
                    };
                    // A failed read or check is read again: damage in
                    // transit, or an error that passes, is not damage at
                    // rest (the quarantine rule, `Proof`).
                    let mut proof = Proof::default();
                    let r = loop {
                        match read_extent(
                            source,
                            &plan,
                            i as u64,
                            e,
                            &mut region,
                            None,
                            deadline,
                            &mut scratch,
                        ) {
                            Ok(()) => break Ok(()),
                            Err(d) => {
                                tracing::warn!(what = %d.what, "extent read failed");
                                if let Some(f) = proof.record(d) {
                                    break Err(f);
                                }
                            }
                        }
                    };
                    if let Err(d) = r {
                        if let Ok(mut f) = failures.lock() {
                            f.push(d);
                        }
                        // Stop early: the restore fails either way.
                        next.store(m.extents.len(), Ordering::Relaxed);
                    }
                }
            });
        }
    });
    drop(regions);
    if let Some(d) = failures.into_inner().ok().and_then(|mut f| f.pop()) {
        return Err(d);
    }
    // Every extent matched its name; the names merge to the payload digest.
    let names: Vec<Digest> = m.extents.iter().map(|e| e.raw_digest).collect();
    let merged = plan
        .merge(&names)
        .map_err(|e| ObjectFault::plain(e.to_string()))?;
    if merged != m.payload_digest {
        return Err(ObjectFault::plain(format!(
            "payload digest {merged} != {}",
            m.payload_digest
        )));
    }
    match result {
        Dest::Owned(v) => Snapshot::from_encoded(v)
            .map(Output::Snapshot)
            .map_err(|e| ObjectFault::plain(e.to_string())),
        // The bytes are the payload, verified, and a flat root's payload
        // digest is its snapshot digest.
        Dest::Borrowed(_) => Ok(Output::Written),
    }
}

/// Reads one extent from `source` through the fused loop into `region`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_extent(
    source: &Source,
    plan: &ExtentPlan,
    index: u64,
    e: &ExtentEntry,
    region: &mut dyn Sink,
    header: Option<&[u8]>,
    deadline: Option<Instant>,
    scratch: &mut [u8],
) -> Result<(), ObjectFault> {
    let key = keys::object_key(&e.object_digest());
    // Where the bytes come from: a positioned-read closure over a file, or
    // the chunks of a GET body.
    let absorbed = match (source, e.codec) {
        (_, ExtentCodec::Zstd) => {
            let stored = read_all(source, e)?;
            let raw = verify_zstd(e, &stored)
                .map_err(|w| ObjectFault::of(&key, FaultKind::Corrupt, w))?;
            let mut pos = 0usize;
            absorb(
                plan,
                index,
                e,
                region,
                header,
                deadline,
                |buf| {
                    let n = buf.len().min(raw.len() - pos);
                    buf[..n].copy_from_slice(&raw[pos..pos + n]);
                    pos += n;
                    Ok(n)
                },
                scratch,
            )
        }
        (Source::Local(root), ExtentCodec::Raw) => {
            let file = open_local(root, &key, e)?;
            let mut pos = 0u64;
            absorb(
                plan,
                index,
                e,
                region,
                header,
                deadline,
                |buf| {
                    let n = read_at(&file, buf, pos)?;
                    pos += n as u64;
                    Ok(n)
                },
                scratch,
            )
        }
        (Source::Remote { store, handle }, ExtentCodec::Raw) => {
            let got = handle.block_on(store.get(&key));
            let got = remote_result(&key, e, got)?;
            let mut body = got.into_stream();
            let mut chunk = Bytes::new();
            absorb(
                plan,
                index,
                e,
                region,
                header,
                deadline,
                |buf| handle.block_on(fill(&mut body, &mut chunk, buf)),
                scratch,
            )
        }
    };
    absorbed.map_err(|x| match x {
        AbsorbError::Deadline => ObjectFault::deadline(),
        AbsorbError::Bad(w) => ObjectFault::of(&key, FaultKind::Corrupt, w),
        AbsorbError::Plan(w) => ObjectFault::plain(format!("{key}: {w}")),
        // A read error (EIO, EACCES, a dropped connection) proves nothing
        // about the bytes at rest: an error, never a quarantine.
        AbsorbError::Read(err) => ObjectFault::io(&key, "read", err),
    })
}

/// Reads the raw bytes `range` (payload offsets) of one remote raw extent
/// and places them, **without** checking the extent's name: for a delta
/// chain whose plan came from authenticated roots alone, every placed byte
/// is checked by the result digest instead (`compose`'s deferred mode),
/// and the extent by its name only if that check fails. One ranged GET,
/// its body's chunks placed as they arrive (no staging copy), so memory
/// stays one body chunk per worker.
pub(crate) fn read_range_unverified(
    store: &Arc<dyn ObjectStore>,
    handle: &tokio::runtime::Handle,
    e: &ExtentEntry,
    range: std::ops::Range<u64>,
    region: &mut dyn Sink,
    deadline: Option<Instant>,
) -> Result<(), ObjectFault> {
    let key = keys::object_key(&e.object_digest());
    if range.start < e.offset || range.end > e.offset + e.raw_len || range.start >= range.end {
        return Err(ObjectFault::plain(format!(
            "{key}: bytes {range:?} are not inside the extent"
        )));
    }
    let opts = object_store::GetOptions::default()
        .with_range(Some(range.start - e.offset..range.end - e.offset));
    let got = handle.block_on(store.get_opts(&key, opts));
    let mut body = remote_result(&key, e, got)?.into_stream();
    // Nothing is hashed here, so the body's chunks are placed as they come,
    // with no staging copy.
    let mut off = range.start;
    while off < range.end {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(ObjectFault::deadline());
        }
        let chunk = match handle.block_on(body.next()) {
            Some(Ok(c)) => c,
            Some(Err(x)) => return Err(ObjectFault::backend(&key, x)),
            None => {
                return Err(ObjectFault::of(
                    &key,
                    FaultKind::Corrupt,
                    format!("ranged read ended {} bytes short", range.end - off),
                ))
            }
        };
        let n = (chunk.len() as u64).min(range.end - off) as usize;
        region.place(off, &chunk[..n]);
        off += n as u64;
        region.placed_upto(off);
    }
    Ok(())
}

/// Fills `buf` from a GET body, keeping the unread rest of the current
/// chunk in `chunk`; returns 0 only at the end of the body.
async fn fill(
    body: &mut futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    chunk: &mut Bytes,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        if chunk.is_empty() {
            match body.next().await {
                Some(Ok(b)) => *chunk = b,
                Some(Err(e)) => return Err(std::io::Error::other(e)),
                None => break,
            }
            continue;
        }
        let k = chunk.len().min(buf.len() - n);
        buf[n..n + k].copy_from_slice(&chunk[..k]);
        chunk.advance(k);
        n += k;
    }
    Ok(n)
}

/// Opens a local extent file and checks its size.
pub(crate) fn open_local(root: &FsPath, key: &Path, e: &ExtentEntry) -> Result<File, ObjectFault> {
    let file = match File::open(root.join(key.as_ref())) {
        Ok(f) => f,
        Err(x) if x.kind() == std::io::ErrorKind::NotFound => {
            return Err(ObjectFault::of(
                key,
                FaultKind::Missing,
                "object is missing",
            ))
        }
        Err(x) => return Err(ObjectFault::io(key, "open", x)),
    };
    let size = file
        .metadata()
        .map_err(|x| ObjectFault::io(key, "stat", x))?
        .len();
    if size != e.stored_len {
        return Err(ObjectFault::of(
            key,
            FaultKind::Corrupt,
            format!("object is {size} bytes, expected {}", e.stored_len),
        ));
    }
    Ok(file)
}

/// Classifies a GET: missing, wrong size (from metadata, before any body
/// byte is read), backend failure, or a body to read.
fn remote_result(
    key: &Path,
    e: &ExtentEntry,
    got: object_store::Result<object_store::GetResult>,
) -> Result<object_store::GetResult, ObjectFault> {
    match got {
        Ok(g) if g.meta.size == e.stored_len => Ok(g),
        Ok(g) => Err(ObjectFault::of(
            key,
            FaultKind::Corrupt,
            format!("object is {} bytes, expected {}", g.meta.size, e.stored_len),
        )),
        Err(x) => Err(ObjectFault::backend(key, x)),
    }
}

/// An extent's whole stored object (zstd extents, the blame pass).
fn read_all(source: &Source, e: &ExtentEntry) -> Result<Bytes, ObjectFault> {
    let key = keys::object_key(&e.object_digest());
    let bytes = match source {
        Source::Local(root) => {
            // Size first, so a huge file is not read into memory.
            drop(open_local(root, &key, e)?);
            Bytes::from(
                std::fs::read(root.join(key.as_ref()))
                    .map_err(|x| ObjectFault::io(&key, "read", x))?,
            )
        }
        Source::Remote { store, handle } => {
            let got = remote_result(&key, e, handle.block_on(store.get(&key)))?;
            handle
                .block_on(got.bytes())
                .map_err(|x| ObjectFault::backend(&key, x))?
        }
    };
    if bytes.len() as u64 != e.stored_len {
        return Err(ObjectFault::of(
            &key,
            FaultKind::Corrupt,
            format!("read {} bytes, expected {}", bytes.len(), e.stored_len),
        ));
    }
    Ok(bytes)
}

/// The first `len` raw bytes of an extent (unverified).
fn read_prefix(source: &Source, e: &ExtentEntry, len: usize) -> Result<Vec<u8>, ObjectFault> {
    let key = keys::object_key(&e.object_digest());
    let len = len.min(usize::try_from(e.raw_len).unwrap_or(usize::MAX));
    match (source, e.codec) {
        (_, ExtentCodec::Zstd) => {
            let stored = read_all(source, e)?;
            let mut raw = verify_zstd(e, &stored)
                .map_err(|w| ObjectFault::of(&key, FaultKind::Corrupt, w))?;
            raw.truncate(len);
            Ok(raw)
        }
        (Source::Local(root), ExtentCodec::Raw) => {
            let f = open_local(root, &key, e)?;
            let mut buf = vec![0u8; len];
            let mut got = 0;
            while got < len {
                let n = read_at(&f, &mut buf[got..], got as u64)
                    .map_err(|x| ObjectFault::io(&key, "read", x))?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            buf.truncate(got);
            Ok(buf)
        }
        (Source::Remote { store, handle }, ExtentCodec::Raw) => {
            let r = handle.block_on(store.get_range(&key, 0..len as u64));
            r.map(|b| b.to_vec())
                .map_err(|x| ObjectFault::backend(&key, x))
        }
    }
}

/// Reads the delta header bytes (unverified; checked again while hashing)
/// from the first extents.
pub(crate) fn read_header_prefix(source: &Source, m: &ManifestV2) -> Result<Vec<u8>, ObjectFault> {
    let need = |out: &[u8]| delta::header_extent(out).unwrap_or(delta::DELTA_PREFIX_LEN);
    let mut out: Vec<u8> = Vec::new();
    for e in &m.extents {
        // `out` holds every byte before this extent; read more of it until
        // the header is complete or the extent is exhausted.
        let mut probe = HEADER_PROBE;
        loop {
            if out.len() >= need(&out) {
                return Ok(out);
            }
            let from_here = out.len() as u64 - e.offset;
            if from_here >= e.raw_len {
                break;
            }
            let want = (need(&out) as u64 - e.offset).max(probe as u64);
            let bytes = read_prefix(source, e, usize::try_from(want).unwrap_or(usize::MAX))?;
            if (bytes.len() as u64) <= from_here {
                // The object is shorter than its entry says; hashing will
                // blame it.
                return Err(blame(
                    source,
                    &ExtentPlan::new(m.payload_len, m.max_extent_bytes)
                        .map_err(|x| ObjectFault::plain(x.to_string()))?,
                    m,
                    e.offset + e.raw_len,
                )
                .unwrap_or(ObjectFault::plain("payload ends inside the delta header")));
            }
            out.truncate(e.offset as usize);
            out.extend_from_slice(&bytes);
            probe = probe.saturating_mul(4);
        }
    }
    if out.len() >= need(&out) {
        return Ok(out);
    }
    Err(ObjectFault::plain("payload ends inside the delta header"))
}

/// Verifies the extents covering the first `upto` payload bytes; returns
/// the first damaged one.
pub(crate) fn blame(
    source: &Source,
    plan: &ExtentPlan,
    m: &ManifestV2,
    upto: u64,
) -> Option<ObjectFault> {
    for (i, e) in m.extents.iter().enumerate() {
        if e.offset >= upto.max(1) {
            break;
        }
        let key = keys::object_key(&e.object_digest());
        let stored = match read_all(source, e) {
            Ok(b) => b,
            Err(d) => return Some(d),
        };
        if let Err(w) = verify_extent(plan, i as u64, e, stored) {
            return Some(ObjectFault::of(&key, FaultKind::Corrupt, w));
        }
    }
    None
}

#[cfg(unix)]
pub(crate) fn read_at(f: &File, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    f.read_at(buf, pos)
}

#[cfg(not(unix))]
pub(crate) fn read_at(f: &File, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = f;
    f.seek(SeekFrom::Start(pos))?;
    f.read(buf)
}

/// Verifies one extent's stored bytes (zstd: stored digest, then bounded
/// decompression) against its raw name and returns the raw bytes. The one
/// place the blame pass and the sweep check an extent on its own.
pub(crate) fn verify_extent(
    plan: &ExtentPlan,
    index: u64,
    e: &ExtentEntry,
    stored: bytes::Bytes,
) -> Result<bytes::Bytes, String> {
    let raw = match e.codec {
        ExtentCodec::Raw => stored,
        ExtentCodec::Zstd => bytes::Bytes::from(verify_zstd(e, &stored)?),
    };
    let name = plan.name(index, &raw, false).map_err(|x| x.to_string())?;
    if name != e.raw_digest {
        return Err(format!("extent {index} name {name} != {}", e.raw_digest));
    }
    Ok(raw)
}

/// Checks a zstd extent's stored digest and decompresses it within its
/// declared raw length.
pub(crate) fn verify_zstd(e: &ExtentEntry, stored: &[u8]) -> Result<Vec<u8>, String> {
    let want = e.stored_digest.ok_or("zstd extent without stored digest")?;
    let found = Digest::blake3(stored);
    if found != want {
        return Err(format!("stored digest {found} != {want}"));
    }
    deltapack_format::extent::decompress(stored, e.raw_len).map_err(|x| x.to_string())
}

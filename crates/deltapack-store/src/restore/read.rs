//! Where restored bytes come from, and the one loop that reads them: an
//! extent's raw bytes from local disk (positioned reads) or any backend
//! (streamed or ranged GETs under a permit budget), each piece hashed into
//! the extent's BLAKE3 name and handed to a [`Sink`] while still in cache.
//!
//! Nothing read here is trusted before its extent verified: a wrong name,
//! a short object or a deadline is an `ObjectFault`, blamed only on proof.

use std::fs::File;
use std::io::Read as _;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use deltapack_format::delta;
use deltapack_format::root::ExtentEntry;
use deltapack_format::{Digest, ExtentCodec, ExtentPlan, ManifestV2};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

pub(crate) use crate::fault::{FaultKind, ObjectFault};
use crate::keys;
use crate::object_check::ObjectCheck;
use crate::verify::{check_extent, unpack_zstd};

use super::sink::{Capture, HeaderCheck, Sink, Tee};
pub(crate) use super::tap::Tap;

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
    /// runtime's handle (which must be a multi-thread runtime, or one driven
    /// by another thread).
    Remote(Remote),
}

/// A remote backend as a restore reads it: every raw extent as aligned
/// ranged GETs, fetched concurrently and each verified as its own BLAKE3
/// subtree, so that one connection's bandwidth does not bound an extent.
pub(crate) struct Remote {
    /// The backend.
    pub(crate) store: Arc<dyn ObjectStore>,
    /// The runtime the requests run on.
    pub(crate) handle: tokio::runtime::Handle,
    /// Size of one ranged GET (a power of two, at least 1 KiB).
    pub(crate) range_bytes: u64,
    /// Ranged GETs in flight across every extent of one restore.
    pub(crate) permits: Arc<tokio::sync::Semaphore>,
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
            Source::Remote(_) => in_flight,
        }
    }
}

impl Remote {
    /// Extents to read at once so that their ranges (of an extent of
    /// `extent_len` bytes) fill the budget of ranges in flight: at least
    /// one, at most the budget.
    pub(crate) fn extent_workers(&self, extent_len: u64) -> usize {
        let per_extent = extent_len.div_ceil(self.range_bytes.max(1)).max(1);
        let budget = self.permits.available_permits().max(1) as u64;
        budget.div_ceil(per_extent).clamp(1, budget) as usize
    }
}

/// What one restore pass reads with: where the bytes come from, how many
/// workers, the deadline, and where the bytes read are counted.
#[derive(Clone, Copy)]
pub(crate) struct ReadCtx<'a> {
    /// Where extent bytes come from.
    pub(crate) source: &'a Source,
    /// Worker threads of the pass.
    pub(crate) threads: usize,
    /// Past this instant the pass fails with a deadline fault.
    pub(crate) deadline: Option<Instant>,
    /// What the pass read.
    pub(crate) tally: &'a ReadTally,
    /// Where whole objects the pass verified are handed on (the tier's
    /// fill), if anywhere.
    pub(crate) tap: Option<&'a dyn Tap>,
}

/// One extent of a root: its plan (the root's extent geometry), its index
/// and its manifest entry.
#[derive(Clone, Copy)]
pub(crate) struct ExtentAt<'a> {
    /// The root's extent plan.
    pub(crate) plan: &'a ExtentPlan,
    /// The extent's index in the root.
    pub(crate) index: u64,
    /// Its manifest entry.
    pub(crate) entry: &'a ExtentEntry,
}

/// Objects and bytes one rebuild read from its source, added up by the
/// workers of its passes (a chain reads only part of its extents, so the
/// manifests' sizes would overstate it).
#[derive(Debug, Default)]
pub(crate) struct ReadTally {
    objects: AtomicU64,
    bytes: AtomicU64,
}

impl ReadTally {
    /// Counts one object read, `bytes` of it.
    pub(crate) fn add(&self, bytes: u64) {
        self.objects.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Objects and bytes counted so far.
    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.objects.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

/// Why absorbing an extent stopped.
enum AbsorbError {
    /// The source failed to deliver bytes.
    Read(std::io::Error),
    /// The bytes were wrong (short, wrong name).
    Bad(String),
    /// The bytes hash to this, not to the extent's name.
    Wrong(Digest, String),
    /// The bytes verified, but the delta header the plan was made from
    /// differs from them: the plan, not the object, is at fault.
    Plan(String),
    /// The deadline passed.
    Deadline,
}

/// Hashes and places one extent's raw bytes, pulled from `next` in pieces
/// of `scratch`'s size, checking the delta header bytes the plan was made
/// from.
fn absorb(
    at: ExtentAt<'_>,
    region: &mut dyn Sink,
    header: Option<&[u8]>,
    deadline: Option<Instant>,
    mut next: impl FnMut(&mut [u8]) -> std::io::Result<usize>,
    scratch: &mut [u8],
) -> Result<(), AbsorbError> {
    let ExtentAt {
        plan,
        index,
        entry: e,
    } = at;
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
    }
    let found = h.finish().map_err(|x| AbsorbError::Bad(x.to_string()))?;
    if found != e.raw_digest {
        let what = deltapack_format::Error::DigestMismatch {
            what: format!("extent {index}"),
            expected: e.raw_digest.to_string(),
            found: found.to_string(),
        };
        return Err(AbsorbError::Wrong(found, what.to_string()));
    }
    if header_differs {
        // The extent is what its name says, so the header the plan was
        // made from (read earlier, or taken from the root) is what is wrong.
        return Err(AbsorbError::Plan(
            "the delta header the plan was made from is not the one stored".into(),
        ));
    }
    Ok(())
}

/// Reads one extent from the pass's source through the fused loop into
/// `region`.
pub(crate) fn read_extent(
    ctx: &ReadCtx<'_>,
    at: ExtentAt<'_>,
    region: &mut dyn Sink,
    header: Option<&[u8]>,
    scratch: &mut [u8],
) -> Result<(), ObjectFault> {
    let e = at.entry;
    let key = keys::object_key(&e.object_digest());
    // A raw extent's stored bytes are its raw bytes: a copy of them, as
    // placed, is the object, once the extent verifies.
    let mut tapped = match (ctx.tap, e.codec) {
        (Some(tap), ExtentCodec::Raw)
            if e.stored_len == e.raw_len && e.object_digest() == e.raw_digest =>
        {
            tap.start(&key, e.stored_len)
        }
        _ => None,
    };
    let mut tee;
    let region: &mut dyn Sink = match tapped.as_mut() {
        Some(t) => {
            tee = Tee {
                inner: region,
                buf: &mut t.buf,
                base: e.offset,
            };
            &mut tee
        }
        None => region,
    };
    let read = read_extent_from(ctx, at, &key, region, header, scratch);
    if let (Ok(()), Some(tap), Some(t)) = (&read, ctx.tap, tapped) {
        tap.verified(&key, t);
    }
    read
}

/// [`read_extent`] without the tap.
fn read_extent_from(
    ctx: &ReadCtx<'_>,
    at: ExtentAt<'_>,
    key: &Path,
    region: &mut dyn Sink,
    header: Option<&[u8]>,
    scratch: &mut [u8],
) -> Result<(), ObjectFault> {
    let (source, deadline) = (ctx.source, ctx.deadline);
    let ExtentAt {
        plan,
        index,
        entry: e,
    } = at;
    // Where the bytes come from: a positioned-read closure over a file, or
    // the chunks of a GET body.
    let absorbed = match (source, e.codec) {
        (_, ExtentCodec::Zstd) => {
            let stored = read_all(source, e)?;
            let raw = unpack_zstd(e, &stored).map_err(|c| ObjectFault::failed(key, c))?;
            let mut rest = &raw[..];
            absorb(at, region, header, deadline, |buf| rest.read(buf), scratch)
        }
        (Source::Local(root), ExtentCodec::Raw) => {
            let file = open_local(root, key, e)?;
            let mut pos = 0u64;
            absorb(
                at,
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
        (Source::Remote(remote), ExtentCodec::Raw) => {
            return read_ranges_verified(remote, plan, index, e, region, header, deadline)
        }
    };
    absorbed.map_err(|x| absorb_fault(key, e, x))
}

/// The fault an absorb error of the object at `key` is.
fn absorb_fault(key: &Path, e: &ExtentEntry, x: AbsorbError) -> ObjectFault {
    match x {
        AbsorbError::Deadline => ObjectFault::deadline(),
        AbsorbError::Bad(w) => ObjectFault::of(key, FaultKind::Corrupt, w),
        AbsorbError::Wrong(found, w) => {
            ObjectFault::of(key, FaultKind::Corrupt, w).with_check(ObjectCheck::Name {
                expected: e.raw_digest,
                found,
            })
        }
        AbsorbError::Plan(w) => ObjectFault::plain(format!("{key}: {w}")),
        // A read error (EIO, EACCES, a dropped connection) proves nothing
        // about the bytes at rest: an error, never a quarantine.
        AbsorbError::Read(err) => ObjectFault::io(key, "read", err),
    }
}

/// Reads one raw remote extent as concurrent ranged GETs (its
/// [`ExtentPlan::ranges`]), each taking a permit of the restore's shared
/// budget of ranges in flight. Each range is hashed as its own BLAKE3
/// subtree at its offset while its body's chunks are placed as they arrive
/// (no staging copy); the range names merge into the extent's name, which
/// must be the one the root records before the extent counts as verified.
/// A range name is recorded nowhere, so a wrong extent is re-read whole by
/// the caller (the quarantine rule), not range by range.
pub(crate) fn read_ranges_verified(
    remote: &Remote,
    plan: &ExtentPlan,
    index: u64,
    e: &ExtentEntry,
    region: &mut dyn Sink,
    header: Option<&[u8]>,
    deadline: Option<Instant>,
) -> Result<(), ObjectFault> {
    let key = keys::object_key(&e.object_digest());
    let bad = |w: String| ObjectFault::of(&key, FaultKind::Corrupt, w);
    if plan.range(index) != (e.offset..e.offset + e.raw_len) {
        return Err(bad(format!("extent {index} is not where the plan puts it")));
    }
    let ranges = plan
        .ranges(index, remote.range_bytes)
        .map_err(|x| ObjectFault::plain(x.to_string()))?;
    // The delta header bytes (from payload offset 0) are compared as they
    // are placed.
    let sink = std::cell::RefCell::new(HeaderCheck {
        inner: region,
        header: header.unwrap_or(&[]),
        at: 0,
        differs: false,
    });
    let one = |k: usize, r: std::ops::Range<u64>| {
        let (sink, key) = (&sink, &key);
        async move {
            let mut h = plan
                .range_hasher(index, remote.range_bytes, k as u64)
                .map_err(|x| ObjectFault::plain(x.to_string()))?;
            fetch_range(remote, key, e, r, deadline, |off, bytes| {
                h.update(bytes);
                // The borrow ends before the next await: the ranges of one
                // extent run on this thread, one callback at a time.
                sink.borrow_mut().place(off, bytes);
            })
            .await?;
            let name = h
                .finish()
                .map_err(|x| ObjectFault::of(key, FaultKind::Corrupt, format!("range {k}: {x}")))?;
            Ok::<_, ObjectFault>((k, name))
        }
    };
    let all = futures::stream::iter(ranges.iter().cloned().enumerate())
        .map(|(k, r)| one(k, r))
        .buffer_unordered(ranges.len().max(1))
        .try_collect::<Vec<_>>();
    let mut names = remote.handle.block_on(with_deadline(deadline, all))?;
    names.sort_unstable_by_key(|(k, _)| *k);
    let names: Vec<Digest> = names.into_iter().map(|(_, d)| d).collect();
    let name = plan
        .merge_ranges(index, remote.range_bytes, &names)
        .map_err(|x| ObjectFault::plain(x.to_string()))?;
    if name != e.raw_digest {
        return Err(
            bad(format!("extent {index} name {name} != {}", e.raw_digest)).with_check(
                ObjectCheck::Name {
                    expected: e.raw_digest,
                    found: name,
                },
            ),
        );
    }
    if sink.into_inner().differs {
        // The extent is what its name says, so the header the plan was
        // made from is what is wrong.
        return Err(ObjectFault::plain(format!(
            "{key}: the delta header the plan was made from is not the one stored"
        )));
    }
    Ok(())
}

/// Runs `f`, failing with a deadline fault once `deadline` passes (also
/// while it waits for a permit or a first byte).
async fn with_deadline<T>(
    deadline: Option<Instant>,
    f: impl std::future::Future<Output = Result<T, ObjectFault>>,
) -> Result<T, ObjectFault> {
    match deadline {
        None => f.await,
        Some(d) => tokio::time::timeout_at(tokio::time::Instant::from_std(d), f)
            .await
            .unwrap_or_else(|_| Err(ObjectFault::deadline())),
    }
}

/// One ranged GET of the raw bytes `r` (payload offsets) of a remote
/// extent, under one permit of the restore's budget: `each(offset, bytes)`
/// sees the body's chunks in order. The object's size (from the response
/// metadata, before any body byte) and the range the backend answered
/// must be the ones asked for, and the body exactly that long: a backend
/// that returns too few or too many bytes, or other bytes than asked, is
/// caught here, not by a name that happens to mismatch. Such an answer is
/// the backend's failure (a read error, retried, never a quarantine): it
/// says nothing about the bytes at rest, whose size the metadata vouched
/// for.
async fn fetch_range(
    remote: &Remote,
    key: &Path,
    e: &ExtentEntry,
    r: std::ops::Range<u64>,
    deadline: Option<Instant>,
    mut each: impl FnMut(u64, &Bytes),
) -> Result<(), ObjectFault> {
    if r.start < e.offset || r.end > e.offset + e.raw_len || r.start >= r.end {
        return Err(ObjectFault::plain(format!(
            "{key}: bytes {r:?} are not inside the extent"
        )));
    }
    let _permit = remote
        .permits
        .acquire()
        .await
        .map_err(|_| ObjectFault::plain("the restore's request budget is closed"))?;
    let rel = r.start - e.offset..r.end - e.offset;
    // A range that is the whole object is a plain GET.
    let whole = rel.start == 0 && rel.end == e.stored_len;
    let opts = object_store::GetOptions::default().with_range((!whole).then(|| rel.clone()));
    let got = remote_result(key, e, remote.store.get_opts(key, opts).await)?;
    let protocol = |what: String| ObjectFault::io(key, "read", std::io::Error::other(what));
    if got.range != rel {
        return Err(protocol(format!(
            "asked for bytes {rel:?}, the backend answered {:?}",
            got.range
        )));
    }
    let mut body = got.into_stream();
    let mut off = r.start;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|x| ObjectFault::backend(key, x))?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(ObjectFault::deadline());
        }
        if chunk.len() as u64 > r.end - off {
            return Err(protocol(format!(
                "the read of bytes {rel:?} returned more bytes than asked"
            )));
        }
        each(off, &chunk);
        off += chunk.len() as u64;
    }
    if off < r.end {
        return Err(protocol(format!(
            "the read of bytes {rel:?} ended {} bytes short",
            r.end - off
        )));
    }
    Ok(())
}

/// Reads the raw bytes `range` (payload offsets) of one remote raw extent
/// and places them, **without** checking the extent's name: for a delta
/// chain whose plan came from authenticated roots alone, every placed byte
/// is checked by the result digest instead (`compose`'s deferred mode),
/// and the extent by its name only if that check fails. The range is cut
/// at the extent's [`Remote::range_bytes`] boundaries and the pieces are
/// fetched concurrently (under the restore's shared permits), their
/// bodies' chunks placed as they arrive (no staging copy), and offered to
/// `tap` as unverified parts if there is one.
pub(crate) fn read_range_unverified(
    remote: &Remote,
    e: &ExtentEntry,
    range: std::ops::Range<u64>,
    region: &mut dyn Sink,
    deadline: Option<Instant>,
    tap: Option<&dyn Tap>,
) -> Result<(), ObjectFault> {
    let key = keys::object_key(&e.object_digest());
    // A tiered restore's tap is offered the parts, marked unverified, for
    // the fill to complete and check by name (`tier/staging.rs`).
    let mut capture = tap.map(|tap| Capture {
        inner: &mut *region,
        tap,
        key: &key,
        base: e.offset,
        len: e.stored_len,
    });
    let region: &mut dyn Sink = match capture.as_mut() {
        Some(c) => c,
        None => region,
    };
    if range.start < e.offset || range.end > e.offset + e.raw_len || range.start >= range.end {
        return Err(ObjectFault::plain(format!(
            "{key}: bytes {range:?} are not inside the extent"
        )));
    }
    let step = remote.range_bytes.max(1);
    let mut pieces = Vec::new();
    let mut at = range.start;
    while at < range.end {
        // The next range boundary of the extent after `at`.
        let next = e.offset + ((at - e.offset) / step + 1) * step;
        let end = next.min(range.end);
        pieces.push(at..end);
        at = end;
    }
    let sink = std::cell::RefCell::new(region);
    let all = futures::stream::iter(pieces.iter().cloned())
        .map(|r| {
            let sink = &sink;
            fetch_range(remote, &key, e, r, deadline, move |off, bytes| {
                // The borrow ends before the next await (see
                // `read_ranges_verified`).
                sink.borrow_mut().place_bytes(off, bytes);
            })
        })
        .buffer_unordered(pieces.len().max(1))
        .try_collect::<Vec<()>>();
    remote.handle.block_on(with_deadline(deadline, all))?;
    Ok(())
}

/// Opens a local extent file and checks its size.
pub(crate) fn open_local(root: &FsPath, key: &Path, e: &ExtentEntry) -> Result<File, ObjectFault> {
    let file = match File::open(root.join(key.as_ref())) {
        Ok(f) => f,
        Err(x) if x.kind() == std::io::ErrorKind::NotFound => {
            return Err(ObjectFault::failed(key, ObjectCheck::Missing))
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
        )
        .with_check(ObjectCheck::Size {
            expected: e.stored_len,
            found: size,
        }));
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
        )
        .with_check(ObjectCheck::Size {
            expected: e.stored_len,
            found: g.meta.size,
        })),
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
        Source::Remote(Remote { store, handle, .. }) => {
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
        )
        .with_check(ObjectCheck::Size {
            expected: e.stored_len,
            found: bytes.len() as u64,
        }));
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
            let mut raw = unpack_zstd(e, &stored).map_err(|c| ObjectFault::failed(&key, c))?;
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
        (Source::Remote(Remote { store, handle, .. }), ExtentCodec::Raw) => {
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
        if let Err(c) = check_extent(plan, i as u64, e, stored) {
            let what = match c {
                ObjectCheck::Name { .. } => format!("extent {i} {c}"),
                _ => c.to_string(),
            };
            return Some(ObjectFault::of(&key, c.kind(), what).with_check(c));
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

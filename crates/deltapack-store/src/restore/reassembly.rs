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
//! Two [`Source`](super::read::Source)s feed the same loop:
//!
//! * **Local disk**: extent files are read with positioned reads, with no
//!   `object_store` round trip.
//! * **Any backend**: each worker drives its own GET through the runtime's
//!   handle and pulls the body's chunks as they arrive, so at most one
//!   256 KiB piece per worker is buffered, not a whole 64 MiB object. A
//!   failed read or check is retried once (damage in transit) before the
//!   object is blamed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use deltapack_format::scatter::{self, Region, Span};
use deltapack_format::{Digest, ExtentPlan, ManifestV2, Snapshot};

use super::read::{read_extent, ExtentAt, ReadCtx, PIECE};
pub(crate) use crate::fault::{FaultKind, ObjectFault, Proof};

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
            None => Ok(Dest::Owned(result_buffer(len)?)),
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

/// Fresh result buffers at least this large are prepared for writing
/// before the restore starts (see [`result_buffer`]).
const PREPARE_FRESH: usize = 32 << 20;

/// Whether fresh result buffers are prepared (`DELTAPACK_FRESH_BUFFERS=huge`:
/// transparent huge pages, faulted in ahead in bulk) or left lazy (the
/// default: 4 KiB pages faulted one at a time where the workers first
/// write). Read once.
///
/// Lazy is the default because preparing commits the whole declared
/// result before a single byte of it was read or verified: a root that
/// declares a huge result over missing objects (anyone with write access
/// to an unkeyed store can write one) would commit it all, which the
/// hostile-input tests forbid. `huge` is for a node that trusts its roots
/// (a keyed store) and wants new buffers faster.
fn prepare_fresh_buffers() -> bool {
    static HUGE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HUGE.get_or_init(|| std::env::var("DELTAPACK_FRESH_BUFFERS").is_ok_and(|v| v.trim() == "huge"))
}

/// A zero-filled buffer obtained without touching its pages: the page
/// faults happen where the bytes are first written, spread over the worker
/// threads, and a buffer whose bytes never arrive costs no memory.
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
    // mmap pages that are not touched here.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout);
        if ptr.is_null() {
            return Err(format!("cannot allocate {len} bytes for a restore"));
        }
        Ok(Vec::from_raw_parts(ptr, len, len))
    }
}

/// A v2 restore's result buffer: [`zeroed_buffer`], prepared ahead when
/// `DELTAPACK_FRESH_BUFFERS=huge` and at least [`PREPARE_FRESH`] long.
///
/// A fresh 1.6 GB buffer is ~400,000 4 KiB pages, each faulted in by the
/// kernel at its first write (578 ms against 263 ms for the same restore
/// into a resident buffer). Prepared, it is asked for transparent huge
/// pages (`MADV_HUGEPAGE`: 512× fewer faults) and faulted in ahead on a few
/// threads (`MADV_POPULATE_WRITE`, Linux 5.14+; older kernels fault lazily
/// as before). Lazy huge-page faults alone had been measured slower (1.2–1.5
/// s instead of 0.5 s for a 193 MiB chain restore: faults stalling on
/// compaction in the workers' loop).
pub(crate) fn result_buffer(len: usize) -> Result<Vec<u8>, String> {
    let mut v = zeroed_buffer(len)?;
    if len >= PREPARE_FRESH && prepare_fresh_buffers() {
        prepare_fresh(&mut v);
    }
    Ok(v)
}

/// Asks for huge pages for `buf`'s page-aligned interior and faults it in
/// ahead on up to four threads (see [`zeroed_buffer`]). Failures are
/// ignored: the pages then fault lazily where they are written.
#[cfg(target_os = "linux")]
fn prepare_fresh(buf: &mut [u8]) {
    const PAGE: usize = 4096;
    const HUGE: usize = 2 << 20;
    let base = buf.as_mut_ptr() as usize;
    let start = base.next_multiple_of(PAGE);
    let end = (base + buf.len()) / PAGE * PAGE;
    if end <= start {
        return;
    }
    // SAFETY: `start..end` lies inside `buf`, which this function borrows
    // mutably; MADV_HUGEPAGE changes only how the range is backed, never
    // its contents.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4);
    let per = (end - start).div_ceil(threads).next_multiple_of(HUGE);
    std::thread::scope(|s| {
        let mut at = start;
        while at < end {
            let n = per.min(end - at);
            s.spawn(move || {
                // SAFETY: `at..at+n` lies inside `buf` (borrowed mutably by
                // the enclosing function for the scope's lifetime);
                // MADV_POPULATE_WRITE faults the pages in as a write would,
                // leaving fresh anonymous pages zero.
                unsafe {
                    libc::madvise(at as *mut libc::c_void, n, libc::MADV_POPULATE_WRITE);
                }
            });
            at += n;
        }
    });
}

#[cfg(not(target_os = "linux"))]
fn prepare_fresh(_buf: &mut [u8]) {}

/// Restores a flat v2 root (its payload is the snapshot) from `source` on
/// up to `threads` workers, into `into` (exactly the snapshot's length) or
/// a buffer allocated here. Every extent is verified against its name as it
/// streams in (a failed one is read once more before it is blamed), and the
/// names merge to the payload digest, which for a flat root is the snapshot
/// digest. `Err(damage)` is a miss (or, for [`FaultKind::Io`], an error).
/// Delta roots go through `compose::restore_chain`.
pub(crate) fn restore_flat(
    ctx: ReadCtx<'_>,
    m: &ManifestV2,
    into: Option<&mut [u8]>,
) -> Result<Output, ObjectFault> {
    let threads = ctx.threads;
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
                        let at = ExtentAt {
                            plan: &plan,
                            index: i as u64,
                            entry: e,
                        };
                        match read_extent(&ctx, at, &mut region, None, &mut scratch) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh buffer large enough to be prepared (huge pages, faulted in
    /// ahead) is all zeros, exactly as long as asked, and writable end to
    /// end; an odd length and a small one too.
    #[test]
    fn fresh_buffers_are_zeroed_whatever_their_preparation() {
        for len in [PREPARE_FRESH + 4097, PREPARE_FRESH, 4096 * 3 + 1, 1] {
            let mut v = zeroed_buffer(len).expect("buffer");
            prepare_fresh(&mut v);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|b| *b == 0), "{len} bytes not zero");
            v.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            assert!(v.iter().enumerate().all(|(i, b)| *b == i as u8));
        }
        assert!(zeroed_buffer(0).expect("empty").is_empty());
        assert!(result_buffer(0).expect("empty").is_empty());
    }
}

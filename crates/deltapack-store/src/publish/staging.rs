//! Staging: the one place a publication's object bytes are captured.
//!
//! **The naming rule.** An object's name is the hash of the bytes written
//! under it. A publication's input is memory deltapack does not own — a
//! caller's buffer, a file — which can change while the call runs. If an
//! extent were hashed from the input and then written from the input
//! again, a change in between would store bytes under the name of other
//! bytes, and every later publication that reuses the name would inherit
//! the damage. So each object's bytes are first copied into a staging
//! buffer that only this publication holds; the name is computed from the
//! staged bytes and the object is written from them. Nothing can change
//! the staged bytes between hashing and writing.
//!
//! Staging buffers are page-aligned (the local backend writes them with
//! direct I/O as they are, without its own bounce copy), and reused: a
//! fresh buffer pays a page fault per 4 KiB on every publication, a pooled
//! one does not. At most [`KEEP`] idle buffers are kept.
//!
//! Memory: a staged object lives from its copy until its write completed.
//! A publication has at most `2 × writers + 1` staged extents (prepared and
//! queued, being written, being prepared; see `write.rs`), each at most
//! `max_extent_bytes`.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Mutex;

use bytes::Bytes;

/// Alignment of staging buffers (direct I/O needs the logical block size;
/// a page covers every device deltapack supports).
pub(crate) const STAGING_ALIGN: usize = 4096;

/// Most idle staging buffers kept for reuse.
const KEEP: usize = 4;

/// Idle staging buffers.
static POOL: Mutex<Vec<Buffer>> = Mutex::new(Vec::new());

/// An aligned heap allocation of `cap` bytes.
struct Buffer {
    ptr: NonNull<u8>,
    cap: usize,
}

// SAFETY: a `Buffer` owns its allocation exclusively (like a `Box<[u8]>`);
// moving it to another thread moves that ownership.
unsafe impl Send for Buffer {}

impl Buffer {
    fn layout(cap: usize) -> Option<Layout> {
        Layout::from_size_align(cap, STAGING_ALIGN).ok()
    }

    /// A buffer of at least `len` (> 0) bytes: the smallest idle one that
    /// fits, or a new one rounded up to the alignment.
    fn take(len: usize) -> std::io::Result<Buffer> {
        let pooled = POOL.lock().ok().and_then(|mut p| {
            let i = p
                .iter()
                .enumerate()
                .filter(|(_, b)| b.cap >= len)
                .min_by_key(|(_, b)| b.cap)
                .map(|(i, _)| i)?;
            Some(p.swap_remove(i))
        });
        if let Some(b) = pooled {
            return Ok(b);
        }
        let cap = len.div_ceil(STAGING_ALIGN) * STAGING_ALIGN;
        let layout = Self::layout(cap)
            .ok_or_else(|| std::io::Error::other(format!("cannot stage {len} bytes")))?;
        // Zeroed, so every byte is initialised before any slice of it is
        // made (pooled buffers were written before). A large zeroed
        // allocation is fresh mapped memory: the zeroing costs nothing
        // beyond the page faults the first copy into it pays anyway.
        // SAFETY: `layout` has a non-zero size (`len` > 0, rounded up).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(ptr)
            .map(|ptr| Buffer { ptr, cap })
            .ok_or_else(|| std::io::Error::other(format!("cannot allocate {cap} staging bytes")))
    }

    /// Back to the pool, or freed when the pool is full (a larger buffer
    /// replaces the smallest idle one, so large extents keep finding room).
    fn give_back(self) {
        let Ok(mut p) = POOL.lock() else {
            return;
        };
        if p.len() < KEEP {
            p.push(self);
        } else if let Some(small) = p.iter_mut().min_by_key(|x| x.cap) {
            if small.cap < self.cap {
                *small = self;
            }
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(layout) = Self::layout(self.cap) {
            // SAFETY: allocated in `take` with exactly this layout, owned
            // only by this value, never used after this.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

/// Staged bytes: the first `len` bytes of a buffer, all written by
/// [`stage`] before anyone could read them. Returned to the pool when the
/// last `Bytes` referring to them is dropped.
struct Staged {
    buf: Option<Buffer>,
    len: usize,
}

impl AsRef<[u8]> for Staged {
    fn as_ref(&self) -> &[u8] {
        match &self.buf {
            // SAFETY: the buffer holds at least `len` initialised bytes
            // (`stage_with`); it is owned by this value and only read from
            // now on (a `Bytes` gives out shared slices only).
            Some(b) => unsafe { std::slice::from_raw_parts(b.ptr.as_ptr(), self.len) },
            None => &[],
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            b.give_back();
        }
    }
}

/// Copies `parts` (in order) into a staging buffer only this call holds;
/// the returned `Bytes` is the one copy every later step hashes and writes.
pub(crate) fn stage(parts: &[Bytes]) -> std::io::Result<Bytes> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    stage_with(len, |dest| {
        let mut at = 0;
        for p in parts {
            dest[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
    })
}

/// A staging buffer of `len` bytes, filled by `fill` (which must write
/// every byte: e.g. a `pread` of exactly `len`; a caller whose fill failed
/// drops the result), then frozen as the one copy every later step hashes
/// and writes.
pub(crate) fn stage_with(len: usize, fill: impl FnOnce(&mut [u8])) -> std::io::Result<Bytes> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    let buf = Buffer::take(len)?;
    // SAFETY: the buffer holds at least `len` initialised bytes (zeroed
    // when allocated, written before when pooled) and is exclusively ours:
    // a pooled buffer is idle, referred to by nothing else, so nothing the
    // fill reads from overlaps it.
    let dest = unsafe { std::slice::from_raw_parts_mut(buf.ptr.as_ptr(), len) };
    fill(dest);
    Ok(Bytes::from_owner(Staged {
        buf: Some(buf),
        len,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_bytes_are_an_aligned_copy_that_later_changes_do_not_reach() {
        let mut input = vec![7u8; 10_000];
        let parts = vec![
            Bytes::copy_from_slice(&input[..3]),
            Bytes::new(),
            Bytes::copy_from_slice(&input[3..]),
        ];
        let staged = stage(&parts).expect("stage");
        assert_eq!(staged.as_ptr() as usize % STAGING_ALIGN, 0);
        assert_eq!(&staged[..], &input[..]);
        input.fill(9);
        drop(parts);
        assert!(staged.iter().all(|&b| b == 7));
        // A reused buffer holds the new bytes exactly (no stale tail).
        drop(staged);
        let again = stage(&[Bytes::from_static(b"abc")]).expect("stage");
        assert_eq!(&again[..], b"abc");
        assert!(stage(&[]).expect("empty").is_empty());
    }
}

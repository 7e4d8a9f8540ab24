//! Fresh result buffers: zeroed memory that costs little at its first write.
//!
//! A restore that allocates its result (`Store::restore`, hence the CLI and
//! Python's `restore`) writes every byte of a buffer nobody touched before.
//! On Linux a large allocation is fresh anonymous memory; left alone, the
//! kernel faults it in one 4 KiB page at a time where it is first written —
//! ~400,000 faults for a 1.6 GB snapshot, which made a restore into a new
//! buffer take 2.2× as long as the same restore into a resident one.
//!
//! [`fresh_buffer`] asks for transparent huge pages for the buffer
//! (`madvise(MADV_HUGEPAGE)`), and nothing else: the pages are still faulted
//! in lazily, where and when the workers first write them, but 2 MiB at a
//! time — 512× fewer faults, and the zeroing of each fault is spread over
//! the threads that write. Nothing is committed ahead: a root that declares
//! a huge result over objects that never arrive (anyone with write access to
//! an unkeyed store can write one) costs no memory, exactly as with small
//! pages. Faulting ahead in bulk (`MADV_POPULATE_WRITE`) was measured too,
//! and was no faster than huge pages faulted where written while it commits
//! the declared size before a byte is verified, so it is not offered.
//!
//! The cost is the kernel's: with `defrag` set to `madvise` (the usual
//! default), a huge-page fault may compact memory when no free 2 MiB page is
//! at hand, and a node whose memory is badly fragmented can see such a fault
//! stall. `DELTAPACK_FRESH_BUFFERS=small` (read once per process) turns the
//! advice off; the buffers are then plain lazily zeroed memory. Elsewhere
//! than Linux the advice does not exist and buffers are always plain.

use std::sync::OnceLock;

/// Buffers shorter than this are not advised: a huge page is 2 MiB, and a
/// small result is not worth one.
const ADVISE_FROM: usize = 32 << 20;

/// The page-backing policy of fresh buffers, from `DELTAPACK_FRESH_BUFFERS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backing {
    /// Transparent huge pages, faulted in where written (the default).
    Huge,
    /// The kernel's default pages (`small`).
    Small,
}

fn backing() -> Backing {
    static BACKING: OnceLock<Backing> = OnceLock::new();
    *BACKING.get_or_init(|| match std::env::var("DELTAPACK_FRESH_BUFFERS") {
        Err(_) => Backing::Huge,
        Ok(v) => match v.trim() {
            "" | "huge" => Backing::Huge,
            "small" => Backing::Small,
            other => {
                tracing::warn!(
                    value = other,
                    "DELTAPACK_FRESH_BUFFERS is neither `huge` nor `small`; using `huge`"
                );
                Backing::Huge
            }
        },
    })
}

/// A zero-filled buffer of `len` bytes for a restore to write, cheap to
/// fault in (see the [module docs](self)): what `Store::restore` allocates
/// its result in, and what a caller should allocate a new buffer for
/// [`Store::restore_into`](crate::Store::restore_into) or the layer-wise
/// restore with.
///
/// No page is touched here: memory is committed where the buffer is
/// written. Fails only when the allocator cannot reserve `len` bytes
/// ([`std::io::ErrorKind::OutOfMemory`]).
pub fn fresh_buffer(len: usize) -> std::io::Result<Vec<u8>> {
    let mut v = zeroed(len)?;
    if len >= ADVISE_FROM && backing() == Backing::Huge {
        advise_huge(&mut v);
    }
    Ok(v)
}

/// A zero-filled buffer obtained without touching its pages.
fn zeroed(len: usize) -> std::io::Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let oom = |what: String| std::io::Error::new(std::io::ErrorKind::OutOfMemory, what);
    let layout = std::alloc::Layout::array::<u8>(len)
        .map_err(|e| oom(format!("cannot allocate {len} bytes: {e}")))?;
    // SAFETY: `layout` has non-zero size. `alloc_zeroed` returns either null
    // (handled) or a zero-initialised block of exactly `len` bytes from the
    // global allocator, which is what `Vec::from_raw_parts` requires for a
    // `Vec<u8>` of length and capacity `len`. Large blocks come from fresh
    // mmap pages that are not touched here.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout);
        if ptr.is_null() {
            return Err(oom(format!("cannot allocate {len} bytes for a restore")));
        }
        Ok(Vec::from_raw_parts(ptr, len, len))
    }
}

/// Asks for transparent huge pages for `buf`'s page-aligned interior.
/// A refusal (a kernel without THP, a range it will not advise) is ignored:
/// the pages are then the kernel's default ones.
#[cfg(target_os = "linux")]
fn advise_huge(buf: &mut [u8]) {
    const PAGE: usize = 4096;
    let base = buf.as_mut_ptr() as usize;
    let start = base.next_multiple_of(PAGE);
    let end = (base + buf.len()) / PAGE * PAGE;
    if end <= start {
        return;
    }
    // SAFETY: `start..end` lies inside `buf`, which this function borrows
    // mutably; MADV_HUGEPAGE changes only how the range will be backed when
    // it is faulted in, never its contents.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "MADV_HUGEPAGE refused; the buffer keeps small pages"
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_buf: &mut [u8]) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh buffer, advised or not, is all zeros, exactly as long as
    /// asked and writable end to end; odd, small and empty lengths too.
    #[test]
    fn fresh_buffers_are_zeroed_whatever_their_backing() {
        for len in [ADVISE_FROM + 4097, ADVISE_FROM, 4096 * 3 + 1, 1] {
            let mut v = fresh_buffer(len).expect("buffer");
            advise_huge(&mut v);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|b| *b == 0), "{len} bytes not zero");
            v.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            assert!(v.iter().enumerate().all(|(i, b)| *b == i as u8));
        }
        assert!(fresh_buffer(0).expect("empty").is_empty());
    }

    /// An impossible size is an out-of-memory error, not a panic or an abort.
    #[test]
    fn an_impossible_size_is_an_error() {
        let e = fresh_buffer(usize::MAX).expect_err("usize::MAX bytes");
        assert_eq!(e.kind(), std::io::ErrorKind::OutOfMemory);
    }
}

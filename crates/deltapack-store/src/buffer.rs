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
//! (`madvise(MADV_HUGEPAGE)`) where that pays (below), and nothing else: the pages are still faulted
//! in lazily, where and when the workers first write them, but 2 MiB at a
//! time — 512× fewer faults, and the zeroing of each fault is spread over
//! the threads that write. Nothing is committed ahead: a root that declares
//! a huge result over objects that never arrive (anyone with write access to
//! an unkeyed store can write one) costs no memory, exactly as with small
//! pages. Faulting ahead in bulk (`MADV_POPULATE_WRITE`) was measured too,
//! and was no faster than huge pages faulted where written while it commits
//! the declared size before a byte is verified, so it is not offered.
//!
//! Where that is a bad trade, the advice is not given. Under a hypervisor
//! that takes free memory back (a virtio balloon with *free page
//! reporting*, as on Firecracker-style VMs), the guest reports every free
//! 2 MiB block to the host, which drops its backing; a huge-page fault then
//! takes exactly such a block and the host must back all of it before the
//! guest can zero it. Measured on such a VM (2 cores, 1.5 GiB written once,
//! after 15 s idle): 4.5 s with huge pages against 1.0 s with small ones,
//! whose free lists hold recently freed, still-backed pages first; with the
//! memory still backed (freed a moment before), 0.26 s against 0.69 s. So
//! the default, `auto`, advises huge pages unless such a balloon device is
//! bound (its feature bit 5, `VIRTIO_BALLOON_F_PAGE_REPORTING`, read once
//! from sysfs). Bare metal, and a VM whose memory is pinned (as it is for a
//! passed-through GPU), reports nothing and gets huge pages.
//! `DELTAPACK_FRESH_BUFFERS` (read once per process) overrides the choice:
//! `huge` always advises, `small` never does (also the answer for a node
//! whose memory is so fragmented that huge-page faults must compact it,
//! which with THP `defrag` at `madvise`, the usual setting, they may).
//! [`fresh_backing`] tells which is in force. Elsewhere than Linux the
//! advice does not exist and buffers are always plain.

use std::sync::OnceLock;

/// Buffers shorter than this are not advised: a huge page is 2 MiB, and a
/// small result is not worth one.
const ADVISE_FROM: usize = 32 << 20;

/// How fresh buffers are backed: the policy in force in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreshBacking {
    /// Transparent huge pages, faulted in where written.
    Huge,
    /// The kernel's default pages.
    Small,
}

/// Why the policy in force was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreshBackingReason {
    /// `DELTAPACK_FRESH_BUFFERS` named it.
    Configured,
    /// `auto` (the default): no hypervisor takes free memory back.
    NoPageReporting,
    /// `auto` (the default): a virtio balloon reports free pages to the
    /// host, so huge pages would come back unbacked.
    PageReporting,
}

/// The backing of the buffers [`fresh_buffer`] allocates in this process,
/// and why: from `DELTAPACK_FRESH_BUFFERS` (`huge`, `small`, or `auto`, the
/// default; anything else is `auto` with a warning), decided once.
pub fn fresh_backing() -> (FreshBacking, FreshBackingReason) {
    static BACKING: OnceLock<(FreshBacking, FreshBackingReason)> = OnceLock::new();
    *BACKING.get_or_init(|| {
        let value = std::env::var("DELTAPACK_FRESH_BUFFERS").unwrap_or_default();
        let chosen = match value.trim() {
            "huge" => (FreshBacking::Huge, FreshBackingReason::Configured),
            "small" => (FreshBacking::Small, FreshBackingReason::Configured),
            other => {
                if !other.is_empty() && other != "auto" {
                    tracing::warn!(
                        value = other,
                        "DELTAPACK_FRESH_BUFFERS is none of `auto`, `huge`, `small`; using `auto`"
                    );
                }
                if free_pages_reported(std::path::Path::new("/")) {
                    (FreshBacking::Small, FreshBackingReason::PageReporting)
                } else {
                    (FreshBacking::Huge, FreshBackingReason::NoPageReporting)
                }
            }
        };
        tracing::debug!(backing = ?chosen.0, reason = ?chosen.1, "fresh result buffers");
        chosen
    })
}

/// Whether a virtio balloon device bound under the sysfs tree at `root`
/// negotiated free page reporting (feature bit 5 of its `features` file, a
/// string of `0`/`1` with bit 0 first). Anything unreadable counts as no.
fn free_pages_reported(root: &std::path::Path) -> bool {
    const PAGE_REPORTING: usize = 5;
    let driver = root.join("sys/bus/virtio/drivers/virtio_balloon");
    let Ok(entries) = std::fs::read_dir(driver) else {
        return false;
    };
    entries.flatten().any(|e| {
        e.file_name().to_string_lossy().starts_with("virtio")
            && std::fs::read_to_string(e.path().join("features"))
                .is_ok_and(|f| f.as_bytes().get(PAGE_REPORTING) == Some(&b'1'))
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
    if len >= ADVISE_FROM && fresh_backing().0 == FreshBacking::Huge {
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

    /// Page reporting is read from a balloon device's feature bits: bit 5
    /// set is reporting, clear or no balloon bound (or no virtio at all) is
    /// not. The files are real files laid out as sysfs lays them out.
    #[test]
    fn page_reporting_is_feature_bit_five_of_a_bound_balloon() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        assert!(!free_pages_reported(root), "no virtio at all");
        let driver = root.join("sys/bus/virtio/drivers/virtio_balloon");
        std::fs::create_dir_all(&driver).expect("driver dir");
        // Files the driver directory holds besides its devices.
        std::fs::write(driver.join("bind"), "").expect("bind");
        assert!(!free_pages_reported(root), "no device bound");
        let dev = driver.join("virtio0");
        std::fs::create_dir_all(&dev).expect("device dir");
        // The feature string of the VM this was measured on (bits 1, 2, 5, 7
        // and 32), and the same without bit 5.
        let with = "0110010100000000000000000000000010000000000000000000000000000000\n";
        let without = "0110000100000000000000000000000010000000000000000000000000000000\n";
        std::fs::write(dev.join("features"), without).expect("features");
        assert!(!free_pages_reported(root), "bit 5 clear");
        std::fs::write(dev.join("features"), with).expect("features");
        assert!(free_pages_reported(root), "bit 5 set");
        std::fs::write(dev.join("features"), "0110").expect("features");
        assert!(!free_pages_reported(root), "a truncated feature string");
    }

    /// An impossible size is an out-of-memory error, not a panic or an abort.
    #[test]
    fn an_impossible_size_is_an_error() {
        let e = fresh_buffer(usize::MAX).expect_err("usize::MAX bytes");
        assert_eq!(e.kind(), std::io::ErrorKind::OutOfMemory);
    }
}

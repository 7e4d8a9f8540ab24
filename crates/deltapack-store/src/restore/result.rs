//! The result of a composed restore while workers fill it: the buffer they
//! share ([`SharedDest`], disjoint writes without locks) and its in-loop
//! hash ([`ResultHash`], each block hashed by the worker that completed it).
//!
//! A block is read for hashing only after its last byte was written; the
//! hash is the one the root's snapshot digest is checked against.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use deltapack_format::{Digest, ExtentPlan, SnapshotHeader};

use super::read::{ObjectFault, RESULT_BLOCK};

/// The result buffer shared by the workers of one pass.
///
/// Workers only write ranges the composed plan gave to their work item (the
/// plan's pieces tile the result exactly once, and every piece belongs to
/// exactly one item), and a result block is read for hashing only after its
/// counter of unwritten bytes reached zero, which no later write can follow.
pub(super) struct SharedDest {
    ptr: *mut u8,
    len: u64,
}

// SAFETY: the pointer is only used under the disjointness rules above; the
// buffer outlives the scoped worker threads that use it.
unsafe impl Send for SharedDest {}
// SAFETY: as above.
unsafe impl Sync for SharedDest {}

impl SharedDest {
    /// Shares `bytes` with the workers of one pass (under the rules above).
    pub(super) fn new(bytes: &mut [u8]) -> Self {
        SharedDest {
            ptr: bytes.as_mut_ptr(),
            len: bytes.len() as u64,
        }
    }

    /// Shares the `len` bytes at `ptr` with the workers of one pass.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes while the value is
    /// used, and accessed only under the rules above.
    pub(super) unsafe fn from_raw(ptr: *mut u8, len: usize) -> Self {
        SharedDest {
            ptr,
            len: len as u64,
        }
    }

    /// The buffer's length.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Copies `bytes` to offset `at`.
    ///
    /// # Safety
    /// No other thread may access `at..at + bytes.len()` during the call.
    pub(super) unsafe fn write(&self, at: u64, bytes: &[u8]) {
        let end = at.checked_add(bytes.len() as u64);
        assert!(end.is_some_and(|e| e <= self.len), "write out of bounds");
        // SAFETY: in bounds (checked above); exclusive by the caller's
        // contract; `bytes` cannot overlap the result (it is a scratch
        // buffer or another snapshot).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(at as usize), bytes.len())
        }
    }

    /// The bytes of `r`, for writing in place.
    ///
    /// # Safety
    /// No other thread may access `r` while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn slice_mut(&self, r: Range<u64>) -> &mut [u8] {
        assert!(r.start <= r.end && r.end <= self.len, "write out of bounds");
        // SAFETY: in bounds (checked above); exclusive by the caller's
        // contract.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr.add(r.start as usize),
                (r.end - r.start) as usize,
            )
        }
    }

    /// The bytes of `r`.
    ///
    /// # Safety
    /// No thread may write `r` while the returned slice lives.
    pub(super) unsafe fn read(&self, r: Range<u64>) -> &[u8] {
        assert!(r.start <= r.end && r.end <= self.len, "read out of bounds");
        // SAFETY: in bounds (checked above); no concurrent writer by the
        // caller's contract.
        unsafe {
            std::slice::from_raw_parts(self.ptr.add(r.start as usize), (r.end - r.start) as usize)
        }
    }
}

/// The in-loop hash of the result: unwritten bytes per block; the worker
/// whose write completes a block hashes it. Blocks are subtrees of the
/// whole encoding's BLAKE3 tree for a `blake3:` result digest, and of each
/// (group, layer) stream's tree for a layered (`blake3-layers:`) one; either
/// way every byte is hashed once, on whichever core completed its block.
pub(super) struct ResultHash {
    kind: HashKind,
    remaining: Vec<AtomicU64>,
}

pub(super) enum HashKind {
    Whole(ExtentPlan),
    Layers {
        plan: deltapack_format::layer_digest::LayerHashPlan,
        prefix_len: u64,
    },
}

impl ResultHash {
    pub(super) fn new(
        result_len: u64,
        extent_bytes: u64,
        want: &Digest,
        header: &SnapshotHeader,
        prefix_len: u64,
    ) -> Result<Self, ObjectFault> {
        let block =
            (extent_bytes / 4).clamp(deltapack_format::extent::MIN_EXTENT_BYTES, RESULT_BLOCK);
        let fault = |e: deltapack_format::Error| ObjectFault::plain(e.to_string());
        let (kind, sizes): (HashKind, Vec<u64>) = match want.algorithm() {
            deltapack_format::Algorithm::Blake3Layers => {
                let plan =
                    deltapack_format::layer_digest::LayerHashPlan::new(header, prefix_len, block)
                        .map_err(fault)?;
                let sizes = plan
                    .blocks()
                    .iter()
                    .map(|b| b.range.1 - b.range.0)
                    .collect();
                (HashKind::Layers { plan, prefix_len }, sizes)
            }
            _ => {
                let plan = ExtentPlan::new(result_len, block).map_err(fault)?;
                let sizes = (0..plan.count())
                    .map(|b| {
                        let r = plan.range(b);
                        r.end - r.start
                    })
                    .collect();
                (HashKind::Whole(plan), sizes)
            }
        };
        let remaining = sizes.into_iter().map(AtomicU64::new).collect();
        Ok(ResultHash { kind, remaining })
    }

    /// Block `b`'s range in the result.
    pub(super) fn range(&self, b: usize) -> Range<u64> {
        match &self.kind {
            HashKind::Whole(plan) => plan.range(b as u64),
            HashKind::Layers { plan, .. } => {
                let r = plan.blocks()[b].range;
                r.0..r.1
            }
        }
    }

    /// Hashes block `b` from its bytes.
    pub(super) fn hash(&self, b: usize, bytes: &[u8]) -> Result<Digest, String> {
        match &self.kind {
            HashKind::Whole(plan) => {
                let mut h = plan.hasher(b as u64);
                h.update(bytes);
                h.finish().map_err(|e| e.to_string())
            }
            HashKind::Layers { plan, .. } => plan
                .hash_block(b, bytes)
                .map(|cv| Digest::new(deltapack_format::Algorithm::Blake3, cv))
                .map_err(|e| e.to_string()),
        }
    }

    /// The blocks `dst..dst+len` overlaps.
    pub(super) fn blocks_in(&self, dst: u64, len: u64) -> Range<usize> {
        match &self.kind {
            HashKind::Whole(plan) => {
                let bsize = plan.max_extent_bytes();
                let last = ((dst + len - 1) / bsize + 1).min(self.remaining.len() as u64);
                (dst / bsize) as usize..last as usize
            }
            HashKind::Layers { plan, .. } => plan.blocks_in(dst, dst + len),
        }
    }

    /// Counts `dst..dst+len` as written; hashes (into `done`) every block
    /// this completes.
    pub(super) fn wrote(
        &self,
        dest: &SharedDest,
        dst: u64,
        len: u64,
        done: &mut Vec<(u64, Digest)>,
    ) {
        if len == 0 {
            return;
        }
        for b in self.blocks_in(dst, len) {
            let r = self.range(b);
            let lo = dst.max(r.start);
            let hi = (dst + len).min(r.end);
            if hi <= lo {
                continue;
            }
            let n = hi - lo;
            let Some(slot) = self.remaining.get(b) else {
                continue;
            };
            if slot.fetch_sub(n, Ordering::AcqRel) == n {
                // SAFETY: every byte of the block is written (the counter
                // reached zero, and AcqRel makes those writes visible), and
                // no byte is written twice in a pass.
                let bytes = unsafe { dest.read(r) };
                if let Ok(d) = self.hash(b, bytes) {
                    done.push((b as u64, d));
                }
            }
        }
    }

    /// Merges the block names (hashing any block the loop did not) into the
    /// result digest.
    pub(super) fn finish(
        &self,
        dest: &SharedDest,
        done: Vec<(u64, Digest)>,
    ) -> Result<Digest, String> {
        let mut names: Vec<Option<Digest>> = vec![None; self.remaining.len()];
        for (b, d) in done {
            if let Some(slot) = names.get_mut(b as usize) {
                *slot = Some(d);
            }
        }
        let names = names
            .into_iter()
            .enumerate()
            .map(|(b, name)| match name {
                Some(d) => Ok(d),
                None => {
                    // SAFETY: the workers have all finished.
                    let bytes = unsafe { dest.read(self.range(b)) };
                    self.hash(b, bytes)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        match &self.kind {
            HashKind::Whole(plan) => plan.merge(&names).map_err(|e| e.to_string()),
            HashKind::Layers { plan, prefix_len } => {
                // SAFETY: the workers have all finished.
                let prefix = unsafe { dest.read(0..*prefix_len) };
                let cvs: Vec<[u8; 32]> = names.iter().map(|d| *d.as_bytes()).collect();
                plan.finish(prefix, &cvs).map_err(|e| e.to_string())
            }
        }
    }
}

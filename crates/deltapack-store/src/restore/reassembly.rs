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
            None => Ok(Dest::Owned(
                crate::buffer::fresh_buffer(len).map_err(|e| e.to_string())?,
            )),
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

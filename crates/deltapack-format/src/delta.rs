//! The `page-tail-cow-v1` page delta.
//!
//! A delta describes a *result* snapshot relative to a *base* snapshot with
//! the same layout and a smaller boundary. For every group, the longest prefix
//! of pages that is byte-identical in every layer (never beyond either page
//! count) is *reused* from the base; all later pages of the result are the
//! *tail* and are stored. A page that contains the base boundary is therefore
//! replaced whole unless it happens to be identical; a recurrent group always
//! stores its (single) checkpoint page.
//!
//! ```text
//! offset  size  field
//! 0       8     magic "DPDELTA\x01"
//! 8       4     header_len, u32 little endian (≤ MAX_DELTA_HEADER)
//! 12      h     header: CBOR map (DeltaHeader)
//! 12+h    t     tails: for each group, for each layer, pages reused..result_count
//! ```
//!
//! The header binds the base and result snapshot digests, both boundaries
//! and both block counts. Reconstruction is a list of [`CopyOp`]s into the
//! result encoding (reused spans from the base payload, tail spans from the
//! delta), so a reader can place verified delta bytes into the result buffer
//! as they stream in without holding a separate copy of the delta. The result
//! is only valid once its digest matches `result_digest`.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::frame::{self, Framing};
use crate::layout::{GroupKind, PageLayout};
use crate::snapshot::{digest_of_encoding, Snapshot, SnapshotHeader};

/// Schema string of this delta format.
pub const DELTA_SCHEMA: &str = "page-tail-cow-v1";
/// Magic bytes of an encoded delta.
pub const DELTA_MAGIC: [u8; 8] = *b"DPDELTA\x01";
/// Largest accepted delta header (CBOR).
pub const MAX_DELTA_HEADER: u32 = 1 << 20;
/// Bytes before the CBOR header.
pub const DELTA_PREFIX_LEN: usize = frame::PREFIX_LEN;

/// The header of an encoded page delta.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeltaHeader {
    /// Always [`DELTA_SCHEMA`].
    pub schema: String,
    /// Admission geometry both boundaries are multiples of.
    pub chunk_tokens: u32,
    /// Snapshot digest of the base.
    pub base_digest: Digest,
    /// Snapshot digest of the result.
    pub result_digest: Digest,
    /// Base boundary (tokens).
    pub base_boundary: u64,
    /// Result boundary (tokens), greater than the base boundary.
    pub result_boundary: u64,
    /// Base pages per group.
    pub base_block_counts: Vec<u64>,
    /// Result pages per group.
    pub result_block_counts: Vec<u64>,
    /// Pages reused from the base, per group.
    pub reused_pages: Vec<u64>,
}

/// One step of reconstructing the result encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyOp {
    /// Copy `len` bytes from the base *payload* at `src` to the result
    /// encoding at `dst`.
    Base {
        /// Offset in the base payload.
        src: u64,
        /// Offset in the result encoding.
        dst: u64,
        /// Bytes.
        len: u64,
    },
    /// Copy `len` bytes from the delta *encoding* at `src` to the result
    /// encoding at `dst`.
    Delta {
        /// Offset in the delta encoding.
        src: u64,
        /// Offset in the result encoding.
        dst: u64,
        /// Bytes.
        len: u64,
    },
}

/// A decoded delta header together with its reconstruction plan against a
/// specific base.
#[derive(Debug, Clone)]
pub struct PageDelta {
    /// The header.
    pub header: DeltaHeader,
    /// Total length of the delta encoding implied by the header.
    pub delta_len: u64,
    /// The result snapshot's header.
    pub result_header: SnapshotHeader,
    /// The result's magic + length + CBOR header (written first).
    pub result_prefix: Vec<u8>,
    /// Length of the whole result encoding.
    pub result_len: u64,
    /// Copy steps, in increasing `dst` order, covering the result payload.
    pub ops: Vec<CopyOp>,
}

fn check_boundary(what: &str, b: u64, chunk_tokens: u32) -> Result<()> {
    if chunk_tokens == 0 || b % u64::from(chunk_tokens) != 0 {
        return Err(Error::Invalid(format!(
            "{what} boundary {b} is not a multiple of chunk_tokens {chunk_tokens}"
        )));
    }
    Ok(())
}

/// Pages reused per group: the longest prefix identical in every layer.
fn reused_pages(base: &Snapshot, result: &Snapshot) -> Vec<u64> {
    let layout = base.layout();
    layout
        .groups
        .iter()
        .enumerate()
        .map(|(gi, g)| {
            if g.kind == GroupKind::Recurrent {
                return 0;
            }
            let limit = base.block_counts()[gi].min(result.block_counts()[gi]);
            let mut reused = limit;
            for (li, l) in g.layers.iter().enumerate() {
                let bpp = l.bytes_per_page as usize;
                let (Some(br), Some(rr)) = (base.layer_range(gi, li), result.layer_range(gi, li))
                else {
                    return 0;
                };
                let b = &base.payload()[br];
                let r = &result.payload()[rr];
                let mut k = 0u64;
                while k < reused {
                    let s = k as usize * bpp;
                    if b[s..s + bpp] != r[s..s + bpp] {
                        break;
                    }
                    k += 1;
                }
                reused = reused.min(k);
            }
            reused
        })
        .collect()
}

/// A delta described without materialising it: its header, then ranges of
/// the result's *encoding* (the page tails) in payload order. The payload is
/// `header_bytes()` followed by those ranges; a publisher streams it into
/// extents straight from the result snapshot (see `deltapack-store`'s
/// publication) instead of copying ~all of the result into a new buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaLayout {
    /// The header (its digests are whatever the caller supplied).
    pub header: DeltaHeader,
    /// Ranges of `result.encoded()` that follow the header, in order.
    pub tails: Vec<Range<usize>>,
}

impl DeltaLayout {
    /// Lays out the delta from `base` to `result`, given both snapshots'
    /// digests (the caller computes them once; nothing is hashed here).
    ///
    /// Rejects mismatching layouts, a result boundary not above the base
    /// boundary, and boundaries that are not multiples of `chunk_tokens`.
    pub fn new(
        chunk_tokens: u32,
        base: &Snapshot,
        result: &Snapshot,
        base_digest: Digest,
        result_digest: Digest,
    ) -> Result<Self> {
        if base.layout() != result.layout() {
            return Err(Error::Invalid("base and result layouts differ".into()));
        }
        check_boundary("base", base.boundary(), chunk_tokens)?;
        check_boundary("result", result.boundary(), chunk_tokens)?;
        if result.boundary() <= base.boundary() {
            return Err(Error::Invalid(format!(
                "result boundary {} must be greater than base boundary {}",
                result.boundary(),
                base.boundary()
            )));
        }
        let reused = reused_pages(base, result);
        let header = DeltaHeader {
            schema: DELTA_SCHEMA.into(),
            chunk_tokens,
            base_digest,
            result_digest,
            base_boundary: base.boundary(),
            result_boundary: result.boundary(),
            base_block_counts: base.block_counts().to_vec(),
            result_block_counts: result.block_counts().to_vec(),
            reused_pages: reused.clone(),
        };
        let payload_at = result.encoded().len() - result.payload().len();
        let mut tails: Vec<Range<usize>> = Vec::new();
        for (gi, g) in result.layout().groups.iter().enumerate() {
            for (li, l) in g.layers.iter().enumerate() {
                let bpp = l.bytes_per_page as usize;
                let r = result
                    .layer_range(gi, li)
                    .ok_or_else(|| Error::Delta("layer range".into()))?;
                let t = payload_at + r.start + reused[gi] as usize * bpp..payload_at + r.end;
                if t.is_empty() {
                    continue;
                }
                match tails.last_mut() {
                    Some(prev) if prev.end == t.start => prev.end = t.end,
                    _ => tails.push(t),
                }
            }
        }
        Ok(DeltaLayout { header, tails })
    }

    /// The encoded header: magic, CBOR length (u32 LE), CBOR. Its length
    /// does not depend on the digests' values.
    pub fn header_bytes(&self) -> Result<Vec<u8>> {
        let cbor = serde_cbor::to_vec(&self.header).map_err(|e| Error::Delta(e.to_string()))?;
        let mut out = Vec::with_capacity(DELTA_PREFIX_LEN + cbor.len());
        out.extend_from_slice(&DELTA_MAGIC);
        out.extend_from_slice(&(cbor.len() as u32).to_le_bytes());
        out.extend_from_slice(&cbor);
        Ok(out)
    }

    /// Bytes of the tails (the payload minus its header).
    pub fn tails_len(&self) -> u64 {
        self.tails.iter().map(|r| (r.end - r.start) as u64).sum()
    }
}

/// Encodes the delta from `base` to `result` into one buffer.
///
/// Rejects mismatching layouts, a result boundary not above the base
/// boundary, and boundaries that are not multiples of `chunk_tokens`.
pub fn encode(chunk_tokens: u32, base: &Snapshot, result: &Snapshot) -> Result<Vec<u8>> {
    encode_with_digests(chunk_tokens, base, result, base.digest(), result.digest())
}

/// Encodes the delta from `base` to `result` into one buffer, naming the
/// given snapshot digests (of either definition: `blake3:` or
/// `blake3-layers:`) in its header. Nothing is hashed.
pub fn encode_with_digests(
    chunk_tokens: u32,
    base: &Snapshot,
    result: &Snapshot,
    base_digest: Digest,
    result_digest: Digest,
) -> Result<Vec<u8>> {
    let layout = DeltaLayout::new(chunk_tokens, base, result, base_digest, result_digest)?;
    let mut out = layout.header_bytes()?;
    out.reserve(layout.tails_len() as usize);
    for r in &layout.tails {
        out.extend_from_slice(&result.encoded()[r.clone()]);
    }
    Ok(out)
}

/// The delta's framing (magic, header bound, messages).
const FRAMING: Framing = Framing::new(DELTA_MAGIC, MAX_DELTA_HEADER, "delta", Error::Delta)
    .bad_magic("bad magic (not a page-tail-cow-v1 delta)");

/// Parses the delta header from the first bytes of a delta (which may be
/// only a prefix). Returns the header and the offset of the tails.
pub fn decode_header(bytes: &[u8]) -> Result<(DeltaHeader, usize)> {
    let (header, end): (DeltaHeader, usize) = FRAMING.decode(bytes)?;
    if header.schema != DELTA_SCHEMA {
        return Err(Error::Delta(format!(
            "unknown delta schema {:?}",
            header.schema
        )));
    }
    Ok((header, end))
}

/// Bytes of the delta prefix (magic + length + header) needed before a plan
/// can be made: `Some(n)` once the first 12 bytes are known.
pub fn header_extent(first_bytes: &[u8]) -> Option<usize> {
    if first_bytes.len() < DELTA_PREFIX_LEN {
        return None;
    }
    let hlen = u32::from_le_bytes([
        first_bytes[8],
        first_bytes[9],
        first_bytes[10],
        first_bytes[11],
    ]);
    Some(DELTA_PREFIX_LEN + hlen.min(MAX_DELTA_HEADER) as usize)
}

impl PageDelta {
    /// Validates `header` (whose tails begin at `tails_offset`) against the
    /// base's header and computes the reconstruction plan.
    pub fn plan(header: DeltaHeader, tails_offset: usize, base: &SnapshotHeader) -> Result<Self> {
        let bad = |m: String| Err(Error::Delta(m));
        let layout: &PageLayout = &base.layout;
        let n = layout.groups.len();
        if header.base_boundary != base.boundary || header.base_block_counts != base.block_counts {
            return bad("delta's base boundary/counts do not match the base snapshot".into());
        }
        check_boundary("base", header.base_boundary, header.chunk_tokens)?;
        check_boundary("result", header.result_boundary, header.chunk_tokens)?;
        if header.result_boundary <= header.base_boundary {
            return bad(format!(
                "result boundary {} is not greater than base boundary {}",
                header.result_boundary, header.base_boundary
            ));
        }
        if header.result_block_counts.len() != n || header.reused_pages.len() != n {
            return bad(format!("per-group vectors do not have {n} entries"));
        }
        layout.check_counts(header.result_boundary, &header.result_block_counts)?;
        for gi in 0..n {
            let limit = header.base_block_counts[gi].min(header.result_block_counts[gi]);
            if header.reused_pages[gi] > limit {
                return bad(format!(
                    "group {gi} reuses {} pages, more than the {limit} available",
                    header.reused_pages[gi]
                ));
            }
        }
        let result_header = SnapshotHeader {
            layout: layout.clone(),
            boundary: header.result_boundary,
            block_counts: header.result_block_counts.clone(),
        };
        let result_prefix = result_header.encode_prefix()?;
        let result_payload = layout.payload_len(&header.result_block_counts)?;
        let result_len = (result_prefix.len() as u64)
            .checked_add(result_payload)
            .ok_or_else(|| Error::Bounds("result length overflows".into()))?;
        let base_offsets = layout.layer_offsets(&base.block_counts)?;
        let mut ops = Vec::new();
        let mut dst = result_prefix.len() as u64;
        let mut src = tails_offset as u64;
        for (gi, g) in layout.groups.iter().enumerate() {
            let reused = header.reused_pages[gi];
            let tail = header.result_block_counts[gi] - reused;
            for (li, l) in g.layers.iter().enumerate() {
                let keep = reused * l.bytes_per_page;
                if keep > 0 {
                    ops.push(CopyOp::Base {
                        src: base_offsets[gi][li],
                        dst,
                        len: keep,
                    });
                    dst += keep;
                }
                let t = tail * l.bytes_per_page;
                if t > 0 {
                    ops.push(CopyOp::Delta { src, dst, len: t });
                    dst += t;
                    src = src
                        .checked_add(t)
                        .ok_or_else(|| Error::Bounds("delta length overflows".into()))?;
                }
            }
        }
        Ok(PageDelta {
            header,
            delta_len: src,
            result_header,
            result_prefix,
            result_len,
            ops,
        })
    }

    /// Reconstructs the result from the base and the full delta encoding,
    /// verifying the result snapshot digest.
    pub fn apply(base: &Snapshot, delta: &[u8]) -> Result<Snapshot> {
        let (header, tails) = decode_header(delta)?;
        let found = crate::layer_digest::digest_like(base, &header.base_digest)?;
        if header.base_digest != found {
            return Err(Error::mismatch(
                "delta base snapshot",
                header.base_digest,
                found,
            ));
        }
        let plan = PageDelta::plan(header, tails, base.header())?;
        if plan.delta_len != delta.len() as u64 {
            return Err(Error::Delta(format!(
                "delta is {} bytes, its header implies {} (truncated or trailing bytes)",
                delta.len(),
                plan.delta_len
            )));
        }
        let len = usize::try_from(plan.result_len)
            .map_err(|_| Error::Bounds("result too large".into()))?;
        let mut out = vec![0u8; len];
        plan.reconstruct(base.payload(), &mut out, |src, dst| {
            dst.copy_from_slice(&delta[src]);
        })?;
        plan.finish(out)
    }

    /// Writes the result prefix and every base span into `out` (which must
    /// be `result_len` bytes), then calls `delta_copy(src_range, dst_slice)`
    /// for every tail span. Used by [`PageDelta::apply`]; a streaming reader
    /// instead calls [`PageDelta::write_base_spans`] and copies tail spans as
    /// verified delta bytes arrive.
    pub fn reconstruct(
        &self,
        base_payload: &[u8],
        out: &mut [u8],
        mut delta_copy: impl FnMut(std::ops::Range<usize>, &mut [u8]),
    ) -> Result<()> {
        self.write_base_spans(base_payload, out)?;
        for op in &self.ops {
            if let CopyOp::Delta { src, dst, len } = *op {
                let (s, d, l) = (src as usize, dst as usize, len as usize);
                delta_copy(s..s + l, &mut out[d..d + l]);
            }
        }
        Ok(())
    }

    /// Writes the result prefix and all reused base spans into `out`.
    pub fn write_base_spans(&self, base_payload: &[u8], out: &mut [u8]) -> Result<()> {
        if out.len() as u64 != self.result_len {
            return Err(Error::Delta(format!(
                "output buffer is {} bytes, result is {}",
                out.len(),
                self.result_len
            )));
        }
        out[..self.result_prefix.len()].copy_from_slice(&self.result_prefix);
        for op in &self.ops {
            if let CopyOp::Base { src, dst, len } = *op {
                let (s, d, l) = (src as usize, dst as usize, len as usize);
                let from = base_payload
                    .get(s..s + l)
                    .ok_or_else(|| Error::Delta("base span out of range".into()))?;
                out[d..d + l].copy_from_slice(from);
            }
        }
        Ok(())
    }

    /// Verifies the reconstructed encoding against `result_digest` and wraps
    /// it as a snapshot.
    pub fn finish(&self, out: Vec<u8>) -> Result<Snapshot> {
        let want = self.header.result_digest;
        let (found, snapshot) = match want.algorithm() {
            crate::Algorithm::Blake3Layers => {
                let s = Snapshot::from_encoded(out)?;
                (crate::layer_digest::of_snapshot(&s)?.snapshot, s)
            }
            _ => {
                let d = digest_of_encoding(&out);
                if d != want {
                    return Err(Error::mismatch("reconstructed result snapshot", want, d));
                }
                (d, Snapshot::from_encoded(out)?)
            }
        };
        if found != want {
            return Err(Error::mismatch(
                "reconstructed result snapshot",
                want,
                found,
            ));
        }
        Ok(snapshot)
    }
}

/// Where one piece of a composed result comes from (see [`compose`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    /// The chain's bottom snapshot; `src` is an offset in its *encoding*
    /// (which, for a flat root, is also its payload).
    Bottom,
    /// Delta `i` of the chain (0 = the delta over the bottom); `src` is an
    /// offset in that delta's encoding (its root's payload).
    Delta(usize),
}

/// One contiguous copy of a composed plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Where the bytes are read.
    pub origin: Origin,
    /// Offset in the origin's encoding.
    pub src: u64,
    /// Offset in the final result encoding.
    pub dst: u64,
    /// Bytes.
    pub len: u64,
}

impl Piece {
    /// The copy, without its origin.
    pub fn span(&self) -> crate::scatter::Span {
        crate::scatter::Span {
            src: self.src,
            dst: self.dst,
            len: self.len,
        }
    }
}

/// The copy plan of a whole delta chain: every byte of the final result's
/// payload comes from exactly one place — the newest delta whose tail wrote
/// it, or the chain's bottom snapshot. No intermediate snapshot is needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComposedPlan {
    /// The final result's header (magic + length + CBOR), written first.
    pub result_prefix: Vec<u8>,
    /// Length of the final result encoding.
    pub result_len: u64,
    /// Pieces in increasing `dst` order, covering
    /// `result_prefix.len()..result_len` exactly once, adjacent pieces of
    /// one origin merged.
    pub pieces: Vec<Piece>,
}

impl ComposedPlan {
    /// Bytes of the final result read from `origin`.
    pub fn bytes_from(&self, origin: Origin) -> u64 {
        self.pieces
            .iter()
            .filter(|p| p.origin == origin)
            .map(|p| p.len)
            .sum()
    }
}

/// Composes the plans of a delta chain over `bottom` into one plan for the
/// final result. `deltas[0]` must have been planned against `bottom`, and
/// each later delta against the result of the one before it (checked: base
/// boundary, block counts and layout of every link).
///
/// The plan says where bytes go, not that they are right: only the final
/// result digest (the newest delta's `result_digest`) proves that. Every
/// input is a verified header in practice, but a forged or inconsistent one
/// can at worst produce a result that fails that digest, never an
/// out-of-range copy: every piece lies inside its origin's declared length
/// and inside the result.
pub fn compose(bottom: &SnapshotHeader, deltas: &[PageDelta]) -> Result<ComposedPlan> {
    let bad = |m: String| Err(Error::Delta(m));
    let bottom_prefix = bottom.encode_prefix()?.len() as u64;
    let bottom_payload = bottom.layout.payload_len(&bottom.block_counts)?;
    // The current level's payload as pieces (dst = offsets in that level's
    // encoding).
    let mut cur: Vec<Piece> = Vec::new();
    if bottom_payload > 0 {
        cur.push(Piece {
            origin: Origin::Bottom,
            src: bottom_prefix,
            dst: bottom_prefix,
            len: bottom_payload,
        });
    }
    let mut prev: &SnapshotHeader = bottom;
    let mut prev_prefix = bottom_prefix;
    let mut prev_len = bottom_prefix + bottom_payload;
    for (i, d) in deltas.iter().enumerate() {
        let h = &d.header;
        if h.base_boundary != prev.boundary
            || h.base_block_counts != prev.block_counts
            || d.result_header.layout != prev.layout
        {
            return bad(format!(
                "delta {i} of the chain is not planned against the result before it"
            ));
        }
        let mut next: Vec<Piece> = Vec::with_capacity(cur.len() + d.ops.len());
        let mut push = |p: Piece| {
            if p.len == 0 {
                return;
            }
            if let Some(last) = next.last_mut() {
                if last.origin == p.origin
                    && last.src + last.len == p.src
                    && last.dst + last.len == p.dst
                {
                    last.len += p.len;
                    return;
                }
            }
            next.push(p);
        };
        for op in &d.ops {
            match *op {
                CopyOp::Delta { src, dst, len } => {
                    if src.checked_add(len).is_none_or(|e| e > d.delta_len) {
                        return bad(format!("delta {i} tail runs past its payload"));
                    }
                    push(Piece {
                        origin: Origin::Delta(i),
                        src,
                        dst,
                        len,
                    });
                }
                CopyOp::Base { src, dst, len } => {
                    // `src` is an offset in the base *payload*.
                    let lo = prev_prefix
                        .checked_add(src)
                        .ok_or_else(|| Error::Bounds("base span overflows".into()))?;
                    let hi = lo
                        .checked_add(len)
                        .ok_or_else(|| Error::Bounds("base span overflows".into()))?;
                    if hi > prev_len {
                        return bad(format!("delta {i} reuses bytes past its base"));
                    }
                    let first = cur.partition_point(|p| p.dst + p.len <= lo);
                    let mut covered = 0u64;
                    for p in &cur[first..] {
                        if p.dst >= hi {
                            break;
                        }
                        let a = p.dst.max(lo);
                        let b = (p.dst + p.len).min(hi);
                        push(Piece {
                            origin: p.origin,
                            src: p.src + (a - p.dst),
                            dst: dst + (a - lo),
                            len: b - a,
                        });
                        covered += b - a;
                    }
                    if covered != len {
                        return bad(format!("delta {i} reuses base bytes no level holds"));
                    }
                }
            }
        }
        cur = next;
        prev = &d.result_header;
        prev_prefix = d.result_prefix.len() as u64;
        prev_len = d.result_len;
    }
    let (result_prefix, result_len) = match deltas.last() {
        Some(d) => (d.result_prefix.clone(), d.result_len),
        None => (bottom.encode_prefix()?, bottom_prefix + bottom_payload),
    };
    // Coverage: the pieces tile the result payload exactly.
    let mut at = result_prefix.len() as u64;
    for p in &cur {
        if p.dst != at {
            return bad("composed pieces do not tile the result".into());
        }
        at += p.len;
    }
    if at != result_len {
        return bad("composed pieces do not cover the result".into());
    }
    Ok(ComposedPlan {
        result_prefix,
        result_len,
        pieces: cur,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{LayerSpec, PageGroup};
    use proptest::prelude::*;

    fn layout_strategy() -> impl Strategy<Value = PageLayout> {
        let layer = (1u64..24).prop_map(|bpp| LayerSpec {
            name: "l".into(),
            dtype: "u8".into(),
            bytes_per_page: bpp,
        });
        let group = (
            prop::bool::weighted(0.8),
            prop::sample::select(vec![1u32, 2, 4, 8, 16]),
            prop::collection::vec(layer, 1..4),
        )
            .prop_map(|(full, tpp, layers)| PageGroup {
                kind: if full {
                    GroupKind::Full
                } else {
                    GroupKind::Recurrent
                },
                tokens_per_page: tpp,
                layers,
            });
        prop::collection::vec(group, 1..4).prop_map(|groups| PageLayout { groups })
    }

    /// Builds a result that extends `base` page-wise, with mutations at
    /// chosen page indexes of each layer.
    fn extend(base: &Snapshot, boundary: u64, seed: u64, mutate: &[u64]) -> Snapshot {
        let header = SnapshotHeader::new(base.layout().clone(), boundary);
        let plen = header
            .layout
            .payload_len(&header.block_counts)
            .expect("len") as usize;
        let mut payload = crate::synth::bytes(seed, plen);
        let offs = header
            .layout
            .layer_offsets(&header.block_counts)
            .expect("offs");
        for (gi, g) in header.layout.groups.iter().enumerate() {
            if g.kind == GroupKind::Recurrent {
                continue;
            }
            let common = base.block_counts()[gi].min(header.block_counts[gi]);
            for (li, l) in g.layers.iter().enumerate() {
                let bpp = l.bytes_per_page as usize;
                let br = base.layer_range(gi, li).expect("range");
                let keep = common as usize * bpp;
                let d = offs[gi][li] as usize;
                payload[d..d + keep].copy_from_slice(&base.payload()[br.start..br.start + keep]);
                for &m in mutate {
                    let p = (m % common.max(1)) as usize;
                    if (p as u64) < common && (m + li as u64) % 3 == 0 {
                        payload[d + p * bpp] ^= 0x5a;
                    }
                }
            }
        }
        Snapshot::from_parts(header, &payload).expect("result")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn apply_inverts_encode_and_stores_no_reused_page(
            layout in layout_strategy(),
            chunk in prop::sample::select(vec![1u32, 4, 16]),
            base_chunks in 0u64..12,
            grow in 1u64..12,
            seed in any::<u64>(),
            mutate in prop::collection::vec(any::<u64>(), 0..3),
        ) {
            let bb = base_chunks * u64::from(chunk);
            let rb = bb + grow * u64::from(chunk);
            let bh = SnapshotHeader::new(layout.clone(), bb);
            let blen = layout.payload_len(&bh.block_counts).expect("len") as usize;
            let base = Snapshot::from_parts(bh, &crate::synth::bytes(seed ^ 0xabc, blen)).expect("base");
            let result = extend(&base, rb, seed, &mutate);
            let delta = encode(chunk, &base, &result).expect("encode");
            let back = PageDelta::apply(&base, &delta).expect("apply");
            prop_assert_eq!(back.encoded(), result.encoded());

            let (h, tails) = decode_header(&delta).expect("header");
            // Size: exactly the tail pages, nothing reused is stored.
            let mut stored = 0u64;
            for (gi, g) in layout.groups.iter().enumerate() {
                stored += (h.result_block_counts[gi] - h.reused_pages[gi]) * g.page_bytes();
                // Maximality: the first stored page differs somewhere (full groups).
                let limit = h.base_block_counts[gi].min(h.result_block_counts[gi]);
                if g.kind == GroupKind::Full && h.reused_pages[gi] < limit {
                    let k = h.reused_pages[gi];
                    let differs = (0..g.layers.len()).any(|li| base.page(gi, li, k) != result.page(gi, li, k));
                    prop_assert!(differs, "page {} of group {} was identical yet stored", k, gi);
                }
                if g.kind == GroupKind::Recurrent {
                    prop_assert_eq!(h.reused_pages[gi], 0);
                }
            }
            prop_assert_eq!(delta.len() as u64, tails as u64 + stored);

            // The streaming layout a publisher writes from is the same bytes,
            // and its header length does not depend on the digests (the
            // publisher lays the delta out before the result digest exists).
            let (bd, rd) = (base.digest(), result.digest());
            let l = DeltaLayout::new(chunk, &base, &result, bd, rd).expect("layout");
            let mut streamed = l.header_bytes().expect("header");
            for r in &l.tails {
                streamed.extend_from_slice(&result.encoded()[r.clone()]);
            }
            prop_assert_eq!(&streamed, &delta);
            let stand_in = DeltaLayout::new(chunk, &base, &result, bd, bd).expect("layout");
            prop_assert_eq!(
                stand_in.header_bytes().expect("header").len(),
                l.header_bytes().expect("header").len()
            );
            prop_assert_eq!(stand_in.tails, l.tails);
        }
    }

    /// Replays a composed plan: the final encoding from the bottom's
    /// encoding and the deltas' encodings alone.
    fn replay(plan: &ComposedPlan, bottom: &[u8], deltas: &[Vec<u8>]) -> Vec<u8> {
        let mut out = vec![0u8; plan.result_len as usize];
        out[..plan.result_prefix.len()].copy_from_slice(&plan.result_prefix);
        for p in &plan.pieces {
            let from: &[u8] = match p.origin {
                Origin::Bottom => bottom,
                Origin::Delta(i) => &deltas[i],
            };
            let (s, d, n) = (p.src as usize, p.dst as usize, p.len as usize);
            out[d..d + n].copy_from_slice(&from[s..s + n]);
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]
        /// Composing a chain's plans gives exactly what applying the deltas
        /// one after another gives, and every piece reads inside its origin.
        #[test]
        fn composed_chain_equals_step_by_step(
            layout in layout_strategy(),
            chunk in prop::sample::select(vec![1u32, 4, 16]),
            base_chunks in 0u64..6,
            grows in prop::collection::vec(1u64..6, 1..6),
            seed in any::<u64>(),
            mutate in prop::collection::vec(any::<u64>(), 0..3),
        ) {
            let mut b = base_chunks * u64::from(chunk);
            let bh = SnapshotHeader::new(layout.clone(), b);
            let blen = layout.payload_len(&bh.block_counts).expect("len") as usize;
            let bottom = Snapshot::from_parts(bh, &crate::synth::bytes(seed ^ 0xabc, blen)).expect("base");
            let mut turns = vec![bottom.clone()];
            let mut encoded = Vec::new();
            let mut plans = Vec::new();
            for (i, g) in grows.iter().enumerate() {
                b += g * u64::from(chunk);
                let prev = turns.last().expect("turn").clone();
                let next = extend(&prev, b, seed.wrapping_add(i as u64), &mutate);
                let d = encode(chunk, &prev, &next).expect("encode");
                // Step by step: apply each delta to the previous result.
                let stepped = PageDelta::apply(&prev, &d).expect("apply");
                prop_assert_eq!(stepped.encoded(), next.encoded());
                let (h, tails) = decode_header(&d).expect("header");
                plans.push(PageDelta::plan(h, tails, prev.header()).expect("plan"));
                encoded.push(d);
                turns.push(next);
            }
            let plan = compose(bottom.header(), &plans).expect("compose");
            let last = turns.last().expect("last");
            prop_assert_eq!(plan.result_len, last.encoded().len() as u64);
            for p in &plan.pieces {
                let len = match p.origin {
                    Origin::Bottom => bottom.encoded().len(),
                    Origin::Delta(i) => encoded[i].len(),
                } as u64;
                prop_assert!(p.src + p.len <= len);
            }
            prop_assert_eq!(replay(&plan, bottom.encoded(), &encoded), last.encoded().to_vec());
            // A link planned against the wrong base is refused.
            if plans.len() >= 2 {
                let mut swapped = plans.clone();
                swapped.swap(0, 1);
                prop_assert!(compose(bottom.header(), &swapped).is_err());
            }
        }
    }

    fn simple() -> (Snapshot, Snapshot) {
        let layout = PageLayout {
            groups: vec![
                PageGroup {
                    kind: GroupKind::Full,
                    tokens_per_page: 4,
                    layers: vec![LayerSpec {
                        name: "kv".into(),
                        dtype: "u8".into(),
                        bytes_per_page: 2,
                    }],
                },
                PageGroup {
                    kind: GroupKind::Recurrent,
                    tokens_per_page: 4,
                    layers: vec![LayerSpec {
                        name: "s".into(),
                        dtype: "u8".into(),
                        bytes_per_page: 3,
                    }],
                },
            ],
        };
        let base = Snapshot::from_parts(
            SnapshotHeader::new(layout.clone(), 8),
            &[1, 1, 2, 2, 9, 9, 9],
        )
        .expect("b");
        let result = Snapshot::from_parts(
            SnapshotHeader::new(layout, 16),
            &[1, 1, 2, 2, 3, 3, 4, 4, 8, 8, 8],
        )
        .expect("r");
        (base, result)
    }

    #[test]
    fn rejects_bad_inputs() {
        let (base, result) = simple();
        assert!(encode(4, &result, &base).is_err(), "boundary must grow");
        assert!(
            encode(3, &base, &result).is_err(),
            "boundaries must be multiples of chunk_tokens"
        );
        let delta = encode(4, &base, &result).expect("encode");
        assert_eq!(PageDelta::apply(&base, &delta).expect("apply"), result);
        // trailing bytes and truncation
        let mut t = delta.clone();
        t.push(0);
        assert!(PageDelta::apply(&base, &t).is_err());
        assert!(PageDelta::apply(&base, &delta[..delta.len() - 1]).is_err());
        // a different base
        assert!(PageDelta::apply(&result, &delta).is_err());
        // a flipped tail byte fails the result digest
        let mut f = delta.clone();
        let n = f.len();
        f[n - 1] ^= 1;
        assert!(matches!(
            PageDelta::apply(&base, &f),
            Err(Error::DigestMismatch { .. })
        ));
        // a forged header claiming more reuse than exists
        let (mut h, tails) = decode_header(&delta).expect("hdr");
        h.reused_pages[0] = 3;
        assert!(PageDelta::plan(h.clone(), tails, base.header()).is_err());
        h.reused_pages = vec![0];
        assert!(PageDelta::plan(h, tails, base.header()).is_err());
    }
}

//! The parallel verification plan: how a reader hashes a snapshot with a
//! layered digest on every core in one pass.
//!
//! Each stream is an ordinary BLAKE3 tree (in derive-key mode), so it is cut
//! into *blocks* that are complete aligned subtrees ([`LayerBlock`],
//! `stream_pieces`), hashed in any order and on any core
//! ([`LayerHashPlan::hash_block`]), and folded back into the stream's digest
//! (`fold_pieces`); the stream digests and the prefix give the snapshot
//! digest ([`LayerHashPlan::finish`]). One stream can be checked alone from
//! its own blocks ([`LayerHashPlan::stream_digest`]), as a layer-wise
//! restore does.
//!
//! One block boundary of every stream falls at its state point (see the
//! `stored` submodule), so the blocks below it are that stream's
//! extendable [`StreamState`]: a reader that verified a snapshot holds its
//! [`DigestState`] at no extra hashing ([`LayerHashPlan::digest_state`]).

use std::ops::Range;

use blake3::hazmat::{ChainingValue, HasherExt, Mode};

use super::definition::{
    bytes_per_page, combine, group_of_stream, settled_pages, stream_hasher, stream_key,
    stream_ranges, supported, unsupported, StreamDigest,
};
use super::state::{DigestState, StreamState, CHUNK};
use super::stored::state_point;
use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::snapshot::SnapshotHeader;

/// One block of a [`LayerHashPlan`]: an aligned piece of one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerBlock {
    /// The stream (payload order).
    pub stream: usize,
    /// The block's index within its stream.
    pub index: u64,
    /// The block's bytes in the snapshot encoding.
    pub range: (u64, u64),
}

/// One stream of a [`LayerHashPlan`].
#[derive(Debug, Clone)]
struct PlanStream {
    /// Where the stream starts in the encoding.
    start: u64,
    /// Its length.
    len: u64,
    /// Its first block in the plan.
    first: usize,
    /// Its blocks' starts relative to the stream, and the end.
    offsets: Vec<u64>,
    /// Where its [`StreamState`] after the settled pages ends its pieces
    /// (`cut`, a block boundary) and its partial chunk (`settled`).
    cut: u64,
    settled: u64,
}

/// How a reader hashes a snapshot with a layered digest in parallel: every
/// stream cut into blocks that are complete subtrees of the stream's BLAKE3
/// tree (aligned powers of two, the last possibly short), hashed in any
/// order, merged per stream, then combined with the prefix.
///
/// The blocks are `block` bytes apart, except around each stream's
/// *settled* point (the end of its settled pages, [`settled_pages`]): there
/// the stream is cut into smaller aligned pieces so that one block boundary
/// falls at the state point of [`StreamState`]. So the blocks' chaining
/// values below it are that stream's extendable state, and a reader that
/// verified a snapshot also holds, at no extra hashing, what publishing the
/// next turn from its new pages needs ([`LayerHashPlan::digest_state`]).
#[derive(Debug, Clone)]
pub struct LayerHashPlan {
    header: SnapshotHeader,
    settled: Vec<u64>,
    streams: Vec<PlanStream>,
    blocks: Vec<LayerBlock>,
}

/// The aligned pieces of a stream of `len` bytes: `block`-sized, except
/// that a boundary falls at `cut` (a multiple of the chunk length below
/// `len`), with the pieces around it the largest aligned powers of two that
/// fit; the last piece runs to the end.
fn stream_pieces(len: u64, block: u64, cut: Option<u64>) -> Vec<u64> {
    let mut starts = Vec::new();
    let mut o = 0u64;
    while o < len {
        starts.push(o);
        let bound = len.min((o / block + 1) * block);
        let stop = match cut {
            Some(c) if o < c && c < bound => c,
            _ => bound,
        };
        let r = stop - o;
        let align = if o == 0 {
            u64::MAX
        } else {
            1u64 << o.trailing_zeros()
        };
        if stop == len && r <= align {
            break;
        }
        let p = align.min(1u64 << (63 - r.leading_zeros()));
        o += p;
    }
    starts.push(len);
    starts
}

/// Folds a stream's blocks' chaining values (in order, at least two) into
/// its digest: the left-balanced tree over its pieces.
fn fold_pieces(pieces: &[(u64, ChainingValue)]) -> StreamDigest {
    let mode = || Mode::DeriveKeyMaterial(stream_key());
    let Some(((_, last), body)) = pieces.split_last() else {
        return *stream_hasher().finalize().as_bytes();
    };
    let mut stack = Vec::with_capacity(body.len());
    for &p in body {
        StreamState::merge_equal(&mut stack);
        stack.push(p);
    }
    StreamState::merge_equal(&mut stack);
    let Some(((_, first), rest)) = stack.split_first() else {
        return *last;
    };
    let mut acc = *last;
    for (_, cv) in rest.iter().rev() {
        acc = blake3::hazmat::merge_subtrees_non_root(cv, &acc, mode());
    }
    *blake3::hazmat::merge_subtrees_root(first, &acc, mode()).as_bytes()
}

impl LayerHashPlan {
    /// A plan for the encoding of `header` whose payload starts at
    /// `payload_offset`, with blocks of `block` bytes (a power of two of at
    /// least 1 KiB).
    pub fn new(header: &SnapshotHeader, payload_offset: u64, block: u64) -> Result<Self> {
        if !supported(header) {
            return Err(unsupported(header));
        }
        if !block.is_power_of_two() || block < CHUNK {
            return Err(Error::Invalid(format!(
                "block of {block} bytes: a power of two of at least {CHUNK} is needed"
            )));
        }
        let ranges = stream_ranges(header, payload_offset)?;
        let settled_pages = settled_pages(header);
        let groups = group_of_stream(header);
        let bpp = bytes_per_page(header);
        let mut streams = Vec::with_capacity(ranges.len());
        let mut blocks = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            let len = r.end - r.start;
            let settled = (settled_pages[groups[i]] * bpp[i]).min(len);
            let cut = state_point(settled);
            let offsets = stream_pieces(len, block, (cut > 0).then_some(cut));
            let first = blocks.len();
            for (b, w) in offsets.windows(2).enumerate() {
                blocks.push(LayerBlock {
                    stream: i,
                    index: b as u64,
                    range: (r.start + w[0], r.start + w[1]),
                });
            }
            streams.push(PlanStream {
                start: r.start,
                len,
                first,
                offsets,
                cut,
                settled,
            });
        }
        Ok(LayerHashPlan {
            header: header.clone(),
            settled: settled_pages,
            streams,
            blocks,
        })
    }

    /// Every block, in encoding order (payload order).
    pub fn blocks(&self) -> &[LayerBlock] {
        &self.blocks
    }

    /// The blocks overlapping encoding bytes `start..end`, as indices into
    /// [`LayerHashPlan::blocks`].
    pub fn blocks_in(&self, start: u64, end: u64) -> Range<usize> {
        let lo = self.blocks.partition_point(|b| b.range.1 <= start);
        let hi = self.blocks.partition_point(|b| b.range.0 < end);
        lo..hi.max(lo)
    }

    /// Hashes block `i` from its bytes: its chaining value, or the stream's
    /// digest when the stream is that one block.
    pub fn hash_block(&self, i: usize, bytes: &[u8]) -> Result<[u8; 32]> {
        let b = self
            .blocks
            .get(i)
            .ok_or_else(|| Error::Invalid(format!("no block {i}")))?;
        if bytes.len() as u64 != b.range.1 - b.range.0 {
            return Err(Error::Invalid(format!(
                "block {i} is {} bytes, got {}",
                b.range.1 - b.range.0,
                bytes.len()
            )));
        }
        let st = &self.streams[b.stream];
        let mut h = stream_hasher();
        if st.offsets.len() <= 2 {
            h.update(bytes);
            return Ok(*h.finalize().as_bytes());
        }
        h.set_input_offset(b.range.0 - st.start);
        h.update(bytes);
        Ok(h.finalize_non_root())
    }

    fn check_hashes(&self, block_hashes: &[[u8; 32]]) -> Result<()> {
        if block_hashes.len() != self.blocks.len() {
            return Err(Error::Invalid(format!(
                "{} block hashes for {} blocks",
                block_hashes.len(),
                self.blocks.len()
            )));
        }
        Ok(())
    }

    /// Merges every block's hash (indexed like [`LayerHashPlan::blocks`])
    /// into the stream digests.
    pub fn stream_digests(&self, block_hashes: &[[u8; 32]]) -> Result<Vec<StreamDigest>> {
        self.check_hashes(block_hashes)?;
        Ok(self
            .streams
            .iter()
            .map(|st| {
                Self::fold_stream(st, &block_hashes[st.first..st.first + st.offsets.len() - 1])
            })
            .collect())
    }

    /// Number of streams (payload order).
    pub fn stream_count(&self) -> usize {
        self.streams.len()
    }

    /// Stream `i`'s bytes in the snapshot encoding.
    pub fn stream_range(&self, i: usize) -> Option<Range<u64>> {
        self.streams.get(i).map(|st| st.start..st.start + st.len)
    }

    /// Stream `i`'s blocks, as indices into [`LayerHashPlan::blocks`]
    /// (empty for a stream without bytes).
    pub fn stream_blocks(&self, i: usize) -> Range<usize> {
        self.streams
            .get(i)
            .map_or(0..0, |st| st.first..st.first + st.offsets.len() - 1)
    }

    /// Stream `i`'s digest from its own blocks' hashes (in order, as many
    /// as [`LayerHashPlan::stream_blocks`] names): one stream checked alone,
    /// as a layer-wise restore does once that stream's blocks are hashed.
    pub fn stream_digest(&self, i: usize, block_hashes: &[[u8; 32]]) -> Result<StreamDigest> {
        let st = self
            .streams
            .get(i)
            .ok_or_else(|| Error::Invalid(format!("no stream {i}")))?;
        if block_hashes.len() != st.offsets.len() - 1 {
            return Err(Error::Invalid(format!(
                "{} block hashes for stream {i}'s {} blocks",
                block_hashes.len(),
                st.offsets.len() - 1
            )));
        }
        Ok(Self::fold_stream(st, block_hashes))
    }

    fn fold_stream(st: &PlanStream, hashes: &[[u8; 32]]) -> StreamDigest {
        match hashes {
            [] => *stream_hasher().finalize().as_bytes(),
            [only] => *only,
            _ => {
                let pieces: Vec<(u64, ChainingValue)> = st
                    .offsets
                    .windows(2)
                    .zip(hashes)
                    .map(|(w, h)| (w[1] - w[0], *h))
                    .collect();
                fold_pieces(&pieces)
            }
        }
    }

    /// The layered digest: the prefix and the merged stream digests.
    pub fn finish(&self, prefix: &[u8], block_hashes: &[[u8; 32]]) -> Result<Digest> {
        Ok(combine(prefix, &self.stream_digests(block_hashes)?))
    }

    /// The verified snapshot's [`DigestState`] from the blocks' hashes and
    /// its encoding (only each stream's last settled chunk is read, at most
    /// 1 KiB per stream; nothing is hashed but those chunks' merges). The
    /// caller must have checked [`LayerHashPlan::finish`] against the
    /// snapshot's digest with these hashes.
    pub fn digest_state(
        &self,
        digest: Digest,
        encoding: &[u8],
        block_hashes: &[[u8; 32]],
    ) -> Result<DigestState> {
        self.check_hashes(block_hashes)?;
        let states = self
            .streams
            .iter()
            .map(|st| {
                let mut state = StreamState::new();
                if st.settled == 0 {
                    return Ok(state);
                }
                let pieces = st.offsets.windows(2).zip(&block_hashes[st.first..]);
                for (w, h) in pieces.take_while(|(w, _)| w[1] <= st.cut) {
                    state.push(w[1] - w[0], *h);
                }
                if state.end != st.cut || st.len < st.settled {
                    return Err(Error::Invalid("a stream's blocks miss its cut".into()));
                }
                let lo = (st.start + st.cut) as usize;
                let hi = (st.start + st.settled) as usize;
                let partial = encoding
                    .get(lo..hi)
                    .ok_or_else(|| Error::Invalid("encoding shorter than the plan".into()))?;
                state.partial = partial.to_vec();
                Ok(state)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DigestState {
            header: self.header.clone(),
            digest,
            settled: self.settled.clone(),
            states,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer_digest::stream_digest;
    use crate::layer_digest::tests::{flat, layout_strategy};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Each stream checked alone from its own blocks (a layer-wise
        /// restore) gives the same digest as all streams merged at once,
        /// and the stream's range is its bytes.
        #[test]
        fn one_stream_alone_matches_the_merged_digests(
            l in layout_strategy(),
            pages in 0u64..40,
            block_log in 10u32..14,
            seed in any::<u64>(),
        ) {
            let snap = flat(&l, pages * 64, seed);
            let off = snap.header().encode_prefix().expect("prefix").len() as u64;
            let plan = LayerHashPlan::new(snap.header(), off, 1 << block_log).expect("plan");
            let hashes: Vec<[u8; 32]> = plan
                .blocks()
                .iter()
                .enumerate()
                .map(|(i, b)| plan.hash_block(i, &snap.encoded()[b.range.0 as usize..b.range.1 as usize]).expect("hash"))
                .collect();
            let all = plan.stream_digests(&hashes).expect("digests");
            prop_assert_eq!(plan.stream_count(), all.len());
            for (i, want) in all.iter().enumerate() {
                let blocks = plan.stream_blocks(i);
                prop_assert_eq!(&plan.stream_digest(i, &hashes[blocks.clone()]).expect("one"), want);
                let r = plan.stream_range(i).expect("range");
                prop_assert_eq!(&stream_digest(&snap.encoded()[r.start as usize..r.end as usize]), want);
                if !blocks.is_empty() {
                    prop_assert!(plan.stream_digest(i, &hashes[blocks.start + 1..blocks.end]).is_err());
                }
            }
            prop_assert!(plan.stream_range(all.len()).is_none());
        }
    }
}

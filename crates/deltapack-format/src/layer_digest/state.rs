//! The extendable hashing state: what a publisher keeps of a snapshot to
//! digest the next turn from its new pages alone.
//!
//! [`StreamState`] is one stream's BLAKE3 state after a prefix of its
//! bytes, held as the chaining values of the complete subtrees covering the
//! prefix plus its last raw chunk (BLAKE3's own incremental state, written
//! out with `blake3::hazmat`), so that it can be assembled from subtrees a
//! reader already hashed and written down, which a `blake3::Hasher` can be
//! neither. [`DigestState`] is a snapshot's header, layered digest and every
//! stream's state after its settled pages ([`settled_pages`]); extending it
//! with a turn's tails ([`DigestState::extend`]) hashes the tails only.
//!
//! The written-down form of a state and its proof on resume are in the
//! `stored` submodule; the state a verifying reader gets from its blocks'
//! hashes is built in `plan` ([`LayerHashPlan::digest_state`]).
//!
//! [`LayerHashPlan::digest_state`]: super::LayerHashPlan::digest_state

use blake3::hazmat::{ChainingValue, HasherExt, Mode};

use super::definition::{
    bytes_per_page, combine, group_of_stream, par_map, settled_pages, stream_hasher, stream_key,
    stream_ranges, supported, unsupported, update, LayerDigests, StreamDigest,
};
use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::snapshot::{Snapshot, SnapshotHeader};

/// BLAKE3's chunk length: subtrees of a stream's tree are whole chunks.
pub(super) const CHUNK: u64 = 1024;

/// One stream's hashing state after some prefix of its bytes, kept as the
/// chaining values of the complete subtrees that cover the prefix (BLAKE3's
/// own incremental state, written out with `blake3::hazmat`), so that it
/// can be built from any subtrees a reader already hashed (a restore's
/// blocks), and written down (a root's sidecar), which a `blake3::Hasher`
/// can be neither.
///
/// Invariant: `pieces` are aligned complete subtrees covering `0..end`,
/// non-increasing in size (equal neighbours are merged lazily, before the
/// next piece is pushed, as BLAKE3's hasher does); `partial` holds the bytes
/// `end..end + partial.len()`, at most one chunk and never empty once any
/// byte was absorbed, because the stream's last chunk cannot be finalized
/// until it is known whether it is the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamState {
    pub(super) pieces: Vec<(u64, ChainingValue)>,
    pub(super) end: u64,
    pub(super) partial: Vec<u8>,
}

impl Default for StreamState {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamState {
    /// The state of an empty stream.
    pub fn new() -> Self {
        StreamState {
            pieces: Vec::new(),
            end: 0,
            partial: Vec::new(),
        }
    }

    /// Bytes absorbed so far.
    pub fn len(&self) -> u64 {
        self.end + self.partial.len() as u64
    }

    /// Whether no byte was absorbed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Chaining value of the complete subtree `bytes` at `offset`.
    fn subtree(offset: u64, bytes: &[u8]) -> ChainingValue {
        let mut h = stream_hasher();
        h.set_input_offset(offset);
        update(&mut h, bytes);
        h.finalize_non_root()
    }

    /// Merges the top two pieces while they are equal (siblings: every
    /// piece below them is larger, so the pair starts on a multiple of
    /// twice its size). Afterwards the pieces strictly decrease.
    pub(super) fn merge_equal(pieces: &mut Vec<(u64, ChainingValue)>) {
        while let [.., (a, left), (b, right)] = pieces[..] {
            if a != b {
                break;
            }
            pieces.truncate(pieces.len() - 2);
            let merged = blake3::hazmat::merge_subtrees_non_root(
                &left,
                &right,
                Mode::DeriveKeyMaterial(stream_key()),
            );
            pieces.push((a + b, merged));
        }
    }

    /// Pushes the subtree `len` bytes long at `self.end`, merging equal
    /// neighbours below it first.
    pub(super) fn push(&mut self, len: u64, cv: ChainingValue) {
        Self::merge_equal(&mut self.pieces);
        self.pieces.push((len, cv));
        self.end += len;
    }

    /// Absorbs `bytes`, the stream's next bytes (more may follow).
    pub fn absorb(&mut self, mut bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        // Top the partial chunk up; a full one becomes a piece only once
        // bytes follow it.
        if !self.partial.is_empty() {
            let room = CHUNK as usize - self.partial.len();
            let k = room.min(bytes.len());
            self.partial.extend_from_slice(&bytes[..k]);
            bytes = &bytes[k..];
            if bytes.is_empty() {
                return;
            }
            let chunk = std::mem::take(&mut self.partial);
            let cv = Self::subtree(self.end, &chunk);
            self.push(CHUNK, cv);
        }
        // `self.end` is chunk-aligned and `partial` empty: whole subtrees
        // up to the last chunk, which stays partial.
        let keep = match bytes.len() as u64 % CHUNK {
            0 => CHUNK,
            r => r,
        } as usize;
        let (body, last) = bytes.split_at(bytes.len() - keep);
        let mut at = 0usize;
        while at < body.len() {
            let left = (body.len() - at) as u64;
            let align = match self.end {
                0 => u64::MAX,
                e => 1u64 << e.trailing_zeros(),
            };
            // The largest power-of-two run of chunks that fits and starts
            // a subtree here.
            let fit = 1u64 << (63 - left.leading_zeros());
            let len = fit.min(align);
            let cv = Self::subtree(self.end, &body[at..at + len as usize]);
            self.push(len, cv);
            at += len as usize;
        }
        self.partial.extend_from_slice(last);
    }

    /// The stream digest of the bytes absorbed (the state is unchanged).
    pub fn finalize(&self) -> StreamDigest {
        if self.pieces.is_empty() {
            let mut h = stream_hasher();
            h.update(&self.partial);
            return *h.finalize().as_bytes();
        }
        let mode = || Mode::DeriveKeyMaterial(stream_key());
        // Strictly decreasing pieces, then the last chunk: the stream's
        // left-balanced tree is their fold from the right, the last merge
        // the root.
        let mut pieces = self.pieces.clone();
        Self::merge_equal(&mut pieces);
        let mut acc = Self::subtree(self.end, &self.partial);
        let Some((first, rest)) = pieces.split_first() else {
            return *stream_hasher().finalize().as_bytes();
        };
        for (_, cv) in rest.iter().rev() {
            acc = blake3::hazmat::merge_subtrees_non_root(cv, &acc, mode());
        }
        *blake3::hazmat::merge_subtrees_root(&first.1, &acc, mode()).as_bytes()
    }
}

/// What a publisher keeps of a snapshot to digest the next turn from its
/// new pages alone: the snapshot's header and layered digest, and every
/// stream's BLAKE3 state after its settled pages ([`settled_pages`]).
///
/// A state is only as good as the bytes it absorbed: whoever extends it must
/// know that the result's settled pages are the base's (a tail-only turn
/// reuses them by construction; a full snapshot is compared page by page).
#[derive(Clone)]
pub struct DigestState {
    pub(super) header: SnapshotHeader,
    pub(super) digest: Digest,
    pub(super) settled: Vec<u64>,
    pub(super) states: Vec<StreamState>,
}

/// Absorbs `bytes` into `h` and returns the stream's digest with the state
/// at `cut` (where the settled pages end), which the next turn extends.
fn hash_across_cut(mut h: StreamState, bytes: &[u8], cut: usize) -> (StreamDigest, StreamState) {
    h.absorb(&bytes[..cut]);
    let state = h.clone();
    h.absorb(&bytes[cut..]);
    (h.finalize(), state)
}

impl std::fmt::Debug for DigestState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DigestState")
            .field("boundary", &self.header.boundary)
            .field("digest", &self.digest)
            .field("settled", &self.settled)
            .finish()
    }
}

impl DigestState {
    /// Hashes every stream of `s` once (on all cores), keeping each
    /// stream's state after its settled pages.
    pub fn capture(s: &Snapshot) -> Result<(LayerDigests, DigestState)> {
        let header = s.header().clone();
        if !supported(&header) {
            return Err(unsupported(&header));
        }
        let payload_offset = (s.encoded().len() - s.payload().len()) as u64;
        let ranges = stream_ranges(&header, payload_offset)?;
        let settled = settled_pages(&header);
        let bpp = bytes_per_page(&header);
        let groups = group_of_stream(&header);
        let enc = s.encoded();
        let hashed: Vec<(StreamDigest, StreamState)> = par_map(ranges.len(), |i| {
            let r = &ranges[i];
            let bytes = &enc[r.start as usize..r.end as usize];
            let cut = (settled[groups[i]] * bpp[i]) as usize;
            hash_across_cut(StreamState::new(), bytes, cut)
        });
        DigestState::finish(header, settled, hashed)
    }

    /// The snapshot digest of `header` over each stream's (digest, state at
    /// its settled cut), and the state to extend it from.
    fn finish(
        header: SnapshotHeader,
        settled: Vec<u64>,
        hashed: Vec<(StreamDigest, StreamState)>,
    ) -> Result<(LayerDigests, DigestState)> {
        let (streams, states): (Vec<_>, Vec<_>) = hashed.into_iter().unzip();
        let prefix = header.encode_prefix()?;
        let digest = combine(&prefix, &streams);
        Ok((
            LayerDigests {
                snapshot: digest,
                streams,
            },
            DigestState {
                header,
                digest,
                settled,
                states,
            },
        ))
    }

    /// The header of the snapshot this state was taken from.
    pub fn header(&self) -> &SnapshotHeader {
        &self.header
    }

    /// The layered digest of that snapshot.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// Number of streams (one [`StreamState`] each).
    pub fn streams(&self) -> usize {
        self.states.len()
    }

    /// Pages per group absorbed into the states: the result of an extension
    /// must hold these pages unchanged, and its tail starts after them.
    pub fn settled(&self) -> &[u64] {
        &self.settled
    }

    /// Digests the snapshot with header `result` whose first
    /// [`DigestState::settled`] pages of every group are this snapshot's and
    /// whose remaining pages, stream by stream, are `tails[i]` (stream `i`'s
    /// pages from its group's settled count to its block count). Hashes the
    /// tails only. Returns the result's digests and its own state.
    ///
    /// Errors (nothing hashed) on another layout, a boundary not above this
    /// one, or a tail of the wrong length.
    pub fn extend(
        &self,
        result: &SnapshotHeader,
        tails: &[&[u8]],
    ) -> Result<(LayerDigests, DigestState)> {
        result.validate()?;
        if result.layout != self.header.layout {
            return Err(Error::Invalid(
                "the result's layout differs from the base's".into(),
            ));
        }
        if result.boundary <= self.header.boundary {
            return Err(Error::Invalid(format!(
                "result boundary {} is not above the base boundary {}",
                result.boundary, self.header.boundary
            )));
        }
        let groups = group_of_stream(result);
        let bpp = bytes_per_page(result);
        if tails.len() != groups.len() {
            return Err(Error::Invalid(format!(
                "{} tails for {} streams",
                tails.len(),
                groups.len()
            )));
        }
        let next_settled = settled_pages(result);
        for (i, t) in tails.iter().enumerate() {
            let g = groups[i];
            let pages = result.block_counts[g]
                .checked_sub(self.settled[g])
                .ok_or_else(|| Error::Invalid(format!("group {g} lost pages")))?;
            if t.len() as u64 != pages * bpp[i] || next_settled[g] < self.settled[g] {
                return Err(Error::Invalid(format!(
                    "stream {i}: tail of {} bytes, expected {} ({pages} pages of {})",
                    t.len(),
                    pages * bpp[i],
                    bpp[i]
                )));
            }
        }
        let hashed: Vec<(StreamDigest, StreamState)> = par_map(tails.len(), |i| {
            let t = tails[i];
            let g = groups[i];
            let cut = ((next_settled[g] - self.settled[g]) * bpp[i]) as usize;
            hash_across_cut(self.states[i].clone(), t, cut)
        });
        DigestState::finish(result.clone(), next_settled, hashed)
    }

    /// [`DigestState::extend`] to a whole result snapshot whose settled
    /// pages are known to equal this snapshot's (the caller compared them):
    /// its tails are read from `result` itself.
    pub fn extend_to(&self, result: &Snapshot) -> Result<(LayerDigests, DigestState)> {
        let payload_offset = (result.encoded().len() - result.payload().len()) as u64;
        let ranges = stream_ranges(result.header(), payload_offset)?;
        let groups = group_of_stream(result.header());
        let bpp = bytes_per_page(result.header());
        let enc = result.encoded();
        let tails: Vec<&[u8]> = ranges
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let skip = self.settled.get(groups[i]).copied().unwrap_or(0) * bpp[i];
                let start = (r.start + skip).min(r.end);
                &enc[start as usize..r.end as usize]
            })
            .collect();
        self.extend(result.header(), &tails)
    }
}

/// The layered digest of a snapshot whose encoding arrives in order, in
/// pieces of any size (a publication's staged extents): each stream's
/// bytes are absorbed as they pass, and its state is kept at its settled
/// cut, so [`StreamFeed::finish`] gives what [`DigestState::capture`]
/// gives for the whole encoding, from the very bytes fed.
#[derive(Debug)]
pub struct StreamFeed {
    header: SnapshotHeader,
    settled: Vec<u64>,
    /// Each stream's range in the encoding.
    ranges: Vec<std::ops::Range<u64>>,
    /// Each stream's settled cut, as an offset in the encoding.
    cuts: Vec<u64>,
    /// Each stream's state, and its state at the cut once passed.
    states: Vec<(StreamState, Option<StreamState>)>,
    /// Bytes of the encoding fed so far.
    at: u64,
    /// The first stream that may still take bytes.
    next: usize,
    /// The encoding's prefix as `header` encodes it: the bytes fed there
    /// must be these.
    prefix: Vec<u8>,
    /// Some fed prefix byte differed.
    prefix_differs: bool,
}

impl StreamFeed {
    /// A feed for the encoding of a snapshot with `header`, whose payload
    /// starts at `payload_offset`.
    pub fn new(header: &SnapshotHeader, payload_offset: u64) -> Result<StreamFeed> {
        if !supported(header) {
            return Err(unsupported(header));
        }
        let ranges = stream_ranges(header, payload_offset)?;
        let settled = settled_pages(header);
        let bpp = bytes_per_page(header);
        let groups = group_of_stream(header);
        let cuts = ranges
            .iter()
            .enumerate()
            .map(|(i, r)| r.start + settled[groups[i]] * bpp[i])
            .collect();
        let states = ranges.iter().map(|_| (StreamState::new(), None)).collect();
        let prefix = header.encode_prefix()?;
        if prefix.len() as u64 != payload_offset {
            return Err(Error::Invalid(format!(
                "payload offset {payload_offset}, the header's prefix is {} bytes",
                prefix.len()
            )));
        }
        Ok(StreamFeed {
            header: header.clone(),
            settled,
            ranges,
            cuts,
            states,
            at: 0,
            next: 0,
            prefix,
            prefix_differs: false,
        })
    }

    /// Bytes of the encoding fed so far.
    pub fn fed(&self) -> u64 {
        self.at
    }

    /// Feeds the encoding's next `bytes`. The prefix's bytes are compared
    /// with the header the feed was made with (the one the digest binds):
    /// a difference makes [`StreamFeed::finish`] fail.
    pub fn feed(&mut self, bytes: &[u8]) {
        let (lo, hi) = (self.at, self.at + bytes.len() as u64);
        self.at = hi;
        let plen = self.prefix.len() as u64;
        if lo < plen {
            let end = hi.min(plen);
            let want = &self.prefix[lo as usize..end as usize];
            if &bytes[..(end - lo) as usize] != want {
                self.prefix_differs = true;
            }
        }
        while self.next < self.ranges.len() && self.ranges[self.next].end <= lo {
            self.next += 1;
        }
        for i in self.next..self.ranges.len() {
            let r = &self.ranges[i];
            if r.start >= hi {
                break;
            }
            let (a, b) = (r.start.max(lo), r.end.min(hi));
            if a >= b {
                continue;
            }
            let cut = self.cuts[i];
            let (state, at_cut) = &mut self.states[i];
            let piece = |x: u64, y: u64| &bytes[(x - lo) as usize..(y - lo) as usize];
            if a < cut && cut <= b {
                state.absorb(piece(a, cut));
                *at_cut = Some(state.clone());
                state.absorb(piece(cut, b));
            } else {
                if cut == a && at_cut.is_none() {
                    *at_cut = Some(state.clone());
                }
                state.absorb(piece(a, b));
            }
        }
    }

    /// The digests and the state to extend them from; an error unless
    /// exactly the whole encoding was fed.
    pub fn finish(self) -> Result<(LayerDigests, DigestState)> {
        if self.prefix_differs {
            return Err(Error::Invalid(
                "the bytes fed begin with another snapshot header".into(),
            ));
        }
        let end = self
            .ranges
            .last()
            .map_or(self.prefix.len() as u64, |r| r.end);
        if self.at != end {
            return Err(Error::Invalid(format!(
                "fed {} bytes of a {end}-byte encoding",
                self.at
            )));
        }
        let hashed = self
            .states
            .into_iter()
            .map(|(st, at_cut)| {
                let at_cut = at_cut.unwrap_or_else(|| st.clone());
                (st.finalize(), at_cut)
            })
            .collect();
        DigestState::finish(self.header, self.settled, hashed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer_digest::tests::{flat, layout_strategy, next_turn, reference};
    use crate::layer_digest::{stream_digest, LayerHashPlan};
    use proptest::prelude::*;

    /// Large pieces (multi-threaded subtree hashing at an offset) and every
    /// boundary case of the chunk grid around them.
    #[test]
    fn a_stream_state_matches_blake3_on_large_streams() {
        let bytes = crate::synth::bytes(11, (20 << 20) + 777);
        for first in [0usize, 1, 1023, 1024, 1025, 4096, (9 << 20) + 5, 16 << 20] {
            let mut st = StreamState::new();
            st.absorb(&bytes[..first]);
            assert_eq!(st.finalize(), stream_digest(&bytes[..first]), "{first}");
            st.absorb(&bytes[first..]);
            assert_eq!(st.finalize(), stream_digest(&bytes), "{first}");
        }
        // Chunk by chunk: every lazily merged stack shape.
        let mut st = StreamState::new();
        for n in 1..=33usize {
            st.absorb(&bytes[(n - 1) * 1024..n * 1024]);
            assert_eq!(
                st.finalize(),
                stream_digest(&bytes[..n * 1024]),
                "{n} chunks"
            );
        }
        let empty = StreamState::new();
        assert!(empty.is_empty());
        assert_eq!(empty.finalize(), stream_digest(&[]));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Extension equals hashing from scratch, turn after turn; the
        /// block plan agrees with both, for any block size.
        #[test]
        fn extension_equals_scratch(
            l in layout_strategy(),
            first in 1u64..6,
            steps in prop::collection::vec(1u64..5, 1..5),
            block_log in 10u32..16,
            seed in any::<u64>(),
        ) {
            let mut b = first * 64;
            let mut snap = flat(&l, b, seed);
            let (d0, mut state) = DigestState::capture(&snap).expect("capture");
            prop_assert_eq!(d0.snapshot, reference(&snap));
            for (k, s) in steps.iter().enumerate() {
                b += s * 64;
                let (next, tails) = next_turn(&snap, b, seed ^ k as u64);
                let refs: Vec<&[u8]> = tails.iter().map(Vec::as_slice).collect();
                let (ext, st) = state.extend(next.header(), &refs).expect("extend");
                prop_assert_eq!(ext.snapshot, reference(&next));
                let (scratch, _) = DigestState::capture(&next).expect("capture");
                prop_assert_eq!(&ext, &scratch);
                let (via, _) = state.extend_to(&next).expect("extend_to");
                prop_assert_eq!(&via, &scratch);
                let off = (next.encoded().len() - next.payload().len()) as u64;
                let plan = LayerHashPlan::new(next.header(), off, 1 << block_log).expect("plan");
                let hashes: Vec<[u8; 32]> = plan.blocks().iter().enumerate().map(|(i, bl)| {
                    plan.hash_block(i, &next.encoded()[bl.range.0 as usize..bl.range.1 as usize]).expect("block")
                }).collect();
                prop_assert_eq!(plan.stream_digests(&hashes).expect("merge"), scratch.streams.clone());
                prop_assert_eq!(plan.finish(&next.encoded()[..off as usize], &hashes).expect("finish"), scratch.snapshot);
                // The state a reader gets from the blocks it verified is the
                // publisher's: the same settled pages, the same digests, and
                // (every other turn) the one the next turn extends.
                let from_plan = plan.digest_state(scratch.snapshot, next.encoded(), &hashes).expect("state");
                prop_assert_eq!(from_plan.settled(), st.settled());
                prop_assert_eq!(from_plan.digest(), st.digest());
                for (a, b) in from_plan.states.iter().zip(&st.states) {
                    prop_assert_eq!(a.len(), b.len());
                    prop_assert_eq!(a.finalize(), b.finalize());
                }
                state = if k % 2 == 0 { from_plan } else { st };
                snap = next;
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// A feed given a snapshot's encoding in any pieces gives what a
        /// capture of the whole gives (digests and the state to extend),
        /// and refuses a changed header or a short feed.
        #[test]
        fn a_feed_in_any_pieces_equals_a_capture(
            l in layout_strategy(),
            blocks in 1u64..6,
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
            seed in any::<u64>(),
        ) {
            let snap = flat(&l, blocks * 64, seed);
            let enc = snap.encoded();
            let off = (enc.len() - snap.payload().len()) as u64;
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(enc.len() + 1)).collect();
            at.push(0);
            at.push(enc.len());
            at.sort_unstable();
            let mut feed = StreamFeed::new(snap.header(), off).expect("feed");
            for w in at.windows(2) {
                feed.feed(&enc[w[0]..w[1]]);
            }
            let (fd, fst) = feed.finish().expect("finish");
            let (cd, cst) = DigestState::capture(&snap).expect("capture");
            prop_assert_eq!(&fd, &cd);
            prop_assert_eq!(&fst.settled, &cst.settled);
            // The states may keep equal subtrees merged or not (merged
            // lazily); they must extend alike.
            let (next, tails) = next_turn(&snap, blocks * 64 + 64, seed ^ 1);
            let refs: Vec<&[u8]> = tails.iter().map(Vec::as_slice).collect();
            let (fe, _) = fst.extend(next.header(), &refs).expect("extend");
            let (ce, _) = cst.extend(next.header(), &refs).expect("extend");
            prop_assert_eq!(&fe, &ce);
            // A short feed, and a changed header byte, are refused.
            let mut short = StreamFeed::new(snap.header(), off).expect("feed");
            short.feed(&enc[..enc.len() - 1]);
            prop_assert!(short.finish().is_err());
            let mut bad = enc.to_vec();
            bad[8] ^= 1;
            let mut changed = StreamFeed::new(snap.header(), off).expect("feed");
            changed.feed(&bad);
            prop_assert!(changed.finish().is_err());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A stream state absorbing a stream in any pieces finalizes to the
        /// stream digest of what it absorbed, after every piece (every
        /// shape of BLAKE3's tree up to 48 chunks, partial chunks included).
        #[test]
        fn a_stream_state_is_blake3_in_any_pieces(
            len in 0usize..49 * 1024,
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
            seed in any::<u64>(),
        ) {
            let bytes = crate::synth::bytes(seed, len);
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(len + 1)).collect();
            at.push(0);
            at.push(len);
            at.sort_unstable();
            let mut st = StreamState::new();
            for w in at.windows(2) {
                st.absorb(&bytes[w[0]..w[1]]);
                prop_assert_eq!(st.len(), w[1] as u64);
                prop_assert_eq!(st.finalize(), stream_digest(&bytes[..w[1]]));
            }
        }
    }
}

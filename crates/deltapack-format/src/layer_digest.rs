//! The layered snapshot digest (`blake3-layers`): a snapshot digest that
//! extends.
//!
//! The first snapshot digest (`blake3:`, kept verifiable forever) is BLAKE3 of
//! the whole snapshot encoding. Its payload is laid out `[group][layer]
//! [pages]`, so appending one page to every layer moves every layer's bytes:
//! no hashing state of turn N can be reused for turn N+1, and publishing one
//! more turn of a long conversation re-hashes the whole conversation.
//!
//! The layered digest hashes each (group, layer) page run — a *stream* — on
//! its own, and then the snapshot from its header and the ordered stream
//! digests:
//!
//! ```text
//! stream_i  = BLAKE3-derive-key(LAYER_STREAM_CONTEXT, pages of stream i)
//! snapshot  = BLAKE3-derive-key(LAYERS_DIGEST_CONTEXT,
//!               u64le(len(prefix)) ‖ prefix ‖ u64le(n) ‖ stream_0 ‖ … ‖ stream_{n-1})
//! ```
//!
//! where `prefix` is the snapshot encoding's first bytes (magic, header
//! length, CBOR header: layout, boundary, block counts) and streams are in
//! payload order (group by group, layer by layer). Text form
//! `blake3-layers:<hex>` ([`Algorithm::Blake3Layers`]), so a digest says
//! which definition it follows and can never compare equal to the other.
//!
//! Why it is as strong a check as the old one: the prefix fixes the layout
//! and the block counts, hence every stream's length and position; each
//! stream digest is a collision-resistant hash of exactly its stream's bytes
//! (BLAKE3 binds the input length); the top hash binds the prefix and every
//! stream digest in order. Two encodings with the same layered digest
//! therefore have the same prefix and the same bytes in every stream — the
//! same encoding — unless BLAKE3 collides. The two contexts separate the
//! domains: no stream digest is a snapshot digest, and neither is a plain
//! `blake3:` digest of anything.
//!
//! What it buys:
//! * **Extension.** A stream's BLAKE3 state after its first `k` pages is all
//!   that is needed to hash the stream with more pages after them
//!   ([`DigestState`]): publishing turn N+1 hashes the new pages only.
//! * **A state that can be written down.** That state is the chaining
//!   values of the stream's complete subtrees plus its last raw chunk
//!   ([`StreamState`]); a root records the chaining values
//!   ([`StoredState`]), and a process holding the snapshot rebuilds and
//!   proves the state by finishing every stream from that point
//!   ([`DigestState::resume`], about one page per stream hashed).
//! * **One layer alone.** A reader can check one (group, layer) stream
//!   against the stream digests a root records, which the top digest
//!   authenticates ([`combine`]).
//! * **Parallel verification.** Each stream is an ordinary BLAKE3 tree (in
//!   derive-key mode), so a restore hashes aligned blocks of every stream on
//!   any core, in any order, and merges them ([`LayerHashPlan`]): one pass,
//!   as fast as the whole-encoding digest.

use std::ops::Range;

use blake3::hazmat::{ChainingValue, ContextKey, HasherExt, Mode};

use crate::digest::{Algorithm, Digest};
use crate::error::{Error, Result};
use crate::layout::GroupKind;
use crate::snapshot::{Snapshot, SnapshotHeader};

/// BLAKE3 derive-key context of one (group, layer) stream.
pub const LAYER_STREAM_CONTEXT: &str = "deltapack 2026-12-03 snapshot layer stream v1";
/// BLAKE3 derive-key context of the layered snapshot digest.
pub const LAYERS_DIGEST_CONTEXT: &str = "deltapack 2026-12-03 snapshot layers digest v1";
/// Most streams a snapshot with a layered digest may have (a root records
/// 32 bytes per stream; 65,536 streams are 2 MiB). Larger layouts keep the
/// whole-encoding digest.
pub const MAX_LAYER_STREAMS: usize = 1 << 16;

/// A stream digest: 32 bytes, BLAKE3 in derive-key mode
/// ([`LAYER_STREAM_CONTEXT`]) of one (group, layer) run of pages.
pub type StreamDigest = [u8; 32];

fn stream_key() -> &'static ContextKey {
    static KEY: std::sync::OnceLock<ContextKey> = std::sync::OnceLock::new();
    KEY.get_or_init(|| blake3::hazmat::hash_derive_key_context(LAYER_STREAM_CONTEXT))
}

/// A fresh hasher for one stream.
pub fn stream_hasher() -> blake3::Hasher {
    blake3::Hasher::new_from_context_key(stream_key())
}

/// The stream digest of one stream's bytes (multi-threaded when large).
pub fn stream_digest(bytes: &[u8]) -> StreamDigest {
    let mut h = stream_hasher();
    update(&mut h, bytes);
    *h.finalize().as_bytes()
}

fn update(h: &mut blake3::Hasher, bytes: &[u8]) {
    if bytes.len() > (8 << 20) {
        h.update_rayon(bytes);
    } else {
        h.update(bytes);
    }
}

/// BLAKE3's chunk length: subtrees of a stream's tree are whole chunks.
const CHUNK: u64 = 1024;

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
    pieces: Vec<(u64, ChainingValue)>,
    end: u64,
    partial: Vec<u8>,
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
    fn merge_equal(pieces: &mut Vec<(u64, ChainingValue)>) {
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
    fn push(&mut self, len: u64, cv: ChainingValue) {
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

/// The layered snapshot digest from the snapshot's prefix (magic, length,
/// CBOR header) and its stream digests in payload order.
pub fn combine(prefix: &[u8], streams: &[StreamDigest]) -> Digest {
    let mut h = blake3::Hasher::new_derive_key(LAYERS_DIGEST_CONTEXT);
    h.update(&(prefix.len() as u64).to_le_bytes());
    h.update(prefix);
    h.update(&(streams.len() as u64).to_le_bytes());
    for s in streams {
        h.update(s);
    }
    Digest::new(Algorithm::Blake3Layers, *h.finalize().as_bytes())
}

/// Whether snapshots of this header's layout may use the layered digest
/// (at most [`MAX_LAYER_STREAMS`] streams).
pub fn supported(header: &SnapshotHeader) -> bool {
    stream_count(header) <= MAX_LAYER_STREAMS
}

/// Number of (group, layer) streams of a layout.
pub fn stream_count(header: &SnapshotHeader) -> usize {
    header.layout.groups.iter().map(|g| g.layers.len()).sum()
}

/// `(group, layer)` of every stream of a layout, in payload order (the
/// stream index is the position in this list).
pub fn stream_layers(header: &SnapshotHeader) -> Vec<(usize, usize)> {
    header
        .layout
        .groups
        .iter()
        .enumerate()
        .flat_map(|(g, grp)| (0..grp.layers.len()).map(move |l| (g, l)))
        .collect()
}

/// Every stream's range in the snapshot *encoding* whose payload starts at
/// `payload_offset`, in payload order.
pub fn stream_ranges(header: &SnapshotHeader, payload_offset: u64) -> Result<Vec<Range<u64>>> {
    let offs = header.layout.layer_offsets(&header.block_counts)?;
    let mut out = Vec::with_capacity(stream_count(header));
    for (gi, g) in header.layout.groups.iter().enumerate() {
        for (li, l) in g.layers.iter().enumerate() {
            let start = payload_offset + offs[gi][li];
            out.push(start..start + l.bytes_per_page * header.block_counts[gi]);
        }
    }
    Ok(out)
}

/// A snapshot's layered digest and its stream digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerDigests {
    /// The layered snapshot digest (`blake3-layers:`).
    pub snapshot: Digest,
    /// Every stream's digest, in payload order.
    pub streams: Vec<StreamDigest>,
}

impl LayerDigests {
    /// The stream digests as one byte string (32 bytes each, in order), the
    /// form a root records.
    pub fn stream_bytes(&self) -> Vec<u8> {
        self.streams.concat()
    }
}

/// Splits a byte string of stream digests (32 bytes each) back into
/// digests; `None` when its length is not a multiple of 32.
pub fn split_streams(bytes: &[u8]) -> Option<Vec<StreamDigest>> {
    if bytes.len() % 32 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(32)
            .map(|c| {
                let mut d = [0u8; 32];
                d.copy_from_slice(c);
                d
            })
            .collect(),
    )
}

fn unsupported(header: &SnapshotHeader) -> Error {
    Error::Invalid(format!(
        "{} streams exceed the layered digest's limit of {MAX_LAYER_STREAMS}",
        stream_count(header)
    ))
}

/// The layered digest of a snapshot, hashing its streams on all cores.
pub fn of_snapshot(s: &Snapshot) -> Result<LayerDigests> {
    DigestState::capture(s).map(|(d, _)| d)
}

/// The snapshot digest of `s` by the definition `like` follows: the layered
/// digest for a `blake3-layers` digest, BLAKE3 of the encoding otherwise.
pub fn digest_like(s: &Snapshot, like: &Digest) -> Result<Digest> {
    match like.algorithm() {
        Algorithm::Blake3Layers => of_snapshot(s).map(|d| d.snapshot),
        _ => Ok(s.digest()),
    }
}

/// The snapshot digest of an encoding held in any slice (no copy), by the
/// definition `like` follows: the layered digest (streams hashed on all
/// cores) for `blake3-layers`, BLAKE3 of the encoding otherwise. The
/// encoding's header is validated; its payload length must match.
pub fn digest_like_encoding(enc: &[u8], like: &Digest) -> Result<Digest> {
    if like.algorithm() != Algorithm::Blake3Layers {
        return Ok(crate::snapshot::digest_of_encoding(enc));
    }
    let (header, payload_offset) = crate::snapshot::decode_prefix(enc)?;
    let want = header.validate()?;
    if (enc.len() - payload_offset) as u64 != want {
        return Err(Error::Snapshot(format!(
            "payload is {} bytes, the header implies {want}",
            enc.len() - payload_offset
        )));
    }
    if !supported(&header) {
        return Err(unsupported(&header));
    }
    let ranges = stream_ranges(&header, payload_offset as u64)?;
    let streams = par_map(ranges.len(), |i| {
        stream_digest(&enc[ranges[i].start as usize..ranges[i].end as usize])
    });
    Ok(combine(&enc[..payload_offset], &streams))
}

/// Pages of each group whose bytes no later turn can change: the complete
/// pages of a `full` group (those wholly below the boundary), none of a
/// `recurrent` group (its one checkpoint page is rewritten every turn).
pub fn settled_pages(header: &SnapshotHeader) -> Vec<u64> {
    header
        .layout
        .groups
        .iter()
        .map(|g| match g.kind {
            GroupKind::Full => header.boundary / u64::from(g.tokens_per_page.max(1)),
            GroupKind::Recurrent => 0,
        })
        .collect()
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
    header: SnapshotHeader,
    digest: Digest,
    settled: Vec<u64>,
    states: Vec<StreamState>,
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

/// The written-down form of a [`DigestState`]: per stream, the chaining
/// values of the complete subtrees before its state point (the binary
/// decomposition of the point in chunks, largest first), without the raw
/// last chunk, which a reader takes from the snapshot it holds. 32 bytes per
/// set bit of the point's chunk count: at most ~15 per stream of a
/// 262,144-token conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredState {
    /// Per stream, in payload order: its subtrees' chaining values.
    pub streams: Vec<Vec<ChainingValue>>,
}

/// The state point of a stream whose first `settled` bytes are settled:
/// the chunk boundary that leaves 1..=1024 bytes raw (0 for none).
fn state_point(settled: u64) -> u64 {
    match settled % CHUNK {
        _ if settled == 0 => 0,
        0 => settled - CHUNK,
        rem => settled - rem,
    }
}

/// Per stream (payload order), the number of subtree chaining values the
/// written-down state of a snapshot with `header` holds: the set bits of its
/// state point's chunk count. Depends on the header alone, so the byte form
/// ([`StoredState::to_bytes`]) needs no lengths of its own.
pub fn stored_counts(header: &SnapshotHeader) -> Vec<usize> {
    stream_points(header)
        .map(|(_, point)| (point / CHUNK).count_ones() as usize)
        .collect()
}

/// Per stream (payload order): its length in bytes and its state point
/// (where the stored state of a snapshot with `header` stands).
fn stream_points(header: &SnapshotHeader) -> impl Iterator<Item = (u64, u64)> + '_ {
    let settled = settled_pages(header);
    let groups = group_of_stream(header);
    let bpp = bytes_per_page(header);
    (0..groups.len()).map(move |i| {
        let g = groups[i];
        let len = header
            .block_counts
            .get(g)
            .copied()
            .unwrap_or(0)
            .saturating_mul(bpp[i]);
        (len, state_point(settled[g].saturating_mul(bpp[i]).min(len)))
    })
}

/// Bytes [`DigestState::resume`] hashes to prove a stored state of a
/// snapshot with `header`: every stream from its state point on (its last
/// settled chunk and its unsettled pages).
pub fn resume_bytes(header: &SnapshotHeader) -> u64 {
    stream_points(header).map(|(len, point)| len - point).sum()
}

impl StoredState {
    /// The byte form a v2.2 root records (`turn_state`): every stream's
    /// chaining values, 32 bytes each, stream after stream, largest subtree
    /// first; the per-stream counts follow from the header ([`stored_counts`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.streams
            .iter()
            .flatten()
            .flat_map(|cv| cv.iter().copied())
            .collect()
    }

    /// Splits the byte form of a snapshot with `header`'s state. Errors on
    /// an unsupported header or a length that is not exactly 32 bytes per
    /// chaining value the header calls for. Says nothing about the values
    /// themselves: [`DigestState::resume`] proves them.
    pub fn from_bytes(header: &SnapshotHeader, bytes: &[u8]) -> Result<StoredState> {
        if !supported(header) {
            return Err(unsupported(header));
        }
        let counts = stored_counts(header);
        let want: usize = counts.iter().sum::<usize>() * 32;
        if bytes.len() != want {
            return Err(Error::Invalid(format!(
                "a turn state of {} bytes; the header calls for {want}",
                bytes.len()
            )));
        }
        let mut at = 0usize;
        let streams = counts
            .iter()
            .map(|&n| {
                (0..n)
                    .map(|_| {
                        let mut cv = [0u8; 32];
                        cv.copy_from_slice(&bytes[at..at + 32]);
                        at += 32;
                        cv
                    })
                    .collect()
            })
            .collect();
        Ok(StoredState { streams })
    }
}

impl DigestState {
    /// The written-down form of this state (see [`StoredState`]).
    pub fn stored(&self) -> StoredState {
        StoredState {
            streams: self
                .states
                .iter()
                .map(|st| {
                    let mut pieces = st.pieces.clone();
                    StreamState::merge_equal(&mut pieces);
                    pieces.into_iter().map(|(_, cv)| cv).collect()
                })
                .collect(),
        }
    }

    /// Rebuilds the state of snapshot `s` from its written-down form, and
    /// proves it: every stream is finished from its state point with `s`'s
    /// own bytes (its last settled chunk and its unsettled pages: at most
    /// about one page per stream is hashed) and must give the stream digest
    /// `streams[i]`, and the stream digests must combine to `digest`. A
    /// stored state that does not belong to `s`'s streams fails (short of a
    /// BLAKE3 collision); the caller then captures the state by hashing.
    ///
    /// What it proves about `s` is its unsettled bytes and last settled
    /// chunks, not every byte: the state stands for the settled pages the
    /// digest covers, which is what extending it needs.
    pub fn resume(
        s: &Snapshot,
        digest: Digest,
        streams: &[StreamDigest],
        stored: &StoredState,
    ) -> Result<DigestState> {
        let header = s.header().clone();
        if !supported(&header) || digest.algorithm() != Algorithm::Blake3Layers {
            return Err(unsupported(&header));
        }
        let payload_offset = (s.encoded().len() - s.payload().len()) as u64;
        let ranges = stream_ranges(&header, payload_offset)?;
        if ranges.len() != streams.len() || ranges.len() != stored.streams.len() {
            return Err(Error::Invalid(format!(
                "a stored state of {} streams and {} stream digests for {} streams",
                stored.streams.len(),
                streams.len(),
                ranges.len()
            )));
        }
        let prefix = header.encode_prefix()?;
        if combine(&prefix, streams) != digest {
            return Err(Error::Invalid(
                "the stream digests do not combine to the snapshot digest".into(),
            ));
        }
        let settled = settled_pages(&header);
        let groups = group_of_stream(&header);
        let bpp = bytes_per_page(&header);
        let enc = s.encoded();
        // Each stream on its own core: a recurrent group's streams are
        // hashed whole (nothing of them is settled), the others from their
        // last settled chunk on.
        let states = par_map(ranges.len(), |i| -> Result<StreamState> {
            let r = &ranges[i];
            let len = r.end - r.start;
            let point_bytes = (settled[groups[i]] * bpp[i]).min(len);
            let point = state_point(point_bytes);
            let cvs = &stored.streams[i];
            let chunks = point / CHUNK;
            if cvs.len() != chunks.count_ones() as usize {
                return Err(Error::Invalid(format!(
                    "stream {i}: {} stored subtrees, its state point needs {}",
                    cvs.len(),
                    chunks.count_ones()
                )));
            }
            let mut st = StreamState::new();
            let mut bit = 63u32;
            for cv in cvs {
                while chunks & (1u64 << bit) == 0 {
                    bit -= 1;
                }
                st.pieces.push(((1u64 << bit) * CHUNK, *cv));
                st.end += (1u64 << bit) * CHUNK;
                bit = bit.saturating_sub(1);
            }
            let bytes = &enc[r.start as usize..r.end as usize];
            st.partial = bytes[point as usize..point_bytes as usize].to_vec();
            let mut full = st.clone();
            full.absorb(&bytes[point_bytes as usize..]);
            if full.finalize() != streams[i] {
                return Err(Error::Invalid(format!(
                    "stream {i}: the stored state does not finish to its digest"
                )));
            }
            Ok(st)
        })
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
        Ok(DigestState {
            header,
            digest,
            settled,
            states,
        })
    }
}

/// `f(0), …, f(n-1)` on rayon's pool (the one BLAKE3's `update_rayon`
/// uses), split in halves down to single items.
fn par_map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    fn go<T: Send>(lo: usize, hi: usize, f: &(impl Fn(usize) -> T + Sync), out: &mut Vec<T>) {
        if hi - lo <= 1 {
            out.extend((lo..hi).map(f));
            return;
        }
        let mid = lo + (hi - lo) / 2;
        let (mut left, mut right) = (Vec::new(), Vec::new());
        rayon_core::join(|| go(lo, mid, f, &mut left), || go(mid, hi, f, &mut right));
        out.append(&mut left);
        out.append(&mut right);
    }
    let mut out = Vec::with_capacity(n);
    go(0, n, &f, &mut out);
    out
}

fn group_of_stream(h: &SnapshotHeader) -> Vec<usize> {
    h.layout
        .groups
        .iter()
        .enumerate()
        .flat_map(|(gi, g)| std::iter::repeat_n(gi, g.layers.len()))
        .collect()
}

fn bytes_per_page(h: &SnapshotHeader) -> Vec<u64> {
    h.layout
        .groups
        .iter()
        .flat_map(|g| g.layers.iter().map(|l| l.bytes_per_page))
        .collect()
}

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
    use crate::layout::{LayerSpec, PageGroup, PageLayout};
    use proptest::prelude::*;

    fn layout(groups: &[(GroupKind, u32, Vec<u64>)]) -> PageLayout {
        PageLayout {
            groups: groups
                .iter()
                .map(|(kind, tpp, bpps)| PageGroup {
                    kind: *kind,
                    tokens_per_page: *tpp,
                    layers: bpps
                        .iter()
                        .enumerate()
                        .map(|(i, &b)| LayerSpec {
                            name: format!("l{i}"),
                            dtype: "u8".into(),
                            bytes_per_page: b,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// The definition written out naively, for comparison.
    fn reference(s: &Snapshot) -> Digest {
        let prefix = s.header().encode_prefix().expect("prefix");
        let off = prefix.len() as u64;
        let streams: Vec<StreamDigest> = stream_ranges(s.header(), off)
            .expect("ranges")
            .iter()
            .map(|r| {
                *blake3::Hasher::new_derive_key(LAYER_STREAM_CONTEXT)
                    .update(&s.encoded()[r.start as usize..r.end as usize])
                    .finalize()
                    .as_bytes()
            })
            .collect();
        combine(&prefix, &streams)
    }

    /// The next turn: the base's settled pages kept, everything after them
    /// new.
    fn next_turn(base: &Snapshot, boundary: u64, seed: u64) -> (Snapshot, Vec<Vec<u8>>) {
        let header = SnapshotHeader::new(base.layout().clone(), boundary);
        let settled = settled_pages(base.header());
        let mut payload = Vec::new();
        let mut tails = Vec::new();
        for (gi, g) in header.layout.groups.iter().enumerate() {
            for (li, l) in g.layers.iter().enumerate() {
                let keep = settled[gi].min(header.block_counts[gi]);
                let old = base.layer_range(gi, li).expect("layer");
                let kept =
                    &base.payload()[old.start..old.start + (keep * l.bytes_per_page) as usize];
                let tail = crate::synth::bytes(
                    seed ^ ((gi as u64) << 20) ^ li as u64,
                    ((header.block_counts[gi] - keep) * l.bytes_per_page) as usize,
                );
                payload.extend_from_slice(kept);
                payload.extend_from_slice(&tail);
                tails.push(tail);
            }
        }
        (
            Snapshot::from_parts(header, &payload).expect("snapshot"),
            tails,
        )
    }

    fn flat(layout: &PageLayout, boundary: u64, seed: u64) -> Snapshot {
        let header = SnapshotHeader::new(layout.clone(), boundary);
        let len = header.validate().expect("valid") as usize;
        Snapshot::from_parts(header, &crate::synth::bytes(seed, len)).expect("snapshot")
    }

    fn layout_strategy() -> impl Strategy<Value = PageLayout> {
        prop::collection::vec(
            (
                prop_oneof![Just(GroupKind::Full), Just(GroupKind::Recurrent)],
                prop_oneof![Just(16u32), Just(64), Just(256), Just(100)],
                prop::collection::vec(1u64..600, 1..4),
            ),
            1..3,
        )
        .prop_map(|g| layout(&g))
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

        /// A flipped byte anywhere in the payload changes exactly that
        /// stream's digest, and the snapshot digest.
        #[test]
        fn a_flipped_byte_fails_its_layer_and_the_snapshot(
            l in layout_strategy(),
            pages in 1u64..8,
            at in any::<prop::sample::Index>(),
            seed in any::<u64>(),
        ) {
            let snap = flat(&l, pages * 64, seed);
            let good = of_snapshot(&snap).expect("digest");
            let mut enc = snap.encoded().to_vec();
            let off = enc.len() - snap.payload().len();
            let pos = off + at.index(snap.payload().len());
            enc[pos] ^= 0x40;
            let bad_snap = Snapshot::from_encoded(enc).expect("same header");
            let bad = of_snapshot(&bad_snap).expect("digest");
            prop_assert_ne!(bad.snapshot, good.snapshot);
            let ranges = stream_ranges(snap.header(), off as u64).expect("ranges");
            for (i, r) in ranges.iter().enumerate() {
                let hit = r.contains(&(pos as u64));
                prop_assert_eq!(bad.streams[i] != good.streams[i], hit, "stream {}", i);
            }
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

        /// A written-down state resumes to one that extends exactly like
        /// the captured one; a state of another snapshot is refused.
        #[test]
        fn a_stored_state_resumes_and_extends(
            l in layout_strategy(),
            first in 1u64..40,
            step in 1u64..5,
            seed in any::<u64>(),
        ) {
            let snap = flat(&l, first * 64, seed);
            let (d, state) = DigestState::capture(&snap).expect("capture");
            let stored = state.stored();
            let resumed = DigestState::resume(&snap, d.snapshot, &d.streams, &stored).expect("resume");
            let (next, tails) = next_turn(&snap, (first + step) * 64, seed ^ 5);
            let refs: Vec<&[u8]> = tails.iter().map(Vec::as_slice).collect();
            let (a, _) = state.extend(next.header(), &refs).expect("extend");
            let (b, after) = resumed.extend(next.header(), &refs).expect("extend");
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(a.snapshot, reference(&next));
            // The byte form round-trips for captured and extended states,
            // and its length is exactly what the header calls for.
            let bytes = stored.to_bytes();
            prop_assert_eq!(&StoredState::from_bytes(snap.header(), &bytes).expect("split"), &stored);
            let later = after.stored();
            let later_bytes = later.to_bytes();
            prop_assert_eq!(
                later_bytes.len(),
                stored_counts(next.header()).iter().sum::<usize>() * 32
            );
            let back = StoredState::from_bytes(next.header(), &later_bytes).expect("split");
            let again = DigestState::resume(&next, b.snapshot, &b.streams, &back).expect("resume");
            prop_assert_eq!(again.digest(), b.snapshot);
            let mut long = later_bytes.clone();
            long.extend_from_slice(&[0u8; 32]);
            prop_assert!(StoredState::from_bytes(next.header(), &long).is_err());
            if !later_bytes.is_empty() {
                // A flipped bit in any chaining value is refused.
                let mut bad = later_bytes.clone();
                let at = (seed as usize) % bad.len();
                bad[at] ^= 1;
                let bad = StoredState::from_bytes(next.header(), &bad).expect("split");
                prop_assert!(DigestState::resume(&next, b.snapshot, &b.streams, &bad).is_err());
            }
            // Another snapshot of the same layout: refused.
            let other = flat(&l, first * 64, seed ^ 1);
            let od = of_snapshot(&other).expect("digest");
            if od.snapshot != d.snapshot {
                prop_assert!(DigestState::resume(&other, od.snapshot, &od.streams, &stored).is_err()
                    || stored.streams.iter().all(Vec::is_empty));
            }
        }
    }

    #[test]
    fn domains_are_separate_and_bad_tails_are_refused() {
        let l = layout(&[
            (GroupKind::Full, 64, vec![8, 4]),
            (GroupKind::Recurrent, 64, vec![3]),
        ]);
        let s = flat(&l, 256, 7);
        let d = of_snapshot(&s).expect("digest");
        assert_eq!(d.snapshot.algorithm(), Algorithm::Blake3Layers);
        assert!(d.snapshot.to_string().starts_with("blake3-layers:"));
        assert_ne!(d.snapshot.as_bytes(), s.digest().as_bytes());
        assert_eq!(digest_like(&s, &s.digest()).expect("like"), s.digest());
        assert_eq!(digest_like(&s, &d.snapshot).expect("like"), d.snapshot);
        assert_eq!(
            digest_like_encoding(s.encoded(), &d.snapshot).expect("like"),
            d.snapshot
        );
        assert_eq!(
            digest_like_encoding(s.encoded(), &s.digest()).expect("like"),
            s.digest()
        );
        assert!(digest_like_encoding(&s.encoded()[..s.encoded().len() - 1], &d.snapshot).is_err());
        assert_eq!(split_streams(&d.stream_bytes()).expect("split"), d.streams);
        assert!(split_streams(&[0; 33]).is_none());
        let (_, state) = DigestState::capture(&s).expect("capture");
        let (next, tails) = next_turn(&s, 512, 9);
        let mut refs: Vec<&[u8]> = tails.iter().map(Vec::as_slice).collect();
        // wrong count, wrong length, not above, other layout
        assert!(state.extend(next.header(), &refs[..2]).is_err());
        let short = &tails[0][1..];
        refs[0] = short;
        assert!(state.extend(next.header(), &refs).is_err());
        refs[0] = &tails[0];
        assert!(state.extend(s.header(), &refs).is_err());
        let other = SnapshotHeader::new(
            layout(&[
                (GroupKind::Full, 64, vec![8, 5]),
                (GroupKind::Recurrent, 64, vec![3]),
            ]),
            512,
        );
        assert!(state.extend(&other, &refs).is_err());
        assert!(state.extend(next.header(), &refs).is_ok());
    }
}

//! The definition's building blocks: what a stream is and how the layered
//! digest is computed from the streams.
//!
//! A snapshot's payload divides into (group, layer) *streams* in payload
//! order ([`stream_layers`], [`stream_ranges`]); each is hashed on its own
//! in derive-key mode ([`LAYER_STREAM_CONTEXT`], [`stream_digest`]) and the
//! snapshot digest is the prefix and the ordered stream digests hashed
//! under [`LAYERS_DIGEST_CONTEXT`] ([`combine`]). A group's *settled* pages
//! ([`settled_pages`]) are the ones no later turn can change: where the
//! extendable hashing state stands (see the `state` and `stored`
//! submodules) and where the verification plan cuts each stream (`plan`).
//!
//! Everything here depends on the header and the bytes alone; nothing keeps
//! state between turns. The helpers the other submodules share (the stream
//! key, per-stream group and page size, the parallel map) live here too, so
//! that every submodule depends on this one and this one on none of them.

use std::ops::Range;

use blake3::hazmat::{ContextKey, HasherExt};

use crate::digest::{Algorithm, Digest};
use crate::error::{Error, Result};
use crate::layout::GroupKind;
use crate::snapshot::SnapshotHeader;

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

pub(super) fn stream_key() -> &'static ContextKey {
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

pub(super) fn update(h: &mut blake3::Hasher, bytes: &[u8]) {
    if bytes.len() > (8 << 20) {
        h.update_rayon(bytes);
    } else {
        h.update(bytes);
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

pub(super) fn unsupported(header: &SnapshotHeader) -> Error {
    Error::Invalid(format!(
        "{} streams exceed the layered digest's limit of {MAX_LAYER_STREAMS}",
        stream_count(header)
    ))
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

/// `f(0), …, f(n-1)` on rayon's pool (the one BLAKE3's `update_rayon`
/// uses), split in halves down to single items.
pub(super) fn par_map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
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

pub(super) fn group_of_stream(h: &SnapshotHeader) -> Vec<usize> {
    h.layout
        .groups
        .iter()
        .enumerate()
        .flat_map(|(gi, g)| std::iter::repeat_n(gi, g.layers.len()))
        .collect()
}

pub(super) fn bytes_per_page(h: &SnapshotHeader) -> Vec<u64> {
    h.layout
        .groups
        .iter()
        .flat_map(|g| g.layers.iter().map(|l| l.bytes_per_page))
        .collect()
}

//! Snapshots and their canonical encoding.
//!
//! ```text
//! offset  size  field
//! 0       8     magic "DPSNAP\0\x01" (format version 1 in the last byte)
//! 8       4     header_len, u32 little endian (≤ MAX_SNAPSHOT_HEADER)
//! 12      h     header: CBOR map {layout, boundary, block_counts}
//! 12+h    p     payload: for each group, for each layer, its pages contiguous
//! ```
//!
//! `p` is fully determined by the header (`layout.payload_len(block_counts)`)
//! and the encoding must end exactly there. The snapshot digest is BLAKE3 of
//! the whole encoding. A [`Snapshot`] holds its encoding as shared,
//! immutable [`Bytes`], so handing it to a placement layer, hashing it or
//! writing slices of it never copies the payload, and the encoding may live
//! in memory that deltapack did not allocate (a caller's buffer wrapped with
//! [`Bytes::from_owner`], as the Python bindings do for publication).

use std::ops::Range;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::frame::{self, Framing};
use crate::layout::PageLayout;

/// Magic bytes of an encoded snapshot.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"DPSNAP\0\x01";
/// Largest accepted snapshot header (CBOR) in bytes.
pub const MAX_SNAPSHOT_HEADER: u32 = 1 << 20;
/// Bytes before the CBOR header.
pub const SNAPSHOT_PREFIX_LEN: usize = frame::PREFIX_LEN;

/// The header of an encoded snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotHeader {
    /// The page layout.
    pub layout: PageLayout,
    /// Tokens covered by this snapshot.
    pub boundary: u64,
    /// Pages per group.
    pub block_counts: Vec<u64>,
}

impl SnapshotHeader {
    /// A header for `layout` at `boundary` with the implied block counts.
    pub fn new(layout: PageLayout, boundary: u64) -> Self {
        let block_counts = layout.block_counts(boundary);
        SnapshotHeader {
            layout,
            boundary,
            block_counts,
        }
    }

    /// Validates the layout and the counts, returning the payload length.
    pub fn validate(&self) -> Result<u64> {
        self.layout.validate()?;
        self.layout
            .check_counts(self.boundary, &self.block_counts)?;
        self.layout.payload_len(&self.block_counts)
    }

    /// Magic + length + CBOR header: the bytes before the payload.
    pub fn encode_prefix(&self) -> Result<Vec<u8>> {
        self.validate()?;
        let cbor = serde_cbor::to_vec(self).map_err(|e| Error::Snapshot(e.to_string()))?;
        let len = u32::try_from(cbor.len())
            .ok()
            .filter(|&l| l <= MAX_SNAPSHOT_HEADER)
            .ok_or_else(|| Error::Bounds(format!("snapshot header of {} bytes", cbor.len())))?;
        let mut out = Vec::with_capacity(SNAPSHOT_PREFIX_LEN + cbor.len());
        out.extend_from_slice(&SNAPSHOT_MAGIC);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&cbor);
        Ok(out)
    }

    /// Total encoded length (prefix + payload).
    pub fn encoded_len(&self) -> Result<u64> {
        let payload = self.validate()?;
        let prefix = self.encode_prefix()?.len() as u64;
        prefix
            .checked_add(payload)
            .ok_or_else(|| Error::Bounds("snapshot length overflows".into()))
    }
}

/// The snapshot's framing (magic, header bound, messages).
const FRAMING: Framing = Framing::new(
    SNAPSHOT_MAGIC,
    MAX_SNAPSHOT_HEADER,
    "snapshot",
    Error::Snapshot,
)
.bad_magic("bad magic (not an encoded snapshot, or unknown version)");

/// Parses the prefix of an encoded snapshot: returns the header and the
/// payload offset. Checks every length against `bytes.len()` (which may be
/// only a prefix of the encoding) before allocating.
pub fn decode_prefix(bytes: &[u8]) -> Result<(SnapshotHeader, usize)> {
    let (header, end): (SnapshotHeader, usize) = FRAMING.decode(bytes)?;
    header.validate()?;
    Ok((header, end))
}

/// The length of an encoded snapshot's prefix (magic, length, CBOR
/// header; the payload starts there), from its first 12 bytes or more: the
/// header length is checked against its bound, nothing is decoded. What a
/// reader of a file reads before [`decode_prefix`].
pub fn prefix_len(first: &[u8]) -> Result<u64> {
    FRAMING.prefix_len(first).map(|n| n as u64)
}

/// A snapshot: its parsed header plus its full canonical encoding.
#[derive(Clone, PartialEq, Eq)]
pub struct Snapshot {
    header: SnapshotHeader,
    bytes: Bytes,
    payload_offset: usize,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("boundary", &self.header.boundary)
            .field("block_counts", &self.header.block_counts)
            .field("encoded_len", &self.bytes.len())
            .finish()
    }
}

impl Snapshot {
    /// Decodes (and validates) an encoding, taking ownership without copying.
    pub fn from_encoded(bytes: Vec<u8>) -> Result<Self> {
        Self::from_bytes(Bytes::from(bytes))
    }

    /// Decodes (and validates) an encoding held in any [`Bytes`], without
    /// copying: the snapshot shares the memory (e.g. a caller's buffer
    /// wrapped with [`Bytes::from_owner`]). The checks are those of
    /// [`Snapshot::from_encoded`]. Whoever owns that memory must not change
    /// it while the snapshot is alive: a snapshot's bytes are immutable.
    pub fn from_bytes(bytes: Bytes) -> Result<Self> {
        let (header, payload_offset) = decode_prefix(&bytes)?;
        let want = header.validate()?;
        let have = (bytes.len() - payload_offset) as u64;
        if have != want {
            return Err(Error::Snapshot(format!(
                "payload is {have} bytes, the header implies {want} (truncated or trailing bytes)"
            )));
        }
        Ok(Snapshot {
            header,
            bytes,
            payload_offset,
        })
    }

    /// Builds a snapshot from a header and its payload.
    pub fn from_parts(header: SnapshotHeader, payload: &[u8]) -> Result<Self> {
        let mut bytes = header.encode_prefix()?;
        let want = header.validate()?;
        if payload.len() as u64 != want {
            return Err(Error::Snapshot(format!(
                "payload is {} bytes, header implies {want}",
                payload.len()
            )));
        }
        let payload_offset = bytes.len();
        bytes.extend_from_slice(payload);
        Ok(Snapshot {
            header,
            bytes: Bytes::from(bytes),
            payload_offset,
        })
    }

    /// The header.
    pub fn header(&self) -> &SnapshotHeader {
        &self.header
    }

    /// The page layout.
    pub fn layout(&self) -> &PageLayout {
        &self.header.layout
    }

    /// Tokens covered.
    pub fn boundary(&self) -> u64 {
        self.header.boundary
    }

    /// Pages per group.
    pub fn block_counts(&self) -> &[u64] {
        &self.header.block_counts
    }

    /// The full canonical encoding.
    pub fn encoded(&self) -> &[u8] {
        &self.bytes
    }

    /// The full canonical encoding as shared [`Bytes`] (a reference count,
    /// no copy): slices of it can be written without copying.
    pub fn encoded_bytes(&self) -> Bytes {
        self.bytes.clone()
    }

    /// Consumes the snapshot, returning its encoding. No copy when the
    /// snapshot was built from a `Vec` and nothing else shares its bytes;
    /// otherwise the encoding is copied into a new `Vec`.
    pub fn into_encoded(self) -> Vec<u8> {
        Vec::from(self.bytes)
    }

    /// The payload (pages) only.
    pub fn payload(&self) -> &[u8] {
        &self.bytes[self.payload_offset..]
    }

    /// The snapshot digest: BLAKE3 of the encoding.
    pub fn digest(&self) -> Digest {
        digest_of_encoding(&self.bytes)
    }

    /// The bytes of all pages of one (group, layer) in the payload.
    pub fn layer_range(&self, group: usize, layer: usize) -> Option<Range<usize>> {
        let g = self.header.layout.groups.get(group)?;
        let l = g.layers.get(layer)?;
        let offs = self
            .header
            .layout
            .layer_offsets(&self.header.block_counts)
            .ok()?;
        let start = *offs.get(group)?.get(layer)? as usize;
        let len = (l.bytes_per_page * self.header.block_counts[group]) as usize;
        Some(start..start + len)
    }

    /// One page of one layer.
    pub fn page(&self, group: usize, layer: usize, index: u64) -> Option<&[u8]> {
        let r = self.layer_range(group, layer)?;
        let bpp = self.header.layout.groups[group].layers[layer].bytes_per_page as usize;
        if index >= self.header.block_counts[group] {
            return None;
        }
        let s = r.start + index as usize * bpp;
        Some(&self.payload()[s..s + bpp])
    }
}

/// BLAKE3 of an encoding; multi-threaded above 4 MiB.
pub fn digest_of_encoding(bytes: &[u8]) -> Digest {
    if bytes.len() > (4 << 20) {
        let mut h = blake3::Hasher::new();
        h.update_rayon(bytes);
        h.finalize().into()
    } else {
        Digest::blake3(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{GroupKind, LayerSpec, PageGroup};

    fn header(boundary: u64) -> SnapshotHeader {
        SnapshotHeader::new(
            PageLayout {
                groups: vec![PageGroup {
                    kind: GroupKind::Full,
                    tokens_per_page: 4,
                    layers: vec![LayerSpec {
                        name: "kv".into(),
                        dtype: "bf16".into(),
                        bytes_per_page: 3,
                    }],
                }],
            },
            boundary,
        )
    }

    #[test]
    fn round_trip_and_rejections() {
        let h = header(9); // 3 pages of 3 bytes
        let s = Snapshot::from_parts(h.clone(), &[1, 2, 3, 4, 5, 6, 7, 8, 9]).expect("build");
        assert_eq!(s.page(0, 0, 1), Some(&[4u8, 5, 6][..]));
        assert_eq!(s.page(0, 0, 3), None);
        let enc = s.encoded().to_vec();
        assert_eq!(Snapshot::from_encoded(enc.clone()).expect("decode"), s);
        // truncated, trailing, bad magic, huge header length
        assert!(Snapshot::from_encoded(enc[..enc.len() - 1].to_vec()).is_err());
        let mut t = enc.clone();
        t.push(0);
        assert!(Snapshot::from_encoded(t).is_err());
        let mut m = enc.clone();
        m[0] ^= 1;
        assert!(Snapshot::from_encoded(m).is_err());
        let mut huge = enc.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Snapshot::from_encoded(huge),
            Err(Error::Bounds(_))
        ));
        assert!(Snapshot::from_parts(h, &[0; 8]).is_err());
    }
}

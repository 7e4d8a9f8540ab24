//! Shared pieces of the deltapack fuzz targets: the synthetic delta bases,
//! the fuzzing MAC key, and envelope fix-ups that let mutations reach the
//! CBOR body parser (a mutated body would otherwise always fail the BLAKE3
//! body check in the envelope header).

use deltapack_format::layout::{GroupKind, LayerSpec, PageGroup, PageLayout};
use deltapack_format::root::{self, ENVELOPE_HEADER_LEN, FLAG_KEYED_MAC, ROOT_MAGIC};
use deltapack_format::{Snapshot, SnapshotHeader};

/// Admission geometry of the synthetic bases (boundaries are multiples).
pub const CHUNK_TOKENS: u32 = 16;

/// Boundaries of the synthetic delta bases, selected by the input's first byte.
pub const BASE_BOUNDARIES: [u64; 3] = [16, 32, 48];

/// Largest result a harness reconstructs by hand (outside `apply`).
pub const MAX_HARNESS_RESULT: u64 = 1 << 20;

/// The layout of every synthetic base: a full-attention group with two
/// layers and a recurrent group with one checkpoint layer.
pub fn layout() -> PageLayout {
    let layer = |name: &str, bpp: u64| LayerSpec {
        name: name.into(),
        dtype: "bf16".into(),
        bytes_per_page: bpp,
    };
    PageLayout {
        groups: vec![
            PageGroup {
                kind: GroupKind::Full,
                tokens_per_page: 16,
                layers: vec![layer("kv0", 24), layer("kv1", 8)],
            },
            PageGroup {
                kind: GroupKind::Recurrent,
                tokens_per_page: 16,
                layers: vec![layer("state", 16)],
            },
        ],
    }
}

/// A small deterministic snapshot at `boundary` tokens; `salt` changes the
/// recurrent page (and, when odd, the last full page) so that deltas between
/// two of them have both reused pages and tails.
pub fn snapshot(boundary: u64, salt: u8) -> Snapshot {
    let header = SnapshotHeader::new(layout(), boundary);
    let len = header.validate().expect("synthetic layout is valid") as usize;
    let mut payload: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ 0x5a)
        .collect();
    // The recurrent checkpoint page is the last 16 bytes.
    for b in &mut payload[len - 16..] {
        *b ^= salt;
    }
    if salt & 1 == 1 {
        // Last page of layer kv1 (layer kv0 has `pages * 24` bytes first).
        let pages = (boundary as usize).div_ceil(16);
        let end = pages * 24 + pages * 8;
        payload[end - 1] ^= 0xff;
    }
    Snapshot::from_parts(header, &payload).expect("synthetic snapshot")
}

/// The base selected by an input's first byte.
pub fn base(selector: u8) -> Snapshot {
    snapshot(
        BASE_BOUNDARIES[selector as usize % BASE_BOUNDARIES.len()],
        0,
    )
}

/// The key the keyed target uses.
pub fn fuzz_key() -> [u8; 32] {
    root::mac_key(b"deltapack-fuzz-secret")
}

/// Wraps `body` in a well-formed envelope (correct length and BLAKE3), with
/// a valid MAC trailer when `mac` is given.
pub fn envelope(body: &[u8], mac: Option<&[u8; 32]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENVELOPE_HEADER_LEN + body.len() + 32);
    out.extend_from_slice(&ROOT_MAGIC);
    out.extend_from_slice(&1u16.to_le_bytes());
    let flags = if mac.is_some() { FLAG_KEYED_MAC } else { 0 };
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(body).as_bytes());
    out.extend_from_slice(body);
    if let Some(k) = mac {
        let tag = blake3::keyed_hash(k, &out);
        out.extend_from_slice(tag.as_bytes());
    }
    out
}

/// If `data` starts like an envelope, the same bytes with `body_len` and the
/// body hash (and, with `mac`, the flag and trailer) recomputed so that the
/// (possibly mutated) body is what gets parsed. Keeps the version and the
/// other flag bits, so the version/flag checks are still exercised.
pub fn fix_up(data: &[u8], mac: Option<&[u8; 32]>) -> Option<Vec<u8>> {
    if data.len() < ENVELOPE_HEADER_LEN || data[..8] != ROOT_MAGIC {
        return None;
    }
    let flags = u16::from_le_bytes([data[10], data[11]]);
    let keyed = mac.is_some() || flags & FLAG_KEYED_MAC != 0;
    let trailer = if keyed { 32 } else { 0 };
    if data.len() < ENVELOPE_HEADER_LEN + trailer {
        return None;
    }
    let body = &data[ENVELOPE_HEADER_LEN..data.len() - trailer];
    let mut out = data[..ENVELOPE_HEADER_LEN].to_vec();
    let flags = if mac.is_some() {
        flags | FLAG_KEYED_MAC
    } else {
        flags
    };
    out[10..12].copy_from_slice(&flags.to_le_bytes());
    out[12..20].copy_from_slice(&(body.len() as u64).to_le_bytes());
    out[20..52].copy_from_slice(blake3::hash(body).as_bytes());
    out.extend_from_slice(body);
    match mac {
        Some(k) => {
            let tag = blake3::keyed_hash(k, &out);
            out.extend_from_slice(tag.as_bytes());
        }
        None => out.extend_from_slice(&data[data.len() - trailer..]),
    }
    Some(out)
}

/// Checks what every successfully decoded root must satisfy: it has a
/// summary, it re-encodes (the encoder re-validates it), and the re-encoding
/// decodes to the same manifest.
pub fn check_decoded(decoded: &root::DecodedRoot, mac: Option<&[u8; 32]>) {
    use deltapack_format::DecodedRoot;
    if let DecodedRoot::Incompatible { .. } = decoded {
        return;
    }
    let s = decoded.summary().expect("a readable root has a summary");
    assert!(s.boundary > 0);
    let again = root::encode(decoded, mac).expect("a decoded root re-encodes");
    let back = root::decode(&again, mac).expect("a re-encoded root decodes");
    assert_eq!(&back, decoded, "decode(encode(decode(x))) == decode(x)");
}

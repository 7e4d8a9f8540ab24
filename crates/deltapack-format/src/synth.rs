//! Deterministic synthetic snapshots for demos, tests and benchmarks.
//!
//! A synthetic conversation is a function of `(preset, seed, tokens)`:
//!
//! * token ids are a keyed hash of `(seed, position)`, so a longer
//!   conversation with the same seed extends a shorter one;
//! * slot `t` of page `p` of layer `l` of a `full` group is a function of
//!   `(seed, group, l, p, t)` alone, and slots past the boundary are zero, so
//!   every *full* page of a smaller snapshot is byte-identical in a larger one
//!   while the partial last page differs;
//! * the recurrent checkpoint page depends on the boundary, so it always
//!   differs between turns.
//!
//! Bytes look like bf16 activations (sign, an exponent clustered around 1.0,
//! random mantissa), not zeros, so compression and hashing see realistic
//! entropy.

use crate::error::{Error, Result};
use crate::layout::{GroupKind, LayerSpec, PageGroup, PageLayout};
use crate::snapshot::{Snapshot, SnapshotHeader};

/// A named synthetic model geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Preset {
    /// KiB-sized pages (512 tokens per page, so 256-token boundaries fall
    /// inside pages) for tests.
    Tiny,
    /// The reference geometry: 24 layers × 65,024 B per 256-token page plus a
    /// 4-layer recurrent checkpoint; 262,144 tokens ≈ 1.6 GB, and the delta
    /// from a 4,096-token base ≈ 1.576 GB.
    Default,
}

impl std::str::FromStr for Preset {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tiny" => Ok(Preset::Tiny),
            "default" => Ok(Preset::Default),
            _ => Err(Error::Invalid(format!(
                "unknown preset {s:?} (expected tiny or default)"
            ))),
        }
    }
}

impl Preset {
    /// The page layout of this preset.
    pub fn layout(self) -> PageLayout {
        let layers = |n: usize, prefix: &str, dtype: &str, bpp: u64| {
            (0..n)
                .map(|i| LayerSpec {
                    name: format!("{prefix}.{i}"),
                    dtype: dtype.into(),
                    bytes_per_page: bpp,
                })
                .collect::<Vec<_>>()
        };
        match self {
            Preset::Tiny => PageLayout {
                groups: vec![
                    PageGroup {
                        kind: GroupKind::Full,
                        tokens_per_page: 512,
                        layers: layers(2, "attn", "bf16", 1024),
                    },
                    PageGroup {
                        kind: GroupKind::Recurrent,
                        tokens_per_page: 256,
                        layers: layers(1, "ssm", "bf16", 512),
                    },
                ],
            },
            Preset::Default => PageLayout {
                groups: vec![
                    PageGroup {
                        kind: GroupKind::Full,
                        tokens_per_page: 256,
                        layers: layers(24, "attn", "bf16", 65_024),
                    },
                    PageGroup {
                        kind: GroupKind::Recurrent,
                        tokens_per_page: 256,
                        layers: layers(4, "ssm", "bf16", 739_328),
                    },
                ],
            },
        }
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The synthetic token ids of a conversation (`n` tokens).
pub fn tokens(seed: u64, n: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| (mix(seed ^ mix(i + 0x51_7cc1)) % 128_000) as u32)
        .collect()
}

/// `n` pseudo-random bytes keyed by `seed` (uniform, incompressible): an
/// arbitrary payload for tests that need bytes rather than a snapshot.
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    for (i, word) in out.chunks_mut(8).enumerate() {
        let w = mix(seed ^ mix(i as u64 ^ 0x6279_7465)).to_le_bytes();
        word.copy_from_slice(&w[..word.len()]);
    }
    out
}

/// Fills `out` with bf16-like values from a stream keyed by `key`.
fn fill_bf16(key: u64, out: &mut [u8]) {
    let mut state = mix(key) | 1;
    for pair in out.chunks_mut(8) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let r = mix(state);
        let mut v = [0u8; 8];
        for k in 0..4 {
            let bits = (r >> (16 * k)) as u16;
            let mant = (bits & 0x7f) as u8;
            // exponent 123..=126 (values 1/16..1), occasionally 127
            let exp = 123 + ((bits >> 7) & 3) as u8 + u8::from((bits >> 9) & 7 == 7);
            let sign = ((bits >> 15) as u8) << 7;
            v[2 * k] = ((exp & 1) << 7) | mant;
            v[2 * k + 1] = sign | (exp >> 1);
        }
        let n = pair.len();
        pair.copy_from_slice(&v[..n]);
    }
}

/// Builds the snapshot of a synthetic conversation of `n_tokens` tokens.
pub fn snapshot(preset: Preset, seed: u64, n_tokens: u64) -> Result<Snapshot> {
    let layout = preset.layout();
    let header = SnapshotHeader::new(layout.clone(), n_tokens);
    let mut bytes = header.encode_prefix()?;
    let payload_len = header.validate()?;
    let prefix = bytes.len();
    let total = usize::try_from(prefix as u64 + payload_len)
        .map_err(|_| Error::Bounds("synthetic snapshot too large".into()))?;
    bytes.resize(total, 0);
    let offsets = layout.layer_offsets(&header.block_counts)?;
    // Collect every page as (key, slots to fill, destination) and fill them on
    // all cores.
    let mut jobs: Vec<(u64, usize, &mut [u8])> = Vec::new();
    let mut rest: &mut [u8] = &mut bytes[prefix..];
    let mut cursor = 0u64;
    for (gi, g) in layout.groups.iter().enumerate() {
        for (li, l) in g.layers.iter().enumerate() {
            debug_assert_eq!(offsets[gi][li], cursor);
            let bpp = l.bytes_per_page as usize;
            for p in 0..header.block_counts[gi] {
                let (page, tail) = std::mem::take(&mut rest).split_at_mut(bpp);
                rest = tail;
                cursor += bpp as u64;
                let key_base = mix(seed ^ mix(((gi as u64) << 48) ^ ((li as u64) << 32) ^ p));
                match g.kind {
                    GroupKind::Full => {
                        let tpp = u64::from(g.tokens_per_page);
                        let valid = (n_tokens - p * tpp).min(tpp) as usize;
                        let slot = bpp / g.tokens_per_page as usize;
                        // Slot-granular fill: valid slots from the page key, the rest zero.
                        let fill = if slot == 0 {
                            bpp
                        } else {
                            (valid * slot).min(bpp)
                        };
                        jobs.push((key_base, fill, page));
                    }
                    GroupKind::Recurrent => {
                        jobs.push((
                            mix(key_base ^ n_tokens.wrapping_mul(0x2545_f491_4f6c_dd1d)),
                            bpp,
                            page,
                        ));
                    }
                }
            }
        }
    }
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8);
    let per = jobs.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let mut it = jobs.into_iter();
        loop {
            let batch: Vec<_> = it.by_ref().take(per).collect();
            if batch.is_empty() {
                break;
            }
            s.spawn(move || {
                for (key, fill, page) in batch {
                    // Each 64-byte block of a slot is keyed separately so a
                    // full page is independent of how many slots are valid.
                    fill_slots(key, &mut page[..fill]);
                }
            });
        }
    });
    Snapshot::from_encoded(bytes)
}

fn fill_slots(key: u64, out: &mut [u8]) {
    const BLOCK: usize = 4096;
    for (i, block) in out.chunks_mut(BLOCK).enumerate() {
        fill_bf16(key ^ mix(i as u64 + 1), block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_prefix_stable() {
        let a = snapshot(Preset::Tiny, 7, 1024 + 256).expect("a");
        let b = snapshot(Preset::Tiny, 7, 1024 + 256).expect("b");
        assert_eq!(a.encoded(), b.encoded());
        let big = snapshot(Preset::Tiny, 7, 4096).expect("big");
        // pages 0 and 1 of the 512-token group are full in `a`: identical in `big`
        for layer in 0..2 {
            for p in 0..2 {
                assert_eq!(a.page(0, layer, p), big.page(0, layer, p));
            }
            // page 2 is partial in `a` (256 of 512 tokens): differs
            assert_ne!(a.page(0, layer, 2), big.page(0, layer, 2));
        }
        assert_ne!(
            a.page(1, 0, 0),
            big.page(1, 0, 0),
            "recurrent checkpoint differs"
        );
        let other = snapshot(Preset::Tiny, 8, 1024 + 256).expect("other");
        assert_ne!(a.encoded(), other.encoded());
        // not zeros
        let zeros = a.payload().iter().filter(|&&x| x == 0).count();
        assert!(zeros < a.payload().len() / 2);
        assert_eq!(tokens(1, 300)[..100], tokens(1, 100)[..]);
    }

    #[test]
    fn default_preset_matches_reference_scale() {
        let layout = Preset::Default.layout();
        let full = layout
            .payload_len(&layout.block_counts(262_144))
            .expect("len");
        assert!((1_550_000_000..1_650_000_000).contains(&full), "{full}");
        // delta from a 4096-token base stores 1008 pages + the checkpoint
        let delta_payload = 1008 * layout.groups[0].page_bytes() + layout.groups[1].page_bytes();
        let reference = 1_575_821_491u64;
        assert!(
            delta_payload.abs_diff(reference) < reference / 500,
            "{delta_payload}"
        );
    }
}

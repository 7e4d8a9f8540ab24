//! The v2 extent tree: authenticated, independently verifiable extents.
//!
//! A payload of `L` bytes is cut into extents of `M` bytes (`M` a power of two,
//! at least 1 KiB — the BLAKE3 chunk size — and at most 1 GiB): extent `i`
//! covers `[i·M, min((i+1)·M, L))`. Because `M` is a power-of-two multiple of
//! the BLAKE3 chunk size, every extent is a complete subtree of the BLAKE3
//! hash tree of the whole payload. Each raw extent is therefore named by its
//! **BLAKE3 subtree chaining value at its offset** (`blake3::hazmat`), and
//! merging the chaining values of all extents in tree order yields the plain
//! BLAKE3 of the payload — exactly what `b3sum` prints for the concatenated
//! extents. When the payload fits in one extent, that extent *is* the whole
//! tree and its name is the plain BLAKE3 root hash. An empty payload has no
//! extents and digest `BLAKE3("")`.
//!
//! Consequences:
//!
//! * One hashing pass verifies every extent individually *and* (by merging the
//!   already-verified names) the whole payload: no second pass.
//! * Extents can be hashed on different cores and in any order.
//! * A corrupt object is pinned to one extent.
//!
//! An extent may be stored zstd-compressed. Then the object holds the
//! compressed bytes, is keyed by the plain BLAKE3 of those stored bytes, and
//! the manifest records both digests: a reader checks the stored digest before
//! decompressing, bounds decompression to the declared raw length, and then
//! checks the raw name. An object's key is always the digest that
//! authenticates its stored bytes.

use std::ops::Range;

use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{Error, Result};

/// Smallest allowed extent size (the BLAKE3 chunk size).
pub const MIN_EXTENT_BYTES: u64 = 1024;
/// Largest allowed extent size.
pub const MAX_EXTENT_BYTES_LIMIT: u64 = 1 << 30;
/// Most extents a payload may have.
pub const MAX_EXTENTS: u64 = 1 << 20;

/// How an extent's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExtentCodec {
    /// Stored as-is; the object key is the raw name.
    Raw,
    /// Stored zstd-compressed; the object key is BLAKE3 of the stored bytes.
    Zstd,
}

/// The geometry of a payload's extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentPlan {
    payload_len: u64,
    max_extent_bytes: u64,
}

/// One raw extent: where it sits and its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentSpec {
    /// Index in the payload.
    pub index: u64,
    /// Byte offset in the payload.
    pub offset: u64,
    /// Raw length.
    pub raw_len: u64,
    /// Name: subtree chaining value (or root hash for a single extent).
    pub raw_digest: Digest,
}

impl ExtentPlan {
    /// A plan for `payload_len` bytes in extents of `max_extent_bytes`.
    pub fn new(payload_len: u64, max_extent_bytes: u64) -> Result<Self> {
        if !max_extent_bytes.is_power_of_two()
            || !(MIN_EXTENT_BYTES..=MAX_EXTENT_BYTES_LIMIT).contains(&max_extent_bytes)
        {
            return Err(Error::Extent(format!(
                "max_extent_bytes {max_extent_bytes} must be a power of two in {MIN_EXTENT_BYTES}..={MAX_EXTENT_BYTES_LIMIT}"
            )));
        }
        let plan = ExtentPlan {
            payload_len,
            max_extent_bytes,
        };
        if plan.count() > MAX_EXTENTS {
            return Err(Error::Bounds(format!(
                "{} extents exceed the limit {MAX_EXTENTS}",
                plan.count()
            )));
        }
        Ok(plan)
    }

    /// Payload length.
    pub fn payload_len(&self) -> u64 {
        self.payload_len
    }

    /// Extent size `M`.
    pub fn max_extent_bytes(&self) -> u64 {
        self.max_extent_bytes
    }

    /// Number of extents (`ceil(L / M)`; zero for an empty payload).
    pub fn count(&self) -> u64 {
        self.payload_len.div_ceil(self.max_extent_bytes)
    }

    /// Byte range of extent `index`.
    pub fn range(&self, index: u64) -> Range<u64> {
        let start = (index * self.max_extent_bytes).min(self.payload_len);
        start..(start + self.max_extent_bytes).min(self.payload_len)
    }

    /// Whether the payload is a single extent (named by its root hash).
    pub fn is_single(&self) -> bool {
        self.count() <= 1
    }

    /// Starts an incremental verifier/namer for extent `index`.
    pub fn hasher(&self, index: u64) -> ExtentHasher {
        let mut h = blake3::Hasher::new();
        let offset = self.range(index).start;
        if !self.is_single() {
            h.set_input_offset(offset);
        }
        ExtentHasher {
            hasher: h,
            single: self.is_single(),
            expected_len: self.range(index).end - offset,
            seen: 0,
        }
    }

    /// Names extent `index` from its complete bytes (multi-threaded when
    /// `parallel` and the extent is large).
    pub fn name(&self, index: u64, bytes: &[u8], parallel: bool) -> Result<Digest> {
        let mut h = self.hasher(index);
        if parallel && bytes.len() > (1 << 20) {
            h.update_rayon(bytes);
        } else {
            h.update(bytes);
        }
        h.finish()
    }

    /// Names every extent of `payload`.
    pub fn name_all(&self, payload: &[u8]) -> Result<Vec<ExtentSpec>> {
        if payload.len() as u64 != self.payload_len {
            return Err(Error::Extent("payload length differs from the plan".into()));
        }
        (0..self.count())
            .map(|i| {
                let r = self.range(i);
                let raw_digest = self.name(i, &payload[r.start as usize..r.end as usize], true)?;
                Ok(ExtentSpec {
                    index: i,
                    offset: r.start,
                    raw_len: r.end - r.start,
                    raw_digest,
                })
            })
            .collect()
    }

    /// Merges the names of all extents (in order) into the payload digest
    /// (plain BLAKE3 of the payload).
    pub fn merge(&self, names: &[Digest]) -> Result<Digest> {
        if names.len() as u64 != self.count() {
            return Err(Error::Extent(format!(
                "{} names for {} extents",
                names.len(),
                self.count()
            )));
        }
        match names.len() {
            0 => Ok(Digest::blake3(b"")),
            1 => Ok(names[0]),
            _ => {
                let cvs: Vec<ChainingValue> = names.iter().map(|d| *d.as_bytes()).collect();
                let (l, r) = self.split(0, self.payload_len, &cvs, Mode::Hash);
                Ok(merge_subtrees_root(&l, &r, Mode::Hash).into())
            }
        }
    }

    /// Splits the subtree covering `len` bytes from `start` into its two
    /// children's chaining values.
    fn split(
        &self,
        start: u64,
        len: u64,
        cvs: &[ChainingValue],
        mode: Mode<'_>,
    ) -> (ChainingValue, ChainingValue) {
        let left_len = left_subtree_len(len);
        let left_n = (left_len / self.max_extent_bytes) as usize;
        let left = self.subtree(start, left_len, &cvs[..left_n], mode);
        let right = self.subtree(start + left_len, len - left_len, &cvs[left_n..], mode);
        (left, right)
    }

    /// The ranges (payload offsets) in which extent `index` is read when
    /// each ranged read is at most `range_bytes` (a power of two, at least
    /// the BLAKE3 chunk size): aligned pieces of `range_bytes`, the last one
    /// possibly shorter. An extent no larger than `range_bytes` is one range.
    ///
    /// Every such range is a complete subtree of the payload's BLAKE3 tree
    /// (its offset is a multiple of its power-of-two size, and a short last
    /// range ends the payload), so it can be hashed on its own
    /// ([`ExtentPlan::range_hasher`]) and the range names merged into the
    /// extent's name ([`ExtentPlan::merge_ranges`]).
    pub fn ranges(&self, index: u64, range_bytes: u64) -> Result<Vec<Range<u64>>> {
        check_range_bytes(range_bytes)?;
        let r = self.range(index);
        if r.end - r.start <= range_bytes {
            return Ok(vec![r]);
        }
        let mut out = Vec::with_capacity((r.end - r.start).div_ceil(range_bytes) as usize);
        let mut at = r.start;
        while at < r.end {
            let end = (at + range_bytes).min(r.end);
            out.push(at..end);
            at = end;
        }
        Ok(out)
    }

    /// A hasher for range `k` of extent `index` (see [`ExtentPlan::ranges`]):
    /// the extent's own hasher when the extent is one range, else the
    /// range's subtree chaining value at its offset.
    pub fn range_hasher(&self, index: u64, range_bytes: u64, k: u64) -> Result<ExtentHasher> {
        let ranges = self.ranges(index, range_bytes)?;
        if ranges.len() == 1 && k == 0 {
            return Ok(self.hasher(index));
        }
        let r = ranges
            .get(k as usize)
            .ok_or_else(|| Error::Extent(format!("extent {index} has no range {k}")))?;
        let mut h = blake3::Hasher::new();
        h.set_input_offset(r.start);
        Ok(ExtentHasher {
            hasher: h,
            single: false,
            expected_len: r.end - r.start,
            seen: 0,
        })
    }

    /// Merges the names of every range of extent `index` (in order; see
    /// [`ExtentPlan::range_hasher`]) into the extent's name.
    pub fn merge_ranges(&self, index: u64, range_bytes: u64, names: &[Digest]) -> Result<Digest> {
        let ranges = self.ranges(index, range_bytes)?;
        if names.len() != ranges.len() {
            return Err(Error::Extent(format!(
                "{} range names for the {} ranges of extent {index}",
                names.len(),
                ranges.len()
            )));
        }
        if names.len() == 1 {
            return Ok(names[0]);
        }
        let r = self.range(index);
        // The extent's subtree, cut like a payload of its length in
        // "extents" of `range_bytes`: the tree's splits fall on range
        // boundaries because every left subtree is a power-of-two multiple
        // of `range_bytes`.
        let inner = ExtentPlan {
            payload_len: r.end - r.start,
            max_extent_bytes: range_bytes,
        };
        let cvs: Vec<ChainingValue> = names.iter().map(|d| *d.as_bytes()).collect();
        let (left, right) = inner.split(0, r.end - r.start, &cvs, Mode::Hash);
        if self.is_single() {
            // The extent is the whole payload: its name is the root hash.
            Ok(merge_subtrees_root(&left, &right, Mode::Hash).into())
        } else {
            Ok(Digest::new(
                crate::Algorithm::Blake3,
                merge_subtrees_non_root(&left, &right, Mode::Hash),
            ))
        }
    }

    fn subtree(
        &self,
        start: u64,
        len: u64,
        cvs: &[ChainingValue],
        mode: Mode<'_>,
    ) -> ChainingValue {
        if cvs.len() == 1 {
            return cvs[0];
        }
        let (l, r) = self.split(start, len, cvs, mode);
        merge_subtrees_non_root(&l, &r, mode)
    }
}

/// Checks a ranged-read size: a power of two of at least one BLAKE3 chunk.
fn check_range_bytes(range_bytes: u64) -> Result<()> {
    if !range_bytes.is_power_of_two() || range_bytes < MIN_EXTENT_BYTES {
        return Err(Error::Extent(format!(
            "range size {range_bytes} must be a power of two of at least {MIN_EXTENT_BYTES}"
        )));
    }
    Ok(())
}

/// Incremental hasher for one extent (see [`ExtentPlan::hasher`]).
#[derive(Clone)]
pub struct ExtentHasher {
    hasher: blake3::Hasher,
    single: bool,
    expected_len: u64,
    seen: u64,
}

impl ExtentHasher {
    /// Absorbs bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.seen += data.len() as u64;
        self.hasher.update(data);
    }

    /// Absorbs bytes using all cores.
    pub fn update_rayon(&mut self, data: &[u8]) {
        self.seen += data.len() as u64;
        self.hasher.update_rayon(data);
    }

    /// The extent's name. Errors if the bytes absorbed are not exactly the
    /// extent's length.
    pub fn finish(&self) -> Result<Digest> {
        if self.seen != self.expected_len {
            return Err(Error::Extent(format!(
                "extent is {} bytes, expected {}",
                self.seen, self.expected_len
            )));
        }
        if self.single {
            Ok(self.hasher.finalize().into())
        } else {
            Ok(Digest::new(
                crate::Algorithm::Blake3,
                self.hasher.finalize_non_root(),
            ))
        }
    }

    /// Finishes and compares with `expected`.
    pub fn verify(&self, what: &str, expected: &Digest) -> Result<()> {
        let found = self.finish()?;
        if found == *expected {
            Ok(())
        } else {
            Err(Error::mismatch(what, expected, found))
        }
    }
}

/// Verifies a payload's extents and digest in one pass as bytes stream in
/// (used by readers that see the payload sequentially).
pub type ExtentVerifier = ExtentHasher;

/// Names a payload produced sequentially: feed bytes in order, get every
/// extent's name and the payload digest at the end.
pub struct PayloadHasher {
    plan: ExtentPlan,
    index: u64,
    current: ExtentHasher,
    names: Vec<Digest>,
}

impl PayloadHasher {
    /// A hasher for a payload with this plan.
    pub fn new(plan: ExtentPlan) -> Self {
        PayloadHasher {
            plan,
            index: 0,
            current: plan.hasher(0),
            names: Vec::new(),
        }
    }

    /// Absorbs the next bytes of the payload.
    pub fn update(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            if self.index >= self.plan.count() {
                return Err(Error::Extent(
                    "more bytes than the plan's payload length".into(),
                ));
            }
            let r = self.plan.range(self.index);
            let room = (r.end - r.start - self.current.seen) as usize;
            let take = room.min(data.len());
            self.current.update(&data[..take]);
            data = &data[take..];
            if self.current.seen == r.end - r.start {
                self.names.push(self.current.finish()?);
                self.index += 1;
                if self.index < self.plan.count() {
                    self.current = self.plan.hasher(self.index);
                }
            }
        }
        Ok(())
    }

    /// Every extent's name and the payload digest.
    pub fn finish(self) -> Result<(Vec<Digest>, Digest)> {
        if self.names.len() as u64 != self.plan.count() {
            return Err(Error::Extent(
                "fewer bytes than the plan's payload length".into(),
            ));
        }
        let d = self.plan.merge(&self.names)?;
        Ok((self.names, d))
    }
}

/// zstd-compresses an extent.
pub fn compress(raw: &[u8], level: i32) -> Result<Vec<u8>> {
    zstd::bulk::compress(raw, level).map_err(|e| Error::Extent(format!("zstd compress: {e}")))
}

/// Decompresses a stored zstd extent whose raw length is `raw_len`. The
/// output buffer is exactly `raw_len` bytes: a frame that would expand past
/// it is an error, never a larger allocation.
pub fn decompress(stored: &[u8], raw_len: u64) -> Result<Vec<u8>> {
    if raw_len > MAX_EXTENT_BYTES_LIMIT {
        return Err(Error::Bounds(format!(
            "declared raw length {raw_len} exceeds {MAX_EXTENT_BYTES_LIMIT}"
        )));
    }
    let mut out = vec![0u8; raw_len as usize];
    let n = zstd::bulk::decompress_to_buffer(stored, &mut out[..]).map_err(|e| {
        Error::Extent(format!(
            "zstd extent does not decode within {raw_len} bytes: {e}"
        ))
    })?;
    if n as u64 != raw_len {
        return Err(Error::Extent(format!(
            "zstd extent decoded to {n} bytes, declared {raw_len}"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| (i.wrapping_mul(31) ^ (i >> 7)) as u8)
            .collect()
    }

    /// Merging the extent names equals plain BLAKE3 of the payload (what
    /// b3sum prints) for edge sizes and for 24 extents.
    #[test]
    fn merged_names_equal_plain_blake3() {
        for m in [1024u64, 4096, 65536] {
            for len in [0, 1, m - 1, m, m + 1, 2 * m, 3 * m + 5, 23 * m + 17, 24 * m] {
                let p = data(len as usize);
                let plan = ExtentPlan::new(len, m).expect("plan");
                let specs = plan.name_all(&p).expect("names");
                assert_eq!(specs.len() as u64, plan.count());
                let names: Vec<Digest> = specs.iter().map(|s| s.raw_digest).collect();
                let merged = plan.merge(&names).expect("merge");
                assert_eq!(merged, Digest::blake3(&p), "m={m} len={len}");
                if plan.count() == 1 {
                    assert_eq!(names[0], Digest::blake3(&p));
                }
                // The streaming namer agrees.
                let mut ph = PayloadHasher::new(plan);
                for piece in p.chunks(777) {
                    ph.update(piece).expect("update");
                }
                let (n2, d2) = ph.finish().expect("finish");
                assert_eq!(n2, names);
                assert_eq!(d2, merged);
            }
        }
        assert_eq!(ExtentPlan::new(24 * 1024, 1024).expect("p").count(), 24);
    }

    #[test]
    fn a_flipped_byte_changes_exactly_one_name() {
        let m = 1024u64;
        let mut p = data(5 * m as usize + 3);
        let plan = ExtentPlan::new(p.len() as u64, m).expect("plan");
        let before = plan.name_all(&p).expect("n");
        p[2 * m as usize + 10] ^= 1;
        let after = plan.name_all(&p).expect("n");
        let diff: Vec<usize> = (0..before.len())
            .filter(|&i| before[i] != after[i])
            .collect();
        assert_eq!(diff, vec![2]);
    }

    #[test]
    fn plan_rejects_bad_sizes() {
        assert!(ExtentPlan::new(10, 1000).is_err());
        assert!(ExtentPlan::new(10, 512).is_err());
        assert!(ExtentPlan::new(10, 1 << 31).is_err());
        assert!(ExtentPlan::new(u64::MAX, 1024).is_err());
        let plan = ExtentPlan::new(3000, 1024).expect("plan");
        let mut h = plan.hasher(2);
        h.update(&[0; 10]);
        assert!(h.finish().is_err(), "short extent must not name");
    }

    #[test]
    fn zstd_is_bounded_by_declared_length() {
        let raw = vec![0u8; 100_000];
        let c = compress(&raw, 3).expect("c");
        assert_eq!(decompress(&c, 100_000).expect("d"), raw);
        assert!(
            decompress(&c, 99_999).is_err(),
            "expansion past the declared length"
        );
        assert!(decompress(&c, 100_001).is_err(), "short output");
        assert!(decompress(b"not zstd", 10).is_err());
        assert!(decompress(&c, u64::MAX).is_err());
    }

    /// Names every range of every extent from `payload` and merges them.
    fn merged_from_ranges(plan: &ExtentPlan, payload: &[u8], range_bytes: u64) -> Vec<Digest> {
        (0..plan.count())
            .map(|i| {
                let ranges = plan.ranges(i, range_bytes).expect("ranges");
                let names: Vec<Digest> = ranges
                    .iter()
                    .enumerate()
                    .map(|(k, r)| {
                        let mut h = plan.range_hasher(i, range_bytes, k as u64).expect("hasher");
                        h.update(&payload[r.start as usize..r.end as usize]);
                        h.finish().expect("finish")
                    })
                    .collect();
                plan.merge_ranges(i, range_bytes, &names).expect("merge")
            })
            .collect()
    }

    #[test]
    fn ranges_tile_each_extent_and_reject_bad_sizes() {
        let plan = ExtentPlan::new(10 * 4096 + 100, 4096).expect("plan");
        assert!(plan.ranges(0, 1000).is_err());
        assert!(plan.ranges(0, 512).is_err());
        assert_eq!(plan.ranges(0, 4096).expect("r"), vec![0..4096]);
        assert_eq!(plan.ranges(0, 1 << 20).expect("r"), vec![0..4096]);
        assert_eq!(
            plan.ranges(1, 1024).expect("r"),
            vec![4096..5120, 5120..6144, 6144..7168, 7168..8192]
        );
        assert_eq!(plan.ranges(10, 1024).expect("r"), vec![40960..41060]);
        assert!(plan.range_hasher(1, 1024, 4).is_err());
        assert!(plan.merge_ranges(1, 1024, &[Digest::blake3(b"")]).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

        /// Range names merged per extent equal the extent names, for any
        /// extent size, range size and payload length (short last extent,
        /// single-extent payloads, ranges as large as the extent); and a
        /// flipped byte in any range changes exactly its extent's merge.
        #[test]
        fn merged_range_names_equal_extent_names(
            m_shift in 10u32..15,
            r_shift in 10u32..16,
            len in 0u64..(40 << 10),
            flip in proptest::prelude::any::<u64>(),
        ) {
            let (m, r) = (1u64 << m_shift, 1u64 << r_shift);
            let payload = data(len as usize);
            let plan = ExtentPlan::new(len, m).expect("plan");
            let want: Vec<Digest> = plan
                .name_all(&payload)
                .expect("names")
                .iter()
                .map(|s| s.raw_digest)
                .collect();
            let got = merged_from_ranges(&plan, &payload, r);
            proptest::prop_assert_eq!(&got, &want);
            if len > 0 {
                let mut bad = payload.clone();
                let at = (flip % len) as usize;
                bad[at] ^= 1 << (flip % 8);
                let got = merged_from_ranges(&plan, &bad, r);
                let hit = at as u64 / m;
                for i in 0..plan.count() {
                    proptest::prop_assert_eq!(got[i as usize] != want[i as usize], i == hit);
                }
            }
        }
    }
}

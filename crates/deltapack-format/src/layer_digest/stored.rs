//! The written-down hashing state: what a root records so that another
//! process can extend a snapshot's digest without hashing it whole.
//!
//! A [`StoredState`] is, per stream, the chaining values of the complete
//! subtrees before the stream's *state point* (the chunk boundary just
//! below its settled bytes, leaving one raw chunk): the binary
//! decomposition of the point in chunks. Its byte form needs no lengths of
//! its own ([`stored_counts`] follows from the header). A reader holding
//! the snapshot takes the raw last chunk from it and proves the values by
//! finishing every stream from its point ([`DigestState::resume`], about
//! one page per stream hashed, [`resume_bytes`]).

use blake3::hazmat::ChainingValue;

use super::definition::{
    bytes_per_page, combine, group_of_stream, par_map, settled_pages, stream_ranges, supported,
    unsupported, StreamDigest,
};
use super::state::{DigestState, StreamState, CHUNK};
use crate::digest::{Algorithm, Digest};
use crate::error::{Error, Result};
use crate::snapshot::{Snapshot, SnapshotHeader};

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
pub(super) fn state_point(settled: u64) -> u64 {
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

/// Where the bytes [`DigestState::resume`] reads lie in the encoding of a
/// snapshot with `header` whose payload starts at `payload_offset`: per
/// stream, from its state point to its end. A reader of a file needs only
/// these (and the prefix) to resume a state; nothing else is read.
pub fn resume_ranges(
    header: &SnapshotHeader,
    payload_offset: u64,
) -> Result<Vec<std::ops::Range<u64>>> {
    let ranges = stream_ranges(header, payload_offset)?;
    Ok(ranges
        .iter()
        .zip(stream_points(header))
        .map(|(r, (_, point))| r.start + point..r.end)
        .collect())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer_digest::of_snapshot;
    use crate::layer_digest::tests::{flat, layout_strategy, next_turn, reference};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

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
}

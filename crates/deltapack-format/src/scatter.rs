//! Scatter: where the bytes of a payload land in a destination buffer.
//!
//! A restore reads a payload (a delta's encoding, or a flat root's snapshot)
//! extent by extent, in pieces, and copies some of its byte ranges to
//! positions in the result. Each contiguous copy is a [`Span`]: `len` bytes
//! from source offset `src` to destination offset `dst`. The spans of one
//! source are **monotone**: sorted by `src`, not overlapping, and in the
//! same order in the destination (a page delta's tail spans are, see
//! [`crate::delta::CopyOp::Delta`]; a flat root is the single span
//! `0 → 0` over its whole payload). Monotone spans give every extent — every
//! contiguous source range — one contiguous part of the destination that no
//! other extent writes, so workers can fill the result in parallel: with
//! disjoint `&mut` [`Region`]s ([`regions`]), or through a shared buffer
//! written only where [`targets`] says.
//!
//! This is the planning alone, shared by the store's restore and the
//! benchmark's floors: no I/O, and nothing here allocates per piece
//! ([`targets`] iterates a borrowed slice; [`regions`] splits the caller's
//! buffer lazily).

use std::ops::Range;

use crate::error::{Error, Result};

/// A contiguous copy of `len` bytes from source offset `src` to destination
/// offset `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Offset in the source (a payload).
    pub src: u64,
    /// Offset in the destination (a result encoding).
    pub dst: u64,
    /// Bytes.
    pub len: u64,
}

impl Span {
    /// One past the last source byte.
    pub fn src_end(&self) -> u64 {
        self.src + self.len
    }

    /// The part of this span whose source lies in `range`, if any.
    pub fn clip(&self, range: &Range<u64>) -> Option<Span> {
        let lo = self.src.max(range.start);
        let hi = self.src_end().min(range.end);
        (lo < hi).then(|| Span {
            src: lo,
            dst: self.dst + (lo - self.src),
            len: hi - lo,
        })
    }
}

/// The spans (sorted by `src`, not overlapping) that hold source bytes of
/// `range`: a subslice, found by binary search. Its first and last span may
/// reach outside `range`; [`targets`] and [`Span::clip`] cut them.
pub fn overlapping(spans: &[Span], range: Range<u64>) -> &[Span] {
    if range.start >= range.end {
        return &[];
    }
    let first = spans.partition_point(|s| s.src_end() <= range.start);
    let rest = &spans[first..];
    &rest[..rest.partition_point(|s| s.src < range.end)]
}

/// One copy of part of a piece of source bytes: `piece[at]` goes to
/// destination offset `dst` (see [`targets`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Destination offset of the first byte.
    pub dst: u64,
    /// The bytes, as offsets into the piece.
    pub at: Range<usize>,
}

/// Where the `len` source bytes starting at offset `src` go: one [`Target`]
/// for each span they meet, in order. Bytes no span covers go nowhere.
/// `spans` must be sorted by `src` and not overlap.
pub fn targets(spans: &[Span], src: u64, len: usize) -> Targets<'_> {
    // One binary search for the first span that reaches the piece; the
    // iterator stops at the first span past it (the restore's hot path:
    // one call per piece read).
    let first = spans.partition_point(|s| s.src_end() <= src);
    Targets {
        spans: &spans[first..],
        start: src,
        end: src + len as u64,
    }
}

/// The iterator of [`targets`].
#[derive(Debug, Clone)]
pub struct Targets<'s> {
    /// Spans from the first that ends after `start`.
    spans: &'s [Span],
    start: u64,
    end: u64,
}

impl Iterator for Targets<'_> {
    type Item = Target;

    fn next(&mut self) -> Option<Target> {
        let (s, rest) = self.spans.split_first()?;
        if s.src >= self.end || self.start >= self.end {
            return None;
        }
        self.spans = rest;
        // `s` ends after `start` and begins before `end`: they overlap.
        let lo = s.src.max(self.start);
        let hi = s.src_end().min(self.end);
        let at = (lo - self.start) as usize;
        Some(Target {
            dst: s.dst + (lo - s.src),
            at: at..at + (hi - lo) as usize,
        })
    }
}

/// The part of a destination buffer that one source range writes (see
/// [`regions`]).
#[derive(Debug)]
pub struct Region<'b, 's> {
    buf: &'b mut [u8],
    dst_start: u64,
    src: Range<u64>,
    spans: &'s [Span],
}

impl Region<'_, '_> {
    /// Copies `bytes`, found at source offset `src`, to where the spans send
    /// them; bytes no span covers are skipped. `src..src + bytes.len()` must
    /// lie inside the source range the region was made for (outside it, a
    /// byte could belong to another region: that panics).
    pub fn place(&mut self, src: u64, bytes: &[u8]) {
        let end = src + bytes.len() as u64;
        assert!(
            self.src.start <= src && end <= self.src.end,
            "bytes {src}..{end} lie outside the region's source {:?}",
            self.src
        );
        for t in targets(self.spans, src, bytes.len()) {
            let d = (t.dst - self.dst_start) as usize;
            self.buf[d..d + t.at.len()].copy_from_slice(&bytes[t.at]);
        }
    }

    /// The destination offsets this region owns.
    pub fn dst(&self) -> Range<u64> {
        self.dst_start..self.dst_start + self.buf.len() as u64
    }
}

/// Splits `buf` (the destination) into one [`Region`] per source range of
/// `ranges`, each owning the destination bytes from the first its spans
/// write to the last (base bytes between them included). `ranges` must be in
/// increasing order and not overlap (the extents of a payload); `spans` must
/// be monotone (see the module documentation). A source range no span
/// touches gets an empty region.
///
/// The split is lazy and allocates nothing: each item is the next region,
/// or an [`Error::Bounds`] if that region would run past `buf` or into the
/// region before it (spans that are not monotone, or ranges out of order).
pub fn regions<'b, 's, I>(
    buf: &'b mut [u8],
    spans: &'s [Span],
    ranges: I,
) -> Regions<'b, 's, I::IntoIter>
where
    I: IntoIterator<Item = Range<u64>>,
{
    Regions {
        rest: buf,
        consumed: 0,
        spans,
        ranges: ranges.into_iter(),
    }
}

/// The iterator of [`regions`].
#[derive(Debug)]
pub struct Regions<'b, 's, I> {
    rest: &'b mut [u8],
    /// Destination offset of `rest[0]`.
    consumed: u64,
    spans: &'s [Span],
    ranges: I,
}

impl<'b, 's, I: Iterator<Item = Range<u64>>> Iterator for Regions<'b, 's, I> {
    type Item = Result<Region<'b, 's>>;

    fn next(&mut self) -> Option<Self::Item> {
        let range = self.ranges.next()?;
        let mine = overlapping(self.spans, range.clone());
        let clipped = |s: Option<&Span>| s.and_then(|s| s.clip(&range));
        let (start, end) = match (clipped(mine.first()), clipped(mine.last())) {
            (Some(f), Some(l)) => (f.dst, l.dst + l.len),
            _ => (self.consumed, self.consumed),
        };
        let room = self.rest.len() as u64;
        if start < self.consumed || end < start || end - self.consumed > room {
            self.rest = &mut [];
            return Some(Err(Error::Bounds(format!(
                "source {range:?} maps to {start}..{end}, outside the destination left ({}..{})",
                self.consumed,
                self.consumed + room
            ))));
        }
        let taken = std::mem::take(&mut self.rest);
        let (_, tail) = taken.split_at_mut((start - self.consumed) as usize);
        let (buf, tail) = tail.split_at_mut((end - start) as usize);
        self.rest = tail;
        self.consumed = end;
        Some(Ok(Region {
            buf,
            dst_start: start,
            src: range,
            spans: mine,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn span(src: u64, dst: u64, len: u64) -> Span {
        Span { src, dst, len }
    }

    #[test]
    fn overlapping_is_the_spans_a_range_meets() {
        let s = [span(4, 100, 6), span(10, 110, 5), span(20, 120, 4)];
        assert_eq!(overlapping(&s, 0..4), &[] as &[Span]);
        assert_eq!(overlapping(&s, 0..5), &s[..1]);
        assert_eq!(overlapping(&s, 9..11), &s[..2]);
        assert_eq!(overlapping(&s, 15..20), &[] as &[Span]);
        assert_eq!(overlapping(&s, 15..21), &s[2..]);
        assert_eq!(overlapping(&s, 0..100), &s[..]);
        assert_eq!(overlapping(&s, 5..5), &[] as &[Span]);
    }

    #[test]
    fn targets_clip_to_the_piece() {
        let s = [span(4, 100, 6), span(10, 200, 5)];
        let t: Vec<Target> = targets(&s, 8, 4).collect();
        assert_eq!(
            t,
            vec![Target { dst: 104, at: 0..2 }, Target { dst: 200, at: 2..4 }]
        );
        assert_eq!(targets(&s, 0, 4).count(), 0);
        assert_eq!(targets(&s, 15, 10).count(), 0);
        assert_eq!(targets(&s, 8, 0).count(), 0);
        // A piece covering both spans and the gap before them.
        let all: Vec<Target> = targets(&s, 0, 20).collect();
        assert_eq!(
            all,
            vec![
                Target {
                    dst: 100,
                    at: 4..10
                },
                Target {
                    dst: 200,
                    at: 10..15
                }
            ]
        );
    }

    #[test]
    fn regions_follow_spans() {
        // payload [4, 20) goes to [100, 116); [0, 4) is a header (not copied)
        let spans = [span(4, 100, 16)];
        let mut buf = vec![0u8; 120];
        let mut rs: Vec<Region<'_, '_>> = regions(&mut buf, &spans, [0..10, 10..20])
            .collect::<Result<_>>()
            .expect("regions");
        assert_eq!(rs[0].dst(), 100..106);
        assert_eq!(rs[1].dst(), 106..116);
        let payload: Vec<u8> = (0..20).collect();
        rs[0].place(0, &payload[..10]);
        rs[1].place(10, &payload[10..]);
        drop(rs);
        assert_eq!(&buf[100..116], &payload[4..20]);
        assert!(buf[..100].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_range_no_span_touches_gets_an_empty_region() {
        let spans = [span(0, 0, 4), span(8, 4, 4)];
        let mut buf = vec![0u8; 8];
        let rs: Vec<Region<'_, '_>> = regions(&mut buf, &spans, [0..4, 4..8, 8..12])
            .collect::<Result<_>>()
            .expect("regions");
        let dst: Vec<_> = rs.iter().map(Region::dst).collect();
        assert_eq!(dst, vec![0..4, 4..4, 4..8]);
    }

    #[test]
    fn spans_past_the_buffer_or_out_of_order_are_errors() {
        let mut buf = vec![0u8; 8];
        let past = [span(0, 4, 8)];
        assert!(regions(&mut buf, &past, std::iter::once(0..8)).any(|r| r.is_err()));
        // Not monotone: the second range's bytes land before the first's.
        let crossed = [span(0, 4, 4), span(4, 0, 4)];
        let r: Vec<_> = regions(&mut buf, &crossed, [0..4, 4..8]).collect();
        assert!(r[0].is_ok() && r[1].is_err());
    }

    #[test]
    #[should_panic(expected = "outside the region")]
    fn placing_outside_the_region_panics() {
        let spans = [span(0, 0, 8)];
        let mut buf = vec![0u8; 8];
        let mut rs = regions(&mut buf, &spans, [0..4, 4..8]);
        let mut first = rs.next().expect("one").expect("ok");
        first.place(2, &[1, 2, 3, 4]);
    }

    /// Monotone spans over a `payload`-byte source: gaps and lengths chosen
    /// by the strategy, destinations increasing with gaps of their own.
    fn monotone() -> impl Strategy<Value = (u64, Vec<Span>)> {
        prop::collection::vec((0u64..5, 1u64..9, 0u64..5), 0..12).prop_map(|parts| {
            let (mut src, mut dst, mut out) = (0, 0, Vec::new());
            for (src_gap, len, dst_gap) in parts {
                src += src_gap;
                dst += dst_gap;
                out.push(span(src, dst, len));
                src += len;
                dst += len;
            }
            (src + 3, out)
        })
    }

    proptest! {
        /// Cutting the source into extents, splitting the destination into
        /// their regions and placing every extent in arbitrary pieces gives
        /// the bytes a plain copy of every span gives.
        #[test]
        fn pieces_through_regions_equal_a_plain_copy(
            (payload, spans) in monotone(),
            extent in 1u64..7,
            piece in 1usize..5,
        ) {
            let source: Vec<u8> = (0..payload).map(|i| (i % 251) as u8 + 1).collect();
            let dst_len = spans.last().map_or(0, |s| s.dst + s.len) as usize + 2;
            let mut want = vec![0u8; dst_len];
            for s in &spans {
                let (a, d, n) = (s.src as usize, s.dst as usize, s.len as usize);
                want[d..d + n].copy_from_slice(&source[a..a + n]);
            }
            let ranges: Vec<Range<u64>> = (0..payload)
                .step_by(extent as usize)
                .map(|a| a..(a + extent).min(payload))
                .collect();
            let mut got = vec![0u8; dst_len];
            let rs: Vec<Region<'_, '_>> = regions(&mut got, &spans, ranges.iter().cloned())
                .collect::<Result<_>>()
                .expect("monotone spans split");
            for (mut r, range) in rs.into_iter().zip(&ranges) {
                let bytes = &source[range.start as usize..range.end as usize];
                for (k, chunk) in bytes.chunks(piece).enumerate() {
                    r.place(range.start + (k * piece) as u64, chunk);
                }
            }
            prop_assert_eq!(got, want);
        }
    }
}

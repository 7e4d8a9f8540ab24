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
//!
//! Where each part lives:
//! * `definition` — the contexts, stream hashing, [`combine`], and how a
//!   snapshot divides into streams and settled pages;
//! * `state` — the extendable hashing state ([`StreamState`],
//!   [`DigestState`]: capture and extension);
//! * `stored` — its written-down form ([`StoredState`]) and
//!   [`DigestState::resume`];
//! * `plan` — the parallel verification plan ([`LayerHashPlan`]: blocks,
//!   pieces, folding);
//! * this module — the entry points that digest a whole snapshot
//!   ([`of_snapshot`], [`digest_like`], [`digest_like_encoding`]).
//!
//! Everything public is reachable here, at `layer_digest::<Name>`.

mod definition;
mod plan;
mod state;
mod stored;

pub use definition::{
    combine, settled_pages, split_streams, stream_count, stream_digest, stream_hasher,
    stream_layers, stream_ranges, supported, LayerDigests, StreamDigest, LAYERS_DIGEST_CONTEXT,
    LAYER_STREAM_CONTEXT, MAX_LAYER_STREAMS,
};
pub use plan::{LayerBlock, LayerHashPlan};
pub use state::{DigestState, StreamFeed, StreamState};
pub use stored::{resume_bytes, resume_ranges, stored_counts, StoredState};

use definition::{par_map, unsupported};

use crate::digest::{Algorithm, Digest};
use crate::error::{Error, Result};
use crate::snapshot::Snapshot;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{GroupKind, LayerSpec, PageGroup, PageLayout};
    use crate::snapshot::SnapshotHeader;
    use proptest::prelude::*;

    // Helpers shared by the submodules' tests.

    pub(super) fn layout(groups: &[(GroupKind, u32, Vec<u64>)]) -> PageLayout {
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
    pub(super) fn reference(s: &Snapshot) -> Digest {
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
    pub(super) fn next_turn(base: &Snapshot, boundary: u64, seed: u64) -> (Snapshot, Vec<Vec<u8>>) {
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

    pub(super) fn flat(layout: &PageLayout, boundary: u64, seed: u64) -> Snapshot {
        let header = SnapshotHeader::new(layout.clone(), boundary);
        let len = header.validate().expect("valid") as usize;
        Snapshot::from_parts(header, &crate::synth::bytes(seed, len)).expect("snapshot")
    }

    pub(super) fn layout_strategy() -> impl Strategy<Value = PageLayout> {
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

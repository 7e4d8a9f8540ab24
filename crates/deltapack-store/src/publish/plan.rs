//! The decisions of a publication, as pure functions of what it was asked
//! and what it found: is the request valid, which digest does the root
//! record, is a delta published as a delta or rebased flat (the chain
//! policy), how much room must be made, which schema the root gets.
//!
//! No I/O and no async here: `mod.rs` gathers the facts (the base root,
//! the chain below it, the delta's layout), asks these functions, and
//! executes what they decide. Each is unit-tested on its own below.

use deltapack_format::root;
use deltapack_format::{Algorithm, BaseRef, CacheIdentity, ChainHints, Digest, SnapshotHeader};

use super::receipt::Turn;
use super::request::{RootFormat, TurnInput};
use crate::config::ChainPolicy;
use crate::error::{Result, StoreError};

/// Checks what can be checked of a request before anything is read or
/// written: the identity, and a boundary that is a positive multiple of the
/// identity's chunk size.
pub(super) fn validate(identity: &CacheIdentity, boundary: u64) -> Result<()> {
    identity.validate()?;
    let ct = u64::from(identity.chunk_tokens);
    if boundary == 0 || boundary % ct != 0 {
        return Err(StoreError::Invalid(format!(
            "boundary {boundary} is not a positive multiple of chunk_tokens {ct}"
        )));
    }
    Ok(())
}

/// Checks a turn request against the previous turn's handle before
/// anything is read: the same store (`store_tag`) and namespace, a new
/// context, a boundary above the previous one and a multiple of the chunk
/// size, and a tail of exactly the new pages' length.
pub(super) fn validate_turn(prev: &Turn, req: &TurnInput, store_tag: &str) -> Result<()> {
    let id = &req.identity;
    id.validate()?;
    let ns = id.namespace();
    let bad = |m: String| Err(StoreError::Invalid(m));
    if *prev.store != *store_tag {
        return bad(format!(
            "the previous turn was published in {}, not in this store ({store_tag})",
            prev.store
        ));
    }
    if prev.namespace != ns {
        return bad(format!(
            "the previous turn lies in namespace {}, the request's identity is {ns}",
            prev.namespace
        ));
    }
    if req.context == prev.context {
        return bad("the new turn's context is the previous turn's".into());
    }
    let ct = u64::from(id.chunk_tokens);
    let (old, new) = (prev.boundary(), req.boundary);
    if new <= old || new % ct != 0 {
        return bad(format!(
            "boundary {new} must be above the previous turn's {old} and a multiple of {ct}"
        ));
    }
    let want = prev.tail_len(new)?;
    if req.tail.len() != want {
        return bad(format!(
            "the tail is {} bytes; a turn from {old} to {new} tokens needs {want} \
             (every layer's pages from the previous turn's kept pages {:?} on)",
            req.tail.len(),
            prev.kept_pages()
        ));
    }
    Ok(())
}

/// Whether the root records the layered digest (a v2.2 root): a v2 root
/// whose snapshot layout allows it.
pub(super) fn layered(format: RootFormat, header: &SnapshotHeader) -> bool {
    format == RootFormat::V2 && deltapack_format::layer_digest::supported(header)
}

/// A stand-in for the result digest, of the kind the root will record: a
/// delta's header has the same length with it as with the real digest, so
/// the delta is laid out before the digest is known.
pub(super) fn stand_in_digest(layered: bool) -> Digest {
    let alg = if layered {
        Algorithm::Blake3Layers
    } else {
        Algorithm::Blake3
    };
    Digest::new(alg, [0; 32])
}

/// What becomes of a delta under the chain policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ChainDecision {
    /// Published flat instead of as a delta.
    pub(super) rebased: bool,
    /// The chain hints a v2 delta root records (its delta header is filled
    /// in once the result digest is known); `None` when rebased or v1.
    pub(super) chain: Option<ChainHints>,
}

/// Decides whether a delta of `delta_len` payload bytes over a base with
/// `below` under it (the roots below the base and their payload bytes, or
/// `None` when that chain cannot be followed to a flat root) is published
/// as a delta, for a result of `result_len` bytes. A v1 delta is never
/// rebased and records no hints. A chain that cannot be followed is always
/// rebased: a delta on it could never be restored.
pub(super) fn decide_chain(
    format: RootFormat,
    below: Option<&(Vec<BaseRef>, u64)>,
    delta_len: u64,
    result_len: u64,
    policy: &ChainPolicy,
) -> ChainDecision {
    if format != RootFormat::V2 {
        return ChainDecision {
            rebased: false,
            chain: None,
        };
    }
    let Some((ancestors, bytes)) = below else {
        return ChainDecision {
            rebased: true,
            chain: None,
        };
    };
    let hints = ChainHints {
        ancestors: ancestors.clone(),
        payload_bytes: bytes + delta_len,
        delta_header: Vec::new(),
    };
    let rebased = policy.rebases(
        hints.ancestors.len() as u64 + 1,
        hints.payload_bytes,
        result_len,
    );
    ChainDecision {
        rebased,
        chain: (!rebased).then_some(hints),
    }
}

/// The bytes to make room for before writing: the payload (objects already
/// present are not subtracted) and a generous estimate of the root.
pub(super) fn room_needed(
    format: RootFormat,
    payload_len: u64,
    max_extent_bytes: u64,
    chunks: u64,
) -> u64 {
    let objects = match format {
        RootFormat::V2 => payload_len.div_ceil(max_extent_bytes.max(1)),
        RootFormat::V1 => chunks,
    };
    payload_len + 4096 + 256 * objects
}

/// The schema of a v2 root: v2.2 with a layered digest, v2.1 with chain
/// hints, else v2.
pub(super) fn v2_schema(layered: bool, chained: bool) -> &'static str {
    match (layered, chained) {
        (true, _) => root::SCHEMA_V2_2,
        (false, true) => root::SCHEMA_V2_1,
        (false, false) => root::SCHEMA_V2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltapack_format::ContextDigest;

    fn base(n: u8) -> BaseRef {
        BaseRef {
            namespace: CacheIdentity::example().namespace(),
            context: ContextDigest([n; 32]),
            boundary: 256 * u64::from(n),
            snapshot_digest: Digest::blake3(&[n]),
        }
    }

    #[test]
    fn a_boundary_must_be_a_positive_multiple_of_the_chunk() {
        let id = CacheIdentity::example();
        let ct = u64::from(id.chunk_tokens);
        assert!(validate(&id, ct).is_ok());
        assert!(validate(&id, 3 * ct).is_ok());
        for bad in [0, 1, ct - 1, ct + 1] {
            assert!(
                matches!(validate(&id, bad), Err(StoreError::Invalid(_))),
                "{bad}"
            );
        }
        let mut odd = id.clone();
        odd.chunk_tokens = 0;
        assert!(validate(&odd, ct).is_err(), "an invalid identity");
    }

    #[test]
    fn a_v1_delta_is_never_rebased_and_records_no_hints() {
        let p = ChainPolicy::default();
        for below in [None, Some((vec![base(1)], 10))] {
            let d = decide_chain(RootFormat::V1, below.as_ref(), 1 << 40, 1, &p);
            assert_eq!(
                d,
                ChainDecision {
                    rebased: false,
                    chain: None
                }
            );
        }
    }

    #[test]
    fn a_chain_that_cannot_be_followed_is_rebased() {
        let d = decide_chain(RootFormat::V2, None, 1, 1 << 30, &ChainPolicy::default());
        assert!(d.rebased);
        assert!(d.chain.is_none());
    }

    #[test]
    fn the_policy_decides_depth_and_read_overhead() {
        let p = ChainPolicy::default()
            .with_max_depth(Some(2))
            .with_max_read_overhead(Some(0.25));
        // Over a flat base (nothing below it): depth 1, reads base + delta.
        let flat = (Vec::new(), 1000);
        let d = decide_chain(RootFormat::V2, Some(&flat), 100, 1000, &p);
        assert!(!d.rebased);
        let hints = d.chain.expect("hints");
        assert_eq!(hints.payload_bytes, 1100);
        assert!(hints.ancestors.is_empty());
        assert!(hints.delta_header.is_empty(), "filled in later");
        // Reading more than 1.25x the result rebases.
        let d = decide_chain(RootFormat::V2, Some(&flat), 300, 1000, &p);
        assert!(d.rebased && d.chain.is_none());
        // Depth 3 > 2 rebases, whatever the bytes.
        let deep = (vec![base(2), base(1)], 10);
        let d = decide_chain(RootFormat::V2, Some(&deep), 1, 1 << 30, &p);
        assert!(d.rebased);
        // Without limits nothing rebases.
        let none = ChainPolicy::default()
            .with_max_depth(None)
            .with_max_read_overhead(None);
        let d = decide_chain(RootFormat::V2, Some(&deep), 1 << 40, 1, &none);
        assert!(!d.rebased);
        assert_eq!(d.chain.map(|c| c.ancestors.len()), Some(2));
    }

    #[test]
    fn room_counts_the_payload_and_a_root_estimate_per_object() {
        assert_eq!(room_needed(RootFormat::V2, 0, 64, 7), 4096);
        assert_eq!(room_needed(RootFormat::V2, 65, 64, 7), 65 + 4096 + 512);
        assert_eq!(room_needed(RootFormat::V1, 65, 64, 7), 65 + 4096 + 7 * 256);
    }

    #[test]
    fn schema_and_stand_in_follow_the_digest_kind() {
        assert_eq!(v2_schema(true, true), root::SCHEMA_V2_2);
        assert_eq!(v2_schema(true, false), root::SCHEMA_V2_2);
        assert_eq!(v2_schema(false, true), root::SCHEMA_V2_1);
        assert_eq!(v2_schema(false, false), root::SCHEMA_V2);
        assert_eq!(stand_in_digest(true).algorithm(), Algorithm::Blake3Layers);
        assert_eq!(stand_in_digest(false).algorithm(), Algorithm::Blake3);
    }
}

//! Root envelopes and manifest bodies.
//!
//! A *root* is the small immutable object that names a context's state. Its
//! stored form is an envelope around a canonical CBOR body:
//!
//! ```text
//! offset  size  field
//! 0       8     magic "DPKROOT\0"
//! 8       2     envelope_version, u16 LE (1)
//! 10      2     flags, u16 LE: bit 0 = keyed MAC trailer present; other bits 0
//! 12      8     body_len, u64 LE (≤ MAX_ROOT_BODY, and exactly the bytes present)
//! 20      32    BLAKE3(body)
//! 52      n     body: CBOR map whose first field is `schema`
//! 52+n    32    (flag bit 0 only) keyed BLAKE3 (root key) over bytes 0..52+n
//! ```
//!
//! Decoding checks the envelope's lengths against the real size before it
//! hashes anything, then the body hash, then dispatches on the body's schema:
//! [`SCHEMA_V2`] (ordered extents) or the legacy [`SCHEMA_V1`] (one SHA-256
//! object per logical chunk). An unknown envelope version, unknown flags or an
//! unknown schema decode as [`DecodedRoot::Incompatible`] — a clean miss for
//! the caller — while damaged bytes are an [`Error`]. Every manifest is
//! validated for internal consistency (extent geometry, counts, lengths, and
//! for v2 that the extent names merge to the payload digest) before it is
//! returned, so later stages can trust its numbers.
//!
//! Encoding is deterministic: struct fields are written in declaration order,
//! integers in their shortest form and absent options as `null`, so
//! `encode(decode(bytes)) == bytes` for every root this crate writes.

use serde::{Deserialize, Serialize};

use crate::digest::{Algorithm, ContextDigest, Digest, Namespace};
use crate::error::{Error, Result};
use crate::extent::{ExtentCodec, ExtentPlan, MAX_EXTENTS};
use crate::layout::PageLayout;
use crate::snapshot::SnapshotHeader;

/// Envelope magic.
pub const ROOT_MAGIC: [u8; 8] = *b"DPKROOT\0";
/// The envelope version this crate writes and reads.
pub const ENVELOPE_VERSION: u16 = 1;
/// Envelope flag: a keyed MAC trailer follows the body.
pub const FLAG_KEYED_MAC: u16 = 1;
/// Fixed envelope header length.
pub const ENVELOPE_HEADER_LEN: usize = 52;
/// Largest accepted root body.
pub const MAX_ROOT_BODY: u64 = 16 << 20;
/// BLAKE3 derive-key context for the root MAC key.
pub const ROOT_MAC_CONTEXT: &str = "deltapack 2026-11-30 root envelope mac v1";
/// Schema string of v2 manifests.
pub const SCHEMA_V2: &str = "deltapack-page-delta-manifest/v2";
/// Schema string of v2.1 manifests: a v2 delta manifest that also lists the
/// roots below its base ([`ChainHints`]), so a reader fetches a whole delta
/// chain in one round trip. Readers of plain v2 see it as an unknown schema
/// (a clean `incompatible` miss).
pub const SCHEMA_V2_1: &str = "deltapack-page-delta-manifest/v2.1";
/// Schema string of v2.2 manifests: a v2 (flat) or v2.1 (delta, with chain
/// hints) manifest whose result snapshot digest is the layered digest
/// (`blake3-layers:`, see [`crate::layer_digest`]) and which records every
/// (group, layer) stream digest ([`ManifestV2::layers`]). Readers of v2 and
/// v2.1 see it as an unknown schema (a clean `incompatible` miss).
pub const SCHEMA_V2_2: &str = "deltapack-page-delta-manifest/v2.2";
/// Most roots a v2.1 manifest lists below its base.
pub const MAX_CHAIN_HINTS: usize = 4096;
/// Schema string of legacy v1 manifests.
pub const SCHEMA_V1: &str = "deltapack-page-delta-manifest/v1";

/// What a root's payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RootKind {
    /// The payload is an encoded snapshot (a base root).
    Snapshot,
    /// The payload is a `page-tail-cow-v1` delta against `base`.
    Delta,
}

/// Reference from a delta root to its base root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaseRef {
    /// Namespace of the base root.
    pub namespace: Namespace,
    /// Context of the base root.
    pub context: ContextDigest,
    /// Snapshot digest the base root must restore to.
    pub snapshot_digest: Digest,
    /// Boundary of the base snapshot.
    pub boundary: u64,
}

/// One extent of a v2 manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtentEntry {
    /// Offset in the payload.
    pub offset: u64,
    /// Raw (uncompressed) length.
    pub raw_len: u64,
    /// Raw name: BLAKE3 subtree chaining value (root hash if single).
    pub raw_digest: Digest,
    /// Storage codec.
    pub codec: ExtentCodec,
    /// Bytes of the stored object.
    pub stored_len: u64,
    /// BLAKE3 of the stored bytes when they differ from the raw bytes.
    pub stored_digest: Option<Digest>,
}

impl ExtentEntry {
    /// The digest that authenticates the stored object (its key).
    pub fn object_digest(&self) -> Digest {
        self.stored_digest.unwrap_or(self.raw_digest)
    }
}

/// The v2 manifest body (`deltapack-page-delta-manifest/v2`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestV2 {
    /// Always [`SCHEMA_V2`].
    pub schema: String,
    /// Namespace this root belongs to.
    pub namespace: Namespace,
    /// Context this root names.
    pub context: ContextDigest,
    /// Snapshot (base) or delta.
    pub kind: RootKind,
    /// Result boundary in tokens.
    pub boundary: u64,
    /// Admission geometry (`chunk_tokens` of the identity).
    pub logical_chunk_tokens: u32,
    /// Page layout of the result.
    pub layout: PageLayout,
    /// Result pages per group.
    pub block_counts: Vec<u64>,
    /// Digest of the reconstructed result snapshot.
    pub result_snapshot_digest: Digest,
    /// Length of the result snapshot encoding.
    pub result_snapshot_len: u64,
    /// The base root (deltas only).
    pub base: Option<BaseRef>,
    /// Payload length.
    pub payload_len: u64,
    /// BLAKE3 of the payload.
    pub payload_digest: Digest,
    /// Extent size M.
    pub max_extent_bytes: u64,
    /// Extents in payload order.
    pub extents: Vec<ExtentEntry>,
    /// v2.1 and v2.2 deltas only (absent, not null, otherwise): the chain
    /// below `base`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<ChainHints>,
    /// v2.2 only (absent, not null, in v2 and v2.1): the result's stream
    /// digests, 32 bytes each in payload order (group by group, layer by
    /// layer). With the result header they hash to `result_snapshot_digest`
    /// (checked on decode), so one layer can be verified alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<serde_bytes::ByteBuf>,
    /// v2.2 only, optional: the result's turn state
    /// ([`crate::layer_digest::StoredState::to_bytes`]), the chaining values
    /// of every stream's settled subtrees, so a process holding the result
    /// publishes the next turn without hashing it. Its length is checked on
    /// decode (it follows from the header); its values are not trusted:
    /// whoever uses them proves them against `layers`
    /// ([`crate::layer_digest::DigestState::resume`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_state: Option<serde_bytes::ByteBuf>,
}

/// What a v2.1 delta root records about the chain below it: the roots to
/// fetch at once, and the chain's size for the publisher's rebase policy.
/// Hints only: a reader checks every root it uses, link by link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainHints {
    /// The roots below `base`, nearest first (the base's base, its base, …),
    /// down to and including the chain's flat root; empty when `base` is
    /// itself flat. Boundaries strictly decrease; all in the root's
    /// namespace; at most [`MAX_CHAIN_HINTS`]. Empty in a manifest from
    /// [`decode_without_ancestors`], whatever the root recorded.
    #[serde(deserialize_with = "ancestors_unless_skipped")]
    pub ancestors: Vec<BaseRef>,
    /// Payload bytes of this root and of every root below it, the flat root
    /// included: what a composed restore reads at most.
    pub payload_bytes: u64,
    /// This root's delta header as it opens the payload (magic, length,
    /// CBOR header), so that a reader plans the whole chain from roots
    /// alone; it is compared with the payload's first bytes as they stream
    /// in and verify.
    #[serde(with = "serde_bytes")]
    pub delta_header: Vec<u8>,
}

/// One chunk object of a legacy v1 manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkEntryV1 {
    /// SHA-256 of the chunk object.
    pub digest: Digest,
    /// Bytes of the chunk object.
    pub bytes: u64,
    /// First token of the logical chunk.
    pub logical_start: u64,
    /// One past the last token of the logical chunk.
    pub logical_end: u64,
}

/// The legacy v1 manifest body (`deltapack-page-delta-manifest/v1`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestV1 {
    /// Always [`SCHEMA_V1`].
    pub schema: String,
    /// Namespace this root belongs to.
    pub namespace: Namespace,
    /// Context this root names.
    pub context: ContextDigest,
    /// Snapshot (base) or delta.
    pub kind: RootKind,
    /// Result boundary in tokens.
    pub boundary: u64,
    /// Admission geometry; the payload is split into `boundary / logical_chunk_tokens` chunks.
    pub logical_chunk_tokens: u32,
    /// Page layout of the result.
    pub layout: PageLayout,
    /// Result pages per group.
    pub block_counts: Vec<u64>,
    /// Digest of the reconstructed result snapshot.
    pub result_snapshot_digest: Digest,
    /// Length of the result snapshot encoding.
    pub result_snapshot_len: u64,
    /// The base root (deltas only).
    pub base: Option<BaseRef>,
    /// Payload length.
    pub payload_len: u64,
    /// BLAKE3 of the payload.
    pub payload_digest: Digest,
    /// Chunk objects in payload order.
    pub chunks: Vec<ChunkEntryV1>,
}

/// The result of decoding a root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodedRoot {
    /// A legacy v1 root.
    V1(ManifestV1),
    /// A v2 root.
    V2(ManifestV2),
    /// A root this version cannot read (unknown envelope version, flags or
    /// schema): a clean miss.
    Incompatible {
        /// Why.
        reason: String,
    },
}

/// The fields v1 and v2 roots have in common.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootSummary {
    /// Schema string.
    pub schema: &'static str,
    /// Namespace.
    pub namespace: Namespace,
    /// Context.
    pub context: ContextDigest,
    /// Kind.
    pub kind: RootKind,
    /// Result boundary.
    pub boundary: u64,
    /// Result snapshot digest.
    pub result_snapshot_digest: Digest,
    /// Result snapshot length.
    pub result_snapshot_len: u64,
    /// Base reference.
    pub base: Option<BaseRef>,
    /// Payload length.
    pub payload_len: u64,
    /// Payload digest.
    pub payload_digest: Digest,
    /// `(object digest, stored bytes)` of every object, in order.
    pub objects: Vec<(Digest, u64)>,
}

/// v1 chunk byte ranges: the payload split into `k` consecutive balanced
/// parts (`start_i = floor(i·len / k)`).
pub fn v1_chunk_ranges(payload_len: u64, k: u64) -> Vec<std::ops::Range<u64>> {
    let at = |i: u64| ((u128::from(i) * u128::from(payload_len)) / u128::from(k.max(1))) as u64;
    (0..k).map(|i| at(i)..at(i + 1)).collect()
}

#[allow(clippy::too_many_arguments)] // the shared fields of two distinct serde structs
fn check_common(
    namespace: &Namespace,
    kind: RootKind,
    boundary: u64,
    chunk_tokens: u32,
    layout: &PageLayout,
    counts: &[u64],
    result_len: u64,
    base: &Option<BaseRef>,
    result_digest: &Digest,
    payload_digest: &Digest,
) -> Result<()> {
    let bad = |m: String| Err(Error::Root(m));
    if chunk_tokens == 0 {
        return bad("logical_chunk_tokens is zero".into());
    }
    let snapshot_alg = |a: Algorithm| matches!(a, Algorithm::Blake3 | Algorithm::Blake3Layers);
    if !snapshot_alg(result_digest.algorithm())
        || payload_digest.algorithm() != Algorithm::Blake3
        || base.is_some_and(|b| !snapshot_alg(b.snapshot_digest.algorithm()))
    {
        return bad("snapshot and payload digests must be BLAKE3".into());
    }
    if boundary == 0 || boundary % u64::from(chunk_tokens) != 0 {
        return bad(format!(
            "boundary {boundary} is not a positive multiple of {chunk_tokens}"
        ));
    }
    let header = SnapshotHeader {
        layout: layout.clone(),
        boundary,
        block_counts: counts.to_vec(),
    };
    let enc = header
        .encoded_len()
        .map_err(|e| Error::Root(format!("result header: {e}")))?;
    if enc != result_len {
        return bad(format!(
            "result_snapshot_len {result_len} but the header implies {enc}"
        ));
    }
    match (kind, base) {
        (RootKind::Snapshot, None) => {}
        (RootKind::Delta, Some(b)) => {
            if b.boundary >= boundary || b.boundary % u64::from(chunk_tokens) != 0 {
                return bad(format!(
                    "base boundary {} invalid for result boundary {boundary}",
                    b.boundary
                ));
            }
            if b.namespace != *namespace {
                return bad("base root lies in another namespace".into());
            }
        }
        (RootKind::Snapshot, Some(_)) => return bad("a snapshot root must not have a base".into()),
        (RootKind::Delta, None) => return bad("a delta root needs a base".into()),
    }
    Ok(())
}

impl ManifestV2 {
    /// Roots below this one's base on its chain, nearest first, as the
    /// publisher recorded them (empty when it recorded none). A hint for
    /// fetching the chain at once: a reader checks every root it uses.
    pub fn chain_hints(&self) -> &[BaseRef] {
        self.chain.as_ref().map_or(&[], |c| &c.ancestors)
    }

    /// The schema string this manifest is written under.
    pub fn schema_str(&self) -> &'static str {
        if self.layers.is_some() {
            SCHEMA_V2_2
        } else if self.chain.is_some() {
            SCHEMA_V2_1
        } else {
            SCHEMA_V2
        }
    }

    fn validate_chain(&self, c: &ChainHints) -> Result<()> {
        let bad = |m: String| Err(Error::Root(m));
        let Some(base) = self.base else {
            return bad("chain hints on a snapshot root".into());
        };
        if c.ancestors.len() > MAX_CHAIN_HINTS {
            return bad(format!(
                "{} chain hints, at most {MAX_CHAIN_HINTS}",
                c.ancestors.len()
            ));
        }
        // Checked here too: `validate` runs this before its own field checks,
        // and a zero chunk size would divide by zero below (found by the
        // root_decode fuzz target; regression seed
        // `fuzz/seeds/root_decode/regression-v21-zero-chunk-tokens`).
        let ct = u64::from(self.logical_chunk_tokens);
        if ct == 0 {
            return bad("logical_chunk_tokens is 0".into());
        }
        let mut below = base.boundary;
        for a in &c.ancestors {
            if a.namespace != self.namespace {
                return bad("a chain hint lies in another namespace".into());
            }
            if a.boundary >= below || a.boundary % ct != 0 {
                return bad(format!(
                    "chain hint boundary {} is not below {below} on the chunk grid",
                    a.boundary
                ));
            }
            below = a.boundary;
        }
        if c.payload_bytes < self.payload_len {
            return bad("the chain holds fewer payload bytes than this root".into());
        }
        let (h, end) = crate::delta::decode_header(&c.delta_header)?;
        if end != c.delta_header.len() || end as u64 > self.payload_len {
            return bad(
                "the recorded delta header has trailing bytes or outgrows the payload".into(),
            );
        }
        if h.result_digest != self.result_snapshot_digest
            || h.base_digest != base.snapshot_digest
            || h.result_boundary != self.boundary
            || h.base_boundary != base.boundary
            || h.result_block_counts != self.block_counts
            || h.chunk_tokens != self.logical_chunk_tokens
        {
            return bad("the recorded delta header does not match the root".into());
        }
        Ok(())
    }

    /// The recorded stream digests hash, with the result header, to the
    /// result snapshot digest.
    fn validate_layers(&self, layers: &[u8]) -> Result<()> {
        let header = SnapshotHeader {
            layout: self.layout.clone(),
            boundary: self.boundary,
            block_counts: self.block_counts.clone(),
        };
        let n = crate::layer_digest::stream_count(&header);
        if n > crate::layer_digest::MAX_LAYER_STREAMS || layers.len() != 32 * n {
            return Err(Error::Root(format!(
                "{} bytes of layer digests for {n} streams",
                layers.len()
            )));
        }
        let streams = crate::layer_digest::split_streams(layers)
            .ok_or_else(|| Error::Root("layer digests are not 32 bytes each".into()))?;
        let prefix = header
            .encode_prefix()
            .map_err(|e| Error::Root(format!("result header: {e}")))?;
        let top = crate::layer_digest::combine(&prefix, &streams);
        if top != self.result_snapshot_digest {
            return Err(Error::mismatch(
                "v2.2 layer digests combined",
                self.result_snapshot_digest,
                top,
            ));
        }
        Ok(())
    }

    /// The recorded turn state split per stream (v2.2 roots that carry
    /// one; `None` otherwise). Unproven: see [`ManifestV2::turn_state`].
    pub fn stored_turn_state(&self) -> Option<crate::layer_digest::StoredState> {
        let bytes = self.turn_state.as_ref()?;
        crate::layer_digest::StoredState::from_bytes(&self.result_header(), bytes).ok()
    }

    fn result_header(&self) -> SnapshotHeader {
        SnapshotHeader {
            layout: self.layout.clone(),
            boundary: self.boundary,
            block_counts: self.block_counts.clone(),
        }
    }

    /// The same v2.2 manifest with the result's turn state recorded.
    pub fn with_turn_state(mut self, state: &crate::layer_digest::StoredState) -> Result<Self> {
        self.turn_state = Some(serde_bytes::ByteBuf::from(state.to_bytes()));
        self.validate()?;
        Ok(self)
    }

    /// The recorded stream digests (v2.2 roots; `None` otherwise).
    pub fn layer_digests(&self) -> Option<Vec<crate::layer_digest::StreamDigest>> {
        self.layers
            .as_ref()
            .and_then(|l| crate::layer_digest::split_streams(l))
    }

    /// Checks internal consistency (see module docs).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Root(m));
        match (self.schema.as_str(), &self.chain, &self.layers) {
            (SCHEMA_V2, None, None) => {}
            (SCHEMA_V2_1, Some(c), None) => self.validate_chain(c)?,
            (SCHEMA_V2_2, c, Some(l)) => {
                if let Some(c) = c {
                    self.validate_chain(c)?;
                }
                self.validate_layers(l)?;
            }
            (SCHEMA_V2, Some(_), _) => return bad("a v2 body must not carry chain hints".into()),
            (SCHEMA_V2_1, None, _) => return bad("a v2.1 body needs chain hints".into()),
            (SCHEMA_V2 | SCHEMA_V2_1, _, Some(_)) => {
                return bad("only a v2.2 body carries layer digests".into())
            }
            (SCHEMA_V2_2, _, None) => return bad("a v2.2 body needs layer digests".into()),
            (other, _, _) => return bad(format!("schema {other:?} in a v2 body")),
        }
        if let Some(ts) = &self.turn_state {
            if self.layers.is_none() {
                return bad("only a v2.2 body carries a turn state".into());
            }
            crate::layer_digest::StoredState::from_bytes(&self.result_header(), ts)
                .map_err(|e| Error::Root(format!("turn state: {e}")))?;
        }
        let layered = self.schema == SCHEMA_V2_2;
        if (self.result_snapshot_digest.algorithm() == Algorithm::Blake3Layers) != layered {
            return bad(format!(
                "a {} body with a {} result digest",
                self.schema,
                self.result_snapshot_digest.algorithm().as_str()
            ));
        }
        check_common(
            &self.namespace,
            self.kind,
            self.boundary,
            self.logical_chunk_tokens,
            &self.layout,
            &self.block_counts,
            self.result_snapshot_len,
            &self.base,
            &self.result_snapshot_digest,
            &self.payload_digest,
        )?;
        // A layered result digest is not the payload's BLAKE3: a v2.2
        // snapshot root's payload is checked by length here and by its
        // extents' names on every read.
        if self.kind == RootKind::Snapshot
            && (self.payload_len != self.result_snapshot_len
                || (!layered && self.payload_digest != self.result_snapshot_digest))
        {
            return bad("a snapshot root's payload must be the result snapshot".into());
        }
        let plan = ExtentPlan::new(self.payload_len, self.max_extent_bytes)
            .map_err(|e| Error::Root(e.to_string()))?;
        if self.extents.len() as u64 != plan.count() {
            return bad(format!(
                "{} extents listed, payload needs {}",
                self.extents.len(),
                plan.count()
            ));
        }
        for (i, e) in self.extents.iter().enumerate() {
            let r = plan.range(i as u64);
            if e.offset != r.start || e.raw_len != r.end - r.start {
                return bad(format!(
                    "extent {i} covers {}+{}, expected {:?}",
                    e.offset, e.raw_len, r
                ));
            }
            if e.raw_digest.algorithm() != Algorithm::Blake3 {
                return bad(format!("extent {i} raw digest is not BLAKE3"));
            }
            match (e.codec, e.stored_digest) {
                (ExtentCodec::Raw, None) if e.stored_len == e.raw_len => {}
                (ExtentCodec::Zstd, Some(d))
                    if d.algorithm() == Algorithm::Blake3
                        && e.stored_len <= zstd_bound(e.raw_len) => {}
                _ => {
                    return bad(format!(
                        "extent {i}: inconsistent codec/stored length/stored digest"
                    ))
                }
            }
        }
        if self.payload_digest.algorithm() != Algorithm::Blake3 {
            return bad("payload digest is not BLAKE3".into());
        }
        let names: Vec<Digest> = self.extents.iter().map(|e| e.raw_digest).collect();
        let merged = plan.merge(&names).map_err(|e| Error::Root(e.to_string()))?;
        if merged != self.payload_digest {
            return Err(Error::mismatch(
                "v2 extent names merged",
                self.payload_digest,
                merged,
            ));
        }
        Ok(())
    }
}

/// Worst-case zstd output for `raw` bytes (generous).
fn zstd_bound(raw: u64) -> u64 {
    raw + raw / 128 + 1024
}

impl ManifestV1 {
    /// Checks internal consistency: chunk count, logical ranges, byte split.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Root(m));
        if self.schema != SCHEMA_V1 {
            return bad(format!("schema {:?} in a v1 body", self.schema));
        }
        if self.result_snapshot_digest.algorithm() != Algorithm::Blake3 {
            return bad("a v1 result digest must be BLAKE3 of the encoding".into());
        }
        check_common(
            &self.namespace,
            self.kind,
            self.boundary,
            self.logical_chunk_tokens,
            &self.layout,
            &self.block_counts,
            self.result_snapshot_len,
            &self.base,
            &self.result_snapshot_digest,
            &self.payload_digest,
        )?;
        if self.kind == RootKind::Snapshot
            && (self.payload_len != self.result_snapshot_len
                || self.payload_digest != self.result_snapshot_digest)
        {
            return bad("a snapshot root's payload must be the result snapshot".into());
        }
        let ct = u64::from(self.logical_chunk_tokens);
        let k = self.boundary / ct;
        if k > MAX_EXTENTS || self.chunks.len() as u64 != k {
            return bad(format!(
                "{} chunks listed, boundary implies {k}",
                self.chunks.len()
            ));
        }
        for ((i, c), r) in self
            .chunks
            .iter()
            .enumerate()
            .zip(v1_chunk_ranges(self.payload_len, k))
        {
            let i = i as u64;
            if c.logical_start != i * ct
                || c.logical_end != (i + 1) * ct
                || c.bytes != r.end - r.start
            {
                return bad(format!("chunk {i} does not match the v1 split"));
            }
            if c.digest.algorithm() != Algorithm::Sha256 {
                return bad(format!("chunk {i} digest is not SHA-256"));
            }
        }
        Ok(())
    }
}

impl DecodedRoot {
    /// The digest of the snapshot this root restores to: its identity, as
    /// the coherence rule and uploads compare it (None when incompatible).
    pub fn snapshot_digest(&self) -> Option<Digest> {
        self.summary().map(|s| s.result_snapshot_digest)
    }

    /// The fields common to v1 and v2 (None when incompatible).
    pub fn summary(&self) -> Option<RootSummary> {
        match self {
            DecodedRoot::V2(m) => Some(RootSummary {
                schema: m.schema_str(),
                namespace: m.namespace,
                context: m.context,
                kind: m.kind,
                boundary: m.boundary,
                result_snapshot_digest: m.result_snapshot_digest,
                result_snapshot_len: m.result_snapshot_len,
                base: m.base,
                payload_len: m.payload_len,
                payload_digest: m.payload_digest,
                objects: m
                    .extents
                    .iter()
                    .map(|e| (e.object_digest(), e.stored_len))
                    .collect(),
            }),
            DecodedRoot::V1(m) => Some(RootSummary {
                schema: SCHEMA_V1,
                namespace: m.namespace,
                context: m.context,
                kind: m.kind,
                boundary: m.boundary,
                result_snapshot_digest: m.result_snapshot_digest,
                result_snapshot_len: m.result_snapshot_len,
                base: m.base,
                payload_len: m.payload_len,
                payload_digest: m.payload_digest,
                objects: m.chunks.iter().map(|c| (c.digest, c.bytes)).collect(),
            }),
            DecodedRoot::Incompatible { .. } => None,
        }
    }
}

/// The MAC key derived from a secret (any length).
pub fn mac_key(secret: &[u8]) -> [u8; 32] {
    blake3::derive_key(ROOT_MAC_CONTEXT, secret)
}

fn envelope(body: &[u8], mac: Option<&[u8; 32]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENVELOPE_HEADER_LEN + body.len() + 32);
    out.extend_from_slice(&ROOT_MAGIC);
    out.extend_from_slice(&ENVELOPE_VERSION.to_le_bytes());
    let flags = if mac.is_some() { FLAG_KEYED_MAC } else { 0 };
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(body).as_bytes());
    out.extend_from_slice(body);
    if let Some(key) = mac {
        let tag = blake3::keyed_hash(key, &out);
        out.extend_from_slice(tag.as_bytes());
    }
    out
}

/// Encodes a v2 root (validating it first). `mac` is a key from [`mac_key`].
pub fn encode_v2(m: &ManifestV2, mac: Option<&[u8; 32]>) -> Result<Vec<u8>> {
    m.validate()?;
    let body = serde_cbor::to_vec(m).map_err(|e| Error::Root(e.to_string()))?;
    Ok(envelope(&body, mac))
}

/// Encodes a v1 root (validating it first).
pub fn encode_v1(m: &ManifestV1, mac: Option<&[u8; 32]>) -> Result<Vec<u8>> {
    m.validate()?;
    let body = serde_cbor::to_vec(m).map_err(|e| Error::Root(e.to_string()))?;
    Ok(envelope(&body, mac))
}

/// Re-encodes a decoded root with the same envelope options.
pub fn encode(root: &DecodedRoot, mac: Option<&[u8; 32]>) -> Result<Vec<u8>> {
    match root {
        DecodedRoot::V1(m) => encode_v1(m, mac),
        DecodedRoot::V2(m) => encode_v2(m, mac),
        DecodedRoot::Incompatible { reason } => Err(Error::Root(format!(
            "cannot encode an incompatible root: {reason}"
        ))),
    }
}

#[derive(Deserialize)]
struct SchemaProbe {
    schema: String,
}

thread_local! {
    /// Set on this thread while [`decode_without_ancestors`] runs.
    static SKIP_ANCESTORS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Deserializes [`ChainHints::ancestors`], or skips over it (checking only
/// that it is well-formed CBOR) while [`decode_without_ancestors`] runs.
fn ancestors_unless_skipped<'de, D>(d: D) -> std::result::Result<Vec<BaseRef>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    if SKIP_ANCESTORS.with(|c| c.get()) {
        serde::de::IgnoredAny::deserialize(d)?;
        Ok(Vec::new())
    } else {
        Vec::deserialize(d)
    }
}

/// [`decode`], except that a v2.1 root's list of ancestors
/// ([`ChainHints::ancestors`]) is skipped, not decoded: the manifest comes
/// back with an empty list. Everything else is decoded and checked as by
/// [`decode`], and the body is verified against the envelope's digest (and
/// MAC) whole, hints included.
///
/// For readers that need a root of a chain but not the list of roots below
/// it, which is every root but the requested one of a chain restore: each
/// root lists all the roots below it, so a chain of N turns holds N²/2
/// references (8.9 MB of CBOR text for 256 turns), and decoding the lists
/// of the roots below the requested one was most of a long chain's root
/// decoding time. A manifest decoded this way must not be re-encoded or
/// used to build another root's hints.
pub fn decode_without_ancestors(bytes: &[u8], mac: Option<&[u8; 32]>) -> Result<DecodedRoot> {
    /// Clears the flag however decoding ends.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            SKIP_ANCESTORS.with(|c| c.set(false));
        }
    }
    SKIP_ANCESTORS.with(|c| c.set(true));
    let _reset = Reset;
    decode(bytes, mac)
}

/// Decodes a root envelope and body.
///
/// With `mac = Some(key)` the envelope must carry a valid keyed MAC
/// (otherwise [`Error::Unauthenticated`]); with `None` a MAC trailer, if
/// present, is length-checked but not verified.
pub fn decode(bytes: &[u8], mac: Option<&[u8; 32]>) -> Result<DecodedRoot> {
    if bytes.len() < ENVELOPE_HEADER_LEN {
        return Err(Error::Root(format!(
            "{} bytes is shorter than a root envelope",
            bytes.len()
        )));
    }
    if bytes[..8] != ROOT_MAGIC {
        return Err(Error::Root("bad magic (not a deltapack root)".into()));
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != ENVELOPE_VERSION {
        return Ok(DecodedRoot::Incompatible {
            reason: format!("envelope version {version}"),
        });
    }
    let flags = u16::from_le_bytes([bytes[10], bytes[11]]);
    if flags & !FLAG_KEYED_MAC != 0 {
        return Ok(DecodedRoot::Incompatible {
            reason: format!("unknown envelope flags {flags:#06x}"),
        });
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&bytes[12..20]);
    let body_len = u64::from_le_bytes(len8);
    if body_len > MAX_ROOT_BODY {
        return Err(Error::Bounds(format!(
            "root body length {body_len} exceeds {MAX_ROOT_BODY}"
        )));
    }
    let trailer = if flags & FLAG_KEYED_MAC != 0 { 32 } else { 0 };
    let expected_total = ENVELOPE_HEADER_LEN as u64 + body_len + trailer;
    if bytes.len() as u64 != expected_total {
        return Err(Error::Root(format!(
            "envelope declares {expected_total} bytes, {} present (truncated or extended)",
            bytes.len()
        )));
    }
    let body_end = ENVELOPE_HEADER_LEN + body_len as usize;
    if let Some(key) = mac {
        if trailer == 0 {
            return Err(Error::Unauthenticated(
                "root carries no MAC but the store is keyed".into(),
            ));
        }
        let tag = blake3::keyed_hash(key, &bytes[..body_end]);
        // blake3::Hash equality is constant time.
        let mut given = [0u8; 32];
        given.copy_from_slice(&bytes[body_end..]);
        if tag != blake3::Hash::from(given) {
            return Err(Error::Unauthenticated(
                "root MAC does not verify with this store's key".into(),
            ));
        }
    }
    let body = &bytes[ENVELOPE_HEADER_LEN..body_end];
    let mut want = [0u8; 32];
    want.copy_from_slice(&bytes[20..52]);
    let want = Digest::new(Algorithm::Blake3, want);
    want.verify("root body", body)?;
    // Nearly every root is v2: decode it as such first, so that its body
    // (megabytes, for the roots of a long chain) is parsed once, not once
    // for the schema and again for the manifest. Anything else takes the
    // schema probe below, which tells v1 from unknown schemas and reports
    // a damaged v2 body.
    if let Ok(m) = serde_cbor::from_slice::<ManifestV2>(body) {
        if m.schema == SCHEMA_V2 || m.schema == SCHEMA_V2_1 || m.schema == SCHEMA_V2_2 {
            m.validate()?;
            return Ok(DecodedRoot::V2(m));
        }
    }
    let probe: SchemaProbe = serde_cbor::from_slice(body)
        .map_err(|e| Error::Root(format!("body has no readable schema: {e}")))?;
    match probe.schema.as_str() {
        SCHEMA_V2 | SCHEMA_V2_1 | SCHEMA_V2_2 => {
            let m: ManifestV2 =
                serde_cbor::from_slice(body).map_err(|e| Error::Root(format!("v2 body: {e}")))?;
            m.validate()?;
            Ok(DecodedRoot::V2(m))
        }
        SCHEMA_V1 => {
            let m: ManifestV1 =
                serde_cbor::from_slice(body).map_err(|e| Error::Root(format!("v1 body: {e}")))?;
            m.validate()?;
            Ok(DecodedRoot::V1(m))
        }
        other => Ok(DecodedRoot::Incompatible {
            reason: format!(
                "unknown schema {:?}",
                other.chars().take(100).collect::<String>()
            ),
        }),
    }
}

/// Whether an envelope carries a MAC trailer flag (without verifying).
pub fn has_mac(bytes: &[u8]) -> bool {
    bytes.len() >= 12 && u16::from_le_bytes([bytes[10], bytes[11]]) & FLAG_KEYED_MAC != 0
}

/// The fields every manifest shares, used to build one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootMeta {
    /// Namespace.
    pub namespace: Namespace,
    /// Context.
    pub context: ContextDigest,
    /// Admission geometry.
    pub chunk_tokens: u32,
    /// Header of the result snapshot.
    pub result_header: SnapshotHeader,
    /// Digest of the result snapshot.
    pub result_snapshot_digest: Digest,
    /// Length of the result snapshot encoding.
    pub result_snapshot_len: u64,
    /// Base reference (deltas only).
    pub base: Option<BaseRef>,
}

impl RootMeta {
    fn kind(&self) -> RootKind {
        if self.base.is_some() {
            RootKind::Delta
        } else {
            RootKind::Snapshot
        }
    }
}

impl ManifestV2 {
    /// Assembles and validates a v2 manifest.
    pub fn new(
        meta: &RootMeta,
        payload_len: u64,
        payload_digest: Digest,
        max_extent_bytes: u64,
        extents: Vec<ExtentEntry>,
    ) -> Result<Self> {
        let m = Self::assemble(meta, payload_len, payload_digest, max_extent_bytes, extents);
        m.validate()?;
        Ok(m)
    }

    /// A v2 manifest from its parts, not yet validated.
    fn assemble(
        meta: &RootMeta,
        payload_len: u64,
        payload_digest: Digest,
        max_extent_bytes: u64,
        extents: Vec<ExtentEntry>,
    ) -> Self {
        ManifestV2 {
            schema: SCHEMA_V2.into(),
            namespace: meta.namespace,
            context: meta.context,
            kind: meta.kind(),
            boundary: meta.result_header.boundary,
            logical_chunk_tokens: meta.chunk_tokens,
            layout: meta.result_header.layout.clone(),
            block_counts: meta.result_header.block_counts.clone(),
            result_snapshot_digest: meta.result_snapshot_digest,
            result_snapshot_len: meta.result_snapshot_len,
            base: meta.base,
            payload_len,
            payload_digest,
            max_extent_bytes,
            extents,
            chain: None,
            layers: None,
            turn_state: None,
        }
    }

    /// The same manifest with chain hints (deltas only): v2.1, or v2.2
    /// when it records layer digests.
    pub fn with_chain(mut self, chain: ChainHints) -> Result<Self> {
        self.chain = Some(chain);
        self.schema = self.schema_str().into();
        self.validate()?;
        Ok(self)
    }

    /// Assembles and validates a v2.2 manifest: `meta`'s result digest is
    /// the layered digest of which `layers` holds the stream digests.
    pub fn new_layered(
        meta: &RootMeta,
        layers: &[crate::layer_digest::StreamDigest],
        payload_len: u64,
        payload_digest: Digest,
        max_extent_bytes: u64,
        extents: Vec<ExtentEntry>,
    ) -> Result<Self> {
        let mut m = Self::assemble(meta, payload_len, payload_digest, max_extent_bytes, extents);
        m.layers = Some(serde_bytes::ByteBuf::from(layers.concat()));
        m.schema = m.schema_str().into();
        m.validate()?;
        Ok(m)
    }
}

impl ManifestV1 {
    /// Assembles and validates a v1 manifest.
    pub fn new(
        meta: &RootMeta,
        payload_len: u64,
        payload_digest: Digest,
        chunks: Vec<ChunkEntryV1>,
    ) -> Result<Self> {
        let m = ManifestV1 {
            schema: SCHEMA_V1.into(),
            namespace: meta.namespace,
            context: meta.context,
            kind: meta.kind(),
            boundary: meta.result_header.boundary,
            logical_chunk_tokens: meta.chunk_tokens,
            layout: meta.result_header.layout.clone(),
            block_counts: meta.result_header.block_counts.clone(),
            result_snapshot_digest: meta.result_snapshot_digest,
            result_snapshot_len: meta.result_snapshot_len,
            base: meta.base,
            payload_len,
            payload_digest,
            chunks,
        };
        m.validate()?;
        Ok(m)
    }
}

/// Builds the v2 extent entries for `payload` (all raw, or zstd where
/// `compress_level` is given and compression saves at least 1/16 of the
/// extent), returning the entries and each extent's stored bytes range or
/// compressed bytes.
pub fn v2_extents(
    payload: &[u8],
    max_extent_bytes: u64,
    compress_level: Option<i32>,
) -> Result<V2Extents> {
    let plan = ExtentPlan::new(payload.len() as u64, max_extent_bytes)?;
    let specs = plan.name_all(payload)?;
    let mut entries = Vec::with_capacity(specs.len());
    let mut stored = Vec::with_capacity(specs.len());
    for s in &specs {
        let raw = &payload[s.offset as usize..(s.offset + s.raw_len) as usize];
        let compressed = match compress_level {
            Some(level) => {
                let c = crate::extent::compress(raw, level)?;
                ((c.len() as u64) < s.raw_len - s.raw_len / 16).then_some(c)
            }
            None => None,
        };
        let entry = match &compressed {
            Some(c) => ExtentEntry {
                offset: s.offset,
                raw_len: s.raw_len,
                raw_digest: s.raw_digest,
                codec: ExtentCodec::Zstd,
                stored_len: c.len() as u64,
                stored_digest: Some(Digest::blake3(c)),
            },
            None => ExtentEntry {
                offset: s.offset,
                raw_len: s.raw_len,
                raw_digest: s.raw_digest,
                codec: ExtentCodec::Raw,
                stored_len: s.raw_len,
                stored_digest: None,
            },
        };
        entries.push(entry);
        stored.push(compressed);
    }
    let names: Vec<Digest> = specs.iter().map(|s| s.raw_digest).collect();
    let payload_digest = plan.merge(&names)?;
    Ok(V2Extents {
        entries,
        compressed: stored,
        payload_digest,
    })
}

/// The output of [`v2_extents`].
#[derive(Debug, Clone)]
pub struct V2Extents {
    /// Manifest entries, in payload order.
    pub entries: Vec<ExtentEntry>,
    /// For each entry, the compressed stored bytes (zstd) or `None` (raw:
    /// the stored bytes are the payload range itself).
    pub compressed: Vec<Option<Vec<u8>>>,
    /// BLAKE3 of the payload.
    pub payload_digest: Digest,
}

/// Builds the v1 chunk entries for `payload` split into `boundary /
/// chunk_tokens` parts.
pub fn v1_chunks(payload: &[u8], boundary: u64, chunk_tokens: u32) -> Result<Vec<ChunkEntryV1>> {
    let ct = u64::from(chunk_tokens);
    if ct == 0 || boundary % ct != 0 || boundary == 0 {
        return Err(Error::Invalid(format!(
            "boundary {boundary} is not a positive multiple of {chunk_tokens}"
        )));
    }
    let k = boundary / ct;
    if k > MAX_EXTENTS {
        return Err(Error::Bounds(format!("{k} v1 chunks exceed {MAX_EXTENTS}")));
    }
    Ok(v1_chunk_ranges(payload.len() as u64, k)
        .into_iter()
        .enumerate()
        .map(|(i, r)| ChunkEntryV1 {
            digest: Digest::sha256(&payload[r.start as usize..r.end as usize]),
            bytes: r.end - r.start,
            logical_start: i as u64 * ct,
            logical_end: (i as u64 + 1) * ct,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `root_decode` fuzz target: a v2.1 body with
    /// `logical_chunk_tokens = 0` and chain hints divided by zero in the
    /// chain check. It must be a clean error.
    #[test]
    fn a_v2_1_root_with_zero_chunk_tokens_is_an_error_not_a_panic() {
        let bytes =
            include_bytes!("../../../fuzz/seeds/root_decode/regression-v21-zero-chunk-tokens");
        assert!(decode(bytes, None).is_err());
    }
    use crate::layout::{GroupKind, LayerSpec, PageGroup};
    use crate::snapshot::Snapshot;

    fn snapshot(boundary: u64) -> Snapshot {
        let layout = PageLayout {
            groups: vec![PageGroup {
                kind: GroupKind::Full,
                tokens_per_page: 16,
                layers: vec![LayerSpec {
                    name: "kv".into(),
                    dtype: "bf16".into(),
                    bytes_per_page: 300,
                }],
            }],
        };
        let h = SnapshotHeader::new(layout, boundary);
        let n = h.validate().expect("len") as usize;
        Snapshot::from_parts(h, &(0..n).map(|i| (i * 7) as u8).collect::<Vec<_>>()).expect("snap")
    }

    fn meta(s: &Snapshot) -> RootMeta {
        RootMeta {
            namespace: Namespace([1; 32]),
            context: ContextDigest([2; 32]),
            chunk_tokens: 16,
            result_header: s.header().clone(),
            result_snapshot_digest: s.digest(),
            result_snapshot_len: s.encoded().len() as u64,
            base: None,
        }
    }

    fn v2(s: &Snapshot, level: Option<i32>) -> ManifestV2 {
        let x = v2_extents(s.encoded(), 1024, level).expect("extents");
        ManifestV2::new(
            &meta(s),
            s.encoded().len() as u64,
            x.payload_digest,
            1024,
            x.entries,
        )
        .expect("manifest")
    }

    #[test]
    fn v2_and_v1_round_trip_byte_identically() {
        let s = snapshot(64);
        for level in [None, Some(3)] {
            let m = v2(&s, level);
            assert!(m.extents.len() > 1);
            let bytes = encode_v2(&m, None).expect("enc");
            let back = decode(&bytes, None).expect("dec");
            assert_eq!(back, DecodedRoot::V2(m.clone()));
            assert_eq!(encode(&back, None).expect("re"), bytes);
        }
        let chunks = v1_chunks(s.encoded(), 64, 16).expect("chunks");
        assert_eq!(chunks.len(), 4);
        let m1 =
            ManifestV1::new(&meta(&s), s.encoded().len() as u64, s.digest(), chunks).expect("v1");
        let bytes = encode_v1(&m1, None).expect("enc");
        assert_eq!(decode(&bytes, None).expect("dec"), DecodedRoot::V1(m1));
    }

    #[test]
    fn envelope_damage_is_an_error_and_unknowns_are_incompatible() {
        let s = snapshot(64);
        let bytes = encode_v2(&v2(&s, None), None).expect("enc");
        for i in [0, 9, 13, 30, 60, bytes.len() - 1] {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            match decode(&b, None) {
                Err(_) | Ok(DecodedRoot::Incompatible { .. }) => {}
                Ok(other) => panic!("flip at {i} decoded as {other:?}"),
            }
        }
        assert!(decode(&bytes[..bytes.len() - 1], None).is_err());
        let mut ext = bytes.clone();
        ext.push(0);
        assert!(decode(&ext, None).is_err());
        let mut huge = bytes.clone();
        huge[12..20].copy_from_slice(&(1u64 << 63).to_le_bytes());
        assert!(matches!(decode(&huge, None), Err(Error::Bounds(_))));
        let mut ver = bytes.clone();
        ver[8] = 2;
        assert!(matches!(
            decode(&ver, None),
            Ok(DecodedRoot::Incompatible { .. })
        ));
        // Unknown schema: valid envelope around a body with another schema.
        let body = serde_cbor::to_vec(&serde_cbor::Value::Map(
            [(
                serde_cbor::Value::Text("schema".into()),
                serde_cbor::Value::Text("deltapack-page-delta-manifest/v9".into()),
            )]
            .into_iter()
            .collect(),
        ))
        .expect("cbor");
        assert!(matches!(
            decode(&envelope(&body, None), None),
            Ok(DecodedRoot::Incompatible { .. })
        ));
        assert!(decode(&envelope(b"\xff\x00", None), None).is_err());
    }

    #[test]
    fn keyed_mac() {
        let s = snapshot(64);
        let key = mac_key(b"secret");
        let other = mac_key(b"other");
        let m = v2(&s, None);
        let keyed = encode_v2(&m, Some(&key)).expect("enc");
        let plain = encode_v2(&m, None).expect("enc");
        assert!(decode(&keyed, Some(&key)).is_ok());
        assert!(matches!(
            decode(&keyed, Some(&other)),
            Err(Error::Unauthenticated(_))
        ));
        assert!(matches!(
            decode(&plain, Some(&key)),
            Err(Error::Unauthenticated(_))
        ));
        assert!(decode(&keyed, None).is_ok());
    }

    #[test]
    fn inconsistent_manifests_are_refused() {
        let s = snapshot(64);
        let good = v2(&s, None);
        let mut m = good.clone();
        m.extents.pop();
        assert!(m.validate().is_err());
        let mut m = good.clone();
        m.extents.swap(0, 1);
        assert!(m.validate().is_err());
        let mut m = good.clone();
        m.payload_len += 1;
        assert!(m.validate().is_err());
        let mut m = good.clone();
        m.max_extent_bytes = 1000;
        assert!(m.validate().is_err());
        let mut m = good.clone();
        m.boundary = 65;
        assert!(m.validate().is_err());
        let mut m = good.clone();
        m.kind = RootKind::Delta;
        assert!(m.validate().is_err());
        let mut m = good;
        m.extents[0].raw_digest = Digest::sha256(b"x");
        assert!(m.validate().is_err());
    }
}

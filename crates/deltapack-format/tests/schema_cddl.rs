//! The CDDL schemas in `schemas/` and the Rust root encoders must never drift.
//!
//! `schemas/*.cddl` are the frozen, language-neutral description of what a
//! stored root looks like (the binary envelope, documented byte by byte in
//! `envelope.cddl`, and the CBOR manifest bodies in `manifest-v1.cddl`,
//! `manifest-v2.cddl` and `common.cddl`). `deltapack_format::root` is the code
//! that actually writes and reads roots. Other implementations, CI migration
//! checks and reviewers rely on the schemas, so a change to a Rust struct
//! (a renamed, added, retyped or reordered field) that is not reflected in
//! the CDDL — or a CDDL edit that no longer matches the bytes — must fail
//! here. This test therefore:
//!
//! * builds roots through the public API (v1 and v2, snapshot and delta with
//!   a base reference, raw and zstd extents, keyed and unkeyed envelopes),
//!   opens each envelope by the byte layout documented in `envelope.cddl`
//!   (not by `root.rs`), and validates each body against the concatenated
//!   CDDL, and checks that the map keys appear in the order the schemas list;
//! * validates every released fixture root under `fixtures/**/roots/**`
//!   that the decoder accepts (roots it refuses, e.g. deliberately damaged
//!   ones, are listed as skipped);
//! * shows the schemas are not trivially permissive: bodies with a wrong
//!   type, a missing field, an uppercase digest or an unknown field must fail
//!   validation, and the Rust decoder must refuse them too (the one known
//!   exception, an absent nullable key, is pinned as such);
//! * checks the envelope constants named in `envelope.cddl` against the code.
//!
//! CDDL has no include directive, so documents are concatenations of the
//! schema files; the manifest file comes first because the first rule of a
//! CDDL document is its root.

use std::path::{Path, PathBuf};

use deltapack_format::root::{
    self, encode_v1, encode_v2, v1_chunks, v2_extents, DecodedRoot, ManifestV1, ManifestV2,
    RootMeta,
};
use deltapack_format::{
    delta, BaseRef, ChainHints, ContextDigest, Digest, ExtentCodec, GroupKind, LayerSpec,
    Namespace, PageGroup, PageLayout, RootKind, Snapshot, SnapshotHeader,
};
use serde_cbor::Value;

const SCHEMA_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../schemas");
const FIXTURE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures");

/// The envelope layout as documented in `envelope.cddl` (deliberately
/// restated here rather than taken from `root.rs`).
const MAGIC: &[u8; 8] = b"DPKROOT\0";
const HEADER_LEN: usize = 52;
const MAC_LEN: usize = 32;
const MAX_BODY: u64 = 16 << 20;
const MAC_CONTEXT: &str = "deltapack 2026-11-30 root envelope mac v1";

const SECRET: &[u8] = b"schema-cddl test secret";

// ---------------------------------------------------------------------------
// Schema documents and validation

fn schema_file(name: &str) -> String {
    let path = Path::new(SCHEMA_DIR).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A CDDL document: the given schema files concatenated in order.
fn document(files: &[&str]) -> String {
    files
        .iter()
        .map(|f| schema_file(f))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The three documents a body is checked against.
struct Docs {
    /// `manifest-v1.cddl` + `common.cddl` (root rule `manifest-v1`).
    v1: String,
    /// `manifest-v2.cddl` + `common.cddl` (root rule `manifest-v2`).
    v2: String,
    /// `manifest-v2.1.cddl` + `manifest-v2.cddl` + `common.cddl` (root rule
    /// `manifest-v2.1`).
    v2_1: String,
    /// `manifest-v2.2.cddl` + `manifest-v2.1.cddl` + `manifest-v2.cddl` +
    /// `common.cddl` (root rule `manifest-v2.2`).
    v2_2: String,
    /// `envelope.cddl` + every manifest + `common.cddl` (root rule
    /// `root-body`).
    body: String,
}

impl Docs {
    fn load() -> Self {
        Docs {
            v1: document(&["manifest-v1.cddl", "common.cddl"]),
            v2: document(&["manifest-v2.cddl", "common.cddl"]),
            v2_1: document(&["manifest-v2.1.cddl", "manifest-v2.cddl", "common.cddl"]),
            v2_2: document(&[
                "manifest-v2.2.cddl",
                "manifest-v2.1.cddl",
                "manifest-v2.cddl",
                "common.cddl",
            ]),
            body: document(&[
                "envelope.cddl",
                "manifest-v1.cddl",
                "manifest-v2.cddl",
                "manifest-v2.1.cddl",
                "manifest-v2.2.cddl",
                "common.cddl",
            ]),
        }
    }

    fn for_version(&self, v: Version) -> &str {
        match v {
            Version::V1 => &self.v1,
            Version::V2 => &self.v2,
            Version::V2_1 => &self.v2_1,
            Version::V2_2 => &self.v2_2,
        }
    }

    /// The other versions' documents: a body must match none of them.
    fn other_versions(&self, v: Version) -> Vec<&str> {
        match v {
            Version::V1 => vec![&self.v2, &self.v2_1, &self.v2_2],
            Version::V2 => vec![&self.v1, &self.v2_1, &self.v2_2],
            Version::V2_1 => vec![&self.v1, &self.v2, &self.v2_2],
            Version::V2_2 => vec![&self.v1, &self.v2, &self.v2_1],
        }
    }
}

/// Validates `cbor` against the root rule of `doc`: `Ok` or the validation
/// errors. Anything that is not a validation verdict (the CDDL does not
/// parse, the bytes are not CBOR) panics, so a broken schema can never make
/// the negative cases pass by failing everything.
/// A validator's errors as one line (there must be some).
fn joined<E: ToString>(errors: &[E]) -> String {
    assert!(!errors.is_empty(), "validation failed without errors");
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn validate(doc: &str, cbor: &[u8]) -> Result<(), String> {
    match cddl::validate_cbor_from_slice(doc, cbor, None) {
        Ok(()) => Ok(()),
        Err(cddl::validator::cbor::Error::Validation(errors)) => Err(joined(&errors)),
        Err(other) => panic!("not a validation verdict (schema or CBOR unreadable): {other}"),
    }
}

// ---------------------------------------------------------------------------
// The envelope, read by the layout documented in envelope.cddl

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
    V2_1,
    V2_2,
}

struct Opened<'a> {
    body: &'a [u8],
    /// Bytes covered by the MAC (0..52+n) and the MAC, when flag bit 0 is set.
    mac: Option<(&'a [u8], &'a [u8])>,
}

fn open_envelope(bytes: &[u8]) -> Result<Opened<'_>, String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!("{} bytes, shorter than the header", bytes.len()));
    }
    if &bytes[0..8] != MAGIC {
        return Err("bad magic".into());
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != 1 {
        return Err(format!("envelope_version {version}"));
    }
    let flags = u16::from_le_bytes([bytes[10], bytes[11]]);
    if flags & !1 != 0 {
        return Err(format!("reserved flag bits set: {flags:#06x}"));
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&bytes[12..20]);
    let n = u64::from_le_bytes(len8);
    if n > MAX_BODY {
        return Err(format!("body_len {n} above the limit"));
    }
    let n = n as usize;
    let trailer = if flags & 1 != 0 { MAC_LEN } else { 0 };
    if bytes.len() != HEADER_LEN + n + trailer {
        return Err(format!(
            "{} bytes, the header declares {}",
            bytes.len(),
            HEADER_LEN + n + trailer
        ));
    }
    let body = &bytes[HEADER_LEN..HEADER_LEN + n];
    if blake3::hash(body).as_bytes()[..] != bytes[20..52] {
        return Err("BLAKE3(body) does not match bytes 20..52".into());
    }
    let mac = (trailer != 0).then(|| (&bytes[..HEADER_LEN + n], &bytes[HEADER_LEN + n..]));
    Ok(Opened { body, mac })
}

/// Wraps a body in an unkeyed envelope, by the documented layout.
fn seal(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(body).as_bytes());
    out.extend_from_slice(body);
    out
}

// ---------------------------------------------------------------------------
// Map key order: CDDL maps are unordered, but the encoding is canonical
// (keys in struct declaration order) and the schemas list keys in that
// order; compare the two.

/// The key sequence of every CBOR map in `cbor`, in encoded order.
fn encoded_key_orders(cbor: &[u8]) -> Vec<Vec<String>> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

    struct Walk<'a>(&'a mut Vec<Vec<String>>);

    impl<'de> DeserializeSeed<'de> for Walk<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Walk<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("any CBOR item")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let out = self.0;
            let mut keys = Vec::new();
            while let Some(k) = map.next_key::<String>()? {
                keys.push(k);
                map.next_value_seed(Walk(&mut *out))?;
            }
            out.push(keys);
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let out = self.0;
            while seq.next_element_seed(Walk(&mut *out))?.is_some() {}
            Ok(())
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_bytes<E>(self, _: &[u8]) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_none<E>(self) -> Result<(), E> {
            Ok(())
        }
    }

    let mut out = Vec::new();
    let mut de = serde_cbor::Deserializer::from_slice(cbor);
    Walk(&mut out).deserialize(&mut de).expect("walk CBOR");
    de.end().expect("one CBOR item");
    out
}

/// `(rule name, keys in order)` of every map rule written as
/// `name = {` … `}` with one `key: type` (or `"key": type`) per line, the
/// style of the schema files.
/// A map rule's keys in order, each with whether it is optional (`? key:`).
type RuleKeys = Vec<(String, bool)>;

/// Whether `keys` (a map's keys as encoded) follow `rule`: every required
/// key in order, optional keys present or not, nothing else.
fn follows(rule: &RuleKeys, keys: &[String]) -> bool {
    let mut at = 0;
    for (k, optional) in rule {
        if keys.get(at) == Some(k) {
            at += 1;
        } else if !optional {
            return false;
        }
    }
    at == keys.len()
}

fn schema_map_rules(doc: &str) -> Vec<(String, RuleKeys)> {
    let mut rules = Vec::new();
    let mut open: Option<(String, RuleKeys)> = None;
    for line in doc.lines() {
        let line = line.split(';').next().unwrap_or("").trim();
        if let Some((name, keys)) = open.as_mut() {
            if line.starts_with('}') {
                rules.push((std::mem::take(name), std::mem::take(keys)));
                open = None;
            } else if let Some((key, _)) = line.split_once(':') {
                // A bareword key, or a quoted one (`"bytes": u64`).
                let key = key.trim();
                let (key, optional) = match key.strip_prefix('?') {
                    Some(k) => (k.trim(), true),
                    None => (key, false),
                };
                let key = key
                    .strip_prefix('"')
                    .and_then(|k| k.strip_suffix('"'))
                    .unwrap_or(key);
                if !key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                    keys.push((key.to_string(), optional));
                }
            }
        } else if let Some(name) = line.strip_suffix('{') {
            if let Some(name) = name.trim().strip_suffix('=') {
                open = Some((name.trim().to_string(), Vec::new()));
            }
        }
    }
    assert!(open.is_none(), "unterminated map rule in the schema");
    rules
}

/// Checks that every map of `body` lists its keys exactly as some map rule
/// of `doc` does; returns the names of the rules matched.
fn check_key_order(doc: &str, body: &[u8], what: &str) -> Vec<String> {
    let rules = schema_map_rules(doc);
    encoded_key_orders(body)
        .into_iter()
        .map(|keys| {
            rules
                .iter()
                .find(|(_, k)| follows(k, &keys))
                .map(|(name, _)| name.clone())
                .unwrap_or_else(|| {
                    panic!("{what}: map keys {keys:?} are not in the order of any schema map rule")
                })
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Building roots with the public API

const CHUNK_TOKENS: u32 = 32;

fn small_layout() -> PageLayout {
    PageLayout {
        groups: vec![PageGroup {
            kind: GroupKind::Full,
            tokens_per_page: 16,
            layers: vec![LayerSpec {
                name: "layer.0.kv".into(),
                dtype: "bf16".into(),
                bytes_per_page: 300,
            }],
        }],
    }
}

fn mixed_layout() -> PageLayout {
    PageLayout {
        groups: vec![
            PageGroup {
                kind: GroupKind::Full,
                tokens_per_page: 16,
                layers: vec![
                    LayerSpec {
                        name: "layer.0.k".into(),
                        dtype: "bf16".into(),
                        bytes_per_page: 256,
                    },
                    LayerSpec {
                        name: "layer.0.v".into(),
                        dtype: "bf16".into(),
                        bytes_per_page: 1024,
                    },
                ],
            },
            PageGroup {
                kind: GroupKind::Recurrent,
                tokens_per_page: 16,
                layers: vec![LayerSpec {
                    name: "layer.1.ssm".into(),
                    dtype: "f32".into(),
                    bytes_per_page: 512,
                }],
            },
        ],
    }
}

/// A snapshot whose page bytes depend only on (group, layer, page) — plus
/// the boundary for recurrent checkpoints — so that a longer snapshot shares
/// pages with a shorter one. Even layers are compressible, odd layers are
/// pseudo-random, so zstd extents and raw extents both occur.
fn snapshot(layout: PageLayout, boundary: u64) -> Snapshot {
    let header = SnapshotHeader::new(layout, boundary);
    let mut payload = Vec::new();
    for (gi, g) in header.layout.groups.iter().enumerate() {
        for (li, l) in g.layers.iter().enumerate() {
            for p in 0..header.block_counts[gi] {
                let mut x = (gi as u64 + 1) * 1_000_003 + (li as u64 + 1) * 10_007 + p * 101;
                if g.kind == GroupKind::Recurrent {
                    x ^= boundary << 20;
                }
                for i in 0..l.bytes_per_page {
                    let b = if li % 2 == 0 {
                        (x as u8) ^ ((i / 64) as u8)
                    } else {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x >> 24) as u8
                    };
                    payload.push(b);
                }
            }
        }
    }
    Snapshot::from_parts(header, &payload).expect("snapshot")
}

fn namespace() -> Namespace {
    Namespace(*blake3::hash(b"schema-cddl namespace").as_bytes())
}

fn context(boundary: u64) -> ContextDigest {
    ContextDigest(*blake3::hash(&boundary.to_le_bytes()).as_bytes())
}

fn meta(result: &Snapshot, base: Option<&Snapshot>) -> RootMeta {
    RootMeta {
        namespace: namespace(),
        context: context(result.boundary()),
        chunk_tokens: CHUNK_TOKENS,
        result_header: result.header().clone(),
        result_snapshot_digest: result.digest(),
        result_snapshot_len: result.encoded().len() as u64,
        base: base.map(|b| BaseRef {
            namespace: namespace(),
            context: context(b.boundary()),
            snapshot_digest: b.digest(),
            boundary: b.boundary(),
        }),
    }
}

/// `(result, base)` → the payload a root stores.
fn payload(result: &Snapshot, base: Option<&Snapshot>) -> Vec<u8> {
    match base {
        None => result.encoded().to_vec(),
        Some(b) => delta::encode(CHUNK_TOKENS, b, result).expect("delta"),
    }
}

fn build_v2(
    result: &Snapshot,
    base: Option<&Snapshot>,
    max_extent_bytes: u64,
    level: Option<i32>,
    keyed: bool,
) -> (ManifestV2, Vec<u8>) {
    let p = payload(result, base);
    let x = v2_extents(&p, max_extent_bytes, level).expect("extents");
    let m = ManifestV2::new(
        &meta(result, base),
        p.len() as u64,
        x.payload_digest,
        max_extent_bytes,
        x.entries,
    )
    .expect("v2 manifest");
    let key = keyed.then(|| root::mac_key(SECRET));
    let bytes = encode_v2(&m, key.as_ref()).expect("encode v2");
    (m, bytes)
}

/// A v2.1 delta root: the v2 delta plus chain hints naming one root below
/// its base.
fn build_v2_1(
    result: &Snapshot,
    base: &Snapshot,
    max_extent_bytes: u64,
    level: Option<i32>,
    keyed: bool,
) -> (ManifestV2, Vec<u8>) {
    let (m, _) = build_v2(result, Some(base), max_extent_bytes, level, false);
    let p = payload(result, Some(base));
    let m = m.with_chain(chain_hints(&p)).expect("v2.1 manifest");
    let key = keyed.then(|| root::mac_key(SECRET));
    let bytes = encode_v2(&m, key.as_ref()).expect("encode v2.1");
    (m, bytes)
}

/// A v2.2 root: the layered result digest and its stream digests; a delta
/// (on a base of either digest kind) with or without chain hints.
fn build_v2_2(
    result: &Snapshot,
    base: Option<&Snapshot>,
    layered_base: bool,
    chained: bool,
    max_extent_bytes: u64,
    keyed: bool,
    turn_state: bool,
) -> (ManifestV2, Vec<u8>) {
    let (digests, state) =
        deltapack_format::layer_digest::DigestState::capture(result).expect("layers");
    let base_digest = |b: &Snapshot| {
        if layered_base {
            deltapack_format::layer_digest::of_snapshot(b)
                .expect("layers")
                .snapshot
        } else {
            b.digest()
        }
    };
    let p = match base {
        None => result.encoded().to_vec(),
        Some(b) => {
            let l = deltapack_format::DeltaLayout::new(
                CHUNK_TOKENS,
                b,
                result,
                base_digest(b),
                digests.snapshot,
            )
            .expect("delta layout");
            let mut p = l.header_bytes().expect("header");
            for r in &l.tails {
                p.extend_from_slice(&result.encoded()[r.clone()]);
            }
            p
        }
    };
    let x = v2_extents(&p, max_extent_bytes, None).expect("extents");
    let mut meta = meta(result, base);
    meta.result_snapshot_digest = digests.snapshot;
    if let (Some(r), Some(b)) = (meta.base.as_mut(), base) {
        r.snapshot_digest = base_digest(b);
    }
    let mut m = ManifestV2::new_layered(
        &meta,
        &digests.streams,
        p.len() as u64,
        x.payload_digest,
        max_extent_bytes,
        x.entries,
    )
    .expect("v2.2 manifest");
    if chained {
        m = m
            .with_chain(chain_hints(&p))
            .expect("v2.2 chained manifest");
    }
    if turn_state {
        m = m
            .with_turn_state(&state.stored())
            .expect("v2.2 manifest with a turn state");
    }
    let key = keyed.then(|| root::mac_key(SECRET));
    let bytes = encode_v2(&m, key.as_ref()).expect("encode v2.2");
    (m, bytes)
}

fn build_v1(result: &Snapshot, base: Option<&Snapshot>, keyed: bool) -> (ManifestV1, Vec<u8>) {
    let p = payload(result, base);
    let chunks = v1_chunks(&p, result.boundary(), CHUNK_TOKENS).expect("chunks");
    let digest = if base.is_none() {
        result.digest()
    } else {
        Digest::blake3(&p)
    };
    let m =
        ManifestV1::new(&meta(result, base), p.len() as u64, digest, chunks).expect("v1 manifest");
    let key = keyed.then(|| root::mac_key(SECRET));
    let bytes = encode_v1(&m, key.as_ref()).expect("encode v1");
    (m, bytes)
}

struct Case {
    name: String,
    version: Version,
    keyed: bool,
    bytes: Vec<u8>,
    decoded: DecodedRoot,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for (lname, layout) in [("small", small_layout()), ("mixed", mixed_layout())] {
        let base = snapshot(layout.clone(), 128);
        let result = snapshot(layout, 256);
        // (name, base, max_extent_bytes, zstd level, keyed)
        let v2_variants = [
            ("v2 snapshot raw", None, 1024, None, false),
            ("v2 snapshot zstd keyed", None, 1024, Some(3), true),
            ("v2 snapshot single extent", None, 1 << 20, Some(3), false),
            ("v2 delta zstd", Some(&base), 1024, Some(3), false),
            ("v2 delta raw keyed", Some(&base), 2048, None, true),
        ];
        for (name, b, m, level, keyed) in v2_variants {
            let (manifest, bytes) = build_v2(&result, b, m, level, keyed);
            out.push(Case {
                name: format!("{lname}: {name}"),
                version: Version::V2,
                keyed,
                bytes,
                decoded: DecodedRoot::V2(manifest),
            });
        }
        for (name, m, level, keyed) in [
            ("v2.1 delta raw", 1024, None, false),
            ("v2.1 delta zstd keyed", 2048, Some(3), true),
        ] {
            let (manifest, bytes) = build_v2_1(&result, &base, m, level, keyed);
            out.push(Case {
                name: format!("{lname}: {name}"),
                version: Version::V2_1,
                keyed,
                bytes,
                decoded: DecodedRoot::V2(manifest),
            });
        }
        // (name, base, layered base, chained, max_extent_bytes, keyed, turn state)
        for (name, b, layered_base, chained, m, keyed, ts) in [
            ("v2.2 snapshot", None, false, false, 1024, false, false),
            (
                "v2.2 snapshot keyed single extent with a turn state",
                None,
                false,
                false,
                1 << 20,
                true,
                true,
            ),
            (
                "v2.2 delta on a blake3 base",
                Some(&base),
                false,
                false,
                1024,
                false,
                false,
            ),
            (
                "v2.2 chained delta on a layered base with a turn state",
                Some(&base),
                true,
                true,
                2048,
                true,
                true,
            ),
        ] {
            let (manifest, bytes) = build_v2_2(&result, b, layered_base, chained, m, keyed, ts);
            out.push(Case {
                name: format!("{lname}: {name}"),
                version: Version::V2_2,
                keyed,
                bytes,
                decoded: DecodedRoot::V2(manifest),
            });
        }
        for (name, b, keyed) in [
            ("v1 snapshot", None, false),
            ("v1 snapshot keyed", None, true),
            ("v1 delta", Some(&base), false),
            ("v1 delta keyed", Some(&base), true),
        ] {
            let (manifest, bytes) = build_v1(&result, b, keyed);
            out.push(Case {
                name: format!("{lname}: {name}"),
                version: Version::V1,
                keyed,
                bytes,
                decoded: DecodedRoot::V1(manifest),
            });
        }
    }
    out
}

/// Validates one encoded root (envelope layout, body against its version's
/// document and against `root-body`, not against the other version, key
/// order); returns the names of the schema map rules its maps matched.
fn check_root(docs: &Docs, what: &str, bytes: &[u8], version: Version) -> Vec<String> {
    let opened = open_envelope(bytes).unwrap_or_else(|e| panic!("{what}: envelope: {e}"));
    let body = opened.body;
    if let Err(e) = validate(docs.for_version(version), body) {
        panic!("{what}: body does not match manifest-{version:?} CDDL: {e}");
    }
    if let Err(e) = validate(&docs.body, body) {
        panic!("{what}: body does not match root-body: {e}");
    }
    for other in docs.other_versions(version) {
        assert!(
            validate(other, body).is_err(),
            "{what}: a {version:?} body must not match another manifest version"
        );
    }
    check_key_order(&docs.body, body, what)
}

// ---------------------------------------------------------------------------
// Tests

#[test]
fn encoded_roots_match_the_schemas() {
    let docs = Docs::load();
    let cases = cases();
    let mut rules_seen = std::collections::BTreeSet::new();
    let (mut zstd, mut raw, mut keyed, mut unkeyed, mut deltas, mut single) = (0, 0, 0, 0, 0, 0);
    for c in &cases {
        rules_seen.extend(check_root(&docs, &c.name, &c.bytes, c.version));

        // The documented envelope: MAC trailer exactly when keyed, computed
        // as envelope.cddl says.
        let opened = open_envelope(&c.bytes).expect("envelope");
        match opened.mac {
            Some((covered, mac)) => {
                assert!(c.keyed, "{}: unexpected MAC trailer", c.name);
                let key = blake3::derive_key(MAC_CONTEXT, SECRET);
                assert_eq!(
                    blake3::keyed_hash(&key, covered).as_bytes()[..],
                    mac[..],
                    "{}: MAC is not keyed BLAKE3 over bytes 0..52+n",
                    c.name
                );
                keyed += 1;
            }
            None => {
                assert!(!c.keyed, "{}: missing MAC trailer", c.name);
                unkeyed += 1;
            }
        }

        // The code reads back exactly what it wrote.
        let key = c.keyed.then(|| root::mac_key(SECRET));
        assert_eq!(
            root::decode(&c.bytes, key.as_ref()).expect("decode"),
            c.decoded,
            "{}",
            c.name
        );

        match &c.decoded {
            DecodedRoot::V2(m) => {
                zstd += m
                    .extents
                    .iter()
                    .filter(|e| e.codec == ExtentCodec::Zstd)
                    .count();
                raw += m
                    .extents
                    .iter()
                    .filter(|e| e.codec == ExtentCodec::Raw)
                    .count();
                single += usize::from(m.extents.len() == 1);
                deltas += usize::from(m.kind == RootKind::Delta && m.base.is_some());
            }
            DecodedRoot::V1(m) => {
                deltas += usize::from(m.kind == RootKind::Delta && m.base.is_some());
            }
            DecodedRoot::Incompatible { .. } => unreachable!(),
        }
    }
    // The cases really cover what they claim to.
    assert!(zstd > 0 && raw > 0, "zstd {zstd} / raw {raw} extents");
    assert!(keyed > 0 && unkeyed > 0);
    assert!(deltas > 0 && single > 0);
    // Every map rule of the schemas describes something the code writes.
    // Rules with the same keys in the same order (v2.2's base and chain
    // rules widen v2.1's digests) are told apart by types, not keys: a map
    // matched by the first of them exercises all of them.
    let rules = schema_map_rules(&docs.body);
    let all_rules: std::collections::BTreeSet<String> =
        rules.iter().map(|(name, _)| name.clone()).collect();
    let rules_seen: std::collections::BTreeSet<String> = rules
        .iter()
        .filter(|(_, keys)| {
            rules
                .iter()
                .any(|(seen, k)| k == keys && rules_seen.contains(seen))
        })
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(
        rules_seen, all_rules,
        "every schema map rule must be exercised"
    );
    println!(
        "schema_cddl: {} encoded roots validated ({zstd} zstd / {raw} raw extents, {keyed} keyed)",
        cases.len()
    );
}

#[test]
fn fixture_roots_match_the_schemas() {
    let dir = Path::new(FIXTURE_DIR);
    if !dir.is_dir() {
        println!(
            "schema_cddl: no fixtures directory at {}; 0 fixture roots checked",
            dir.display()
        );
        return;
    }
    let mut files = Vec::new();
    collect_root_files(dir, false, &mut files);
    files.sort();
    let docs = Docs::load();
    let mut checked = 0usize;
    let mut skipped = Vec::new();
    for path in &files {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let what = path.display().to_string();
        // Fixtures that the decoder itself refuses (deliberately damaged or
        // incompatible roots) are reported, not schema-checked; every root
        // the code accepts must match the schemas.
        match root::decode(&bytes, None) {
            Ok(DecodedRoot::V1(_)) => {
                check_root(&docs, &what, &bytes, Version::V1);
                checked += 1;
            }
            Ok(DecodedRoot::V2(m)) => {
                let v = if m.layers.is_some() {
                    Version::V2_2
                } else if m.chain.is_some() {
                    Version::V2_1
                } else {
                    Version::V2
                };
                check_root(&docs, &what, &bytes, v);
                checked += 1;
            }
            Ok(DecodedRoot::Incompatible { reason }) => {
                skipped.push(format!("{what}: incompatible: {reason}"))
            }
            Err(e) => skipped.push(format!("{what}: not decodable: {e}")),
        }
    }
    println!(
        "schema_cddl: {checked} fixture root(s) under {} validated against the CDDL; {} skipped",
        dir.display(),
        skipped.len()
    );
    for s in &skipped {
        println!("schema_cddl: skipped {s}");
    }
}

/// Files anywhere below a directory named `roots` under `dir`.
fn collect_root_files(dir: &Path, in_roots: bool, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            let roots = in_roots || path.file_name().is_some_and(|n| n == "roots");
            collect_root_files(&path, roots, out);
        } else if in_roots && path.is_file() {
            out.push(path);
        }
    }
}

// Negative cases: mutations of valid bodies.

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

/// The value at a dotted path (`extents.0.raw_len`) of a CBOR value.
fn at<'a>(v: &'a mut Value, path: &str) -> &'a mut Value {
    path.split('.')
        .filter(|s| !s.is_empty())
        .fold(v, |v, step| match v {
            Value::Map(m) => m
                .get_mut(&text(step))
                .unwrap_or_else(|| panic!("no key {step} in {path}")),
            Value::Array(a) => {
                let i: usize = step.parse().expect("array index");
                &mut a[i]
            }
            other => panic!("cannot step into {other:?} at {step}"),
        })
}

fn set(path: impl Into<String>, value: Value) -> Box<dyn Fn(&mut Value)> {
    let path = path.into();
    Box::new(move |v| *at(v, &path) = value.clone())
}

fn remove(map_path: impl Into<String>, key: &'static str) -> Box<dyn Fn(&mut Value)> {
    let map_path = map_path.into();
    Box::new(move |v| match at(v, &map_path) {
        Value::Map(m) => {
            m.remove(&text(key)).expect("key to remove");
        }
        other => panic!("not a map: {other:?}"),
    })
}

fn insert(map_path: impl Into<String>, key: &'static str, value: Value) -> Box<dyn Fn(&mut Value)> {
    let map_path = map_path.into();
    Box::new(move |v| match at(v, &map_path) {
        Value::Map(m) => {
            assert!(m.insert(text(key), value.clone()).is_none());
        }
        other => panic!("not a map: {other:?}"),
    })
}

fn edit(path: impl Into<String>, f: fn(&str) -> String) -> Box<dyn Fn(&mut Value)> {
    let path = path.into();
    Box::new(move |v| {
        let slot = at(v, &path);
        let Value::Text(s) = slot else {
            panic!("{path} is not text")
        };
        *slot = Value::Text(f(s));
    })
}

fn digest_text(seed: &[u8], alg: &str) -> Value {
    let d = match alg {
        "sha256" => Digest::sha256(seed),
        _ => Digest::blake3(seed),
    };
    Value::Text(d.to_string())
}

type Mutation = (&'static str, Box<dyn Fn(&mut Value)>);

/// What the Rust decoder does with a body the schema refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decoder {
    /// It refuses it too.
    Refuses,
    /// It accepts it: serde gives an `Option` field that is absent the value
    /// `None`, so the decoder tolerates a missing nullable key that the
    /// encoder never omits (it always writes `null`). The schema describes
    /// what is written and requires the key. If the decoder starts refusing
    /// such bodies, move the case to the `Refuses` list.
    ToleratesAbsentOption,
}

/// Applies each mutation to `body` and requires that the CDDL (both the
/// version document and `root-body`) refuses it, and that the Rust decoder
/// behaves as `decoder` says.
fn assert_all_refused(
    docs: &Docs,
    version: Version,
    body: &[u8],
    decoder: Decoder,
    mutations: Vec<Mutation>,
) {
    let original: Value = serde_cbor::from_slice(body).expect("body value");
    // Control: re-encoding the unmutated value (serde_cbor::Value sorts map
    // keys) is still valid, so each failure below is due to its mutation.
    let control = serde_cbor::to_vec(&original).expect("re-encode");
    validate(docs.for_version(version), &control).expect("control body validates");
    validate(&docs.body, &control).expect("control body validates as root-body");
    assert!(matches!(
        root::decode(&seal(&control), None),
        Ok(DecodedRoot::V1(_) | DecodedRoot::V2(_))
    ));
    for (name, mutate) in mutations {
        let mut v = original.clone();
        mutate(&mut v);
        let bad = serde_cbor::to_vec(&v).expect("encode mutated body");
        let verdict = validate(docs.for_version(version), &bad);
        assert!(
            verdict.is_err(),
            "{version:?} schema accepted a body with {name}"
        );
        assert!(
            validate(&docs.body, &bad).is_err(),
            "root-body accepted a {version:?} body with {name}"
        );
        let accepted = matches!(
            root::decode(&seal(&bad), None),
            Ok(DecodedRoot::V1(_) | DecodedRoot::V2(_))
        );
        match decoder {
            Decoder::Refuses => assert!(
                !accepted,
                "the decoder accepted a {version:?} body with {name} that the schema refuses"
            ),
            Decoder::ToleratesAbsentOption => assert!(
                accepted,
                "the decoder now refuses a {version:?} body with {name}: update this test"
            ),
        }
        println!(
            "schema_cddl: schema refused {version:?} body with {name} (decoder: {decoder:?}): {}",
            verdict.err().unwrap_or_default()
        );
    }
}

#[test]
fn invalid_v2_bodies_fail_validation() {
    let docs = Docs::load();
    let layout = mixed_layout();
    let base = snapshot(layout.clone(), 128);
    let result = snapshot(layout, 256);
    let (m, bytes) = build_v2(&result, Some(&base), 1024, Some(3), false);
    let zstd = m
        .extents
        .iter()
        .position(|e| e.codec == ExtentCodec::Zstd)
        .expect("a zstd extent");
    let raw = m
        .extents
        .iter()
        .position(|e| e.codec == ExtentCodec::Raw)
        .expect("a raw extent");
    let zp = |field: &str| format!("extents.{zstd}.{field}");
    let rp = |field: &str| format!("extents.{raw}.{field}");
    let body = open_envelope(&bytes).expect("envelope").body.to_vec();

    let mutations: Vec<Mutation> = vec![
        // Wrong types.
        ("boundary as text", set("boundary", text("256"))),
        ("extent raw_len as text", set(rp("raw_len"), text("1024"))),
        (
            "namespace as bytes",
            set("namespace", Value::Bytes(vec![0; 32])),
        ),
        ("layout null", set("layout", Value::Null)),
        ("base as an integer", set("base", Value::Integer(7))),
        ("negative offset", set(zp("offset"), Value::Integer(-1))),
        (
            "logical_chunk_tokens above u32",
            set("logical_chunk_tokens", Value::Integer(1 << 32)),
        ),
        (
            "block_counts as a map",
            set("block_counts", Value::Map(Default::default())),
        ),
        (
            "tokens_per_page as text",
            set("layout.groups.0.tokens_per_page", text("16")),
        ),
        // Missing fields.
        ("no payload_digest", remove("", "payload_digest")),
        ("no extents", remove("", "extents")),
        ("no base (must be null, not absent)", remove("", "base")),
        ("base without boundary", remove("base", "boundary")),
        (
            "layer without dtype",
            remove("layout.groups.0.layers.0", "dtype"),
        ),
        // Digests and identifiers.
        (
            "uppercase payload digest",
            edit("payload_digest", |s| s.to_ascii_uppercase()),
        ),
        (
            "uppercase hex in a raw digest",
            edit(zp("raw_digest"), |s| {
                format!("blake3:{}", s["blake3:".len()..].to_ascii_uppercase())
            }),
        ),
        (
            "uppercase namespace",
            edit("namespace", |s| s.to_ascii_uppercase()),
        ),
        (
            "digest with a trailing character",
            edit("result_snapshot_digest", |s| format!("{s}0")),
        ),
        (
            "digest with a leading character",
            edit("payload_digest", |s| format!(" {s}")),
        ),
        (
            "digest one hex digit short",
            edit("payload_digest", |s| s[..s.len() - 1].to_string()),
        ),
        (
            "untagged digest",
            edit("payload_digest", |s| s[7..].to_string()),
        ),
        (
            "md5-tagged digest",
            edit("payload_digest", |s| format!("md5{}", &s[6..])),
        ),
        ("path-like context", set("context", text(&"../".repeat(21)))),
        (
            "sha256 extent raw_digest",
            set(zp("raw_digest"), digest_text(b"x", "sha256")),
        ),
        (
            "sha256 stored_digest",
            set(zp("stored_digest"), digest_text(b"x", "sha256")),
        ),
        (
            "sha256 payload digest",
            set("payload_digest", digest_text(b"x", "sha256")),
        ),
        // Closed enumerations and the schema string.
        ("codec gzip", set(zp("codec"), text("gzip"))),
        ("kind base", set("kind", text("base"))),
        (
            "group kind sliding",
            set("layout.groups.0.kind", text("sliding")),
        ),
        ("v1 schema string", set("schema", text(root::SCHEMA_V1))),
        // Unknown extra fields.
        (
            "unknown top-level field",
            insert("", "comment", text("hello")),
        ),
        (
            "unknown extent field",
            insert(zp(""), "level", Value::Integer(3)),
        ),
        (
            "unknown base field",
            insert("base", "root_digest", digest_text(b"b", "blake3")),
        ),
        (
            "unknown layer field",
            insert("layout.groups.0.layers.0", "shape", Value::Null),
        ),
        (
            "v1 chunks field",
            insert("", "chunks", Value::Array(vec![])),
        ),
        (
            "v2.1 chain hints in a v2 body",
            insert("", "chain", Value::Map(Default::default())),
        ),
    ];
    assert_all_refused(&docs, Version::V2, &body, Decoder::Refuses, mutations);

    // v2.1: the chain hints are required, typed and closed.
    let (_, v21) = build_v2_1(&result, &base, 1024, None, false);
    let v21_body = open_envelope(&v21).expect("envelope").body.to_vec();
    assert_all_refused(
        &docs,
        Version::V2_1,
        &v21_body,
        Decoder::Refuses,
        vec![
            ("no chain", remove("", "chain")),
            ("v2 schema string", set("schema", text(root::SCHEMA_V2))),
            ("kind snapshot", set("kind", text("snapshot"))),
            ("null base", set("base", Value::Null)),
            (
                "delta_header as text",
                set("chain.delta_header", text("DPDELTA")),
            ),
            (
                "ancestors as a number",
                set("chain.ancestors", Value::Integer(1)),
            ),
            ("no payload_bytes", remove("chain", "payload_bytes")),
            (
                "unknown chain field",
                insert("chain", "depth", Value::Integer(3)),
            ),
        ],
    );

    // v2.2: the layered result digest and its stream digests are required
    // and typed; a blake3 result digest or another schema string is not v2.2.
    let (_, v22) = build_v2_2(&result, Some(&base), true, true, 1024, false, true);
    let v22_body = open_envelope(&v22).expect("envelope").body.to_vec();
    assert_all_refused(
        &docs,
        Version::V2_2,
        &v22_body,
        Decoder::Refuses,
        vec![
            ("no layers", remove("", "layers")),
            ("layers as text", set("layers", text("00"))),
            (
                "a blake3 result digest",
                set("result_snapshot_digest", digest_text(b"r", "blake3")),
            ),
            ("v2.1 schema string", set("schema", text(root::SCHEMA_V2_1))),
            (
                "sha256 base digest",
                set("base.snapshot_digest", digest_text(b"b", "sha256")),
            ),
            ("unknown field", insert("", "streams", Value::Integer(3))),
            ("turn state as text", set("turn_state", text("00"))),
        ],
    );
    // The turn state is optional; its length follows from the header, which
    // only the decoder checks (its values are proven by whoever uses them).
    let mut v: Value = serde_cbor::from_slice(&v22_body).expect("value");
    let without = match &mut v {
        Value::Map(m) => {
            assert!(m.remove(&Value::Text("turn_state".into())).is_some());
            serde_cbor::to_vec(&v).expect("encode")
        }
        _ => unreachable!("a v2.2 body is a map"),
    };
    assert!(
        validate(&docs.v2_2, &without).is_ok(),
        "turn_state is optional"
    );
    assert!(root::decode(&seal(&without), None).is_ok());
    let mut v: Value = serde_cbor::from_slice(&v22_body).expect("value");
    if let Value::Bytes(b) = at(&mut v, "turn_state") {
        assert!(!b.is_empty(), "the case records chaining values");
        b.truncate(b.len() - 1);
    }
    let bad = serde_cbor::to_vec(&v).expect("encode");
    assert!(validate(&docs.v2_2, &bad).is_ok());
    assert!(
        root::decode(&seal(&bad), None).is_err(),
        "a turn state of the wrong length is refused"
    );
    // What only the decoder can check: the stream digests hash, with the
    // header, to the result digest.
    let mut v: Value = serde_cbor::from_slice(&v22_body).expect("value");
    if let Value::Bytes(b) = at(&mut v, "layers") {
        b[5] ^= 1;
    }
    let bad = serde_cbor::to_vec(&v).expect("encode");
    assert!(
        validate(&docs.v2_2, &bad).is_ok(),
        "the schema cannot see digests"
    );
    assert!(
        root::decode(&seal(&bad), None).is_err(),
        "a changed stream digest is refused"
    );
    if let Value::Bytes(b) = at(&mut v, "layers") {
        b.truncate(b.len() - 32);
    }
    let bad = serde_cbor::to_vec(&v).expect("encode");
    assert!(
        root::decode(&seal(&bad), None).is_err(),
        "a missing stream digest is refused"
    );

    // Nullable keys must be present (as null); the decoder is laxer here.
    let (_, snapshot_bytes) = build_v2(&result, None, 1024, None, false);
    let snapshot_body = open_envelope(&snapshot_bytes)
        .expect("envelope")
        .body
        .to_vec();
    assert_all_refused(
        &docs,
        Version::V2,
        &snapshot_body,
        Decoder::ToleratesAbsentOption,
        vec![
            ("no base key on a snapshot root", remove("", "base")),
            (
                "raw extent without stored_digest",
                remove("extents.0", "stored_digest"),
            ),
        ],
    );
}

#[test]
fn invalid_v1_bodies_fail_validation() {
    let docs = Docs::load();
    let layout = small_layout();
    let base = snapshot(layout.clone(), 128);
    let result = snapshot(layout, 256);
    let (_, bytes) = build_v1(&result, Some(&base), false);
    let body = open_envelope(&bytes).expect("envelope").body.to_vec();
    let mutations: Vec<Mutation> = vec![
        (
            "blake3 chunk digest",
            set("chunks.0.digest", digest_text(b"c", "blake3")),
        ),
        ("chunk bytes as text", set("chunks.1.bytes", text("10"))),
        (
            "chunk without logical_end",
            remove("chunks.0", "logical_end"),
        ),
        (
            "unknown chunk field",
            insert("chunks.0", "codec", text("raw")),
        ),
        (
            "v2 extents field",
            insert("", "extents", Value::Array(vec![])),
        ),
        ("v2 schema string", set("schema", text(root::SCHEMA_V2))),
        (
            "uppercase chunk digest",
            edit("chunks.0.digest", |s| s.to_ascii_uppercase()),
        ),
        ("no context", remove("", "context")),
    ];
    assert_all_refused(&docs, Version::V1, &body, Decoder::Refuses, mutations);
}

#[test]
fn envelope_constants_match_the_code() {
    let body_doc = Docs::load().body;
    let check = |rule: &str, value: Value| {
        let doc = format!("deltapack-check = {rule}\n{body_doc}");
        validate(&doc, &serde_cbor::to_vec(&value).expect("cbor"))
    };
    let uint = |n: u64| Value::Integer(i128::from(n));
    // The `cddl` crate 0.10 cannot match byte-string literals (it panics),
    // so the magic is compared as the text of its rule.
    let magic_rule = body_doc
        .lines()
        .find_map(|l| l.trim().strip_prefix("envelope-magic = h'"))
        .and_then(|rest| rest.split('\'').next())
        .expect("envelope-magic rule");
    assert_eq!(
        magic_rule.to_ascii_lowercase(),
        hex::encode(root::ROOT_MAGIC),
        "envelope.cddl envelope-magic disagrees with ROOT_MAGIC"
    );
    let cases = [
        ("envelope-version", uint(root::ENVELOPE_VERSION.into())),
        ("envelope-flag-keyed-mac", uint(root::FLAG_KEYED_MAC.into())),
        (
            "envelope-header-len",
            uint(root::ENVELOPE_HEADER_LEN as u64),
        ),
        ("envelope-mac-len", uint(blake3::OUT_LEN as u64)),
        ("max-root-body", uint(root::MAX_ROOT_BODY)),
        ("root-mac-context", text(root::ROOT_MAC_CONTEXT)),
    ];
    for (rule, value) in cases {
        if let Err(e) = check(rule, value.clone()) {
            panic!("envelope.cddl {rule} disagrees with the code ({value:?}): {e}");
        }
    }
    // The checks can fail.
    assert!(check("envelope-version", uint(2)).is_err());
    assert!(check("root-mac-context", text("deltapack root mac")).is_err());
    // The test's restatement of the layout agrees with the code, too.
    assert_eq!(*MAGIC, root::ROOT_MAGIC);
    assert_eq!(HEADER_LEN, root::ENVELOPE_HEADER_LEN);
    assert_eq!(MAX_BODY, root::MAX_ROOT_BODY);
    assert_eq!(MAC_CONTEXT, root::ROOT_MAC_CONTEXT);
    assert_eq!(
        root::mac_key(SECRET),
        blake3::derive_key(MAC_CONTEXT, SECRET)
    );
}

/// A chain restore decodes the roots below the requested one without their
/// lists of ancestors (a chain of N turns holds N²/2 of them).
/// `decode_without_ancestors` must give every root exactly what `decode`
/// gives, the list of ancestors emptied, and refuse what `decode` refuses
/// for any other reason: a body that fails its digest, a missing or wrong
/// MAC, an invalid field outside the list.
#[test]
fn decoding_without_ancestors_changes_nothing_but_the_list() {
    let key = root::mac_key(SECRET);
    for case in cases() {
        let mac = case.keyed.then_some(&key);
        let mut want = root::decode(&case.bytes, mac).expect("full decode");
        let lean = root::decode_without_ancestors(&case.bytes, mac).expect("lean decode");
        if let DecodedRoot::V2(m) = &mut want {
            if let Some(c) = m.chain.as_mut() {
                assert!(!c.ancestors.is_empty(), "{}: the case has hints", case.name);
                c.ancestors.clear();
            }
        }
        assert_eq!(lean, want, "{}", case.name);
        // The flag is this call's alone: a full decode afterwards on the
        // same thread decodes the list again.
        assert_eq!(
            root::decode(&case.bytes, mac).expect("full decode"),
            case.decoded,
            "{}",
            case.name
        );
        // A flipped body byte fails the envelope's digest either way.
        let mut bad = case.bytes.clone();
        bad[HEADER_LEN + 3] ^= 1;
        assert!(
            root::decode_without_ancestors(&bad, mac).is_err(),
            "{}",
            case.name
        );
        if case.keyed {
            // A keyed store refuses a root without a valid MAC either way.
            let other = root::mac_key(b"another secret");
            assert!(matches!(
                root::decode_without_ancestors(&case.bytes, Some(&other)),
                Err(deltapack_format::Error::Unauthenticated(_))
            ));
        }
    }
    // A field outside the list that fails validation fails the lean decode
    // too (the delta header the root records must match the root).
    let layout = small_layout();
    let (base, result) = (snapshot(layout.clone(), 128), snapshot(layout, 256));
    let (mut m, _) = build_v2_1(&result, &base, 1024, None, false);
    if let Some(c) = m.chain.as_mut() {
        c.payload_bytes = 0;
    }
    let mut body = Vec::new();
    serde_cbor::to_writer(&mut body, &m).expect("cbor");
    let bytes = seal(&body);
    assert!(root::decode(&bytes, None).is_err());
    assert!(root::decode_without_ancestors(&bytes, None).is_err());
}

// ---------------------------------------------------------------------------
// The ledger binding (JSON, schemas/ledger-binding.cddl)

/// Validates a JSON document against `ledger-binding.cddl`.
fn validate_binding(json: &str) -> Result<(), String> {
    let doc = schema_file("ledger-binding.cddl");
    match cddl::validate_json_from_str(&doc, json, None) {
        Ok(()) => Ok(()),
        Err(cddl::validator::json::Error::Validation(errors)) => Err(joined(&errors)),
        Err(other) => panic!("not a validation verdict (schema or JSON unreadable): {other}"),
    }
}

/// Every binding the code writes matches the schema, and the schema refuses
/// what the decoder refuses (a wrong format, generation 0, a bad id, an
/// unknown engine, an extra field).
#[test]
fn ledger_binding_matches_its_schema() {
    use deltapack_format::{LedgerBinding, LedgerId};
    for previous in [None, Some(LedgerId([0xab; 16]))] {
        let b = LedgerBinding {
            generation: 2,
            ledger_id: LedgerId([0x5c; 16]),
            engine: "sqlite".into(),
            description: "sqlite on host n1: /var/lib/deltapack/ledger.sqlite3".into(),
            bound_at_ms: 1_764_748_800_000,
            previous,
        };
        let json = String::from_utf8(b.encode().expect("encode")).expect("utf8");
        validate_binding(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
        assert_eq!(LedgerBinding::decode(json.as_bytes()).expect("decode"), b);
        let bad = [
            json.replace("binding/1", "binding/9"),
            json.replace("\"generation\":2", "\"generation\":0"),
            json.replace(&"5c".repeat(16), &"5C".repeat(16)),
            json.replace("\"sqlite\"", "\"mysql\""),
            json.replace("\"bound_at_ms\"", "\"extra\":1,\"bound_at_ms\""),
        ];
        for j in bad {
            assert!(validate_binding(&j).is_err(), "schema accepted {j}");
            assert!(
                LedgerBinding::decode(j.as_bytes()).is_err(),
                "decoder accepted {j}"
            );
        }
    }
}

/// Chain hints for a delta payload `p`: one flat ancestor below the base,
/// and `p`'s own delta header.
fn chain_hints(p: &[u8]) -> ChainHints {
    let (_, header_len) = delta::decode_header(p).expect("header");
    ChainHints {
        ancestors: vec![BaseRef {
            namespace: namespace(),
            context: context(u64::from(CHUNK_TOKENS)),
            snapshot_digest: Digest::blake3(b"the flat root below the base"),
            boundary: u64::from(CHUNK_TOKENS),
        }],
        payload_bytes: p.len() as u64 * 3,
        delta_header: p[..header_len].to_vec(),
    }
}

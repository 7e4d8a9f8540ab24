//! Hostile input: text and bytes written by someone trying to break the
//! store. The property guarded here is that such input is *refused* — with a
//! clear error at the format layer or a clean `corrupt` miss at restore —
//! before it can reach a storage key or cause a large allocation, and never
//! with a panic or wrong bytes:
//!
//! * context/namespace strings that are not exactly 64 lowercase hex
//!   characters (`../`, `/`, NUL, uppercase, 63/65 characters, multi-byte
//!   characters of the right byte length) do not parse, so no key can be built
//!   from them; junk keys planted under `roots/` are ignored by listing;
//! * forged roots (valid envelope, correct body BLAKE3 — built by hand here)
//!   whose body claims 2^40 extents, a payload of 2^62 bytes, far more
//!   extents or chunks than the payload needs, or a body length of 2^63, are
//!   refused by `root::decode` quickly and without a large allocation, and
//!   as stored roots restore as `corrupt` misses;
//! * a plausible but huge root (hundreds of GiB in a few hundred extents)
//!   restores as a `corrupt` miss without committing memory;
//! * a zstd extent that expands past its declared raw length (correct
//!   digests) is a `corrupt` miss;
//! * a root naming an object by a path-like digest string does not decode;
//! * a delta whose objects and payload digest are all correct but which
//!   rebuilds other bytes than the result its root names is a `corrupt`
//!   miss, from `restore` and from `restore_into`, and blames no object.
//!
//! Regression inputs found by the fuzz targets in `fuzz/` also belong here.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::*;
use bytes::Bytes;
use deltapack_format::extent::ExtentCodec;
use deltapack_format::layout::{GroupKind, LayerSpec, PageGroup, PageLayout};
use deltapack_format::root::{self, ChunkEntryV1, ExtentEntry, ManifestV1, ManifestV2, RootKind};
use deltapack_format::{
    CacheIdentity, ContextDigest, DecodedRoot, Digest, ExtentPlan, Namespace, Snapshot,
    SnapshotHeader, SCHEMA_V1, SCHEMA_V2,
};
use deltapack_store::{
    keys, MissReason, RestoreIntoOutcome, RestoreOutcome, RootFormat, StoreConfig,
};
use object_store::{ObjectStoreExt, PutPayload};
use serde_cbor::Value;

/// Peak-RSS growth allowed while refusing one hostile input.
const ALLOWED_RSS_GROWTH: u64 = 256 << 20;
/// Time allowed to refuse one hostile root (generous for a loaded CI box).
const ALLOWED_TIME: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------- helpers

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

fn int(n: u64) -> Value {
    Value::Integer(i128::from(n))
}

/// A CBOR map value from `(key, value)` pairs.
fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (text(k), v)).collect())
}

fn cbor(v: &Value) -> Vec<u8> {
    serde_cbor::to_vec(v).expect("cbor")
}

fn set(v: &mut Value, key: &str, new: Value) {
    let Value::Map(m) = v else {
        panic!("not a map")
    };
    m.insert(text(key), new);
}

fn field<'a>(v: &'a mut Value, key: &str) -> &'a mut Value {
    let Value::Map(m) = v else {
        panic!("not a map")
    };
    m.get_mut(&text(key)).expect("field")
}

/// A tiny layout: one full group (16 tokens/page) with one layer of
/// `bytes_per_page` bytes per page per layer, `layers` layers.
fn layout(layers: usize, bytes_per_page: u64) -> PageLayout {
    PageLayout {
        groups: vec![PageGroup {
            kind: GroupKind::Full,
            tokens_per_page: 16,
            layers: (0..layers)
                .map(|i| LayerSpec {
                    name: format!("kv{i}"),
                    dtype: "bf16".into(),
                    bytes_per_page,
                })
                .collect(),
        }],
    }
}

/// A small real snapshot (one page group, 256 tokens).
fn small_snapshot() -> Snapshot {
    let h = SnapshotHeader::new(layout(1, 8), 256);
    let n = h.validate().expect("len") as usize;
    let payload: Vec<u8> = (0..n).map(|i| (i * 13 + 7) as u8).collect();
    Snapshot::from_parts(h, &payload).expect("snapshot")
}

struct Target {
    t: TestStore,
    id: CacheIdentity,
    ns: Namespace,
    ctx: ContextDigest,
}

fn target(name: &str) -> Target {
    target_with(name, config())
}

/// [`target`], [`small_snapshot`] and a valid v2 manifest of it under the
/// target's keys ([`v2_manifest`]).
fn small_target(name: &str) -> (Target, Snapshot, ManifestV2) {
    let tg = target(name);
    let snap = small_snapshot();
    let m = v2_manifest(&tg, &snap);
    (tg, snap, m)
}

/// [`target`] on a memory store with `config`.
fn target_with(name: &str, config: StoreConfig) -> Target {
    let id = identity(name);
    let ns = id.namespace();
    let ctx = ctx(&id, 1, 256);
    Target {
        t: memory(config),
        id,
        ns,
        ctx,
    }
}

impl Target {
    async fn put(&self, key: &object_store::path::Path, bytes: Vec<u8>) {
        self.t
            .store
            .object_store()
            .put(key, PutPayload::from_bytes(Bytes::from(bytes)))
            .await
            .expect("put");
    }

    async fn put_root(&self, bytes: Vec<u8>) {
        self.put(&keys::root_key(&self.ns, &self.ctx), bytes).await;
    }

    /// [`Target::expect_corrupt`], and the peak RSS grows by less than
    /// [`ALLOWED_RSS_GROWTH`] meanwhile.
    async fn expect_corrupt_in_bounded_memory(&self, case: &str) {
        reset_peak_rss();
        let before = peak_rss();
        self.expect_corrupt(case).await;
        let grew = peak_rss().saturating_sub(before);
        assert!(
            grew < ALLOWED_RSS_GROWTH,
            "{case}: peak RSS grew by {} MiB",
            grew >> 20
        );
    }

    /// Restores and insists on a `corrupt` miss (never an error or a hit).
    async fn expect_corrupt(&self, case: &str) -> String {
        let t0 = Instant::now();
        let out = self
            .t
            .store
            .restore((&self.id, self.ctx), Default::default())
            .await;
        let took = t0.elapsed();
        // Moves to quarantine are queued off the read path: wait for them.
        self.t.store.settle_quarantines().await;
        let what = match out {
            Ok(RestoreOutcome::Miss(MissReason::Corrupt { what, .. })) => what,
            Ok(RestoreOutcome::Miss(other)) => panic!("{case}: expected corrupt, got miss {other}"),
            Ok(RestoreOutcome::Hit(_)) => panic!("{case}: a hostile root restored as a hit"),
            Err(e) => panic!("{case}: restore returned an error instead of a miss: {e}"),
        };
        assert!(took < ALLOWED_TIME, "{case}: refusing took {took:?}");
        what
    }
}

/// What a flat root of `snap` under the target's keys says of its result.
fn flat_meta(tg: &Target, snap: &Snapshot) -> root::RootMeta {
    root::RootMeta {
        namespace: tg.ns,
        context: tg.ctx,
        chunk_tokens: 256,
        result_header: snap.header().clone(),
        result_snapshot_digest: snap.digest(),
        result_snapshot_len: snap.encoded().len() as u64,
        base: None,
    }
}

/// A valid v2 snapshot manifest for `snap` under the target's keys.
fn v2_manifest(tg: &Target, snap: &Snapshot) -> ManifestV2 {
    let x = root::v2_extents(snap.encoded(), TEST_EXTENT, None).expect("extents");
    ManifestV2::new(
        &flat_meta(tg, snap),
        snap.encoded().len() as u64,
        x.payload_digest,
        TEST_EXTENT,
        x.entries,
    )
    .expect("manifest")
}

fn to_value<T: serde::Serialize>(x: &T) -> Value {
    serde_cbor::value::to_value(x).expect("to value")
}

/// Peak resident set size of this process (VmHWM), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Resets the peak-RSS mark (Linux ≥ 4.0); returns whether it worked.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Peak RSS is process-wide, so a test that measures it runs alone in a
/// child process: `alone!("test_name")` returns at once in the parent.
macro_rules! alone {
    ($test:literal) => {
        if !common::in_own_process(concat!("hostile_input::", $test)) {
            return;
        }
    };
}

/// Runs `f` and asserts it neither took long nor raised the peak RSS by more
/// than [`ALLOWED_RSS_GROWTH`]. The tests that call it run alone in a
/// child process ([`common::in_own_process`]): the peak RSS is the whole
/// process's, and the other tests of this binary allocate far more.
fn bounded<T>(case: &str, f: impl FnOnce() -> T) -> T {
    reset_peak_rss();
    let before = peak_rss();
    let t0 = Instant::now();
    let out = f();
    let took = t0.elapsed();
    let grew = peak_rss().saturating_sub(before);
    assert!(took < ALLOWED_TIME, "{case}: took {took:?}");
    assert!(
        grew < ALLOWED_RSS_GROWTH,
        "{case}: peak RSS grew by {} MiB",
        grew >> 20
    );
    out
}

// ------------------------------------------------- context/namespace strings

fn hostile_id_strings() -> Vec<(String, &'static str)> {
    let good = "0123456789abcdef".repeat(4);
    let mut nul = good.clone();
    nul.replace_range(10..11, "\0");
    let mut slash = good.clone();
    slash.replace_range(2..3, "/");
    let mut dots = good.clone();
    dots.replace_range(0..3, "../");
    vec![
        ("../".into(), "parent dir"),
        ("/".into(), "slash"),
        ("".into(), "empty"),
        ("../../../../etc/passwd".into(), "traversal"),
        (format!("../{}", &good[3..]), "64 chars starting with ../"),
        (dots, "64 chars with ../ in place"),
        (slash, "64 chars with a slash"),
        (nul, "64 chars with a NUL"),
        (good.to_uppercase(), "uppercase"),
        (good[..63].into(), "63 chars"),
        (format!("{good}0"), "65 chars"),
        (format!(" {}", &good[1..]), "leading space"),
        (format!("{}\n", &good[..63]), "trailing newline"),
        (format!("0x{}", &good[2..]), "0x prefix"),
        ("é".repeat(32), "64 bytes of multi-byte characters"),
        (format!("{}g", &good[..63]), "non-hex letter"),
        (
            format!("blake3:{good}"),
            "digest text where a bare id is expected",
        ),
    ]
}

#[test]
fn path_like_ids_do_not_parse() {
    let good = "0123456789abcdef".repeat(4);
    assert!(good.parse::<ContextDigest>().is_ok());
    assert!(good.parse::<Namespace>().is_ok());
    for (s, what) in hostile_id_strings() {
        assert!(
            s.parse::<ContextDigest>().is_err(),
            "context {what} ({s:?}) parsed"
        );
        assert!(
            s.parse::<Namespace>().is_err(),
            "namespace {what} ({s:?}) parsed"
        );
        // Digest text with the same tail is refused too.
        for alg in ["blake3", "sha256"] {
            assert!(
                format!("{alg}:{s}").parse::<Digest>().is_err(),
                "digest {alg}:{what} parsed"
            );
        }
        // A key built from these strings is not recognised as a root key.
        let key = object_store::path::Path::from(format!("roots/{good}/{s}"));
        assert_eq!(keys::parse_root_key(&key), None, "root key with {what}");
    }
    // Keys can only be built from typed ids: hex only, fixed shape.
    let k = keys::root_key(&Namespace([0xab; 32]), &ContextDigest([0xcd; 32]));
    assert_eq!(
        k.as_ref(),
        format!("roots/{}/{}", "ab".repeat(32), "cd".repeat(32))
    );
}

#[tokio::test]
async fn junk_under_roots_is_ignored_by_listing() {
    let (tg, _, m) = small_target("hostile-junk-keys");
    let good_root = root::encode_v2(&m, None).expect("encode");
    let ns_hex = tg.ns.hex();
    for (s, _) in hostile_id_strings() {
        // object_store paths cannot hold every string (empty segments, `..`
        // and some control characters are rejected or encoded); plant the
        // ones it accepts.
        if let Ok(p) = object_store::path::Path::parse(format!("roots/{ns_hex}/{s}")) {
            tg.put(&p, good_root.clone()).await;
        }
    }
    tg.put(
        &object_store::path::Path::from(format!("roots/{ns_hex}/{}/extra", tg.ctx.hex())),
        good_root.clone(),
    )
    .await;
    let listed = tg.t.store.list_roots(None).await.expect("list");
    assert!(listed.is_empty(), "junk keys listed as roots: {listed:?}");
    assert!(tg.t.store.inspect(None).await.expect("inspect").is_empty());
    // The real key still works.
    tg.put_root(good_root).await;
    let one = tg.t.store.list_roots(None).await.expect("list");
    assert_eq!(one, vec![(tg.ns, tg.ctx)]);
}

// ------------------------------------------------------------ forged roots

#[test]
fn envelope_length_fields_are_bounded_before_use() {
    alone!("envelope_length_fields_are_bounded_before_use");
    let body = b"\xa0".to_vec(); // an empty CBOR map
    for claimed in [1u64 << 63, u64::MAX, (16 << 20) + 1, 1 << 40] {
        let mut r = forge(&body);
        r[12..20].copy_from_slice(&claimed.to_le_bytes());
        let out = bounded("huge body_len", || root::decode(&r, None));
        assert!(
            matches!(out, Err(deltapack_format::Error::Bounds(_))),
            "body_len {claimed}: {out:?}"
        );
    }
    // A body_len within the limit but beyond the bytes present.
    let mut r = forge(&body);
    r[12..20].copy_from_slice(&(16u64 << 20).to_le_bytes());
    assert!(root::decode(&r, None).is_err());
    // With the MAC flag the trailer must be present too.
    let mut r = forge(&body);
    r[10] = 1;
    assert!(root::decode(&r, None).is_err());
}

/// A v2 body (hand-written CBOR) whose `extents` array header claims `n`
/// elements but carries only one.
fn body_claiming_extents(tg: &Target, n: u64) -> Vec<u8> {
    let snap = small_snapshot();
    let mut v = to_value(&v2_manifest(tg, &snap));
    let one = field(&mut v, "extents").clone();
    let Value::Map(m) = &mut v else { panic!() };
    m.remove(&text("extents"));
    let len = m.len();
    let mut out = cbor(&v);
    assert!(len + 1 < 24, "short map header");
    out[0] = 0xa0 + (len as u8 + 1); // map header now counts `extents`
    out.extend_from_slice(&cbor(&text("extents")));
    out.push(0x9b); // array, 8-byte length follows
    out.extend_from_slice(&n.to_be_bytes());
    if let Value::Array(items) = one {
        out.extend_from_slice(&cbor(&items[0]));
    }
    out
}

#[tokio::test]
async fn root_claiming_2_pow_40_extents_is_refused() {
    alone!("root_claiming_2_pow_40_extents_is_refused");
    let tg = target("hostile-2p40-extents");
    for n in [1u64 << 40, 1 << 62, u64::MAX] {
        let r = forge(&body_claiming_extents(&tg, n));
        let out = bounded("2^40 extents", || root::decode(&r, None));
        assert!(out.is_err(), "{n} extents decoded: {out:?}");
    }
    tg.put_root(forge(&body_claiming_extents(&tg, 1 << 40)))
        .await;
    let what = tg.expect_corrupt("2^40 extents").await;
    assert!(what.contains("root"), "{what}");
    assert!(tg.t.store.stats().quarantined >= 1);
}

#[tokio::test]
async fn root_claiming_2_pow_62_payload_is_refused() {
    alone!("root_claiming_2_pow_62_payload_is_refused");
    let (tg, _, m) = small_target("hostile-2p62-payload");

    // v2 snapshot root: payload_len must equal the result; v2 delta-shaped
    // body: 2^62 bytes need 2^32 extents of 1 GiB, over the limit.
    let mut flat = to_value(&m);
    set(&mut flat, "payload_len", int(1 << 62));
    let mut as_delta = flat.clone();
    set(&mut as_delta, "kind", text("delta"));
    set(
        &mut as_delta,
        "base",
        map(vec![
            ("namespace", text(&tg.ns.hex())),
            ("context", text(&"ab".repeat(32))),
            (
                "snapshot_digest",
                text(&Digest::blake3(b"base").to_string()),
            ),
            ("boundary", int(0)),
        ]),
    );
    let mut big_m = as_delta.clone();
    set(&mut big_m, "max_extent_bytes", int(1 << 30));
    for (case, body) in [
        ("flat", &flat),
        ("delta", &as_delta),
        ("delta, 1 GiB extents", &big_m),
    ] {
        let r = forge(&cbor(body));
        let out = bounded(case, || root::decode(&r, None));
        assert!(out.is_err(), "{case}: 2^62 payload decoded: {out:?}");
    }

    // v1 can describe 2^62 consistently (2 chunks of 2^61 bytes over a
    // layout of 2^32 pages of 1 GiB): decode may accept it, restore must not
    // allocate it — the store's restore limit turns it into a corrupt miss.
    let v1 = phantom_v1(
        &tg,
        layout(1, 1 << 30),
        1 << 36, // 2^32 pages of 16 tokens
        1 << 31,
        Digest::blake3(b"not the real snapshot"),
    );
    assert!(v1.result_snapshot_len > 1 << 61);
    let r = forge(&serde_cbor::to_vec(&v1).expect("cbor"));
    let _ = bounded("v1 2^62 decode", || root::decode(&r, None));
    tg.put_root(r).await;
    let what = tg.expect_corrupt("v1 2^62 payload").await;
    assert!(what.contains("limit"), "{what}");
}

#[tokio::test]
async fn extent_and_chunk_counts_beyond_the_payload_are_refused() {
    alone!("extent_and_chunk_counts_beyond_the_payload_are_refused");
    let (tg, snap, m) = small_target("hostile-counts");
    assert_eq!(m.extents.len(), 1);

    // v2: 1000 copies of the one extent the payload needs.
    let mut v = to_value(&m);
    let Value::Array(items) = field(&mut v, "extents").clone() else {
        panic!()
    };
    set(
        &mut v,
        "extents",
        Value::Array(vec![items[0].clone(); 1000]),
    );
    let r = forge(&cbor(&v));
    assert!(bounded("1000 extents", || root::decode(&r, None)).is_err());
    // v2: extents past the end of the payload (offsets beyond payload_len).
    let mut v = to_value(&m);
    let mut far = items[0].clone();
    set(&mut far, "offset", int(1 << 40));
    set(&mut v, "extents", Value::Array(vec![items[0].clone(), far]));
    let r2 = forge(&cbor(&v));
    assert!(root::decode(&r2, None).is_err());

    // v1: far more chunks than boundary / chunk_tokens.
    let x = root::v1_chunks(snap.encoded(), 256, 256).expect("chunks");
    let v1 = ManifestV1::new(
        &flat_meta(&tg, &snap),
        snap.encoded().len() as u64,
        snap.digest(),
        x.clone(),
    )
    .expect("v1");
    let mut v = to_value(&v1);
    set(&mut v, "chunks", Value::Array(vec![to_value(&x[0]); 5000]));
    let r3 = forge(&cbor(&v));
    assert!(bounded("5000 chunks", || root::decode(&r3, None)).is_err());

    for (case, bytes) in [("extents", r), ("offsets", r2), ("chunks", r3)] {
        tg.put_root(bytes).await;
        tg.expect_corrupt(case).await;
    }
}

#[tokio::test]
async fn plausible_huge_v2_root_is_a_miss_without_committing_memory() {
    // 200 GiB in 200 extents of 1 GiB: internally consistent (the extent
    // names merge to the payload digest), within the default restore limit,
    // but no object exists. Restore must not commit the memory it declares.
    let tg = target_with("hostile-plausible-v2", Default::default());
    let lay = layout(200, 1 << 30);
    let hdr = SnapshotHeader::new(lay, 16); // one 1 GiB page per layer
    let len = hdr.encoded_len().expect("len");
    let m_bytes = 1u64 << 30;
    let plan = ExtentPlan::new(len, m_bytes).expect("plan");
    let names: Vec<Digest> = (0..plan.count())
        .map(|i| Digest::blake3(&i.to_le_bytes()))
        .collect();
    let payload_digest = plan.merge(&names).expect("merge");
    let extents = (0..plan.count())
        .map(|i| {
            let r = plan.range(i);
            ExtentEntry {
                offset: r.start,
                raw_len: r.end - r.start,
                raw_digest: names[i as usize],
                codec: ExtentCodec::Raw,
                stored_len: r.end - r.start,
                stored_digest: None,
            }
        })
        .collect();
    let m = ManifestV2 {
        schema: SCHEMA_V2.into(),
        namespace: tg.ns,
        context: tg.ctx,
        kind: RootKind::Snapshot,
        boundary: 16,
        logical_chunk_tokens: 16,
        layout: hdr.layout.clone(),
        block_counts: hdr.block_counts.clone(),
        result_snapshot_digest: payload_digest,
        result_snapshot_len: len,
        base: None,
        payload_len: len,
        payload_digest,
        max_extent_bytes: m_bytes,
        extents,
        chain: None,
        layers: None,
        turn_state: None,
    };
    m.validate()
        .expect("the forged manifest is internally consistent");
    assert!(len > 200 << 30 && len < tg.t.store.config().restore.max_restore_bytes);
    let r = root::encode_v2(&m, None).expect("encode");
    assert!(matches!(root::decode(&r, None), Ok(DecodedRoot::V2(_))));
    tg.put_root(r).await;
    tg.expect_corrupt_in_bounded_memory("200 GiB v2 root").await;
}

/// A v1 snapshot manifest under the target's keys of `lay` at `boundary`
/// tokens, in chunks of `ct` tokens none of which exists; `fake` stands for
/// its snapshot and payload digests.
fn phantom_v1(tg: &Target, lay: PageLayout, boundary: u64, ct: u32, fake: Digest) -> ManifestV1 {
    let hdr = SnapshotHeader::new(lay.clone(), boundary);
    let len = hdr.encoded_len().expect("len");
    let ct64 = u64::from(ct);
    let chunks = root::v1_chunk_ranges(len, boundary / ct64)
        .into_iter()
        .enumerate()
        .map(|(i, r)| ChunkEntryV1 {
            digest: Digest::sha256(&i.to_le_bytes()),
            bytes: r.end - r.start,
            logical_start: i as u64 * ct64,
            logical_end: (i as u64 + 1) * ct64,
        })
        .collect();
    ManifestV1 {
        schema: SCHEMA_V1.into(),
        namespace: tg.ns,
        context: tg.ctx,
        kind: RootKind::Snapshot,
        boundary,
        logical_chunk_tokens: ct,
        layout: lay,
        block_counts: hdr.block_counts.clone(),
        result_snapshot_digest: fake,
        result_snapshot_len: len,
        base: None,
        payload_len: len,
        payload_digest: fake,
        chunks,
    }
}

/// A v1 snapshot root declaring `layers` GiB of payload in 2 chunks, none of
/// which exists.
fn huge_v1_root(tg: &Target, layers: usize) -> Vec<u8> {
    // 2 pages of 512 MiB per layer, in chunks of one page.
    let lay = layout(layers, 1 << 29);
    let v1 = phantom_v1(tg, lay, 32, 16, Digest::blake3(b"never written"));
    v1.validate().expect("consistent");
    root::encode_v1(&v1, None).expect("encode")
}

#[tokio::test]
async fn plausible_large_v1_root_is_a_miss_without_committing_memory() {
    // 1 GiB declared, no chunk exists: the restore should find the first
    // chunk missing without committing 1 GiB of RAM first.
    let tg = target_with("hostile-plausible-v1", Default::default());
    tg.put_root(huge_v1_root(&tg, 1)).await;
    // (A v1 root whose chunks do not exist.)
    tg.expect_corrupt_in_bounded_memory("1 GiB v1 root").await;
}

#[tokio::test]
async fn unallocatable_v1_root_is_a_miss_not_an_error() {
    // 200 GiB declared (below the default 256 GiB restore limit): the
    // allocation fails on any ordinary machine; that must be a miss.
    let tg = target_with("hostile-unallocatable-v1", Default::default());
    tg.put_root(huge_v1_root(&tg, 200)).await;
    tg.expect_corrupt("200 GiB v1 root").await;
}

#[tokio::test]
async fn zstd_extent_expanding_past_raw_len_is_corrupt() {
    alone!("zstd_extent_expanding_past_raw_len_is_corrupt");
    let tg = target("hostile-zstd-bomb");
    let snap = small_snapshot();
    let raw = snap.encoded();
    assert!((raw.len() as u64) < TEST_EXTENT, "single extent");
    // Stored bytes decompress to the raw extent followed by 64 KiB more.
    let mut longer = raw.to_vec();
    longer.extend(std::iter::repeat_n(0u8, 64 << 10));
    let mut shorter = raw.to_vec();
    shorter.truncate(raw.len() - 1);
    for (case, content) in [
        ("expands past raw_len", longer),
        ("short of raw_len", shorter),
    ] {
        let stored = deltapack_format::extent::compress(&content, 3).expect("zstd");
        let stored_digest = Digest::blake3(&stored);
        let entry = ExtentEntry {
            offset: 0,
            raw_len: raw.len() as u64,
            raw_digest: snap.digest(), // single extent: plain BLAKE3
            codec: ExtentCodec::Zstd,
            stored_len: stored.len() as u64,
            stored_digest: Some(stored_digest),
        };
        let m = ManifestV2 {
            extents: vec![entry],
            ..v2_manifest(&tg, &snap)
        };
        // Correct digests everywhere: the root itself is valid.
        let r = root::encode_v2(&m, None).expect("encode");
        assert!(matches!(root::decode(&r, None), Ok(DecodedRoot::V2(_))));
        tg.put(&keys::object_key(&stored_digest), stored).await;
        tg.put_root(r).await;
        let what = tg.expect_corrupt(case).await;
        assert!(
            what.contains("zstd") || what.contains("decode"),
            "{case}: {what}"
        );
        // The object was quarantined, not served.
        assert!(tg
            .t
            .store
            .object_store()
            .head(&keys::quarantine_key(&keys::object_key(&stored_digest)))
            .await
            .is_ok());
    }
    // The format-level decoder refuses it directly as well.
    let mut longer = snap.encoded().to_vec();
    longer.extend(std::iter::repeat_n(0u8, 1 << 20));
    let stored = deltapack_format::extent::compress(&longer, 3).expect("zstd");
    let out = bounded("decompress bomb", || {
        deltapack_format::extent::decompress(&stored, snap.encoded().len() as u64)
    });
    assert!(out.is_err());
}

#[tokio::test]
async fn path_like_digest_strings_in_a_root_do_not_decode() {
    let (tg, snap, m) = small_target("hostile-path-digests");
    let hex = "0123456789abcdef".repeat(4);
    let path_like = [
        "blake3:../../../../etc/passwd".to_string(),
        format!("blake3:../{}", &hex[3..]),
        format!("blake3:{}/{}", &hex[..31], &hex[32..]),
        format!("blake3:{}", hex.to_uppercase()),
        format!("blake3:{}\0", &hex[..63]),
        format!("../objects/blake3/{hex}"),
        "objects/blake3/01/0123".to_string(),
        format!("md5:{hex}"),
        format!("blake3:{hex}/../../x"),
        String::new(),
    ];
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for bad in &path_like {
        // The raw name of an extent.
        let mut v = to_value(&m);
        if let Value::Array(items) = field(&mut v, "extents") {
            set(&mut items[0], "raw_digest", text(bad));
        }
        cases.push((format!("raw_digest {bad:?}"), cbor(&v)));
        // A stored digest (zstd extent).
        let mut v = to_value(&m);
        if let Value::Array(items) = field(&mut v, "extents") {
            set(&mut items[0], "codec", text("zstd"));
            set(&mut items[0], "stored_digest", text(bad));
        }
        cases.push((format!("stored_digest {bad:?}"), cbor(&v)));
        // The namespace and context the root names.
        for f in ["namespace", "context"] {
            let mut v = to_value(&m);
            set(&mut v, f, text(bad.trim_start_matches("blake3:")));
            cases.push((format!("{f} {bad:?}"), cbor(&v)));
        }
    }
    // v1 chunk digests.
    let x = root::v1_chunks(snap.encoded(), 256, 256).expect("chunks");
    let mut v1 = to_value(&ManifestV1 {
        schema: SCHEMA_V1.into(),
        namespace: tg.ns,
        context: tg.ctx,
        kind: RootKind::Snapshot,
        boundary: 256,
        logical_chunk_tokens: 256,
        layout: snap.layout().clone(),
        block_counts: snap.block_counts().to_vec(),
        result_snapshot_digest: snap.digest(),
        result_snapshot_len: snap.encoded().len() as u64,
        base: None,
        payload_len: snap.encoded().len() as u64,
        payload_digest: snap.digest(),
        chunks: x,
    });
    if let Value::Array(items) = field(&mut v1, "chunks") {
        set(
            &mut items[0],
            "digest",
            text("sha256:../../../../../../../../../../../../../../../../../../../etc/x"),
        );
    }
    cases.push(("v1 chunk digest".into(), cbor(&v1)));
    // An object key as a whole instead of a digest, as a byte string.
    let mut v = to_value(&m);
    if let Value::Array(items) = field(&mut v, "extents") {
        set(
            &mut items[0],
            "raw_digest",
            Value::Bytes(b"../../objects/blake3/00/00".to_vec()),
        );
    }
    cases.push(("digest as bytes".into(), cbor(&v)));

    for (case, body) in &cases {
        let r = forge(body);
        match root::decode(&r, None) {
            Err(e) => assert!(!e.to_string().is_empty()),
            Ok(d) => panic!("{case}: decoded {d:?}"),
        }
    }
    // Stored, each is a corrupt miss and nothing outside the layout is read.
    for (case, body) in cases.iter().take(6) {
        tg.put_root(forge(body)).await;
        tg.expect_corrupt(case).await;
    }
    let mut listed: Vec<String> = Vec::new();
    let mut s = tg.t.store.object_store().list(None);
    use futures::StreamExt;
    while let Some(m) = s.next().await {
        listed.push(m.expect("meta").location.to_string());
    }
    assert!(
        listed.iter().all(|k| k.starts_with("quarantine/roots/")),
        "{listed:?}"
    );
}

#[test]
fn unknown_fields_and_wrong_types_in_a_body_do_not_decode() {
    let (_, _, m) = small_target("hostile-shapes");
    let good = to_value(&m);
    let mut cases: Vec<(&str, Value)> = Vec::new();
    let mut v = good.clone();
    set(&mut v, "objects_outside", text("../../x"));
    cases.push(("unknown field", v));
    let mut v = good.clone();
    set(&mut v, "payload_len", Value::Integer(-1));
    cases.push(("negative length", v));
    let mut v = good.clone();
    set(&mut v, "payload_len", text("1180591620717411303424"));
    cases.push(("length as a decimal string", v));
    let mut v = good.clone();
    set(&mut v, "extents", map(vec![("0", text("x"))]));
    cases.push(("extents as a map", v));
    let mut v = good.clone();
    set(&mut v, "boundary", Value::Float(256.0));
    cases.push(("float boundary", v));
    let mut v = good.clone();
    set(&mut v, "max_extent_bytes", int(3000));
    cases.push(("extent size not a power of two", v));
    let mut v = good;
    let Value::Map(mm) = &mut v else { panic!() };
    let n: BTreeMap<Value, Value> = std::mem::take(mm);
    *mm = n
        .into_iter()
        .filter(|(k, _)| *k != text("layout"))
        .collect();
    cases.push(("missing layout", v));
    for (case, v) in cases {
        let r = forge(&cbor(&v));
        assert!(root::decode(&r, None).is_err(), "{case} decoded");
    }
    // The unmodified body decodes, so the cases above fail for their reason.
    let r = forge(&cbor(&to_value(&m)));
    assert!(matches!(root::decode(&r, None), Ok(DecodedRoot::V2(_))));
}

#[tokio::test]
async fn oversized_root_object_is_a_corrupt_miss() {
    let tg = target("hostile-oversized-root");
    let mut junk = forge(b"\xa0");
    junk.resize((17 << 20) as usize, 0x41);
    tg.put_root(junk).await;
    let what = tg.expect_corrupt("17 MiB root").await;
    assert!(what.contains("limit") || what.contains("bytes"), "{what}");
}

/// A self-consistent delta (every extent name and the payload digest are
/// right) that rebuilds other bytes than its root and header name — a
/// publisher bug, or a forger holding the MAC key. Only the final check of
/// the rebuilt result can catch it; it must, on every path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_rebuilding_other_bytes_than_its_result_is_corrupt() {
    for t in [memory(config()), local(config())] {
        let s = &t.store;
        let id = identity("wrong-rebuild");
        let ns = id.namespace();
        let (a, b) = (turn(5, 1024), turn(5, 4096));
        let (ca, cb) = (ctx(&id, 5, 1024), ctx(&id, 5, 4096));
        publish_base(s, &id, ca, a.clone(), RootFormat::V2).await;
        // The honest delta with one tail byte changed, named correctly.
        let (da, db) = (
            deltapack_format::layer_digest::of_snapshot(&a).expect("digest"),
            deltapack_format::layer_digest::of_snapshot(&b).expect("digest"),
        );
        let mut payload =
            deltapack_format::delta::encode_with_digests(256, &a, &b, da.snapshot, db.snapshot)
                .expect("encode");
        let last = payload.len() - 1;
        payload[last] ^= 0x5a;
        let x = root::v2_extents(&payload, TEST_EXTENT, None).expect("extents");
        assert!(x.entries.len() > 2, "several extents");
        for e in &x.entries {
            let r = e.offset as usize..(e.offset + e.raw_len) as usize;
            s.object_store()
                .put(
                    &keys::object_key(&e.raw_digest),
                    PutPayload::from(payload[r].to_vec()),
                )
                .await
                .expect("put extent");
        }
        let meta = root::RootMeta {
            namespace: ns,
            context: cb,
            chunk_tokens: 256,
            result_header: b.header().clone(),
            result_snapshot_digest: db.snapshot,
            result_snapshot_len: b.encoded().len() as u64,
            base: Some(deltapack_format::BaseRef {
                namespace: ns,
                context: ca,
                snapshot_digest: da.snapshot,
                boundary: a.boundary(),
            }),
        };
        let m = ManifestV2::new_layered(
            &meta,
            &db.streams,
            payload.len() as u64,
            x.payload_digest,
            TEST_EXTENT,
            x.entries,
        )
        .expect("manifest");
        s.object_store()
            .put(
                &keys::root_key(&ns, &cb),
                PutPayload::from(root::encode_v2(&m, None).expect("encode")),
            )
            .await
            .expect("put root");

        match s
            .restore((&id, cb), Default::default())
            .await
            .expect("restore")
        {
            RestoreOutcome::Miss(MissReason::Corrupt { what, .. }) => {
                assert!(what.contains("reconstructed result"), "{what}")
            }
            other => panic!("expected a corrupt miss, got {other:?}"),
        }
        let mut buf = vec![0u8; b.encoded().len()];
        match s
            .restore_into((&id, cb), &mut buf, Default::default())
            .await
            .expect("restore_into")
        {
            RestoreIntoOutcome::Miss {
                reason: MissReason::Corrupt { what, .. },
            } => assert!(what.contains("reconstructed result"), "{what}"),
            other => panic!("expected a corrupt miss, got {other:?}"),
        }
        assert_eq!(
            s.stats().quarantined,
            0,
            "every object is what its name says: none is blamed"
        );
    }
}

//! Backward compatibility: every stored format ever released stays readable
//! (SPEC §4.7). The frozen stores under `fixtures/` were written once by this
//! code and must never be regenerated; this file proves that the current code
//! still decodes every root in them, re-encodes each byte-identically, and
//! restores every context to the recorded snapshot digest — and that the
//! fixture files themselves have not changed (their digests are pinned here).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::*;
use deltapack_format::{
    root, CacheIdentity, ContextDigest, DecodedRoot, Digest, Namespace, Snapshot,
};
use deltapack_store::{RestoreOutcome, RootFormat, Store, StoreConfig};
use serde::{Deserialize, Serialize};

/// Every released fixture set with the BLAKE3 over the sorted `(relative
/// path, BLAKE3 of contents)` list of its files. Frozen: a failure means a
/// fixture changed. A new format adds a set here (written once by
/// `write_fixture_set`), never edits one.
const SETS: &[(&str, &str)] = &[
    (
        "2026-11-v1v2",
        "3bd85ebe1ba5e71529fd4b411874ec238c569e1ec19e18781ce34832f21eb855",
    ),
    (
        "2026-12-v2.1-chain",
        "3a80cb87c58a11b5a93e3998784fa31859fda7a77f262fb06bf48883f4ec3275",
    ),
    (
        "2026-12-v2.2-layers",
        "270fca597533cc356e4ffccdddecdd047e75f6394916d6f8f6ed80494ef5855d",
    ),
];
/// The set `write_fixture_set` writes (the newest).
const NEWEST: &str = "2026-12-v2.2-layers";
const FIXTURE_SECRET: &[u8] = b"deltapack-fixture-secret-2026-11";

#[derive(Debug, Serialize, Deserialize)]
struct Expected {
    description: String,
    max_extent_bytes: u64,
    roots: Vec<ExpectedRoot>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ExpectedRoot {
    label: String,
    identity_file: String,
    namespace: Namespace,
    context: ContextDigest,
    schema: String,
    keyed: bool,
    snapshot_file: String,
    snapshot_digest: Digest,
}

fn set_dir(set: &str) -> PathBuf {
    crate::common::repo_root().join("fixtures").join(set)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn set_digest(dir: &Path) -> String {
    let mut files = Vec::new();
    walk(dir, &mut files);
    let mut h = blake3::Hasher::new();
    for f in files {
        let rel = f
            .strip_prefix(dir)
            .expect("prefix")
            .to_string_lossy()
            .replace('\\', "/");
        h.update(rel.as_bytes());
        h.update(&[0]);
        h.update(blake3::hash(&std::fs::read(&f).expect("read")).as_bytes());
    }
    h.finalize().to_hex().to_string()
}

fn copy_tree(from: &Path, to: &Path) {
    let mut files = Vec::new();
    walk(from, &mut files);
    for f in files {
        let dest = to.join(f.strip_prefix(from).expect("prefix"));
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&f, &dest).expect("copy");
    }
}

fn expected(set: &str) -> Expected {
    serde_json::from_slice(
        &std::fs::read(set_dir(set).join("expected.json")).expect("expected.json"),
    )
    .expect("json")
}

#[test]
fn fixture_files_are_frozen() {
    for (set, pinned) in SETS {
        assert!(set_dir(set).exists(), "fixture set {set} is missing");
        assert_eq!(
            set_digest(&set_dir(set)),
            *pinned,
            "a file under fixtures/{set} changed"
        );
    }
}

#[test]
fn every_fixture_root_decodes_and_reencodes_byte_identically() {
    let key = root::mac_key(FIXTURE_SECRET);
    let mut schemas = BTreeMap::new();
    for (set, _) in SETS {
        let exp = expected(set);
        let mut roots = Vec::new();
        walk(&set_dir(set).join("store/roots"), &mut roots);
        assert_eq!(roots.len(), exp.roots.len());
        for p in roots {
            let bytes = std::fs::read(&p).expect("read");
            let keyed = root::has_mac(&bytes);
            let decoded =
                root::decode(&bytes, keyed.then_some(&key)).expect("fixture root decodes");
            let again = root::encode(&decoded, keyed.then_some(&key)).expect("re-encode");
            assert_eq!(again, bytes, "{} re-encodes byte-identically", p.display());
            let s = decoded.summary().expect("summary");
            *schemas.entry(s.schema).or_insert(0) += 1;
            assert!(matches!(decoded, DecodedRoot::V1(_) | DecodedRoot::V2(_)));
        }
    }
    assert!(
        schemas.contains_key(root::SCHEMA_V1)
            && schemas.contains_key(root::SCHEMA_V2)
            && schemas.contains_key(root::SCHEMA_V2_1)
            && schemas.contains_key(root::SCHEMA_V2_2),
        "{schemas:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_context_restores_to_its_recorded_digest() {
    for (set, _) in SETS {
        restore_set(set).await;
    }
}

async fn restore_set(set: &str) {
    let exp = expected(set);
    // Work on a copy: a restore may quarantine, and fixtures are read-only.
    let tmp = tempfile::tempdir().expect("tmp");
    copy_tree(&set_dir(set).join("store"), tmp.path());
    let url = format!("file://{}", tmp.path().display());
    let plain = Store::open(&url, StoreConfig::default()).expect("open");
    let keyed = Store::open(
        &url,
        StoreConfig::default().with_mac_secret(Some(FIXTURE_SECRET.to_vec())),
    )
    .expect("open");
    for r in &exp.roots {
        let id = CacheIdentity::from_json(
            &std::fs::read(set_dir(set).join(&r.identity_file)).expect("id"),
        )
        .expect("id");
        assert_eq!(
            id.namespace(),
            r.namespace,
            "{}: namespace derivation is frozen",
            r.label
        );
        let store = if r.keyed { &keyed } else { &plain };
        match store
            .restore((&id, r.context), Default::default())
            .await
            .expect("restore")
        {
            RestoreOutcome::Hit(h) => {
                assert_eq!(h.digest, r.snapshot_digest, "{}", r.label);
                assert_eq!(h.schema, r.schema, "{}", r.label);
                let input = std::fs::read(set_dir(set).join(&r.snapshot_file)).expect("input");
                assert_eq!(h.snapshot.encoded(), &input[..], "{}: bit-exact", r.label);
            }
            RestoreOutcome::Miss(m) => panic!("{}: fixture restore missed: {m}", r.label),
        }
        if r.keyed {
            let miss = plain_keyed_check(&keyed, &plain, &id, r.context).await;
            assert!(miss, "{}: keyed roots verify only with the key", r.label);
        }
    }
}

/// A keyed root restores with the key; a store opened with another key
/// refuses it as unauthenticated.
async fn plain_keyed_check(
    keyed: &Store,
    _plain: &Store,
    id: &CacheIdentity,
    ctx: ContextDigest,
) -> bool {
    let wrong = Store::from_backend(
        deltapack_store::Backend {
            store: keyed.object_store().clone(),
            kind: keyed.backend_kind().clone(),
        },
        StoreConfig::default().with_mac_secret(Some(b"another key".to_vec())),
    )
    .expect("store");
    matches!(
        wrong
            .restore((id, ctx), Default::default())
            .await
            .expect("restore"),
        RestoreOutcome::Miss(deltapack_store::MissReason::Unauthenticated { .. })
    )
}

/// Writes the fixture set. Run once, by hand, when a new set is introduced:
/// `DELTAPACK_WRITE_FIXTURES=1 cargo test --test backward_compatibility -- --ignored`.
/// Refuses to overwrite an existing set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes fixtures; run by hand only when adding a new fixture set"]
async fn write_fixture_set() {
    if std::env::var("DELTAPACK_WRITE_FIXTURES").as_deref() != Ok("1") {
        return;
    }
    let dir = set_dir(NEWEST);
    assert!(
        !dir.exists(),
        "fixture set {NEWEST} exists and is frozen; add a new set instead"
    );
    std::fs::create_dir_all(dir.join("inputs")).expect("mkdir");
    match NEWEST {
        "2026-11-v1v2" => write_v1v2_set(&dir).await,
        "2026-12-v2.1-chain" => write_chain_set(&dir).await,
        "2026-12-v2.2-layers" => write_layers_set(&dir).await,
        other => panic!("no writer for fixture set {other}"),
    }
    println!("fixture set digest: {}", set_digest(&dir));
}

/// The inputs of the five-turn fixture sets (tiny preset, seed 2026, 1,024
/// tokens per turn), written under `inputs/`: each turn's snapshot and the
/// last turn's tokens. Returns the turns' token counts and snapshots.
fn five_turn_inputs(dir: &Path) -> (Vec<u64>, Vec<Arc<Snapshot>>) {
    let tokens: Vec<u64> = (1..=5).map(|k| k * 1024).collect();
    let snaps: Vec<_> = tokens.iter().map(|t| turn(2026, *t)).collect();
    for (t, snap) in tokens.iter().zip(&snaps) {
        std::fs::write(
            dir.join(format!("inputs/turn-{t}.snapshot")),
            snap.encoded(),
        )
        .expect("w");
    }
    std::fs::write(
        dir.join("inputs/tokens-5120.u32le"),
        deltapack_format::context::tokens_to_le_bytes(&deltapack_format::synth::tokens(2026, 5120)),
    )
    .expect("w");
    (tokens, snaps)
}

/// Extent size of the five-turn fixture sets.
const FIVE_TURN_M: u64 = 4096;

/// One namespace of a five-turn fixture set: its identity (written to
/// `inputs/identity-{label}.json`) and a handle on the set's store.
struct FixtureNs {
    label: String,
    keyed: bool,
    id: CacheIdentity,
    id_file: String,
    store: Store,
}

impl FixtureNs {
    /// The set's two namespaces, each opened when its turn comes: `label`,
    /// unkeyed, then `{label}-keyed`, with a keyed root MAC.
    fn both<'a>(dir: &'a Path, label: &str) -> impl Iterator<Item = FixtureNs> + 'a {
        [(label.to_string(), false), (format!("{label}-keyed"), true)]
            .into_iter()
            .map(move |(label, keyed)| FixtureNs::open(dir, label, keyed))
    }

    /// The namespace `label`, its identity written, on the set's store,
    /// keyed or not.
    fn open(dir: &Path, label: String, keyed: bool) -> FixtureNs {
        let url = format!("file://{}", dir.join("store").display());
        let id = identity(&format!("fixture-{label}"));
        let id_file = format!("inputs/identity-{label}.json");
        std::fs::write(dir.join(&id_file), id.to_json_pretty()).expect("w");
        let cfg = StoreConfig::default()
            .with_max_extent_bytes(FIVE_TURN_M)
            .with_mac_secret(keyed.then(|| FIXTURE_SECRET.to_vec()));
        let store = Store::open(&url, cfg).expect("open");
        FixtureNs {
            label,
            keyed,
            id,
            id_file,
            store,
        }
    }

    /// The context of the conversation at `t` tokens.
    fn ctx(&self, t: u64) -> ContextDigest {
        ctx(&self.id, 2026, t as usize)
    }

    /// Publishes turn `k` of the five: flat if it is the first, else as a
    /// full-snapshot delta on the turn before.
    async fn publish_full(
        &self,
        k: usize,
        tokens: &[u64],
        snaps: &[Arc<Snapshot>],
    ) -> deltapack_store::PublishReceipt {
        let (c, snap) = (self.ctx(tokens[k]), snaps[k].clone());
        if k == 0 {
            return publish_base(&self.store, &self.id, c, snap, RootFormat::V2).await;
        }
        let (bc, base) = (self.ctx(tokens[k - 1]), snaps[k - 1].clone());
        publish_delta(&self.store, &self.id, c, snap, bc, base, RootFormat::V2).await
    }

    /// The expected entry of turn `k` (at `t` tokens), whose root has
    /// `schema` and restores to `snapshot_digest`.
    fn root(&self, k: usize, t: u64, schema: String, snapshot_digest: Digest) -> ExpectedRoot {
        ExpectedRoot {
            label: format!("{}-turn-{}", self.label, k + 1),
            identity_file: self.id_file.clone(),
            namespace: self.id.namespace(),
            context: self.ctx(t),
            schema,
            keyed: self.keyed,
            snapshot_file: format!("inputs/turn-{t}.snapshot"),
            snapshot_digest,
        }
    }
}

/// Writes a five-turn set's `expected.json` and drops its ledger (derived
/// state, rebuilt from the store by any reader).
fn write_five_turn_set(dir: &Path, description: &str, roots: Vec<ExpectedRoot>) {
    let exp = Expected {
        description: description.into(),
        max_extent_bytes: FIVE_TURN_M,
        roots,
    };
    write_expected(dir, &exp);
    std::fs::remove_dir_all(dir.join("store/ledger")).expect("rm ledger");
}

/// `2026-12-v2.1-chain`: a five-turn conversation (tiny preset, seed 2026,
/// 1,024 tokens per turn): turn 1 a flat v2 root, turns 2–5 v2.1 deltas,
/// each on the turn before; once unkeyed, once with a keyed root MAC.
async fn write_chain_set(dir: &Path) {
    let (tokens, snaps) = five_turn_inputs(dir);
    let mut roots = Vec::new();
    for ns in FixtureNs::both(dir, "chain") {
        for (k, (t, snap)) in tokens.iter().zip(&snaps).enumerate() {
            let receipt = ns.publish_full(k, &tokens, &snaps).await;
            assert_eq!(receipt.chain_depth as usize, k);
            roots.push(ns.root(k, *t, receipt.schema, snap.digest()));
        }
    }
    write_five_turn_set(
        dir,
        "Five-turn synthetic conversation (tiny preset, seed 2026, 1024 tokens per turn): \
         turn 1 a flat v2 root, turns 2-5 deltapack-page-delta-manifest/v2.1 roots (chain hints: the \
         roots below the base, the chain's payload bytes, the delta header), each on the \
         turn before; in two namespaces, unkeyed and with a keyed root MAC. M = 4096 bytes.",
        roots,
    );
}

/// `2026-12-v2.2-layers`: a five-turn conversation (tiny preset, seed
/// 2026, 1,024 tokens per turn) with the layered snapshot digest: turn 1 a
/// flat v2.2 root, turns 2-3 full-snapshot deltas, turns 4-5 tail-only
/// turns (`publish_turn`), each on the turn before; once unkeyed, once with
/// a keyed root MAC.
async fn write_layers_set(dir: &Path) {
    let (tokens, snaps) = five_turn_inputs(dir);
    let mut roots = Vec::new();
    for ns in FixtureNs::both(dir, "layers") {
        let mut prev: Option<deltapack_store::Turn> = None;
        for (k, (t, snap)) in tokens.iter().zip(&snaps).enumerate() {
            let receipt = if k < 3 {
                ns.publish_full(k, &tokens, &snaps).await
            } else {
                let p = prev.as_ref().expect("turn");
                ns.store
                    .publish_turn(
                        p,
                        deltapack_store::TurnRequest {
                            identity: ns.id.clone(),
                            context: ns.ctx(*t),
                            boundary: *t,
                            tail: p.tail_of(snap).expect("tail"),
                        },
                    )
                    .await
                    .expect("publish_turn")
            };
            assert_eq!(receipt.chain_depth as usize, k);
            assert_eq!(receipt.schema, root::SCHEMA_V2_2);
            prev = receipt.turn.clone();
            roots.push(ns.root(k, *t, receipt.schema, receipt.snapshot_digest));
        }
    }
    write_five_turn_set(
        dir,
        "Five-turn synthetic conversation (tiny preset, seed 2026, 1024 tokens per turn) \
         with the layered snapshot digest (blake3-layers): turn 1 a flat \
         deltapack-page-delta-manifest/v2.2 root, turns 2-3 full-snapshot deltas, turns 4-5 \
         tail-only turns, each a v2.2 delta with chain hints on the turn before; in two \
         namespaces, unkeyed and with a keyed root MAC. M = 4096 bytes.",
        roots,
    );
}

fn write_expected(dir: &Path, exp: &Expected) {
    std::fs::write(
        dir.join("expected.json"),
        serde_json::to_string_pretty(exp).expect("json"),
    )
    .expect("w");
}

/// `2026-11-v1v2` (released; kept for the record, never run again): base
/// and delta in four namespaces (v2 raw, v1, v2 zstd, v2 keyed).
async fn write_v1v2_set(dir: &Path) {
    let url = format!("file://{}", dir.join("store").display());
    let m = 4096;
    let base = turn(2026, 1024);
    let result = turn(2026, 4096);
    std::fs::write(dir.join("inputs/base-1024.snapshot"), base.encoded()).expect("w");
    std::fs::write(dir.join("inputs/result-4096.snapshot"), result.encoded()).expect("w");
    std::fs::write(
        dir.join("inputs/tokens-4096.u32le"),
        deltapack_format::context::tokens_to_le_bytes(&deltapack_format::synth::tokens(2026, 4096)),
    )
    .expect("w");
    let variants: [(&str, RootFormat, Option<i32>, bool); 4] = [
        ("v2-raw", RootFormat::V2, None, false),
        ("v1", RootFormat::V1, None, false),
        ("v2-zstd", RootFormat::V2, Some(3), false),
        ("v2-keyed", RootFormat::V2, None, true),
    ];
    let mut roots = Vec::new();
    for (label, format, compression, keyed) in variants {
        let id = identity(&format!("fixture-{label}"));
        let id_file = format!("inputs/identity-{label}.json");
        std::fs::write(dir.join(&id_file), id.to_json_pretty()).expect("w");
        let cfg = StoreConfig::default()
            .with_max_extent_bytes(m)
            .with_compression(compression)
            .with_mac_secret(keyed.then(|| FIXTURE_SECRET.to_vec()));
        let store = Store::open(&url, cfg).expect("open");
        let (cb, cr) = (ctx(&id, 2026, 1024), ctx(&id, 2026, 4096));
        publish_base(&store, &id, cb, base.clone(), format).await;
        publish_delta(&store, &id, cr, result.clone(), cb, base.clone(), format).await;
        let schema = match format {
            RootFormat::V2 => root::SCHEMA_V2,
            RootFormat::V1 => root::SCHEMA_V1,
            other => panic!("no frozen fixture for {other:?}"),
        };
        for (suffix, c, file, snap) in [
            ("base", cb, "inputs/base-1024.snapshot", &base),
            ("delta", cr, "inputs/result-4096.snapshot", &result),
        ] {
            roots.push(ExpectedRoot {
                label: format!("{label}-{suffix}"),
                identity_file: id_file.clone(),
                namespace: id.namespace(),
                context: c,
                schema: schema.into(),
                keyed,
                snapshot_file: file.into(),
                snapshot_digest: snap.digest(),
            });
        }
    }
    let exp = Expected {
        description: "Tiny synthetic conversation (seed 2026): base at 1024 tokens, result at 4096 tokens, \
                      published as base + page-tail-cow-v1 delta in four namespaces: v2 raw extents, legacy v1 \
                      chunks, v2 zstd extents, v2 with keyed root MAC. M = 4096 bytes."
            .into(),
        max_extent_bytes: m,
        roots,
    };
    write_expected(dir, &exp);
    let _: Snapshot = (*base).clone();
}

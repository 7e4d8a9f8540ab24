//! `deltapack compat` and `deltapack migrate --check`, as a downstream CI
//! runs them.
//!
//! Guards the contract other projects build their CI on: over copies of
//! this repository's frozen fixture sets, `compat fixtures` and `compat
//! check` pass (exit 0); one flipped byte of an object fails (exit 3) and
//! the JSON names the root and the object; a flipped byte of a root fails
//! naming the root; `compat record` then `check --expect` round-trips, and
//! one wrong digest in the expect file fails naming that root; `freeze`
//! writes a set that `compat fixtures` passes; `migrate --check` proves
//! every v1 digest and fails (exit 3) on a corrupted v1 chunk. None of
//! these may change the store they check — not even quarantine what they
//! find damaged — so every test compares the store's full listing (paths,
//! directories included, and bytes) before and after. The fixtures are
//! always copied to a temporary directory first: the repository's copies
//! must stay byte-identical.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::{expect_code, files_below, words};

/// The secret of the fixture sets' keyed roots (fixtures/README.md).
const FIXTURE_SECRET: &str = "deltapack-fixture-secret-2026-11";
const SETS: [&str; 3] = ["2026-11-v1v2", "2026-12-v2.1-chain", "2026-12-v2.2-layers"];

fn repo_fixture(set: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(set)
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let dest = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).expect("copy");
        }
    }
}

/// Every path under `dir` (directories as `None`, files with their bytes).
fn listing(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Option<Vec<u8>>>) {
        for e in std::fs::read_dir(dir).expect("read_dir") {
            let p = e.expect("entry").path();
            let rel = p.strip_prefix(root).expect("prefix").to_path_buf();
            if p.is_dir() {
                out.insert(rel, None);
                walk(root, &p, out);
            } else {
                out.insert(rel, Some(std::fs::read(&p).expect("read")));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// A temporary directory holding copies of every fixture set and the key.
struct Work {
    tmp: tempfile::TempDir,
}

impl Work {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        for set in SETS {
            copy_tree(&repo_fixture(set), &tmp.path().join(set));
        }
        std::fs::write(tmp.path().join("key"), FIXTURE_SECRET).expect("key");
        Work { tmp }
    }
    fn dir(&self) -> &Path {
        self.tmp.path()
    }
    fn set(&self, set: &str) -> PathBuf {
        self.dir().join(set)
    }
    fn store(&self, set: &str) -> String {
        format!("file://{}", self.set(set).join("store").display())
    }
    fn key(&self) -> String {
        self.dir().join("key").display().to_string()
    }
    fn run(&self, args: &[&str], code: i32) -> String {
        expect_code(self.dir(), args, code)
    }
    /// Runs `compat check` over `set`'s store with the fixture key and the
    /// arguments `more`; asserts the exit code and returns stdout.
    fn check(&self, set: &str, more: &str, code: i32) -> String {
        let line = format!(
            "compat check --store {} --root-key-file {} {more}",
            self.store(set),
            self.key()
        );
        self.run(&words(&line), code)
    }
}

/// The JSON lines of a `--json` run.
fn lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn expected_roots(set_dir: &Path) -> Vec<serde_json::Value> {
    let exp: serde_json::Value = serde_json::from_slice(
        &std::fs::read(set_dir.join("expected.json")).expect("expected.json"),
    )
    .expect("json");
    exp["roots"].as_array().expect("roots").clone()
}

/// Flips a bit of byte `at` (or of the last byte) of the `nth` file below
/// `dir`, in sorted order; returns that file.
fn flip_byte(dir: &Path, nth: usize, at: usize) -> PathBuf {
    let victim = files_below(dir)
        .into_iter()
        .nth(nth)
        .expect("a file to damage");
    let mut b = std::fs::read(&victim).expect("read");
    let i = at.min(b.len() - 1);
    b[i] ^= 0x01;
    std::fs::write(&victim, b).expect("write");
    victim
}

fn store_key(store_dir: &Path, file: &Path) -> String {
    file.strip_prefix(store_dir)
        .expect("prefix")
        .to_string_lossy()
        .replace('\\', "/")
}

#[test]
fn fixture_sets_pass_and_are_not_changed() {
    let w = Work::new();
    let key = w.key();
    for set in SETS {
        let dir = w.set(set);
        let before = listing(&dir);
        let out = w.run(
            &words(&format!(
                "compat fixtures {} --root-key-file {key} --json",
                dir.to_str().expect("utf-8")
            )),
            0,
        );
        let got = lines(&out);
        let want = expected_roots(&dir);
        assert_eq!(got.len(), want.len(), "{set}: one line per root\n{out}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g["status"], "ok", "{set}: {g}");
            assert_eq!(g["label"], w["label"]);
            assert_eq!(g["snapshot_digest"], w["snapshot_digest"]);
            assert_eq!(g["schema"], w["schema"]);
            let mac = if w["keyed"] == true {
                "verified"
            } else {
                "none"
            };
            assert_eq!(g["mac"], mac, "{g}");
        }
        let out = w.check(set, "", 0);
        assert!(
            out.contains(&format!(
                "{} roots, {} ok, 0 failed",
                want.len(),
                want.len()
            )),
            "{out}"
        );
        // Without the key a fixture set's keyed roots cannot be proven.
        let out = w.run(
            &["compat", "fixtures", dir.to_str().expect("utf-8"), "--json"],
            3,
        );
        for (g, w) in lines(&out).iter().zip(&want) {
            let status = if w["keyed"] == true { "fail" } else { "ok" };
            assert_eq!(g["status"], status, "{g}");
        }
        assert!(listing(&dir) == before, "{set}: a check changed the set");
    }
}

#[test]
fn a_flipped_object_byte_names_the_root_and_the_object() {
    let w = Work::new();
    let key = w.key();
    for (set, algo) in [("2026-11-v1v2", "sha256"), ("2026-12-v2.1-chain", "blake3")] {
        let store_dir = w.set(set).join("store");
        let victim = flip_byte(&store_dir.join("objects").join(algo), 0, 100);
        let object = store_key(&store_dir, &victim);
        let before = listing(&w.set(set));
        let out = w.check(set, "--json", 3);
        let got = lines(&out);
        // The roots whose own objects include it fail the object check;
        // the deltas built on them fail their restore; all name it.
        let blamed: Vec<_> = got.iter().filter(|r| r["check"] == "object").collect();
        assert!(
            !blamed.is_empty(),
            "{set}: a root references the object\n{out}"
        );
        for r in got.iter().filter(|r| r["status"] != "ok") {
            assert_eq!(r["status"], "fail", "{r}");
            assert_eq!(r["object"], object.as_str(), "{set}: {r}");
            assert!(r["check"] == "object" || r["check"] == "restore", "{r}");
            assert!(
                r["root"].as_str().expect("root").starts_with("roots/"),
                "{r}"
            );
        }
        let root = blamed[0]["root"].as_str().expect("root");
        // Roots that do not need the object still pass.
        assert!(got.iter().any(|r| r["status"] == "ok"), "{out}");
        // The fixture check blames the same object.
        let out = w.run(
            &words(&format!(
                "compat fixtures {} --root-key-file {key} --json",
                w.set(set).to_str().expect("utf-8")
            )),
            3,
        );
        assert!(
            lines(&out)
                .iter()
                .any(|r| r["root"] == root && r["object"] == object.as_str()),
            "{out}"
        );
        // A baseline is never recorded over a failing root.
        let out_file = w.dir().join(format!("{set}-expect.json"));
        w.run(
            &words(&format!(
                "compat record --store {} --out {} --root-key-file {key}",
                w.store(set),
                out_file.to_str().expect("utf-8")
            )),
            3,
        );
        assert!(!out_file.exists(), "record wrote a failing baseline");
        // Nothing was quarantined or otherwise written.
        assert!(
            listing(&w.set(set)) == before,
            "{set}: the check changed the store"
        );
    }
}

#[test]
fn a_flipped_root_byte_names_the_root() {
    let w = Work::new();
    let set = "2026-12-v2.1-chain";
    let store_dir = w.set(set).join("store");
    let victim = flip_byte(&store_dir.join("roots"), 2, 200);
    let root = store_key(&store_dir, &victim);
    let before = listing(&w.set(set));
    let out = w.check(set, "--json", 3);
    let got = lines(&out);
    let bad: Vec<_> = got.iter().filter(|r| r["root"] == root.as_str()).collect();
    assert_eq!(bad.len(), 1, "{out}");
    assert_eq!(bad[0]["status"], "fail");
    assert!(
        bad[0]["check"] == "decode" || bad[0]["check"] == "mac",
        "{}",
        bad[0]
    );
    assert!(
        listing(&w.set(set)) == before,
        "the check changed the store"
    );
    // The text output names it too.
    let out = w.check(set, "", 3);
    let ctx = Path::new(&root).file_name().expect("ctx").to_string_lossy();
    assert!(
        out.lines()
            .any(|l| l.starts_with("FAIL") && l.contains(&ctx[..12])),
        "{out}"
    );
}

#[test]
fn record_then_expect_round_trips_and_a_wrong_digest_fails() {
    let w = Work::new();
    let set = "2026-11-v1v2";
    let store = w.store(set);
    let key = w.key();
    let exp = w.dir().join("expect.json");
    let exp_s = exp.to_str().expect("utf-8");
    let before = listing(&w.set(set));
    w.run(
        &words(&format!(
            "compat record --store {store} --out {exp_s} --root-key-file {key}"
        )),
        0,
    );
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&exp).expect("read")).expect("json");
    assert_eq!(recorded["format"], "deltapack-compat-expect/1");
    let roots = recorded["roots"].as_object().expect("roots");
    for r in expected_roots(&w.set(set)) {
        let k = format!(
            "roots/{}/{}",
            r["namespace"].as_str().expect("ns"),
            r["context"].as_str().expect("ctx")
        );
        assert_eq!(roots[&k]["snapshot_digest"], r["snapshot_digest"], "{k}");
        assert_eq!(roots[&k]["schema"], r["schema"], "{k}");
    }
    assert_eq!(roots.len(), 8);
    let out = w.run(
        &words(&format!(
            "compat check --store {store} --expect {exp_s} --root-key-file {key} --json"
        )),
        0,
    );
    assert!(
        lines(&out)
            .iter()
            .all(|r| r["expected"] == true && r["status"] == "ok"),
        "{out}"
    );

    // One wrong digest: the base's digest recorded for the delta.
    let mut wrong = recorded.clone();
    let victim = roots
        .iter()
        .find(|(_, v)| {
            v["snapshot_digest"] != roots.values().next().expect("one")["snapshot_digest"]
        })
        .map(|(k, _)| k.clone())
        .expect("a root with another digest");
    let other = roots.values().next().expect("one")["snapshot_digest"].clone();
    wrong["roots"][&victim]["snapshot_digest"] = other;
    let bad = w.dir().join("wrong.json");
    std::fs::write(&bad, serde_json::to_vec_pretty(&wrong).expect("json")).expect("write");
    let out = w.run(
        &words(&format!(
            "compat check --store {store} --expect {} --root-key-file {key} --json",
            bad.to_str().expect("utf-8")
        )),
        3,
    );
    let failed: Vec<_> = lines(&out)
        .into_iter()
        .filter(|r| r["status"] != "ok")
        .collect();
    assert_eq!(failed.len(), 1, "{out}");
    assert_eq!(failed[0]["root"], victim.as_str());
    assert_eq!(failed[0]["check"], "expect");

    // A root the expect file lists and the store lacks is a miss.
    let mut extra = recorded.clone();
    let ghost = format!("roots/{}/{}", "a".repeat(64), "b".repeat(64));
    extra["roots"][&ghost] = serde_json::json!({
        "namespace": "a".repeat(64),
        "context": "b".repeat(64),
        "schema": "deltapack-page-delta-manifest/v2",
        "snapshot_digest": other_digest(&recorded),
    });
    std::fs::write(&bad, serde_json::to_vec_pretty(&extra).expect("json")).expect("write");
    let out = w.run(
        &words(&format!(
            "compat check --store {store} --expect {} --root-key-file {key} --json",
            bad.to_str().expect("utf-8")
        )),
        3,
    );
    assert!(
        lines(&out)
            .iter()
            .any(|r| r["root"] == ghost.as_str() && r["status"] == "missing"),
        "{out}"
    );

    // A file that is not an expect file is an error (exit 1), not a pass.
    std::fs::write(&bad, br#"{"roots": {}}"#).expect("write");
    w.run(
        &words(&format!(
            "compat check --store {store} --expect {}",
            bad.to_str().expect("utf-8")
        )),
        1,
    );
    // An unreachable store is an error too.
    let missing = w.dir().join("no-such-store");
    w.run(
        &words(&format!(
            "compat check --store {}",
            missing.to_str().expect("utf-8")
        )),
        1,
    );
    assert!(!missing.exists(), "a check must not create a store");
    assert!(
        listing(&w.set(set)) == before,
        "record/check changed the store"
    );
}

fn other_digest(recorded: &serde_json::Value) -> serde_json::Value {
    recorded["roots"]
        .as_object()
        .expect("roots")
        .values()
        .next()
        .expect("one")["snapshot_digest"]
        .clone()
}

#[test]
fn freeze_writes_a_set_that_compat_fixtures_passes() {
    let w = Work::new();
    let set = "2026-12-v2.1-chain";
    let key = w.key();
    let before = listing(&w.set(set));
    let frozen = w.dir().join("frozen");
    let frozen_s = frozen.to_str().expect("utf-8");
    let identity = w.set(set).join("inputs/identity-chain.json");
    w.run(
        &words(&format!(
            "compat freeze {frozen_s} --store {} --root-key-file {key} --identity {}",
            w.store(set),
            identity.to_str().expect("utf-8")
        )),
        0,
    );
    assert!(frozen.join("expected.json").is_file());
    let out = w.run(
        &words(&format!(
            "compat fixtures {frozen_s} --root-key-file {key} --json"
        )),
        0,
    );
    let got = lines(&out);
    assert_eq!(got.len(), 10, "{out}");
    assert!(got.iter().all(|r| r["status"] == "ok"), "{out}");
    // The frozen store holds the source's roots and objects, byte for byte.
    let src = listing(&w.set(set).join("store"));
    for (p, c) in listing(&frozen.join("store")) {
        assert_eq!(
            src.get(&p),
            Some(&c),
            "{} differs from the source",
            p.display()
        );
    }
    let roots = expected_roots(&frozen);
    let with_identity = roots
        .iter()
        .filter(|r| r["identity_file"].is_string())
        .count();
    assert_eq!(
        with_identity, 5,
        "the unkeyed namespace's roots name the identity"
    );
    // The frozen set's inputs are the repository set's snapshots.
    for r in &roots {
        let ours =
            std::fs::read(frozen.join(r["snapshot_file"].as_str().expect("file"))).expect("read");
        let theirs = expected_roots(&w.set(set))
            .into_iter()
            .find(|t| t["context"] == r["context"])
            .expect("same root");
        let input = std::fs::read(
            w.set(set)
                .join(theirs["snapshot_file"].as_str().expect("file")),
        )
        .expect("read");
        assert!(ours == input, "{}", r["label"]);
    }
    // A second freeze into the non-empty directory is refused.
    let frozen_before = listing(&frozen);
    w.run(
        &words(&format!(
            "compat freeze {frozen_s} --store {} --root-key-file {key}",
            w.store(set)
        )),
        1,
    );
    assert!(
        listing(&frozen) == frozen_before,
        "a refused freeze changed the directory"
    );
    // A damaged frozen object fails the frozen set.
    flip_byte(&frozen.join("store/objects"), 0, 10);
    w.run(
        &["compat", "fixtures", frozen_s, "--root-key-file", &key],
        3,
    );
    assert!(listing(&w.set(set)) == before, "freeze changed its source");
}

#[test]
fn migrate_check_proves_every_v1_digest_and_writes_nothing() {
    let w = Work::new();
    let set = "2026-11-v1v2";
    let store = w.store(set);
    let before = listing(&w.set(set));
    let out = w.run(&["migrate", "--check", "--store", &store, "--json"], 0);
    let got = lines(&out);
    let v1: Vec<_> = expected_roots(&w.set(set))
        .into_iter()
        .filter(|r| r["schema"] == "deltapack-page-delta-manifest/v1")
        .collect();
    assert_eq!(got.len(), v1.len(), "one line per v1 root\n{out}");
    for r in &v1 {
        let p = got
            .iter()
            .find(|p| p["context"] == r["context"])
            .unwrap_or_else(|| panic!("{} is not in the output\n{out}", r["label"]));
        assert_eq!(p["proven"], true, "{p}");
        assert_eq!(p["snapshot_digest"], r["snapshot_digest"], "{p}");
        assert!(p["extents"].as_u64().expect("extents") >= 1, "{p}");
    }
    assert!(
        listing(&w.set(set)) == before,
        "migrate --check wrote to the store"
    );
    // A corrupted v1 chunk: that root would not migrate identically.
    flip_byte(&w.set(set).join("store/objects/sha256"), 0, 50);
    let damaged = listing(&w.set(set));
    let out = w.run(&["migrate", "--check", "--store", &store, "--json"], 3);
    let got = lines(&out);
    assert_eq!(got.len(), v1.len(), "{out}");
    assert!(
        got.iter()
            .any(|p| p["proven"] == false && p["reason"].is_string()),
        "{out}"
    );
    assert!(
        listing(&w.set(set)) == damaged,
        "migrate --check wrote to (or quarantined in) the store"
    );
    // The text form says so per root.
    let out = w.run(&["migrate", "--check", "--store", &store], 3);
    assert!(out.lines().any(|l| l.starts_with("FAIL")), "{out}");
}

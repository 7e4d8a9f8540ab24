//! End-to-end test of the `deltapack` binary as a user drives it.
//!
//! Guards the CLI contract: a snapshot published through the CLI (flat, then
//! as a delta) restores bit-exactly; re-publishing is idempotent (exit 0,
//! already-present); `inspect --json` lists every root (v1 and v2); a flipped
//! byte in a stored delta object is a `corrupt` miss (exit 3, never bad
//! bytes in the output file); an unknown context is an `absent` miss (exit
//! 3); a usage error exits 2; `lookup` answers the longest stored boundary
//! of a longer request (exit 0) and misses an unrelated one (exit 3); and
//! the `demo` runs end to end and verifies.

use std::path::PathBuf;

use crate::common::{assert_none, expect_code, scratch_conversation, words, Cli};

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

#[test]
fn publish_restore_inspect_corrupt_and_demo() {
    // Identity and two turns of one tiny conversation.
    let (tmp, store) = scratch_conversation(&[("a", 7, 2048), ("b", 7, 4096)]);
    let dir = tmp.path();
    let store_dir = dir.join("store");
    let s = store.as_str();

    // Base (v2) via --tokens, then the delta against it.
    let base = json(&Cli(dir).ok(format!(
        "publish --store {s} --identity id.json --tokens a.tok --snapshot a.snap --json"
    )));
    assert_eq!(base["outcome"], "created");
    let delta_args_line = format!("publish --store {s} --identity id.json --tokens b.tok --snapshot b.snap --base-snapshot a.snap --base-tokens a.tok --json");
    let delta_args = words(&delta_args_line);
    let delta = json(&expect_code(dir, &delta_args, 0));
    assert_eq!(delta["outcome"], "created");
    // A delta records its chain and its layered digest (v2.2): here one
    // delta over a flat root.
    assert_eq!(delta["schema"], "deltapack-page-delta-manifest/v2.2");
    assert_eq!(delta["chain_depth"], 1);
    assert_eq!(delta["rebased"], false);
    let delta_ctx = delta["context"].as_str().expect("context").to_string();

    // Lookup of a longer request (the delta's tokens plus 300 more):
    // the longest stored boundary is the delta's, 4096.
    let mut longer = std::fs::read(dir.join("b.tok")).expect("b.tok");
    longer.extend((0..300u32).flat_map(|t| (t + 11).to_le_bytes()));
    std::fs::write(dir.join("longer.tok"), &longer).expect("write longer.tok");
    let lookup = |tok: &str, code: i32| {
        json(&Cli(dir).code(
            code,
            format!("lookup --store {s} --identity id.json --tokens {tok} --json"),
        ))
    };
    let hit = lookup("longer.tok", 0);
    assert_eq!(hit["outcome"], "hit");
    assert_eq!(hit["boundary"], 4096);
    assert_eq!(hit["context"], delta_ctx.as_str());
    assert_eq!(hit["tokens"], 4096 + 300);
    // A prompt that shares no stored prefix: a miss, exit 3.
    let other: Vec<u8> = (0..1024u32)
        .flat_map(|t| (t * 7 + 3).to_le_bytes())
        .collect();
    std::fs::write(dir.join("other.tok"), other).expect("write other.tok");
    assert_eq!(lookup("other.tok", 3)["outcome"], "miss");

    // Restore to a file: bit-exact.
    let restored = json(&Cli(dir).ok(format!(
        "restore --store {s} --identity id.json --tokens b.tok --out restored.snap --json"
    )));
    assert_eq!(restored["outcome"], "hit");
    assert_eq!(
        std::fs::read(dir.join("restored.snap")).expect("restored file"),
        std::fs::read(dir.join("b.snap")).expect("synthesized file"),
        "restore must be bit-exact"
    );
    assert!(!dir.join("restored.snap.tmp").exists());

    // Same publication again: idempotent.
    let again = json(&expect_code(dir, &delta_args, 0));
    assert_eq!(again["outcome"], "already-present");

    // A v1 root of another context (another conversation).
    Cli(dir).ok("synth --preset tiny --seed 8 --tokens 1024 --out c.snap --tokens-out c.tok");
    let v1 = json(&Cli(dir).ok(format!("publish --store {s} --identity id.json --tokens c.tok --snapshot c.snap --format v1 --json")));
    assert_eq!(v1["outcome"], "created");
    assert_eq!(v1["schema"], "deltapack-page-delta-manifest/v1");

    // inspect --json lists all three roots.
    let roots = json(&Cli(dir).ok(format!("inspect --store {s} --json")));
    let roots = roots.as_array().expect("inspect --json is an array");
    assert_eq!(roots.len(), 3, "{roots:?}");
    let schemas: Vec<&str> = roots.iter().filter_map(|r| r["schema"].as_str()).collect();
    // The flat root and the delta are v2.2 (layered digest), one is v1.
    assert_eq!(schemas.iter().filter(|s| s.ends_with("/v2.2")).count(), 2);
    assert_eq!(schemas.iter().filter(|s| s.ends_with("/v1")).count(), 1);
    let delta_row = roots
        .iter()
        .find(|r| r["context"] == delta_ctx.as_str())
        .expect("delta root listed");
    assert_eq!(delta_row["kind"], "delta");
    assert_eq!(delta_row["boundary"], 4096);

    // Corrupt the delta's stored object: flip one byte of the file that
    // `inspect --context` names (the largest file under objects/blake3).
    let detail = json(&Cli(dir).ok(format!("inspect --store {s} --context {delta_ctx} --json")));
    let objects = detail["objects"].as_array().expect("objects");
    let victim: PathBuf = objects
        .iter()
        .max_by_key(|o| o["stored_len"].as_u64().unwrap_or(0))
        .and_then(|o| o["key"].as_str())
        .map(|k| store_dir.join(k))
        .expect("the delta references an object");
    assert!(victim.starts_with(store_dir.join("objects/blake3")));
    let mut bytes = std::fs::read(&victim).expect("read object");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&victim, bytes).expect("write corrupted object");
    let _ = std::fs::remove_file(dir.join("restored.snap"));
    let miss = json(&Cli(dir).code(3, format!("restore --store {s} --identity id.json --context {delta_ctx} --out restored.snap --json")));
    assert_eq!(miss["reason"], "corrupt", "{miss}");
    assert!(
        !dir.join("restored.snap").exists(),
        "a miss writes no output file"
    );

    // Unknown context: absent.
    let zeros = "0".repeat(64);
    let absent = json(&Cli(dir).code(
        3,
        format!("restore --store {s} --identity id.json --context {zeros} --out x.snap --json"),
    ));
    assert_eq!(absent["reason"], "absent");

    // The restore quarantined the damaged object; the sweep finds the delta
    // root now needs a missing object, invalidates it (exit 4), and a second
    // sweep (`verify` alias) is clean.
    let sweep = json(&Cli(dir).code(4, format!("sweep --store {s} --grace 0s --json")));
    assert_eq!(
        sweep["missing"].as_array().map(Vec::len),
        Some(1),
        "{sweep}"
    );
    let invalidated = sweep["invalidated_roots"].to_string();
    assert!(invalidated.contains(&delta_ctx), "{sweep}");
    let clean = json(&Cli(dir).ok(format!("verify --store {s} --grace 0s --json")));
    assert_none(&clean, &["corrupt", "missing"]);

    // Usage error: missing --store.
    Cli(dir).code(
        2,
        format!("restore --identity id.json --context {zeros} --out x.snap"),
    );

    // The demo, end to end on its own store.
    let demo_store = format!("file://{}", dir.join("demo").display());
    let out = Cli(dir).ok(format!("demo --preset tiny --store {demo_store}"));
    assert!(out.contains("verified"), "{out}");
}

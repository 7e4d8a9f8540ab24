//! Only the commands that say they delete may delete.
//!
//! A read command once accepted `--cold-start clear`, returned a hit, and
//! left an empty store behind. This file guards that no command but
//! `deltapack clear` can empty a store, that `clear` asks for `--yes` (a
//! dry run needs none), and that a refused command leaves every root and
//! object where it was.

use std::path::Path;

use crate::common::{expect_code, files_below, scratch_conversation, words, Cli};

/// The roots and objects below the store directory `dir` (paths relative to
/// it), sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = files_below(dir)
        .iter()
        .map(|p| p.strip_prefix(dir).expect("prefix").display().to_string())
        .collect();
    out.retain(|f| f.starts_with("roots/") || f.starts_with("objects/"));
    out.sort();
    out
}

#[test]
fn only_clear_with_yes_empties_a_store() {
    let (tmp, store) = scratch_conversation(&[("a", 3, 2048)]);
    let dir = tmp.path();
    let s = store.as_str();
    Cli(dir).ok(format!(
        "publish --store {s} --identity id.json --tokens a.tok --snapshot a.snap"
    ));
    let before = files(&dir.join("store"));
    assert!(before.iter().any(|f| f.starts_with("roots/")), "{before:?}");

    // No command accepts a cold-start policy that deletes: a usage error
    // (exit 2) before the store is opened, and nothing changes.
    let restore_line = format!(
        "restore --store {s} --identity id.json --tokens a.tok --out r.snap --cold-start clear"
    );
    let restore = words(&restore_line);
    expect_code(dir, &restore, 2);
    let publish_line = format!("publish --store {s} --identity id.json --tokens a.tok --snapshot a.snap --cold-start clear");
    let publish = words(&publish_line);
    expect_code(dir, &publish, 2);
    Cli(dir).code(2, format!("stats --store {s} --cold-start clear"));
    assert_eq!(
        files(&dir.join("store")),
        before,
        "refused commands change nothing"
    );
    // The policies that do not delete still work.
    let restore_rebuild_line = format!(
        "restore --store {s} --identity id.json --tokens a.tok --out r.snap --cold-start rebuild"
    );
    let restore_rebuild = words(&restore_rebuild_line);
    expect_code(dir, &restore_rebuild, 0);
    assert_eq!(files(&dir.join("store")), before);

    // `clear` without --yes refuses (exit 2), a dry run needs no --yes and
    // changes nothing, and `clear --yes` empties the store.
    Cli(dir).code(2, format!("clear --store {s}"));
    Cli(dir).ok(format!("clear --store {s} --dry-run"));
    assert_eq!(files(&dir.join("store")), before);
    Cli(dir).ok(format!("clear --store {s} --yes"));
    assert!(
        !files(&dir.join("store"))
            .iter()
            .any(|f| f.starts_with("roots/")),
        "clear --yes removed every root"
    );
}

/// `invalidate` and `clear` override holds: they say so, naming the hold,
/// in the dry run and when they remove; and they say that what the roots
/// condemned stays in the store until the grace period ends.
#[test]
fn removals_that_override_holds_say_so() {
    let (tmp, store) = scratch_conversation(&[("a", 7, 1024), ("b", 8, 1024)]);
    let dir = tmp.path();
    let s = store.as_str();
    for t in ["a", "b"] {
        Cli(dir).ok(format!(
            "publish --store {s} --identity id.json --tokens {t}.tok --snapshot {t}.snap"
        ));
    }
    Cli(dir).ok(format!(
        "hold --store {s} --name keep-me --identity id.json --tokens a.tok"
    ));

    // invalidate one context: the dry run names the hold it would override.
    let dry = Cli(dir).ok(format!(
        "invalidate --store {s} --identity id.json --tokens a.tok --dry-run"
    ));
    assert!(dry.contains("would remove 1 held root"), "{dry}");
    assert!(dry.contains("keep-me"), "{dry}");
    assert!(dry.contains("until the grace period"), "{dry}");
    let json: serde_json::Value = serde_json::from_str(&Cli(dir).ok(format!(
        "invalidate --store {s} --identity id.json --tokens a.tok --dry-run --json"
    )))
    .expect("json");
    let held = json["overridden_holds"]
        .as_array()
        .expect("overridden_holds");
    assert_eq!(held.len(), 1, "{json}");
    assert!(
        held[0].as_str().is_some_and(|h| h.ends_with(": keep-me")),
        "{json}"
    );
    assert!(
        json["grace_seconds"].as_u64().is_some_and(|g| g > 0),
        "{json}"
    );

    // For real: the same, in the past tense.
    let done = Cli(dir).ok(format!(
        "invalidate --store {s} --identity id.json --tokens a.tok"
    ));
    assert!(done.contains("removed 1 held root"), "{done}");
    assert!(done.contains("sweep --grace 0s"), "{done}");

    // clear of a store with no held root says nothing of holds.
    let cleared = Cli(dir).ok(format!("clear --store {s} --yes"));
    assert!(!cleared.contains("held root"), "{cleared}");
    assert!(cleared.contains("until the grace period"), "{cleared}");
}

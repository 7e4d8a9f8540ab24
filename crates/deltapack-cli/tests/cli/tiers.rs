//! Tiers through the `deltapack` binary: real processes sharing one node's
//! tier (one tier ledger) in front of one store lose nothing and keep the
//! tier's budget; a publication acknowledged in the tier reaches the store
//! with `tier upload`; `inspect`, `stats`, `tier status` and `config show`
//! say where things are. Why: the tier is shared by every process of a
//! node, and an operator runs it from flags, variables or a file.

use std::path::Path;

use crate::common::{assert_none, conversation, s3_prefix, words, Cli};

/// The store every test here publishes to: the S3 test server when it is
/// there, else a local directory.
fn origin(dir: &Path) -> String {
    match std::env::var("DELTAPACK_TEST_S3_ENDPOINT") {
        Ok(ep) if !ep.is_empty() => s3_prefix("tiers", &ep),
        _ => format!("file://{}", dir.join("origin").display()),
    }
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("json output")
}

#[test]
fn two_processes_share_one_tier_and_its_budget() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let mut turns = Vec::new();
    for lane in 0..2u64 {
        for t in 1..=5u64 {
            turns.push((format!("l{lane}t{t}"), 60 + lane, 1024 * t));
        }
    }
    let named: Vec<(&str, u64, u64)> = turns.iter().map(|(n, s, k)| (n.as_str(), *s, *k)).collect();
    conversation(dir, &named);
    let store = origin(dir);
    let tier = dir.join("tier");
    let budget = 40_000u64;
    let opts = format!(
        "--store {store} --tier {} --tier-budget {budget} --grace 0s",
        tier.display()
    );
    std::thread::scope(|s| {
        for lane in 0..2u64 {
            let opts = &opts;
            s.spawn(move || {
                for t in 1..=5u64 {
                    let mut line = format!(
                        "publish {opts} --max-extent-bytes 4096 --identity id.json \
                         --tokens l{lane}t{t}.tok --snapshot l{lane}t{t}.snap"
                    );
                    if t > 1 {
                        let p = t - 1;
                        line.push_str(&format!(
                            " --base-snapshot l{lane}t{p}.snap --base-tokens l{lane}t{p}.tok"
                        ));
                    }
                    Cli(dir).ok(&line);
                    // Read back through the tier by this lane's process, and
                    // by the other lane's turns too (their fills race ours).
                    for (l, u) in [(lane, t), (1 - lane, t.saturating_sub(1).max(1))] {
                        let out = format!("out{lane}.snap");
                        let o = Cli(dir).run(format!(
                            "restore {opts} --identity id.json --tokens l{l}t{u}.tok --out {out}"
                        ));
                        let code = o.status.code();
                        assert!(code == Some(0) || code == Some(3), "restore: {o:?}");
                        if code == Some(0) {
                            let got = std::fs::read(dir.join(&out)).expect("out");
                            let want =
                                std::fs::read(dir.join(format!("l{l}t{u}.snap"))).expect("in");
                            assert!(got == want, "lane {l} turn {u}: restored bytes differ");
                        }
                    }
                }
            });
        }
    });
    // Nothing lost: every turn restores bit-exactly from the store itself.
    for (name, _, _) in &turns {
        Cli(dir).ok(format!(
            "restore --store {store} --identity id.json --tokens {name}.tok --out check.snap"
        ));
        assert_eq!(
            std::fs::read(dir.join("check.snap")).expect("check"),
            std::fs::read(dir.join(format!("{name}.snap"))).expect("want"),
            "{name}"
        );
    }
    // The tier's budget held, and its ledger agrees with its disk.
    let status = json(&Cli(dir).ok(format!("tier status {opts} --json")));
    let used = status["ledger"]["used_bytes"].as_u64().expect("used");
    assert!(used <= budget, "tier budget held: {status}");
    let sweep = json(&Cli(dir).ok(format!(
        "sweep --store file://{} --grace 0s --json",
        tier.display()
    )));
    assert_none(
        &sweep,
        &["corrupt", "missing", "invalidated_roots", "unusable_roots"],
    );
}

#[test]
fn a_publication_acknowledged_in_the_tier_reaches_the_store_with_tier_upload() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    conversation(dir, &[("a", 71, 2048)]);
    let store = origin(dir);
    let tier = dir.join("tier");
    let opts = format!("--store {store} --tier {} --tier-ack tier", tier.display());
    Cli(dir).ok(format!(
        "publish {opts} --identity id.json --tokens a.tok --snapshot a.snap"
    ));
    Cli(dir).ok(format!("tier upload {opts}"));
    let roots = json(&Cli(dir).ok(format!("inspect {opts} --json")));
    assert_eq!(roots.as_array().map(Vec::len), Some(1), "{roots}");
    assert_eq!(roots[0]["location"], "origin+tier", "{roots}");
    Cli(dir).ok(format!(
        "restore --store {store} --identity id.json --tokens a.tok --out b.snap"
    ));
    assert_eq!(
        std::fs::read(dir.join("a.snap")).expect("a"),
        std::fs::read(dir.join("b.snap")).expect("b")
    );
    let status = json(&Cli(dir).ok(format!("tier status {opts} --json")));
    assert_eq!(status["upload_backlog"], 0, "{status}");

    // Another node's `restore` is served by the store and fills its tier
    // before the process exits.
    let other = format!("--store {store} --tier {}", dir.join("tier-b").display());
    Cli(dir).ok(format!(
        "restore {other} --identity id.json --tokens a.tok --out c.snap"
    ));
    let status = json(&Cli(dir).ok(format!("tier status {other} --json")));
    assert_eq!(status["ledger"]["roots"], 1, "{status}");
}

#[test]
fn tier_options_come_from_flags_variables_and_the_file() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    std::fs::write(
        dir.join("node.toml"),
        "tier = \"/nvme/deltapack\"\ntier-budget = \"500GiB\"\ntier-ack = \"tier\"\n",
    )
    .expect("config");
    let shown =
        Cli(dir).ok("config show --store memory:// --config node.toml --tier-check-interval 2s");
    for want in [
        "/nvme/deltapack",
        "536870912000 bytes",
        "tier-ack              tier",
        "tier-check-interval   2s",
    ] {
        assert!(
            shown
                .lines()
                .any(|l| words(l).join(" ").contains(&words(want).join(" "))),
            "{want:?} in:\n{shown}"
        );
    }
    // A tier option without a tier is refused.
    let o = Cli(dir).run("config show --store memory:// --tier-budget 1GiB");
    assert!(!o.status.success(), "{o:?}");
    // A tier that is not a local directory is refused at open.
    let o = Cli(dir).run("stats --store memory:// --tier memory://");
    assert!(!o.status.success(), "{o:?}");
}

//! The tier's promises through the `deltapack` binary, as an operator meets
//! them: a root invalidated and republished in the store is never served
//! from a node's tier again, and a publication acknowledged in the tier
//! that the store refuses (another node published other bytes at its
//! context) is kept, reported by `tier upload`, and given up only by
//! `tier abandon`, which says it is lost. Why: both were reproduced with the
//! release binary (issue 48): the tier served the invalidated root for
//! ever, and a conflicting upload deleted the tier's copy without a word.

use std::path::Path;

use crate::common::{conversation, s3_prefix, Cli};

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("json output")
}

fn same(dir: &Path, a: &str, b: &str) -> bool {
    std::fs::read(dir.join(a)).expect("a") == std::fs::read(dir.join(b)).expect("b")
}

#[test]
fn an_invalidated_and_republished_root_is_never_served_from_the_tier() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    // `b.snap` is another snapshot of as many tokens: published under
    // a.tok's context, it replaces `a.snap` there.
    conversation(dir, &[("a", 81, 2048), ("b", 82, 2048)]);
    let store = format!("file://{}", dir.join("origin").display());
    let tiered = format!("--store {store} --tier {}", dir.join("tier").display());
    Cli(dir).ok(format!(
        "publish {tiered} --identity id.json --tokens a.tok --snapshot a.snap"
    ));
    Cli(dir).ok(format!(
        "restore {tiered} --identity id.json --tokens a.tok --out got.snap"
    ));
    assert!(same(dir, "got.snap", "a.snap"));
    Cli(dir).ok(format!("invalidate --store {store} --identity id.json"));
    let r = json(&Cli(dir).ok(format!(
        "publish {tiered} --identity id.json --tokens a.tok --snapshot b.snap --json"
    )));
    assert_eq!(r["outcome"], "created", "{r}");
    for _ in 0..3 {
        Cli(dir).ok(format!(
            "restore {tiered} --identity id.json --tokens a.tok --out got.snap"
        ));
        assert!(
            same(dir, "got.snap", "b.snap"),
            "the tier served the replaced root"
        );
    }
}

#[test]
fn a_refused_upload_is_kept_reported_and_abandoned_on_request() {
    let Ok(endpoint) = std::env::var("DELTAPACK_TEST_S3_ENDPOINT") else {
        return;
    };
    if endpoint.is_empty() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    conversation(dir, &[("a", 83, 2048), ("b", 84, 2048)]);
    let store = s3_prefix("tier-trust", &endpoint);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let down = store
        .replace(&endpoint, &format!("http://127.0.0.1:{port}"))
        .replace("?endpoint", "?max_retries=0&retry_timeout=1s&endpoint");
    let tier = format!("--tier {} --tier-ack tier", dir.join("tier").display());
    // Node A acknowledges a.snap in its tier while the store is down …
    let r = json(&Cli(dir).ok(format!(
        "publish --store {down} {tier} --identity id.json --tokens a.tok --snapshot a.snap --json"
    )));
    assert_eq!(r["outcome"], "created", "{r}");
    let (ns, ctx) = (
        r["namespace"].as_str().expect("namespace").to_string(),
        r["context"].as_str().expect("context").to_string(),
    );
    // … and another node publishes b.snap at the same context.
    Cli(dir).ok(format!(
        "publish --store {store} --identity id.json --tokens a.tok --snapshot b.snap"
    ));
    // The upload (this call's round, or the uploader the call's handle
    // starts, whichever gets there first) meets the conflict; the report
    // names every root kept as one.
    let up = json(&Cli(dir).ok(format!("tier upload --store {store} {tier} --json")));
    assert_eq!(up["remaining"], 0, "{up}");
    let named = up["conflicted"][0].as_str().expect("conflicted root");
    assert!(named.contains(&ctx), "{up}");
    // The store's snapshot is what a restore gets, on the node too.
    Cli(dir).ok(format!(
        "restore --store {store} {tier} --identity id.json --tokens a.tok --out got.snap"
    ));
    assert!(same(dir, "got.snap", "b.snap"));
    // The tier kept a.snap, and says so.
    let roots = json(&Cli(dir).ok(format!("inspect --store {store} {tier} --json")));
    let kept = roots
        .as_array()
        .expect("roots")
        .iter()
        .any(|r| r["location"] == "tier (upload conflict)");
    assert!(kept, "{roots}");
    // Abandoning it says it is lost (the store holds other bytes).
    let gone = json(&Cli(dir).ok(format!(
        "tier abandon --store {store} {tier} --namespace {ns} --context {ctx} --json"
    )));
    assert_eq!(gone["abandoned"][0]["state"], "conflict", "{gone}");
    assert_eq!(gone["abandoned"][0]["in_origin"], false, "{gone}");
    let text = Cli(dir).ok(format!("inspect --store {store} {tier} --json"));
    assert!(!text.contains("upload conflict"), "{text}");
}

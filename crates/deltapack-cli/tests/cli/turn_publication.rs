//! `deltapack publish --tail`: a turn published from its new pages alone
//! restores bit-exactly and records the same layered digest as the full
//! snapshot would; a tail of the wrong length is `invalid-input` and writes
//! nothing.

use crate::common::{scratch_conversation, Cli};

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

/// Every layer's pages from the base's settled pages on (payload order).
fn tail(base: &deltapack_format::Snapshot, next: &deltapack_format::Snapshot) -> Vec<u8> {
    let settled = deltapack_format::layer_digest::settled_pages(base.header());
    let mut out = Vec::new();
    for (gi, g) in next.layout().groups.iter().enumerate() {
        for (li, l) in g.layers.iter().enumerate() {
            let r = next.layer_range(gi, li).expect("layer");
            let skip = (settled[gi] * l.bytes_per_page) as usize;
            out.extend_from_slice(&next.payload()[r.start + skip..r.end]);
        }
    }
    out
}

#[test]
fn publish_tail_restores_bit_exactly_and_refuses_a_wrong_tail() {
    let (tmp, store) = scratch_conversation(&[("a", 9, 2048), ("b", 9, 3072)]);
    let dir = tmp.path();
    let s = store.as_str();
    let read = |n: &str| {
        deltapack_format::Snapshot::from_encoded(std::fs::read(dir.join(n)).expect("read"))
            .expect("snapshot")
    };
    let (a, b) = (read("a.snap"), read("b.snap"));
    let t = tail(&a, &b);
    std::fs::write(dir.join("b.tail"), &t).expect("tail");
    std::fs::write(dir.join("short.tail"), &t[1..]).expect("tail");
    Cli(dir).ok(format!(
        "publish --store {s} --identity id.json --tokens a.tok --snapshot a.snap"
    ));
    let turn = |tail: &str, code: i32| {
        Cli(dir).code(code, format!("publish --store {s} --identity id.json --tokens b.tok --tail {tail} --base-snapshot a.snap --base-tokens a.tok --json"))
    };
    // A wrong tail: invalid input, nothing published.
    turn("short.tail", 1);
    Cli(dir).code(
        3,
        format!("restore --store {s} --identity id.json --tokens b.tok --out x.snap"),
    );
    let r = json(&turn("b.tail", 0));
    assert_eq!(r["outcome"], "created");
    assert_eq!(r["schema"], "deltapack-page-delta-manifest/v2.2");
    assert_eq!(r["chain_depth"], 1);
    let want = deltapack_format::layer_digest::of_snapshot(&b)
        .expect("digest")
        .snapshot;
    assert_eq!(r["snapshot_digest"], want.to_string());
    assert!(r["payload_len"].as_u64().expect("len") < b.encoded().len() as u64);
    Cli(dir).ok(format!(
        "restore --store {s} --identity id.json --tokens b.tok --out b.out"
    ));
    assert_eq!(std::fs::read(dir.join("b.out")).expect("out"), b.encoded());
}

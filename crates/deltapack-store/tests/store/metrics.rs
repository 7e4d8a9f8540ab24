//! The metrics a scraper sees: `Store::register_metrics` registers live
//! `prometheus-client` metrics whose encoded series count what the store
//! really did — a restore hit, an absent miss and a corrupt miss (a byte of
//! a real object flipped in the file on disk) under their labels and the
//! root's schema, publications by outcome, histogram counts and sums, the
//! object/byte counters agreeing with `Store::stats` — and ledger gauges
//! that are as of their last update: a publication's budget check sees the
//! ledger before its own root, `stats_report` refreshes them to the totals
//! it returns.

use std::collections::BTreeMap;

use crate::common::*;
use deltapack_format::root;
use deltapack_store::prometheus_client::{encoding::text::encode, registry::Registry};
use deltapack_store::{keys, BackendKind, MissReason, RootFormat, RootStatus};

/// What a v2 publication writes (a layered-digest v2.2 root).
const V2: &str = root::SCHEMA_V2_2;

/// Every sample line of the encoded registry, `series → value`.
fn scrape(registry: &Registry) -> BTreeMap<String, f64> {
    let mut text = String::new();
    encode(&mut text, registry).expect("encode");
    assert!(text.ends_with("# EOF\n"), "{text}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, v) = l.rsplit_once(' ').expect("sample line");
            (series.to_string(), v.parse().expect("value"))
        })
        .collect()
}

fn get(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    *m.get(series)
        .unwrap_or_else(|| panic!("no series {series} in {m:#?}"))
}

fn restores(outcome: &str, reason: &str, schema: &str) -> String {
    format!(
        "deltapack_restore_total{{outcome=\"{outcome}\",reason=\"{reason}\",schema=\"{schema}\"}}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_registry_counts_hits_misses_publications_and_ledger_totals() {
    let t = local(config().with_budget_bytes(Some(1 << 30)));
    let s = &t.store;
    let mut registry = Registry::default();
    s.register_metrics(&mut registry);
    let id = identity("metrics");
    let (a, b) = (turn(31, 2048), turn(32, 2048));
    let (ca, cb) = (ctx(&id, 31, 2048), ctx(&id, 32, 2048));

    // Before anything: the budget is known, no restore was counted.
    let m = scrape(&registry);
    assert_eq!(get(&m, "deltapack_budget_bytes"), (1u64 << 30) as f64);
    assert_eq!(get(&m, "deltapack_restore_duration_seconds_count"), 0.0);
    assert!(!m.keys().any(|k| k.starts_with("deltapack_restore_total")));

    let first = publish_base(s, &id, ca, a.clone(), RootFormat::V2).await;
    publish_base(s, &id, ca, a.clone(), RootFormat::V2).await; // already present
    assert_eq!(restore_bytes(s, &id, ca).await, a.encoded());
    let absent = s
        .restore((&id, ctx(&id, 99, 2048)), Default::default())
        .await
        .expect("restore");
    assert_eq!(absent.miss(), Some(&MissReason::Absent));
    let second = publish_base(s, &id, cb, b.clone(), RootFormat::V2).await;

    let m = scrape(&registry);
    assert_eq!(get(&m, &restores("hit", "none", V2)), 1.0);
    assert_eq!(get(&m, &restores("miss", "absent", "unknown")), 1.0);
    assert_eq!(
        get(
            &m,
            &format!("deltapack_publish_total{{outcome=\"created\",schema=\"{V2}\"}}")
        ),
        2.0
    );
    assert_eq!(
        get(
            &m,
            &format!("deltapack_publish_total{{outcome=\"already_present\",schema=\"{V2}\"}}")
        ),
        1.0
    );
    assert_eq!(get(&m, "deltapack_publish_duration_seconds_count"), 3.0);
    assert_eq!(get(&m, "deltapack_publish_size_bytes_count"), 2.0);
    assert_eq!(
        get(&m, "deltapack_publish_size_bytes_sum"),
        (first.payload_len + second.payload_len) as f64
    );
    // The ledger gauges as of the last update: the second publication's
    // budget check, which saw the first root only.
    assert_eq!(get(&m, "deltapack_ledger_roots"), 1.0);

    // stats_report refreshes them to the totals it returns.
    let report = s.stats_report().await.expect("stats report");
    let m = scrape(&registry);
    assert_eq!(report.ledger.roots, 2);
    assert_eq!(get(&m, "deltapack_ledger_roots"), 2.0);
    assert_eq!(
        get(&m, "deltapack_ledger_objects"),
        report.ledger.objects as f64
    );
    assert_eq!(
        get(&m, "deltapack_ledger_used_bytes"),
        report.ledger.used_bytes as f64
    );
    assert_eq!(
        get(&m, "deltapack_ledger_object_bytes"),
        report.ledger.object_bytes as f64
    );
    assert_eq!(get(&m, "deltapack_ledger_condemned_objects"), 0.0);
    assert_eq!(get(&m, "deltapack_ledger_condemned_bytes"), 0.0);
    assert_eq!(
        get(
            &m,
            &format!(
                "deltapack_ledger_namespace_bytes{{namespace=\"{}\"}}",
                id.namespace().hex()
            )
        ),
        report.ledger.object_bytes as f64
    );
    assert_eq!(
        get(&m, "deltapack_free_bytes"),
        report.free_bytes.expect("local free space") as f64
    );

    // A corrupt miss: one byte of B's extent flipped in its file.
    let BackendKind::Local { root: dir } = s.backend_kind() else {
        panic!("a local store")
    };
    let RootStatus::Found(r) = s.read_root(&id.namespace(), &cb).await.expect("read") else {
        panic!("root of B")
    };
    let (digest, _) = r.summary().expect("summary").objects[0];
    let file = dir.join(keys::object_key(&digest).as_ref());
    let mut bytes = std::fs::read(&file).expect("read object");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&file, &bytes).expect("write object");
    let corrupt = s
        .restore((&id, cb), Default::default())
        .await
        .expect("restore");
    s.settle_quarantines().await;
    assert!(
        matches!(corrupt.miss(), Some(MissReason::Corrupt { .. })),
        "{corrupt:?}"
    );

    let m = scrape(&registry);
    assert_eq!(get(&m, &restores("miss", "corrupt", V2)), 1.0);
    assert_eq!(get(&m, &restores("hit", "none", V2)), 1.0);
    assert_eq!(get(&m, &restores("miss", "absent", "unknown")), 1.0);
    assert_eq!(
        m.keys()
            .filter(|k| k.starts_with("deltapack_restore_total"))
            .count(),
        3,
        "{m:#?}"
    );
    assert_eq!(get(&m, "deltapack_restore_duration_seconds_count"), 3.0);
    assert_eq!(
        get(&m, "deltapack_restore_duration_seconds_bucket{le=\"+Inf\"}"),
        3.0
    );
    assert_eq!(get(&m, "deltapack_restore_size_bytes_count"), 1.0);
    assert_eq!(
        get(&m, "deltapack_restore_size_bytes_sum"),
        a.encoded().len() as f64
    );
    assert_eq!(get(&m, "deltapack_quarantined_total"), 1.0);
    // The plain counters are the ones `stats()` reports.
    let st = s.stats();
    assert_eq!(
        get(&m, "deltapack_objects_read_total"),
        st.objects_read as f64
    );
    assert_eq!(get(&m, "deltapack_read_bytes_total"), st.bytes_read as f64);
    assert!(st.objects_read >= 1);
    assert_eq!(
        get(&m, "deltapack_objects_written_total"),
        st.objects_written as f64
    );
    assert_eq!(
        get(&m, "deltapack_written_bytes_total"),
        st.bytes_written as f64
    );
    assert_eq!(get(&m, "deltapack_roots_written_total"), 2.0);
    assert_eq!(st.hits, 1);
    assert_eq!((st.miss_absent, st.miss_corrupt), (1, 1));
}

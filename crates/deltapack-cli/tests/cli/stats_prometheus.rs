//! `deltapack stats --prometheus` prints the store's `prometheus-client`
//! registry — the same names a process that called
//! `Store::register_metrics` serves — with the ledger gauges as of now.
//!
//! Guards what an operator scraping the CLI relies on: after a CLI publish,
//! a restore hit and an absent miss (each its own process), the output is
//! the OpenMetrics text (`# EOF`-terminated) whose ledger gauges equal the
//! ledger `stats --json` reports, whose accumulated counters carry the
//! other processes' work (persisted in the ledger), and whose per-process
//! counters and histograms are present with this process's own values
//! (it restored nothing). Each CLI restore persists its own counters before
//! exiting, so the hit and the miss are both counted exactly once.

use crate::common::{scratch_conversation, Cli};

/// The value of the series `series` (name and labels exactly as printed).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[test]
fn stats_prometheus_prints_the_registry_after_cli_work() {
    let (tmp, store) = scratch_conversation(&[("a", 7, 2048), ("other", 8, 2048)]);
    let dir = tmp.path();
    let s = store.as_str();
    Cli(dir).ok(format!(
        "publish --store {s} --identity id.json --tokens a.tok --snapshot a.snap"
    ));
    let restore = |tok: &str, code: i32| {
        Cli(dir).code(
            code,
            format!("restore --store {s} --identity id.json --tokens {tok} --out out.snap --json"),
        )
    };
    restore("a.tok", 0);
    restore("other.tok", 3);

    let text = Cli(dir).ok(format!("stats --store {s} --prometheus"));
    let report: serde_json::Value =
        serde_json::from_str(&Cli(dir).ok(format!("stats --store {s} --json")))
            .expect("stats --json");
    assert!(text.ends_with("# EOF\n"), "{text}");

    // Ledger gauges: refreshed by the command, equal to the ledger's totals.
    let ledger = &report["ledger"];
    for (series, field) in [
        ("deltapack_ledger_roots", "roots"),
        ("deltapack_ledger_objects", "objects"),
        ("deltapack_ledger_used_bytes", "used_bytes"),
        ("deltapack_ledger_object_bytes", "object_bytes"),
        ("deltapack_ledger_condemned_objects", "condemned_objects"),
        ("deltapack_ledger_condemned_bytes", "condemned_bytes"),
    ] {
        let want = ledger[field].as_u64().expect(field) as f64;
        assert_eq!(value(&text, series), Some(want), "{series}\n{text}");
    }
    assert_eq!(value(&text, "deltapack_ledger_roots"), Some(1.0));
    // The command read the ledger, so its last contact is now (it said 0:
    // only a lookup set it).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as f64;
    let reached = value(&text, "deltapack_ledger_last_reachable_timestamp_seconds")
        .expect("the last-reachable gauge");
    assert!(
        (now - 120.0..=now + 1.0).contains(&reached),
        "last reachable {reached}, now {now}"
    );
    assert!(value(&text, "deltapack_ledger_used_bytes").is_some_and(|b| b > 0.0));
    assert!(
        value(&text, "deltapack_free_bytes").is_some_and(|b| b > 0.0),
        "{text}"
    );
    let ns = ledger["per_namespace"][0][0].as_str().expect("namespace");
    assert!(
        value(
            &text,
            &format!("deltapack_ledger_namespace_bytes{{namespace=\"{ns}\"}}")
        )
        .is_some_and(|b| b > 0.0),
        "{text}"
    );

    // The counters other processes persisted in the ledger, as `stats
    // --json` reports them (the publication's are certain: one root, one
    // object).
    let persisted: std::collections::BTreeMap<String, u64> = report["counters"]
        .as_array()
        .expect("counters")
        .iter()
        .map(|p| {
            (
                p[0].as_str().expect("name").into(),
                p[1].as_u64().expect("value"),
            )
        })
        .collect();
    assert_eq!(persisted.get("roots_written"), Some(&1), "{report}");
    assert_eq!(persisted.get("objects_written"), Some(&1), "{report}");
    // Every CLI restore persists its counters before it exits (a hit and an
    // absent miss, which never needed the ledger otherwise, each count).
    assert_eq!(persisted.get("hits"), Some(&1), "{report}");
    assert_eq!(persisted.get("misses_absent"), Some(&1), "{report}");
    for counter in ["roots_written", "objects_written", "bytes_written", "hits"] {
        assert_eq!(
            value(
                &text,
                &format!("deltapack_ledger_accumulated{{counter=\"{counter}\"}}")
            ),
            persisted.get(counter).map(|v| *v as f64),
            "{counter}\n{text}"
        );
    }

    // This process's own counters and histograms: there, and zero for what
    // it did not do (it restored and published nothing; a labelled family
    // with no series yet is not printed at all).
    for family in [
        "# TYPE deltapack_objects_read counter",
        "# TYPE deltapack_restore_duration_seconds histogram",
        "# TYPE deltapack_publish_duration_seconds histogram",
        "# TYPE deltapack_restore_size_bytes histogram",
        "# TYPE deltapack_ledger_used_bytes gauge",
    ] {
        assert!(text.contains(family), "{family}\n{text}");
    }
    assert!(!text.contains("deltapack_restore_total"), "{text}");
    assert!(!text.contains("deltapack_publish_total"), "{text}");
    assert_eq!(
        value(&text, "deltapack_restore_duration_seconds_count"),
        Some(0.0)
    );
    assert_eq!(value(&text, "deltapack_objects_written_total"), Some(0.0));
}

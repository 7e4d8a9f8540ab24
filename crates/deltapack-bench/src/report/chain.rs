//! The chain scenario's part of the report: scenario rows, targets and the
//! `results.md` section (its plot is `plot::chain`; its per-N rows and
//! summary, [`ChainSummary`], are in [`super::types`]). Imports the report's
//! types and units, never `report/mod.rs`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::types::{ChainSummary, FloorRef, Row, Scenario, Target};
use super::units::{markdown_table, mib, secs};
use crate::job::Acc;

/// Allowed slowdown of a chain restore over the flat one (local, warm).
const LOCAL_RATIO_TARGET: f64 = 1.15;
/// Allowed S3-like excess of a chain restore over the flat one, in GETs'
/// latencies.
const S3_LATENCIES_TARGET: f64 = 3.0;

/// Group, label and floor of a chain scenario id.
pub(crate) fn describe(
    id: &str,
    latency_ms: u64,
) -> Option<(&'static str, String, Option<String>)> {
    let rest = id.strip_prefix("chain-")?;
    let (who, what) = rest.split_once('-')?;
    let (turns, floor) = match who {
        "flat" => ("flat root".to_string(), None),
        _ => {
            let n: u32 = who.strip_prefix('n')?.parse().ok()?;
            let t = format!("{n}-turn chain");
            let floor = match what {
                "warm" | "warm-into" | "s3like" => Some(format!("chain-flat-{what}")),
                "publish" => Some(format!("chain-n{n}-floor-write")),
                _ => None,
            };
            (t, floor)
        }
    };
    Some(match what {
        "warm" => (
            "restore",
            format!("chain: restore last turn, {turns}, local, warm, fresh process"),
            floor,
        ),
        "warm-into" => (
            "restore",
            format!("chain: restore_into last turn, {turns}, local, warm, fresh process"),
            floor,
        ),
        "s3like" => (
            "restore",
            format!(
                "chain: restore last turn, {turns}, S3-like ({latency_ms} ms/GET), fresh process"
            ),
            floor,
        ),
        "publish" => (
            "publish",
            format!("chain: publish last turn of a {turns}, durable, local"),
            floor,
        ),
        "floor-write" => (
            "floor",
            format!("chain: floor (c) durable write of the last turn's payload, {turns}"),
            None,
        ),
        _ => return None,
    })
}

/// Scenario rows of the chain runs, in report order.
pub(crate) fn scenarios(c: &ChainSummary, accs: &BTreeMap<String, Acc>) -> Vec<Scenario> {
    let mut ids: Vec<String> = ["warm", "warm-into", "s3like"]
        .iter()
        .map(|w| format!("chain-flat-{w}"))
        .collect();
    for n in &c.turns {
        for w in ["warm", "warm-into", "s3like"] {
            ids.push(format!("chain-n{n}-{w}"));
        }
    }
    for n in &c.turns {
        ids.push(format!("chain-n{n}-floor-write"));
        ids.push(format!("chain-n{n}-publish"));
    }
    Scenario::rows(ids, accs, &INFO, |id, a| {
        let (group, label, floor_id) = describe(id, c.latency_ms)?;
        let floor = floor_id.and_then(|f| {
            accs.get(&f).map(|fa| FloorRef {
                id: f,
                ms: Some(fa.median()),
                runs: Some(fa),
            })
        });
        let bytes = a
            .info
            .get(if group == "restore" {
                "result_bytes"
            } else {
                "payload_bytes"
            })
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        let mut note = String::new();
        if group == "restore" && floor.is_some() {
            note = "floor = the same restore of the flat root (ratio: chain / flat)".into();
        }
        if group == "publish" {
            note = "floor = durable write of the same payload bytes in the same child".into();
        }
        if let Some(v) = a.info.get("variant").and_then(|v| v.as_str()) {
            note = format!("fastest variant: {v}");
        }
        let objects = a.info_median(if group == "restore" {
            "objects_read_counter"
        } else {
            "objects"
        });
        Some(Row {
            id: id.to_string(),
            group,
            label,
            bytes,
            objects: objects.map(|x| x as u64),
            floor,
            own_peak: group != "floor",
            bound_bytes: (group == "restore").then_some(c.bound_bytes),
            note,
        })
    })
}

/// The breakdown figures of the chain rows.
const INFO: [&str; 12] = [
    "encode_ms",
    "write_ms",
    "cpu_ms",
    "others_cores",
    "drop_ms",
    "objects_read_counter",
    "bytes_read_counter",
    "warmed_bytes",
    "root_chain_depth",
    "median_ms_1_stream",
    "median_ms_1_direct_stream",
    "median_ms_2_direct_stream",
];

/// The chain targets: chain ≤ 1.15 × flat (local, warm) for every N;
/// S3-like chain ≤ flat + 3 × latency; peak memory ≤ result + 4 × M + M.
pub(crate) fn targets(c: &ChainSummary) -> Vec<Target> {
    let mut t = Vec::new();
    let lat = c.latency_ms as f64;
    for r in &c.rows {
        let mut parts = Vec::new();
        let mut met = None;
        for (what, ms, ratio, flat) in [
            ("new buffer", r.warm_ms, r.warm_ratio, c.flat_warm_ms),
            ("`restore_into`", r.into_ms, r.into_ratio, c.flat_into_ms),
        ] {
            if let (Some(ms), Some(x), Some(f)) = (ms, ratio, flat) {
                parts.push(format!("{what} {x:.2}× ({} vs {})", secs(ms), secs(f)));
                met = Some(met.unwrap_or(true) && x <= LOCAL_RATIO_TARGET);
            }
        }
        if !parts.is_empty() {
            t.push(Target {
                target: format!(
                    "chain of {} turn(s): restore ≤ {LOCAL_RATIO_TARGET} × flat, local, warm",
                    r.turns
                ),
                measured: parts.join("; "),
                met,
            });
        }
    }
    for r in &c.rows {
        if let (Some(s3), Some(d), Some(f)) =
            (r.s3like_ms, r.s3like_minus_flat_ms, c.flat_s3like_ms)
        {
            t.push(Target {
                target: format!(
                    "chain of {} turn(s): restore S3-like ≤ flat + {S3_LATENCIES_TARGET} × {} ms",
                    r.turns, c.latency_ms
                ),
                measured: format!(
                    "{:+.0} ms = {:+.1} × latency ({} vs {})",
                    d,
                    d / lat.max(1.0),
                    secs(s3),
                    secs(f)
                ),
                met: Some(d <= S3_LATENCIES_TARGET * lat),
            });
        }
    }
    for r in &c.rows {
        if let Some(p) = r.peak_bytes {
            t.push(Target {
                target: format!(
                    "chain of {} turn(s): restore peak memory ≤ result + 4×M + M",
                    r.turns
                ),
                measured: format!(
                    "{} ≤ {} ({:.2} × bound; largest of new buffer, `restore_into`, S3-like)",
                    mib(p),
                    mib(c.bound_bytes),
                    p as f64 / c.bound_bytes as f64
                ),
                met: Some(p <= c.bound_bytes),
            });
        }
    }
    t
}

/// The head of the chain table.
const CHAIN_TABLE_HEAD: &str = "\
| turns | last turn (tokens) | last turn payload | store objects | publish last turn | write floor | restore local | / flat | `restore_into` | / flat | S3-like | − flat | in latencies | peak / bound |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

/// The chain section of `results.md`.
pub(crate) fn markdown(c: &ChainSummary, s: &mut String) {
    let _ = writeln!(s, "\n## Chain: restore cost against the number of turns\n");
    let _ = writeln!(
        s,
        "Final snapshot {} tokens ({}), the same for every N; turn k ends at round_to_chunk(k × {} / N) ({}-token chunks); rebasing off. Every restore runs in a fresh child (no base cache), page cache warm. Flat: local {} (`restore_into` {}), S3-like {}. Bound: result + 4×M + M = {}.\n",
        c.final_tokens,
        mib(c.result_bytes),
        c.final_tokens,
        c.chunk_tokens,
        c.flat_warm_ms.map(secs).unwrap_or_default(),
        c.flat_into_ms.map(secs).unwrap_or_default(),
        c.flat_s3like_ms.map(secs).unwrap_or_default(),
        mib(c.bound_bytes),
    );
    let f = |x: Option<f64>| x.map(secs).unwrap_or_default();
    let x = |x: Option<f64>| x.map(|v| format!("{v:.2}×")).unwrap_or_default();
    s.push_str(&markdown_table(CHAIN_TABLE_HEAD, &c.rows, |r| {
        vec![
            r.turns.to_string(),
            r.last_turn_tokens.to_string(),
            mib(r.last_payload_bytes),
            mib(r.store_bytes),
            f(r.publish_ms),
            f(r.floor_write_ms),
            f(r.warm_ms),
            x(r.warm_ratio),
            f(r.into_ms),
            x(r.into_ratio),
            f(r.s3like_ms),
            r.s3like_minus_flat_ms
                .map(|d| format!("{d:+.0} ms"))
                .unwrap_or_default(),
            r.s3like_minus_flat_latencies
                .map(|d| format!("{d:+.1}"))
                .unwrap_or_default(),
            r.peak_over_bound
                .map(|v| format!("{v:.2}"))
                .unwrap_or_default(),
        ]
    }));
    for k in &c.skipped {
        let _ = writeln!(s, "\nNot run: {k}.");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_ids_are_described() {
        let (g, _, f) = describe("chain-n16-warm", 20).expect("warm");
        assert_eq!((g, f.as_deref()), ("restore", Some("chain-flat-warm")));
        let (_, _, f) = describe("chain-n16-warm-into", 20).expect("into");
        assert_eq!(f.as_deref(), Some("chain-flat-warm-into"));
        let (g, _, f) = describe("chain-n4-publish", 20).expect("publish");
        assert_eq!((g, f.as_deref()), ("publish", Some("chain-n4-floor-write")));
        let (g, _, f) = describe("chain-flat-s3like", 20).expect("flat");
        assert_eq!((g, f), ("restore", None));
        assert_eq!(
            describe("chain-n4-floor-write", 20).expect("floor").0,
            "floor"
        );
        assert!(describe("restore-v2-warm", 20).is_none());
    }
}

//! report/units.rs: how the report writes its figures (durations, sizes)
//! and its tables' rows; shared by the report's files, the studies' reports
//! and the runner's progress lines. A leaf: it imports nothing from the
//! report or the runner.

use crate::workload::MIB;

/// A duration in ms, in the report's units (ms, or s with 2 or 1 decimals).
pub(crate) fn secs(ms: f64) -> String {
    if ms >= 10_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.0} ms")
    }
}

/// Bytes in MiB, no decimals.
pub(crate) fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / MIB as f64)
}

/// A markdown table: its `head` (the titles' line and the alignment line),
/// then one line per row with the cells `cells` gives it.
pub(crate) fn markdown_table<R>(
    head: &str,
    rows: impl IntoIterator<Item = R>,
    cells: impl Fn(R) -> Vec<String>,
) -> String {
    let mut table = format!("{head}\n");
    for r in rows {
        table.push_str(&format!("| {} |\n", cells(r).join(" | ")));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_its_head_then_a_line_per_row() {
        let t = markdown_table("| n | square |\n|---:|---:|", [1u64, 3], |n| {
            vec![n.to_string(), (n * n).to_string()]
        });
        assert_eq!(t, "| n | square |\n|---:|---:|\n| 1 | 1 |\n| 3 | 9 |\n");
        assert_eq!(
            markdown_table("| a |\n|---|", Vec::<u64>::new(), |_| vec![]),
            "| a |\n|---|\n"
        );
    }
}

//! report/units.rs: how the report writes its figures (durations, sizes);
//! shared by the report's files and the runner's progress lines. A leaf: it
//! imports nothing from the report or the runner.

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

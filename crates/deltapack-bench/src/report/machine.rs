//! The machine a run measured: cores, memory, CPU, kernel, load, the work
//! dir's filesystem and how fresh result buffers are backed
//! (`machine.txt`, and the `Machine:` line of `results.md`).

use std::path::Path;

use super::types::{Machine, Report};
use crate::measure::threads;

/// The machine's description (cores, memory, CPU, kernel, load, the work
/// dir's filesystem).
pub(crate) fn machine(work: &Path) -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu_model = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let mem_total_bytes = read("/proc/meminfo")
        .lines()
        .find_map(|l| {
            let r = l.strip_prefix("MemTotal:")?;
            r.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
        })
        .unwrap_or(0)
        * 1024;
    // The filesystem holding the work dir, from /proc/mounts (longest prefix).
    let canon = std::fs::canonicalize(work).unwrap_or_else(|_| work.to_path_buf());
    let filesystem = read("/proc/mounts")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && canon.starts_with(f[1]))
                .then(|| (f[1].len(), format!("{} on {} ({})", f[0], f[1], f[2])))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, s)| s)
        .unwrap_or_default();
    Machine {
        nproc: threads(),
        mem_total_bytes,
        cpu_model,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        loadavg_start: read("/proc/loadavg").trim().to_string(),
        loadavg_end: String::new(),
        work_dir: work.display().to_string(),
        filesystem,
        fresh_buffers: fresh_buffers(),
    }
}

/// The fresh-buffer backing in force, and why, in words.
fn fresh_buffers() -> String {
    use deltapack_store::{FreshBacking, FreshBackingReason};
    let (backing, reason) = deltapack_store::fresh_backing();
    let backing = match backing {
        FreshBacking::Huge => "huge pages",
        FreshBacking::Small => "small pages",
    };
    let reason = match reason {
        FreshBackingReason::Configured => "DELTAPACK_FRESH_BUFFERS",
        FreshBackingReason::NoPageReporting => "auto: no free page reporting",
        FreshBackingReason::PageReporting => "auto: free pages reported to the host",
    };
    format!("{backing} ({reason})")
}

/// `machine.txt`.
pub(super) fn machine_txt(r: &Report) -> String {
    let m = &r.machine;
    format!(
        "nproc: {}\nmemory: {} bytes ({:.1} GiB)\ncpu model: {}\nkernel: {}\nload average at start: {}\nload average at end: {}\nwork dir: {}\nfilesystem: {}\nfresh result buffers: {}\n",
        m.nproc,
        m.mem_total_bytes,
        m.mem_total_bytes as f64 / (1u64 << 30) as f64,
        m.cpu_model,
        m.kernel,
        m.loadavg_start,
        m.loadavg_end,
        m.work_dir,
        m.filesystem,
        m.fresh_buffers
    )
}

//! What a child measures about itself: wall time, CPU time (its own and
//! the machine's), resident memory and its peak; and the units and
//! statistics of those figures (ms, the median). A leaf: it imports nothing
//! from this crate (a job's result records a [`CpuSample`], not the other
//! way round).

use std::time::{Duration, Instant};

/// A field of `/proc/self/status` in bytes (`VmHWM`, `VmRSS`), 0 if unknown.
pub(crate) fn proc_status(field: &str) -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(field)?.strip_prefix(':')?;
            let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kb * 1024)
        })
        .unwrap_or(0)
}

/// Resets the process's peak resident set size (`VmHWM`) to its current
/// RSS (`/proc/self/clear_refs` ← 5, Linux ≥ 4.0), so that one process can
/// report the peak of several scenarios in turn.
pub(crate) fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", b"5").is_ok()
}

/// A window for the peak resident memory of one measured section: RSS at
/// its start, and the peak above that ([`reset_peak`] first).
pub(crate) struct PeakWindow {
    rss: u64,
}

impl PeakWindow {
    /// Opens a window (resets the process's peak).
    pub(crate) fn open() -> Self {
        let rss = proc_status("VmRSS");
        reset_peak();
        PeakWindow { rss }
    }

    /// The peak resident memory since [`PeakWindow::open`], above the RSS
    /// then (bytes).
    pub(crate) fn peak(&self) -> u64 {
        proc_status("VmHWM").saturating_sub(self.rss)
    }
}

/// CPU accounting around a timed section: this process's CPU time
/// (`getrusage`) and the whole machine's busy time (`/proc/stat`), so that a
/// report can show how much of the machine *other* processes used meanwhile.
pub(crate) struct CpuSample {
    at: Instant,
    own: Duration,
    busy_jiffies: u64,
}

impl CpuSample {
    /// Starts a section.
    pub(crate) fn now() -> Self {
        CpuSample {
            at: Instant::now(),
            own: own_cpu(),
            busy_jiffies: machine_busy_jiffies(),
        }
    }

    /// The figures of the section since `self`: this process's CPU time and
    /// the average cores other processes kept busy.
    pub(crate) fn finish(&self) -> CpuFigures {
        let wall = self.at.elapsed().as_secs_f64();
        let own = own_cpu().saturating_sub(self.own).as_secs_f64();
        // USER_HZ is 100 on Linux.
        let busy = machine_busy_jiffies().saturating_sub(self.busy_jiffies) as f64 / 100.0;
        let others_cores = (wall > 0.0).then(|| {
            let cores = threads() as f64;
            ((busy - own) / wall).clamp(0.0, cores)
        });
        CpuFigures {
            cpu_ms: own * 1000.0,
            others_cores,
        }
    }
}

/// What a [`CpuSample`] measured over its section.
pub(crate) struct CpuFigures {
    /// CPU time of this process (all threads), ms.
    pub(crate) cpu_ms: f64,
    /// Average cores other processes kept busy (`None` if no wall time
    /// passed).
    pub(crate) others_cores: Option<f64>,
}

/// User + system CPU time of this process (all threads).
fn own_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given; a zeroed
    // `rusage` is a valid value of that plain C struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return Duration::ZERO;
        }
        ru
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Busy jiffies of all CPUs (user, nice, system, irq, softirq, steal).
pub(crate) fn machine_busy_jiffies() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/stat") else {
        return 0;
    };
    let Some(line) = text.lines().next() else {
        return 0;
    };
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    [0usize, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| f.get(i))
        .sum()
}

/// Cores this process may use.
pub(crate) fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Milliseconds of a duration, with microsecond resolution.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// The upper median of durations (the middle one of an odd count).
///
/// # Panics
/// On no durations: every caller measures at least one repetition.
pub(crate) fn median_duration(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The median (NaN for no values).
pub(crate) fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}

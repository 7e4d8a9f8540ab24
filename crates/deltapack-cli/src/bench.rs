//! `deltapack bench`: macro benchmarks on real stores, with the machine's
//! floors measured in the same run on the same bytes.
//!
//! The reference workload (`--scale 1`): a conversation of the `default`
//! synth preset with a base at 4,096 tokens and a result at 262,144 tokens;
//! the delta is ≈ 1.576 GB, published as v2 (24 extents of 64 MiB) and as
//! legacy v1 (1,024 SHA-256 chunk objects). `--scale F` multiplies the result
//! tokens (rounded to a multiple of 256, at least base + 256).
//!
//! Every timed scenario runs in a child process of this binary (the hidden
//! `bench-one` command, one JSON job in, one JSON result out) so that its
//! peak memory is that child's `VmHWM`. Restore scenarios and read floors
//! run round-robin, one repetition per child per round, so that drift on a
//! shared machine hits all of them alike; the median is reported.
//!
//! Floors:
//! * **raw**: read the payload's extent files, one BLAKE3 pass (extent
//!   subtrees on all cores), one copy into a pre-touched buffer;
//! * **spec**: what the specification requires of a delta restore — read +
//!   BLAKE3 of the delta + copy of the result (base spans and tails) into a
//!   fresh buffer + BLAKE3 of the result (also reported with a pre-touched
//!   result buffer);
//! * **durable write**: write + fsync + rename + directory fsync of the same
//!   bytes in 64 MiB files (one and two streams, buffered and with direct
//!   I/O from aligned buffers; the fastest counts).
//!
//! `deltapack bench chain` (also part of `all`) measures restore cost
//! against the number of turns of a conversation: see [`chain`].
//!
//! Outputs (under `--out`): `results.json`, `results.md`, `results.svg` and
//! `machine.txt`, and `chain.svg` when the chain scenario ran.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path as FsPath, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use deltapack_format::delta::{self, CopyOp, PageDelta};
use deltapack_format::snapshot::digest_of_encoding;
use deltapack_format::synth::{self, Preset};
use deltapack_format::{
    CacheIdentity, ContextDigest, ContextHasher, DecodedRoot, Digest, ExtentPlan, ManifestV2,
    Snapshot,
};
use deltapack_store::{
    keys, Backend, BackendKind, BaseInput, PublishRequest, RestoreIntoOutcome, RestoreOptions,
    RestoreOutcome, RootFormat, RootStatus, Store, StoreConfig,
};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjPath;
use object_store::throttle::{ThrottleConfig, ThrottledStore};
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use serde::{Deserialize, Serialize};

use crate::common;

#[path = "bench_chain.rs"]
mod chain;

/// Result tokens of the reference workload (`--scale 1`).
pub(crate) const REFERENCE_RESULT_TOKENS: u64 = 262_144;
/// Base tokens of the workload (every scale).
pub(crate) const BASE_TOKENS: u64 = 4096;
/// Seed of the synthetic conversation.
const SEED: u64 = 1;
/// Piece size of the floors' fused read → hash → copy loop (fits in L2).
const PIECE: usize = 256 * 1024;
/// Objects a restore keeps in flight (`deltapack_store::restore`).
const IN_FLIGHT: u64 = deltapack_store::RESTORE_IN_FLIGHT as u64;
const MIB: u64 = 1 << 20;

/// Which scenarios to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Suite {
    /// v2 and v1 restores (warm, cold, S3-like latency, real S3 if given)
    /// and the read floors.
    Restore,
    /// Durable v2 and v1 publication and the durable write floor.
    Publish,
    /// Restore cost against the number of turns of a conversation (chains
    /// of 1, 4, 16, 64 and 256 deltas ending in the same snapshot) and the
    /// publication of each conversation's last turn.
    Chain,
    /// Restore and publish, the zstd study and chain.
    All,
}

#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// Which scenarios to run.
    #[arg(value_enum)]
    suite: Suite,
    /// Workload scale: 1 is the reference (result at 262,144 tokens, a
    /// ≈ 1.576 GB delta); F multiplies the result tokens.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// `s3://bucket/prefix` (with `?endpoint=…` for a local server): also
    /// publish and restore there (at --s3-scale). Without it,
    /// DELTAPACK_TEST_S3_ENDPOINT (+ DELTAPACK_TEST_S3_BUCKET) is used if set.
    /// A `file://` URL or a path instead chooses where the temporary local
    /// stores are created (default: the system temp dir).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Print the report as JSON on stdout (the files are written either way).
    #[arg(long)]
    json: bool,
    /// Directory for results.json, results.md, results.svg and machine.txt.
    #[arg(long, value_name = "DIR", default_value = "benches/results")]
    out: PathBuf,
    /// Repetitions of every timing (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=25))]
    repeats: u32,
    /// Simulated per-GET latency of the S3-like scenario, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 20)]
    latency_ms: u64,
    /// Scale of the real-S3 scenario (default: min(--scale, 1/16)).
    #[arg(long, value_name = "F")]
    s3_scale: Option<f64>,
    /// Extent size M of the v2 stores (power of two; default 64 MiB).
    #[arg(long, value_name = "BYTES")]
    extent_bytes: Option<u64>,
    /// Keep the temporary stores (their path is printed).
    #[arg(long)]
    keep: bool,
    /// Conversation lengths of the chain scenario (comma-separated; default
    /// 1,4,16,64,256). N = 1 (the flat root) always runs; an N larger than
    /// the final snapshot's number of chunks is skipped.
    #[arg(long, value_name = "N,N,…", value_delimiter = ',')]
    chain_turns: Option<Vec<u32>>,
    /// Before each timed child, wait up to this many seconds for the
    /// machine to be idle (other processes using < 0.3 cores over 1 s), so
    /// that a shared machine's load disturbs the figures less.
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    wait_idle: u64,
}

#[derive(Debug, clap::Args)]
pub(crate) struct BenchOneArgs {
    /// The job, as JSON (written by `deltapack bench`).
    #[arg(long)]
    job: String,
}

// ------------------------------------------------------------------ workload

/// The benchmark conversation at one scale.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Workload {
    base_tokens: u64,
    result_tokens: u64,
    extent_bytes: u64,
}

impl Workload {
    fn from_scale(scale: f64, extent_bytes: u64) -> Result<Self> {
        if !(scale.is_finite() && scale > 0.0 && scale <= 16.0) {
            bail!("--scale must be in (0, 16], got {scale}");
        }
        let raw = (REFERENCE_RESULT_TOKENS as f64 * scale / 256.0).round() as u64 * 256;
        ExtentPlan::new(0, extent_bytes).map_err(|e| anyhow!("--extent-bytes: {e}"))?;
        Ok(Workload {
            base_tokens: BASE_TOKENS,
            result_tokens: raw.max(BASE_TOKENS + 256),
            extent_bytes,
        })
    }

    fn identity() -> CacheIdentity {
        let mut id = CacheIdentity::example();
        id.attributes
            .insert("deltapack.bench".into(), "reference-workload".into());
        id
    }

    fn contexts(&self) -> Result<(ContextDigest, ContextDigest)> {
        let id = Self::identity();
        let n = usize::try_from(self.result_tokens).context("too many tokens")?;
        let tokens = synth::tokens(SEED, n);
        let h = ContextHasher::new(id.namespace(), id.chunk_tokens)?;
        Ok((
            h.digest(&tokens[..self.base_tokens as usize]),
            h.digest(&tokens),
        ))
    }

    fn base(&self) -> Result<Snapshot> {
        Ok(synth::snapshot(Preset::Default, SEED, self.base_tokens)?)
    }

    fn result(&self) -> Result<Snapshot> {
        Ok(synth::snapshot(Preset::Default, SEED, self.result_tokens)?)
    }

    fn config(&self) -> StoreConfig {
        StoreConfig {
            max_extent_bytes: self.extent_bytes,
            ..Default::default()
        }
    }
}

/// Root format, serializable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Fmt {
    V2,
    V1,
}

impl Fmt {
    fn root_format(self) -> RootFormat {
        match self {
            Fmt::V2 => RootFormat::V2,
            Fmt::V1 => RootFormat::V1,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Fmt::V2 => "v2",
            Fmt::V1 => "v1",
        }
    }
}

/// Where a restore reads from.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum Source {
    /// Local store, page cache warm.
    Warm { dir: PathBuf },
    /// Local store, its files evicted from the page cache before each run.
    Cold { dir: PathBuf },
    /// Local files through `object_store` with a per-GET latency.
    Throttled { dir: PathBuf, latency_ms: u64 },
    /// A real S3-compatible store.
    S3 { url: String },
}

/// Which read floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum ReadFloor {
    Raw,
    Spec,
    SpecTouched,
}

/// One unit of work for a child process.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "kebab-case")]
enum Job {
    /// Durable publication of the delta as v2 and v1 and the durable write
    /// floor, interleaved round by round in one process (the snapshots are
    /// synthesized once); the stores of the last round are kept.
    PublishSuite {
        w: Workload,
        keep_v2: PathBuf,
        keep_v1: PathBuf,
        scratch: PathBuf,
        rounds: u32,
    },
    ReadFloor {
        w: Workload,
        store_v2: PathBuf,
        floor: ReadFloor,
        cold: bool,
    },
    Restore {
        w: Workload,
        format: Fmt,
        source: Source,
        /// Restore into a caller-provided, already resident buffer
        /// (`Store::restore_into`) instead of a new one.
        #[serde(default)]
        into: bool,
    },
    S3Publish {
        w: Workload,
        url_v2: String,
        url_v1: String,
    },
    S3Cleanup {
        urls: Vec<String>,
    },
    Zstd {
        w: Workload,
        store_v2: PathBuf,
        repeats: u32,
    },
    /// Publication of one conversation of the chain scenario.
    ChainPublish {
        spec: chain::PublishSpec,
    },
    /// One restore of the last turn of a chain scenario conversation.
    ChainRestore {
        spec: chain::RestoreSpec,
    },
}

/// What a child reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct JobOutput {
    /// Timed repetitions, milliseconds.
    times_ms: Vec<f64>,
    /// VmRSS when the job started.
    rss_start: u64,
    /// VmHWM when the job ended.
    peak: u64,
    /// Job-specific figures.
    info: BTreeMap<String, serde_json::Value>,
    /// Results of several scenarios run by one job: scenario id → runs.
    #[serde(default)]
    sub: BTreeMap<String, Vec<JobOutput>>,
}

impl JobOutput {
    fn put(&mut self, k: &str, v: impl Serialize) {
        self.info.insert(
            k.to_string(),
            serde_json::to_value(v).unwrap_or(serde_json::Value::Null),
        );
    }
    fn num(&self, k: &str) -> Option<f64> {
        self.info.get(k).and_then(|v| v.as_f64())
    }
}

// ------------------------------------------------------------------ report

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
struct Scenario {
    /// Stable identifier.
    id: String,
    /// Human label.
    label: String,
    /// `floor`, `restore` or `publish`.
    group: &'static str,
    /// Median time (ms).
    median_ms: f64,
    /// Every repetition (ms).
    times_ms: Vec<f64>,
    /// Bytes moved (payload).
    bytes: u64,
    /// bytes / median, GB/s.
    gb_per_s: f64,
    /// Objects read or written.
    objects: Option<u64>,
    /// Floor this scenario is compared with.
    floor_id: Option<String>,
    /// That floor's median (ms).
    floor_ms: Option<f64>,
    /// median / floor (1.0 = at the floor).
    ratio: Option<f64>,
    /// Median CPU time (all threads of the child) of the timed section (ms):
    /// unlike wall time, barely affected by other load on a shared machine.
    cpu_ms: Option<f64>,
    /// cpu_ms / the floor's cpu_ms (restores only).
    cpu_ratio: Option<f64>,
    /// Peak resident memory of the child (VmHWM, bytes).
    peak_bytes: Option<u64>,
    /// Resident memory when the child started.
    baseline_bytes: Option<u64>,
    /// Bound the peak is held against.
    bound_bytes: Option<u64>,
    /// Extra figures (breakdowns).
    info: BTreeMap<String, serde_json::Value>,
    /// Notes.
    note: String,
}

/// One target of the issue.
#[derive(Debug, Clone, Serialize)]
struct Target {
    target: String,
    measured: String,
    met: Option<bool>,
}

/// Machine description.
#[derive(Debug, Clone, Serialize)]
struct Machine {
    nproc: usize,
    mem_total_bytes: u64,
    cpu_model: String,
    kernel: String,
    loadavg_start: String,
    loadavg_end: String,
    work_dir: String,
    filesystem: String,
}

/// zstd figures for one data set and level.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ZstdRow {
    data: String,
    level: i32,
    raw_bytes: u64,
    stored_bytes: u64,
    ratio: f64,
    compress_mb_s: f64,
    decompress_mb_s: f64,
    /// Whether the library's rule (saves ≥ 1/16) would store it as zstd.
    stored_as_zstd: bool,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
struct Report {
    deltapack_version: &'static str,
    suite: String,
    scale: f64,
    base_tokens: u64,
    result_tokens: u64,
    base_bytes: u64,
    result_bytes: u64,
    payload_bytes: u64,
    extent_bytes: u64,
    v2_extents: u64,
    v1_chunks: u64,
    repeats: u32,
    latency_ms: u64,
    s3: Option<serde_json::Value>,
    machine: Machine,
    scenarios: Vec<Scenario>,
    targets: Vec<Target>,
    zstd: Vec<ZstdRow>,
    /// The chain scenario (restore cost against the number of turns).
    #[serde(skip_serializing_if = "Option::is_none")]
    chain: Option<chain::ChainSummary>,
    total_s: f64,
}

// ------------------------------------------------------------------ helpers

/// A field of `/proc/self/status` in bytes (`VmHWM`, `VmRSS`), 0 if unknown.
fn proc_status(field: &str) -> u64 {
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

/// CPU accounting around a timed section: this process's CPU time
/// (`getrusage`) and the whole machine's busy time (`/proc/stat`), so that a
/// report can show how much of the machine *other* processes used meanwhile.
struct CpuSample {
    at: Instant,
    own: Duration,
    busy_jiffies: u64,
}

impl CpuSample {
    fn now() -> Self {
        CpuSample {
            at: Instant::now(),
            own: own_cpu(),
            busy_jiffies: machine_busy_jiffies(),
        }
    }

    /// Adds `cpu_ms` (this process) and `others_cores` (average cores other
    /// processes kept busy) for the section since `self`.
    fn record(&self, out: &mut JobOutput) {
        let wall = self.at.elapsed().as_secs_f64();
        let own = own_cpu().saturating_sub(self.own).as_secs_f64();
        // USER_HZ is 100 on Linux.
        let busy = machine_busy_jiffies().saturating_sub(self.busy_jiffies) as f64 / 100.0;
        out.put("cpu_ms", own * 1000.0);
        if wall > 0.0 {
            let cores = threads() as f64;
            out.put("others_cores", ((busy - own) / wall).clamp(0.0, cores));
        }
    }
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
fn machine_busy_jiffies() -> u64 {
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

/// Calls `f` on every regular file below `dir` (depth first).
pub(crate) fn for_each_file(dir: &FsPath, mut f: impl FnMut(&FsPath) -> Result<()>) -> Result<()> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let entry = entry?;
            let ft = entry.file_type()?;
            if ft.is_dir() {
                stack.push(entry.path());
            } else if ft.is_file() {
                f(&entry.path())?;
            }
        }
    }
    Ok(())
}

/// Drops every file under `dir` from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`). Returns the number of files.
fn evict(dir: &FsPath) -> Result<usize> {
    let mut n = 0;
    for_each_file(dir, |p| {
        let f = File::open(p)?;
        fadvise_dontneed(&f).with_context(|| format!("evicting {}", p.display()))?;
        n += 1;
        Ok(())
    })?;
    Ok(n)
}

#[cfg(target_os = "linux")]
fn fadvise_dontneed(f: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the duration of the call;
    // posix_fadvise only gives the kernel advice about cached pages.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

#[cfg(not(target_os = "linux"))]
fn fadvise_dontneed(_f: &File) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "cold-cache scenarios need posix_fadvise (Linux)",
    ))
}

fn median(v: &[f64]) -> f64 {
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

fn secs(ms: f64) -> String {
    if ms >= 10_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.0} ms")
    }
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / MIB as f64)
}

fn open_local(dir: &FsPath, w: &Workload) -> Result<Store> {
    open_local_with(dir, w.config())
}

fn open_local_with(dir: &FsPath, config: StoreConfig) -> Result<Store> {
    common::open_store(&format!("file://{}", dir.display()), config)
}

/// Reads the v2 delta manifest of the workload from a local store.
async fn v2_manifest(dir: &FsPath, w: &Workload) -> Result<ManifestV2> {
    let store = open_local(dir, w)?;
    let (_, ctx) = w.contexts()?;
    match store
        .read_root(&Workload::identity().namespace(), &ctx)
        .await?
    {
        RootStatus::Found(d) => match *d {
            DecodedRoot::V2(m) => Ok(m),
            other => bail!("expected a v2 root, found {:?}", other.summary()),
        },
        RootStatus::Absent => bail!("no delta root in {}", dir.display()),
        RootStatus::Unusable(r) => bail!("delta root unusable: {r}"),
    }
}

/// One extent file of a local v2 store.
#[derive(Debug, Clone)]
struct ExtentFile {
    path: PathBuf,
    offset: u64,
    len: u64,
    name: Digest,
}

fn extent_files(dir: &FsPath, m: &ManifestV2) -> Vec<ExtentFile> {
    m.extents
        .iter()
        .map(|e| ExtentFile {
            path: dir.join(keys::object_key(&e.object_digest()).as_ref()),
            offset: e.offset,
            len: e.raw_len,
            name: e.raw_digest,
        })
        .collect()
}

/// A contiguous copy from payload offset `src` to buffer offset `dst`.
#[derive(Debug, Clone, Copy)]
struct Span {
    src: u64,
    dst: u64,
    len: u64,
}

/// The part of the destination buffer one extent writes.
struct Region<'a> {
    buf: &'a mut [u8],
    dst_start: u64,
    pieces: Vec<Span>,
}

impl Region<'_> {
    fn place(&mut self, src: u64, bytes: &[u8]) {
        let end = src + bytes.len() as u64;
        for p in &self.pieces {
            let lo = p.src.max(src);
            let hi = (p.src + p.len).min(end);
            if lo < hi {
                let d = (p.dst + (lo - p.src) - self.dst_start) as usize;
                let s = (lo - src) as usize;
                let n = (hi - lo) as usize;
                self.buf[d..d + n].copy_from_slice(&bytes[s..s + n]);
            }
        }
    }
}

/// Splits `buf` into the disjoint regions each extent writes (spans map
/// payload bytes monotonically into the buffer).
fn regions<'a>(buf: &'a mut [u8], spans: &[Span], files: &[ExtentFile]) -> Vec<Region<'a>> {
    let mut out = Vec::with_capacity(files.len());
    let mut rest: &mut [u8] = buf;
    let mut consumed = 0u64;
    for f in files {
        let (a, b) = (f.offset, f.offset + f.len);
        let pieces: Vec<Span> = spans
            .iter()
            .filter_map(|s| {
                let lo = s.src.max(a);
                let hi = (s.src + s.len).min(b);
                (lo < hi).then(|| Span {
                    src: lo,
                    dst: s.dst + (lo - s.src),
                    len: hi - lo,
                })
            })
            .collect();
        let (start, end) = match (pieces.first(), pieces.last()) {
            (Some(f), Some(l)) => (f.dst, l.dst + l.len),
            _ => (consumed, consumed),
        };
        let taken = std::mem::take(&mut rest);
        let (_, tail) = taken.split_at_mut((start - consumed) as usize);
        let (mine, tail) = tail.split_at_mut((end - start) as usize);
        rest = tail;
        consumed = end;
        out.push(Region {
            buf: mine,
            dst_start: start,
            pieces,
        });
    }
    out
}

/// The floors' fused loop: every extent file read in `PIECE`-sized
/// positioned reads into a per-thread buffer, hashed as its BLAKE3 subtree
/// while in cache and copied to its region; extents spread over `threads`
/// std threads. Returns the verified extent names in order.
fn fused(
    plan: &ExtentPlan,
    files: &[ExtentFile],
    regions: Vec<Region<'_>>,
    threads: usize,
) -> Result<Vec<Digest>> {
    use std::os::unix::fs::FileExt;
    let slots: Vec<Mutex<Option<Region<'_>>>> =
        regions.into_iter().map(|r| Mutex::new(Some(r))).collect();
    let next = AtomicUsize::new(0);
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, files.len().max(1)) {
            s.spawn(|| {
                let mut scratch = vec![0u8; PIECE];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(f) = files.get(i) else { break };
                    let Some(mut region) = slots[i].lock().ok().and_then(|mut r| r.take()) else {
                        break;
                    };
                    let r = (|| -> Result<()> {
                        let file = File::open(&f.path)?;
                        let mut h = plan.hasher(i as u64);
                        let mut pos = 0u64;
                        while pos < f.len {
                            let want = ((f.len - pos) as usize).min(PIECE);
                            let buf = &mut scratch[..want];
                            file.read_exact_at(buf, pos)?;
                            h.update(buf);
                            region.place(f.offset + pos, buf);
                            pos += want as u64;
                        }
                        h.verify(&format!("extent {i}"), &f.name)?;
                        Ok(())
                    })();
                    if let Err(e) = r {
                        if let Ok(mut v) = errors.lock() {
                            v.push(format!("{}: {e:#}", f.path.display()));
                        }
                        next.store(files.len(), Ordering::Relaxed);
                    }
                }
            });
        }
    });
    if let Some(e) = errors.into_inner().ok().and_then(|mut v| v.pop()) {
        bail!("floor read failed: {e}");
    }
    Ok(files.iter().map(|f| f.name).collect())
}

fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// A zero-filled buffer whose pages are not touched yet (calloc → fresh
/// mmap pages for large sizes): page faults happen where it is written.
fn fresh_buffer(len: usize) -> Vec<u8> {
    vec![0u8; len]
}

/// A buffer whose pages are all resident.
fn touched_buffer(len: usize) -> Vec<u8> {
    vec![1u8; len]
}

/// An `ObjectStore` that turns local-file GETs into a streamed body of
/// [`BODY_CHUNK`] pieces, as an HTTP GET delivers it (`ThrottledStore` only
/// wraps streams).
///
/// Earlier versions delivered each object as one in-memory body; that
/// charged every 64 MiB GET a fresh 64 MiB allocation (page faults) that
/// no real S3 client makes, so S3-like restores paid for the emulation.
/// Body chunk size of the S3-like emulation.
const BODY_CHUNK: u64 = 256 * 1024;

#[derive(Debug)]
struct StreamedObjects {
    inner: Arc<dyn ObjectStore>,
}

impl std::fmt::Display for StreamedObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamedObjects({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for StreamedObjects {
    async fn put_opts(
        &self,
        location: &ObjPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let head = options.head;
        let r = self.inner.get_opts(location, options).await?;
        if matches!(r.payload, GetResultPayload::Stream(_)) {
            return Ok(r);
        }
        let (meta, range, attributes, extensions) = (
            r.meta.clone(),
            r.range.clone(),
            r.attributes.clone(),
            r.extensions.clone(),
        );
        let body: BoxStream<'static, object_store::Result<Bytes>> = match r.payload {
            _ if head => futures::stream::empty().boxed(),
            GetResultPayload::File(file, _) => {
                let file = Arc::new(file);
                let end = range.end;
                futures::stream::try_unfold(range.start, move |pos| {
                    let file = file.clone();
                    async move {
                        if pos >= end {
                            return Ok(None);
                        }
                        let n = (end - pos).min(BODY_CHUNK);
                        let chunk = tokio::task::spawn_blocking(move || {
                            use std::os::unix::fs::FileExt;
                            let mut v = vec![0u8; n as usize];
                            file.read_exact_at(&mut v, pos).map(|_| Bytes::from(v))
                        })
                        .await
                        .map_err(std::io::Error::other)
                        .and_then(|r| r)
                        .map_err(|e| object_store::Error::Generic {
                            store: "bench",
                            source: Box::new(e),
                        })?;
                        Ok(Some((chunk, pos + n)))
                    }
                })
                .boxed()
            }
            GetResultPayload::Stream(s) => s,
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(body),
            meta,
            range,
            attributes,
            extensions,
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjPath>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&ObjPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjPath>,
    ) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &ObjPath,
        to: &ObjPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

// ------------------------------------------------------------------ child jobs

/// Runs `deltapack bench-one`: one job, its result as one JSON line.
pub(crate) async fn run_one(args: BenchOneArgs) -> Result<ExitCode> {
    let job: Job = serde_json::from_str(&args.job).context("bench-one: bad --job JSON")?;
    let rss_start = proc_status("VmRSS");
    let mut out = match job {
        Job::PublishSuite {
            w,
            keep_v2,
            keep_v1,
            scratch,
            rounds,
        } => job_publish_suite(w, &keep_v2, &keep_v1, &scratch, rounds).await?,
        Job::ReadFloor {
            w,
            store_v2,
            floor,
            cold,
        } => job_read_floor(w, &store_v2, floor, cold).await?,
        Job::Restore {
            w,
            format,
            source,
            into,
        } => job_restore(w, format, source, into).await?,
        Job::S3Publish { w, url_v2, url_v1 } => job_s3_publish(w, &url_v2, &url_v1).await?,
        Job::S3Cleanup { urls } => job_s3_cleanup(&urls).await?,
        Job::Zstd {
            w,
            store_v2,
            repeats,
        } => job_zstd(w, &store_v2, repeats).await?,
        Job::ChainPublish { spec } => chain::job_publish(spec).await?,
        Job::ChainRestore { spec } => chain::job_restore(spec).await?,
    };
    out.rss_start = rss_start;
    out.peak = proc_status("VmHWM");
    println!("{}", serde_json::to_string(&out)?);
    Ok(ExitCode::SUCCESS)
}

fn request(
    w: &Workload,
    format: Fmt,
    base: &Arc<Snapshot>,
    result: Option<&Arc<Snapshot>>,
) -> Result<PublishRequest> {
    let (bctx, rctx) = w.contexts()?;
    Ok(PublishRequest {
        identity: Workload::identity(),
        context: if result.is_some() { rctx } else { bctx },
        snapshot: result.unwrap_or(base).clone(),
        base: result.map(|_| BaseInput {
            context: bctx,
            snapshot: base.clone(),
        }),
        format: format.root_format(),
    })
}

async fn synth_pair(w: Workload) -> Result<(Arc<Snapshot>, Arc<Snapshot>)> {
    tokio::task::spawn_blocking(move || -> Result<_> {
        Ok((Arc::new(w.base()?), Arc::new(w.result()?)))
    })
    .await
    .context("synthesis task")?
}

/// Resets the process's peak resident set size (`VmHWM`) to its current
/// RSS (`/proc/self/clear_refs` ← 5, Linux ≥ 4.0), so that one process can
/// report the peak of several scenarios in turn.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", b"5").is_ok()
}

/// One timed durable publication of the delta into a fresh store.
async fn publish_once(
    w: &Workload,
    format: Fmt,
    dir: &FsPath,
    base: &Arc<Snapshot>,
    result: &Arc<Snapshot>,
) -> Result<JobOutput> {
    let store = open_local(dir, w)?;
    store.publish(request(w, format, base, None)?).await?;
    // Steady state: a store in use has its object fan-out directories
    // (`objects/<alg>/<hh>/`); a fresh store creates (and fsyncs) each on
    // first use, which is not what a publication costs in service.
    for alg in ["blake3", "sha256"] {
        for b in 0..=255u8 {
            std::fs::create_dir_all(dir.join("objects").join(alg).join(format!("{b:02x}")))?;
        }
    }
    for d in [
        dir.join("objects/blake3"),
        dir.join("objects/sha256"),
        dir.join("objects"),
    ] {
        File::open(&d)?.sync_all()?;
    }
    let mut out = JobOutput::default();
    reset_peak();
    out.rss_start = proc_status("VmRSS");
    let cpu = CpuSample::now();
    let t = Instant::now();
    let receipt = store
        .publish(request(w, format, base, Some(result))?)
        .await?;
    out.times_ms.push(common::ms(t.elapsed()));
    cpu.record(&mut out);
    out.peak = proc_status("VmHWM");
    if receipt.outcome != deltapack_store::PublishOutcome::Created {
        bail!("publication was {:?}, not created", receipt.outcome);
    }
    out.put("encode_ms", common::ms(receipt.encode_time));
    out.put("write_ms", common::ms(receipt.write_time));
    out.put("objects", receipt.objects_written);
    out.put("payload_bytes", receipt.payload_len);
    Ok(out)
}

async fn job_publish_suite(
    w: Workload,
    keep_v2: &FsPath,
    keep_v1: &FsPath,
    scratch: &FsPath,
    rounds: u32,
) -> Result<JobOutput> {
    let (base, result) = synth_pair(w).await?;
    let mut out = JobOutput::default();
    let mut sub: BTreeMap<String, Vec<JobOutput>> = BTreeMap::new();
    let mut add = |id: &str, o: JobOutput| sub.entry(id.to_string()).or_default().push(o);
    for round in 0..rounds {
        // The write floor on the same bytes (the encoded delta, cut into
        // extent-sized files), one and two streams.
        let (b, r, m) = (base.clone(), result.clone(), w.extent_bytes as usize);
        let chunks = tokio::task::spawn_blocking(move || -> Result<Vec<Vec<u8>>> {
            let d = delta::encode(256, &b, &r)?;
            Ok(d.chunks(m).map(<[u8]>::to_vec).collect())
        })
        .await
        .context("delta encoder task")??;
        for streams in [2usize, 1] {
            let dir = scratch.join(format!("floor-{streams}-{round}"));
            let chunks_ref = &chunks;
            let o = tokio::task::block_in_place(|| -> Result<JobOutput> {
                let mut o = JobOutput::default();
                let cpu = CpuSample::now();
                let t = Instant::now();
                durable_write(&dir, chunks_ref, streams)?;
                o.times_ms.push(common::ms(t.elapsed()));
                cpu.record(&mut o);
                std::fs::remove_dir_all(&dir)?;
                o.put("files", chunks_ref.len());
                o.put(
                    "payload_bytes",
                    chunks_ref.iter().map(|c| c.len() as u64).sum::<u64>(),
                );
                Ok(o)
            })?;
            add(&format!("floor-write-{streams}"), o);
        }
        // The same with direct I/O (O_DIRECT) from 4 KiB-aligned copies of
        // the chunks (prepared untimed): no page-cache copy at all.
        let aligned: Vec<(Vec<u8>, usize)> = chunks.iter().map(|c| aligned_copy(c)).collect();
        drop(chunks);
        for streams in [2usize, 1] {
            let dir = scratch.join(format!("floor-direct-{streams}-{round}"));
            let o = tokio::task::block_in_place(|| -> Result<Option<JobOutput>> {
                let mut o = JobOutput::default();
                let cpu = CpuSample::now();
                let t = Instant::now();
                let supported = durable_write_direct(&dir, &aligned, streams)?;
                o.times_ms.push(common::ms(t.elapsed()));
                cpu.record(&mut o);
                std::fs::remove_dir_all(&dir)?;
                o.put("files", aligned.len());
                Ok(supported.then_some(o))
            })?;
            // A filesystem without O_DIRECT has no direct floor.
            if let Some(o) = o {
                add(&format!("floor-write-{streams}-direct"), o);
            }
        }
        drop(aligned);
        for (format, keep) in [(Fmt::V2, keep_v2), (Fmt::V1, keep_v1)] {
            let dir = scratch.join(format!("{}-{round}", format.name()));
            let o = publish_once(&w, format, &dir, &base, &result).await?;
            add(&format!("publish-{}", format.name()), o);
            if round + 1 == rounds {
                if keep.exists() {
                    std::fs::remove_dir_all(keep)?;
                }
                std::fs::rename(&dir, keep)?;
            } else {
                std::fs::remove_dir_all(&dir)?;
            }
        }
    }
    // Where a publication's CPU goes, piece by piece (same bytes, wall ms).
    let (b, r, m) = (base.clone(), result.clone(), w.extent_bytes);
    let costs = tokio::task::spawn_blocking(move || -> Result<BTreeMap<String, f64>> {
        let mut c = BTreeMap::new();
        let mut time = |k: &str, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
            let t = Instant::now();
            f()?;
            c.insert(k.to_string(), common::ms(t.elapsed()));
            Ok(())
        };
        time("cost_result_digest_ms", &mut || {
            std::hint::black_box(r.digest());
            Ok(())
        })?;
        let mut d = Vec::new();
        time("cost_delta_encode_ms", &mut || {
            d = delta::encode(256, &b, &r)?;
            Ok(())
        })?;
        let plan = ExtentPlan::new(d.len() as u64, m)?;
        time("cost_extent_names_1_thread_ms", &mut || {
            for i in 0..plan.count() {
                let rg = plan.range(i);
                std::hint::black_box(plan.name(
                    i,
                    &d[rg.start as usize..rg.end as usize],
                    false,
                )?);
            }
            Ok(())
        })?;
        time("cost_copy_into_fresh_buffer_ms", &mut || {
            let mut v = fresh_buffer(d.len());
            v.copy_from_slice(&d);
            std::hint::black_box(&v);
            Ok(())
        })?;
        Ok(c)
    })
    .await
    .context("publication cost task")??;
    if let Some(runs) = sub.get_mut("publish-v2") {
        for run in runs.iter_mut() {
            for (k, v) in &costs {
                run.put(k, v);
            }
        }
    }
    out.sub = sub;
    out.put("base_bytes", base.encoded().len());
    out.put("result_bytes", result.encoded().len());
    Ok(out)
}

/// A copy of `c` starting at a 4 KiB boundary inside the returned vector
/// (at the returned offset), for direct I/O.
fn aligned_copy(c: &[u8]) -> (Vec<u8>, usize) {
    let mut v = vec![0u8; c.len() + 4096];
    let off = v.as_ptr().align_offset(4096);
    v[off..off + c.len()].copy_from_slice(c);
    (v, off)
}

/// Writes chunks durably with direct I/O on `streams` threads: `O_DIRECT`
/// write of the 4 KiB-aligned part, a buffered write of the tail, fsync,
/// rename, directory fsync. Returns `false` (having written nothing) if the
/// filesystem refuses `O_DIRECT`.
fn durable_write_direct(dir: &FsPath, chunks: &[(Vec<u8>, usize)], streams: usize) -> Result<bool> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    std::fs::create_dir_all(dir)?;
    let probe = dir.join("probe");
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
    {
        Ok(_) => std::fs::remove_file(&probe)?,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    write_files_durably(dir, chunks.len(), streams, |i, tmp| {
        let (v, off) = &chunks[i];
        let len = v.len() - 4096;
        let c = &v[*off..*off + len];
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(tmp)?;
        let aligned = len - len % 4096;
        f.write_all_at(&c[..aligned], 0)?;
        if aligned == len {
            return Ok(f);
        }
        drop(f);
        let t = std::fs::OpenOptions::new().write(true).open(tmp)?;
        t.write_all_at(&c[aligned..], aligned as u64)?;
        Ok(t)
    })?;
    Ok(true)
}

/// Writes `chunks` durably into `dir` as files: write, fsync, rename,
/// directory fsync — on `streams` threads.
fn durable_write(dir: &FsPath, chunks: &[Vec<u8>], streams: usize) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    write_files_durably(dir, chunks.len(), streams, |i, tmp| {
        let mut f = File::create(tmp)?;
        f.write_all(&chunks[i])?;
        Ok(f)
    })
}

/// The durable-write protocol shared by the write floors: on `streams`
/// threads, `write(i, tmp)` writes file `i` under a temporary name and
/// returns it; then fsync, rename to `i`, fsync the directory.
fn write_files_durably(
    dir: &FsPath,
    files: usize,
    streams: usize,
    write: impl Fn(usize, &FsPath) -> std::io::Result<File> + Sync,
) -> Result<()> {
    let next = AtomicUsize::new(0);
    let dir_lock = Mutex::new(File::open(dir)?);
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..streams.clamp(1, files.max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= files {
                    break;
                }
                let r = (|| -> std::io::Result<()> {
                    let tmp = dir.join(format!("{i}.tmp"));
                    let f = write(i, &tmp)?;
                    f.sync_all()?;
                    drop(f);
                    std::fs::rename(&tmp, dir.join(format!("{i}")))?;
                    match dir_lock.lock() {
                        Ok(d) => d.sync_all(),
                        Err(p) => p.into_inner().sync_all(),
                    }
                })();
                if let Err(e) = r {
                    if let Ok(mut v) = errors.lock() {
                        v.push(e.to_string());
                    }
                    break;
                }
            });
        }
    });
    if let Some(e) = errors.into_inner().ok().and_then(|mut v| v.pop()) {
        bail!("durable write floor failed: {e}");
    }
    Ok(())
}

async fn job_read_floor(
    w: Workload,
    store_v2: &FsPath,
    floor: ReadFloor,
    cold: bool,
) -> Result<JobOutput> {
    let m = v2_manifest(store_v2, &w).await?;
    let files = extent_files(store_v2, &m);
    let plan = ExtentPlan::new(m.payload_len, m.max_extent_bytes)?;
    let dir = store_v2.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<JobOutput> {
        let mut out = JobOutput::default();
        let payload_len = usize::try_from(m.payload_len)?;
        // Untimed preparation: buffers, the base and the copy plan.
        let (spans, result_len, base, delta_plan) = match floor {
            ReadFloor::Raw => (
                vec![Span {
                    src: 0,
                    dst: 0,
                    len: m.payload_len,
                }],
                payload_len,
                None,
                None,
            ),
            ReadFloor::Spec | ReadFloor::SpecTouched => {
                let base = w.base()?;
                let first = files.first().ok_or_else(|| anyhow!("empty payload"))?;
                let head = std::fs::read(&first.path)?;
                let (h, tails) = delta::decode_header(&head)?;
                let plan = PageDelta::plan(h, tails, base.header())?;
                let spans = plan
                    .ops
                    .iter()
                    .filter_map(|op| match *op {
                        CopyOp::Delta { src, dst, len } => Some(Span { src, dst, len }),
                        CopyOp::Base { .. } => None,
                    })
                    .collect();
                (
                    spans,
                    usize::try_from(plan.result_len)?,
                    Some(base),
                    Some(plan),
                )
            }
        };
        let mut reused = match floor {
            ReadFloor::Raw | ReadFloor::SpecTouched => Some(touched_buffer(result_len)),
            ReadFloor::Spec => None,
        };
        if cold {
            out.put("evicted_files", evict(&dir)?);
        }
        let cpu = CpuSample::now();
        let t = Instant::now();
        let mut fresh = None;
        let buf: &mut Vec<u8> = match reused.as_mut() {
            Some(b) => b,
            None => fresh.insert(fresh_buffer(result_len)),
        };
        if let (Some(p), Some(b)) = (&delta_plan, &base) {
            p.write_base_spans(b.payload(), buf)?;
        }
        let names = fused(
            &plan,
            &files,
            regions(buf.as_mut_slice(), &spans, &files),
            threads(),
        )?;
        let t_read = t.elapsed();
        if plan.merge(&names)? != m.payload_digest {
            bail!("floor: payload digest mismatch");
        }
        if floor != ReadFloor::Raw {
            let d = digest_of_encoding(&buf[..]);
            if d != m.result_snapshot_digest {
                bail!("floor: result digest {d} != {}", m.result_snapshot_digest);
            }
        }
        out.times_ms.push(common::ms(t.elapsed()));
        cpu.record(&mut out);
        out.put("read_hash_copy_ms", common::ms(t_read));
        out.put("objects", files.len());
        out.put("payload_bytes", m.payload_len);
        out.put("result_bytes", m.result_snapshot_len);
        drop(fresh);
        Ok(out)
    })
    .await
    .context("read floor task")?
}

fn restore_store(source: &Source, w: &Workload) -> Result<Store> {
    match source {
        Source::Warm { dir } | Source::Cold { dir } => open_local(dir, w),
        Source::Throttled { dir, latency_ms } => throttled_store(dir, *latency_ms, w.config()),
        Source::S3 { url } => common::open_store(url, w.config()),
    }
}

/// The S3-like emulation: the local store's files through `object_store`,
/// streamed bodies, `latency_ms` per GET.
fn throttled_store(dir: &FsPath, latency_ms: u64, config: StoreConfig) -> Result<Store> {
    let local = object_store::local::LocalFileSystem::new_with_prefix(dir)
        .with_context(|| format!("opening {}", dir.display()))?;
    let throttled = ThrottledStore::new(
        StreamedObjects {
            inner: Arc::new(local),
        },
        ThrottleConfig {
            wait_get_per_call: Duration::from_millis(latency_ms),
            ..Default::default()
        },
    );
    Ok(Store::from_backend(
        Backend {
            store: Arc::new(throttled),
            kind: BackendKind::Memory,
        },
        config,
    )?)
}

async fn job_restore(w: Workload, format: Fmt, source: Source, into: bool) -> Result<JobOutput> {
    let store = restore_store(&source, &w)?;
    let ns = Workload::identity().namespace();
    let (_, rctx) = w.contexts()?;
    let mut out = JobOutput::default();
    // One untimed restore of the delta first: it restores the base, which
    // lands in the verified-base cache, as a reader restoring turn N+1 has
    // turn N's base (the timed work is the delta), and warms the runtime.
    let t = Instant::now();
    match store
        .restore_with(ns, rctx, RestoreOptions::default())
        .await?
    {
        RestoreOutcome::Hit(_) => {}
        RestoreOutcome::Miss(m) => bail!("first restore missed: {m}"),
    }
    out.put("first_restore_with_base_ms", common::ms(t.elapsed()));
    let t = Instant::now();
    let root = store.read_root(&ns, &rctx).await?;
    out.put("root_read_ms", common::ms(t.elapsed()));
    let summary = match root {
        RootStatus::Found(d) => d.summary().ok_or_else(|| anyhow!("unreadable root"))?,
        _ => bail!("no {} root for the result", format.name()),
    };
    if let Source::Cold { dir } = &source {
        out.put("evicted_files", evict(dir)?);
    }
    if into {
        // The placement layer's memory: allocated and resident before the
        // restore, as when a reader restores turn after turn into the same
        // buffer.
        let mut buf = touched_buffer(summary.result_snapshot_len as usize);
        let before = store.stats();
        let cpu = CpuSample::now();
        let t = Instant::now();
        let outcome = store
            .restore_into_with(ns, rctx, &mut buf, RestoreOptions::default())
            .await?;
        out.times_ms.push(common::ms(t.elapsed()));
        cpu.record(&mut out);
        let after = store.stats();
        match outcome {
            RestoreIntoOutcome::Hit { digest, .. }
                if digest == summary.result_snapshot_digest.to_string() => {}
            RestoreIntoOutcome::Hit { .. } => bail!("restore_into returned the wrong snapshot"),
            RestoreIntoOutcome::Miss { reason } => bail!("restore_into missed: {reason}"),
        }
        if digest_of_encoding(&buf) != summary.result_snapshot_digest {
            bail!("the buffer does not hash to the snapshot digest");
        }
        out.put("objects", summary.objects.len());
        out.put(
            "objects_read_counter",
            after.objects_read - before.objects_read,
        );
        out.put("bytes_read_counter", after.bytes_read - before.bytes_read);
        out.put("payload_bytes", summary.payload_len);
        out.put("result_bytes", summary.result_snapshot_len);
        out.put("schema", summary.schema);
        return Ok(out);
    }
    let before = store.stats();
    let cpu = CpuSample::now();
    let t = Instant::now();
    let outcome = store
        .restore_with(ns, rctx, RestoreOptions::default())
        .await?;
    out.times_ms.push(common::ms(t.elapsed()));
    cpu.record(&mut out);
    let after = store.stats();
    let r = match outcome {
        RestoreOutcome::Hit(r) => r,
        RestoreOutcome::Miss(m) => bail!("restore missed: {m}"),
    };
    if r.digest != summary.result_snapshot_digest
        || r.snapshot.encoded().len() as u64 != summary.result_snapshot_len
    {
        bail!("restore returned the wrong snapshot");
    }
    // For the breakdown: one BLAKE3 pass over the (now resident) result.
    let t = Instant::now();
    let d = digest_of_encoding(r.snapshot.encoded());
    out.put("result_blake3_ms", common::ms(t.elapsed()));
    if d != r.digest {
        bail!("restored bytes do not hash to their digest");
    }
    let t = Instant::now();
    drop(r);
    out.put("drop_ms", common::ms(t.elapsed()));
    out.put("objects", summary.objects.len());
    out.put(
        "objects_read_counter",
        after.objects_read - before.objects_read,
    );
    out.put("bytes_read_counter", after.bytes_read - before.bytes_read);
    out.put("payload_bytes", summary.payload_len);
    out.put("result_bytes", summary.result_snapshot_len);
    out.put("schema", summary.schema);
    Ok(out)
}

async fn job_s3_publish(w: Workload, url_v2: &str, url_v1: &str) -> Result<JobOutput> {
    let (base, result) = synth_pair(w).await?;
    let mut out = JobOutput::default();
    for (format, url) in [(Fmt::V2, url_v2), (Fmt::V1, url_v1)] {
        let store = common::open_store(url, w.config())?;
        store.publish(request(&w, format, &base, None)?).await?;
        let t = Instant::now();
        let receipt = store
            .publish(request(&w, format, &base, Some(&result))?)
            .await?;
        let ms = common::ms(t.elapsed());
        out.times_ms.push(ms);
        out.put(&format!("{}_ms", format.name()), ms);
        out.put(
            &format!("{}_objects", format.name()),
            receipt.objects_written,
        );
        out.put("payload_bytes", receipt.payload_len);
    }
    out.put("base_bytes", base.encoded().len());
    out.put("result_bytes", result.encoded().len());
    Ok(out)
}

async fn job_s3_cleanup(urls: &[String]) -> Result<JobOutput> {
    let mut deleted = 0u64;
    for url in urls {
        let store = common::open_store(url, StoreConfig::default())?;
        let os = store.object_store().clone();
        let metas: Vec<ObjectMeta> = os.list(None).try_collect().await?;
        for m in metas {
            os.delete(&m.location).await?;
            deleted += 1;
        }
    }
    let mut out = JobOutput::default();
    out.put("deleted", deleted);
    Ok(out)
}

/// Zero-heavy pages: `valid` of every 256-slot page of the default preset
/// geometry hold bf16-like bytes, the rest are zero.
fn zero_heavy(sample: &[u8], len: usize, valid_slots: usize) -> Vec<u8> {
    const PAGE: usize = 65_024;
    const SLOT: usize = PAGE / 256;
    let mut out = vec![0u8; len];
    let mut src = sample.iter().copied().cycle();
    for page in out.chunks_mut(PAGE) {
        let n = (valid_slots * SLOT).min(page.len());
        for b in &mut page[..n] {
            *b = src.next().unwrap_or(0);
        }
    }
    out
}

/// Byte-planar shuffle of 2-byte elements (all low bytes, then all high).
fn shuffled(sample: &[u8]) -> Vec<u8> {
    let half = sample.len() / 2;
    let mut out = vec![0u8; sample.len()];
    for (i, pair) in sample.chunks_exact(2).enumerate() {
        out[i] = pair[0];
        out[half + i] = pair[1];
    }
    out
}

async fn job_zstd(w: Workload, store_v2: &FsPath, repeats: u32) -> Result<JobOutput> {
    let m = v2_manifest(store_v2, &w).await?;
    let files = extent_files(store_v2, &m);
    tokio::task::spawn_blocking(move || -> Result<JobOutput> {
        // A full extent past the delta header if there is one.
        let f = files
            .get(1)
            .or_else(|| files.first())
            .ok_or_else(|| anyhow!("empty payload"))?;
        let bf16 = std::fs::read(&f.path)?;
        let len = bf16.len();
        let sets: Vec<(String, Vec<u8>)> = vec![
            ("bf16 pages (synthetic)".into(), bf16.clone()),
            ("bf16, byte-planar shuffle".into(), shuffled(&bf16)),
            ("pages 50% zero".into(), zero_heavy(&bf16, len, 128)),
            ("pages 90% zero".into(), zero_heavy(&bf16, len, 26)),
            ("all-zero pages".into(), vec![0u8; len]),
        ];
        let mut rows = Vec::new();
        for (name, data) in &sets {
            for level in [1, 3] {
                let (mut ct, mut dt) = (Vec::new(), Vec::new());
                let mut stored = 0;
                for _ in 0..repeats {
                    let t = Instant::now();
                    let c = deltapack_format::extent::compress(data, level)?;
                    ct.push(t.elapsed().as_secs_f64());
                    stored = c.len();
                    let t = Instant::now();
                    let d = deltapack_format::extent::decompress(&c, data.len() as u64)?;
                    dt.push(t.elapsed().as_secs_f64());
                    if d != *data {
                        bail!("zstd round trip changed {name}");
                    }
                }
                let raw = data.len() as u64;
                rows.push(ZstdRow {
                    data: name.clone(),
                    level,
                    raw_bytes: raw,
                    stored_bytes: stored as u64,
                    ratio: raw as f64 / stored.max(1) as f64,
                    compress_mb_s: raw as f64 / 1e6 / median(&ct),
                    decompress_mb_s: raw as f64 / 1e6 / median(&dt),
                    stored_as_zstd: (stored as u64) < raw - raw / 16,
                });
            }
        }
        // Reference speeds on the same bytes, one core.
        let t = Instant::now();
        let _ = blake3::hash(&bf16);
        let b3 = bf16.len() as f64 / 1e6 / t.elapsed().as_secs_f64();
        let mut out = JobOutput::default();
        out.put("rows", rows);
        out.put("blake3_mb_s_1_core", b3);
        Ok(out)
    })
    .await
    .context("zstd task")?
}

// ------------------------------------------------------------------ parent

/// Runs one child job and parses its result.
/// The binary children run: a link (or copy) of this executable in the work
/// dir, so that a `cargo build` replacing it during a long run is harmless.
static CHILD_EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

fn pin_exe(work: &FsPath) -> Result<()> {
    let exe = std::env::current_exe().context("locating the deltapack binary")?;
    let pinned = work.join("deltapack-bench-child");
    if std::fs::hard_link(&exe, &pinned).is_err() {
        std::fs::copy(&exe, &pinned)
            .with_context(|| format!("copying {} to the work dir", exe.display()))?;
    }
    let _ = CHILD_EXE.set(pinned);
    Ok(())
}

/// Seconds to wait for an idle machine before each child (`--wait-idle`).
static WAIT_IDLE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Waits (up to `WAIT_IDLE` seconds) until the machine's busy time over one
/// second is below 0.3 cores. Returns the busy cores last seen.
async fn wait_idle() -> f64 {
    let max = Duration::from_secs(WAIT_IDLE.load(Ordering::Relaxed));
    if max.is_zero() {
        return f64::NAN;
    }
    let start = Instant::now();
    loop {
        let (a, t) = (machine_busy_jiffies(), Instant::now());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let busy =
            machine_busy_jiffies().saturating_sub(a) as f64 / 100.0 / t.elapsed().as_secs_f64();
        if busy < 0.3 || start.elapsed() >= max {
            return busy;
        }
    }
}

async fn child(job: &Job, what: &str) -> Result<JobOutput> {
    let busy_before = wait_idle().await;
    let exe = match CHILD_EXE.get() {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("locating the deltapack binary")?,
    };
    let json = serde_json::to_string(job)?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("bench-one")
        .arg("--job")
        .arg(json)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none()
        && std::env::var_os("DELTAPACK_TEST_S3_ENDPOINT").is_some()
    {
        cmd.env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing");
    }
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none()
    {
        cmd.env("AWS_REGION", "us-east-1");
    }
    let t = Instant::now();
    let out = cmd.output().await.context("running bench-one")?;
    if !out.status.success() {
        bail!("bench job {what} failed ({})", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow!("bench job {what} printed no result"))?;
    let r: JobOutput =
        serde_json::from_str(line).with_context(|| format!("bench job {what}: bad result"))?;
    let others: Vec<String> = std::iter::once(&r)
        .chain(r.sub.values().flatten())
        .filter_map(|o| o.num("others_cores"))
        .map(|x| format!("{x:.2}"))
        .collect();
    eprintln!(
        "bench: {what:<42} {:>10}  (child {:.1} s, peak {}, other load {} cores{})",
        r.times_ms
            .iter()
            .map(|t| secs(*t))
            .collect::<Vec<_>>()
            .join(" "),
        t.elapsed().as_secs_f64(),
        mib(r.peak),
        others.join("/"),
        if busy_before.is_nan() {
            String::new()
        } else {
            format!(", {busy_before:.2} before")
        }
    );
    Ok(r)
}

/// Collected repetitions of one scenario.
#[derive(Default)]
struct Acc {
    times: Vec<f64>,
    /// VmHWM and start RSS of the run that grew the most.
    peak: u64,
    baseline: u64,
    info: BTreeMap<String, serde_json::Value>,
    infos: Vec<BTreeMap<String, serde_json::Value>>,
}

impl Acc {
    fn add(&mut self, o: JobOutput) {
        self.times.extend(o.times_ms);
        if o.peak.saturating_sub(o.rss_start) >= self.peak.saturating_sub(self.baseline) {
            self.peak = o.peak;
            self.baseline = o.rss_start;
        }
        self.infos.push(o.info.clone());
        self.info = o.info;
    }
    /// Median of a numeric info field over the repetitions.
    fn info_median(&self, k: &str) -> Option<f64> {
        let v: Vec<f64> = self
            .infos
            .iter()
            .filter_map(|i| i.get(k).and_then(|v| v.as_f64()))
            .collect();
        (!v.is_empty()).then(|| median(&v))
    }
}

fn machine(work: &FsPath) -> Machine {
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
    }
}

/// A unique suffix for temporary names.
fn unique() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{}-{t}", std::process::id())
}

/// `s3://bucket/prefix?q` → `s3://bucket/prefix/<leaf>?q`.
fn s3_child_url(url: &str, leaf: &str) -> String {
    let (path, query) = match url.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (url, None),
    };
    let path = path.trim_end_matches('/');
    match query {
        Some(q) => format!("{path}/{leaf}?{q}"),
        None => format!("{path}/{leaf}"),
    }
}

/// Runs `deltapack bench`.
pub(crate) async fn run(args: BenchArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let extent_bytes = args
        .extent_bytes
        .unwrap_or(deltapack_format::DEFAULT_MAX_EXTENT_BYTES);
    let w = Workload::from_scale(args.scale, extent_bytes)?;
    let (s3_url, parent_dir) = match args.store.as_deref() {
        Some(u) if u.starts_with("s3://") => (Some(u.to_string()), std::env::temp_dir()),
        Some(u) if u.starts_with("memory:") => {
            bail!("--store memory:// cannot be shared with child processes; give s3://… or a directory")
        }
        Some(u) => (None, PathBuf::from(u.strip_prefix("file://").unwrap_or(u))),
        None => (
            std::env::var("DELTAPACK_TEST_S3_ENDPOINT")
                .ok()
                .filter(|e| !e.is_empty())
                .map(|ep| {
                    let bucket = std::env::var("DELTAPACK_TEST_S3_BUCKET")
                        .unwrap_or_else(|_| "deltapack-test".into());
                    format!("s3://{bucket}?endpoint={ep}")
                }),
            std::env::temp_dir(),
        ),
    };
    WAIT_IDLE.store(args.wait_idle, Ordering::Relaxed);
    let work = parent_dir.join(format!("deltapack-bench-{}", unique()));
    std::fs::create_dir_all(&work)
        .with_context(|| format!("creating the work dir {}", work.display()))?;
    let mut mach = machine(&work);
    pin_exe(&work)?;
    let outcome = run_suite(&args, w, s3_url.as_deref(), &work, &mut mach).await;
    if args.keep {
        eprintln!("bench: stores kept under {}", work.display());
    } else if let Err(e) = std::fs::remove_dir_all(&work) {
        eprintln!("bench: could not remove {}: {e}", work.display());
    }
    let mut report = outcome?;
    mach.loadavg_end = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string();
    report.machine = mach;
    report.total_s = started.elapsed().as_secs_f64();
    write_outputs(&args.out, &report)?;
    if args.json {
        common::print_json(&report)?;
    } else {
        print!("{}", markdown(&report));
        println!(
            "\nwritten: {}/results.{{json,md,svg}}, machine.txt{}",
            args.out.display(),
            if report.chain.is_some() {
                ", chain.svg"
            } else {
                ""
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_suite(
    args: &BenchArgs,
    w: Workload,
    s3_url: Option<&str>,
    work: &FsPath,
    mach: &mut Machine,
) -> Result<Report> {
    let do_publish = matches!(args.suite, Suite::Publish | Suite::All);
    let do_restore = matches!(args.suite, Suite::Restore | Suite::All);
    let do_chain = matches!(args.suite, Suite::Chain | Suite::All);
    let repeats = args.repeats;
    let store_v2 = work.join("store-v2");
    let store_v1 = work.join("store-v1");
    let scratch = work.join("scratch");
    eprintln!(
        "bench: {:?} at scale {} — base {} tokens, result {} tokens, extents {}, {repeats} repetition(s); work dir {}",
        args.suite,
        args.scale,
        w.base_tokens,
        w.result_tokens,
        mib(w.extent_bytes),
        work.display()
    );

    let mut accs: BTreeMap<String, Acc> = BTreeMap::new();
    // Publication and the durable write floor, interleaved per round in one
    // child (timed when publishing; a single round to create the stores
    // otherwise).
    let o = if do_publish || do_restore {
        child(
            &Job::PublishSuite {
                w,
                keep_v2: store_v2.clone(),
                keep_v1: store_v1.clone(),
                scratch: scratch.clone(),
                rounds: if do_publish { repeats } else { 1 },
            },
            "publish v2, v1 + durable write floor",
        )
        .await?
    } else {
        JobOutput::default()
    };
    let get = |k: &str| o.info.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let (base_bytes, result_bytes) = (get("base_bytes"), get("result_bytes"));
    for (id, runs) in o.sub {
        let acc = accs.entry(id).or_default();
        for r in runs {
            acc.add(r);
        }
    }
    // The write floor is the fastest of one and two streams, buffered or
    // direct.
    let best = [
        "floor-write-1",
        "floor-write-2",
        "floor-write-1-direct",
        "floor-write-2-direct",
    ]
    .into_iter()
    .filter_map(|id| accs.get(id).map(|a| (id, median(&a.times))))
    .min_by(|a, b| a.1.total_cmp(&b.1))
    .map(|(id, _)| id.to_string());
    if let Some(id) = best {
        if let Some(a) = accs.get(&id) {
            let mut f = Acc {
                times: a.times.clone(),
                peak: a.peak,
                baseline: a.baseline,
                info: a.info.clone(),
                infos: a.infos.clone(),
            };
            for k in ["1", "2", "1-direct", "2-direct"] {
                if let Some(x) = accs.get(&format!("floor-write-{k}")) {
                    f.info.insert(
                        format!("median_ms_{}_stream", k.replace('-', "_")),
                        serde_json::json!(median(&x.times)),
                    );
                }
            }
            f.infos = vec![f.info.clone()];
            accs.insert("floor-write".into(), f);
        }
    }
    let pinfo = |id: &str, k: &str| {
        accs.get(id)
            .and_then(|a| a.info.get(k))
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
    };
    let payload_bytes = pinfo("publish-v2", "payload_bytes");
    let v2_extents = pinfo("publish-v2", "objects");
    let v1_chunks = pinfo("publish-v1", "objects");

    if do_restore {
        let warm = Source::Warm {
            dir: store_v2.clone(),
        };
        let warm1 = Source::Warm {
            dir: store_v1.clone(),
        };
        type Plan = Vec<(&'static str, Job)>;
        let rf = |floor, cold| Job::ReadFloor {
            w,
            store_v2: store_v2.clone(),
            floor,
            cold,
        };
        let rs = |format, source| Job::Restore {
            w,
            format,
            source,
            into: false,
        };
        let ri = |format, source| Job::Restore {
            w,
            format,
            source,
            into: true,
        };
        let plans: Vec<Plan> = vec![
            vec![
                ("floor-raw-warm", rf(ReadFloor::Raw, false)),
                ("floor-spec-warm", rf(ReadFloor::Spec, false)),
                ("floor-spec-touched-warm", rf(ReadFloor::SpecTouched, false)),
                ("restore-v2-warm", rs(Fmt::V2, warm.clone())),
                ("restore-v2-warm-into", ri(Fmt::V2, warm)),
                ("restore-v1-warm", rs(Fmt::V1, warm1)),
            ],
            vec![
                ("floor-raw-cold", rf(ReadFloor::Raw, true)),
                ("floor-spec-cold", rf(ReadFloor::Spec, true)),
                (
                    "restore-v2-cold",
                    rs(
                        Fmt::V2,
                        Source::Cold {
                            dir: store_v2.clone(),
                        },
                    ),
                ),
                (
                    "restore-v1-cold",
                    rs(
                        Fmt::V1,
                        Source::Cold {
                            dir: store_v1.clone(),
                        },
                    ),
                ),
            ],
            vec![
                (
                    "restore-v2-s3like",
                    rs(
                        Fmt::V2,
                        Source::Throttled {
                            dir: store_v2.clone(),
                            latency_ms: args.latency_ms,
                        },
                    ),
                ),
                (
                    "restore-v2-s3like-into",
                    ri(
                        Fmt::V2,
                        Source::Throttled {
                            dir: store_v2.clone(),
                            latency_ms: args.latency_ms,
                        },
                    ),
                ),
                (
                    "restore-v1-s3like",
                    rs(
                        Fmt::V1,
                        Source::Throttled {
                            dir: store_v1.clone(),
                            latency_ms: args.latency_ms,
                        },
                    ),
                ),
            ],
        ];
        // Round-robin: one repetition of every scenario of a block per round.
        for plan in &plans {
            for round in 0..repeats {
                for (id, job) in plan {
                    let o = child(job, &format!("{id} [{}/{repeats}]", round + 1)).await?;
                    accs.entry(id.to_string()).or_default().add(o);
                }
            }
        }
    }

    // The real S3-compatible server, scaled.
    let mut s3_info = None;
    if let (true, Some(url)) = (do_restore || do_publish, s3_url) {
        let s3_scale = args.s3_scale.unwrap_or(args.scale.min(1.0 / 16.0));
        let ws = Workload::from_scale(s3_scale, w.extent_bytes)?;
        let leaf = format!("bench-{}", unique());
        let (u2, u1) = (
            s3_child_url(url, &format!("{leaf}-v2")),
            s3_child_url(url, &format!("{leaf}-v1")),
        );
        let r = async {
            let o = child(
                &Job::S3Publish {
                    w: ws,
                    url_v2: u2.clone(),
                    url_v1: u1.clone(),
                },
                "s3: publish v2 + v1 (scaled)",
            )
            .await?;
            let mut p = Acc::default();
            p.add(o);
            for round in 0..repeats {
                for (id, format, u) in [
                    ("restore-v2-s3", Fmt::V2, &u2),
                    ("restore-v1-s3", Fmt::V1, &u1),
                ] {
                    let o = child(
                        &Job::Restore {
                            w: ws,
                            format,
                            source: Source::S3 { url: u.clone() },
                            into: false,
                        },
                        &format!("{id} [{}/{repeats}]", round + 1),
                    )
                    .await?;
                    accs.entry(id.to_string()).or_default().add(o);
                }
            }
            Ok::<_, anyhow::Error>(p)
        }
        .await;
        let cleanup = child(
            &Job::S3Cleanup {
                urls: vec![u2.clone(), u1.clone()],
            },
            "s3: cleanup",
        )
        .await;
        let p = r?;
        cleanup?;
        s3_info = Some(serde_json::json!({
            "url": url,
            "scale": s3_scale,
            "result_tokens": ws.result_tokens,
            "payload_bytes": p.info.get("payload_bytes"),
            "publish_v2_ms": p.info.get("v2_ms"),
            "publish_v1_ms": p.info.get("v1_ms"),
            "v2_objects": p.info.get("v2_objects"),
            "v1_objects": p.info.get("v1_objects"),
        }));
    }

    let mut zstd = Vec::new();
    if args.suite == Suite::All {
        let o = child(
            &Job::Zstd {
                w,
                store_v2: store_v2.clone(),
                repeats,
            },
            "zstd per extent",
        )
        .await?;
        if let Some(rows) = o.info.get("rows") {
            zstd = serde_json::from_value(rows.clone()).context("zstd rows")?;
        }
        mach.filesystem.push_str(&format!(
            "; BLAKE3 one core on this data: {:.0} MB/s",
            o.num("blake3_mb_s_1_core").unwrap_or(0.0)
        ));
    }

    // Restore cost against the number of turns (own stores and floors).
    let mut chain_accs: BTreeMap<String, Acc> = BTreeMap::new();
    let chain = if do_chain {
        Some(chain::run(args, w, work, &mut chain_accs).await?)
    } else {
        None
    };

    let mut report = Report {
        deltapack_version: env!("CARGO_PKG_VERSION"),
        suite: format!("{:?}", args.suite).to_lowercase(),
        scale: args.scale,
        base_tokens: w.base_tokens,
        result_tokens: w.result_tokens,
        base_bytes,
        result_bytes,
        payload_bytes,
        extent_bytes: w.extent_bytes,
        v2_extents,
        v1_chunks,
        repeats,
        latency_ms: args.latency_ms,
        s3: s3_info,
        machine: mach.clone(),
        scenarios: Vec::new(),
        targets: Vec::new(),
        zstd,
        chain,
        total_s: 0.0,
    };
    report.scenarios = scenarios(&report, &accs, do_publish, args.latency_ms);
    report.targets = targets(&report);
    if let Some(c) = &report.chain {
        let rows = chain::scenarios(c, &chain_accs);
        report.scenarios.extend(rows);
        report.targets.extend(chain::targets(c));
    }
    Ok(report)
}

/// Static description of every scenario id.
fn describe(id: &str, latency_ms: u64) -> Option<(&'static str, String, Option<&'static str>)> {
    Some(match id {
        "floor-raw-warm" => (
            "floor",
            "floor (a) raw: read + BLAKE3 + copy, warm".into(),
            None,
        ),
        "floor-spec-warm" => (
            "floor",
            "floor (b) spec: read + BLAKE3 delta + copy + BLAKE3 result, warm".into(),
            None,
        ),
        "floor-spec-touched-warm" => (
            "floor",
            "floor (b) spec, pre-touched result buffer, warm".into(),
            None,
        ),
        "floor-raw-cold" => ("floor", "floor (a) raw, cold page cache".into(), None),
        "floor-spec-cold" => ("floor", "floor (b) spec, cold page cache".into(), None),
        "floor-write" => (
            "floor",
            "floor (c) durable write, 64 MiB files (fastest of 1 and 2 streams, buffered or direct I/O)".into(),
            None,
        ),
        "restore-v2-warm" => (
            "restore",
            "restore v2, local, warm".into(),
            Some("floor-spec-warm"),
        ),
        "restore-v2-warm-into" => (
            "restore",
            "restore v2 into a caller's resident buffer, local, warm".into(),
            Some("floor-spec-touched-warm"),
        ),
        "restore-v1-warm" => (
            "restore",
            "restore v1, local, warm".into(),
            Some("floor-spec-warm"),
        ),
        "restore-v2-cold" => (
            "restore",
            "restore v2, local, cold".into(),
            Some("floor-spec-cold"),
        ),
        "restore-v1-cold" => (
            "restore",
            "restore v1, local, cold".into(),
            Some("floor-spec-cold"),
        ),
        "restore-v2-s3like" => (
            "restore",
            format!("restore v2, S3-like ({latency_ms} ms/GET)"),
            Some("floor-spec-warm"),
        ),
        "restore-v2-s3like-into" => (
            "restore",
            format!("restore v2 into a caller's resident buffer, S3-like ({latency_ms} ms/GET)"),
            Some("floor-spec-touched-warm"),
        ),
        "restore-v1-s3like" => (
            "restore",
            format!("restore v1, S3-like ({latency_ms} ms/GET)"),
            Some("floor-spec-warm"),
        ),
        "restore-v2-s3" => (
            "restore",
            "restore v2, real S3 server (scaled)".into(),
            None,
        ),
        "restore-v1-s3" => (
            "restore",
            "restore v1, real S3 server (scaled)".into(),
            None,
        ),
        "publish-v2" => (
            "publish",
            "publish v2, durable, local".into(),
            Some("floor-write"),
        ),
        "publish-v1" => (
            "publish",
            "publish v1, durable, local".into(),
            Some("floor-write"),
        ),
        _ => return None,
    })
}

const ORDER: [&str; 18] = [
    "floor-raw-warm",
    "floor-spec-warm",
    "floor-spec-touched-warm",
    "restore-v2-warm",
    "restore-v2-warm-into",
    "restore-v1-warm",
    "floor-raw-cold",
    "floor-spec-cold",
    "restore-v2-cold",
    "restore-v1-cold",
    "restore-v2-s3like",
    "restore-v2-s3like-into",
    "restore-v1-s3like",
    "restore-v2-s3",
    "restore-v1-s3",
    "floor-write",
    "publish-v2",
    "publish-v1",
];

fn scenarios(
    r: &Report,
    accs: &BTreeMap<String, Acc>,
    do_publish: bool,
    latency_ms: u64,
) -> Vec<Scenario> {
    let medians: BTreeMap<&str, f64> = accs
        .iter()
        .map(|(k, a)| (k.as_str(), median(&a.times)))
        .collect();
    let restore_bound = r.base_bytes + r.result_bytes + 5 * r.extent_bytes;
    let mut out = Vec::new();
    for id in ORDER {
        let Some(a) = accs.get(id) else { continue };
        if (id.starts_with("publish") || id == "floor-write") && !do_publish {
            continue;
        }
        let Some((group, label, floor_id)) = describe(id, latency_ms) else {
            continue;
        };
        let m = median(&a.times);
        let objects = a.info.get("objects").and_then(|v| v.as_u64());
        let bytes = a
            .info
            .get("payload_bytes")
            .and_then(|v| v.as_u64())
            .unwrap_or(r.payload_bytes);
        let mut note = String::new();
        // S3-like floors add the latency of ⌈objects / in-flight⌉ request rounds.
        let floor_ms = floor_id.and_then(|f| medians.get(f).copied()).map(|f| {
            if id.ends_with("s3like") {
                let rounds = objects.unwrap_or(0).div_ceil(IN_FLIGHT);
                note = format!(
                    "floor = spec floor + {rounds} rounds × {latency_ms} ms ({IN_FLIGHT} GETs in flight)"
                );
                f + (rounds * latency_ms) as f64
            } else {
                f
            }
        });
        let bound = match group {
            "restore" if !id.ends_with("-s3") => Some(restore_bound),
            // Beyond the snapshots the caller holds: the payload and at most
            // two object payloads of a durability batch.
            "publish" => Some(r.payload_bytes + 2 * r.extent_bytes),
            _ => None,
        };
        let mut info = BTreeMap::new();
        for k in [
            "encode_ms",
            "write_ms",
            "cpu_ms",
            "others_cores",
            "root_read_ms",
            "result_blake3_ms",
            "drop_ms",
            "read_hash_copy_ms",
            "median_ms_1_stream",
            "median_ms_2_stream",
            "median_ms_1_direct_stream",
            "median_ms_2_direct_stream",
            "streams",
            "first_restore_with_base_ms",
            "objects_read_counter",
            "bytes_read_counter",
            "cost_result_digest_ms",
            "cost_delta_encode_ms",
            "cost_extent_names_1_thread_ms",
            "cost_copy_into_fresh_buffer_ms",
        ] {
            if let Some(v) = a.info_median(k) {
                info.insert(k.to_string(), serde_json::json!(v));
            }
        }
        out.push(Scenario {
            id: id.to_string(),
            label,
            group,
            median_ms: m,
            times_ms: a.times.clone(),
            bytes,
            gb_per_s: bytes as f64 / 1e6 / m,
            objects,
            floor_id: floor_id.map(str::to_string),
            floor_ms,
            ratio: floor_ms.map(|f| m / f),
            cpu_ms: a.info_median("cpu_ms"),
            cpu_ratio: match (group, a.info_median("cpu_ms"), floor_id) {
                ("restore", Some(c), Some(f)) => accs
                    .get(f)
                    .and_then(|fa| fa.info_median("cpu_ms"))
                    .map(|fc| c / fc),
                _ => None,
            },
            // The write floor shares the publication child: no own peak.
            peak_bytes: (id != "floor-write").then_some(a.peak),
            baseline_bytes: (id != "floor-write").then_some(a.baseline),
            bound_bytes: bound,
            info,
            note,
        });
    }
    out
}

/// "v1 / v2" speed-up, wall and CPU time.
fn vs(v1: &Scenario, v2: &Scenario) -> String {
    let x = v1.median_ms / v2.median_ms;
    let cpu = match (v1.cpu_ms, v2.cpu_ms) {
        (Some(a), Some(b)) if b > 0.0 => format!("; CPU time {:.1}×", a / b),
        _ => String::new(),
    };
    format!(
        "{x:.1}× ({} vs {}){cpu}",
        secs(v1.median_ms),
        secs(v2.median_ms)
    )
}

fn targets(r: &Report) -> Vec<Target> {
    let s = |id: &str| r.scenarios.iter().find(|s| s.id == id);
    let mut t = Vec::new();
    let reference = r.result_tokens == REFERENCE_RESULT_TOKENS;
    if let Some(v2) = s("restore-v2-warm") {
        if let Some(ratio) = v2.ratio {
            t.push(Target {
                target: "v2 restore warm ≤ 1.25 × spec floor".into(),
                measured: format!(
                    "{:.2} × ({} vs {}){}",
                    ratio,
                    secs(v2.median_ms),
                    secs(v2.floor_ms.unwrap_or(0.0)),
                    v2.cpu_ratio
                        .map(|c| format!("; CPU time {c:.2} ×"))
                        .unwrap_or_default()
                ),
                met: Some(ratio <= 1.25),
            });
        }
        // The absolute target is for the reference workload; scale it.
        let limit = 800.0 * r.payload_bytes as f64 / 1_575_821_491.0;
        t.push(Target {
            target: if reference {
                "v2 restore warm < 0.8 s (reference workload, 2 cores)".into()
            } else {
                format!(
                    "v2 restore warm < {} (0.8 s scaled by payload)",
                    secs(limit)
                )
            },
            measured: secs(v2.median_ms),
            met: Some(v2.median_ms < limit),
        });
        if let Some(into) = s("restore-v2-warm-into") {
            t.push(Target {
                target: if reference {
                    "v2 restore warm into the caller's resident buffer (`restore_into`) < 0.8 s"
                        .into()
                } else {
                    format!(
                        "v2 restore warm into the caller's resident buffer < {} (scaled)",
                        secs(limit)
                    )
                },
                measured: format!(
                    "{}{}",
                    secs(into.median_ms),
                    into.ratio
                        .map(|x| format!("; {x:.2} × its floor (spec floor, pre-touched)"))
                        .unwrap_or_default()
                ),
                met: Some(into.median_ms < limit),
            });
        }
        if let Some(v1) = s("restore-v1-warm") {
            let x = v1.median_ms / v2.median_ms;
            t.push(Target {
                target: "v2 ≥ 3× faster than v1, local disk (warm)".into(),
                measured: vs(v1, v2),
                met: Some(x >= 3.0),
            });
        }
    }
    if let (Some(v2), Some(v1)) = (s("restore-v2-cold"), s("restore-v1-cold")) {
        t.push(Target {
            target: "(info) v2 vs v1, local disk, cold page cache".into(),
            measured: vs(v1, v2),
            met: None,
        });
    }
    if let (Some(v2), Some(v1)) = (s("restore-v2-s3like"), s("restore-v1-s3like")) {
        let x = v1.median_ms / v2.median_ms;
        t.push(Target {
            target: format!(
                "v2 ≥ 5× faster than v1, S3-like latency ({} ms/GET)",
                r.latency_ms
            ),
            measured: vs(v1, v2),
            met: Some(x >= 5.0),
        });
    }
    if let (Some(v2), Some(v1)) = (s("restore-v2-s3"), s("restore-v1-s3")) {
        t.push(Target {
            target: "(info) v2 vs v1, real S3 server (scaled)".into(),
            measured: vs(v1, v2),
            met: None,
        });
    }
    if let Some(p2) = s("publish-v2") {
        if let Some(f) = p2.floor_ms {
            let eff = f / p2.median_ms;
            t.push(Target {
                target: "durable v2 publish ≥ 0.85 × durable write floor (floor/time)".into(),
                measured: format!("{eff:.2} ({} vs floor {})", secs(p2.median_ms), secs(f)),
                met: Some(eff >= 0.85),
            });
        }
        if let Some(p1) = s("publish-v1") {
            let x = p1.median_ms / p2.median_ms;
            t.push(Target {
                target: "durable v2 publish ≥ 1.5× faster than v1".into(),
                measured: format!("{x:.2}× ({} vs {})", secs(p1.median_ms), secs(p2.median_ms)),
                met: Some(x >= 1.5),
            });
        }
    }
    for id in [
        "restore-v2-warm",
        "restore-v2-warm-into",
        "restore-v2-cold",
        "restore-v2-s3like",
        "restore-v2-s3like-into",
    ] {
        if let Some(sc) = s(id) {
            if let (Some(p), Some(b)) = (sc.peak_bytes, sc.bound_bytes) {
                let above = p.saturating_sub(sc.baseline_bytes.unwrap_or(0));
                t.push(Target {
                    target: format!("{}: peak memory ≤ base + result + 4×M + M", sc.label),
                    measured: format!(
                        "{} above process start ≤ {} (VmHWM {})",
                        mib(above),
                        mib(b),
                        mib(p)
                    ),
                    met: Some(above <= b),
                });
            }
        }
    }
    t
}

// ------------------------------------------------------------------ outputs

fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# deltapack bench — {} at scale {}\n", r.suite, r.scale);
    if let (Some(c), true) = (&r.chain, r.suite == "chain") {
        let _ = writeln!(
            s,
            "Workload: `default` preset; conversations of {:?} turns ending in the same {}-token snapshot ({}), {} extents. Median of {} repetition(s); every restore runs in its own fresh child process, round-robin.\n",
            c.turns,
            c.final_tokens,
            mib(c.result_bytes),
            mib(r.extent_bytes),
            r.repeats
        );
    } else {
        let _ = writeln!(
        s,
        "Workload: `default` preset, base {} tokens ({}), result {} tokens ({}); delta payload {} bytes = {} v2 extents of {} / {} v1 chunks. Median of {} repetition(s); every restore and read floor runs in its own child process, round-robin.\n",
        r.base_tokens,
        mib(r.base_bytes),
        r.result_tokens,
        mib(r.result_bytes),
        r.payload_bytes,
        r.v2_extents,
        mib(r.extent_bytes),
        r.v1_chunks,
        r.repeats
    );
    }
    let _ = writeln!(
        s,
        "| scenario | median | GB/s | objects | floor | ratio | CPU time | CPU ratio | peak memory (VmHWM − start) | bound | other load |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for sc in &r.scenarios {
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} |",
            sc.label,
            secs(sc.median_ms),
            sc.gb_per_s,
            sc.objects.map(|o| o.to_string()).unwrap_or_default(),
            sc.floor_ms.map(secs).unwrap_or_default(),
            sc.ratio.map(|x| format!("{x:.2}×")).unwrap_or_default(),
            sc.cpu_ms.map(secs).unwrap_or_default(),
            sc.cpu_ratio.map(|x| format!("{x:.2}×")).unwrap_or_default(),
            sc.peak_bytes
                .map(|p| mib(p.saturating_sub(sc.baseline_bytes.unwrap_or(0))))
                .unwrap_or_default(),
            sc.bound_bytes.map(mib).unwrap_or_default(),
            sc.info
                .get("others_cores")
                .and_then(|v| v.as_f64())
                .map(|x| format!("{x:.2}"))
                .unwrap_or_default(),
        );
    }
    let notes: Vec<&Scenario> = r.scenarios.iter().filter(|s| !s.note.is_empty()).collect();
    if !notes.is_empty() {
        let _ = writeln!(s);
        for sc in notes {
            let _ = writeln!(s, "- {}: {}", sc.label, sc.note);
        }
    }
    let _ = writeln!(
        s,
        "\n*CPU time*: user + system time of all the child's threads during the timed section; *CPU ratio*: against the floor's. *other load*: average cores other processes kept busy during the timed section (median over repetitions; this machine has {}).",
        r.machine.nproc
    );
    let _ = writeln!(s, "\n## Targets\n");
    let _ = writeln!(s, "| target | measured | met |");
    let _ = writeln!(s, "|---|---|---|");
    for t in &r.targets {
        let _ = writeln!(
            s,
            "| {} | {} | {} |",
            t.target,
            t.measured,
            match t.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "—",
            }
        );
    }
    let _ = writeln!(s, "\n## Breakdowns (medians, ms)\n");
    for sc in &r.scenarios {
        if sc.info.is_empty() {
            continue;
        }
        let parts: Vec<String> = sc
            .info
            .iter()
            .map(|(k, v)| {
                format!(
                    "{k} {}",
                    v.as_f64()
                        .map(|x| format!("{x:.1}"))
                        .unwrap_or_else(|| v.to_string())
                )
            })
            .collect();
        let _ = writeln!(s, "- {}: {}", sc.label, parts.join(", "));
    }
    if let Some(s3) = &r.s3 {
        let _ = writeln!(s, "\nReal S3 server: {s3}");
    }
    if let Some(c) = &r.chain {
        chain::markdown(c, &mut s);
    }
    if !r.zstd.is_empty() {
        let _ = writeln!(s, "\n## zstd per extent (one core)\n");
        let _ = writeln!(
            s,
            "| data | level | ratio | compress MB/s | decompress MB/s | stored as zstd (saves ≥ 1/16) |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---|");
        for z in &r.zstd {
            let _ = writeln!(
                s,
                "| {} | {} | {:.2}× | {:.0} | {:.0} | {} |",
                z.data,
                z.level,
                z.ratio,
                z.compress_mb_s,
                z.decompress_mb_s,
                if z.stored_as_zstd { "yes" } else { "no" }
            );
        }
    }
    let m = &r.machine;
    let _ = writeln!(
        s,
        "\nMachine: {} cores, {:.1} GiB, {}, kernel {}; load average {} → {}; {}. Total {:.0} s.",
        m.nproc,
        m.mem_total_bytes as f64 / (1u64 << 30) as f64,
        m.cpu_model,
        m.kernel,
        m.loadavg_start,
        m.loadavg_end,
        m.filesystem,
        r.total_s
    );
    s
}

fn machine_txt(r: &Report) -> String {
    let m = &r.machine;
    format!(
        "nproc: {}\nmemory: {} bytes ({:.1} GiB)\ncpu model: {}\nkernel: {}\nload average at start: {}\nload average at end: {}\nwork dir: {}\nfilesystem: {}\n",
        m.nproc,
        m.mem_total_bytes,
        m.mem_total_bytes as f64 / (1u64 << 30) as f64,
        m.cpu_model,
        m.kernel,
        m.loadavg_start,
        m.loadavg_end,
        m.work_dir,
        m.filesystem
    )
}

fn write_outputs(dir: &FsPath, r: &Report) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_string_pretty(r)?;
    common::write_atomic(&dir.join("results.json"), format!("{json}\n").as_bytes())?;
    common::write_atomic(&dir.join("results.md"), markdown(r).as_bytes())?;
    common::write_atomic(&dir.join("machine.txt"), machine_txt(r).as_bytes())?;
    let svg = plot(r)?;
    common::write_atomic(&dir.join("results.svg"), svg.as_bytes())?;
    if let Some(c) = &r.chain {
        let svg = chain::plot(r, c)?;
        common::write_atomic(&dir.join("chain.svg"), svg.as_bytes())?;
    }
    Ok(())
}

/// Horizontal bars: every scenario's median time, its floor as a black
/// marker, floors as grey bars.
fn plot(r: &Report) -> Result<String> {
    use plotters::coord::ranged1d::SegmentValue;
    use plotters::prelude::*;
    // The chain rows have their own plot (`chain.svg`); they are drawn here
    // only when nothing else ran.
    let others = r.scenarios.iter().any(|s| !s.id.starts_with("chain-"));
    let rows: Vec<&Scenario> = r
        .scenarios
        .iter()
        .rev()
        .filter(|s| !(others && s.id.starts_with("chain-")))
        .collect();
    let n = rows.len().max(1);
    let xmax = rows
        .iter()
        .flat_map(|s| [s.median_ms, s.floor_ms.unwrap_or(0.0)])
        .fold(1.0f64, f64::max)
        / 1000.0
        * 1.3;
    let mut svg = String::new();
    {
        let height = 90 + 30 * n as u32;
        let root = SVGBackend::with_string(&mut svg, (1100, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
        let title = match (&r.chain, r.payload_bytes) {
            (Some(c), 0) => format!(
                "deltapack bench, scale {} ({} MB chain result): median time vs floor",
                r.scale,
                c.result_bytes / 1_000_000
            ),
            _ => format!(
                "deltapack bench, scale {} ({} MB delta): median time vs floor",
                r.scale,
                r.payload_bytes / 1_000_000
            ),
        };
        let labels: Vec<String> = rows.iter().map(|s| s.label.clone()).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(390)
            .build_cartesian_2d(0.0..xmax, (0..n).into_segmented())
            .map_err(|e| anyhow!("plot: {e}"))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE)
            .x_desc("seconds (grey: floors; black mark: the scenario's floor; green: ≤ 1.25× its floor, orange: above)")
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .draw()
            .map_err(|e| anyhow!("plot: {e}"))?;
        let colour = |s: &Scenario| match (s.group, s.ratio) {
            ("floor", _) => RGBColor(170, 170, 170),
            (_, Some(x)) if x <= 1.25 => RGBColor(60, 140, 80),
            (_, Some(_)) => RGBColor(210, 110, 40),
            _ => RGBColor(70, 110, 180),
        };
        chart
            .draw_series(rows.iter().enumerate().map(|(i, s)| {
                let mut bar = Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (s.median_ms / 1000.0, SegmentValue::Exact(i + 1)),
                    ],
                    colour(s).filled(),
                );
                bar.set_margin(5, 5, 0, 0);
                bar
            }))
            .map_err(|e| anyhow!("plot: {e}"))?;
        chart
            .draw_series(rows.iter().enumerate().filter_map(|(i, s)| {
                let f = s.floor_ms? / 1000.0;
                let mut tick = Rectangle::new(
                    [
                        (f, SegmentValue::Exact(i)),
                        (f + xmax * 0.004, SegmentValue::Exact(i + 1)),
                    ],
                    BLACK.filled(),
                );
                tick.set_margin(2, 2, 0, 0);
                Some(tick)
            }))
            .map_err(|e| anyhow!("plot: {e}"))?;
        chart
            .draw_series(rows.iter().enumerate().map(|(i, s)| {
                let text = match s.ratio {
                    Some(x) => format!("{}  ({x:.2}× floor)", secs(s.median_ms)),
                    None => secs(s.median_ms),
                };
                Text::new(
                    text,
                    (
                        s.median_ms / 1000.0 + xmax * 0.005,
                        SegmentValue::CenterOf(i),
                    ),
                    ("sans-serif", 13),
                )
            }))
            .map_err(|e| anyhow!("plot: {e}"))?;
        root.present().map_err(|e| anyhow!("plot: {e}"))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_rounds_to_pages_and_respects_the_base() {
        let w = Workload::from_scale(1.0, 64 << 20).expect("w");
        assert_eq!(w.result_tokens, REFERENCE_RESULT_TOKENS);
        let w = Workload::from_scale(0.015625, 64 << 20).expect("w");
        assert_eq!(w.result_tokens, BASE_TOKENS + 256);
        let w = Workload::from_scale(0.1, 64 << 20).expect("w");
        assert_eq!(w.result_tokens % 256, 0);
        assert!(Workload::from_scale(0.0, 64 << 20).is_err());
        assert!(Workload::from_scale(1.0, 1000).is_err());
    }

    #[test]
    fn medians_and_urls() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(
            s3_child_url("s3://b/p/?endpoint=http://x:1", "leaf"),
            "s3://b/p/leaf?endpoint=http://x:1"
        );
        assert_eq!(s3_child_url("s3://b", "leaf"), "s3://b/leaf");
    }

    #[test]
    fn regions_follow_spans() {
        let files = vec![
            ExtentFile {
                path: PathBuf::new(),
                offset: 0,
                len: 10,
                name: Digest::blake3(b""),
            },
            ExtentFile {
                path: PathBuf::new(),
                offset: 10,
                len: 10,
                name: Digest::blake3(b""),
            },
        ];
        // payload [4, 20) goes to [100, 116); [0, 4) is a header (not copied)
        let spans = [Span {
            src: 4,
            dst: 100,
            len: 16,
        }];
        let mut buf = vec![0u8; 120];
        let mut rs = regions(&mut buf, &spans, &files);
        let payload: Vec<u8> = (0..20).collect();
        rs[0].place(0, &payload[..10]);
        rs[1].place(10, &payload[10..]);
        drop(rs);
        assert_eq!(&buf[100..116], &payload[4..20]);
        assert!(buf[..100].iter().all(|&b| b == 0));
    }
}

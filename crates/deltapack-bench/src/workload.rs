//! The workload: the synthetic conversation (snapshots, token contexts,
//! publication requests), the chain scenario's conversations of N turns,
//! and the set-up of the local stores the scenarios run on (opening,
//! cloning, steady-state directories, page-cache control).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use deltapack_format::synth::{self, Preset};
use deltapack_format::{CacheIdentity, ContextDigest, ContextHasher, ExtentPlan, Snapshot};
use deltapack_store::{BaseInput, ChainPolicy, PublishRequest, RootFormat, Store, StoreConfig};
use serde::{Deserialize, Serialize};

/// Result tokens of the reference workload (`--scale 1`).
pub(crate) const REFERENCE_RESULT_TOKENS: u64 = 262_144;
/// Base tokens of the workload (every scale).
pub(crate) const BASE_TOKENS: u64 = 4096;
/// Seed of the synthetic conversation.
pub(crate) const SEED: u64 = 1;
/// Bytes in a MiB.
pub(crate) const MIB: u64 = 1 << 20;

/// The benchmark conversation at one scale.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Workload {
    /// Tokens of the base (turn N).
    pub(crate) base_tokens: u64,
    /// Tokens of the result (turn N + 1).
    pub(crate) result_tokens: u64,
    /// Extent size M of the v2 stores.
    pub(crate) extent_bytes: u64,
}

impl Workload {
    /// The workload at `scale` (see `--scale`).
    pub(crate) fn from_scale(scale: f64, extent_bytes: u64) -> Result<Self> {
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

    /// The cache identity every scenario publishes under.
    pub(crate) fn identity() -> CacheIdentity {
        let mut id = CacheIdentity::example();
        id.attributes
            .insert("deltapack.bench".into(), "reference-workload".into());
        id
    }

    /// Context digests of the base and the result.
    pub(crate) fn contexts(&self) -> Result<(ContextDigest, ContextDigest)> {
        let id = Self::identity();
        let n = usize::try_from(self.result_tokens).context("too many tokens")?;
        let tokens = synth::tokens(SEED, n);
        let h = ContextHasher::new(id.namespace(), id.chunk_tokens)?;
        Ok((
            h.digest(&tokens[..self.base_tokens as usize]),
            h.digest(&tokens),
        ))
    }

    /// The base snapshot.
    pub(crate) fn base(&self) -> Result<Snapshot> {
        Ok(synth::snapshot(Preset::Default, SEED, self.base_tokens)?)
    }

    /// The result snapshot.
    pub(crate) fn result(&self) -> Result<Snapshot> {
        Ok(synth::snapshot(Preset::Default, SEED, self.result_tokens)?)
    }

    /// The stores' configuration (the workload's extent size; ranged-GET
    /// and multipart knobs from the CLI's environment variables, for A/B
    /// runs).
    pub(crate) fn config(&self) -> StoreConfig {
        with_env_knobs(StoreConfig::default().with_max_extent_bytes(self.extent_bytes))
    }

    /// Publication of the base (`result: None`) or of the result as a delta
    /// on the base.
    pub(crate) fn request(
        &self,
        format: Fmt,
        base: &Arc<Snapshot>,
        result: Option<&Arc<Snapshot>>,
    ) -> Result<PublishRequest> {
        let (bctx, rctx) = self.contexts()?;
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

    /// Synthesizes the base and the result on a blocking thread.
    pub(crate) async fn synth_pair(self) -> Result<(Arc<Snapshot>, Arc<Snapshot>)> {
        tokio::task::spawn_blocking(move || -> Result<_> {
            Ok((Arc::new(self.base()?), Arc::new(self.result()?)))
        })
        .await
        .context("synthesis task")?
    }
}

/// Root format, serializable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Fmt {
    /// v2 (extents).
    V2,
    /// Legacy v1 (chunk objects).
    V1,
}

impl Fmt {
    /// The store's root format.
    pub(crate) fn root_format(self) -> RootFormat {
        match self {
            Fmt::V2 => RootFormat::V2,
            Fmt::V1 => RootFormat::V1,
        }
    }

    /// `v2` or `v1`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Fmt::V2 => "v2",
            Fmt::V1 => "v1",
        }
    }
}

/// One conversation of the chain scenario: `turns` turns ending at
/// `final_tokens`. Turn k ends at `round_to_chunk(k × final / N)`; every
/// turn is the workload's synthetic conversation at that length (same
/// seed), so turn k+1 extends turn k.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Conversation {
    /// N.
    pub(crate) turns: u32,
    /// Tokens of the last turn.
    pub(crate) final_tokens: u64,
    /// Tokens per chunk (turn boundaries are multiples).
    pub(crate) chunk_tokens: u64,
    /// Extent size M.
    pub(crate) extent_bytes: u64,
}

impl Conversation {
    /// `turns` turns ending in the workload's result.
    pub(crate) fn new(turns: u32, w: &Workload) -> Self {
        Conversation {
            turns,
            final_tokens: w.result_tokens,
            chunk_tokens: u64::from(Workload::identity().chunk_tokens),
            extent_bytes: w.extent_bytes,
        }
    }

    /// Turn boundaries: turn k ends at `round_to_chunk(k × final / N)`, the
    /// last turn at `final`. Fails unless they strictly increase.
    pub(crate) fn boundaries(&self) -> Result<Vec<u64>> {
        let (n, f, c) = (u64::from(self.turns), self.final_tokens, self.chunk_tokens);
        if n == 0 || f % c != 0 {
            bail!("{n} turns of a {f}-token conversation in {c}-token chunks");
        }
        let b: Vec<u64> = (1..=n)
            .map(|k| {
                ((u128::from(k) * u128::from(f) + u128::from(n * c / 2)) / u128::from(n * c)) as u64
                    * c
            })
            .collect();
        if b[0] == 0 || b.windows(2).any(|p| p[0] >= p[1]) || b[b.len() - 1] != f {
            bail!(
                "{n} turns do not fit a {f}-token conversation ({} chunks of {c} tokens)",
                f / c
            );
        }
        Ok(b)
    }

    /// The store configuration: the workload's extents, rebasing off.
    pub(crate) fn config(&self) -> StoreConfig {
        with_env_knobs(
            StoreConfig::default()
                .with_chain(ChainPolicy::unbounded())
                .with_max_extent_bytes(self.extent_bytes),
        )
    }

    /// The context hasher of the workload's identity.
    pub(crate) fn hasher(&self) -> Result<ContextHasher> {
        let id = Workload::identity();
        Ok(ContextHasher::new(id.namespace(), id.chunk_tokens)?)
    }

    /// The context digest of the last turn.
    pub(crate) fn final_context(&self) -> Result<ContextDigest> {
        let n = usize::try_from(self.final_tokens)?;
        Ok(self.hasher()?.digest(&synth::tokens(SEED, n)))
    }
}

/// Synthesizes the conversation's snapshot at `tokens` on a blocking thread.
pub(crate) async fn synth_at(tokens: u64) -> Result<Arc<Snapshot>> {
    tokio::task::spawn_blocking(move || -> Result<_> {
        Ok(Arc::new(synth::snapshot(Preset::Default, SEED, tokens)?))
    })
    .await
    .context("synthesis task")?
}

/// One chain turn's (v2) publication request.
pub(crate) fn turn_request(
    snap: &Arc<Snapshot>,
    ctx: ContextDigest,
    base: Option<&(ContextDigest, Arc<Snapshot>)>,
) -> PublishRequest {
    PublishRequest {
        identity: Workload::identity(),
        context: ctx,
        snapshot: snap.clone(),
        base: base.map(|(c, s)| BaseInput {
            context: *c,
            snapshot: s.clone(),
        }),
        format: RootFormat::V2,
    }
}

// ------------------------------------------------------------------ stores

/// Opens a store by URL.
pub(crate) fn open_store(url: &str, config: StoreConfig) -> Result<Store> {
    Store::open(url, config).with_context(|| format!("cannot open store {url}"))
}

/// Opens the local store in `dir` with the workload's configuration.
pub(crate) fn open_local(dir: &Path, w: &Workload) -> Result<Store> {
    open_local_with(dir, w.config())
}

/// Opens the local store in `dir`.
pub(crate) fn open_local_with(dir: &Path, config: StoreConfig) -> Result<Store> {
    open_store(&format!("file://{}", dir.display()), config)
}

/// Puts a local store in steady state for a timed publication: a store in
/// use has its object fan-out directories (`objects/<alg>/<hh>/`), which a
/// fresh store creates (and fsyncs) on first use — not what a publication
/// costs in service. Creates them for every `alg` and syncs them.
pub(crate) fn fan_out(dir: &Path, algs: &[&str]) -> Result<()> {
    let objects = dir.join("objects");
    for alg in algs {
        for b in 0..=255u8 {
            std::fs::create_dir_all(objects.join(alg).join(format!("{b:02x}")))?;
        }
    }
    for alg in algs {
        File::open(objects.join(alg))?.sync_all()?;
    }
    File::open(&objects)?.sync_all()?;
    Ok(())
}

/// Copies a local store for another publication of the same last turn:
/// immutable objects and roots hard-linked, everything else (the ledger)
/// copied. Falls back to copying where hard links fail.
pub(crate) fn clone_store(from: &Path, to: &Path) -> Result<()> {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        std::fs::create_dir_all(to.join(&rel))?;
        for entry in std::fs::read_dir(from.join(&rel))? {
            let entry = entry?;
            let r = rel.join(entry.file_name());
            let ft = entry.file_type()?;
            if ft.is_dir() {
                stack.push(r);
            } else if ft.is_file() {
                let immutable = matches!(
                    r.components().next().and_then(|c| c.as_os_str().to_str()),
                    Some("objects" | "roots")
                );
                if !(immutable && std::fs::hard_link(from.join(&r), to.join(&r)).is_ok()) {
                    std::fs::copy(from.join(&r), to.join(&r))
                        .with_context(|| format!("cloning {}", r.display()))?;
                }
            }
        }
    }
    Ok(())
}

/// Calls `f` on every regular file below `dir` (depth first).
pub(crate) fn for_each_file(dir: &Path, mut f: impl FnMut(&Path) -> Result<()>) -> Result<()> {
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

/// Total bytes of the files under `dir/objects` (0 if unreadable).
pub(crate) fn objects_bytes(dir: &Path) -> u64 {
    let mut n = 0;
    let counted = for_each_file(&dir.join("objects"), |p| {
        n += std::fs::metadata(p)?.len();
        Ok(())
    });
    if counted.is_err() {
        return 0;
    }
    n
}

/// Reads every file of a store once (objects, roots, ledger), so that the
/// timed restore finds the page cache warm. Returns the bytes read.
pub(crate) fn warm_page_cache(dir: &Path) -> Result<u64> {
    use std::io::Read;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    for_each_file(dir, |p| {
        let mut f = File::open(p)?;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            total += n as u64;
        }
    })?;
    Ok(total)
}

/// Drops every file under `dir` from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`). Returns the number of files.
pub(crate) fn evict(dir: &Path) -> Result<usize> {
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

/// A zero-filled buffer whose pages are not touched yet, allocated as the
/// store allocates a restore's result ([`deltapack_store::fresh_buffer`]:
/// huge pages advised, faulted in where written), so that a floor writing
/// into a new buffer pays the same page faults as the restore it bounds.
pub(crate) fn fresh_buffer(len: usize) -> anyhow::Result<Vec<u8>> {
    Ok(deltapack_store::fresh_buffer(len)?)
}

/// A buffer whose pages are all resident.
pub(crate) fn touched_buffer(len: usize) -> Vec<u8> {
    vec![1u8; len]
}

/// A unique suffix for temporary names.
pub(crate) fn unique() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{}-{t}", std::process::id())
}

/// `s3://bucket/prefix?q` → `s3://bucket/prefix/<leaf>?q`.
pub(crate) fn s3_child_url(url: &str, leaf: &str) -> String {
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

/// Applies `DELTAPACK_RANGES_IN_FLIGHT`, `DELTAPACK_RANGE_BYTES`,
/// `DELTAPACK_PARTS_IN_FLIGHT`, `DELTAPACK_PART_BYTES`,
/// `DELTAPACK_CHAIN_GETS_IN_FLIGHT` and `DELTAPACK_ROOTS_IN_FLIGHT` (the
/// CLI's variables) when set, so a run can compare settings; a value that does
/// not parse is ignored with a warning.
pub(crate) fn with_env_knobs(mut c: StoreConfig) -> StoreConfig {
    let r = &mut c.remote;
    for (name, knob) in [
        (
            "DELTAPACK_RANGES_IN_FLIGHT",
            Knob::Count(&mut r.ranges_in_flight),
        ),
        ("DELTAPACK_RANGE_BYTES", Knob::Size(&mut r.range_bytes)),
        (
            "DELTAPACK_PARTS_IN_FLIGHT",
            Knob::Count(&mut r.parts_in_flight),
        ),
        ("DELTAPACK_PART_BYTES", Knob::Size(&mut r.part_bytes)),
        (
            "DELTAPACK_CHAIN_GETS_IN_FLIGHT",
            Knob::Count(&mut r.chain_gets_in_flight),
        ),
        (
            "DELTAPACK_ROOTS_IN_FLIGHT",
            Knob::Count(&mut r.roots_in_flight),
        ),
    ] {
        let Ok(v) = std::env::var(name) else {
            continue;
        };
        let set = match knob {
            Knob::Count(field) => match v.parse::<usize>() {
                Ok(n) if n > 0 => {
                    *field = n;
                    Ok(())
                }
                _ => Err("not a positive integer".to_string()),
            },
            Knob::Size(field) => deltapack_store::units::parse_size(&v).map(|n| *field = n),
        };
        if let Err(why) = set {
            eprintln!("bench: {name}={v} ignored: {why}");
        }
    }
    c
}

/// A setting of [`with_env_knobs`].
enum Knob<'a> {
    /// A positive integer.
    Count(&'a mut usize),
    /// A size in bytes (`64MiB`, `1000`, …).
    Size(&'a mut u64),
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
    fn s3_urls() {
        assert_eq!(
            s3_child_url("s3://b/p/?endpoint=http://x:1", "leaf"),
            "s3://b/p/leaf?endpoint=http://x:1"
        );
        assert_eq!(s3_child_url("s3://b", "leaf"), "s3://b/leaf");
    }

    #[test]
    fn turn_boundaries_split_on_chunks_and_end_at_the_final_snapshot() {
        let c = |turns, final_tokens| Conversation {
            turns,
            final_tokens,
            chunk_tokens: 256,
            extent_bytes: 1 << 20,
        };
        assert_eq!(c(1, 4352).boundaries().expect("1"), vec![4352]);
        assert_eq!(
            c(4, 4352).boundaries().expect("4"),
            vec![1024, 2304, 3328, 4352]
        );
        let b = c(256, 262_144).boundaries().expect("256");
        assert_eq!(b.len(), 256);
        assert!(b.iter().all(|x| x % 256 == 0));
        assert_eq!(b[0], 1024);
        assert_eq!(*b.last().expect("last"), 262_144);
        let b = c(17, 4352).boundaries().expect("17 of 17 chunks");
        assert_eq!(b[0], 256);
        assert!(c(18, 4352).boundaries().is_err());
        assert!(c(256, 32_768).boundaries().is_err());
    }
}

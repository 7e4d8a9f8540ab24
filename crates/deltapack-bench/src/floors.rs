//! The floors every ratio is measured against, on the same bytes and in the
//! same run as the scenarios:
//!
//! * **raw**: read the payload's extent files, one BLAKE3 pass (extent
//!   subtrees on all cores), one copy into a pre-touched buffer;
//! * **spec**: what the specification requires of a delta restore — read +
//!   BLAKE3 of the delta + copy of the result (base spans and tails) into a
//!   fresh buffer + BLAKE3 of the result (also reported with a pre-touched
//!   result buffer);
//! * **durable write**: write + fsync + rename + directory fsync of the same
//!   bytes in extent-sized files (one and two streams, buffered and with
//!   direct I/O from aligned buffers; the fastest counts).
//!
//! The read floors place bytes with the same planning as the store's
//! restore ([`deltapack_format::scatter`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use deltapack_format::delta::{self, CopyOp, PageDelta};
use deltapack_format::scatter::{self, Region, Span};
use deltapack_format::{DecodedRoot, Digest, ExtentPlan, ManifestV2, Snapshot};
use deltapack_store::{keys, RootStatus};

use crate::job::{Acc, JobOutput, ReadFloor};
use crate::measure::{median, ms, threads, CpuSample};
use crate::workload::{evict, fresh_buffer, open_local, touched_buffer, Workload};

/// Piece size of the floors' fused read → hash → copy loop (fits in L2).
const PIECE: usize = 256 * 1024;

/// Reads the v2 delta manifest of the workload from a local store.
pub(crate) async fn v2_manifest(dir: &Path, w: &Workload) -> Result<ManifestV2> {
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
pub(crate) struct ExtentFile {
    /// The object's file.
    pub(crate) path: PathBuf,
    /// Payload offset.
    offset: u64,
    /// Raw length.
    len: u64,
    /// Its name (subtree chaining value).
    name: Digest,
}

/// The extent files of a v2 manifest in a local store.
pub(crate) fn extent_files(dir: &Path, m: &ManifestV2) -> Vec<ExtentFile> {
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

/// The floors' fused loop: every extent file read in `PIECE`-sized
/// positioned reads into a per-thread buffer, hashed as its BLAKE3 subtree
/// while in cache and copied to its region; extents spread over `threads`
/// std threads. Returns the verified extent names in order.
fn fused(
    plan: &ExtentPlan,
    files: &[ExtentFile],
    regions: Vec<Region<'_, '_>>,
    threads: usize,
) -> Result<Vec<Digest>> {
    use std::os::unix::fs::FileExt;
    let slots: Vec<Mutex<Option<Region<'_, '_>>>> =
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

/// One read floor (a child job): untimed preparation (buffers, the base,
/// the copy plan), then the timed read → hash → place of every extent and,
/// for the spec floors, the BLAKE3 of the result.
pub(crate) async fn job_read_floor(
    w: Workload,
    store_v2: &Path,
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
            None => fresh.insert(fresh_buffer(result_len)?),
        };
        if let (Some(p), Some(b)) = (&delta_plan, &base) {
            p.write_base_spans(b.payload(), buf)?;
        }
        let extents = files.iter().map(|f| f.offset..f.offset + f.len);
        let regions = scatter::regions(buf.as_mut_slice(), &spans, extents)
            .collect::<deltapack_format::Result<Vec<_>>>()?;
        let names = fused(&plan, &files, regions, threads())?;
        let t_read = t.elapsed();
        if plan.merge(&names)? != m.payload_digest {
            bail!("floor: payload digest mismatch");
        }
        if floor != ReadFloor::Raw {
            // By the root's definition: BLAKE3 of the encoding, or the
            // layered digest of a v2.2 root (what the restore computes).
            let d = deltapack_format::layer_digest::digest_like_encoding(
                &buf[..],
                &m.result_snapshot_digest,
            )?;
            if d != m.result_snapshot_digest {
                bail!("floor: result digest {d} != {}", m.result_snapshot_digest);
            }
        }
        out.times_ms.push(ms(t.elapsed()));
        out.record_cpu(&cpu);
        out.put("read_hash_copy_ms", ms(t_read));
        out.put("objects", files.len());
        out.put("payload_bytes", m.payload_len);
        out.put("result_bytes", m.result_snapshot_len);
        drop(fresh);
        Ok(out)
    })
    .await
    .context("read floor task")?
}

// ------------------------------------------------------------------ writes

/// The payload a publication of `result` writes (a delta on `base`, or the
/// snapshot itself), cut into extent-sized chunks: the write floors' bytes.
pub(crate) async fn payload_chunks(
    base: Option<Arc<Snapshot>>,
    result: Arc<Snapshot>,
    chunk_tokens: u32,
    extent_bytes: u64,
) -> Result<Vec<Vec<u8>>> {
    let m = usize::try_from(extent_bytes)?;
    tokio::task::spawn_blocking(move || -> Result<Vec<Vec<u8>>> {
        let d = match &base {
            Some(b) => delta::encode(chunk_tokens, b, &result)?,
            None => result.encoded().to_vec(),
        };
        Ok(d.chunks(m).map(<[u8]>::to_vec).collect())
    })
    .await
    .context("delta encoder task")?
}

/// Durable write floors of `chunks` (one file each) in scratch directories
/// `{dir}-{variant}`: buffered with each of `buffered` stream counts, then
/// (from 4 KiB-aligned copies prepared untimed) direct I/O with each of
/// `direct`. Returns `(variant, run)` with variants `1`, `2`, `1-direct`,
/// …; a filesystem that refuses `O_DIRECT` has no direct variants. Blocks.
pub(crate) fn write_floors(
    dir: &Path,
    chunks: Vec<Vec<u8>>,
    buffered: &[usize],
    direct: &[usize],
) -> Result<Vec<(String, JobOutput)>> {
    let payload_bytes: u64 = chunks.iter().map(|c| c.len() as u64).sum();
    let files = chunks.len();
    let scratch = |variant: &str| {
        let mut name = dir.file_name().unwrap_or_default().to_os_string();
        name.push(format!("-{variant}"));
        dir.with_file_name(name)
    };
    let timed = |d: &Path, write: &dyn Fn(&Path) -> Result<bool>| -> Result<Option<JobOutput>> {
        let mut o = JobOutput::default();
        let cpu = CpuSample::now();
        let t = Instant::now();
        let written = write(d)?;
        o.times_ms.push(ms(t.elapsed()));
        o.record_cpu(&cpu);
        std::fs::remove_dir_all(d)?;
        o.put("files", files);
        o.put("payload_bytes", payload_bytes);
        Ok(written.then_some(o))
    };
    let mut out = Vec::new();
    for &streams in buffered {
        let variant = format!("{streams}");
        let d = scratch(&variant);
        if let Some(o) = timed(&d, &|d| durable_write(d, &chunks, streams).map(|()| true))? {
            out.push((variant, o));
        }
    }
    // Direct I/O (O_DIRECT) from 4 KiB-aligned copies of the chunks
    // (prepared untimed): no page-cache copy at all.
    let aligned: Vec<(Vec<u8>, usize)> = chunks.iter().map(|c| aligned_copy(c)).collect();
    drop(chunks);
    for &streams in direct {
        let variant = format!("{streams}-direct");
        let d = scratch(&variant);
        if let Some(o) = timed(&d, &|d| durable_write_direct(d, &aligned, streams))? {
            out.push((variant, o));
        }
    }
    Ok(out)
}

/// The fastest of the write floor variants `{prefix}-{variant}` in `accs`
/// (by median): its id, its runs, and the median of every variant measured
/// as `median_ms_{variant}_stream` (dashes as underscores).
pub(crate) fn fastest_write_floor<'a>(
    accs: &'a BTreeMap<String, Acc>,
    prefix: &str,
    variants: &[&str],
) -> Option<(String, &'a Acc, BTreeMap<String, serde_json::Value>)> {
    let measured: Vec<(&str, String, &Acc)> = variants
        .iter()
        .filter_map(|k| {
            let id = format!("{prefix}-{k}");
            accs.get(&id).map(|a| (*k, id, a))
        })
        .collect();
    let medians = measured
        .iter()
        .map(|(k, _, a)| {
            (
                format!("median_ms_{}_stream", k.replace('-', "_")),
                serde_json::json!(median(&a.times)),
            )
        })
        .collect();
    let (_, id, best) = measured
        .into_iter()
        .min_by(|a, b| median(&a.2.times).total_cmp(&median(&b.2.times)))?;
    Some((id, best, medians))
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
fn durable_write_direct(dir: &Path, chunks: &[(Vec<u8>, usize)], streams: usize) -> Result<bool> {
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
fn durable_write(dir: &Path, chunks: &[Vec<u8>], streams: usize) -> Result<()> {
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
    dir: &Path,
    files: usize,
    streams: usize,
    write: impl Fn(usize, &Path) -> std::io::Result<File> + Sync,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_floors_write_and_remove_every_variant() {
        let tmp = std::env::temp_dir().join(format!("dp-floors-{}", crate::workload::unique()));
        std::fs::create_dir_all(&tmp).expect("tmp");
        let chunks = vec![vec![7u8; 5000], vec![9u8; 300]];
        let runs = write_floors(&tmp.join("floor"), chunks, &[2, 1], &[1]).expect("floors");
        let names: Vec<&str> = runs.iter().map(|(v, _)| v.as_str()).collect();
        // Direct I/O is refused by some filesystems (tmpfs): then no variant.
        assert!(
            names == ["2", "1", "1-direct"] || names == ["2", "1"],
            "{names:?}"
        );
        for (_, o) in &runs {
            assert_eq!(o.times_ms.len(), 1);
            assert_eq!(o.num("payload_bytes"), Some(5300.0));
        }
        let left: Vec<_> = std::fs::read_dir(&tmp).expect("list").collect();
        assert!(left.is_empty(), "scratch directories left behind");
        std::fs::remove_dir_all(&tmp).expect("cleanup");
    }

    #[test]
    fn the_fastest_write_floor_carries_every_median() {
        let mut accs = BTreeMap::new();
        for (k, t) in [("1", 30.0), ("2", 20.0), ("1-direct", 25.0)] {
            let mut o = JobOutput::default();
            o.times_ms.push(t);
            accs.entry(format!("floor-write-{k}"))
                .or_insert_with(Acc::default)
                .add(o);
        }
        let (id, best, medians) =
            fastest_write_floor(&accs, "floor-write", &["1", "2", "1-direct", "2-direct"])
                .expect("some");
        assert_eq!(id, "floor-write-2");
        assert_eq!(best.times, vec![20.0]);
        assert_eq!(medians.len(), 3);
        assert_eq!(
            medians["median_ms_1_direct_stream"],
            serde_json::json!(25.0)
        );
        assert!(fastest_write_floor(&BTreeMap::new(), "x", &["1"]).is_none());
    }
}

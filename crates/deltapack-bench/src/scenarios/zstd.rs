//! The zstd study (part of `all`): compression ratio and speed, one core,
//! on one extent of the delta and on zero-heavy variants of it, with the
//! library's extent codec.

use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};

use crate::floors::{extent_files, v2_manifest};
use crate::job::JobOutput;
use crate::measure::median;
use crate::report::ZstdRow;
use crate::workload::Workload;

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

/// The zstd study on one extent of the v2 store (a child job).
pub(crate) async fn job_zstd(w: Workload, store_v2: &Path, repeats: u32) -> Result<JobOutput> {
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

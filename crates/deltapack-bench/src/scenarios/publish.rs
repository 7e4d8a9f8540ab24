//! Publication scenarios: durable v2 and v1 publication of the workload's
//! delta into fresh local stores, interleaved round by round with the
//! durable write floor of the same bytes, publication through the
//! bandwidth-shaped S3 emulation, and publication on a real S3 server. The timed publication itself ([`timed_publish`]) is shared with
//! the chain scenario.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use deltapack_format::{delta, ExtentPlan, Snapshot};
use deltapack_store::{PublishOutcome, PublishReceipt, PublishRequest, Store};
use futures::TryStreamExt;
use object_store::{ObjectMeta, ObjectStoreExt};

use crate::floors::{payload_chunks, write_floors};
use crate::job::JobOutput;
use crate::measure::{ms, proc_status, reset_peak, CpuSample};
use crate::scenarios::restore::put_shaped_counters;
use crate::shaped::{shaped_memory_store, Shaping};
use crate::workload::{fan_out, fresh_buffer, open_local, open_store, Fmt, Workload};

/// One timed publication in this process: the peak RSS is reset first, and
/// the request is built inside the timed section. Records the time, the
/// CPU time, RSS at start and peak, and the receipt's encode and write
/// times, objects and payload bytes.
pub(crate) async fn timed_publish(
    store: &Store,
    request: impl FnOnce() -> Result<PublishRequest>,
) -> Result<(JobOutput, PublishReceipt)> {
    let mut out = JobOutput::default();
    reset_peak();
    out.rss_start = proc_status("VmRSS");
    let cpu = CpuSample::now();
    let t = Instant::now();
    let receipt = store.publish(request()?).await?;
    out.times_ms.push(ms(t.elapsed()));
    out.record_cpu(&cpu);
    out.peak = proc_status("VmHWM");
    out.put("encode_ms", ms(receipt.encode_time));
    out.put("write_ms", ms(receipt.write_time));
    out.put("objects", receipt.objects_written);
    out.put("payload_bytes", receipt.payload_len);
    Ok((out, receipt))
}

/// One timed durable publication of the delta into a fresh store (the base
/// published untimed first; the store in steady state, see [`fan_out`]).
async fn publish_once(
    w: &Workload,
    format: Fmt,
    dir: &Path,
    base: &Arc<Snapshot>,
    result: &Arc<Snapshot>,
) -> Result<JobOutput> {
    let store = open_local(dir, w)?;
    store.publish(w.request(format, base, None)?).await?;
    fan_out(dir, &["blake3", "sha256"])?;
    let (out, receipt) = timed_publish(&store, || w.request(format, base, Some(result))).await?;
    if receipt.outcome != PublishOutcome::Created {
        bail!("publication was {:?}, not created", receipt.outcome);
    }
    Ok(out)
}

/// The publication suite (a child job): per round, the write floors of the
/// delta's bytes (two and one streams, buffered then direct I/O) and a
/// timed v2 and v1 publication, each into a fresh store; the last round's
/// stores are kept (the restore scenarios read them). Then, untimed by the
/// scenarios, where a publication's CPU goes.
pub(crate) async fn job_publish_suite(
    w: Workload,
    keep_v2: &Path,
    keep_v1: &Path,
    scratch: &Path,
    rounds: u32,
) -> Result<JobOutput> {
    let (base, result) = w.synth_pair().await?;
    let mut out = JobOutput::default();
    for round in 0..rounds {
        // The write floor on the same bytes (the encoded delta, cut into
        // extent-sized files).
        let chunks =
            payload_chunks(Some(base.clone()), result.clone(), 256, w.extent_bytes).await?;
        let dir = scratch.join(format!("floor-{round}"));
        let floors = tokio::task::block_in_place(|| write_floors(&dir, chunks, &[2, 1], &[2, 1]))?;
        for (variant, o) in floors {
            out.push_sub(format!("floor-write-{variant}"), o);
        }
        for (format, keep) in [(Fmt::V2, keep_v2), (Fmt::V1, keep_v1)] {
            let dir = scratch.join(format!("{}-{round}", format.name()));
            let o = publish_once(&w, format, &dir, &base, &result).await?;
            out.push_sub(format!("publish-{}", format.name()), o);
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
    let costs = publication_costs(base.clone(), result.clone(), w.extent_bytes).await?;
    if let Some(runs) = out.sub.get_mut("publish-v2") {
        for run in runs.iter_mut() {
            for (k, v) in &costs {
                run.put(k, v);
            }
        }
    }
    put_sizes(&mut out, &base, &result);
    Ok(out)
}

/// Records the encoded sizes of the base and the result a publication job
/// published.
fn put_sizes(out: &mut JobOutput, base: &Snapshot, result: &Snapshot) {
    out.put("base_bytes", base.encoded().len());
    out.put("result_bytes", result.encoded().len());
}

/// Where a publication's CPU goes, piece by piece (same bytes, wall ms).
async fn publication_costs(
    b: Arc<Snapshot>,
    r: Arc<Snapshot>,
    m: u64,
) -> Result<BTreeMap<String, f64>> {
    tokio::task::spawn_blocking(move || -> Result<BTreeMap<String, f64>> {
        let mut c = BTreeMap::new();
        let mut time = |k: &str, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
            let t = Instant::now();
            f()?;
            c.insert(k.to_string(), ms(t.elapsed()));
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
            let mut v = fresh_buffer(d.len())?;
            v.copy_from_slice(&d);
            std::hint::black_box(&v);
            Ok(())
        })?;
        Ok(c)
    })
    .await
    .context("publication cost task")?
}

/// Publication of the (scaled) workload on a real S3 server, v2 then v1
/// (a child job; the timings are informational).
pub(crate) async fn job_s3_publish(w: Workload, url_v2: &str, url_v1: &str) -> Result<JobOutput> {
    let (base, result) = w.synth_pair().await?;
    let mut out = JobOutput::default();
    for (format, url) in [(Fmt::V2, url_v2), (Fmt::V1, url_v1)] {
        let store = open_store(url, w.config())?;
        store.publish(w.request(format, &base, None)?).await?;
        let t = Instant::now();
        let receipt = store
            .publish(w.request(format, &base, Some(&result))?)
            .await?;
        let ms = ms(t.elapsed());
        out.times_ms.push(ms);
        out.put(&format!("{}_ms", format.name()), ms);
        out.put(
            &format!("{}_objects", format.name()),
            receipt.objects_written,
        );
        out.put("payload_bytes", receipt.payload_len);
    }
    put_sizes(&mut out, &base, &result);
    Ok(out)
}

/// Deletes every object under the given store URLs (a child job).
pub(crate) async fn job_s3_cleanup(urls: &[String]) -> Result<JobOutput> {
    let mut deleted = 0u64;
    for url in urls {
        let os = deltapack_store::open_backend(url)
            .with_context(|| format!("cannot open {url}"))?
            .store;
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

/// Publication through the bandwidth-shaped S3 emulation (a child job):
/// per round, the delta published as v2 into a fresh in-memory object
/// store unshaped (`publish-v2-inmem`: the CPU's headroom over A) and into
/// a fresh shaped one (`publish-v2-shaped`). In both, the base is published
/// first, untimed (with shaping off).
pub(crate) async fn job_shaped_publish(
    w: Workload,
    shaping: Shaping,
    rounds: u32,
) -> Result<JobOutput> {
    let (base, result) = w.synth_pair().await?;
    let mut out = JobOutput::default();
    for _ in 0..rounds {
        for (id, shaping) in [
            ("publish-v2-inmem", None),
            ("publish-v2-shaped", Some(shaping)),
        ] {
            let (store, shaper) = shaped_memory_store(shaping, w.config())?;
            if let Some(sh) = &shaper {
                sh.set_enabled(false);
            }
            store.publish(w.request(Fmt::V2, &base, None)?).await?;
            let before = shaper.as_ref().map(|sh| {
                sh.set_enabled(true);
                sh.reset_max_open();
                sh.counters()
            });
            let (mut o, receipt) =
                timed_publish(&store, || w.request(Fmt::V2, &base, Some(&result))).await?;
            if receipt.outcome != PublishOutcome::Created {
                bail!("publication was {:?}, not created", receipt.outcome);
            }
            if let (Some(sh), Some(b)) = (&shaper, before) {
                put_shaped_counters(&mut o, sh, b);
            }
            out.push_sub(id.to_string(), o);
        }
    }
    put_sizes(&mut out, &base, &result);
    Ok(out)
}

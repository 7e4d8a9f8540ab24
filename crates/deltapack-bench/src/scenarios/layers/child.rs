//! The `layers` suite's child jobs: the flat store's publication and one
//! timed measure ([`job_measure`]), with the simulated consumer
//! ([`Pacer`]).

use std::ops::Range;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use deltapack_format::{ContextDigest, Digest, Namespace, RootSummary};
use deltapack_store::{
    LayerOrder, LayerProof, RestoreIntoOutcome, RestoreOptions, RootStatus, Store,
};
use serde::Serialize;

use crate::job::{JobOutput, LayersMode, LayersSpec};
use crate::measure::{ms, CpuSample, PeakWindow};
use crate::scenarios::restore::put_shaped_counters;
use crate::workload::{open_local, synth_at, touched_buffer, Fmt, Workload};

// ------------------------------------------------------------------ pacing

/// When a consumer at `bytes_per_s` may be done with `bytes` bytes, after
/// its first byte.
pub(crate) fn due_after(bytes: u64, bytes_per_s: f64) -> Duration {
    Duration::from_secs_f64(bytes as f64 / bytes_per_s)
}

/// How long before a deadline the waiting stops sleeping and spins.
const SPIN: Duration = Duration::from_micros(200);

/// Waits until `due`: sleeps while it is far, spins the last [`SPIN`].
fn wait_until(due: Instant) {
    loop {
        let now = Instant::now();
        if now >= due {
            return;
        }
        let left = due - now;
        if left > SPIN {
            std::thread::sleep(left - SPIN);
        } else {
            std::hint::spin_loop();
        }
    }
}

/// A simulated consumer of handed-out layers (a device upload at a fixed
/// rate): each layer is copied into the consumer's memory, then the
/// consumer waits until `bytes so far / rate` has passed since its first
/// byte, so that it never runs faster than the rate (and runs at the
/// memory copy's speed where that is slower).
#[derive(Debug)]
pub(crate) struct Pacer {
    /// The rate, bytes per second.
    bytes_per_s: f64,
    /// When the first byte came.
    first: Option<Instant>,
    /// Bytes consumed.
    bytes: u64,
    /// Time spent copying.
    copying: Duration,
    /// Time spent waiting for the rate.
    waiting: Duration,
}

impl Pacer {
    /// A consumer at `bytes_per_s` that has consumed nothing.
    pub(crate) fn new(bytes_per_s: f64) -> Self {
        Pacer {
            bytes_per_s,
            first: None,
            bytes: 0,
            copying: Duration::ZERO,
            waiting: Duration::ZERO,
        }
    }

    /// Consumes `src` into `dst` (same length): copies, then paces.
    ///
    /// # Panics
    /// If the lengths differ (the callers check them).
    pub(crate) fn consume(&mut self, dst: &mut [u8], src: &[u8]) {
        let now = Instant::now();
        let first = *self.first.get_or_insert(now);
        dst.copy_from_slice(src);
        let copied = Instant::now();
        self.copying += copied - now;
        self.bytes += src.len() as u64;
        wait_until(first + self.due());
        self.waiting += copied.elapsed();
    }

    /// How long after its first byte the consumer may be done with what it
    /// has consumed so far.
    pub(crate) fn due(&self) -> Duration {
        due_after(self.bytes, self.bytes_per_s)
    }

    /// Time since the first byte (zero before it).
    pub(crate) fn elapsed(&self) -> Duration {
        self.first.map_or(Duration::ZERO, |f| f.elapsed())
    }

    /// Records the consumer's figures in `out`.
    fn put(&self, out: &mut JobOutput) {
        out.put("consumer_bytes", self.bytes);
        out.put("consumer_copy_ms", ms(self.copying));
        out.put("consumer_wait_ms", ms(self.waiting));
        out.put("consumer_due_ms", ms(self.due()));
    }
}

// ---------------------------------------------------------------- children

/// Publishes the workload's result flat (v2, no base) into `dir` (a child
/// job): the store every measure of the suite reads.
pub(crate) async fn job_publish(w: Workload, dir: &Path) -> Result<JobOutput> {
    let result = synth_at(w.result_tokens).await?;
    let (_, rctx) = w.contexts()?;
    let mut req = w.request(Fmt::V2, &result, None)?;
    req.context = rctx;
    let store = open_local(dir, &w)?;
    let t = Instant::now();
    store.publish(req).await?;
    let mut out = JobOutput::default();
    out.put("publish_ms", ms(t.elapsed()));
    let ns = Workload::identity().namespace();
    let summary = root_summary(&store, ns, rctx).await?;
    out.put("schema", summary.schema);
    out.put("objects", summary.objects.len());
    out.put("payload_bytes", summary.payload_len);
    out.put("result_bytes", summary.result_snapshot_len);
    Ok(out)
}

/// The summary of the root of `ctx`.
async fn root_summary(store: &Store, ns: Namespace, ctx: ContextDigest) -> Result<RootSummary> {
    match store.read_root(&ns, &ctx).await? {
        RootStatus::Found(d) => d.summary().ok_or_else(|| anyhow!("unreadable root")),
        _ => bail!("no root for the workload's result"),
    }
}

/// The snapshot every restore must produce.
#[derive(Clone, Copy)]
struct Want {
    digest: Digest,
}

/// Fails unless `out` is a hit with the wanted digest.
fn check_hit(out: &RestoreIntoOutcome, want: Want, what: &str) -> Result<()> {
    match out {
        RestoreIntoOutcome::Hit { digest, .. } if *digest == want.digest => Ok(()),
        RestoreIntoOutcome::Hit { .. } => bail!("{what} returned the wrong snapshot"),
        RestoreIntoOutcome::Miss { reason } => bail!("{what} missed: {reason}"),
    }
}

/// One layer as the layer-wise restore handed it out.
#[derive(Debug, Clone, Serialize)]
struct Handed {
    group: usize,
    layer: usize,
    stream: usize,
    /// Its bytes in the buffer.
    range: Range<u64>,
    /// When the callback was called, ms after the restore started.
    at_ms: f64,
    /// Proven by its own stream digest (not the whole snapshot's).
    own_digest: bool,
}

/// What one layer-wise restore handed out, and when it returned.
struct Timeline {
    handed: Vec<Handed>,
    done_ms: f64,
}

impl Timeline {
    /// Fails unless each of the `expected` streams was handed out exactly
    /// once.
    fn check(&self, expected: usize) -> Result<()> {
        let mut streams: Vec<usize> = self.handed.iter().map(|h| h.stream).collect();
        streams.sort_unstable();
        if streams.len() != expected || streams.iter().enumerate().any(|(i, &s)| i != s) {
            bail!(
                "the layer-wise restore did not hand out each of the {expected} streams once: \
                 {streams:?}"
            );
        }
        Ok(())
    }

    /// When each layer of the default (layer-major) order could be used by
    /// a consumer that needs them in that order: the k-th is the latest
    /// hand-out of the first k + 1.
    fn in_order_ms(&self) -> Vec<f64> {
        let mut order: Vec<&Handed> = self.handed.iter().collect();
        order.sort_by_key(|h| (h.layer, h.group));
        order
            .iter()
            .scan(f64::NEG_INFINITY, |latest, h| {
                *latest = latest.max(h.at_ms);
                Some(*latest)
            })
            .collect()
    }

    /// Records the timeline in `out`.
    fn put(&self, out: &mut JobOutput) {
        let first = self.handed.first().map_or(f64::NAN, |h| h.at_ms);
        let last = self.handed.last().map_or(f64::NAN, |h| h.at_ms);
        let in_order = self.in_order_ms();
        out.put("first_layer_ms", first);
        out.put(
            "first_in_order_ms",
            in_order.first().copied().unwrap_or(f64::NAN),
        );
        out.put("in_order_ms", in_order);
        out.put("last_layer_ms", last);
        out.put("done_ms", self.done_ms);
        out.put("layers", self.handed.len());
        out.put(
            "layers_own_digest",
            self.handed.iter().filter(|h| h.own_digest).count(),
        );
        out.put(
            "first_layer_bytes",
            self.handed
                .first()
                .map_or(0, |h| h.range.end - h.range.start),
        );
        out.put("handed", &self.handed);
    }
}

/// A byte range of the buffer as indices, if it fits in memory.
fn indices(r: &Range<u64>) -> Option<Range<usize>> {
    Some(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?)
}

/// One layer-wise restore of `key` into `buf` (default order), timed from
/// the call; with `consumer`, every handed-out layer is consumed into the
/// consumer's buffer (same offsets) on the calling thread.
async fn layer_restore(
    store: &Store,
    key: (Namespace, ContextDigest),
    buf: &mut [u8],
    want: Want,
    mut consumer: Option<(&mut [u8], &mut Pacer)>,
) -> Result<Timeline> {
    let mut handed = Vec::new();
    let mut misfit = None;
    let t = Instant::now();
    let outcome = store
        .restore_layers_with(
            key,
            buf,
            RestoreOptions::default(),
            &LayerOrder::default(),
            |ready, bytes| {
                let at_ms = ms(t.elapsed());
                if let Some((dest, pacer)) = consumer.as_mut() {
                    match indices(&ready.range).and_then(|r| dest.get_mut(r)) {
                        Some(d) if d.len() == bytes.len() => pacer.consume(d, bytes),
                        _ => misfit = Some(ready.range.clone()),
                    }
                }
                handed.push(Handed {
                    group: ready.group,
                    layer: ready.layer,
                    stream: ready.stream,
                    range: ready.range.clone(),
                    at_ms,
                    own_digest: ready.proof == LayerProof::StreamDigest,
                });
            },
        )
        .await?;
    let done_ms = ms(t.elapsed());
    check_hit(&outcome, want, "restore_layers_with")?;
    if let Some(r) = misfit {
        bail!("a handed-out layer ({r:?}) does not fit the consumer's buffer");
    }
    // The layout's streams, from the restored (and verified) header.
    let (header, _) = deltapack_format::snapshot::decode_prefix(buf)?;
    let streams = header.layout.groups.iter().map(|g| g.layers.len()).sum();
    let tl = Timeline { handed, done_ms };
    tl.check(streams)?;
    Ok(tl)
}

/// Fails unless the consumer's buffer holds every handed-out layer's bytes.
fn check_consumed(dest: &[u8], buf: &[u8], handed: &[Handed]) -> Result<()> {
    for h in handed {
        let r = indices(&h.range).context("a layer beyond memory")?;
        if dest.get(r.clone()) != buf.get(r) {
            bail!("the consumer's copy of stream {} differs", h.stream);
        }
    }
    Ok(())
}

/// One timed measure of the `layers` suite (a child job); see the module
/// docs. `times_ms` is the measure's time: the outcome (the restores) or
/// the consumer's first to last byte (the consumer alone).
pub(crate) async fn job_measure(spec: LayersSpec) -> Result<JobOutput> {
    let LayersSpec {
        w,
        source,
        mode,
        consumer_bytes_per_s,
    } = spec;
    let (store, shaper) = source.open_probed(w.config())?;
    let ns = Workload::identity().namespace();
    let (_, rctx) = w.contexts()?;
    let key = (ns, rctx);
    let mut out = JobOutput::default();
    if let Some(sh) = &shaper {
        sh.set_enabled(false);
    }
    let summary = root_summary(&store, ns, rctx).await?;
    let want = Want {
        digest: summary.result_snapshot_digest,
    };
    let len = usize::try_from(summary.result_snapshot_len)?;
    let mut buf = touched_buffer(len);
    // The untimed restore, through the API this child times.
    let t = Instant::now();
    let warm = match mode {
        LayersMode::RestoreInto => {
            let o = store
                .restore_into(key, &mut buf, RestoreOptions::default())
                .await?;
            check_hit(&o, want, "restore_into")?;
            None
        }
        _ => Some(layer_restore(&store, key, &mut buf, want, None).await?),
    };
    out.put("warm_up_ms", ms(t.elapsed()));
    if let Some(sh) = &shaper {
        sh.set_enabled(true);
        sh.reset_max_open();
    }
    // The consumer's memory (the device's, in a placement layer): resident
    // before the clock starts.
    let mut dest = match mode {
        LayersMode::LayersConsumer | LayersMode::ConsumerAlone => touched_buffer(len),
        _ => Vec::new(),
    };
    let shaped_before = shaper.as_ref().map(|sh| sh.counters());
    let stats_before = store.stats();
    // The child's peak from here on (`VmHWM` reset to the RSS now): its
    // buffers and the timed section.
    let window = PeakWindow::open();
    let cpu = CpuSample::now();
    let mut pacer = Pacer::new(consumer_bytes_per_s);
    // The layers a consumer copied, checked once the clock has stopped.
    let consumed: Option<Vec<Handed>> = match mode {
        LayersMode::RestoreInto => {
            let t = Instant::now();
            let o = store
                .restore_into(key, &mut buf, RestoreOptions::default())
                .await?;
            out.times_ms.push(ms(t.elapsed()));
            check_hit(&o, want, "restore_into")?;
            None
        }
        LayersMode::Layers => {
            let tl = layer_restore(&store, key, &mut buf, want, None).await?;
            out.times_ms.push(tl.done_ms);
            tl.put(&mut out);
            None
        }
        LayersMode::LayersConsumer => {
            let tl = layer_restore(
                &store,
                key,
                &mut buf,
                want,
                Some((&mut dest[..], &mut pacer)),
            )
            .await?;
            out.times_ms.push(tl.done_ms);
            out.put("consumer_span_ms", ms(pacer.elapsed()));
            tl.put(&mut out);
            pacer.put(&mut out);
            Some(tl.handed)
        }
        LayersMode::ConsumerAlone => {
            let handed = warm.map_or_else(Vec::new, |tl| tl.handed);
            for h in &handed {
                let r = indices(&h.range).context("a layer beyond memory")?;
                match (dest.get_mut(r.clone()), buf.get(r)) {
                    (Some(d), Some(s)) if d.len() == s.len() => pacer.consume(d, s),
                    _ => bail!("a layer ({:?}) does not fit the buffers", h.range),
                }
            }
            out.times_ms.push(ms(pacer.elapsed()));
            pacer.put(&mut out);
            out.put("layers", handed.len());
            Some(handed)
        }
    };
    out.record_cpu(&cpu);
    out.put("timed_peak_bytes", window.peak());
    if let (Some(sh), Some(b)) = (&shaper, shaped_before) {
        put_shaped_counters(&mut out, sh, b);
    }
    let stats = store.stats();
    out.put(
        "objects_read_counter",
        stats.objects_read - stats_before.objects_read,
    );
    out.put(
        "bytes_read_counter",
        stats.bytes_read - stats_before.bytes_read,
    );
    // Untimed: the consumer's copies are the layers, the buffer is the
    // snapshot.
    if let Some(handed) = &consumed {
        check_consumed(&dest, &buf, handed)?;
    }
    if deltapack_format::layer_digest::digest_like_encoding(&buf, &want.digest)? != want.digest {
        bail!("the buffer does not hash to the snapshot digest");
    }
    out.put("schema", summary.schema);
    out.put("objects", summary.objects.len());
    out.put("result_bytes", summary.result_snapshot_len);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_is_bytes_over_rate_since_the_first_byte() {
        assert_eq!(due_after(25_000_000_000, 25e9), Duration::from_secs(1));
        assert_eq!(due_after(0, 25e9), Duration::ZERO);
        assert_eq!(due_after(57_000_000, 25e9), Duration::from_micros(2280));
        let mut p = Pacer::new(1e9);
        assert_eq!(p.elapsed(), Duration::ZERO);
        let src = vec![7u8; 1_000_000];
        let mut dst = vec![0u8; 1_000_000];
        let t = Instant::now();
        for _ in 0..5 {
            p.consume(&mut dst, &src);
        }
        // 5 MB at 1 GB/s: never before 5 ms after the first byte.
        assert_eq!(p.due(), Duration::from_millis(5));
        assert!(p.elapsed() >= Duration::from_millis(5), "{:?}", p.elapsed());
        assert!(t.elapsed() >= Duration::from_millis(5));
        assert_eq!(dst, src);
        assert!(p.waiting + p.copying >= Duration::from_millis(5) - SPIN);
    }

    #[test]
    fn in_order_times_wait_for_every_earlier_layer() {
        let h = |group, layer, at_ms| Handed {
            group,
            layer,
            stream: 0,
            range: 0..0,
            at_ms,
            own_digest: true,
        };
        // Layer-major: (g0, l0), (g1, l0), (g0, l1), (g1, l1).
        let tl = Timeline {
            handed: vec![h(0, 1, 4.0), h(0, 0, 2.0), h(1, 1, 7.0), h(1, 0, 5.0)],
            done_ms: 8.0,
        };
        assert_eq!(tl.in_order_ms(), [2.0, 5.0, 5.0, 7.0]);
        let late_first = Timeline {
            handed: vec![h(1, 0, 1.0), h(0, 1, 2.0), h(0, 0, 9.0)],
            done_ms: 9.5,
        };
        assert_eq!(late_first.in_order_ms(), [9.0, 9.0, 9.0]);
    }
}

//! Restore scenarios: one timed restore per child, from a warm or cold
//! local store, the S3-like emulation or a real S3 server, into a new
//! buffer or a caller's resident one. The timed restore itself
//! ([`measure`]) is shared with the chain scenario.

use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use deltapack_format::{ContextDigest, Digest, Namespace};
use deltapack_store::{
    RestoreIntoOutcome, RestoreOptions, RestoreOutcome, Restored, RootStatus, Store,
};

use crate::job::{JobOutput, Source};
use crate::measure::{ms, CpuSample};
use crate::shaped::Shaper;
use crate::workload::{evict, touched_buffer, Fmt, Workload};

/// The snapshot a timed restore must produce.
pub(crate) struct Expected {
    /// Its digest.
    pub(crate) digest: Digest,
    /// Its length.
    pub(crate) len: u64,
}

/// One timed restore of `ctx`: `Store::restore_into` a buffer allocated and
/// touched before the clock starts (`into`), or `Store::restore` into a new
/// one. Records the time, the CPU time (see [`CpuSample`]) and the store's
/// read counters in `out`; checks that the bytes are the expected snapshot.
/// Returns the restored snapshot when the restore allocated it, so that the
/// caller decides when it is dropped (see [`timed_drop`]).
pub(crate) async fn measure(
    store: &Store,
    ns: Namespace,
    ctx: ContextDigest,
    into: bool,
    want: &Expected,
    out: &mut JobOutput,
) -> Result<Option<Restored>> {
    let before = store.stats();
    let restored = if into {
        // The placement layer's memory: allocated and resident before the
        // restore, as when a reader restores turn after turn into the same
        // buffer.
        let mut buf = touched_buffer(usize::try_from(want.len)?);
        let cpu = CpuSample::now();
        let t = Instant::now();
        let outcome = store
            .restore_into((ns, ctx), &mut buf, RestoreOptions::default())
            .await?;
        out.times_ms.push(ms(t.elapsed()));
        out.record_cpu(&cpu);
        match outcome {
            RestoreIntoOutcome::Hit { digest, .. } if digest == want.digest => {}
            RestoreIntoOutcome::Hit { .. } => bail!("restore_into returned the wrong snapshot"),
            RestoreIntoOutcome::Miss { reason } => bail!("restore_into missed: {reason}"),
        }
        if deltapack_format::layer_digest::digest_like_encoding(&buf, &want.digest)? != want.digest
        {
            bail!("the buffer does not hash to the snapshot digest");
        }
        None
    } else {
        let cpu = CpuSample::now();
        let t = Instant::now();
        let outcome = store.restore((ns, ctx), RestoreOptions::default()).await?;
        out.times_ms.push(ms(t.elapsed()));
        out.record_cpu(&cpu);
        let r = match outcome {
            RestoreOutcome::Hit(r) => r,
            RestoreOutcome::Miss(m) => bail!("restore missed: {m}"),
        };
        if r.digest != want.digest || r.snapshot.encoded().len() as u64 != want.len {
            bail!("restore returned the wrong snapshot");
        }
        Some(r)
    };
    let after = store.stats();
    out.put(
        "objects_read_counter",
        after.objects_read - before.objects_read,
    );
    out.put("bytes_read_counter", after.bytes_read - before.bytes_read);
    Ok(restored)
}

/// Records what a shaper counted since `before` (see [`Shaper::counters`]):
/// requests, bytes down and up, connections, most open at once.
pub(crate) fn put_shaped_counters(out: &mut JobOutput, sh: &Shaper, before: [u64; 5]) {
    let now = sh.counters();
    out.put("shaped_requests", now[0] - before[0]);
    out.put("shaped_bytes_down", now[1] - before[1]);
    out.put("shaped_bytes_up", now[2] - before[2]);
    out.put("shaped_connections", now[3] - before[3]);
    out.put("shaped_max_connections_open", now[4]);
}

/// Drops a restored snapshot, timed (`drop_ms`: freeing the result).
pub(crate) fn timed_drop(r: Restored, out: &mut JobOutput) {
    let t = Instant::now();
    drop(r);
    out.put("drop_ms", ms(t.elapsed()));
}

/// One restore of the workload's delta (a child job). One untimed restore
/// of the delta comes first: it restores the base, which lands in the
/// verified-base cache, as a reader restoring turn N+1 has turn N's base
/// (the timed work is the delta), and warms the runtime. Through the shaped
/// emulation that first restore runs with shaping off (it is not timed),
/// and the shaper's counters of the timed restore are recorded
/// (`shaped_*`).
pub(crate) async fn job_restore(
    w: Workload,
    format: Fmt,
    source: Source,
    into: bool,
) -> Result<JobOutput> {
    let (store, shaper) = source.open_probed(w.config())?;
    let ns = Workload::identity().namespace();
    let (_, rctx) = w.contexts()?;
    let mut out = JobOutput::default();
    if let Some(sh) = &shaper {
        sh.set_enabled(false);
    }
    let t = Instant::now();
    match store.restore((ns, rctx), RestoreOptions::default()).await? {
        RestoreOutcome::Hit(_) => {}
        RestoreOutcome::Miss(m) => bail!("first restore missed: {m}"),
    }
    out.put("first_restore_with_base_ms", ms(t.elapsed()));
    if let Some(sh) = &shaper {
        sh.set_enabled(true);
    }
    let t = Instant::now();
    let root = store.read_root(&ns, &rctx).await?;
    out.put("root_read_ms", ms(t.elapsed()));
    let summary = match root {
        RootStatus::Found(d) => d.summary().ok_or_else(|| anyhow!("unreadable root"))?,
        _ => bail!("no {} root for the result", format.name()),
    };
    if let Source::Cold { dir } = &source {
        out.put("evicted_files", evict(dir)?);
    }
    let want = Expected {
        digest: summary.result_snapshot_digest,
        len: summary.result_snapshot_len,
    };
    let before = shaper.as_ref().map(|sh| {
        sh.reset_max_open();
        sh.counters()
    });
    let restored = measure(&store, ns, rctx, into, &want, &mut out).await?;
    if let (Some(sh), Some(b)) = (&shaper, before) {
        put_shaped_counters(&mut out, sh, b);
    }
    if let Some(r) = restored {
        // For the breakdown: one BLAKE3 pass over the (now resident) result.
        let t = Instant::now();
        let d =
            deltapack_format::layer_digest::digest_like_encoding(r.snapshot.encoded(), &r.digest)?;
        out.put("result_blake3_ms", ms(t.elapsed()));
        if d != r.digest {
            bail!("restored bytes do not hash to their digest");
        }
        timed_drop(r, &mut out);
    }
    out.put("objects", summary.objects.len());
    out.put("payload_bytes", summary.payload_len);
    out.put("result_bytes", summary.result_snapshot_len);
    out.put("schema", summary.schema);
    Ok(out)
}

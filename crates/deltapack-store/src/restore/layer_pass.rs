//! The layer-wise restore's pass: the result is rebuilt layer by layer,
//! and each (group, layer) stream is handed out as soon as it is proven.
//!
//! A v2.2 root records every stream's digest (`layers`), and the root's
//! decoder checks that they combine, with the result's header, to the
//! layered snapshot digest the root names — which the envelope hash (and,
//! on a keyed store, its MAC) authenticates. So a stream whose bytes hash to
//! its recorded digest is proven on its own: its bytes are exactly the
//! bytes of that stream in the snapshot the root was published for, unless
//! BLAKE3 collides. That is what lets a layer leave before the rest of the
//! snapshot has been read.
//!
//! The pass is the composed restore's (`compose`), regrouped: the composed
//! plan's pieces (one flat root is a single piece) are cut at stream
//! boundaries, and the work items — per stream, the part of each extent
//! that holds its bytes — are queued in the caller's layer order, so the
//! workers finish early layers first and the reads of later ones are
//! already in flight. Each stream is hashed in aligned blocks as they
//! complete (`LayerHashPlan`, the same blocks a whole restore hashes); the
//! worker that completes a stream's last block merges its blocks, compares
//! the stream digest with the root's, and only on a match sends the stream
//! to the caller's thread. A stream that does not match is never sent.
//!
//! The first pass is *deferred* (raw extents read without checking their
//! names: each stream's digest covers every byte it hands out). A stream
//! that fails its digest makes the next pass *verified*: every extent it
//! reads is hashed against its name, so the object at fault is found and,
//! after a second failed check, quarantined (the usual proof rule,
//! [`Proof`]). Later passes only rebuild the streams not yet handed out; a
//! stream handed out is never written again. When every stream is out, the
//! stream digests and the prefix are combined once more and compared with
//! the root's snapshot digest.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use deltapack_format::delta::Origin;
use deltapack_format::layer_digest::{LayerHashPlan, StreamDigest};
use deltapack_format::scatter::{self, Span};
use deltapack_format::{Digest, ExtentCodec, ExtentPlan, ManifestV2, SnapshotHeader};

use super::compose::{copy_memory, place_local_unverified, Bottom};
use super::plan::Plan;
use super::read::{
    read_extent, read_range_unverified, ExtentAt, ObjectFault, ReadCtx, Source, PIECE, RESULT_BLOCK,
};
use super::reassembly::Proof;
use super::result::SharedDest;
use super::sink::Sink;

/// Largest work item of a deferred local pass.
const LOCAL_ITEM: u64 = 8 << 20;

/// Where every byte of a layered result comes from, and what each stream
/// must hash to.
pub(super) struct LayerSource<'m> {
    levels: Vec<&'m ManifestV2>,
    plans: Vec<ExtentPlan>,
    /// Payload pieces in `dst` order: the level that holds them (`None`: a
    /// bottom held in memory) and the copy.
    pieces: Vec<(Option<usize>, Span)>,
    prefix: Vec<u8>,
    header: SnapshotHeader,
    want: Digest,
    streams: Vec<StreamDigest>,
    memory: Option<&'m [u8]>,
    top_level: usize,
    extent_bytes: u64,
}

impl<'m> LayerSource<'m> {
    /// The source of a flat or chained v2.2 root (`None`: the root records
    /// no stream digests, so its layers cannot be proven one by one).
    pub(super) fn new(
        ctx: &ReadCtx<'_>,
        what: &'m Plan,
    ) -> Result<Option<LayerSource<'m>>, ObjectFault> {
        let plain = |e: deltapack_format::Error| ObjectFault::plain(e.to_string());
        match what {
            Plan::Flat(m) => {
                let Some(streams) = m.layer_digests() else {
                    return Ok(None);
                };
                let header = SnapshotHeader {
                    layout: m.layout.clone(),
                    boundary: m.boundary,
                    block_counts: m.block_counts.clone(),
                };
                let prefix = header.encode_prefix().map_err(plain)?;
                let p = prefix.len() as u64;
                if m.payload_len < p || m.payload_len != m.result_snapshot_len {
                    return Err(ObjectFault::plain(
                        "a flat root's payload is not its snapshot",
                    ));
                }
                let pieces = vec![(
                    Some(0),
                    Span {
                        src: p,
                        dst: p,
                        len: m.payload_len - p,
                    },
                )];
                Ok(Some(LayerSource {
                    plans: vec![ExtentPlan::new(m.payload_len, m.max_extent_bytes).map_err(plain)?],
                    levels: vec![m],
                    pieces,
                    prefix,
                    header,
                    want: m.result_snapshot_digest,
                    streams,
                    memory: None,
                    top_level: 0,
                    extent_bytes: m.max_extent_bytes,
                }))
            }
            Plan::Chain { bottom, deltas } => {
                let Some(top) = deltas.last() else {
                    return Err(ObjectFault::plain("a chain needs at least one delta"));
                };
                let Some(streams) = top.layer_digests() else {
                    return Ok(None);
                };
                let prepared = super::compose::prepare(ctx, bottom, deltas)?;
                let header = SnapshotHeader {
                    layout: top.layout.clone(),
                    boundary: top.boundary,
                    block_counts: top.block_counts.clone(),
                };
                let prefix = header.encode_prefix().map_err(plain)?;
                if prefix != prepared.composed.result_prefix || header != prepared.result_header {
                    return Err(ObjectFault::plain(
                        "the chain's result header is not its root's",
                    ));
                }
                let n = deltas.len();
                let flat_bottom = matches!(bottom, Bottom::Flat(_));
                let pieces = prepared
                    .composed
                    .pieces
                    .iter()
                    .map(|p| {
                        let level = match p.origin {
                            Origin::Delta(i) if i < n => Some(i),
                            Origin::Delta(_) => {
                                return Err(ObjectFault::plain(
                                    "a piece names a turn outside the chain",
                                ))
                            }
                            Origin::Bottom if flat_bottom => Some(n),
                            Origin::Bottom => None,
                        };
                        Ok((level, p.span()))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Some(LayerSource {
                    levels: prepared.levels,
                    plans: prepared.plans,
                    pieces,
                    prefix,
                    header,
                    want: top.result_snapshot_digest,
                    streams,
                    memory: match bottom {
                        Bottom::Memory(s, _) => Some(s.encoded()),
                        Bottom::Flat(_) => None,
                    },
                    top_level: n - 1,
                    extent_bytes: top.max_extent_bytes,
                }))
            }
            Plan::V1 { .. } => Ok(None),
        }
    }

    /// The result's header.
    pub(super) fn header(&self) -> &SnapshotHeader {
        &self.header
    }

    /// The result's length.
    pub(super) fn result_len(&self) -> u64 {
        self.pieces
            .last()
            .map_or(self.prefix.len() as u64, |(_, s)| s.dst + s.len)
    }

    /// The work items of one pass: for each stream of `pending` (in that
    /// order), the part of each extent (or of the bottom in memory) that
    /// holds its bytes.
    fn items(&self, plan: &LayerHashPlan, pending: &[usize], item_bytes: u64) -> Vec<Item> {
        let mut items = Vec::new();
        for &s in pending {
            let Some(r) = plan.stream_range(s) else {
                continue;
            };
            // The pieces inside the stream, clipped to it, by level.
            let first = self
                .pieces
                .partition_point(|(_, p)| p.dst + p.len <= r.start);
            let mut by_level: Vec<Vec<Span>> = vec![Vec::new(); self.levels.len()];
            for (level, p) in self.pieces[first..]
                .iter()
                .take_while(|(_, p)| p.dst < r.end)
            {
                let lo = p.dst.max(r.start);
                let hi = (p.dst + p.len).min(r.end);
                let span = Span {
                    src: p.src + (lo - p.dst),
                    dst: lo,
                    len: hi - lo,
                };
                match level {
                    Some(l) => by_level[*l].push(span),
                    None => {
                        let mut at = 0;
                        while at < span.len {
                            let n = (span.len - at).min(8 << 20);
                            items.push(Item {
                                level: None,
                                index: 0,
                                spans: vec![Span {
                                    src: span.src + at,
                                    dst: span.dst + at,
                                    len: n,
                                }],
                            });
                            at += n;
                        }
                    }
                }
            }
            for (l, mut spans) in by_level.into_iter().enumerate() {
                if spans.is_empty() {
                    continue;
                }
                spans.sort_unstable_by_key(|s| s.src);
                for (j, e) in self.levels[l].extents.iter().enumerate() {
                    let (a, b) = (e.offset, e.offset + e.raw_len);
                    let mine = scatter::overlapping(&spans, a..b);
                    // Clipped to the extent, in items of at most
                    // `item_bytes`, so that every worker can help finish
                    // the first layers first.
                    let clipped = mine.iter().filter_map(|s| {
                        let (lo, hi) = (s.src.max(a), s.src_end().min(b));
                        (lo < hi).then(|| Span {
                            src: lo,
                            dst: s.dst + (lo - s.src),
                            len: hi - lo,
                        })
                    });
                    for part in cut(clipped, item_bytes) {
                        items.push(Item {
                            level: Some(l),
                            index: j,
                            spans: part,
                        });
                    }
                }
            }
        }
        items
    }
}

/// `spans` (in source order) cut into groups of at most `max` bytes,
/// splitting a span where a group fills.
fn cut(spans: impl Iterator<Item = Span>, max: u64) -> Vec<Vec<Span>> {
    let mut out: Vec<Vec<Span>> = Vec::new();
    let mut cur: Vec<Span> = Vec::new();
    let mut room = max;
    for mut s in spans {
        while s.len > 0 {
            let n = s.len.min(room);
            cur.push(Span {
                src: s.src,
                dst: s.dst,
                len: n,
            });
            s = Span {
                src: s.src + n,
                dst: s.dst + n,
                len: s.len - n,
            };
            room -= n;
            if room == 0 {
                out.push(std::mem::take(&mut cur));
                room = max;
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// One worker's share of a pass: one stream's bytes in one extent (or in
/// the bottom held in memory).
struct Item {
    level: Option<usize>,
    index: usize,
    spans: Vec<Span>,
}

/// Why a pass failed.
enum PassError {
    Fault(ObjectFault),
    /// Every read succeeded, but a stream is not the one the root names.
    Mismatch(String),
}

/// The in-loop hash of a layered result: unwritten bytes per block, every
/// block's chaining value once known, and per stream its blocks not yet
/// hashed.
struct LayerHash<'a> {
    plan: &'a LayerHashPlan,
    left: Vec<AtomicU64>,
    cvs: Vec<OnceLock<[u8; 32]>>,
    blocks_left: Vec<AtomicUsize>,
}

impl<'a> LayerHash<'a> {
    /// Counters for the blocks of `pending` streams.
    fn new(plan: &'a LayerHashPlan, pending: &[usize]) -> Self {
        let blocks = plan.blocks();
        let left: Vec<AtomicU64> = blocks.iter().map(|_| AtomicU64::new(0)).collect();
        let blocks_left: Vec<AtomicUsize> = (0..plan.stream_count())
            .map(|_| AtomicUsize::new(0))
            .collect();
        for &s in pending {
            let r = plan.stream_blocks(s);
            blocks_left[s].store(r.len(), Ordering::Relaxed);
            for b in r {
                left[b].store(blocks[b].range.1 - blocks[b].range.0, Ordering::Relaxed);
            }
        }
        LayerHash {
            plan,
            left,
            cvs: blocks.iter().map(|_| OnceLock::new()).collect(),
            blocks_left,
        }
    }

    /// Counts `dst..dst+len` as written; hashes every block this completes
    /// and calls `complete(stream)` for every stream whose last block that
    /// was.
    fn wrote(&self, dest: &SharedDest, dst: u64, len: u64, complete: &mut dyn FnMut(usize)) {
        if len == 0 {
            return;
        }
        let blocks = self.plan.blocks();
        for b in self.plan.blocks_in(dst, dst + len) {
            let r = blocks[b].range;
            let (lo, hi) = (dst.max(r.0), (dst + len).min(r.1));
            if hi <= lo {
                continue;
            }
            if self.left[b].fetch_sub(hi - lo, Ordering::AcqRel) != hi - lo {
                continue;
            }
            // SAFETY: every byte of the block is written (its counter
            // reached zero, AcqRel makes those writes visible), and none is
            // written again in this pass.
            let bytes = unsafe { dest.read(r.0..r.1) };
            let Ok(cv) = self.plan.hash_block(b, bytes) else {
                continue;
            };
            let _ = self.cvs[b].set(cv);
            let s = blocks[b].stream;
            if self.blocks_left[s].fetch_sub(1, Ordering::AcqRel) == 1 {
                complete(s);
            }
        }
    }

    /// Stream `s`'s digest from its blocks (all hashed).
    fn stream_digest(&self, s: usize) -> Result<StreamDigest, String> {
        let cvs = self
            .plan
            .stream_blocks(s)
            .map(|b| self.cvs[b].get().copied().ok_or("a block was not hashed"))
            .collect::<Result<Vec<_>, _>>()?;
        self.plan.stream_digest(s, &cvs).map_err(|e| e.to_string())
    }
}

/// One pass's shared state.
struct Pass<'a, 'm> {
    ctx: &'a ReadCtx<'a>,
    src: &'a LayerSource<'m>,
    dest: &'a SharedDest,
    hash: LayerHash<'a>,
    emitted: &'a [AtomicBool],
    found: &'a [OnceLock<StreamDigest>],
    mismatch: Mutex<Option<String>>,
}

impl Pass<'_, '_> {
    /// A stream's last block was hashed: it is handed out (`send`) if its
    /// digest is the root's, and never otherwise.
    fn complete(&self, s: usize, send: &std::sync::mpsc::Sender<usize>) {
        let got = self.hash.stream_digest(s);
        match got {
            Ok(d) if self.src.streams.get(s) == Some(&d) => {
                let _ = self.found[s].set(d);
                self.emitted[s].store(true, Ordering::Release);
                let _ = send.send(s);
            }
            other => {
                let what = match other {
                    Ok(d) => format!(
                        "layer stream {s} hashes to {}, its root records {}",
                        hex::encode(d),
                        self.src
                            .streams
                            .get(s)
                            .map_or("nothing".into(), hex::encode)
                    ),
                    Err(e) => format!("layer stream {s}: {e}"),
                };
                if let Ok(mut m) = self.mismatch.lock() {
                    m.get_or_insert(what);
                }
            }
        }
    }

    /// Places one item's bytes.
    fn item(
        &self,
        item: &Item,
        deferred: bool,
        scratch: &mut [u8],
        send: &std::sync::mpsc::Sender<usize>,
    ) -> Result<(), ObjectFault> {
        let (dest, deadline) = (self.dest, self.ctx.deadline);
        let mut wrote = |dst: u64, n: u64| {
            self.hash
                .wrote(dest, dst, n, &mut |s| self.complete(s, send))
        };
        let Some(level) = item.level else {
            let span = item.spans.first().copied().unwrap_or(Span {
                src: 0,
                dst: 0,
                len: 0,
            });
            return copy_memory(self.src.memory, span, dest, deadline, &mut wrote);
        };
        let m = self.src.levels[level];
        let e = &m.extents[item.index];
        let spans = &item.spans[..];
        let mut sink = LayerSink {
            dest,
            spans,
            wrote: &mut wrote,
        };
        if !(deferred && e.codec == ExtentCodec::Raw) {
            self.ctx.tally.add(e.stored_len);
            let at = ExtentAt {
                plan: &self.src.plans[level],
                index: item.index as u64,
                entry: e,
            };
            return read_extent(self.ctx, at, &mut sink, None, scratch);
        }
        let needed = spans.iter().map(|s| s.len).sum::<u64>();
        self.ctx.tally.add(needed);
        match self.ctx.source {
            Source::Local(root) => {
                place_local_unverified(root, e, spans, None, dest, deadline, sink.wrote)?;
            }
            Source::Remote(remote) => {
                let (Some(first), Some(last)) = (spans.first(), spans.last()) else {
                    return Ok(());
                };
                let range = first.src.max(e.offset)..last.src_end().min(e.offset + e.raw_len);
                read_range_unverified(remote, e, range, &mut sink, deadline, self.ctx.tap)?;
            }
        }
        Ok(())
    }
}

/// Places one extent's bytes of one stream into the result.
struct LayerSink<'s, 'w> {
    dest: &'s SharedDest,
    spans: &'s [Span],
    wrote: &'w mut dyn FnMut(u64, u64),
}

impl Sink for LayerSink<'_, '_> {
    fn place(&mut self, src: u64, bytes: &[u8]) {
        for t in scatter::targets(self.spans, src, bytes.len()) {
            let n = t.at.len() as u64;
            // SAFETY: these result bytes belong to this item's stream and
            // extent alone, and the stream was not handed out (it is
            // pending in this pass).
            unsafe { self.dest.write(t.dst, &bytes[t.at]) };
            (self.wrote)(t.dst, n);
        }
    }
}

/// Rebuilds the result of `src` in `dest` (exactly its length) stream by
/// stream in `order` (every stream once), calling `ready(stream, bytes)` on
/// the calling thread for each stream as soon as its digest matched the
/// root's (marking it in `emitted`). `Ok` once every stream is out and the
/// snapshot digest matched; `Err` is a miss (or, for [`crate::fault::FaultKind::Io`], an
/// error), after which the streams already handed out hold their proven
/// bytes and nothing else of `dest` is meaningful.
pub(super) fn run(
    ctx: &ReadCtx<'_>,
    src: &LayerSource<'_>,
    dest: &SharedDest,
    order: &[usize],
    emitted: &[AtomicBool],
    ready: &mut dyn FnMut(usize, &[u8]),
) -> Result<(), ObjectFault> {
    let p = src.prefix.len() as u64;
    let block =
        (src.extent_bytes / 4).clamp(deltapack_format::extent::MIN_EXTENT_BYTES, RESULT_BLOCK);
    let plan =
        LayerHashPlan::new(&src.header, p, block).map_err(|e| ObjectFault::plain(e.to_string()))?;
    if dest.len() != src.result_len() || plan.stream_count() != src.streams.len() {
        return Err(ObjectFault::plain(
            "the buffer or the stream digests do not fit the result",
        ));
    }
    let found: Vec<OnceLock<StreamDigest>> =
        (0..plan.stream_count()).map(|_| OnceLock::new()).collect();
    // SAFETY: no worker runs yet.
    unsafe { dest.write(0, &src.prefix) };
    let mut proof = Proof::default();
    let mut deferred = true;
    loop {
        let pending: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&s| !emitted[s].load(Ordering::Acquire))
            .collect();
        if pending.is_empty() {
            break;
        }
        let pass = Pass {
            ctx,
            src,
            dest,
            hash: LayerHash::new(&plan, &pending),
            emitted,
            found: &found,
            mismatch: Mutex::new(None),
        };
        let out = run_pass(&pass, &plan, &pending, deferred, ready);
        match out {
            Ok(()) if pending.iter().all(|&s| emitted[s].load(Ordering::Acquire)) => {}
            Ok(()) => {
                // Every read succeeded and no stream failed its digest, yet
                // one never completed: the plan does not cover it. Never a
                // reason to read everything again.
                return Err(ObjectFault::plain(
                    "a layer's bytes are not all covered by the chain's plan",
                ));
            }
            Err(PassError::Mismatch(what)) if deferred => {
                tracing::warn!(%what, "a layer failed its digest; verifying every extent");
                deferred = false;
            }
            Err(PassError::Mismatch(what)) => return Err(ObjectFault::plain(what)),
            Err(PassError::Fault(d)) => {
                deferred = false;
                tracing::warn!(what = %d.what, "layer-wise restore failed");
                if let Some(f) = proof.record(d) {
                    return Err(f);
                }
            }
        }
    }
    // Every stream matched its recorded digest; they and the prefix must
    // still make the snapshot digest the root names.
    let digests = found
        .iter()
        .map(|d| {
            d.get()
                .copied()
                .ok_or_else(|| ObjectFault::plain("a layer was not proven"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // SAFETY: the workers have all finished.
    let prefix = unsafe { dest.read(0..p) };
    let top = deltapack_format::layer_digest::combine(prefix, &digests);
    if top != src.want {
        return Err(ObjectFault::plain(format!(
            "the layers combine to {top}, the root names {}",
            src.want
        )));
    }
    Ok(())
}

/// Workers of a pass: one per core locally; on a remote store as many as
/// it takes for the items' ranged GETs to fill the budget of ranges in
/// flight, and no more — a worker per item would put every layer's reads
/// in flight at once (each at a fraction of the bandwidth, and 32 threads
/// on the cores), where fewer keep the early layers' reads first.
fn workers(ctx: &ReadCtx<'_>, items: &[Item]) -> usize {
    match ctx.source {
        Source::Local(_) => ctx.threads,
        Source::Remote(r) => {
            let bytes: u64 = items
                .iter()
                .filter(|i| i.level.is_some())
                .flat_map(|i| i.spans.iter().map(|s| s.len))
                .sum();
            let mean = bytes / items.len().max(1) as u64;
            r.extent_workers(mean.max(1)).min(ctx.threads)
        }
    }
}

/// One pass over the pending streams' items; hands out (`ready`, on this
/// thread) each stream as it is proven.
fn run_pass(
    pass: &Pass<'_, '_>,
    plan: &LayerHashPlan,
    pending: &[usize],
    deferred: bool,
    ready: &mut dyn FnMut(usize, &[u8]),
) -> Result<(), PassError> {
    // Locally, items of at most 8 MiB (both cores finish the first layer
    // first); remote items stay whole per extent (their reads are cut into
    // ranged GETs anyway, and a verified pass reads whole extents).
    let item_bytes = match (pass.ctx.source, deferred) {
        (Source::Local(_), true) => LOCAL_ITEM,
        _ => u64::MAX,
    };
    let items = pass.src.items(plan, pending, item_bytes);
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    // Streams without bytes are proven at once.
    for &s in pending {
        if plan.stream_blocks(s).is_empty() {
            pass.complete(s, &tx);
        }
    }
    let threads = workers(pass.ctx, &items);
    let next = AtomicUsize::new(0);
    let failures = crate::fault::PassFailures::default();
    std::thread::scope(|sc| {
        for _ in 0..threads.max(1).min(items.len().max(1)) {
            let tx = tx.clone();
            let (items, next, failures) = (&items, &next, &failures);
            sc.spawn(move || {
                let mut scratch = vec![0u8; PIECE];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let in_base = item.level.is_some_and(|l| l != pass.src.top_level);
                    // After a failure the pass is a miss either way; only
                    // the bases' extents are still read, so that damage to
                    // a base is reported as such (`base-missing`).
                    if failures.failed() && !in_base {
                        continue;
                    }
                    if let Err(d) = pass.item(item, deferred, &mut scratch, &tx) {
                        failures.record(d, in_base, next, items.len());
                    }
                }
            });
        }
        drop(tx);
        // The caller's consumer runs here, on the calling thread, while the
        // workers go on with the next layers.
        for s in rx {
            if let Some(r) = plan.stream_range(s) {
                // SAFETY: the stream is complete and proven; no worker
                // writes it again (later passes skip handed-out streams).
                ready(s, unsafe { pass.dest.read(r) });
            }
        }
    });
    if let Some(d) = failures.first() {
        return Err(PassError::Fault(d));
    }
    if let Some(what) = pass.mismatch.lock().ok().and_then(|mut m| m.take()) {
        return Err(PassError::Mismatch(what));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cutting spans into items keeps every byte once, in order, with the
    /// same source-to-destination mapping, and no item over the bound.
    #[test]
    fn cut_items_keep_every_byte_once() {
        let spans = [
            Span {
                src: 100,
                dst: 1000,
                len: 5,
            },
            Span {
                src: 105,
                dst: 2000,
                len: 17,
            },
            Span {
                src: 200,
                dst: 3000,
                len: 3,
            },
        ];
        for max in [1u64, 4, 5, 7, 25, 1000] {
            let parts = cut(spans.iter().copied(), max);
            let mut flat: Vec<(u64, u64)> = Vec::new();
            for p in &parts {
                assert!(p.iter().map(|s| s.len).sum::<u64>() <= max, "max {max}");
                assert!(!p.is_empty());
                for s in p {
                    flat.extend((0..s.len).map(|k| (s.src + k, s.dst + k)));
                }
            }
            let want: Vec<(u64, u64)> = spans
                .iter()
                .flat_map(|s| (0..s.len).map(move |k| (s.src + k, s.dst + k)))
                .collect();
            assert_eq!(flat, want, "max {max}");
        }
        assert!(cut(std::iter::empty(), 8).is_empty());
    }
}

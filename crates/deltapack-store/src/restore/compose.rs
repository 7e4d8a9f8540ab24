//! Composed restore of a delta chain: one pass over the chain, no
//! intermediate snapshot.
//!
//! A conversation is stored as a chain: a flat root (or a snapshot this
//! process already holds, verified) and deltas on top of it, turn after
//! turn. Restoring the newest turn by restoring every turn before it costs
//! the sum of all turns' sizes in time and memory. Here the chain's copy
//! plans are composed first ([`deltapack_format::compose`]) from the delta
//! headers alone, so every byte of the final result has exactly one origin:
//! the newest delta whose tail wrote it, or the bottom. Then only the
//! extents that still hold result bytes are read, each once. The first pass
//! is *deferred* when every delta is v2.1 (its header and chain hints are
//! in the root, so the plan came from authenticated roots alone): raw
//! extents are read without checking their names, only the range that holds
//! result bytes, on local disk straight into the result; the result is
//! hashed once, as blocks complete. If that digest is wrong, a *verified*
//! pass follows (the fused read → hash → place loop of a flat restore, every
//! extent checked by name as it streams, each delta's header extent too), so
//! the object at fault is found and, once proven, quarantined. v2 chains
//! (headers read from storage) and every pass after a failure are verified.
//! A bottom held in memory is copied by the same workers.
//!
//! # Why the result digest is enough
//!
//! Every placed byte goes where a plan made from authenticated roots (or
//! from a snapshot verified earlier) puts it, no stored byte is
//! interpreted, and the whole result is hashed (block by block, as blocks
//! are completed, while they are still in cache) and compared with the
//! result digest the target root names. A result that passes is, by BLAKE3's
//! collision resistance, exactly the snapshot that root was published for,
//! whatever the intermediate results or the extents' names would have been;
//! a wrong header, a wrong link or a wrong extent can only make it fail. So
//! neither the intermediate snapshots' digests nor (in a deferred pass) the
//! extents' names prove anything for this result that the final one does
//! not. Damage confined to bytes later turns replaced is not this restore's
//! business: the sweep finds it.
//!
//! # Memory
//!
//! The result buffer (new, or the caller's), one 256 KiB piece per worker,
//! the delta headers and the plan. Workers write disjoint parts of the
//! result (the composed pieces tile it exactly once), so they share it
//! through [`SharedDest`] without locks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use deltapack_format::delta::{self, ComposedPlan, Origin, PageDelta};
use deltapack_format::scatter::{self, Span};
use deltapack_format::{Digest, ExtentCodec, ExtentPlan, ManifestV2, Snapshot, SnapshotHeader};

use super::read::{
    blame, open_local, read_at, read_extent, read_header_prefix, read_range_unverified, ExtentAt,
    FaultKind, ObjectFault, ReadCtx, Source, PIECE,
};
use super::reassembly::{Dest, Output};
use super::result::{ResultHash, SharedDest};
use super::sink::{HeaderCheck, Sink};

/// Largest piece of a memory-to-result copy handed to one worker.
const MEMORY_ITEM: u64 = 8 << 20;

/// The bottom of a chain: where the bytes no delta replaced come from.
pub(crate) enum Bottom {
    /// A flat v2 root: its extents are read like a delta's.
    Flat(Box<ManifestV2>),
    /// A snapshot verified earlier (the base cache, a concurrent restore of
    /// the same base, a legacy v1 base restored the old way), with its
    /// digest.
    Memory(Arc<Snapshot>, Digest),
}

impl Bottom {
    fn header(&self) -> SnapshotHeader {
        match self {
            Bottom::Flat(m) => SnapshotHeader {
                layout: m.layout.clone(),
                boundary: m.boundary,
                block_counts: m.block_counts.clone(),
            },
            Bottom::Memory(s, _) => s.header().clone(),
        }
    }

    fn digest(&self) -> Digest {
        match self {
            Bottom::Flat(m) => m.result_snapshot_digest,
            Bottom::Memory(_, d) => *d,
        }
    }
}

/// One worker's share of the result: the spans of one extent (those of its
/// level that hold bytes of the extent), or a run of bytes from a bottom
/// held in memory.
enum Item<'p> {
    Extent {
        /// Index into the levels (deltas, then a flat bottom).
        level: usize,
        index: u64,
        spans: &'p [Span],
        header: Option<&'p [u8]>,
    },
    Memory(Span),
}

/// Places one extent's bytes into the shared result.
struct ItemSink<'a> {
    dest: &'a SharedDest,
    hash: &'a ResultHash,
    spans: &'a [Span],
    done: &'a mut Vec<(u64, Digest)>,
}

impl Sink for ItemSink<'_> {
    fn place(&mut self, src: u64, bytes: &[u8]) {
        for t in scatter::targets(self.spans, src, bytes.len()) {
            let n = t.at.len() as u64;
            // SAFETY: the bytes are this item's extent's, and their part of
            // the result belongs to this item alone.
            unsafe { self.dest.write(t.dst, &bytes[t.at]) };
            self.hash.wrote(self.dest, t.dst, n, self.done);
        }
    }
}

/// Runs `f(i)` for `i in 0..n` on up to `threads` scoped threads.
pub(super) fn pool<T: Send>(threads: usize, n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<(usize, T)>> = Mutex::new(Vec::with_capacity(n));
    std::thread::scope(|s| {
        for _ in 0..threads.max(1).min(n.max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let r = f(i);
                if let Ok(mut o) = out.lock() {
                    o.push((i, r));
                }
            });
        }
    });
    let mut out = out.into_inner().unwrap_or_default();
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// Restores the result of the chain `deltas` (oldest first; `deltas[0]` is
/// the delta over `bottom`) in one pass, into `into` (exactly the result's
/// length) or a buffer allocated here. One pass reads each needed extent
/// once and makes no second attempt: the caller decides whether a failure
/// is worth a second pass (see `Store`'s restore). What it reads is added
/// to `tally`.
pub(crate) fn restore_chain(
    ctx: ReadCtx<'_>,
    bottom: &Bottom,
    deltas: &[ManifestV2],
    into: Option<&mut [u8]>,
    allow_deferred: bool,
) -> Result<Output, ObjectFault> {
    let Some(top) = deltas.last() else {
        return Err(ObjectFault::plain("a chain needs at least one delta"));
    };
    let started = Instant::now();
    let prepared = prepare(&ctx, bottom, deltas)?;
    let (levels, composed) = (&prepared.levels, &prepared.composed);

    // 3. Work items: per level, the spans each extent owns.
    let (by_level, memory) = spans_by_level(composed, bottom, levels.len(), deltas.len())?;
    let items = work_items(
        &by_level,
        &memory,
        levels,
        &prepared.headers,
        &prepared.header_lens,
    );

    tracing::debug!(
        turns = deltas.len(),
        pieces = composed.pieces.len(),
        items = items.len(),
        plan_ms = started.elapsed().as_secs_f64() * 1e3,
        "composed the chain's plan"
    );

    // 4. The pass. With every link's plan taken from authenticated roots
    //    (v2.1), the first pass is *deferred*: extents are read without
    //    checking their names, and only the result digest is computed, so
    //    each result byte is read once and hashed once, as for a flat root.
    //    If that digest is wrong, a verified pass follows (every extent
    //    checked by name as it streams), which finds the culprit or, if all
    //    objects are sound, shows the chain itself is inconsistent.
    let len =
        usize::try_from(composed.result_len).map_err(|_| ObjectFault::plain("result too large"))?;
    let mut result = Dest::take(len, into).map_err(ObjectFault::plain)?;
    let bytes = result.bytes();
    let dest = SharedDest::new(bytes);
    let deferred = allow_deferred && deltas.iter().all(|m| m.chain.is_some());
    let pass = Pass {
        ctx,
        levels,
        plans: &prepared.plans,
        items: &items,
        dest: &dest,
        prefix: &composed.result_prefix,
        result_header: &prepared.result_header,
        result_len: composed.result_len,
        extent_bytes: top.max_extent_bytes,
        want: top.result_snapshot_digest,
        memory_src: match bottom {
            Bottom::Memory(s, _) => Some(s.encoded()),
            Bottom::Flat(_) => None,
        },
        top_level: deltas.len() - 1,
        suspect: std::sync::atomic::AtomicBool::new(false),
    };
    pass.run_to_verdict(deferred)?;
    match result {
        Dest::Owned(v) => Snapshot::from_encoded(v)
            .map(Output::Snapshot)
            .map_err(|e| ObjectFault::plain(e.to_string())),
        Dest::Borrowed(_) => Ok(Output::Written),
    }
}

/// A chain planned: every level read from storage, the composed plan and
/// the result's header (steps 1 and 2 of [`restore_chain`], shared with the
/// layer-wise restore).
pub(super) struct Prepared<'m> {
    /// The deltas (oldest first), then a flat bottom.
    pub(super) levels: Vec<&'m ManifestV2>,
    /// Each level's extent geometry.
    pub(super) plans: Vec<ExtentPlan>,
    /// Each delta's header bytes (recorded in its root, or read).
    pub(super) headers: Vec<Vec<u8>>,
    /// Each delta's header length.
    pub(super) header_lens: Vec<usize>,
    /// Where every byte of the result comes from.
    pub(super) composed: ComposedPlan,
    /// The result's snapshot header.
    pub(super) result_header: SnapshotHeader,
}

/// Steps 1 and 2 of [`restore_chain`]: reads (or takes from the roots)
/// every delta's header, plans each link against the result below it and
/// composes the chain.
pub(super) fn prepare<'m>(
    ctx: &ReadCtx<'_>,
    bottom: &'m Bottom,
    deltas: &'m [ManifestV2],
) -> Result<Prepared<'m>, ObjectFault> {
    let (source, threads, tally) = (ctx.source, ctx.threads, ctx.tally);
    let Some(top) = deltas.last() else {
        return Err(ObjectFault::plain("a chain needs at least one delta"));
    };
    // Extent geometry of every level read from storage: the deltas, then a
    // flat bottom.
    let mut levels: Vec<&ManifestV2> = deltas.iter().collect();
    if let Bottom::Flat(m) = bottom {
        levels.push(m);
    }
    let plans: Vec<ExtentPlan> = levels
        .iter()
        .map(|m| ExtentPlan::new(m.payload_len, m.max_extent_bytes))
        .collect::<Result<_, _>>()
        .map_err(|e| ObjectFault::plain(e.to_string()))?;

    // 1. Every delta's header (unverified here; each is checked again
    //    byte for byte while its extent is hashed).
    //    A v2.1 root carries its header: no read at all.
    let headers: Vec<Vec<u8>> = pool(threads, deltas.len(), |i| match deltas[i].chain.as_ref() {
        Some(c) => Ok(c.delta_header.clone()),
        None => read_header_prefix(source, &deltas[i]).inspect(|h| tally.add(h.len() as u64)),
    })
    .into_iter()
    .collect::<Result<_, _>>()?;

    // 2. Plan every link against the result before it, and check it against
    //    the roots.
    let bottom_header = bottom.header();
    let (links, header_lens) = plan_links(source, bottom, deltas, &headers, &plans)?;
    let composed =
        delta::compose(&bottom_header, &links).map_err(|e| ObjectFault::plain(e.to_string()))?;
    let result_header = links
        .last()
        .map(|l| l.result_header.clone())
        .ok_or_else(|| ObjectFault::plain("a chain needs at least one delta"))?;
    if composed.result_len != top.result_snapshot_len {
        return Err(ObjectFault::plain(format!(
            "the chain composes to {} bytes, the root says {}",
            composed.result_len, top.result_snapshot_len
        )));
    }
    Ok(Prepared {
        levels,
        plans,
        headers,
        header_lens,
        composed,
        result_header,
    })
}

/// Step 2 of [`restore_chain`]: plans every link of `deltas` against the
/// result before it (from `bottom` up) and checks it against its root.
/// Returns the links and each delta's header length; a link that does not
/// plan is blamed on the object that holds its header when one is at
/// fault.
fn plan_links(
    source: &Source,
    bottom: &Bottom,
    deltas: &[ManifestV2],
    headers: &[Vec<u8>],
    plans: &[ExtentPlan],
) -> Result<(Vec<PageDelta>, Vec<usize>), ObjectFault> {
    let mut base_header = bottom.header();
    let mut base_digest = bottom.digest();
    let mut links: Vec<PageDelta> = Vec::with_capacity(deltas.len());
    let mut header_lens = Vec::with_capacity(deltas.len());
    for (i, (m, hdr)) in deltas.iter().zip(headers).enumerate() {
        let planned = plan_link(m, hdr, &base_header, &base_digest);
        let (link, hlen) = match planned {
            Ok(x) => x,
            Err(what) => {
                let mut d = blame(source, &plans[i], m, hdr.len() as u64).unwrap_or(
                    ObjectFault::plain(format!("turn {} of the chain: {what}", i + 1)),
                );
                d.in_base = i + 1 < deltas.len();
                return Err(d);
            }
        };
        base_header = link.result_header.clone();
        base_digest = m.result_snapshot_digest;
        header_lens.push(hlen);
        links.push(link);
    }
    Ok((links, header_lens))
}

/// Step 3 of [`restore_chain`], first half: the composed pieces by the
/// level that supplies them (`levels` of them: the deltas, then a flat
/// bottom), each level's sorted by source offset, and the spans a bottom
/// held in memory supplies.
pub(super) fn spans_by_level(
    composed: &ComposedPlan,
    bottom: &Bottom,
    levels: usize,
    deltas: usize,
) -> Result<(Vec<Vec<Span>>, Vec<Span>), ObjectFault> {
    let level_of = |o: Origin| match o {
        Origin::Delta(i) => Some(i),
        Origin::Bottom => matches!(bottom, Bottom::Flat(_)).then_some(deltas),
    };
    let mut by_level: Vec<Vec<Span>> = vec![Vec::new(); levels];
    let mut memory: Vec<Span> = Vec::new();
    for p in &composed.pieces {
        let s = p.span();
        match level_of(p.origin) {
            Some(l) if l < by_level.len() => by_level[l].push(s),
            Some(_) => return Err(ObjectFault::plain("a piece names a turn outside the chain")),
            None => memory.push(s),
        }
    }
    for spans in &mut by_level {
        spans.sort_unstable_by_key(|s| s.src);
    }
    Ok((by_level, memory))
}

/// Step 3 of [`restore_chain`], second half: the work items of a pass. Per
/// level, each extent that holds result bytes or a delta header, with the
/// spans it owns; then the memory spans, cut into pieces of at most
/// [`MEMORY_ITEM`].
fn work_items<'p>(
    by_level: &'p [Vec<Span>],
    memory: &[Span],
    levels: &[&ManifestV2],
    headers: &'p [Vec<u8>],
    header_lens: &[usize],
) -> Vec<Item<'p>> {
    let mut items: Vec<Item<'p>> = Vec::new();
    for (l, spans) in by_level.iter().enumerate() {
        let m = levels[l];
        let header = headers.get(l).map(|h| &h[..header_lens[l].min(h.len())]);
        for (j, e) in m.extents.iter().enumerate() {
            let a = e.offset;
            let mine = scatter::overlapping(spans, a..a + e.raw_len);
            // A delta's header extents are read even when later turns
            // replaced all their bytes: the plan was made from them.
            let holds_header = header.is_some_and(|h| (h.len() as u64) > a);
            if mine.is_empty() && !holds_header {
                continue;
            }
            items.push(Item::Extent {
                level: l,
                index: j as u64,
                spans: mine,
                header: header.filter(|_| holds_header),
            });
        }
    }
    for s in memory {
        let mut at = 0;
        while at < s.len {
            let n = (s.len - at).min(MEMORY_ITEM);
            items.push(Item::Memory(Span {
                src: s.src + at,
                dst: s.dst + at,
                len: n,
            }));
            at += n;
        }
    }
    items
}

/// Why one pass over a chain failed.
enum PassError {
    /// An object (or the source, or the deadline) failed.
    Fault(ObjectFault),
    /// Every read succeeded, but the result is not the one the root names.
    Mismatch(String),
}

/// Everything one pass over the work items needs.
struct Pass<'a, 'p> {
    /// The source, workers, deadline and tally of the pass.
    ctx: ReadCtx<'a>,
    levels: &'a [&'p ManifestV2],
    plans: &'a [ExtentPlan],
    items: &'a [Item<'p>],
    dest: &'a SharedDest,
    prefix: &'a [u8],
    result_header: &'a SnapshotHeader,
    result_len: u64,
    extent_bytes: u64,
    want: Digest,
    memory_src: Option<&'a [u8]>,
    top_level: usize,
    /// Set by a deferred pass that found a stored delta header unlike the
    /// one its root recorded: the pass fails, and a verified one follows.
    suspect: std::sync::atomic::AtomicBool,
}

impl Pass<'_, '_> {
    /// Step 4 of [`restore_chain`]: the first pass (deferred when
    /// `deferred`) and, when a deferred pass ends with the wrong result
    /// digest, a verified pass that finds the object at fault or shows
    /// the chain itself is inconsistent.
    fn run_to_verdict(&self, deferred: bool) -> Result<(), ObjectFault> {
        let pass_started = Instant::now();
        let first = self.run(deferred);
        tracing::debug!(
            deferred,
            ok = first.is_ok(),
            pass_ms = pass_started.elapsed().as_secs_f64() * 1e3,
            "first pass over the chain"
        );
        match first {
            Ok(()) => Ok(()),
            Err(PassError::Fault(d)) => Err(d),
            Err(PassError::Mismatch(what)) if !deferred => Err(ObjectFault::plain(what)),
            Err(PassError::Mismatch(what)) => {
                tracing::warn!(%what, "deferred chain pass failed its result digest; verifying every extent");
                match self.run(false) {
                    Ok(()) => Ok(()),
                    Err(PassError::Fault(d)) => Err(d),
                    Err(PassError::Mismatch(what)) => Err(ObjectFault::plain(what)),
                }
            }
        }
    }

    /// Places every item's bytes into the result and checks the result
    /// digest. `deferred`: raw extents are read without checking their
    /// names (the result digest covers every byte placed); otherwise each
    /// extent is checked by name as it streams.
    fn run(&self, deferred: bool) -> Result<(), PassError> {
        let (dest, items) = (self.dest, self.items);
        let hash = ResultHash::new(
            self.result_len,
            self.extent_bytes,
            &self.want,
            self.result_header,
            self.prefix.len() as u64,
        )
        .map_err(PassError::Fault)?;
        let mut done = Vec::new();
        // SAFETY: no worker runs yet.
        unsafe { dest.write(0, self.prefix) };
        hash.wrote(dest, 0, self.prefix.len() as u64, &mut done);
        let next = AtomicUsize::new(0);
        let failures = crate::fault::PassFailures::default();
        let hashed: Mutex<Vec<(u64, Digest)>> = Mutex::new(done);
        std::thread::scope(|sc| {
            for _ in 0..self.ctx.threads.max(1).min(items.len().max(1)) {
                sc.spawn(|| {
                    let mut scratch = vec![0u8; PIECE];
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= items.len() {
                            break;
                        }
                        let in_base = match &items[i] {
                            Item::Extent { level, .. } => *level != self.top_level,
                            Item::Memory(_) => false,
                        };
                        // After a failure the pass is a miss either way;
                        // only the bases' extents are still read, so that
                        // damage to a base is reported as such
                        // (`base-missing`) whichever worker found what first.
                        if failures.failed() && !in_base {
                            continue;
                        }
                        let r = self.item(&items[i], deferred, &hash, &mut done, &mut scratch);
                        if let Err(d) = r {
                            failures.record(d, in_base, &next, items.len());
                        }
                    }
                    if let Ok(mut h) = hashed.lock() {
                        h.append(&mut done);
                    }
                });
            }
        });
        if let Some(d) = failures.first() {
            return Err(PassError::Fault(d));
        }
        if self.suspect.swap(false, Ordering::Relaxed) {
            return Err(PassError::Mismatch(
                "a stored delta header differs from the one its root recorded".into(),
            ));
        }
        let found = hash
            .finish(dest, hashed.into_inner().unwrap_or_default())
            .map_err(|w| PassError::Fault(ObjectFault::plain(w)))?;
        if found != self.want {
            return Err(PassError::Mismatch(format!(
                "reconstructed result {found} != {} named by the root",
                self.want
            )));
        }
        Ok(())
    }

    /// Places one work item's bytes.
    fn item(
        &self,
        item: &Item<'_>,
        deferred: bool,
        hash: &ResultHash,
        done: &mut Vec<(u64, Digest)>,
        scratch: &mut [u8],
    ) -> Result<(), ObjectFault> {
        let (level, index, spans, header) = match item {
            Item::Memory(span) => {
                return copy_memory(
                    self.memory_src,
                    *span,
                    self.dest,
                    self.ctx.deadline,
                    &mut |dst, n| hash.wrote(self.dest, dst, n, done),
                )
            }
            Item::Extent {
                level,
                index,
                spans,
                header,
            } => (*level, *index, *spans, *header),
        };
        let m = self.levels[level];
        let e = &m.extents[index as usize];
        let mut sink = ItemSink {
            dest: self.dest,
            hash,
            spans,
            done,
        };
        // A deferred pass reads raw extents unchecked: its plan came from the
        // roots, not from these bytes. zstd extents are decoded whole, so
        // they are checked by name either way.
        if !(deferred && e.codec == ExtentCodec::Raw) {
            self.ctx.tally.add(e.stored_len);
            let at = ExtentAt {
                plan: &self.plans[level],
                index,
                entry: e,
            };
            return read_extent(&self.ctx, at, &mut sink, header, scratch);
        }
        // The delta header bytes this extent holds must be the ones its root
        // recorded (the plan's source): a difference makes the pass suspect,
        // and the verified pass that follows tells which side is damaged.
        let stored_header = header.and_then(|h| {
            let a = usize::try_from(e.offset).ok()?;
            let end = h
                .len()
                .min(a.saturating_add(usize::try_from(e.raw_len).ok()?));
            (a < end).then(|| &h[a..end])
        });
        let needed = match (spans.first(), spans.last()) {
            (Some(first), Some(last)) => {
                Some(first.src.max(e.offset)..last.src_end().min(e.offset + e.raw_len))
            }
            _ => None,
        };
        let header_differs = match self.ctx.source {
            Source::Local(root) => {
                let mut n = stored_header.map_or(0, |h| h.len() as u64);
                for s in spans {
                    let (lo, hi) = (s.src.max(e.offset), s.src_end().min(e.offset + e.raw_len));
                    n += hi.saturating_sub(lo);
                }
                self.ctx.tally.add(n);
                let done = &mut *sink.done;
                place_local_unverified(
                    root,
                    e,
                    spans,
                    stored_header,
                    self.dest,
                    self.ctx.deadline,
                    &mut |dst, n| hash.wrote(self.dest, dst, n, done),
                )?
            }
            Source::Remote(remote) => {
                // One ranged GET from the header (if this extent holds part
                // of it) to the last needed byte.
                let (start, end) = match (&needed, stored_header) {
                    (Some(r), Some(h)) => (e.offset, r.end.max(e.offset + h.len() as u64)),
                    (Some(r), None) => (r.start, r.end),
                    (None, Some(h)) => (e.offset, e.offset + h.len() as u64),
                    (None, None) => return Ok(()),
                };
                self.ctx.tally.add(end - start);
                let mut check = HeaderCheck {
                    inner: &mut sink,
                    header: stored_header.unwrap_or(&[]),
                    at: e.offset,
                    differs: false,
                };
                // A tiered restore's tap keeps the parts read, for the fill
                // to complete and check by name (`tier/tap.rs`).
                let (deadline, tap) = (self.ctx.deadline, self.ctx.tap);
                read_range_unverified(remote, e, start..end, &mut check, deadline, tap)?;
                check.differs
            }
        };
        if header_differs {
            self.suspect.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Reads the bytes of `spans` of one local raw extent straight into the
/// result (no staging copy) without checking the extent's name (the
/// result's digest, or each layer's, covers every byte placed), a piece at
/// a time, calling `wrote(dst, len)` after each so that the blocks it
/// completes are hashed while they are still in cache. Returns whether the
/// stored delta header bytes this extent holds differ from `stored_header`
/// (the ones its root recorded).
pub(super) fn place_local_unverified(
    root: &std::path::Path,
    e: &deltapack_format::root::ExtentEntry,
    spans: &[Span],
    stored_header: Option<&[u8]>,
    dest: &SharedDest,
    deadline: Option<Instant>,
    wrote: &mut dyn FnMut(u64, u64),
) -> Result<bool, ObjectFault> {
    let key = crate::keys::object_key(&e.object_digest());
    let file = open_local(root, &key, e)?;
    let read_exact = |buf: &mut [u8], pos: u64| -> Result<(), ObjectFault> {
        let mut got = 0usize;
        while got < buf.len() {
            let k = read_at(&file, &mut buf[got..], pos + got as u64)
                .map_err(|x| ObjectFault::io(&key, "read", x))?;
            if k == 0 {
                return Err(ObjectFault::of(
                    &key,
                    FaultKind::Corrupt,
                    "object ended early (it shrank while being read)",
                ));
            }
            got += k;
        }
        Ok(())
    };
    let mut header_differs = false;
    if let Some(h) = stored_header {
        let mut stored = vec![0u8; h.len()];
        read_exact(&mut stored, 0)?;
        header_differs = stored != h;
    }
    let (start, end) = (e.offset, e.offset + e.raw_len);
    for s in spans {
        let (lo, hi) = (s.src.max(start), s.src_end().min(end));
        let mut at = lo;
        while at < hi {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(ObjectFault::deadline());
            }
            let n = (hi - at).min(PIECE as u64);
            let dst = s.dst + (at - s.src);
            // SAFETY: these result bytes belong to this span, and the span
            // to the caller's work item alone.
            let buf = unsafe { dest.slice_mut(dst..dst + n) };
            read_exact(buf, at - e.offset)?;
            wrote(dst, n);
            at += n;
        }
    }
    Ok(header_differs)
}

/// Plans one link of the chain from its header bytes, checked against its
/// root and against the result below it. Returns the plan and the header's
/// length.
fn plan_link(
    m: &ManifestV2,
    hdr: &[u8],
    base: &SnapshotHeader,
    base_digest: &Digest,
) -> Result<(PageDelta, usize), String> {
    let (h, tails) = delta::decode_header(hdr).map_err(|e| e.to_string())?;
    if h.result_digest != m.result_snapshot_digest {
        return Err(format!(
            "delta names result {}, the root {}",
            h.result_digest, m.result_snapshot_digest
        ));
    }
    if h.base_digest != *base_digest {
        return Err(format!(
            "delta's base {} is not the turn below it ({base_digest})",
            h.base_digest
        ));
    }
    if h.result_boundary != m.boundary || h.result_block_counts != m.block_counts {
        return Err("delta header and root disagree on the result's geometry".into());
    }
    let plan = PageDelta::plan(h, tails, base).map_err(|e| e.to_string())?;
    if plan.delta_len != m.payload_len || plan.result_len != m.result_snapshot_len {
        return Err(format!(
            "delta header implies {} payload / {} result bytes, the root says {} / {}",
            plan.delta_len, plan.result_len, m.payload_len, m.result_snapshot_len
        ));
    }
    if plan.result_header.layout != m.layout {
        return Err("delta's result layout is not the root's".into());
    }
    Ok((plan, tails))
}

/// Copies a span of a snapshot held in memory into the result, calling
/// `wrote(dst, len)` after each piece.
pub(super) fn copy_memory(
    from: Option<&[u8]>,
    s: Span,
    dest: &SharedDest,
    deadline: Option<Instant>,
    wrote: &mut dyn FnMut(u64, u64),
) -> Result<(), ObjectFault> {
    let from = from.ok_or_else(|| ObjectFault::plain("no bottom snapshot in memory"))?;
    let mut at = 0u64;
    while at < s.len {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(ObjectFault::deadline());
        }
        let n = (s.len - at).min(PIECE as u64);
        let a = (s.src + at) as usize;
        let bytes = from
            .get(a..a + n as usize)
            .ok_or_else(|| ObjectFault::plain("a piece lies outside the bottom snapshot"))?;
        // SAFETY: this span belongs to this item alone.
        unsafe { dest.write(s.dst + at, bytes) };
        wrote(s.dst + at, n);
        at += n;
    }
    Ok(())
}

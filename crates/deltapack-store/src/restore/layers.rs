//! The layer-wise restore's interface: a restore into the caller's buffer
//! that hands each (group, layer) stream to the caller as soon as it is
//! proven, so that the placement layer's device upload of layer *k*
//! overlaps the read and verification of layers after it.
//!
//! Three forms of one call:
//!
//! * [`Store::restore_layers_with`] — a callback, run on the calling
//!   thread for each layer while worker threads read the next ones; the
//!   form for synchronous callers (and the one the others are built on).
//! * [`Store::restore_layers`] — a [`futures::Stream`] of [`LayerEvent`]s
//!   over a buffer the stream owns (a `Vec<u8>`), readable layer by layer
//!   with [`LayerStream::layer`] and returned by
//!   [`LayerStream::into_buffer`].
//! * [`Store::restore_layers_raw`] — the callback form over raw memory, for
//!   foreign callers (Python's pinned or numpy buffers) that read handed-out
//!   layers while the restore writes the rest.
//!
//! **What a handed-out layer is.** For a v2.2 root, the layer's bytes
//! matched the stream digest the root records ([`LayerProof::StreamDigest`],
//! see `layer_pass` for why that proves them) before the callback ran; they
//! are never written again by this call. Roots that record no stream
//! digests — v2, v2.1 (including migrated roots) and legacy v1 — are
//! verified whole first and then handed out all at once
//! ([`LayerProof::WholeSnapshot`]): the documented fallback.
//!
//! **The final word** is the returned [`RestoreIntoOutcome`] (the stream's
//! [`LayerEvent::Done`]): a hit means every layer was handed out and the
//! whole snapshot verified against the root's digest. A miss after some
//! layers were handed out is a miss; **the buffer on a miss**: every layer
//! already handed out still holds its proven bytes, and every other byte
//! (the header and the layers not handed out) is zeroed before the call
//! returns, as `restore_into` zeroes a buffer it wrote to. A miss before
//! anything was written leaves the buffer as it was.

use std::ops::Range;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use deltapack_format::SnapshotHeader;

use super::outcome::{RestoreIntoOutcome, RestoreOptions};
use super::plan::Plan;
use super::result::SharedDest;
use crate::error::{MissReason, Result, StoreError};
use crate::keys::RootKey;
use crate::store::Store;

/// In which order the layers are read and handed out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayerOrder {
    /// Layer 0 of every group, then layer 1 of every group, … (the order a
    /// forward pass needs them): the default.
    #[default]
    LayerMajor,
    /// Group by group, each group's layers in order: the payload's own
    /// order.
    GroupMajor,
    /// The caller's order of `(group, layer)` pairs. Layers it leaves out
    /// follow in payload order (a restore always rebuilds and verifies the
    /// whole snapshot); a pair named twice or not in the layout is an
    /// error.
    Custom(Vec<(usize, usize)>),
}

impl LayerOrder {
    /// The streams (payload order indices) of `header`'s layout in this
    /// order, or why the order does not fit the layout.
    pub fn streams(&self, header: &SnapshotHeader) -> std::result::Result<Vec<usize>, String> {
        let names = deltapack_format::layer_digest::stream_layers(header);
        let index = |g: usize, l: usize| names.iter().position(|&n| n == (g, l));
        Ok(match self {
            LayerOrder::GroupMajor => (0..names.len()).collect(),
            LayerOrder::LayerMajor => {
                let mut s: Vec<usize> = (0..names.len()).collect();
                s.sort_by_key(|&i| (names[i].1, names[i].0));
                s
            }
            LayerOrder::Custom(pairs) => {
                let mut seen = vec![false; names.len()];
                let mut out = Vec::with_capacity(names.len());
                for &(g, l) in pairs {
                    let i = index(g, l)
                        .ok_or_else(|| format!("the layout has no layer {l} in group {g}"))?;
                    if std::mem::replace(&mut seen[i], true) {
                        return Err(format!("layer {l} of group {g} is named twice"));
                    }
                    out.push(i);
                }
                out.extend((0..names.len()).filter(|&i| !seen[i]));
                out
            }
        })
    }
}

/// How a handed-out layer was proven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayerProof {
    /// Its bytes matched the stream digest its (v2.2) root records, before
    /// the rest of the snapshot was read.
    StreamDigest,
    /// The root records no stream digests (v2, v2.1, v1): the whole
    /// snapshot was verified first, and every layer handed out after it.
    WholeSnapshot,
}

/// One layer handed to the caller: where its proven bytes are in the
/// caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayerReady {
    /// The page group (index in the layout).
    pub group: usize,
    /// The layer within its group.
    pub layer: usize,
    /// The stream's index in payload order (group by group, layer by
    /// layer).
    pub stream: usize,
    /// The layer's bytes in the buffer (offsets into the snapshot
    /// encoding): its pages, in page order.
    pub range: Range<u64>,
    /// How it was proven.
    pub proof: LayerProof,
}

/// An item of a [`LayerStream`].
#[derive(Debug, Clone)]
pub enum LayerEvent {
    /// A layer was proven and may be used.
    Ready(LayerReady),
    /// The last item: a hit (every layer was handed out, and the snapshot
    /// digest matched) or a miss (see the module docs for the buffer).
    Done(RestoreIntoOutcome),
}

/// The caller's memory, as the layer-wise restore writes it: a pointer and
/// a length, so that the layers already handed out can be read (by the
/// callback, or by another thread) while the rest is written.
#[derive(Clone, Copy)]
struct RawBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the restore writes only ranges not handed out, and readers read
// only ranges handed out (see `Store::restore_layers_raw`'s contract).
unsafe impl Send for RawBuf {}
// SAFETY: as above.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    fn dest(&self) -> SharedDest {
        // SAFETY: `ptr..ptr+len` is valid for writes for the call (the
        // contract of `restore_layers_raw`).
        unsafe { SharedDest::from_raw(self.ptr, self.len) }
    }

    /// The whole buffer, for a path that writes it all before handing out
    /// anything.
    ///
    /// # Safety
    /// Nobody else may access the buffer while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn all(&self) -> &mut [u8] {
        // SAFETY: by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Store {
    /// Restores the root `key` names into `buf` (exactly the snapshot's
    /// encoded length) layer by layer, calling `on_layer(ready, bytes)` on
    /// the calling thread for each layer as soon as it is proven, while
    /// worker threads read and verify the next ones (in `order`). The
    /// returned outcome is the final word: see the module docs
    /// (`restore::layers`) for what a handed-out layer is and for the
    /// buffer's contract on a miss. A slow callback slows nothing but
    /// itself: the workers go on, and at most the whole snapshot waits in
    /// `buf`.
    ///
    /// Reads come from this store itself, not from a tier in front of it
    /// (a tier's hit is only good once the origin has been asked whether
    /// the root changed, which a layer handed out early cannot wait for).
    ///
    /// Errors: a wrong-sized `buf` (found from the root, before any payload
    /// byte is read), an `order` that does not fit the layout (for a root
    /// with stream digests before any payload byte is read; for the
    /// fallback after the whole check, with no layer handed out), and
    /// failures of the backend or the process.
    pub async fn restore_layers_with<F>(
        &self,
        key: impl Into<RootKey>,
        buf: &mut [u8],
        opts: RestoreOptions,
        order: &LayerOrder,
        mut on_layer: F,
    ) -> Result<RestoreIntoOutcome>
    where
        F: FnMut(&LayerReady, &[u8]) + Send,
    {
        let raw = RawBuf {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        };
        // SAFETY: `buf` is borrowed mutably for the whole call, and the
        // only reads of it are the callback's, of handed-out layers.
        unsafe {
            self.restore_layers_raw(key, raw.ptr, raw.len, opts, order, &mut on_layer)
                .await
        }
    }

    /// [`Store::restore_layers_with`] over raw memory, for callers whose
    /// buffer other threads read while the restore runs (a foreign
    /// runtime's pinned or numpy memory).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes until the returned
    /// future completes (or is dropped), and nothing but this call may
    /// write it in that time; a layer's bytes may be read by anyone once
    /// `on_layer` was called for it, and nothing else of the buffer may be
    /// read before the future completes.
    pub unsafe fn restore_layers_raw<'a>(
        &'a self,
        key: impl Into<RootKey>,
        ptr: *mut u8,
        len: usize,
        opts: RestoreOptions,
        order: &'a LayerOrder,
        on_layer: &'a mut (dyn FnMut(&LayerReady, &[u8]) + Send),
    ) -> impl std::future::Future<Output = Result<RestoreIntoOutcome>> + Send + 'a {
        let raw = RawBuf { ptr, len };
        let key = key.into();
        async move {
            let start = Instant::now();
            let out = self
                .layers_origin(key, raw, opts, order, on_layer, start)
                .await;
            out.map_err(|e| self.origin_failed(e))
        }
    }

    async fn layers_origin(
        &self,
        key: RootKey,
        raw: RawBuf,
        opts: RestoreOptions,
        order: &LayerOrder,
        on_layer: &mut (dyn FnMut(&LayerReady, &[u8]) + Send),
        start: Instant,
    ) -> Result<RestoreIntoOutcome> {
        let (ns, context) = (key.namespace, key.context);
        let miss = |reason: MissReason, schema: Option<&'static str>| {
            self.record_restore(start, schema, Err(&reason));
            Ok(RestoreIntoOutcome::Miss { reason })
        };
        if opts.deadline_passed() {
            return miss(MissReason::DeadlineExceeded, None);
        }
        let (multi_thread, direct) = self.restore_in_place();
        let _pin = self.pin(ns, context);
        let r = match self.resolve_within(ns, context, opts).await? {
            Err((reason, schema)) => return miss(reason, schema),
            Ok(r) => r,
        };
        if raw.len as u64 != r.result_len {
            return Err(StoreError::Invalid(format!(
                "buffer is {} bytes, the snapshot is {}",
                raw.len, r.result_len
            )));
        }
        if !direct || matches!(r.what, Plan::V1 { .. }) {
            // Legacy roots (and remote stores on a current-thread runtime):
            // the whole snapshot is restored and verified, then every layer
            // is handed out.
            // SAFETY: nothing is handed out yet, so nobody reads the buffer.
            let out = self
                .restore_into_origin(ns, context, unsafe { raw.all() }, opts, Instant::now())
                .await?;
            return hand_out_whole(raw, out, order, on_layer);
        }
        let deadline = opts.deadline.map(|d| d.into_std());
        let tally = super::read::ReadTally::default();
        let tap = self.tier().and_then(|t| t.open_tap(key));
        let tapped = tap.as_deref().map(|t| t as &dyn super::read::Tap);
        let (out, emitted, streams) = {
            let mut emitted: Vec<AtomicBool> = Vec::new();
            // Where each stream lies in the buffer (known once planned).
            let mut streams: Vec<std::ops::Range<u64>> = Vec::new();
            let mut work = || -> std::result::Result<
                std::result::Result<bool, StoreError>,
                super::reassembly::ObjectFault,
            > {
                let source = self.reassembly_source();
                let ctx = super::read::ReadCtx {
                    source: &source,
                    threads: source.threads(self.config().remote.chain_gets_in_flight.max(1)),
                    deadline,
                    tally: &tally,
                    tap: tapped,
                };
                // Planning a chain may read stored delta headers (v2.0
                // links); a failure there is read again before anything is
                // blamed (the two-failed-checks rule).
                let mut proof = super::reassembly::Proof::default();
                let planned = loop {
                    match super::layer_pass::LayerSource::new(&ctx, &r.what) {
                        Ok(p) => break p,
                        Err(d) => {
                            if let Some(f) = proof.record(d) {
                                return Err(f);
                            }
                        }
                    }
                };
                let Some(src) = planned else {
                    // No stream digests: verified whole, by the usual rebuild.
                    // SAFETY: nothing is handed out yet.
                    self.rebuild(&r.what, Some(unsafe { raw.all() }), deadline, &tally, tapped)?;
                    return Ok(Ok(false));
                };
                let order = match order.streams(src.header()) {
                    Ok(o) => o,
                    Err(e) => return Ok(Err(StoreError::Invalid(format!("layer order: {e}")))),
                };
                emitted = (0..order.len()).map(|_| AtomicBool::new(false)).collect();
                let prefix = src.header().encode_prefix().map_err(|e| {
                    super::reassembly::ObjectFault::plain(format!("snapshot prefix: {e}"))
                })?;
                streams = deltapack_format::layer_digest::stream_ranges(
                    src.header(),
                    prefix.len() as u64,
                )
                .map_err(|e| super::reassembly::ObjectFault::plain(format!("stream ranges: {e}")))?;
                let names = deltapack_format::layer_digest::stream_layers(src.header());
                let dest = raw.dest();
                let mut ready = |s: usize, bytes: &[u8]| {
                    let (group, layer) = names.get(s).copied().unwrap_or_default();
                    let base = bytes.as_ptr() as u64 - raw.ptr as u64;
                    let r = LayerReady {
                        group,
                        layer,
                        stream: s,
                        range: base..base + bytes.len() as u64,
                        proof: LayerProof::StreamDigest,
                    };
                    on_layer(&r, bytes);
                };
                super::layer_pass::run(&ctx, &src, &dest, &order, &emitted, &mut ready)?;
                Ok(Ok(true))
            };
            let out = if multi_thread {
                tokio::task::block_in_place(&mut work)
            } else {
                work()
            };
            (out, emitted, streams)
        };
        match out {
            Ok(Err(e)) => Err(e),
            Ok(Ok(layered)) => {
                self.count_reads(&r.what, &tally);
                self.ledger_touch(&ns, &context).await;
                self.after_origin_hit((ns, context).into(), r.want);
                self.record_restore(start, Some(r.schema), Ok((r.boundary, r.result_len)));
                let hit = RestoreIntoOutcome::Hit {
                    len: r.result_len,
                    digest: r.want,
                };
                if layered {
                    return Ok(hit);
                }
                hand_out_whole(raw, hit, order, on_layer)
            }
            Err(failed) => {
                // The layers handed out keep their proven bytes; nothing
                // else unverified stays in the caller's memory.
                zero_unproven(raw, &emitted, &streams);
                let reason = self.damage_outcome(failed).await?;
                miss(reason, Some(r.schema))
            }
        }
    }

    /// The layer-wise restore as a [`futures::Stream`] over a buffer it owns
    /// (exactly the snapshot's length; its heap memory is written in place
    /// and given back by [`LayerStream::into_buffer`]). Items are
    /// [`LayerEvent::Ready`] for each layer as it is proven, then one
    /// [`LayerEvent::Done`]; an `Err` item (then the end) is an error of
    /// [`Store::restore_layers_with`]. The work runs as a task on the
    /// current runtime and goes on if the stream is dropped. A new buffer
    /// is best allocated with [`crate::fresh_buffer`] (huge pages, faulted
    /// in where the workers write).
    pub fn restore_layers(
        &self,
        key: impl Into<RootKey>,
        buf: Vec<u8>,
        opts: RestoreOptions,
        order: LayerOrder,
    ) -> LayerStream {
        let mut buf = buf;
        let raw = RawBuf {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        };
        let owned = Arc::new(OwnedBuf { _buf: buf, raw });
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (store, key, keep) = (self.clone(), key.into(), owned.clone());
        let task = tokio::spawn(async move {
            let events = tx.clone();
            let mut send = move |r: &LayerReady, _: &[u8]| {
                let _ = events.send(Ok(LayerEvent::Ready(r.clone())));
            };
            let raw = keep.raw;
            // SAFETY: `keep` holds the Vec (whose heap block does not move)
            // until this task ends; the stream reads only layers handed
            // out, and nothing else writes the Vec.
            let out = unsafe {
                store
                    .restore_layers_raw(key, raw.ptr, raw.len, opts, &order, &mut send)
                    .await
            };
            drop(keep);
            let _ = tx.send(out.map(LayerEvent::Done));
        });
        LayerStream {
            rx,
            owned,
            handed: Vec::new(),
            task: Some(task),
        }
    }
}

/// Hands out every layer of a snapshot verified whole (the fallback for
/// roots without stream digests), after a hit; a miss hands out nothing.
/// An order that does not fit the layout is an error before any layer is
/// handed out, as it is for a layered root.
fn hand_out_whole(
    raw: RawBuf,
    out: RestoreIntoOutcome,
    order: &LayerOrder,
    on_layer: &mut (dyn FnMut(&LayerReady, &[u8]) + Send),
) -> Result<RestoreIntoOutcome> {
    if !matches!(out, RestoreIntoOutcome::Hit { .. }) {
        return Ok(out);
    }
    // SAFETY: the whole buffer is written and verified; from here on it is
    // only read.
    let all: &[u8] = unsafe { raw.all() };
    let internal = |e: String| StoreError::Internal(format!("a verified snapshot: {e}"));
    let (header, off) =
        deltapack_format::snapshot::decode_prefix(all).map_err(|e| internal(e.to_string()))?;
    let ranges = deltapack_format::layer_digest::stream_ranges(&header, off as u64)
        .map_err(|e| internal(e.to_string()))?;
    let streams = order
        .streams(&header)
        .map_err(|e| StoreError::Invalid(format!("layer order: {e}")))?;
    let names = deltapack_format::layer_digest::stream_layers(&header);
    for s in streams {
        let (Some(r), Some(&(group, layer))) = (ranges.get(s), names.get(s)) else {
            return Err(internal(format!("no stream {s}")));
        };
        let ready = LayerReady {
            group,
            layer,
            stream: s,
            range: r.clone(),
            proof: LayerProof::WholeSnapshot,
        };
        on_layer(&ready, &all[r.start as usize..r.end as usize]);
    }
    Ok(out)
}

/// After a miss: zeroes every byte of the buffer but the layers handed out
/// (stream `s` lies at `streams[s]`; empty when nothing was planned, and
/// then nothing was handed out either).
///
/// Writes through the raw pointer, range by range, and never makes a
/// reference to the whole buffer: the caller may be reading the handed-out
/// layers at this very moment, and a `&mut [u8]` over their bytes would be
/// undefined behaviour even if those bytes were never written.
fn zero_unproven(raw: RawBuf, emitted: &[AtomicBool], streams: &[std::ops::Range<u64>]) {
    let zero = |a: usize, b: usize| {
        let (a, b) = (a.min(raw.len), b.min(raw.len));
        if a < b {
            // SAFETY: `a..b` lies within the caller's buffer (clamped to
            // its length), which is valid for writes for the whole call
            // (the contract of `restore_layers_raw`); the workers have
            // finished, and no handed-out layer overlaps `a..b` (streams
            // are disjoint and in order), so nobody reads these bytes.
            unsafe { std::ptr::write_bytes(raw.ptr.add(a), 0, b - a) }
        }
    };
    let mut at = 0usize;
    for (s, r) in streams.iter().enumerate() {
        let out = emitted
            .get(s)
            .is_some_and(|e| e.load(std::sync::atomic::Ordering::Acquire));
        if out {
            zero(at, r.start as usize);
            at = r.end as usize;
        }
    }
    zero(at, raw.len);
}

/// The buffer a [`LayerStream`] owns.
struct OwnedBuf {
    _buf: Vec<u8>,
    raw: RawBuf,
}

/// The layer-wise restore as a stream (see [`Store::restore_layers`]).
pub struct LayerStream {
    rx: tokio::sync::mpsc::UnboundedReceiver<Result<LayerEvent>>,
    owned: Arc<OwnedBuf>,
    handed: Vec<Range<u64>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl LayerStream {
    /// The proven bytes of a layer this stream handed out (`None` for any
    /// other range).
    pub fn layer(&self, ready: &LayerReady) -> Option<&[u8]> {
        if !self.handed.contains(&ready.range) {
            return None;
        }
        let (a, b) = (ready.range.start as usize, ready.range.end as usize);
        // SAFETY: a handed-out layer is never written again, and the buffer
        // lives as long as `self.owned`.
        let all = unsafe { std::slice::from_raw_parts(self.owned.raw.ptr, self.owned.raw.len) };
        all.get(a..b)
    }

    /// Waits for the restore to end and gives the buffer back.
    pub async fn into_buffer(mut self) -> Result<Vec<u8>> {
        if let Some(t) = self.task.take() {
            t.await
                .map_err(|e| StoreError::task("layer-wise restore", e))?;
        }
        match Arc::try_unwrap(self.owned) {
            Ok(o) => Ok(o._buf),
            Err(_) => Err(StoreError::Internal(
                "the layer-wise restore still holds its buffer".into(),
            )),
        }
    }
}

impl futures::Stream for LayerStream {
    type Item = Result<LayerEvent>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let polled = self.rx.poll_recv(cx);
        if let std::task::Poll::Ready(Some(Ok(LayerEvent::Ready(r)))) = &polled {
            let range = r.range.clone();
            self.handed.push(range);
        }
        polled
    }
}

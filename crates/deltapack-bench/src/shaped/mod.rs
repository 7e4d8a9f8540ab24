//! The bandwidth-shaped S3 emulation: an `ObjectStore` wrapper that gives
//! every request a first-byte latency and every connection a bandwidth cap,
//! under an aggregate cap that all connections share.
//!
//! The S3-like emulation ([`crate::s3like`]) adds a latency per GET and
//! nothing else, so a restore that moves an extent in one GET pays one
//! latency for 64 MiB and is otherwise limited by the CPU. Real S3 is not
//! like that: one connection (one GET body, one PUT, one multipart part)
//! delivers some 50–100 MB/s, and a host's network link caps the sum. A
//! client that wants the link's bandwidth must keep enough connections
//! busy: ranged GETs of one object in parallel, multipart uploads with
//! several parts in flight. [`ShapedStore`] models exactly that, with
//! three parameters ([`Shaping`]): the latency L before any request's
//! first byte, the per-connection cap C and the aggregate cap A.
//!
//! How requests are shaped:
//!
//! * every GET, HEAD, PUT, multipart create / part / complete / abort and
//!   copy first sleeps L (the requests sleep concurrently, as independent
//!   round trips do);
//! * a GET body (whole object or a range) is one connection: it is
//!   streamed in the chunks the inner store yields (256 KiB from
//!   [`crate::s3like::StreamedObjects`]) and each chunk is held back until
//!   its time on the connection's clock (at C) and on the shared aggregate
//!   clock (at A) has come;
//! * a PUT payload and each multipart part's payload is one connection,
//!   paced the same way in 256 KiB slices before it is forwarded to the
//!   inner store (so a PUT of `len` bytes takes at least `len / C`, and
//!   reserves `len` bytes on the aggregate clock, slice by slice).
//!
//! The clocks ([`Clock`]) are virtual-time token buckets: a reservation of
//! `n` bytes made at time `now` starts at the clock's next free instant or
//! at `now` (less one chunk of slack, so that a timer firing a little late
//! does not cost bandwidth), and moves the clock on by `n / rate`. The
//! aggregate clock only ever advances by `n / A` per reservation, whatever
//! the connection clocks say, so over any interval it hands out at most
//! A × interval + one chunk; and because every connection asks for its next
//! chunk only once the previous one is through, reservations interleave
//! chunk by chunk, which shares A fairly: N busy connections get
//! min(N × C, A) in total (see the tests, which check the schedule itself
//! rather than wall-clock timings).
//!
//! Not modelled: TCP slow start, request rate limits, errors, and the CPU
//! cost of TLS. Listing and deletion pass through unshaped (the scenarios
//! do not time them).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, MultipartUpload, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, UploadPart,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use anyhow::{Context, Result};
use deltapack_store::{Backend, BackendKind, Store, StoreConfig};

use crate::s3like::{get_rebodied, StreamedObjects, BODY_CHUNK};
use deltapack_store::wrap::{Intercept, Wrapped};

mod parts_memory;

use parts_memory::PartsMemory;

/// The shaping parameters: first-byte latency, per-connection and aggregate
/// bandwidth (bytes are 10⁶ per MB throughout).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Shaping {
    /// Latency before the first byte of every request, ms.
    pub(crate) latency_ms: u64,
    /// Cap of one connection (a GET body, a PUT, a part), bytes/s.
    pub(crate) conn_bytes_per_s: u64,
    /// Cap shared by all connections, bytes/s.
    pub(crate) aggregate_bytes_per_s: u64,
}

/// The shaped emulation's options (`--shaped-*`), shared by every suite
/// that runs it.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ShapingArgs {
    /// Shaped S3 emulation: latency before the first byte of every
    /// request (GET, HEAD, PUT, multipart part), in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 20)]
    pub(crate) shaped_latency_ms: u64,
    /// Shaped S3 emulation: bandwidth cap C of one connection (a GET body,
    /// a PUT, a part), MB/s (10⁶ bytes).
    #[arg(long, value_name = "MB_S", default_value_t = 25.0)]
    pub(crate) shaped_conn_mb_s: f64,
    /// Shaped S3 emulation: aggregate bandwidth cap A shared by all
    /// connections, MB/s (10⁶ bytes).
    #[arg(long, value_name = "MB_S", default_value_t = 400.0)]
    pub(crate) shaped_aggregate_mb_s: f64,
}

impl ShapingArgs {
    /// The emulation's parameters, checked (each bandwidth between 0.001
    /// and 1,000,000 MB/s).
    pub(crate) fn shaping(&self) -> anyhow::Result<Shaping> {
        let rate = |flag: &str, mb_s: f64| -> anyhow::Result<u64> {
            if !(0.001..=1e6).contains(&mb_s) {
                anyhow::bail!("{flag} must be between 0.001 and 1,000,000 MB/s, got {mb_s}");
            }
            Ok((mb_s * 1e6).round() as u64)
        };
        Ok(Shaping {
            latency_ms: self.shaped_latency_ms,
            conn_bytes_per_s: rate("--shaped-conn-mb-s", self.shaped_conn_mb_s)?,
            aggregate_bytes_per_s: rate("--shaped-aggregate-mb-s", self.shaped_aggregate_mb_s)?,
        })
    }
}

impl Shaping {
    /// The aggregate-bandwidth floor of moving `bytes`: `bytes / A` plus one
    /// latency, in ms (computed, not measured: no transfer over this store
    /// can be faster).
    pub(crate) fn floor_ms(&self, bytes: u64) -> f64 {
        bytes as f64 / self.aggregate_bytes_per_s as f64 * 1000.0 + self.latency_ms as f64
    }

    /// The connections at C it takes to fill A (rounded up).
    pub(crate) fn connections_to_fill(&self) -> u64 {
        self.aggregate_bytes_per_s
            .div_ceil(self.conn_bytes_per_s.max(1))
    }

    /// One line describing the parameters.
    pub(crate) fn describe(&self) -> String {
        format!(
            "latency {} ms per request, C = {} MB/s per connection, A = {} MB/s aggregate ({} connections at C fill A), {} KiB body chunks",
            self.latency_ms,
            self.conn_bytes_per_s as f64 / 1e6,
            self.aggregate_bytes_per_s as f64 / 1e6,
            self.connections_to_fill(),
            BODY_CHUNK / 1024
        )
    }
}

/// A pacing clock: a token bucket in virtual time (seconds since the
/// shaper's epoch). See the module docs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    /// Bytes per second.
    rate: f64,
    /// Slack: how far behind `now` a reservation may start, s.
    slack_s: f64,
    /// When the clock is next free, s.
    next: f64,
}

impl Clock {
    /// A clock at `rate` bytes/s that allows `burst` bytes of slack.
    pub(crate) fn new(rate: u64, burst: u64) -> Clock {
        let rate = rate.max(1) as f64;
        Clock {
            rate,
            slack_s: burst as f64 / rate,
            next: f64::NEG_INFINITY,
        }
    }

    /// Reserves `n` bytes asked for at `now`; returns when they are
    /// through on this clock.
    pub(crate) fn reserve(&mut self, now: f64, n: u64) -> f64 {
        let begin = self.next.max(now - self.slack_s);
        self.next = begin + n as f64 / self.rate;
        self.next
    }
}

/// When `n` bytes asked for at `now` on a connection are through: the later
/// of the connection's and the aggregate clock's reservations.
pub(crate) fn schedule(conn: &mut Clock, aggregate: &mut Clock, now: f64, n: u64) -> f64 {
    conn.reserve(now, n).max(aggregate.reserve(now, n))
}

/// Counters of a shaper (totals since it was made).
#[derive(Debug, Default)]
pub(crate) struct ShapedStats {
    /// Requests that paid the latency.
    pub(crate) requests: AtomicU64,
    /// GET body bytes delivered.
    pub(crate) bytes_down: AtomicU64,
    /// PUT and part bytes accepted.
    pub(crate) bytes_up: AtomicU64,
    /// Connections (GET bodies, PUTs, parts) opened.
    pub(crate) connections: AtomicU64,
    /// Connections open now.
    open: AtomicU64,
    /// Most connections open at once.
    pub(crate) max_open: AtomicU64,
}

/// The shared state of one shaped store: the parameters, the epoch of the
/// virtual clocks, the aggregate clock and the counters.
#[derive(Debug)]
pub(crate) struct Shaper {
    shaping: Shaping,
    epoch: Instant,
    aggregate: Mutex<Clock>,
    /// Whether requests are shaped (and counted) at all: off for a
    /// scenario's untimed set-up through the same store.
    enabled: AtomicBool,
    /// The counters.
    pub(crate) stats: ShapedStats,
}

impl Shaper {
    /// A shaper for `shaping`, its clocks starting now.
    pub(crate) fn new(shaping: Shaping) -> Arc<Shaper> {
        Arc::new(Shaper {
            shaping,
            epoch: Instant::now(),
            aggregate: Mutex::new(Clock::new(shaping.aggregate_bytes_per_s, BODY_CHUNK)),
            enabled: AtomicBool::new(true),
            stats: ShapedStats::default(),
        })
    }

    /// Turns shaping on or off (on when made). Off, requests pass
    /// through at once and are not counted; connections opened while on
    /// stay shaped.
    pub(crate) fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// One request's first-byte latency.
    async fn first_byte(&self) {
        if !self.enabled() {
            return;
        }
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        if self.shaping.latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.shaping.latency_ms)).await;
        }
    }

    /// Opens a connection (its own clock at C); `None` while shaping is
    /// off.
    fn connect(self: &Arc<Self>) -> Option<Connection> {
        if !self.enabled() {
            return None;
        }
        let s = &self.stats;
        s.connections.fetch_add(1, Ordering::Relaxed);
        let open = s.open.fetch_add(1, Ordering::Relaxed) + 1;
        s.max_open.fetch_max(open, Ordering::Relaxed);
        Some(Connection {
            shaper: self.clone(),
            clock: Clock::new(self.shaping.conn_bytes_per_s, BODY_CHUNK),
        })
    }

    /// Paces an upload of `len` bytes on a new connection (at once while
    /// shaping is off).
    async fn upload(self: &Arc<Self>, len: u64) {
        if let Some(mut c) = self.connect() {
            c.upload(len).await;
        }
    }

    /// A snapshot of the counters: requests, bytes down, bytes up,
    /// connections, most open at once.
    pub(crate) fn counters(&self) -> [u64; 5] {
        let s = &self.stats;
        [
            s.requests.load(Ordering::Relaxed),
            s.bytes_down.load(Ordering::Relaxed),
            s.bytes_up.load(Ordering::Relaxed),
            s.connections.load(Ordering::Relaxed),
            s.max_open.load(Ordering::Relaxed),
        ]
    }

    /// Resets the high-water mark of open connections to those open now.
    pub(crate) fn reset_max_open(&self) {
        let s = &self.stats;
        s.max_open
            .store(s.open.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// One connection: a GET body or a PUT / part payload.
#[derive(Debug)]
struct Connection {
    shaper: Arc<Shaper>,
    clock: Clock,
}

impl Connection {
    /// Waits until `n` more bytes are through on this connection's clock and
    /// on the aggregate one.
    async fn pace(&mut self, n: u64) {
        let sh = &self.shaper;
        let now = sh.epoch.elapsed().as_secs_f64();
        let at = {
            let mut agg = sh.aggregate.lock().unwrap_or_else(|e| e.into_inner());
            schedule(&mut self.clock, &mut agg, now, n)
        };
        if at > now {
            tokio::time::sleep_until(sh.epoch + Duration::from_secs_f64(at)).await;
        }
    }

    /// Paces an upload of `len` bytes, slice by slice.
    async fn upload(&mut self, len: u64) {
        let mut left = len;
        while left > 0 {
            let n = left.min(BODY_CHUNK);
            self.pace(n).await;
            left -= n;
        }
        self.shaper.stats.bytes_up.fetch_add(len, Ordering::Relaxed);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shaper.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The shaped store: `inner` behind a [`Shaper`] (see the module docs).
#[derive(Debug)]
pub(crate) struct ShapedStore {
    inner: Arc<dyn ObjectStore>,
    shaper: Arc<Shaper>,
}

impl ShapedStore {
    /// Shapes `inner` with `shaping`.
    pub(crate) fn new(inner: Arc<dyn ObjectStore>, shaping: Shaping) -> Wrapped<ShapedStore> {
        Wrapped(ShapedStore {
            inner,
            shaper: Shaper::new(shaping),
        })
    }

    /// The shared shaper (its counters).
    pub(crate) fn shaper(&self) -> Arc<Shaper> {
        self.shaper.clone()
    }
}

/// A part of a shaped multipart upload.
#[derive(Debug)]
struct ShapedUpload {
    inner: Box<dyn MultipartUpload>,
    shaper: Arc<Shaper>,
}

#[async_trait]
impl MultipartUpload for ShapedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let len = data.content_length() as u64;
        // Handed to the inner upload now, so that the part keeps its index;
        // the caller sees it done only once it has been paced.
        let forwarded = self.inner.put_part(data);
        let shaper = self.shaper.clone();
        Box::pin(async move {
            shaper.first_byte().await;
            shaper.upload(len).await;
            forwarded.await
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.shaper.first_byte().await;
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.shaper.first_byte().await;
        self.inner.abort().await
    }
}

#[async_trait]
impl Intercept for ShapedStore {
    deltapack_store::layer_basics!("ShapedStore");

    async fn put_opts(
        &self,
        location: &ObjPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.shaper.first_byte().await;
        self.shaper.upload(payload.content_length() as u64).await;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.shaper.first_byte().await;
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(ShapedUpload {
            inner,
            shaper: self.shaper.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &ObjPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.shaper.first_byte().await;
        get_rebodied(&*self.inner, location, options, |r| {
            // A stream as it is; a file's bytes as object_store streams them.
            let inner = r.into_stream();
            match self.shaper.connect() {
                None => inner,
                Some(conn) => {
                    futures::stream::unfold((inner, conn), |(mut inner, mut conn)| async move {
                        let item = inner.next().await?;
                        if let Ok(chunk) = &item {
                            let n = chunk.len() as u64;
                            conn.pace(n).await;
                            conn.shaper.stats.bytes_down.fetch_add(n, Ordering::Relaxed);
                        }
                        Some((item, (inner, conn)))
                    })
                    .boxed()
                }
            }
        })
        .await
    }

    async fn copy_opts(
        &self,
        from: &ObjPath,
        to: &ObjPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.shaper.first_byte().await;
        self.inner.copy_opts(from, to, options).await
    }
}

/// The shaped emulation over a local store's files, for restores: the
/// files through `object_store`'s local backend, streamed in 256 KiB
/// chunks ([`StreamedObjects`]), shaped. The store's kind is `Memory` (an
/// in-memory ledger), as for the S3-like emulation.
pub(crate) fn shaped_local_store(
    dir: &std::path::Path,
    shaping: Shaping,
    config: StoreConfig,
) -> Result<(Store, Arc<Shaper>)> {
    let local = object_store::local::LocalFileSystem::new_with_prefix(dir)
        .with_context(|| format!("opening {}", dir.display()))?;
    let shaped = ShapedStore::new(Arc::new(StreamedObjects::over(Arc::new(local))), shaping);
    let shaper = shaped.shaper();
    let store = Store::from_backend(
        Backend {
            store: Arc::new(shaped),
            kind: BackendKind::Memory,
        },
        config,
    )?;
    Ok((store, shaper))
}

/// An in-memory object store, shaped (`Some`) or not, for publications.
///
/// The store's kind is `S3` with an in-memory ledger: the publication
/// takes the path it takes on S3 (a `Memory` store would copy every
/// object's payload first, which an S3 client does not), and the objects
/// land in a [`PartsMemory`] (no disk in the way: the local backend's
/// buffered writes run at a few hundred MB/s on the reference machine,
/// about A; and no copy of the payload).
pub(crate) fn shaped_memory_store(
    shaping: Option<Shaping>,
    mut config: StoreConfig,
) -> Result<(Store, Option<Arc<Shaper>>)> {
    let mem: Arc<dyn ObjectStore> = Arc::new(PartsMemory::default());
    let (os, shaper): (Arc<dyn ObjectStore>, _) = match shaping {
        Some(s) => {
            let st = ShapedStore::new(mem, s);
            let sh = st.shaper();
            (Arc::new(st), Some(sh))
        }
        None => (mem, None),
    };
    config.capacity.ledger = Some("sqlite://:memory:".into());
    let store = Store::from_backend(
        Backend {
            store: os,
            kind: BackendKind::S3 {
                bucket: "shaped-emulation".into(),
                prefix: String::new(),
                query: String::new(),
            },
        },
        config,
    )?;
    Ok((store, shaper))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use object_store::memory::InMemory;
    use object_store::{GetRange, ObjectStoreExt};

    /// The whole body of `key` in `store`.
    async fn whole(store: &dyn ObjectStore, key: &ObjPath) -> Bytes {
        store
            .get(key)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("body")
    }

    /// Simulates `conns` connections that each move `per_conn` bytes in
    /// `chunk`-byte pieces, every connection asking for its next piece the
    /// moment the previous one is through (virtual time, no sleeping).
    /// Returns when each connection finished, s.
    fn simulate(conns: usize, per_conn: u64, chunk: u64, c: u64, a: u64) -> Vec<f64> {
        let mut agg = Clock::new(a, chunk);
        let mut clocks: Vec<Clock> = (0..conns).map(|_| Clock::new(c, chunk)).collect();
        let mut ready = vec![0.0f64; conns];
        let mut left = vec![per_conn; conns];
        loop {
            // The connection that asks first (ties: lowest index).
            let Some(i) = (0..conns)
                .filter(|&i| left[i] > 0)
                .min_by(|&x, &y| ready[x].total_cmp(&ready[y]))
            else {
                return ready;
            };
            let n = left[i].min(chunk);
            ready[i] = schedule(&mut clocks[i], &mut agg, ready[i], n);
            left[i] -= n;
        }
    }

    #[test]
    fn one_connection_runs_at_c() {
        // 1 MB at 1 MB/s in 10 kB chunks: one second, less one chunk of
        // slack at the start.
        let t = simulate(1, 1_000_000, 10_000, 1_000_000, 100_000_000);
        assert!((t[0] - 0.99).abs() < 1e-9, "{t:?}");
        // The clock's own schedule: back-to-back reservations at `now` = 0
        // are spaced n / rate apart.
        let mut c = Clock::new(1000, 0);
        let ends: Vec<f64> = (0..3).map(|_| c.reserve(0.0, 100)).collect();
        assert_eq!(ends, vec![0.1, 0.2, 0.30000000000000004]);
        // A reservation made after an idle spell starts at `now`, not at the
        // stale `next` (the slack here is zero).
        assert!((c.reserve(5.0, 100) - 5.1).abs() < 1e-9);
    }

    #[test]
    fn n_connections_share_min_of_n_c_and_a_fairly() {
        let (c, a, per, chunk) = (25_000_000, 400_000_000, 20_000_000, 256 * 1024);
        for n in [1usize, 4, 8, 16, 24, 32, 64] {
            let t = simulate(n, per, chunk, c, a);
            let last = t.iter().copied().fold(0.0, f64::max);
            let first = t.iter().copied().fold(f64::INFINITY, f64::min);
            let total = (n as u64 * per) as f64 / last;
            let want = (n as f64 * c as f64).min(a as f64);
            assert!(
                (total / want - 1.0).abs() < 0.03,
                "{n} connections: {total:.0} B/s, want {want:.0}"
            );
            // Fair: every connection finishes within a few chunks' time of
            // the others.
            assert!(
                last - first <= n as f64 * chunk as f64 / a as f64 + 2.0 * chunk as f64 / c as f64,
                "{n} connections: finishes spread over {:.3} s",
                last - first
            );
        }
    }

    #[test]
    fn the_aggregate_clock_never_hands_out_more_than_a() {
        // Whatever the order and sizes of reservations, bytes through by T
        // are at most A × T + one chunk.
        let a = 1_000_000u64;
        let mut agg = Clock::new(a, 1000);
        let mut through = Vec::new();
        for i in 0..1000u64 {
            let now = (i % 7) as f64 * 0.001 + i as f64 * 0.0001;
            let n = 100 + (i * 37) % 900;
            through.push((agg.reserve(now, n), n));
        }
        through.sort_by(|x, y| x.0.total_cmp(&y.0));
        let mut sum = 0u64;
        for (t, n) in through {
            sum += n;
            assert!(sum as f64 <= a as f64 * t + 1000.0 + 1e-6, "{sum} by {t}");
        }
    }

    #[test]
    fn floor_and_description() {
        let s = Shaping {
            latency_ms: 20,
            conn_bytes_per_s: 25_000_000,
            aggregate_bytes_per_s: 400_000_000,
        };
        assert!((s.floor_ms(400_000_000) - 1020.0).abs() < 1e-9);
        assert_eq!(s.connections_to_fill(), 16);
        let d = s.describe();
        assert!(d.contains("20 ms") && d.contains("C = 25 MB/s") && d.contains("A = 400 MB/s"));
    }

    /// Real sleeps, lower bounds only (a sleep never ends early), small
    /// parameters.
    #[tokio::test]
    async fn gets_puts_ranges_and_parts_are_shaped() {
        let s = Shaping {
            latency_ms: 10,
            conn_bytes_per_s: 4_000_000,
            aggregate_bytes_per_s: 8_000_000,
        };
        let store = ShapedStore::new(Arc::new(InMemory::new()), s);
        let sh = store.shaper();
        let len = 1_000_000usize;
        let key = ObjPath::from("a");
        // PUT: ≥ latency + (len − one chunk of slack) / C.
        let t = Instant::now();
        store
            .put(&key, PutPayload::from(vec![7u8; len]))
            .await
            .expect("put");
        let min = 0.010 + (len as f64 - BODY_CHUNK as f64) / 4e6;
        assert!(t.elapsed().as_secs_f64() >= min, "{:?}", t.elapsed());
        // GET: the body is paced at C (the body arrives as one chunk from
        // InMemory: it is held until its time has come).
        let t = Instant::now();
        let body = whole(&store, &key).await;
        assert_eq!(body.len(), len);
        assert!(t.elapsed().as_secs_f64() >= min, "{:?}", t.elapsed());
        // Four concurrent ranged GETs of a quarter each: one connection
        // each, the aggregate (2 × C) binds: ≥ latency + (len − slack) / A.
        let t = Instant::now();
        let q = (len / 4) as u64;
        let gets = (0..4u64).map(|i| {
            let (store, key) = (&store, &key);
            async move {
                let opts = GetOptions {
                    range: Some(GetRange::Bounded(i * q..(i + 1) * q)),
                    ..Default::default()
                };
                store.get_opts(key, opts).await?.bytes().await
            }
        });
        let parts = futures::future::try_join_all(gets).await.expect("ranges");
        assert!(parts.iter().all(|p| p.len() as u64 == q));
        let min_agg = 0.010 + (len as f64 - BODY_CHUNK as f64) / 8e6;
        assert!(t.elapsed().as_secs_f64() >= min_agg, "{:?}", t.elapsed());
        // HEAD: latency, no body, no connection.
        let before = sh.counters();
        let t = Instant::now();
        assert_eq!(store.head(&key).await.expect("head").size, len as u64);
        assert!(t.elapsed() >= Duration::from_millis(10));
        assert_eq!(sh.counters()[3], before[3], "HEAD opened a connection");
        // Multipart: each part paced; the object is the parts in order.
        let mut up = store
            .put_multipart_opts(&ObjPath::from("m"), PutMultipartOptions::default())
            .await
            .expect("create");
        let t = Instant::now();
        let p1 = up.put_part(PutPayload::from(vec![1u8; len / 2]));
        let p2 = up.put_part(PutPayload::from(vec![2u8; len / 2]));
        futures::future::try_join(p1, p2).await.expect("parts");
        // Two parts, one connection each: together ≥ (len − 2 slack) / min(2C, A).
        let min_parts = 0.010 + (len as f64 - 2.0 * BODY_CHUNK as f64) / 8e6;
        assert!(t.elapsed().as_secs_f64() >= min_parts, "{:?}", t.elapsed());
        up.complete().await.expect("complete");
        let m = whole(&store, &ObjPath::from("m")).await;
        assert_eq!(m.len(), len);
        assert!(m[..len / 2].iter().all(|&b| b == 1) && m[len / 2..].iter().all(|&b| b == 2));
        let [requests, down, up_bytes, conns, max_open] = sh.counters();
        assert_eq!(up_bytes, 2 * len as u64);
        assert_eq!(down, 3 * len as u64);
        // put, get, 4 ranges, head, create, 2 parts, complete, get.
        assert_eq!(requests, 12);
        // put, get, 4 ranges, 2 parts, get.
        assert_eq!(conns, 9);
        assert!(max_open >= 2, "{max_open}");
        // Shaping off: requests pass through and are not counted.
        sh.set_enabled(false);
        let before = sh.counters();
        let body = whole(&store, &key).await;
        assert_eq!(body.len(), len);
        assert_eq!(sh.counters(), before);
    }
}

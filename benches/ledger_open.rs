//! The ledger at scale: N valid v2 roots (N = 100,000 by default;
//! `DELTAPACK_BENCH_ROOTS` overrides, `.ci/smoke` runs a small N), then
//!
//! - **rebuild**: list and read every root into the ledger (SQLite; also
//!   PostgreSQL and a moto bucket when `DELTAPACK_TEST_POSTGRES` /
//!   `DELTAPACK_TEST_S3_ENDPOINT` are set; moto with
//!   `DELTAPACK_BENCH_S3_ROOTS`, default min(N, 10,000), since moto serves
//!   about 100 requests/s), with the number of requests the
//!   store received, counted by a wrapper around the backend;
//! - **open**: a fresh handle's ledger opened with a persisted ledger
//!   (`load`: no listing), its first totals (a scan of the tables), and
//!   the background reconciliation that follows;
//! - **lookup**: `Store::lookup` of a 262,144-token request (1,024
//!   candidate boundaries, one of them stored) over the N roots, p50/p99 of
//!   200 calls, and the requests one call sends;
//! - **publish/restore**: the reference workload's shape — a delta over a
//!   4,096-token base, durably published, then restored cold by a fresh
//!   handle — with a SQLite and with a PostgreSQL ledger
//!   (`DELTAPACK_BENCH_PR_TOKENS` result tokens, default 16,384 ≈ 100 MB,
//!   262,144 for the reference 1.58 GB delta; `DELTAPACK_BENCH_PR_RUNS`
//!   alternating runs each, default 5; medians and ratios; each handle's
//!   ledger is opened before the clock starts, as a node opens its
//!   connection once).
//!
//! Prints one JSON line per measurement; not a timed assertion.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deltapack::format::context::ContextHasher;
use deltapack::format::root::{self, RootMeta};
use deltapack::format::synth::{self, Preset};
use deltapack::format::{CacheIdentity, ContextDigest};
use deltapack::store::{keys, open_backend, Backend, ColdStart, Store, StoreConfig};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// Counts the requests a store sends its backend, by kind.
#[derive(Debug, Default)]
struct Counts {
    put: AtomicU64,
    get: AtomicU64,
    head: AtomicU64,
    list: AtomicU64,
    delete: AtomicU64,
}

impl Counts {
    fn json(&self) -> String {
        format!(
            "{{\"list\":{},\"get\":{},\"head\":{},\"put\":{},\"delete\":{}}}",
            self.list.load(Ordering::Relaxed),
            self.get.load(Ordering::Relaxed),
            self.head.load(Ordering::Relaxed),
            self.put.load(Ordering::Relaxed),
            self.delete.load(Ordering::Relaxed)
        )
    }
    fn reset(&self) {
        for c in [&self.put, &self.get, &self.head, &self.list, &self.delete] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// A backend wrapper that counts requests (a listing counts once per
/// 1,000 keys, as S3 pages it).
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn ObjectStore>,
    counts: Arc<Counts>,
}

impl fmt::Display for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Counting {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.counts.put.fetch_add(1, Ordering::Relaxed);
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.counts.put.fetch_add(1, Ordering::Relaxed);
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let c = if options.head {
            &self.counts.head
        } else {
            &self.counts.get
        };
        c.fetch_add(1, Ordering::Relaxed);
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let counts = self.counts.clone();
        self.inner
            .delete_stream(locations)
            .inspect(move |_| {
                counts.delete.fetch_add(1, Ordering::Relaxed);
            })
            .boxed()
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let counts = self.counts.clone();
        counts.list.fetch_add(1, Ordering::Relaxed);
        self.inner
            .list(prefix)
            .enumerate()
            .map(move |(i, m)| {
                if i > 0 && i % 1000 == 0 {
                    counts.list.fetch_add(1, Ordering::Relaxed);
                }
                m
            })
            .boxed()
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.counts.list.fetch_add(1, Ordering::Relaxed);
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A fresh schema in the test PostgreSQL, as a ledger URL.
fn postgres_url(tag: &str) -> Option<String> {
    let base = std::env::var("DELTAPACK_TEST_POSTGRES")
        .ok()
        .filter(|u| !u.is_empty())?;
    let schema = format!("bench_{}_{tag}", std::process::id());
    let b = base.clone();
    let s = schema.clone();
    std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&b, postgres::NoTls).expect("connect");
        c.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {s} CASCADE; CREATE SCHEMA {s}"
        ))
        .expect("schema");
    })
    .join()
    .expect("schema thread");
    let sep = if base.contains('?') { '&' } else { '?' };
    Some(format!("{base}{sep}options=-c%20search_path%3D{schema}"))
}

fn p(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

struct Fixture {
    id: CacheIdentity,
    candidates: Vec<(u64, ContextDigest)>,
    hit: (u64, ContextDigest),
}

/// Writes the object and N roots through `backend` (32 PUTs in flight).
async fn populate(backend: &Backend, n: usize) -> Fixture {
    let id = CacheIdentity::example();
    let ns = id.namespace();
    // One small snapshot payload shared by every root (one object), and N
    // valid v2 roots naming it under distinct contexts; root 0 is the
    // request's boundary at 131,072 tokens.
    let snap = synth::snapshot(Preset::Tiny, 1, 1024).expect("synth");
    let x = root::v2_extents(snap.encoded(), 1 << 20, None).expect("extents");
    let object = &x.entries[0];
    backend
        .store
        .put(
            &keys::object_key(&object.object_digest()),
            bytes::Bytes::copy_from_slice(snap.encoded()).into(),
        )
        .await
        .expect("object");
    let tokens = synth::tokens(7, 262_144);
    let candidates = ContextHasher::new(ns, id.chunk_tokens)
        .expect("hasher")
        .boundaries(&tokens);
    let hit = candidates[511];
    let t = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let ctx = if i == 0 {
                hit.1
            } else {
                let mut c = [0u8; 32];
                c[..8].copy_from_slice(&(i as u64).to_le_bytes());
                ContextDigest(*blake3::hash(&c).as_bytes())
            };
            let meta = RootMeta {
                namespace: ns,
                context: ctx,
                chunk_tokens: id.chunk_tokens,
                result_header: snap.header().clone(),
                result_snapshot_digest: snap.digest(),
                result_snapshot_len: snap.encoded().len() as u64,
                base: None,
            };
            let m = deltapack::format::ManifestV2::new(
                &meta,
                snap.encoded().len() as u64,
                x.payload_digest,
                1 << 20,
                x.entries.clone(),
            )
            .expect("manifest");
            let bytes = root::encode_v2(&m, None).expect("encode");
            let store = backend.store.clone();
            async move {
                store
                    .put(&keys::root_key(&ns, &ctx), bytes::Bytes::from(bytes).into())
                    .await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .expect("roots");
    eprintln!("wrote {n} roots in {:.1} s", t.elapsed().as_secs_f64());
    Fixture {
        id,
        candidates,
        hit,
    }
}

async fn measure(engine: &str, url: &str, ledger: Option<String>, n: usize, f: &Fixture) {
    let raw = open_backend(url).expect("backend");
    let counts = Arc::new(Counts::default());
    let backend = Backend {
        store: Arc::new(Counting {
            inner: raw.store.clone(),
            counts: counts.clone(),
        }),
        kind: raw.kind.clone(),
    };
    let config = StoreConfig::default().with_ledger(ledger);
    let t = Instant::now();
    let store = Store::from_backend(
        backend.clone(),
        config.clone().with_cold_start(ColdStart::Rebuild),
    )
    .expect("open");
    let totals = store.ledger_totals().await.expect("rebuild");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(totals.roots as usize, n);
    println!(
        "{{\"bench\":\"ledger_rebuild\",\"engine\":\"{engine}\",\"roots\":{n},\"seconds\":{secs:.3},\"requests\":{}}}",
        counts.json()
    );
    drop(store);
    for round in 0..2 {
        counts.reset();
        let t = Instant::now();
        let store = Store::from_backend(backend.clone(), config.clone()).expect("open");
        store.ledger_location().await.expect("open");
        let open = t.elapsed();
        let open_requests = counts.json();
        let t = Instant::now();
        let totals = store.ledger_totals().await.expect("totals");
        let totals_ms = t.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(totals.roots as usize, n);
        let t = Instant::now();
        store.reconcile_ledger().await.expect("reconcile");
        let reconcile = t.elapsed();
        println!(
            "{{\"bench\":\"ledger_open\",\"engine\":\"{engine}\",\"roots\":{n},\"round\":{round},\"open_ms\":{:.2},\"open_requests\":{open_requests},\"totals_ms\":{totals_ms:.2},\"background_reconcile_s\":{:.3},\"requests\":{}}}",
            open.as_secs_f64() * 1000.0,
            reconcile.as_secs_f64(),
            counts.json()
        );
        if round == 1 {
            let mut times = Vec::new();
            counts.reset();
            for _ in 0..200 {
                let t = Instant::now();
                let found = store.lookup(&f.id, &f.candidates).await.expect("lookup");
                times.push(t.elapsed());
                assert_eq!(found, Some(f.hit));
            }
            times.sort();
            println!(
                "{{\"bench\":\"lookup\",\"engine\":\"{engine}\",\"roots\":{n},\"candidates\":{},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"requests_per_lookup\":{}}}",
                f.candidates.len(),
                p(&times, 0.5),
                p(&times, 0.99),
                counts.head.load(Ordering::Relaxed) as f64 / 200.0
            );
        }
    }
}

/// The reference workload's shape: a flat base of 4,096 tokens published
/// first (not timed), then one durable publication of the result
/// (`DELTAPACK_BENCH_PR_TOKENS` tokens, default 16,384 ≈ 100 MB; 262,144 is
/// the reference, a 1.58 GB delta) as a delta on it into a fresh local
/// store, then the result's cold restore by a fresh handle; seconds of each.
async fn publish_restore_once(ledger: Option<String>, w: &PrWorkload) -> (f64, f64) {
    let dir = tempfile::tempdir().expect("tmp");
    let url = format!("file://{}", dir.path().display());
    let config = StoreConfig::default().with_ledger(ledger);
    let store = Store::open(&url, config.clone()).expect("open");
    // A node opens its ledger connection once: not part of a publication.
    store.ledger_location().await.expect("ledger");
    store
        .publish(deltapack::store::PublishRequest {
            identity: w.id.clone(),
            context: w.base_ctx,
            snapshot: w.base.clone(),
            base: None,
            format: deltapack::store::RootFormat::V2,
        })
        .await
        .expect("publish base");
    let t = Instant::now();
    store
        .publish(deltapack::store::PublishRequest {
            identity: w.id.clone(),
            context: w.ctx,
            snapshot: w.snap.clone(),
            base: Some(deltapack::store::BaseInput {
                context: w.base_ctx,
                snapshot: w.base.clone(),
            }),
            format: deltapack::store::RootFormat::V2,
        })
        .await
        .expect("publish");
    let publish = t.elapsed().as_secs_f64();
    drop(store);
    let store = Store::open(&url, config).expect("open");
    store.ledger_location().await.expect("ledger");
    let t = Instant::now();
    match store
        .restore(
            (w.id.namespace(), w.ctx),
            deltapack::store::RestoreOptions::default(),
        )
        .await
        .expect("restore")
    {
        deltapack::store::RestoreOutcome::Hit(r) => {
            let took = t.elapsed().as_secs_f64();
            assert!(
                r.snapshot.encoded() == w.snap.encoded(),
                "restored bytes differ"
            );
            (publish, took)
        }
        other => panic!("restore: {other:?}"),
    }
}

/// The conversation [`publish_restore_once`] publishes.
struct PrWorkload {
    id: CacheIdentity,
    base: Arc<deltapack::format::Snapshot>,
    base_ctx: ContextDigest,
    snap: Arc<deltapack::format::Snapshot>,
    ctx: ContextDigest,
}

/// Publication and restore with a SQLite and with a PostgreSQL ledger,
/// alternating, `DELTAPACK_BENCH_PR_RUNS` (default 5) times each: the
/// medians and their ratio.
async fn publish_restore() {
    let Some(probe) = postgres_url("probe") else {
        return;
    };
    drop(probe);
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let tokens = env("DELTAPACK_BENCH_PR_TOKENS", 16_384).max(4096 + 256);
    let runs = env("DELTAPACK_BENCH_PR_RUNS", 5).max(1);
    let id = CacheIdentity::example();
    let hasher = ContextHasher::new(id.namespace(), id.chunk_tokens).expect("hasher");
    let w = PrWorkload {
        base: Arc::new(synth::snapshot(Preset::Default, 1, 4096).expect("synth")),
        base_ctx: hasher.digest(&synth::tokens(1, 4096)),
        snap: Arc::new(synth::snapshot(Preset::Default, 1, tokens).expect("synth")),
        ctx: hasher.digest(&synth::tokens(1, tokens as usize)),
        id,
    };
    let (mut sq, mut pg) = (Vec::new(), Vec::new());
    for i in 0..runs {
        sq.push(publish_restore_once(None, &w).await);
        let url = postgres_url(&format!("pr{i}"));
        pg.push(publish_restore_once(url, &w).await);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let fmt = |v: &[(f64, f64)], i: usize| {
        v.iter()
            .map(|r| format!("{:.3}", if i == 0 { r.0 } else { r.1 }))
            .collect::<Vec<_>>()
            .join(",")
    };
    println!(
        "{{\"bench\":\"publish_restore_samples\",\"sqlite_publish_s\":[{}],\"postgres_publish_s\":[{}],\"sqlite_restore_s\":[{}],\"postgres_restore_s\":[{}]}}",
        fmt(&sq, 0),
        fmt(&pg, 0),
        fmt(&sq, 1),
        fmt(&pg, 1)
    );
    let (mut sp, mut sr): (Vec<f64>, Vec<f64>) = sq.into_iter().unzip();
    let (mut pp, mut pr): (Vec<f64>, Vec<f64>) = pg.into_iter().unzip();
    let (sp, sr, pp, pr) = (med(&mut sp), med(&mut sr), med(&mut pp), med(&mut pr));
    println!(
        "{{\"bench\":\"publish_restore\",\"tokens\":{tokens},\"base_tokens\":4096,\"bytes\":{},\"runs\":{runs},\"sqlite_publish_s\":{sp:.3},\"postgres_publish_s\":{pp:.3},\"publish_ratio\":{:.3},\"sqlite_restore_s\":{sr:.3},\"postgres_restore_s\":{pr:.3},\"restore_ratio\":{:.3}}}",
        w.snap.encoded().len(),
        pp / sp,
        pr / sr
    );
}

fn main() {
    let n: usize = std::env::var("DELTAPACK_BENCH_ROOTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        if n == 0 {
            // DELTAPACK_BENCH_ROOTS=0: the publication/restore comparison only.
            publish_restore().await;
            return;
        }
        let dir = tempfile::tempdir().expect("tmp");
        let url = format!("file://{}", dir.path().display());
        let f = populate(&open_backend(&url).expect("backend"), n).await;
        measure("sqlite", &url, None, n, &f).await;
        if let Some(pg) = postgres_url("scale") {
            measure("postgres", &url, Some(pg), n, &f).await;
        }
        publish_restore().await;
        if let Ok(ep) = std::env::var("DELTAPACK_TEST_S3_ENDPOINT") {
            let bucket = std::env::var("DELTAPACK_TEST_S3_BUCKET")
                .unwrap_or_else(|_| "deltapack-test".into());
            let s3 = format!(
                "s3://{bucket}/bench-ledger-{}?endpoint={ep}",
                std::process::id()
            );
            // moto serves ~100 requests/s: a smaller N by default.
            let n3: usize = std::env::var("DELTAPACK_BENCH_S3_ROOTS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(n.min(10_000));
            let f = populate(&open_backend(&s3).expect("s3 backend"), n3).await;
            let ledger = format!("sqlite://{}", dir.path().join("moto.sqlite3").display());
            measure("sqlite+moto", &s3, Some(ledger), n3, &f).await;
        }
    });
}

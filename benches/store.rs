//! Criterion benchmarks of small publish/restore round trips on a temporary
//! local store (fsync on, as in production):
//!
//! * durable publication of a delta (v2 and legacy v1) against an already
//!   published base, each iteration into a fresh store;
//! * restore of that delta (base from the verified-base cache), v2 through
//!   the fused local path and v1 through `object_store`.
//!
//! Two workloads: the `tiny` preset with 4 KiB extents (many small objects)
//! and a scaled `default` conversation (4,096 → 6,144 tokens, ≈ 15 MiB
//! delta, one 64 MiB extent). The reference-scale numbers come from
//! `deltapack-bench` (crates/deltapack-bench, see `benches/results/`);
//! `cargo bench --bench store -- --test` runs each benchmark once (the CI
//! smoke check).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use deltapack::format::synth::{self, Preset};
use deltapack::format::{CacheIdentity, ContextDigest, ContextHasher, Snapshot};
use deltapack::store::{BaseInput, PublishRequest, RootFormat, Store, StoreConfig};

/// One conversation: base and result snapshots and their contexts.
struct Workload {
    name: &'static str,
    identity: CacheIdentity,
    base: Arc<Snapshot>,
    result: Arc<Snapshot>,
    base_ctx: ContextDigest,
    result_ctx: ContextDigest,
    extent_bytes: u64,
}

impl Workload {
    fn new(name: &'static str, preset: Preset, b: u64, r: u64, extent_bytes: u64) -> Self {
        let identity = CacheIdentity::example();
        let tokens = synth::tokens(1, r as usize);
        let h = ContextHasher::new(identity.namespace(), identity.chunk_tokens).expect("hasher");
        Workload {
            name,
            base: Arc::new(synth::snapshot(preset, 1, b).expect("base")),
            result: Arc::new(synth::snapshot(preset, 1, r).expect("result")),
            base_ctx: h.digest(&tokens[..b as usize]),
            result_ctx: h.digest(&tokens),
            identity,
            extent_bytes,
        }
    }

    fn request(&self, format: RootFormat, delta: bool) -> PublishRequest {
        PublishRequest {
            identity: self.identity.clone(),
            context: if delta {
                self.result_ctx
            } else {
                self.base_ctx
            },
            snapshot: if delta {
                self.result.clone()
            } else {
                self.base.clone()
            },
            base: delta.then(|| BaseInput {
                context: self.base_ctx,
                snapshot: self.base.clone(),
            }),
            format,
        }
    }

    /// A fresh local store holding the published base.
    fn store_with_base(&self, rt: &tokio::runtime::Runtime, format: RootFormat) -> Fresh {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = StoreConfig::default().with_max_extent_bytes(self.extent_bytes);
        let store =
            Store::open(&format!("file://{}", dir.path().display()), config).expect("open store");
        rt.block_on(store.publish(self.request(format, false)))
            .expect("publish base");
        Fresh { store, _dir: dir }
    }
}

/// A store and the temporary directory it lives in.
struct Fresh {
    store: Store,
    _dir: tempfile::TempDir,
}

fn round_trips(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let workloads = [
        Workload::new("tiny_2048_to_8192_4KiB", Preset::Tiny, 2048, 8192, 4096),
        Workload::new(
            "default_4096_to_6144_64MiB",
            Preset::Default,
            4096,
            6144,
            deltapack::format::DEFAULT_MAX_EXTENT_BYTES,
        ),
    ];
    let mut g = c.benchmark_group("store_round_trip");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(3));
    for w in &workloads {
        g.throughput(Throughput::Bytes(w.result.encoded().len() as u64));
        for (fname, format) in [("v2", RootFormat::V2), ("v1", RootFormat::V1)] {
            g.bench_function(
                BenchmarkId::new(format!("publish_delta_{fname}"), w.name),
                |b| {
                    b.iter_batched(
                        || w.store_with_base(&rt, format),
                        |fresh| {
                            rt.block_on(fresh.store.publish(w.request(format, true)))
                                .expect("publish delta");
                            fresh
                        },
                        BatchSize::PerIteration,
                    )
                },
            );
            let fresh = w.store_with_base(&rt, format);
            rt.block_on(fresh.store.publish(w.request(format, true)))
                .expect("publish delta");
            // Warm the verified-base cache, as a long-running reader has it.
            rt.block_on(
                fresh
                    .store
                    .restore((&w.identity, w.base_ctx), Default::default()),
            )
            .expect("restore base");
            g.bench_function(
                BenchmarkId::new(format!("restore_delta_{fname}"), w.name),
                |b| {
                    b.iter(|| {
                        let out = rt
                            .block_on(fresh.store.restore(
                                (&w.identity, black_box(w.result_ctx)),
                                Default::default(),
                            ))
                            .expect("restore");
                        assert!(out.hit().is_some(), "restore missed: {:?}", out.miss());
                        out
                    })
                },
            );
        }
    }
    g.finish();
}

criterion_group!(benches, round_trips);
criterion_main!(benches);

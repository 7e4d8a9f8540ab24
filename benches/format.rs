//! Criterion benchmarks of the pure hot paths of deltapack:
//!
//! * extent-tree hashing of a 64 MiB buffer: one core (`ExtentPlan::name`,
//!   `parallel = false`), rayon (`parallel = true`), and the layout restore
//!   uses — two 32 MiB extents hashed as BLAKE3 subtrees on two std threads
//!   and merged; plus the fused 256 KiB "hash while hot, copy out" loop;
//! * page-delta encode and apply (`delta::encode`, `PageDelta::apply`) on a
//!   tiny and a scaled default-preset conversation;
//! * root envelope encode/decode of the reference-sized v2 (24 extents) and
//!   v1 (1,024 chunks) manifests;
//! * a 64 MiB copy into fresh (page-faulting) versus resident memory — the
//!   largest single cost of a restore into a newly allocated result.
//!
//! Sample sizes and measurement times are small so that `cargo bench` stays
//! within a few minutes on 2 cores; `cargo bench --bench format -- --test`
//! runs every benchmark once (the CI smoke check).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use deltapack::format::root::{self, RootMeta};
use deltapack::format::synth::{self, Preset};
use deltapack::format::{
    delta, BaseRef, CacheIdentity, ChunkEntryV1, ContextDigest, Digest, ExtentCodec, ExtentEntry,
    ExtentPlan, ManifestV1, ManifestV2, PageDelta, SnapshotHeader,
};

const MIB: usize = 1 << 20;

/// Deterministic non-trivial bytes (bf16-like synthetic pages).
fn buffer(len: usize) -> Vec<u8> {
    let tokens = (len as u64 / (24 * 65_024 + 1)).max(1) * 256 + 256;
    let s = synth::snapshot(Preset::Default, 3, tokens).expect("synthetic snapshot");
    let mut v = s.payload().to_vec();
    v.resize(len, 0x5a);
    v
}

fn extent_hashing(c: &mut Criterion) {
    let len = 64 * MIB;
    let data = buffer(len);
    let mut g = c.benchmark_group("extent_hash_64MiB");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Bytes(len as u64));
    // Extent 0 of a two-extent payload: a non-root subtree, as in production.
    let plan = ExtentPlan::new(2 * len as u64, len as u64).expect("plan");
    g.bench_function("name_1_thread", |b| {
        b.iter(|| plan.name(0, black_box(&data), false).expect("name"))
    });
    g.bench_function("name_rayon", |b| {
        b.iter(|| plan.name(0, black_box(&data), true).expect("name"))
    });
    // The same 64 MiB as two 32 MiB extents, one per std thread, merged.
    let half = ExtentPlan::new(len as u64, (len / 2) as u64).expect("plan");
    g.bench_function("two_extents_2_threads", |b| {
        b.iter(|| {
            let (l, r) = data.split_at(len / 2);
            let names = std::thread::scope(|s| {
                let a = s.spawn(|| half.name(0, l, false));
                let b = s.spawn(|| half.name(1, r, false));
                [
                    a.join().expect("join").expect("name"),
                    b.join().expect("join").expect("name"),
                ]
            });
            half.merge(&names).expect("merge")
        })
    });
    // The restore loop on one core: 256 KiB pieces hashed, then copied into a
    // touched destination while still in cache.
    let mut dst = vec![1u8; len];
    g.bench_function("fused_hash_copy_256KiB_1_thread", |b| {
        b.iter(|| {
            let mut h = plan.hasher(0);
            for (src, out) in data.chunks(256 * 1024).zip(dst.chunks_mut(256 * 1024)) {
                h.update(src);
                out.copy_from_slice(src);
            }
            h.finish().expect("name")
        })
    });
    g.finish();
}

/// Why restore wants a reusable destination: the same 64 MiB copy into
/// fresh (never touched, page-faulting) memory and into resident memory.
fn page_faults(c: &mut Criterion) {
    let len = 64 * MIB;
    let src = vec![7u8; len];
    let mut g = c.benchmark_group("copy_64MiB");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Bytes(len as u64));
    g.bench_function("into_fresh_pages", |b| {
        b.iter_batched(
            // calloc of a large block maps fresh zero pages without touching them
            || vec![0u8; len],
            |mut dst| {
                dst.copy_from_slice(black_box(&src));
                dst
            },
            BatchSize::PerIteration,
        )
    });
    let mut dst = vec![1u8; len];
    g.bench_function("into_touched_pages", |b| {
        b.iter(|| dst.copy_from_slice(black_box(&src)))
    });
    g.finish();
}

fn page_delta(c: &mut Criterion) {
    let mut g = c.benchmark_group("page_delta");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    // (name, preset, base tokens, result tokens)
    let cases = [
        ("tiny_2048_to_8192", Preset::Tiny, 2048u64, 8192u64),
        ("default_4096_to_8192", Preset::Default, 4096, 8192),
    ];
    for (name, preset, b_tokens, r_tokens) in cases {
        let base = synth::snapshot(preset, 1, b_tokens).expect("base");
        let result = synth::snapshot(preset, 1, r_tokens).expect("result");
        let d = delta::encode(256, &base, &result).expect("encode");
        g.throughput(Throughput::Bytes(d.len() as u64));
        g.bench_with_input(BenchmarkId::new("encode", name), &(), |b, _| {
            b.iter(|| delta::encode(256, black_box(&base), black_box(&result)).expect("encode"))
        });
        g.throughput(Throughput::Bytes(result.encoded().len() as u64));
        g.bench_with_input(BenchmarkId::new("apply", name), &(), |b, _| {
            b.iter(|| PageDelta::apply(black_box(&base), black_box(&d)).expect("apply"))
        });
    }
    g.finish();
}

/// Reference-sized manifests: the 1,575,821,491-byte-class delta as v2 (24
/// extents of 64 MiB) and v1 (1,024 SHA-256 chunks). Names are synthetic
/// but consistent (merged for v2), so both validate.
fn reference_manifests() -> (ManifestV2, ManifestV1) {
    let id = CacheIdentity::example();
    let ns = id.namespace();
    let layout = Preset::Default.layout();
    let header = SnapshotHeader::new(layout.clone(), 262_144);
    let result_len = header.encoded_len().expect("header");
    let payload_len = 1008 * layout.groups[0].page_bytes() + layout.groups[1].page_bytes() + 400;
    let meta = RootMeta {
        namespace: ns,
        context: ContextDigest(*Digest::blake3(b"result").as_bytes()),
        chunk_tokens: 256,
        result_header: header,
        result_snapshot_digest: Digest::blake3(b"result snapshot"),
        result_snapshot_len: result_len,
        base: Some(BaseRef {
            namespace: ns,
            context: ContextDigest(*Digest::blake3(b"base").as_bytes()),
            snapshot_digest: Digest::blake3(b"base snapshot"),
            boundary: 4096,
        }),
    };
    let m = deltapack::format::DEFAULT_MAX_EXTENT_BYTES;
    let plan = ExtentPlan::new(payload_len, m).expect("plan");
    let extents: Vec<ExtentEntry> = (0..plan.count())
        .map(|i| {
            let r = plan.range(i);
            ExtentEntry {
                offset: r.start,
                raw_len: r.end - r.start,
                raw_digest: Digest::blake3(&i.to_le_bytes()),
                codec: ExtentCodec::Raw,
                stored_len: r.end - r.start,
                stored_digest: None,
            }
        })
        .collect();
    let names: Vec<Digest> = extents.iter().map(|e| e.raw_digest).collect();
    let v2 = ManifestV2::new(
        &meta,
        payload_len,
        plan.merge(&names).expect("merge"),
        m,
        extents,
    )
    .expect("v2 manifest");
    let chunks: Vec<ChunkEntryV1> = root::v1_chunk_ranges(payload_len, 1024)
        .into_iter()
        .enumerate()
        .map(|(i, r)| ChunkEntryV1 {
            digest: Digest::sha256(&(i as u64).to_le_bytes()),
            bytes: r.end - r.start,
            logical_start: i as u64 * 256,
            logical_end: (i as u64 + 1) * 256,
        })
        .collect();
    let v1 = ManifestV1::new(&meta, payload_len, Digest::blake3(b"payload"), chunks)
        .expect("v1 manifest");
    (v2, v1)
}

fn roots(c: &mut Criterion) {
    let (v2, v1) = reference_manifests();
    let key = root::mac_key(b"bench secret");
    let mut g = c.benchmark_group("root");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(1));
    for (name, mac) in [("plain", None), ("keyed", Some(&key))] {
        let e2 = root::encode_v2(&v2, mac).expect("encode v2");
        let e1 = root::encode_v1(&v1, mac).expect("encode v1");
        g.bench_function(BenchmarkId::new("encode_v2_24_extents", name), |b| {
            b.iter(|| root::encode_v2(black_box(&v2), mac).expect("encode"))
        });
        g.bench_function(BenchmarkId::new("decode_v2_24_extents", name), |b| {
            b.iter(|| root::decode(black_box(&e2), mac).expect("decode"))
        });
        g.bench_function(BenchmarkId::new("encode_v1_1024_chunks", name), |b| {
            b.iter(|| root::encode_v1(black_box(&v1), mac).expect("encode"))
        });
        g.bench_function(BenchmarkId::new("decode_v1_1024_chunks", name), |b| {
            b.iter(|| root::decode(black_box(&e1), mac).expect("decode"))
        });
    }
    g.finish();
}

criterion_group!(benches, extent_hashing, page_faults, page_delta, roots);
criterion_main!(benches);

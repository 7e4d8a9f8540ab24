//! Ledger cold start at scale: how long opening a store with N roots takes
//! with the `load` policy (persisted ledger + root-count check) and with
//! `rebuild` (list and decode every root). N = 100,000 by default
//! (`DELTAPACK_BENCH_ROOTS` overrides; `.ci/smoke` runs a small N).
//! Prints one JSON line per policy; not a timed assertion.

use std::time::Instant;

use deltapack::format::root::{self, RootMeta};
use deltapack::format::synth::{self, Preset};
use deltapack::format::{CacheIdentity, ContextDigest};
use deltapack::store::{keys, ColdStart, Store, StoreConfig};

fn main() {
    let n: usize = std::env::var("DELTAPACK_BENCH_ROOTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tmp");
    let id = CacheIdentity::example();
    let ns = id.namespace();
    // One small snapshot payload shared by every root (one object), and N
    // valid v2 roots naming it under distinct contexts.
    let snap = synth::snapshot(Preset::Tiny, 1, 1024).expect("synth");
    let x = root::v2_extents(snap.encoded(), 1 << 20, None).expect("extents");
    let object = &x.entries[0];
    let opath = dir
        .path()
        .join(keys::object_key(&object.object_digest()).as_ref());
    std::fs::create_dir_all(opath.parent().expect("parent")).expect("mkdir");
    std::fs::write(&opath, snap.encoded()).expect("object");
    let t = Instant::now();
    for i in 0..n {
        let mut c = [0u8; 32];
        c[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let ctx = ContextDigest(*blake3::hash(&c).as_bytes());
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
        let p = dir.path().join(keys::root_key(&ns, &ctx).as_ref());
        if i == 0 {
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        }
        std::fs::write(p, bytes).expect("root");
    }
    eprintln!("wrote {n} roots in {:.1} s", t.elapsed().as_secs_f64());
    let url = format!("file://{}", dir.path().display());
    for policy in [ColdStart::Rebuild, ColdStart::Load, ColdStart::Load] {
        let t = Instant::now();
        let store =
            Store::open(&url, StoreConfig::default().with_cold_start(policy)).expect("open");
        let totals = rt.block_on(store.ledger_totals()).expect("ledger");
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(totals.roots as usize, n);
        println!("{{\"bench\":\"ledger_open\",\"roots\":{n},\"policy\":\"{policy:?}\",\"seconds\":{secs:.3}}}");
    }
}

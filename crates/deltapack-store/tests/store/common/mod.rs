//! Shared helpers for the integration tests: real backends, synthetic
//! conversations, and an instrumented `ObjectStore` wrapper.

pub(crate) mod faults;
pub(crate) mod instrumented;
pub(crate) mod pg;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use object_store::path::Path;

use deltapack_format::synth::{self, Preset};
use deltapack_format::{CacheIdentity, ContextDigest, ContextHasher, Snapshot};
use deltapack_store::{
    keys, open_backend, Backend, BaseInput, PublishReceipt, PublishRequest, RootFormat, RootStatus,
    Store, StoreConfig,
};

/// The repository's top folder (where `fixtures/` and `tests/tools/` live).
pub(crate) fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Set in a child test process started by [`in_own_process`].
const ISOLATED: &str = "DELTAPACK_TEST_ISOLATED";

/// Runs the calling test again, alone, in a child process of this test
/// binary, so that process-wide measurements (peak RSS) see only its own
/// work and not the other tests running beside it in this binary.
///
/// `test` is the test's path as the harness names it
/// (`"hostile_input::envelope_length_fields_are_bounded_before_use"`).
/// Returns `true` in the child, which then runs the test's body; in the
/// parent it waits for the child, asserts that exactly that one test ran and
/// passed, and returns `false` (the caller returns).
pub(crate) fn in_own_process(test: &str) -> bool {
    if std::env::var_os(ISOLATED).is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(ISOLATED, "1")
        .output()
        .expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{test}, run in its own process, did not pass alone:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

/// SplitMix64's increment: the `n`th value of a stream seeded with `seed`
/// is [`mix64`]`(seed + n * GOLDEN_GAMMA)`.
pub(crate) const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output function: a well-mixed `u64` from any `u64` (`z`
/// derived from a seed and a counter gives reproducible test randomness).
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seeded SplitMix64 stream: test randomness that a seed reproduces.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next value.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        mix64(self.0)
    }

    /// A value in `0..n` (`0` for `n = 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        (self.next() as f64 / u64::MAX as f64) < p
    }

    /// A value between `lo` and `hi`.
    pub(crate) fn fraction(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() as f64 / u64::MAX as f64)
    }
}

/// The object keys `c`'s root (in `id`'s namespace) lists.
pub(crate) async fn object_keys(s: &Store, id: &CacheIdentity, c: &ContextDigest) -> Vec<Path> {
    let RootStatus::Found(r) = s.read_root(&id.namespace(), c).await.expect("read") else {
        panic!("root")
    };
    r.summary()
        .expect("summary")
        .objects
        .iter()
        .map(|(d, _)| keys::object_key(d))
        .collect()
}

/// A count of calls (or held things) in flight, and the most there have
/// been at once: what a test layer measures to check a concurrency bound.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl InFlight {
    /// One more in flight; the most at once rises to the new count.
    pub(crate) fn enter(&self) {
        self.enter_recording(true);
    }

    /// One more in flight; the most at once rises to the new count only if
    /// `record` (when the bound under test covers some calls only, but
    /// counts all of them).
    pub(crate) fn enter_recording(&self, record: bool) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        if record {
            self.max.fetch_max(n, Ordering::SeqCst);
        }
    }

    /// One fewer in flight.
    pub(crate) fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    /// The most in flight at once so far.
    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    /// Forgets the most at once (measures from now on).
    pub(crate) fn reset_max(&self) {
        self.max.store(0, Ordering::SeqCst);
    }
}

/// Extent size used by tests: small, so tiny snapshots span several extents.
pub(crate) const TEST_EXTENT: u64 = 4096;

/// A store under test plus what is needed to tamper with it.
pub(crate) struct TestStore {
    /// Human name of the backend.
    pub(crate) name: &'static str,
    /// The store.
    pub(crate) store: Store,
    /// Keeps a temp dir alive for local stores.
    pub(crate) _dir: Option<tempfile::TempDir>,
}

/// The S3 endpoint of the test server, if configured. In CI (`CI=true`) a
/// missing server is a failure, not a skip.
pub(crate) fn s3_endpoint() -> Option<String> {
    match std::env::var("DELTAPACK_TEST_S3_ENDPOINT") {
        Ok(e) if !e.is_empty() => {
            if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
                std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
                std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
            }
            if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err()
            {
                std::env::set_var("AWS_REGION", "us-east-1");
            }
            Some(e)
        }
        _ => {
            assert!(
                std::env::var("CI").map(|v| v != "true").unwrap_or(true),
                "CI=true but DELTAPACK_TEST_S3_ENDPOINT is not set: the S3 tests must run in CI (see .ci/run)"
            );
            eprintln!("DELTAPACK_TEST_S3_ENDPOINT not set: skipping the S3 backend (run `bash .ci/run` for the full suite)");
            None
        }
    }
}

/// Bucket used by the S3 tests.
pub(crate) fn s3_bucket() -> String {
    std::env::var("DELTAPACK_TEST_S3_BUCKET").unwrap_or_else(|_| "deltapack-test".into())
}

pub(crate) fn unique() -> String {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}-{}-{}",
        std::process::id(),
        t,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The URL of a fresh, empty PostgreSQL ledger (its own schema in the test
/// database `.ci/run` starts), if `DELTAPACK_TEST_POSTGRES` is set. In CI a
/// missing server is a failure, not a skip.
pub(crate) fn postgres_ledger_url() -> Option<String> {
    pg::fresh_schema(&format!("t_{}", unique().replace('-', "_")))
}

/// The URL of a fresh, empty S3 prefix, if the server is configured.
pub(crate) fn s3_url() -> Option<String> {
    let ep = s3_endpoint()?;
    Some(format!("s3://{}/t-{}?endpoint={ep}", s3_bucket(), unique()))
}

/// Test config: small extents.
pub(crate) fn config() -> StoreConfig {
    StoreConfig::default().with_max_extent_bytes(TEST_EXTENT)
}

/// A fresh memory store.
pub(crate) fn memory(config: StoreConfig) -> TestStore {
    TestStore {
        name: "memory",
        store: Store::open("memory://", config).expect("memory store"),
        _dir: None,
    }
}

/// A fresh local-disk store in a temp dir.
pub(crate) fn local(config: StoreConfig) -> TestStore {
    let dir = tempfile::tempdir().expect("tempdir");
    let store =
        Store::open(&format!("file://{}", dir.path().display()), config).expect("local store");
    TestStore {
        name: "local",
        store,
        _dir: Some(dir),
    }
}

/// A fresh S3 prefix, if configured.
pub(crate) fn s3(config: StoreConfig) -> Option<TestStore> {
    let url = s3_url()?;
    Some(TestStore {
        name: "s3",
        store: Store::open(&url, config).expect("s3 store"),
        _dir: None,
    })
}

/// A kind of scratch backend a test suite runs on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scratch {
    /// `memory://`.
    Memory,
    /// A `file://` store in a temp dir (fsync on).
    Local,
    /// A fresh prefix on the S3 test server.
    S3,
}

impl Scratch {
    /// A fresh store of this kind with `config` (`None` for S3 without the
    /// test server).
    pub(crate) fn store(self, config: StoreConfig) -> Option<TestStore> {
        match self {
            Scratch::Memory => Some(memory(config)),
            Scratch::Local => Some(local(config)),
            Scratch::S3 => s3(config),
        }
    }

    /// The raw backend of a fresh store of this kind, and the temp dir a
    /// local one lives in (`None` for S3 without the test server).
    pub(crate) fn backend(self) -> Option<(Backend, Option<tempfile::TempDir>)> {
        match self {
            Scratch::Memory => Some((raw_backend("memory://"), None)),
            Scratch::Local => {
                let dir = tempfile::tempdir().expect("tmp");
                let url = format!("file://{}", dir.path().display());
                Some((raw_backend(&url), Some(dir)))
            }
            Scratch::S3 => s3_url().map(|u| (raw_backend(&u), None)),
        }
    }
}

/// A handle on `store` (typically an in-memory store under a test layer)
/// that the store treats as remote-like memory (`BackendKind::Memory`).
pub(crate) fn memory_kind(store: Arc<dyn object_store::ObjectStore>, config: StoreConfig) -> Store {
    wrapped(
        Backend {
            store,
            kind: deltapack_store::BackendKind::Memory,
        },
        config,
    )
}

/// Wraps an arbitrary backend (e.g. an instrumented one).
pub(crate) fn wrapped(backend: Backend, config: StoreConfig) -> Store {
    Store::from_backend(backend, config).expect("store")
}

/// A handle on `raw`'s bucket through `layer` (a wrapper of `raw.store`),
/// keeping `raw`'s kind.
pub(crate) fn through(
    raw: &Backend,
    layer: Arc<dyn object_store::ObjectStore>,
    config: StoreConfig,
) -> Store {
    wrapped(
        Backend {
            store: layer,
            kind: raw.kind.clone(),
        },
        config,
    )
}

/// `s`'s ledger, as kept so far, equals one rebuilt from the store (else the
/// test fails, naming `what`); its image.
pub(crate) async fn assert_ledger_equals_rebuild(
    s: &Store,
    what: &str,
) -> deltapack_store::LedgerImage {
    let kept = s.ledger_image().await.expect("image");
    s.rebuild_ledger().await.expect("rebuild");
    assert_eq!(s.ledger_image().await.expect("image"), kept, "{what}");
    kept
}

/// `reader` restores `c` to exactly `snap` (else the test fails with
/// `lost`), and the two handles of `pair` hold the same ledger image (else
/// `differ`).
pub(crate) async fn assert_kept(
    reader: &Store,
    (id, c): (&CacheIdentity, ContextDigest),
    snap: &Snapshot,
    lost: &str,
    pair: [&Store; 2],
    differ: &str,
) {
    assert_eq!(restore_bytes(reader, id, c).await, snap.encoded(), "{lost}");
    assert_eq!(
        pair[0].ledger_image().await.expect("image"),
        pair[1].ledger_image().await.expect("image"),
        "{differ}"
    );
}

/// A handle on `raw` through a fault wrapper (no faults planned yet), and
/// the wrapper, whose plan the test sets when the moment comes.
pub(crate) fn faulty_handle(
    raw: &Backend,
    config: StoreConfig,
) -> (Arc<faults::FaultyStore>, Store) {
    let faulty = Arc::new(faults::Faulty::new(
        raw.store.clone(),
        faults::FaultPlan::default(),
    ));
    let s = through(raw, faulty.clone(), config);
    (faulty, s)
}

/// Opens the raw backend behind a URL.
pub(crate) fn raw_backend(url: &str) -> Backend {
    open_backend(url).expect("backend")
}

/// The test identity (salt distinguishes test namespaces).
pub(crate) fn identity(salt: &str) -> CacheIdentity {
    let mut id = CacheIdentity::example();
    id.salt = salt.into();
    id
}

/// A synthetic conversation turn.
pub(crate) fn turn(seed: u64, tokens: u64) -> Arc<Snapshot> {
    Arc::new(synth::snapshot(Preset::Tiny, seed, tokens).expect("synth"))
}

/// The snapshot digest a v2 publication of `s` records (the layered
/// digest of a v2.2 root).
pub(crate) fn v2_digest(s: &Snapshot) -> deltapack_format::Digest {
    deltapack_format::layer_digest::of_snapshot(s)
        .expect("layered digest")
        .snapshot
}

/// Context digest of the synthetic conversation `seed` at `tokens`.
pub(crate) fn ctx(id: &CacheIdentity, seed: u64, tokens: usize) -> ContextDigest {
    ContextHasher::new(id.namespace(), id.chunk_tokens)
        .expect("hasher")
        .digest(&synth::tokens(seed, tokens))
}

/// A request to publish `snap` flat (no base) under `ctx`.
pub(crate) fn flat(
    id: &CacheIdentity,
    ctx: ContextDigest,
    snap: &Arc<Snapshot>,
    format: RootFormat,
) -> PublishRequest {
    PublishRequest {
        identity: id.clone(),
        context: ctx,
        snapshot: snap.clone(),
        base: None,
        format,
    }
}

/// Publishes a flat snapshot.
pub(crate) async fn publish_base(
    store: &Store,
    id: &CacheIdentity,
    ctx: ContextDigest,
    snap: Arc<Snapshot>,
    format: RootFormat,
) -> PublishReceipt {
    store
        .publish(flat(id, ctx, &snap, format))
        .await
        .expect("publish base")
}

/// Publishes the synthetic conversation `seed` at `tokens` ([`turn`],
/// under [`ctx`]) flat; its context.
pub(crate) async fn publish_seed(
    store: &Store,
    id: &CacheIdentity,
    seed: u64,
    tokens: u64,
    format: RootFormat,
) -> ContextDigest {
    let c = ctx(id, seed, tokens as usize);
    publish_base(store, id, c, turn(seed, tokens), format).await;
    c
}

/// A request to publish `snap` as a delta on `base` (published under
/// `base_ctx`).
pub(crate) fn delta(
    id: &CacheIdentity,
    ctx: ContextDigest,
    snap: &Arc<Snapshot>,
    base_ctx: ContextDigest,
    base: &Arc<Snapshot>,
    format: RootFormat,
) -> PublishRequest {
    PublishRequest {
        base: Some(BaseInput {
            context: base_ctx,
            snapshot: base.clone(),
        }),
        ..flat(id, ctx, snap, format)
    }
}

/// Publishes a delta.
pub(crate) async fn publish_delta(
    store: &Store,
    id: &CacheIdentity,
    ctx: ContextDigest,
    snap: Arc<Snapshot>,
    base_ctx: ContextDigest,
    base: Arc<Snapshot>,
    format: RootFormat,
) -> PublishReceipt {
    store
        .publish(delta(id, ctx, &snap, base_ctx, &base, format))
        .await
        .expect("publish delta")
}

/// Restores and returns the bytes, panicking on a miss.
pub(crate) async fn restore_bytes(
    store: &Store,
    id: &CacheIdentity,
    ctx: ContextDigest,
) -> Vec<u8> {
    match store
        .restore((id, ctx), Default::default())
        .await
        .expect("restore")
    {
        deltapack_store::RestoreOutcome::Hit(r) => r.snapshot.encoded().to_vec(),
        deltapack_store::RestoreOutcome::Miss(m) => panic!("expected a hit, got miss {m}"),
    }
}

/// Each `(context, snapshot)` of `turns` restores from `store` to exactly
/// its snapshot (else the test fails, naming `what` and the turn).
pub(crate) async fn assert_restores(
    store: &Store,
    id: &CacheIdentity,
    turns: &[(ContextDigest, Arc<Snapshot>)],
    what: &str,
) {
    for (k, (c, snap)) in turns.iter().enumerate() {
        assert_eq!(
            restore_bytes(store, id, *c).await,
            snap.encoded(),
            "{what}: turn {k}"
        );
    }
}

/// `restore_into` of `key` into `buf` is a hit that leaves exactly `want`
/// there (else the test fails, naming `what`).
pub(crate) async fn assert_restored_into(
    store: &Store,
    key: (&CacheIdentity, ContextDigest),
    buf: &mut [u8],
    want: &[u8],
    what: &str,
) {
    let out = store
        .restore_into(key, buf, Default::default())
        .await
        .expect("restore_into");
    assert!(
        matches!(out, deltapack_store::RestoreIntoOutcome::Hit { .. }),
        "{what}: {out:?}"
    );
    assert_eq!(buf, want, "{what}: the buffer restored into");
}

/// A root envelope around `body`, built by hand from the documented layout
/// (not by the code under test): magic, version 1, flags 0, body_len,
/// BLAKE3 of the body, the body.
pub(crate) fn forge(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(52 + body.len());
    out.extend_from_slice(b"DPKROOT\0");
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(body).as_bytes());
    out.extend_from_slice(body);
    out
}

/// The bytes stored under `key` (the test fails if they cannot be read).
pub(crate) async fn stored(
    os: &dyn object_store::ObjectStore,
    key: &object_store::path::Path,
) -> bytes::Bytes {
    object_store::ObjectStoreExt::get(os, key)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes")
}

/// A sweep with the default options (it repairs what it proves damaged).
pub(crate) async fn sweep(s: &Store) -> deltapack_store::SweepReport {
    s.sweep(&deltapack_store::SweepOptions::default())
        .await
        .expect("sweep")
}

/// A dry-run sweep with an hour's grace: what it finds, nothing changed.
pub(crate) async fn dry_sweep(s: &Store) -> deltapack_store::SweepReport {
    s.sweep(
        &deltapack_store::SweepOptions::default()
            .with_grace(std::time::Duration::from_secs(3600))
            .with_dry_run(true),
    )
    .await
    .expect("sweep")
}

/// Every file below `dir`, in no particular order (none if `dir` does not
/// exist).
pub(crate) fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The sweep found nothing missing and nothing corrupt (else the test
/// fails, naming `what` and showing the report).
pub(crate) fn assert_no_damage(report: &deltapack_store::SweepReport, what: &str) {
    assert!(
        report.missing.is_empty() && report.corrupt.is_empty(),
        "{what}: {report:?}"
    );
}

/// The sweep found nothing missing, nothing corrupt and no unusable root
/// (each asserted on its own, showing what it found).
pub(crate) fn assert_nothing_lost(report: &deltapack_store::SweepReport) {
    assert!(report.missing.is_empty(), "missing: {:?}", report.missing);
    assert!(report.corrupt.is_empty(), "corrupt: {:?}", report.corrupt);
    assert!(
        report.unusable_roots.is_empty(),
        "unusable: {:?}",
        report.unusable_roots
    );
}

/// Copies a directory tree (e.g. a fixture store into a temp dir).
pub(crate) fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let dest = to.join(e.file_name());
        if e.path().is_dir() {
            std::fs::create_dir_all(&dest).expect("mkdir");
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).expect("copy");
        }
    }
}

/// The peak of [`listed_bytes`] while publications race for a budget,
/// sampled every `every` until [`PeakBytes::stop`].
pub(crate) struct PeakBytes {
    done: Arc<std::sync::atomic::AtomicBool>,
    sampler: tokio::task::JoinHandle<u64>,
    store: Store,
}

impl PeakBytes {
    /// Starts sampling `store`'s listed bytes every `every`.
    pub(crate) fn sample(store: &Store, every: std::time::Duration) -> Self {
        use std::sync::atomic::AtomicBool;
        let done = Arc::new(AtomicBool::new(false));
        let (s, d) = (store.clone(), done.clone());
        let sampler = tokio::spawn(async move {
            let mut peak = 0;
            while !d.load(Ordering::SeqCst) {
                peak = peak.max(listed_bytes(&s).await);
                tokio::time::sleep(every).await;
            }
            peak
        });
        PeakBytes {
            done,
            sampler,
            store: store.clone(),
        }
    }

    /// The peak, the bytes listed now included.
    pub(crate) async fn stop(self) -> u64 {
        self.done.store(true, Ordering::SeqCst);
        let peak = self.sampler.await.expect("sampler");
        peak.max(listed_bytes(&self.store).await)
    }
}

/// Awaits racing publications: each is created or refused for capacity
/// (anything else fails the test); returns how many were created.
pub(crate) async fn created_or_refused(
    tasks: Vec<tokio::task::JoinHandle<deltapack_store::Result<deltapack_store::PublishReceipt>>>,
) -> usize {
    let mut created = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(r) => {
                assert_eq!(r.outcome, deltapack_store::PublishOutcome::Created);
                created += 1;
            }
            Err(deltapack_store::StoreError::Capacity(_)) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    created
}

/// Bytes of every object and root under a store's prefix, from its listing
/// (what the bucket really holds, whatever the ledger says).
pub(crate) async fn listed_bytes(s: &Store) -> u64 {
    use futures::TryStreamExt;
    let mut total = 0;
    for prefix in ["objects", "roots"] {
        let p = object_store::path::Path::from(prefix);
        let metas: Vec<object_store::ObjectMeta> = s
            .object_store()
            .list(Some(&p))
            .try_collect()
            .await
            .unwrap_or_default();
        total += metas.iter().map(|m| m.size).sum::<u64>();
    }
    total
}

/// `pg_ctl stop -m MODE` or `start` (with its log in `../LOG` beside the
/// data directory) on the test cluster in `data`, as the `postgres` user
/// (`DELTAPACK_TEST_PG_BIN` names the server's binaries).
pub(crate) fn pg_ctl(data: &str, action: &str, stop_mode: &str, log: &str) {
    let bin = std::env::var("DELTAPACK_TEST_PG_BIN").expect("DELTAPACK_TEST_PG_BIN is needed");
    let ctl = format!("{bin}/pg_ctl");
    let log = format!("{data}/../{log}");
    let mut args = vec!["-u", "postgres", "--", &ctl, "-D", data, "-w"];
    match action {
        "stop" => args.extend(["-m", stop_mode, "stop"]),
        _ => args.extend(["-l", &log, "start"]),
    }
    let out = std::process::Command::new("runuser")
        .args(&args)
        .output()
        .expect("run pg_ctl");
    assert!(
        out.status.success(),
        "pg_ctl {action}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

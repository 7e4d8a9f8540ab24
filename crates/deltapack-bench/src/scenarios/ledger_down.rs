//! `deltapack-bench ledger-down`: lookup and restore with the capacity
//! ledger up and down, on the S3-like emulation (a fixed latency per
//! request), measured in request rounds.
//!
//! A conversation (tiny preset) is stored at half of a long request (by
//! default a 131,072-token root for a 262,144-token request: 1,024
//! candidate boundaries, the hit 512 candidates down from the longest).
//! Then, in one process, with medians of `--repeats`:
//!
//! * lookup with the ledger up: local disk (no latency) and S3-like — one
//!   ledger query and one HEAD;
//! * lookup with the ledger down (its SQLite file replaced by garbage, so it
//!   cannot be opened): the store is probed by name, 64 HEADs in flight —
//!   for the stored prefix, and for a request none of whose boundaries is
//!   stored (the worst case: every candidate probed);
//! * restore of the stored root with the ledger up and down;
//! * lookup and restore with a PostgreSQL ledger that accepts connections
//!   and never answers (the test kit's black hole), and the process's
//!   threads before and after.
//!
//! Rounds = time / latency. Targets (issue "the read path survives the
//! ledger"): lookup with the ledger down ≤ 20 rounds; with it up, p50 ≤ 1 ms
//! locally; restore down ≤ 1.05 × up; (issue "the ledger under faults")
//! restore with the ledger black-holed ≤ 1.05 × up, threads bounded.
//! Results: `results.json` and
//! `results.md` under `--out`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::measure::{median_duration as median, ms};
use anyhow::{bail, Result};
use deltapack_format::synth::{self, Preset};
use deltapack_format::{CacheIdentity, ContextDigest, ContextHasher};
use deltapack_store::{
    LookupSource, PublishRequest, RestoreOutcome, RootFormat, Store, StoreConfig,
};
use serde::Serialize;

use crate::report::markdown_table;

use crate::s3like::throttled_store;

/// Options of `ledger-down`.
#[derive(Debug, clap::Args)]
pub(crate) struct LedgerDownArgs {
    /// Tokens of the request (its candidates are every 256-token boundary);
    /// the stored root covers half of it.
    #[arg(long, default_value_t = 262_144)]
    tokens: u64,
    /// Latency of every request of the S3-like emulation.
    #[arg(long, value_name = "MS", default_value_t = 20)]
    latency_ms: u64,
    /// Samples per measure (the median is reported).
    #[arg(long, default_value_t = 11, value_parser = clap::value_parser!(u32).range(1..=101))]
    repeats: u32,
    /// Directory for results.json and results.md.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "benches/results/ledger-down"
    )]
    out: PathBuf,
}

#[derive(Debug, Serialize)]
struct Row {
    measure: &'static str,
    median_ms: f64,
    rounds: Option<f64>,
    source: Option<&'static str>,
    target: &'static str,
    met: bool,
}

#[derive(Debug, Serialize)]
struct Results {
    request_tokens: u64,
    candidates: usize,
    stored_boundary: u64,
    latency_ms: u64,
    repeats: u32,
    rows: Vec<Row>,
    restore_down_over_up: f64,
    restore_black_holed_over_up: f64,
    threads_before_black_hole: usize,
    threads_after_black_hole: usize,
    stored_bytes: u64,
}

/// Every thread of this process (0 where `/proc` is not there).
fn process_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

async fn lookup_median(
    s: &Store,
    id: &CacheIdentity,
    candidates: &[(u64, ContextDigest)],
    repeats: u32,
    want: Option<u64>,
) -> Result<(Duration, LookupSource)> {
    let mut samples = Vec::new();
    let mut source = LookupSource::Ledger;
    for _ in 0..repeats {
        let t = Instant::now();
        let a = s.lookup_detailed(id, candidates).await?;
        samples.push(t.elapsed());
        if a.found.map(|f| f.0) != want {
            bail!("lookup answered {:?}, expected boundary {want:?}", a.found);
        }
        source = a.source;
    }
    Ok((median(samples), source))
}

async fn restore_median(
    s: &Store,
    id: &CacheIdentity,
    ctx: ContextDigest,
    repeats: u32,
) -> Result<Duration> {
    let mut samples = Vec::new();
    for _ in 0..repeats {
        let t = Instant::now();
        match s.restore((id, ctx), Default::default()).await? {
            RestoreOutcome::Hit(_) => {}
            RestoreOutcome::Miss(m) => bail!("restore missed: {m}"),
        }
        samples.push(t.elapsed());
    }
    Ok(median(samples))
}

fn source_name(s: LookupSource) -> &'static str {
    match s {
        LookupSource::Ledger => "ledger",
        _ => "store",
    }
}

fn config(ledger: &Path) -> StoreConfig {
    StoreConfig::default()
        .with_ledger(Some(format!("sqlite://{}", ledger.display())))
        // A restore of the same root must read it each time.
        .with_base_cache_bytes(0)
}

/// Runs the scenario and writes its results.
pub(crate) async fn run(a: LedgerDownArgs) -> Result<ExitCode> {
    if a.tokens < 1024 || a.tokens % 512 != 0 {
        bail!("--tokens must be a multiple of 512, at least 1,024");
    }
    super::in_work_dir(None, "ledger-down", async |work| measure(&a, work).await).await
}

async fn measure(a: &LedgerDownArgs, work: &Path) -> Result<ExitCode> {
    let store_dir = work.join("store");
    std::fs::create_dir_all(&store_dir)?;
    let good = work.join("ledger.sqlite3");
    let id = CacheIdentity::example();
    let hasher = ContextHasher::new(id.namespace(), id.chunk_tokens)?;
    let seed = 11;
    let stored = a.tokens / 2;
    let request = synth::tokens(seed, a.tokens as usize);
    let candidates = hasher.boundaries(&request);
    let stored_ctx = hasher.digest(&request[..stored as usize]);
    let unknown = hasher.boundaries(&synth::tokens(seed + 1, a.tokens as usize));

    // Publish (no latency), then measure through the S3-like emulation.
    let stored_snapshot = std::sync::Arc::new(synth::snapshot(Preset::Tiny, seed, stored)?);
    let stored_bytes = stored_snapshot.encoded().len() as u64;
    {
        let s = throttled_store(&store_dir, 0, config(&good))?;
        s.publish(PublishRequest {
            identity: id.clone(),
            context: stored_ctx,
            snapshot: stored_snapshot,
            base: None,
            format: RootFormat::V2,
        })
        .await?;
        s.close().await?;
    }
    let lat = a.latency_ms as f64;
    let rounds = |d: Duration| (lat > 0.0).then(|| ms(d) / lat);
    // A row of a measure through the S3-like emulation (its median also in
    // rounds), with the source of a lookup.
    let row = |measure, d, source: Option<LookupSource>, target, met| Row {
        measure,
        median_ms: ms(d),
        rounds: rounds(d),
        source: source.map(source_name),
        target,
        met,
    };
    let mut rows = Vec::new();

    let local = throttled_store(&store_dir, 0, config(&good))?;
    let (d, src) = lookup_median(&local, &id, &candidates, a.repeats, Some(stored)).await?;
    rows.push(Row {
        // No latency, no rounds.
        rounds: None,
        ..row(
            "lookup, ledger up, local (no latency)",
            d,
            Some(src),
            "p50 <= 1 ms",
            d <= Duration::from_millis(1) && src == LookupSource::Ledger,
        )
    });
    let up = throttled_store(&store_dir, a.latency_ms, config(&good))?;
    let (d, src) = lookup_median(&up, &id, &candidates, a.repeats, Some(stored)).await?;
    rows.push(row(
        "lookup, ledger up, S3-like",
        d,
        Some(src),
        "one query + one HEAD",
        src == LookupSource::Ledger,
    ));
    let restore_up = restore_median(&up, &id, stored_ctx, a.repeats).await?;

    // The ledger goes down: a file that is not a database in its place.
    let bad = work.join("down.sqlite3");
    std::fs::write(&bad, vec![0x5a; 8192])?;
    let down = throttled_store(&store_dir, a.latency_ms, config(&bad))?;
    for (measure, asked, want) in [
        (
            "lookup, ledger down, S3-like, stored prefix at half",
            &candidates,
            Some(stored),
        ),
        (
            "lookup, ledger down, S3-like, nothing stored (every candidate)",
            &unknown,
            None,
        ),
    ] {
        let (d, src) = lookup_median(&down, &id, asked, a.repeats, want).await?;
        let met = rounds(d).is_none_or(|r| r <= 20.0) && src == LookupSource::Store;
        rows.push(row(measure, d, Some(src), "<= 20 rounds", met));
    }
    let restore_down = restore_median(&down, &id, stored_ctx, a.repeats).await?;
    let ratio = restore_down.as_secs_f64() / restore_up.as_secs_f64().max(1e-9);
    rows.push(row(
        "restore, ledger up, S3-like",
        restore_up,
        None,
        "reference",
        true,
    ));
    rows.push(row(
        "restore, ledger down, S3-like",
        restore_down,
        None,
        "<= 1.05 x up",
        ratio <= 1.05,
    ));

    // A PostgreSQL ledger that accepts connections and never answers.
    let hole = deltapack_testkit::FaultProxy::black_hole()?;
    let threads_before = process_threads();
    let held_cfg = StoreConfig::default()
        .with_ledger(Some(format!(
            "postgres://deltapack@127.0.0.1:{}/ledger?sslmode=disable&connect_timeout=1",
            hole.port()
        )))
        .with_base_cache_bytes(0);
    let held = throttled_store(&store_dir, a.latency_ms, held_cfg)?;
    let (d, src) = lookup_median(&held, &id, &candidates, a.repeats, Some(stored)).await?;
    let met = rounds(d).is_none_or(|r| r <= 20.0) && src == LookupSource::Store;
    rows.push(row(
        "lookup, ledger black-holed, S3-like, stored prefix at half",
        d,
        Some(src),
        "<= 20 rounds",
        met,
    ));
    let restore_held = restore_median(&held, &id, stored_ctx, a.repeats).await?;
    let held_ratio = restore_held.as_secs_f64() / restore_up.as_secs_f64().max(1e-9);
    rows.push(row(
        "restore, ledger black-holed, S3-like",
        restore_held,
        None,
        "<= 1.05 x up",
        held_ratio <= 1.05,
    ));
    let threads_after = process_threads();
    let results = Results {
        request_tokens: a.tokens,
        candidates: candidates.len(),
        stored_boundary: stored,
        latency_ms: a.latency_ms,
        repeats: a.repeats,
        rows,
        restore_down_over_up: ratio,
        restore_black_holed_over_up: held_ratio,
        threads_before_black_hole: threads_before,
        threads_after_black_hole: threads_after,
        stored_bytes,
    };
    report(&a.out, &results)
}

/// The head of the `results.md` table.
const TABLE_HEAD: &str = "\
| measure | median | rounds | source | target | met |
|---|---:|---:|---|---|---|";

/// Writes `results.json` and `results.md` (and prints the table).
fn report(out: &Path, results: &Results) -> Result<ExitCode> {
    let mut md = format!(
        "# Lookup and restore with the ledger up and down\n\n\
         Request of {} tokens ({} candidate boundaries), stored root at {} tokens, \
         S3-like latency {} ms per request, medians of {}. Rounds = time / latency.\n\n",
        results.request_tokens,
        results.candidates,
        results.stored_boundary,
        results.latency_ms,
        results.repeats
    );
    md.push_str(&markdown_table(TABLE_HEAD, &results.rows, |r| {
        vec![
            r.measure.to_string(),
            format!("{:.1} ms", r.median_ms),
            r.rounds.map_or("–".into(), |x| format!("{x:.1}")),
            r.source.unwrap_or("–").to_string(),
            r.target.to_string(),
            if r.met { "yes" } else { "**no**" }.to_string(),
        ]
    }));
    md.push_str(&format!(
        "\nRestore with the ledger down / up: {:.3}×; black-holed / up: {:.3}× \
         (threads {} before the black-holed ledger, {} after its measures). The restored root is the stored \
         prefix (tiny preset, {} bytes): its cost is request rounds, which is what the \
         ledger could add. \"Ledger down\" is a SQLite ledger file that is not a \
         database (every open fails at once); \"black-holed\" is a PostgreSQL ledger URL \
         whose server accepts connections and never answers (connect_timeout 1 s): a \
         read pays at most the ledger deadline (50 ms) once, and the reads after it skip \
         the ledger for a second. Binary profile: {}.\n",
        results.restore_down_over_up,
        results.restore_black_holed_over_up,
        results.threads_before_black_hole,
        results.threads_after_black_hole,
        results.stored_bytes,
        if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        }
    ));
    super::write_study(out, results, &md)?;
    Ok(ExitCode::SUCCESS)
}

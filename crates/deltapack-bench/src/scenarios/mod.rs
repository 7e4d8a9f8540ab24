//! The measured scenarios and the order they run in.
//!
//! A suite first publishes the workload (the publication suite, timed when
//! `publish` is asked for, otherwise once to create the stores), then runs
//! the restores and read floors in blocks, round-robin (warm; cold; S3-like),
//! then the bandwidth-shaped S3 emulation (restores round-robin, then the
//! shaped publication), the real S3 server (scaled), the zstd study and the
//! chain scenario.
//! Each job runs in a child process ([`crate::runner`]); each job's code is
//! in the submodule of its kind.

pub(crate) mod chain;
pub(crate) mod layers;
pub(crate) mod ledger_down;
pub(crate) mod publish;
pub(crate) mod restore;
pub(crate) mod tiers;
pub(crate) mod turn;
pub(crate) mod zstd;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::args::{BenchArgs, Suite};
use crate::floors::fastest_write_floor;
use crate::job::{Acc, Job, JobOutput, ReadFloor, Source};
use crate::report::{self, machine, mib, Machine, Report};
use crate::runner::{child, pin_exe, round_robin, set_wait_idle};
use crate::shaped::Shaping;
use crate::workload::{s3_child_url, unique, Fmt, Workload};

/// Runs a study (`layers`, `ledger-down`, `tiers`, `turn`) in a fresh work
/// directory named after it under `parent` (default: the temporary
/// directory), removed afterwards whatever the outcome.
pub(crate) async fn in_work_dir<T>(
    parent: Option<&Path>,
    name: &str,
    study: impl AsyncFnOnce(&Path) -> Result<T>,
) -> Result<T> {
    let work = parent
        .map_or_else(std::env::temp_dir, Path::to_path_buf)
        .join(format!(
            "deltapack-{name}-{}-{}",
            std::process::id(),
            unique()
        ));
    std::fs::create_dir_all(&work)?;
    let out = study(&work).await;
    let _ = std::fs::remove_dir_all(&work);
    out
}

/// Writes a study's `results.json` (pretty-printed) and `results.md` into
/// `out`, creating the directory, and prints the markdown.
pub(crate) fn write_study(out: &Path, results: &impl serde::Serialize, md: &str) -> Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(results)?,
    )?;
    std::fs::write(out.join("results.md"), md)?;
    print!("{md}");
    Ok(())
}

/// Runs a suite: the scenarios in a fresh work dir (removed afterwards
/// unless `--keep`), then the report files under `--out` and the report on
/// stdout.
pub(crate) async fn run(suite: Suite, args: BenchArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let extent_bytes = args
        .extent_bytes
        .unwrap_or(deltapack_format::DEFAULT_MAX_EXTENT_BYTES);
    let w = Workload::from_scale(args.scale, extent_bytes)?;
    args.shaped.shaping()?;
    let (s3_url, parent_dir) = match args.store.as_deref() {
        Some(u) if u.starts_with("s3://") => (Some(u.to_string()), std::env::temp_dir()),
        Some(u) if u.starts_with("memory:") => {
            bail!("--store memory:// cannot be shared with child processes; give s3://… or a directory")
        }
        Some(u) => (None, PathBuf::from(u.strip_prefix("file://").unwrap_or(u))),
        None => (
            std::env::var("DELTAPACK_TEST_S3_ENDPOINT")
                .ok()
                .filter(|e| !e.is_empty())
                .map(|ep| {
                    let bucket = std::env::var("DELTAPACK_TEST_S3_BUCKET")
                        .unwrap_or_else(|_| "deltapack-test".into());
                    format!("s3://{bucket}?endpoint={ep}")
                }),
            std::env::temp_dir(),
        ),
    };
    set_wait_idle(args.wait_idle);
    let work = parent_dir.join(format!("deltapack-bench-{}", unique()));
    std::fs::create_dir_all(&work)
        .with_context(|| format!("creating the work dir {}", work.display()))?;
    let mut mach = machine(&work);
    pin_exe(&work)?;
    let outcome = run_suite(suite, &args, w, s3_url.as_deref(), &work, &mut mach).await;
    if args.keep {
        eprintln!("bench: stores kept under {}", work.display());
    } else if let Err(e) = std::fs::remove_dir_all(&work) {
        eprintln!("bench: could not remove {}: {e}", work.display());
    }
    let mut report = outcome?;
    mach.loadavg_end = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string();
    report.machine = mach;
    report.total_s = started.elapsed().as_secs_f64();
    report::write_outputs(&args.out, &report)?;
    if args.json {
        report::print_json(&report)?;
    } else {
        print!("{}", report::markdown(&report));
        println!(
            "\nwritten: {}/results.{{json,md,svg}}, machine.txt{}",
            args.out.display(),
            if report.chain.is_some() {
                ", chain.svg"
            } else {
                ""
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The restore blocks, round-robin within each: warm, cold, S3-like.
fn restore_blocks(w: Workload, work: &Path, latency_ms: u64) -> Vec<Vec<(String, Job)>> {
    let (store_v2, store_v1) = (work.join("store-v2"), work.join("store-v1"));
    let floor = |floor, cold| Job::ReadFloor {
        w,
        store_v2: store_v2.clone(),
        floor,
        cold,
    };
    let restore = |format, source, into| Job::Restore {
        w,
        format,
        source,
        into,
    };
    let warm = |dir: &PathBuf| Source::Warm { dir: dir.clone() };
    let cold = |dir: &PathBuf| Source::Cold { dir: dir.clone() };
    let s3like = |dir: &PathBuf| Source::Throttled {
        dir: dir.clone(),
        latency_ms,
    };
    let blocks = vec![
        vec![
            ("floor-raw-warm", floor(ReadFloor::Raw, false)),
            ("floor-spec-warm", floor(ReadFloor::Spec, false)),
            (
                "floor-spec-touched-warm",
                floor(ReadFloor::SpecTouched, false),
            ),
            ("restore-v2-warm", restore(Fmt::V2, warm(&store_v2), false)),
            (
                "restore-v2-warm-into",
                restore(Fmt::V2, warm(&store_v2), true),
            ),
            ("restore-v1-warm", restore(Fmt::V1, warm(&store_v1), false)),
        ],
        vec![
            ("floor-raw-cold", floor(ReadFloor::Raw, true)),
            ("floor-spec-cold", floor(ReadFloor::Spec, true)),
            ("restore-v2-cold", restore(Fmt::V2, cold(&store_v2), false)),
            ("restore-v1-cold", restore(Fmt::V1, cold(&store_v1), false)),
        ],
        vec![
            (
                "restore-v2-s3like",
                restore(Fmt::V2, s3like(&store_v2), false),
            ),
            (
                "restore-v2-s3like-into",
                restore(Fmt::V2, s3like(&store_v2), true),
            ),
            (
                "restore-v1-s3like",
                restore(Fmt::V1, s3like(&store_v1), false),
            ),
        ],
    ];
    blocks
        .into_iter()
        .map(|b| {
            b.into_iter()
                .map(|(id, job)| (id.to_string(), job))
                .collect()
        })
        .collect()
}

/// The shaped restores, round-robin: v2 and v1 through the shaped
/// emulation, and (`with_reference`) the unshaped S3-like v2 restore of the
/// same files, the CPU's headroom over A.
fn shaped_blocks(
    w: Workload,
    work: &Path,
    shaping: Shaping,
    latency_ms: u64,
    with_reference: bool,
) -> Vec<Vec<(String, Job)>> {
    let restore = |format, dir: PathBuf| Job::Restore {
        w,
        format,
        source: Source::Shaped { dir, shaping },
        into: false,
    };
    let mut block = vec![
        (
            "restore-v2-shaped".to_string(),
            restore(Fmt::V2, work.join("store-v2")),
        ),
        (
            "restore-v1-shaped".to_string(),
            restore(Fmt::V1, work.join("store-v1")),
        ),
    ];
    if with_reference {
        block.push((
            "restore-v2-s3like".to_string(),
            Job::Restore {
                w,
                format: Fmt::V2,
                source: Source::Throttled {
                    dir: work.join("store-v2"),
                    latency_ms,
                },
                into: false,
            },
        ));
    }
    vec![block]
}

/// Publication and restores on a real S3-compatible server at `--s3-scale`;
/// the objects are deleted afterwards. Returns the report's `s3` figures.
async fn real_s3(
    args: &BenchArgs,
    w: Workload,
    url: &str,
    accs: &mut BTreeMap<String, Acc>,
) -> Result<serde_json::Value> {
    let repeats = args.repeats;
    let s3_scale = args.s3_scale.unwrap_or(args.scale.min(1.0 / 16.0));
    let ws = Workload::from_scale(s3_scale, w.extent_bytes)?;
    let leaf = format!("bench-{}", unique());
    let (u2, u1) = (
        s3_child_url(url, &format!("{leaf}-v2")),
        s3_child_url(url, &format!("{leaf}-v1")),
    );
    let r = async {
        let o = child(
            &Job::S3Publish {
                w: ws,
                url_v2: u2.clone(),
                url_v1: u1.clone(),
            },
            "s3: publish v2 + v1 (scaled)",
        )
        .await?;
        let mut p = Acc::default();
        p.add(o);
        let job = |format, u: &String| Job::Restore {
            w: ws,
            format,
            source: Source::S3 { url: u.clone() },
            into: false,
        };
        let block = vec![
            ("restore-v2-s3".to_string(), job(Fmt::V2, &u2)),
            ("restore-v1-s3".to_string(), job(Fmt::V1, &u1)),
        ];
        round_robin(&[block], repeats, accs).await?;
        Ok::<_, anyhow::Error>(p)
    }
    .await;
    let cleanup = child(
        &Job::S3Cleanup {
            urls: vec![u2.clone(), u1.clone()],
        },
        "s3: cleanup",
    )
    .await;
    let p = r?;
    cleanup?;
    Ok(serde_json::json!({
        "url": url,
        "scale": s3_scale,
        "result_tokens": ws.result_tokens,
        "payload_bytes": p.info.get("payload_bytes"),
        "publish_v2_ms": p.info.get("v2_ms"),
        "publish_v1_ms": p.info.get("v1_ms"),
        "v2_objects": p.info.get("v2_objects"),
        "v1_objects": p.info.get("v1_objects"),
    }))
}

/// Publication and the durable write floor, interleaved per round in one
/// child; keeps the v2 and v1 stores the restores read.
async fn publish_stores(w: Workload, work: &Path, rounds: u32) -> Result<JobOutput> {
    child(
        &Job::PublishSuite {
            w,
            keep_v2: work.join("store-v2"),
            keep_v1: work.join("store-v1"),
            scratch: work.join("scratch"),
            rounds,
        },
        "publish v2, v1 + durable write floor",
    )
    .await
}

/// The shaped-S3 restores (round-robin) and publication.
async fn shaped_suite(
    w: Workload,
    work: &Path,
    args: &BenchArgs,
    with_reference: bool,
    accs: &mut BTreeMap<String, Acc>,
) -> Result<()> {
    let shaping = args.shaped.shaping()?;
    eprintln!("bench: shaped S3 emulation: {}", shaping.describe());
    round_robin(
        &shaped_blocks(w, work, shaping, args.latency_ms, with_reference),
        args.repeats,
        accs,
    )
    .await?;
    let o = child(
        &Job::ShapedPublish {
            w,
            shaping,
            rounds: args.repeats,
        },
        "publish v2: in-memory unshaped + shaped",
    )
    .await?;
    Acc::add_sub(accs, o.sub);
    Ok(())
}

/// Records the write floor as the fastest of one and two streams, buffered
/// or direct (by median), under `floor-write`.
fn record_write_floor(accs: &mut BTreeMap<String, Acc>) {
    if let Some((_, best, medians)) =
        fastest_write_floor(&*accs, "floor-write", &["1", "2", "1-direct", "2-direct"])
    {
        let mut f = Acc {
            times: best.times.clone(),
            peak: best.peak,
            baseline: best.baseline,
            info: best.info.clone(),
            infos: Vec::new(),
        };
        f.info.extend(medians);
        f.infos = vec![f.info.clone()];
        accs.insert("floor-write".into(), f);
    }
}

/// zstd per extent of the v2 store (ratio and speed per level); adds
/// BLAKE3's one-core speed on this data to the machine's description.
async fn zstd_per_extent(
    w: Workload,
    work: &Path,
    repeats: u32,
    mach: &mut Machine,
) -> Result<Vec<crate::report::ZstdRow>> {
    let mut zstd = Vec::new();
    let o = child(
        &Job::Zstd {
            w,
            store_v2: work.join("store-v2"),
            repeats,
        },
        "zstd per extent",
    )
    .await?;
    if let Some(rows) = o.info.get("rows") {
        zstd = serde_json::from_value(rows.clone()).context("zstd rows")?;
    }
    mach.filesystem.push_str(&format!(
        "; BLAKE3 one core on this data: {:.0} MB/s",
        o.num("blake3_mb_s_1_core").unwrap_or(0.0)
    ));
    Ok(zstd)
}

async fn run_suite(
    suite: Suite,
    args: &BenchArgs,
    w: Workload,
    s3_url: Option<&str>,
    work: &Path,
    mach: &mut Machine,
) -> Result<Report> {
    let do_publish = matches!(suite, Suite::Publish | Suite::All);
    let do_restore = matches!(suite, Suite::Restore | Suite::All);
    let do_chain = matches!(suite, Suite::Chain | Suite::All);
    let do_shaped = matches!(suite, Suite::Shaped | Suite::All);
    let shaping = args.shaped.shaping()?;
    let repeats = args.repeats;
    eprintln!(
        "bench: {:?} at scale {} — base {} tokens, result {} tokens, extents {}, {repeats} repetition(s); work dir {}",
        suite,
        args.scale,
        w.base_tokens,
        w.result_tokens,
        mib(w.extent_bytes),
        work.display()
    );

    let mut accs: BTreeMap<String, Acc> = BTreeMap::new();
    // Publication and the durable write floor, interleaved per round in one
    // child (timed when publishing; a single round to create the stores
    // otherwise).
    let o = if do_publish || do_restore || do_shaped {
        publish_stores(w, work, if do_publish { repeats } else { 1 }).await?
    } else {
        JobOutput::default()
    };
    let get = |k: &str| o.info.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let (base_bytes, result_bytes) = (get("base_bytes"), get("result_bytes"));
    Acc::add_sub(&mut accs, o.sub);
    record_write_floor(&mut accs);
    let pinfo = |id: &str, k: &str| {
        accs.get(id)
            .and_then(|a| a.info.get(k))
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
    };
    let payload_bytes = pinfo("publish-v2", "payload_bytes");
    let v2_extents = pinfo("publish-v2", "objects");
    let v1_chunks = pinfo("publish-v1", "objects");

    if do_restore {
        round_robin(
            &restore_blocks(w, work, args.latency_ms),
            repeats,
            &mut accs,
        )
        .await?;
    }

    // The bandwidth-shaped S3 emulation.
    if do_shaped {
        shaped_suite(w, work, args, !do_restore, &mut accs).await?;
    }

    // The real S3-compatible server, scaled.
    let mut s3_info = None;
    if let (true, Some(url)) = (do_restore || do_publish, s3_url) {
        s3_info = Some(real_s3(args, w, url, &mut accs).await?);
    }

    let zstd = if suite == Suite::All {
        zstd_per_extent(w, work, repeats, mach).await?
    } else {
        Vec::new()
    };

    // Restore cost against the number of turns (own stores and floors).
    let mut chain_accs: BTreeMap<String, Acc> = BTreeMap::new();
    let chain = if do_chain {
        Some(chain::run(args, w, work, &mut chain_accs).await?)
    } else {
        None
    };

    let mut report = Report {
        deltapack_version: env!("CARGO_PKG_VERSION"),
        suite: format!("{suite:?}").to_lowercase(),
        scale: args.scale,
        base_tokens: w.base_tokens,
        result_tokens: w.result_tokens,
        base_bytes,
        result_bytes,
        payload_bytes,
        extent_bytes: w.extent_bytes,
        v2_extents,
        v1_chunks,
        repeats,
        latency_ms: args.latency_ms,
        shaped: do_shaped.then_some(shaping),
        s3: s3_info,
        machine: mach.clone(),
        scenarios: Vec::new(),
        targets: Vec::new(),
        zstd,
        chain,
        total_s: 0.0,
    };
    report.scenarios = report::scenarios(&report, &accs, do_publish, args.latency_ms);
    report.targets = report::targets(&report);
    if let Some(c) = &report.chain {
        let rows = report::chain::scenarios(c, &chain_accs);
        report.scenarios.extend(rows);
        report.targets.extend(report::chain::targets(c));
    }
    Ok(report)
}

//! `deltapack demo`: the main job end to end on the embedded default store.
//!
//! A synthetic multi-turn conversation (one seed, so every turn extends the
//! previous one) is published turn by turn: turn 1 as a base snapshot, every
//! later turn as a `page-tail-cow-v1` delta against the previous turn — once
//! as v2 roots (ordered extents) and once as legacy v1 roots (one object per
//! 256-token logical chunk) under a second identity (`salt = "demo-v1"`, so a
//! different namespace). The final turn is then restored from both and
//! compared with the synthesized snapshot byte for byte. Re-running on an
//! existing store is idempotent: publications report already-present and the
//! restores are verified again.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use deltapack_format::synth;
use deltapack_format::{CacheIdentity, ContextDigest, ContextHasher, Namespace, Snapshot};
use deltapack_store::{
    BackendKind, BaseInput, PublishOutcome, PublishRequest, RestoreOptions, RestoreOutcome,
    RootFormat, RootStatus, Store,
};
use serde::Serialize;

use crate::common;
use crate::synth::PresetArg;

/// The embedded default store of the demo.

#[derive(Debug, clap::Args)]
#[command(mut_arg("store", |a| a.required(false).default_value(common::DEMO_STORE)))]
pub(crate) struct DemoArgs {
    #[command(flatten)]
    store: crate::settings::StoreArgs,
    /// Model geometry.
    #[arg(long, value_enum, default_value = "default")]
    preset: PresetArg,
    /// Number of conversation turns.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    turns: u32,
    /// Tokens added per turn (a multiple of 256). Default: 8192 for the
    /// default preset (4 turns → 32,768 tokens), 2304 for tiny (turn
    /// boundaries then fall inside 512-token pages).
    #[arg(long, value_name = "N")]
    turn_tokens: Option<u64>,
    /// Conversation seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    extents: crate::settings::ExtentArgs,
    /// Machine-readable report.
    #[arg(long)]
    json: bool,
}

/// Totals of one root format.
#[derive(Debug, Clone, Serialize)]
struct FormatReport {
    format: &'static str,
    schema: &'static str,
    namespace: String,
    turns: u32,
    created: u32,
    already_present: u32,
    objects_written: u64,
    objects_reused: u64,
    bytes_written: u64,
    objects_referenced: u64,
    stored_bytes_referenced: u64,
    publish_ms: f64,
    restore_ms: f64,
    restore_objects_read: u64,
    restore_bytes_read: u64,
    restored_digest: Option<String>,
    verified: bool,
    miss: Option<String>,
}

/// One format's publication of one turn.
#[derive(Debug, Clone, Serialize)]
struct TurnFormat {
    outcome: &'static str,
    context: String,
    payload_len: u64,
    objects: u64,
    stored_bytes: u64,
    publish_ms: f64,
}

/// One turn of the conversation.
#[derive(Debug, Clone, Serialize)]
struct TurnReport {
    turn: u32,
    boundary: u64,
    kind: &'static str,
    snapshot_bytes: u64,
    snapshot_digest: String,
    v2: TurnFormat,
    v1: TurnFormat,
}

/// The whole report (`--json`).
#[derive(Debug, Clone, Serialize)]
struct DemoReport {
    store: String,
    preset: &'static str,
    seed: u64,
    turns: u32,
    turn_tokens: u64,
    final_boundary: u64,
    final_snapshot_bytes: u64,
    final_snapshot_digest: String,
    turn_details: Vec<TurnReport>,
    formats: Vec<FormatReport>,
    verified: bool,
    total_ms: f64,
}

/// One identity the demo publishes under.
struct Lane {
    format: RootFormat,
    identity: CacheIdentity,
    namespace: Namespace,
    /// Context digest at every turn boundary.
    contexts: Vec<ContextDigest>,
    report: FormatReport,
}

fn outcome_label(o: PublishOutcome) -> &'static str {
    match o {
        PublishOutcome::Created => "created",
        PublishOutcome::AlreadyPresent => "already-present",
        PublishOutcome::Conflict => "conflict",
    }
}

/// The v2 demo identity: the example identity, marked with the preset (a
/// different geometry is a different model, so it must not share contexts).
fn demo_identity(preset: PresetArg) -> CacheIdentity {
    let mut id = CacheIdentity::example();
    id.attributes
        .insert("deltapack.demo.preset".into(), preset.name().into());
    id
}

/// Runs `deltapack demo`.
pub(crate) async fn run(args: DemoArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let preset = args.preset;
    let step = args.turn_tokens.unwrap_or(match preset {
        PresetArg::Default => 8192,
        PresetArg::Tiny => 2304,
    });
    let id_v2 = demo_identity(preset);
    let ct = u64::from(id_v2.chunk_tokens);
    if step == 0 || step % ct != 0 {
        bail!("--turn-tokens {step} must be a positive multiple of {ct}");
    }
    let final_tokens = step
        .checked_mul(u64::from(args.turns))
        .context("conversation too long")?;
    let n_tokens = usize::try_from(final_tokens).context("conversation too long")?;

    let resolved = crate::settings::resolve(&args.store, Some(&args.extents), None)?;
    let store = resolved.open()?;
    let store_name = match store.backend_kind() {
        BackendKind::Local { root } => root.display().to_string(),
        _ => resolved.url()?,
    };

    // One token sequence; context digests at every turn boundary in one
    // O(n) pass per namespace.
    let tokens = synth::tokens(args.seed, n_tokens);
    let mut lanes = demo_lanes(id_v2, &tokens, args.turns, step)?;
    if !args.json {
        println!(
            "deltapack demo: store {store_name}, preset {}, seed {}",
            preset.name(),
            args.seed
        );
        println!(
            "{} turns of {step} tokens -> {final_tokens} tokens; v2 namespace {}, v1 namespace {} (salt \"demo-v1\")",
            args.turns,
            common::short(&lanes[0].namespace.hex()),
            common::short(&lanes[1].namespace.hex()),
        );
        println!();
    }

    // Publish turn by turn, v2 then v1, holding at most two snapshots.
    let mut turn_reports = Vec::with_capacity(args.turns as usize);
    let mut prev: Option<Arc<Snapshot>> = None;
    for turn in 1..=args.turns {
        let boundary = u64::from(turn) * step;
        let pb = common::spinner(format!(
            "synthesizing turn {turn}/{} ({boundary} tokens)",
            args.turns
        ));
        let (p, seed) = (preset.preset(), args.seed);
        let snap = tokio::task::spawn_blocking(move || synth::snapshot(p, seed, boundary))
            .await
            .context("synthesis task")?
            .context("synthesizing a turn")?;
        pb.finish_and_clear();
        let snap = Arc::new(snap);
        let mut per_format = Vec::with_capacity(2);
        for lane in &mut lanes {
            per_format
                .push(publish_turn(&store, lane, (turn, args.turns), &snap, prev.as_ref()).await?);
        }
        let v1 = per_format.pop().context("v1 publication")?;
        let v2 = per_format.pop().context("v2 publication")?;
        turn_reports.push(TurnReport {
            turn,
            boundary,
            kind: if prev.is_none() { "snapshot" } else { "delta" },
            snapshot_bytes: snap.encoded().len() as u64,
            snapshot_digest: snap.digest().to_string(),
            v2,
            v1,
        });
        prev = Some(snap);
    }
    let final_snap = prev.context("no turns")?;
    let final_digest = final_snap.digest();

    // Restore the final turn from both formats and compare bit for bit.
    for lane in &mut lanes {
        restore_final(&store, lane, (args.turns - 1) as usize, &final_snap).await?;
    }
    let verified = lanes.iter().all(|l| l.report.verified);
    let report = DemoReport {
        store: store_name,
        preset: preset.name(),
        seed: args.seed,
        turns: args.turns,
        turn_tokens: step,
        final_boundary: final_snap.boundary(),
        final_snapshot_bytes: final_snap.encoded().len() as u64,
        final_snapshot_digest: final_digest.to_string(),
        turn_details: turn_reports,
        formats: lanes.into_iter().map(|l| l.report).collect(),
        verified,
        total_ms: common::ms(started.elapsed()),
    };
    if args.json {
        common::print_json(&report)?;
    } else {
        print!("{}", report_text(&report));
    }
    if !verified {
        report_failures(&report);
        return Ok(ExitCode::from(crate::exit::EXIT_ERROR));
    }
    Ok(ExitCode::SUCCESS)
}

/// The two lanes of the demo (v2, then v1 under its own salt), each with
/// the context digest of every turn boundary (one O(n) pass each).
fn demo_lanes(id_v2: CacheIdentity, tokens: &[u32], turns: u32, step: u64) -> Result<Vec<Lane>> {
    let mut id_v1 = id_v2.clone();
    id_v1.salt = "demo-v1".into();
    let mut lanes = Vec::with_capacity(2);
    for (format, identity) in [(RootFormat::V2, id_v2), (RootFormat::V1, id_v1)] {
        let namespace = identity.namespace();
        let all = ContextHasher::new(namespace, identity.chunk_tokens)?.boundaries(tokens);
        let contexts = (1..=u64::from(turns))
            .map(|t| {
                let b = t * step;
                all.iter()
                    .find(|(n, _)| *n == b)
                    .map(|(_, c)| *c)
                    .context("turn boundary without a context digest")
            })
            .collect::<Result<Vec<_>>>()?;
        let (name, schema) = (format.name(), format.schema());
        lanes.push(Lane {
            format,
            identity,
            namespace,
            contexts,
            report: FormatReport {
                format: name,
                schema,
                namespace: namespace.hex(),
                turns: 0,
                created: 0,
                already_present: 0,
                objects_written: 0,
                objects_reused: 0,
                bytes_written: 0,
                objects_referenced: 0,
                stored_bytes_referenced: 0,
                publish_ms: 0.0,
                restore_ms: 0.0,
                restore_objects_read: 0,
                restore_bytes_read: 0,
                restored_digest: None,
                verified: false,
                miss: None,
            },
        });
    }
    Ok(lanes)
}

/// Publishes turn `turn.0` of `turn.1` (`snap`, a delta on `prev` when
/// there is one) in `lane`'s format, adds it to the lane's report and
/// returns the turn's row.
async fn publish_turn(
    store: &Store,
    lane: &mut Lane,
    turn: (u32, u32),
    snap: &Arc<Snapshot>,
    prev: Option<&Arc<Snapshot>>,
) -> Result<TurnFormat> {
    let (turn, turns) = turn;
    let idx = (turn - 1) as usize;
    let base = prev.map(|b| BaseInput {
        context: lane.contexts[idx - 1],
        snapshot: b.clone(),
    });
    let req = PublishRequest {
        identity: lane.identity.clone(),
        context: lane.contexts[idx],
        snapshot: snap.clone(),
        base,
        format: lane.format,
    };
    let pb = common::byte_bar(format!("turn {turn}/{turns} {}", lane.report.format));
    let progress = |done: u64, total: u64| {
        pb.set_length(total);
        pb.set_position(done);
    };
    let before = store.stats();
    let t = Instant::now();
    let receipt = store.publish_with_progress(req, &progress).await;
    let elapsed = t.elapsed();
    pb.finish_and_clear();
    let receipt =
        receipt.with_context(|| format!("publishing turn {turn} as {}", lane.report.format))?;
    let after = store.stats();
    if receipt.outcome == PublishOutcome::Conflict {
        return Err(crate::exit::Conflict(format!(
                "conflict: the store already holds a different snapshot ({}) for turn {turn} of the {} demo conversation (context {}); use another --store",
                receipt
                    .existing_snapshot_digest
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| format!("schema {}", receipt.schema)),
                lane.report.format,
                receipt.context
            ))
            .into());
    }
    let r = &mut lane.report;
    r.turns += 1;
    match receipt.outcome {
        PublishOutcome::Created => r.created += 1,
        _ => r.already_present += 1,
    }
    r.objects_written += after.objects_written - before.objects_written;
    r.objects_reused += after.objects_reused - before.objects_reused;
    r.bytes_written += after.bytes_written - before.bytes_written;
    r.publish_ms += common::ms(elapsed);
    // What the root now references (stable across re-runs).
    let (objects, stored_bytes, payload_len) = match store
        .read_root(&lane.namespace, &lane.contexts[idx])
        .await?
    {
        RootStatus::Found(d) => match d.summary() {
            Some(s) => (
                s.objects.len() as u64,
                s.objects.iter().map(|o| o.1).sum::<u64>(),
                s.payload_len,
            ),
            None => (0, 0, 0),
        },
        RootStatus::Absent => bail!("turn {turn} root vanished after publication"),
        RootStatus::Unusable(reason) => {
            bail!("turn {turn} root is unusable after publication: {reason}")
        }
    };
    r.objects_referenced += objects;
    r.stored_bytes_referenced += stored_bytes;
    Ok(TurnFormat {
        outcome: outcome_label(receipt.outcome),
        context: lane.contexts[idx].hex(),
        payload_len,
        objects,
        stored_bytes,
        publish_ms: common::ms(elapsed),
    })
}

/// Restores the final turn (`last`) of `lane`, recomputes its digest and
/// compares its bytes with `final_snap`, into the lane's report.
async fn restore_final(
    store: &Store,
    lane: &mut Lane,
    last: usize,
    final_snap: &Arc<Snapshot>,
) -> Result<()> {
    let final_digest = final_snap.digest();
    let pb = common::spinner(format!("restoring the final turn ({})", lane.report.format));
    let before = store.stats();
    let t = Instant::now();
    let out = store
        .restore(
            (lane.namespace, lane.contexts[last]),
            RestoreOptions::default(),
        )
        .await;
    let elapsed = t.elapsed();
    pb.finish_and_clear();
    let after = store.stats();
    let r = &mut lane.report;
    r.restore_ms = common::ms(elapsed);
    r.restore_objects_read = after.objects_read - before.objects_read;
    r.restore_bytes_read = after.bytes_read - before.bytes_read;
    match out.with_context(|| format!("restoring the final turn ({})", r.format))? {
        RestoreOutcome::Hit(hit) => {
            let (want, got) = (final_snap.clone(), hit.snapshot.clone());
            // Recompute the digest ourselves (by the definition the
            // root uses: BLAKE3 of the encoding for v1, the layered
            // digest for v2.2) rather than trusting the store's, and
            // compare the bytes.
            let named = hit.digest;
            let (digest, equal) = tokio::task::spawn_blocking(move || {
                let d = deltapack_format::layer_digest::digest_like(&got, &named);
                (d, got.encoded() == want.encoded())
            })
            .await
            .context("verification task")?;
            let digest = digest.context("digest of the restored snapshot")?;
            r.restored_digest = Some(digest.to_string());
            let whole = named.algorithm() != deltapack_format::Algorithm::Blake3Layers;
            r.verified = equal && digest == hit.digest && (!whole || hit.digest == final_digest);
        }
        RestoreOutcome::Miss(reason) => r.miss = Some(reason.to_string()),
    }
    Ok(())
}

/// Says on stderr why the demo did not verify.
fn report_failures(report: &DemoReport) {
    for f in &report.formats {
        if let Some(m) = &f.miss {
            eprintln!("error: {} restore of the final turn missed: {m}", f.format);
        } else if !f.verified {
            eprintln!(
                "error: {} restore of the final turn returned {} but the synthesized snapshot is {}",
                f.format,
                f.restored_digest.as_deref().unwrap_or("?"),
                report.final_snapshot_digest
            );
        }
    }
}

fn report_text(r: &DemoReport) -> String {
    let mut out = String::new();
    let turn_rows: Vec<Vec<String>> = r
        .turn_details
        .iter()
        .map(|t| {
            vec![
                t.turn.to_string(),
                t.boundary.to_string(),
                t.kind.to_string(),
                common::human_bytes(t.snapshot_bytes),
                common::human_bytes(t.v2.payload_len),
                t.v2.objects.to_string(),
                t.v1.objects.to_string(),
                t.v2.outcome.to_string(),
                t.v1.outcome.to_string(),
            ]
        })
        .collect();
    out.push_str(&common::table(
        &[
            "TURN", "TOKENS", "KIND", "SNAPSHOT", "PAYLOAD", "V2 OBJS", "V1 OBJS", "V2", "V1",
        ],
        &turn_rows,
        &[0, 1, 3, 4, 5, 6],
    ));
    out.push('\n');
    let fmt_rows: Vec<Vec<String>> = r
        .formats
        .iter()
        .map(|f| {
            let outcome = match (f.created, f.already_present) {
                (c, 0) => format!("{c} created"),
                (0, a) => format!("{a} already-present"),
                (c, a) => format!("{c} created, {a} already-present"),
            };
            vec![
                f.format.to_string(),
                f.turns.to_string(),
                outcome,
                f.objects_written.to_string(),
                common::human_bytes(f.bytes_written),
                format!("{:.1}", f.publish_ms),
                format!("{:.1}", f.restore_ms),
                f.restore_objects_read.to_string(),
                if f.verified {
                    "ok".into()
                } else {
                    "FAILED".into()
                },
            ]
        })
        .collect();
    out.push_str(&common::table(
        &[
            "FORMAT",
            "TURNS",
            "PUBLISHED",
            "OBJECTS WRITTEN",
            "BYTES WRITTEN",
            "PUBLISH MS",
            "RESTORE MS",
            "OBJECTS READ",
            "VERIFY",
        ],
        &fmt_rows,
        &[1, 3, 4, 5, 6, 7],
    ));
    out.push_str(
        "(restore = the final turn through its whole base chain; objects read counts every object fetched)\n\n",
    );
    if r.verified {
        let names: Vec<&str> = r.formats.iter().map(|f| f.format).collect();
        out.push_str(&format!(
            "verified: final snapshot {} ({} tokens, {}) restored bit-exactly from {}\n",
            r.final_snapshot_digest,
            r.final_boundary,
            common::human_bytes(r.final_snapshot_bytes),
            names.join(" and ")
        ));
    } else {
        out.push_str(&format!(
            "NOT verified: final snapshot {} was not restored bit-exactly from every format\n",
            r.final_snapshot_digest
        ));
    }
    out.push_str(&format!(
        "total {:.1} s\n",
        Duration::from_micros((r.total_ms * 1000.0) as u64).as_secs_f64()
    ));
    out
}

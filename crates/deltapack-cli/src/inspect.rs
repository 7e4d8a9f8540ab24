//! `deltapack inspect`: the roots of a store, or one root in detail.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use deltapack_format::{ContextDigest, DecodedRoot, Namespace};
use deltapack_store::{keys, MissReason, RootInfo, RootStatus, Store};
use serde_json::{json, Value};

use crate::common;

#[derive(Debug, clap::Args)]
pub(crate) struct InspectArgs {
    #[command(flatten)]
    store: crate::settings::StoreArgs,
    /// Only this identity's namespace.
    #[arg(long, value_name = "FILE")]
    identity: Option<PathBuf>,
    /// Show this context's root in detail, with its extents or chunks.
    #[arg(long, value_name = "HEX", conflicts_with = "tokens")]
    context: Option<String>,
    /// Show the root of these token ids' context (u32 LE; needs
    /// --identity) in detail, instead of --context.
    #[arg(long, value_name = "FILE", requires = "identity")]
    tokens: Option<PathBuf>,
    /// Machine-readable output (a JSON array of roots, or one object).
    #[arg(long)]
    json: bool,
}

/// Runs `deltapack inspect`.
///
/// Note that reading a damaged root quarantines it (as every reader does).
pub(crate) async fn run(args: InspectArgs) -> Result<ExitCode> {
    let identity = args
        .identity
        .as_deref()
        .map(common::read_identity)
        .transpose()?;
    let ns = identity.as_ref().map(|id| id.namespace());
    let context = common::context_of(
        identity.as_ref(),
        args.context.as_deref(),
        args.tokens.as_deref(),
    )?;
    let store = args.store.open()?;
    match context {
        None => list(&store, ns.as_ref(), args.json).await,
        Some(ctx) => detail(&store, ns, ctx, args.json).await,
    }
}

async fn list(store: &Store, ns: Option<&Namespace>, json: bool) -> Result<ExitCode> {
    let roots: Vec<RootInfo> = store.inspect(ns).await?;
    if json {
        common::print_json(&roots)?;
        return Ok(ExitCode::SUCCESS);
    }
    if roots.is_empty() {
        println!("no roots");
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = roots
        .iter()
        .map(|r| {
            vec![
                common::short(&r.namespace).to_string(),
                common::short(&r.context).to_string(),
                common::short_schema(&r.schema).to_string(),
                if r.kind.is_empty() {
                    "-".into()
                } else {
                    r.kind.clone()
                },
                r.boundary.to_string(),
                r.objects.to_string(),
                r.stored_bytes.to_string(),
                r.base_context
                    .as_deref()
                    .map(|b| common::short(b).to_string())
                    .unwrap_or_else(|| "-".into()),
            ]
            .into_iter()
            // With a tier: where each root lives.
            .chain(r.location.clone())
            .collect()
        })
        .collect();
    let mut header = vec![
        "NAMESPACE",
        "CONTEXT",
        "SCHEMA",
        "KIND",
        "BOUNDARY",
        "OBJECTS",
        "STORED",
        "BASE",
    ];
    if roots.iter().any(|r| r.location.is_some()) {
        header.push("WHERE");
    }
    print!("{}", common::table(&header, &rows, &[4, 5, 6]));
    let stored: u64 = roots.iter().map(|r| r.stored_bytes).sum();
    println!(
        "{} roots, {} referenced (objects shared between roots counted per root)",
        roots.len(),
        common::human_bytes(stored)
    );
    Ok(ExitCode::SUCCESS)
}

async fn detail(
    store: &Store,
    ns: Option<Namespace>,
    ctx: ContextDigest,
    json: bool,
) -> Result<ExitCode> {
    // A context digest is keyed by its namespace, so without an identity the
    // context names at most one root in practice.
    let ns = match ns {
        Some(n) => n,
        None => {
            let found: Vec<Namespace> = store
                .list_roots(None)
                .await?
                .into_iter()
                .filter(|(_, c)| *c == ctx)
                .map(|(n, _)| n)
                .collect();
            match found.as_slice() {
                [] => {
                    crate::restore::print_miss(&MissReason::Absent, "", &ctx.hex(), json, None)?;
                    return Ok(ExitCode::from(crate::exit::EXIT_MISS));
                }
                [n] => *n,
                _ => bail!(
                    "context {ctx} has roots in {} namespaces; pass --identity",
                    found.len()
                ),
            }
        }
    };
    let key = keys::root_key(&ns, &ctx);
    let root_bytes = store.root_size((ns, ctx)).await.ok().flatten();
    let root = match store.peek_root(&ns, &ctx).await? {
        RootStatus::Found(d) => *d,
        RootStatus::Absent => {
            crate::restore::print_miss(&MissReason::Absent, &ns.hex(), &ctx.hex(), json, None)?;
            return Ok(ExitCode::from(crate::exit::EXIT_MISS));
        }
        RootStatus::Unusable(reason) => {
            crate::restore::print_miss(&reason, &ns.hex(), &ctx.hex(), json, None)?;
            return Ok(ExitCode::from(crate::exit::EXIT_MISS));
        }
    };
    let v = root_detail(&root, key.as_ref(), root_bytes)?;
    if json {
        common::print_json(&v)?;
    } else {
        print!("{}", detail_text(&v));
    }
    Ok(ExitCode::SUCCESS)
}

/// One root in detail, as JSON (also the source of the human view).
fn root_detail(root: &DecodedRoot, key: &str, root_bytes: Option<u64>) -> Result<Value> {
    let summary = match root.summary() {
        Some(s) => s,
        None => bail!("root {key} is not readable by this version"),
    };
    let objects: Vec<Value> = match root {
        DecodedRoot::V2(m) => m
            .extents
            .iter()
            .enumerate()
            .map(|(i, e)| {
                json!({
                    "index": i,
                    "offset": e.offset,
                    "raw_len": e.raw_len,
                    "codec": e.codec,
                    "stored_len": e.stored_len,
                    "object_digest": e.object_digest().to_string(),
                    "raw_digest": e.raw_digest.to_string(),
                    "key": keys::object_key(&e.object_digest()).to_string(),
                })
            })
            .collect(),
        DecodedRoot::V1(m) => {
            let ranges =
                deltapack_format::root::v1_chunk_ranges(m.payload_len, m.chunks.len() as u64);
            m.chunks
                .iter()
                .zip(ranges)
                .enumerate()
                .map(|(i, (c, r))| {
                    json!({
                        "index": i,
                        "offset": r.start,
                        "raw_len": c.bytes,
                        "codec": "raw",
                        "stored_len": c.bytes,
                        "object_digest": c.digest.to_string(),
                        "logical_start": c.logical_start,
                        "logical_end": c.logical_end,
                        "key": keys::object_key(&c.digest).to_string(),
                    })
                })
                .collect()
        }
        DecodedRoot::Incompatible { reason } => bail!("root {key} is incompatible: {reason}"),
    };
    let (chunk_tokens, max_extent_bytes) = match root {
        DecodedRoot::V2(m) => (m.logical_chunk_tokens, Some(m.max_extent_bytes)),
        DecodedRoot::V1(m) => (m.logical_chunk_tokens, None),
        DecodedRoot::Incompatible { .. } => (0, None),
    };
    Ok(json!({
        "key": key,
        "namespace": summary.namespace.hex(),
        "context": summary.context.hex(),
        "schema": summary.schema,
        "kind": summary.kind,
        "boundary": summary.boundary,
        "logical_chunk_tokens": chunk_tokens,
        "result_snapshot_digest": summary.result_snapshot_digest.to_string(),
        "result_snapshot_len": summary.result_snapshot_len,
        "payload_digest": summary.payload_digest.to_string(),
        "payload_len": summary.payload_len,
        "max_extent_bytes": max_extent_bytes,
        "base": summary.base,
        "root_bytes": root_bytes,
        "stored_bytes": summary.objects.iter().map(|o| o.1).sum::<u64>(),
        "object_count": objects.len(),
        "objects": objects,
    }))
}

fn detail_text(v: &Value) -> String {
    let s = |k: &str| match &v[k] {
        Value::String(x) => x.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let mut out = String::new();
    let mut line = |k: &str, val: String| out.push_str(&format!("{k:<10} {val}\n"));
    line("root", s("key"));
    line("namespace", s("namespace"));
    line("context", s("context"));
    line("schema", s("schema"));
    line("kind", s("kind"));
    line(
        "boundary",
        format!(
            "{} tokens (logical chunks of {})",
            n("boundary"),
            n("logical_chunk_tokens")
        ),
    );
    line(
        "result",
        format!(
            "{} ({} bytes)",
            s("result_snapshot_digest"),
            n("result_snapshot_len")
        ),
    );
    line(
        "payload",
        format!("{} ({} bytes)", s("payload_digest"), n("payload_len")),
    );
    let base = &v["base"];
    if base.is_object() {
        line(
            "base",
            format!(
                "{} at {} tokens, snapshot {}",
                base["context"].as_str().unwrap_or("?"),
                base["boundary"].as_u64().unwrap_or(0),
                base["snapshot_digest"].as_str().unwrap_or("?"),
            ),
        );
    } else {
        line("base", "-".into());
    }
    if let Some(m) = v["max_extent_bytes"].as_u64() {
        line("extent", format!("{} max", common::human_bytes(m)));
    }
    line(
        "objects",
        format!(
            "{}, {} stored ({} bytes)",
            n("object_count"),
            common::human_bytes(n("stored_bytes")),
            n("stored_bytes")
        ),
    );
    if let Some(b) = v["root_bytes"].as_u64() {
        line("root size", format!("{b} bytes"));
    }
    out.push('\n');
    let rows: Vec<Vec<String>> = v["objects"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|o| {
                    let num = |k: &str| o[k].as_u64().unwrap_or(0).to_string();
                    vec![
                        num("index"),
                        num("offset"),
                        num("raw_len"),
                        o["codec"].as_str().unwrap_or("?").to_string(),
                        num("stored_len"),
                        o["object_digest"].as_str().unwrap_or("?").to_string(),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    out.push_str(&common::table(
        &["#", "OFFSET", "RAW_LEN", "CODEC", "STORED_LEN", "OBJECT"],
        &rows,
        &[0, 1, 2, 4],
    ));
    out
}

//! `compat check` and `compat record`: a store's roots against the digests
//! a `record` file expects.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use deltapack_format::{ContextDigest, Digest, Namespace};
use deltapack_store::keys;
use serde::{Deserialize, Serialize};

use super::handles::Handles;
use super::report::{finish, print_result};
use super::root_check::{check_root, list_roots, Checked, RootResult};
use crate::common;
use crate::settings::KeyArgs;

/// The `format` of the files `compat record` writes and `--expect` reads.
pub(crate) const EXPECT_FORMAT: &str = "deltapack-compat-expect/1";

/// `deltapack compat check`.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
    /// Store URL: file:///dir (or a plain path), s3://bucket/prefix.
    #[arg(long, value_name = "URL")]
    store: String,
    /// A file written by `compat record`: every root must restore to the
    /// digest it records, and every root it lists must be present.
    #[arg(long, value_name = "FILE")]
    expect: Option<PathBuf>,
    #[command(flatten)]
    key: KeyArgs,
    /// One JSON object per root (JSON lines); the summary goes to stderr.
    #[arg(long)]
    json: bool,
}

/// `deltapack compat record`.
#[derive(Debug, clap::Args)]
pub(crate) struct RecordArgs {
    /// Store URL.
    #[arg(long, value_name = "URL")]
    store: String,
    /// Where to write the expected digests (JSON).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    #[command(flatten)]
    key: KeyArgs,
    /// One JSON object per root (JSON lines); the summary goes to stderr.
    #[arg(long)]
    json: bool,
}

/// The file `compat record` writes and `compat check --expect` reads.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ExpectFile {
    /// Always [`EXPECT_FORMAT`].
    pub(super) format: String,
    /// Root key (`roots/<namespace>/<context>`) → what it must restore to.
    pub(super) roots: BTreeMap<String, ExpectRoot>,
}

/// One recorded root.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ExpectRoot {
    pub(super) namespace: Namespace,
    pub(super) context: ContextDigest,
    pub(super) schema: String,
    pub(super) snapshot_digest: Digest,
}

pub(super) fn read_expect(path: &Path) -> Result<BTreeMap<(Namespace, ContextDigest), ExpectRoot>> {
    let text = std::fs::read(path)
        .with_context(|| format!("cannot read the expect file {}", path.display()))?;
    #[derive(Deserialize)]
    struct Probe {
        format: Option<String>,
    }
    let probe: Probe = serde_json::from_slice(&text)
        .with_context(|| format!("expect file {}: not a JSON object", path.display()))?;
    match probe.format.as_deref() {
        Some(EXPECT_FORMAT) => {}
        Some(other) => bail!(
            "expect file {}: format {other:?} is not {EXPECT_FORMAT:?} (written by a newer deltapack?)",
            path.display()
        ),
        None => bail!(
            "expect file {}: no \"format\" field (not written by `deltapack compat record`)",
            path.display()
        ),
    }
    let file: ExpectFile =
        serde_json::from_slice(&text).with_context(|| format!("expect file {}", path.display()))?;
    let mut out = BTreeMap::new();
    for (k, v) in file.roots {
        let key = keys::root_key(&v.namespace, &v.context).to_string();
        if k != key {
            bail!(
                "expect file {}: entry {k:?} names {key} (namespace and context disagree with its key)",
                path.display()
            );
        }
        out.insert((v.namespace, v.context), v);
    }
    Ok(out)
}

/// Checks every root of `url`; with `expect`, against it too. Returns the
/// per-root results (already printed), the passing roots' details and the
/// refused-write count.
pub(super) async fn check_store(
    url: &str,
    key: &KeyArgs,
    expect: Option<&BTreeMap<(Namespace, ContextDigest), ExpectRoot>>,
    json: bool,
) -> Result<(Vec<RootResult>, Vec<Checked>, u64)> {
    let h = Handles::open(url, key.mac_secret()?)?;
    let roots = list_roots(&h.plain).await?;
    if roots.is_empty() && expect.is_none_or(|e| e.is_empty()) {
        bail!("store {url} holds no roots (is the URL right?)");
    }
    let mut results = Vec::with_capacity(roots.len());
    let mut passed = Vec::new();
    let listed: BTreeSet<_> = roots.iter().copied().collect();
    for (ns, ctx) in roots {
        let (mut r, checked) = check_root(&h, ns, ctx).await?;
        if let Some(e) = expect {
            r.expected = Some(e.contains_key(&(ns, ctx)));
            if let (Some(want), false) = (e.get(&(ns, ctx)), r.failed()) {
                if r.snapshot_digest.as_deref() != Some(want.snapshot_digest.to_string().as_str()) {
                    r.fail(
                        "expect",
                        format!(
                            "restores to {}, --expect records {}",
                            r.snapshot_digest.as_deref().unwrap_or("?"),
                            want.snapshot_digest
                        ),
                    );
                } else if r.schema.as_deref() != Some(want.schema.as_str()) {
                    r.fail(
                        "expect",
                        format!(
                            "schema {}, --expect records {}",
                            r.schema.as_deref().unwrap_or("?"),
                            want.schema
                        ),
                    );
                }
            }
        }
        print_result(&r, json)?;
        if !r.failed() {
            if let Some(mut c) = checked {
                // Only the summary is kept: a store's snapshots need not
                // fit in memory together.
                c.snapshot = None;
                passed.push(c);
            }
        }
        results.push(r);
    }
    if let Some(e) = expect {
        for ((ns, ctx), want) in e {
            if listed.contains(&(*ns, *ctx)) {
                continue;
            }
            let mut r = RootResult::missing(
                ns,
                ctx,
                &want.schema,
                "--expect lists this root; the store does not hold it",
            );
            r.snapshot_digest = Some(want.snapshot_digest.to_string());
            r.expected = Some(true);
            print_result(&r, json)?;
            results.push(r);
        }
    }
    Ok((results, passed, h.refused()))
}

pub(super) async fn check(a: CheckArgs) -> Result<ExitCode> {
    let expect = a.expect.as_deref().map(read_expect).transpose()?;
    let (results, _, refused) = check_store(&a.store, &a.key, expect.as_ref(), a.json).await?;
    Ok(finish("compat check", &results, refused, a.json))
}

pub(super) async fn record(a: RecordArgs) -> Result<ExitCode> {
    let (results, passed, refused) = check_store(&a.store, &a.key, None, a.json).await?;
    let code = finish("compat record", &results, refused, a.json);
    if results.iter().any(|r| r.failed()) {
        eprintln!(
            "compat record: not written ({} would record failing roots)",
            a.out.display()
        );
        return Ok(code);
    }
    let roots = passed
        .iter()
        .map(|c| {
            let s = &c.summary;
            (
                keys::root_key(&s.namespace, &s.context).to_string(),
                ExpectRoot {
                    namespace: s.namespace,
                    context: s.context,
                    schema: s.schema.to_string(),
                    snapshot_digest: s.result_snapshot_digest,
                },
            )
        })
        .collect();
    let file = ExpectFile {
        format: EXPECT_FORMAT.into(),
        roots,
    };
    let mut text = serde_json::to_string_pretty(&file).context("serializing the expect file")?;
    text.push('\n');
    common::write_atomic(&a.out, text.as_bytes())?;
    if !a.json {
        println!("recorded {} roots in {}", passed.len(), a.out.display());
    }
    Ok(code)
}

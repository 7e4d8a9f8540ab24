//! Fixture sets: `compat fixtures` checks a frozen directory, `compat
//! freeze` writes one from a store that passed every check.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use deltapack_format::{ContextDigest, Digest, Namespace};
use deltapack_store::{keys, ObjectKey, RestoreOutcome};
use object_store::path::Path as ObjPath;
use serde::{Deserialize, Serialize};

use super::expect::check_store;
use super::handles::Handles;
use super::report::{finish, print_result};
use super::root_check::{check_root, list_roots, Checked, RootResult};
use crate::common;
use crate::settings::KeyArgs;

/// `deltapack compat fixtures`.
#[derive(Debug, clap::Args)]
pub(crate) struct FixturesArgs {
    /// The fixture directory (expected.json, inputs/, store/).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// The secret of the set's keyed roots (a fixture set does not hold it).
    #[command(flatten)]
    key: KeyArgs,
    /// One JSON object per root (JSON lines); the summary goes to stderr.
    #[arg(long)]
    json: bool,
}

/// `deltapack compat freeze`.
#[derive(Debug, clap::Args)]
pub(crate) struct FreezeArgs {
    /// The directory to write (must not exist, or be empty).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Store URL to freeze.
    #[arg(long, value_name = "URL")]
    store: String,
    /// Identity files to keep with the set (repeatable): roots of their
    /// namespace name them, and `compat fixtures` checks the namespace
    /// derivation.
    #[arg(long, value_name = "FILE")]
    identity: Vec<PathBuf>,
    /// The set's description in expected.json.
    #[arg(long, value_name = "TEXT")]
    description: Option<String>,
    #[command(flatten)]
    key: KeyArgs,
    /// One JSON object per root (JSON lines); the summary goes to stderr.
    #[arg(long)]
    json: bool,
}

/// `expected.json` of a fixture set (the format of this repository's
/// `fixtures/*/expected.json`; `identity_file` and `max_extent_bytes` may
/// be absent in sets `compat freeze` wrote).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct FixtureSet {
    pub(super) description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) max_extent_bytes: Option<u64>,
    pub(super) roots: Vec<FixtureRoot>,
}

/// One root of a fixture set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct FixtureRoot {
    pub(super) label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) identity_file: Option<String>,
    pub(super) namespace: Namespace,
    pub(super) context: ContextDigest,
    pub(super) schema: String,
    pub(super) keyed: bool,
    pub(super) snapshot_file: String,
    pub(super) snapshot_digest: Digest,
}

/// `dir/rel` for a relative path inside the set (no `..`, not absolute).
pub(super) fn inside(dir: &Path, rel: &str) -> Result<PathBuf> {
    let p = Path::new(rel);
    if p.components().any(|c| !matches!(c, Component::Normal(_))) {
        bail!("expected.json names {rel:?}, which is not a plain path inside the set");
    }
    Ok(dir.join(p))
}

/// Checks a fixture directory; prints per-root lines; the results.
pub(super) async fn check_fixture_dir(
    dir: &Path,
    key: &KeyArgs,
    json: bool,
) -> Result<(Vec<RootResult>, u64)> {
    let exp_path = dir.join("expected.json");
    let text =
        std::fs::read(&exp_path).with_context(|| format!("cannot read {}", exp_path.display()))?;
    let set: FixtureSet =
        serde_json::from_slice(&text).with_context(|| format!("{}", exp_path.display()))?;
    let store_dir = dir.join("store");
    let url = store_dir.to_string_lossy().into_owned();
    let h = Handles::open(&url, key.mac_secret()?)?;
    let listed: BTreeSet<_> = list_roots(&h.plain).await?.into_iter().collect();
    if set.roots.is_empty() {
        bail!("{}: the set lists no roots", exp_path.display());
    }
    let mut results = Vec::new();
    let mut seen = BTreeSet::new();
    for want in &set.roots {
        let id = (want.namespace, want.context);
        seen.insert(id);
        if !listed.contains(&id) {
            let mut r = RootResult::missing(
                &want.namespace,
                &want.context,
                &want.schema,
                "expected.json lists this root; store/ does not hold it",
            );
            r.label = Some(want.label.clone());
            print_result(&r, json)?;
            results.push(r);
            continue;
        }
        let (mut r, checked) = if want.keyed && h.key.is_none() {
            let mut r = RootResult::new(&want.namespace, &want.context);
            r.schema = Some(want.schema.clone());
            r.fail(
                "mac",
                "expected.json marks this root keyed: give the set's secret (--root-key-file or DELTAPACK_ROOT_KEY)",
            );
            (r, None)
        } else {
            check_root(&h, want.namespace, want.context).await?
        };
        r.label = Some(want.label.clone());
        if let Some(c) = checked {
            fixture_extras(dir, want, &c, &mut r)?;
        }
        print_result(&r, json)?;
        results.push(r);
    }
    for (ns, ctx) in listed.difference(&seen) {
        let mut r = RootResult::new(ns, ctx);
        r.fail(
            "unlisted",
            "store/ holds a root expected.json does not list",
        );
        print_result(&r, json)?;
        results.push(r);
    }
    Ok((results, h.refused()))
}

/// The checks only a fixture set allows: its schema, keyed flag, expected
/// digest, identity (namespace derivation) and input snapshot bytes.
pub(super) fn fixture_extras(
    dir: &Path,
    want: &FixtureRoot,
    c: &Checked,
    r: &mut RootResult,
) -> Result<()> {
    if c.summary.schema != want.schema {
        r.fail(
            "schema",
            format!(
                "the root is {}, expected.json says {}",
                c.summary.schema, want.schema
            ),
        );
    } else if c.keyed != want.keyed {
        r.fail(
            "keyed",
            format!(
                "the root is keyed: {}, expected.json says {}",
                c.keyed, want.keyed
            ),
        );
    } else if c.summary.result_snapshot_digest != want.snapshot_digest {
        r.fail(
            "expect",
            format!(
                "restores to {}, expected.json records {}",
                c.summary.result_snapshot_digest, want.snapshot_digest
            ),
        );
    }
    if r.failed() {
        return Ok(());
    }
    if let Some(f) = &want.identity_file {
        let id_path = inside(dir, f)?;
        let id = common::read_identity(&id_path)?;
        if id.namespace() != want.namespace {
            r.fail(
                "identity",
                format!(
                    "{f} derives namespace {}, expected.json records {}",
                    id.namespace().hex(),
                    want.namespace.hex()
                ),
            );
            return Ok(());
        }
    }
    let snap_path = inside(dir, &want.snapshot_file)?;
    // Read into memory of its own (never mapped: see `common::open_snapshot`).
    let input = crate::common::read_private_now(&snap_path)?;
    match &c.snapshot {
        Some(s) if s.encoded() == &input[..] => {}
        _ => r.fail(
            "snapshot-file",
            format!("the restored snapshot differs from {}", want.snapshot_file),
        ),
    }
    Ok(())
}

pub(super) async fn fixtures(a: FixturesArgs) -> Result<ExitCode> {
    let (results, refused) = check_fixture_dir(&a.dir, &a.key, a.json).await?;
    Ok(finish("compat fixtures", &results, refused, a.json))
}

pub(super) async fn freeze(a: FreezeArgs) -> Result<ExitCode> {
    if a.dir.exists() {
        let non_empty = std::fs::read_dir(&a.dir)
            .with_context(|| format!("cannot read {}", a.dir.display()))?
            .next()
            .is_some();
        if non_empty {
            bail!(
                "{} exists and is not empty: refusing to overwrite it",
                a.dir.display()
            );
        }
    }
    let mut identities = BTreeMap::new();
    for f in &a.identity {
        let id = common::read_identity(f)?;
        identities.insert(id.namespace(), id);
    }
    // 1. Everything passes, or nothing is written.
    let (results, passed, refused) = check_store(&a.store, &a.key, None, a.json).await?;
    let code = finish("compat freeze (check)", &results, refused, a.json);
    if results.iter().any(|r| r.failed()) {
        eprintln!("compat freeze: nothing written (a failing root cannot be frozen)");
        return Ok(code);
    }
    // 2. The roots that passed, the objects they reference, their
    //    snapshots; a failure removes what was written (DIR was empty).
    let set = match write_set(&a, &passed, &identities).await {
        Ok(set) => set,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&a.dir);
            return Err(e.context(format!(
                "compat freeze failed; {} was removed",
                a.dir.display()
            )));
        }
    };
    // 3. The frozen set checks as `compat fixtures` will check it.
    if !a.json {
        println!(
            "frozen {} roots into {}; checking it:",
            set.roots.len(),
            a.dir.display()
        );
    }
    let (results, refused) = check_fixture_dir(&a.dir, &a.key, a.json).await?;
    Ok(finish("compat fixtures", &results, refused, a.json))
}

/// Writes the fixture set of the roots that passed into `a.dir`.
pub(super) async fn write_set(
    a: &FreezeArgs,
    passed: &[Checked],
    identities: &BTreeMap<Namespace, deltapack_format::CacheIdentity>,
) -> Result<FixtureSet> {
    let source = Handles::open(&a.store, a.key.mac_secret()?)?;
    std::fs::create_dir_all(a.dir.join("inputs"))
        .with_context(|| format!("cannot create {}", a.dir.display()))?;
    let store_dir = a.dir.join("store");
    let mut written_objects = BTreeSet::new();
    let mut roots = Vec::new();
    let mut snapshots = BTreeSet::new();
    let mut id_files = BTreeMap::new();
    for (ns, id) in identities {
        let rel = format!("inputs/identity-{}.json", common::short(&ns.hex()));
        std::fs::write(a.dir.join(&rel), id.to_json_pretty())
            .with_context(|| format!("cannot write {rel}"))?;
        id_files.insert(*ns, rel);
    }
    let mut max_extent = None;
    for c in passed {
        let s = &c.summary;
        let rkey = keys::root_key(&s.namespace, &s.context);
        write_file(&store_dir, &rkey, &c.raw)?;
        for (d, _) in &s.objects {
            let okey = keys::object_key(d);
            if written_objects.insert(okey.to_string()) {
                let bytes = source
                    .plain
                    .raw_object(&ObjectKey(*d))
                    .await
                    .with_context(|| format!("reading {okey}"))?
                    .with_context(|| format!("{okey} is missing"))?;
                write_file(&store_dir, &okey, &bytes)?;
            }
        }
        let snapshot_file = format!("inputs/{}.snapshot", s.result_snapshot_digest.hex());
        if snapshots.insert(snapshot_file.clone()) {
            // Restored (and verified) once more, one at a time.
            let store = match (c.keyed, &source.keyed) {
                (true, Some(k)) => k,
                _ => &source.plain,
            };
            let snap = match store
                .restore((s.namespace, s.context), Default::default())
                .await?
            {
                RestoreOutcome::Hit(h) if h.digest == s.result_snapshot_digest => h.snapshot,
                RestoreOutcome::Hit(h) => bail!("{rkey} now restores to {}", h.digest),
                RestoreOutcome::Miss(m) => bail!("{rkey} no longer restores ({m})"),
            };
            std::fs::write(a.dir.join(&snapshot_file), snap.encoded())
                .with_context(|| format!("cannot write {snapshot_file}"))?;
        }
        max_extent = max_extent.max(c.max_extent_bytes);
        roots.push(FixtureRoot {
            label: format!(
                "{}-{}-{}",
                common::short_schema(s.schema),
                common::short(&s.namespace.hex()),
                common::short(&s.context.hex())
            ),
            identity_file: id_files.get(&s.namespace).cloned(),
            namespace: s.namespace,
            context: s.context,
            schema: s.schema.to_string(),
            keyed: c.keyed,
            snapshot_file,
            snapshot_digest: s.result_snapshot_digest,
        });
    }
    let set = FixtureSet {
        description: a.description.clone().unwrap_or_else(|| {
            format!(
                "Frozen by deltapack {} `compat freeze` ({} roots).",
                env!("CARGO_PKG_VERSION"),
                roots.len()
            )
        }),
        max_extent_bytes: max_extent,
        roots,
    };
    let mut text = serde_json::to_string_pretty(&set).context("serializing expected.json")?;
    text.push('\n');
    std::fs::write(a.dir.join("expected.json"), text).context("cannot write expected.json")?;
    Ok(set)
}

/// Writes an object-store key's bytes under `dir` (keys are built from
/// typed digests: only hex and fixed words).
pub(super) fn write_file(dir: &Path, key: &ObjPath, bytes: &[u8]) -> Result<()> {
    let mut p = dir.to_path_buf();
    for part in key.parts() {
        p.push(part.as_ref());
    }
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(&p, bytes).with_context(|| format!("cannot write {}", p.display()))
}

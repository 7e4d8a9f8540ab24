//! `deltapack compat check|record|fixtures|freeze` and `deltapack migrate
//! --check`: proof, for a downstream project's CI, that its stored roots and
//! frozen fixtures still decode, restore bit-exactly to their recorded
//! snapshot digests and would migrate without changing a snapshot.
//!
//! Every check reads the store through [`open_read_only`]: an object store
//! wrapper that refuses every write (put, copy, rename, delete), a handle
//! that believes it is a `memory://` store (so no local fast path writes
//! behind the wrapper's back, e.g. the restore's quarantine on local disk
//! or its root lock file) and an in-memory capacity ledger (so the store's
//! `ledger/` file, or the state directory's, is never opened). A restore
//! that finds a damaged object tries to quarantine it; the wrapper refuses,
//! and the number of refused writes is reported.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use deltapack_format::root::{self, DecodedRoot, RootSummary};
use deltapack_format::{ContextDigest, Digest, Namespace, Snapshot};
use deltapack_store::{
    keys, Backend, BackendKind, ObjectKey, Refusals, RestoreOutcome, Store, StoreConfig,
};
use object_store::path::Path as ObjPath;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};

use crate::common;
use crate::settings::{KeyArgs, StoreArgs};

/// The `format` of the files `compat record` writes and `--expect` reads.
pub(crate) const EXPECT_FORMAT: &str = "deltapack-compat-expect/1";

/// A secret no store uses: a keyed root must refuse it.
const OTHER_KEY: &[u8] = b"deltapack compat: a key no store uses";

/// `deltapack compat`.
#[derive(Debug, clap::Args)]
pub(crate) struct CompatArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Check every root of a store: it decodes (schema, envelope, MAC with
    /// a key), every object it references verifies, it restores bit-exactly
    /// to its recorded snapshot digest (and to --expect's), and its body
    /// re-encodes byte-identically. Never writes to the store. Exits 3 on
    /// any failure.
    Check(CheckArgs),
    /// Check every root, then write the digests `check --expect` compares
    /// with (written only if every root passed).
    Record(RecordArgs),
    /// The same checks over a frozen fixture directory (expected.json,
    /// inputs/, store/), against its expected digests and input snapshots.
    Fixtures(FixturesArgs),
    /// Check a store, then freeze it as a fixture directory that
    /// `compat fixtures` checks (refuses an existing non-empty DIR).
    Freeze(FreezeArgs),
}

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

pub(crate) async fn run(a: CompatArgs) -> Result<ExitCode> {
    match a.action {
        Action::Check(a) => check(a).await,
        Action::Record(a) => record(a).await,
        Action::Fixtures(a) => fixtures(a).await,
        Action::Freeze(a) => freeze(a).await,
    }
}

// ---------------------------------------------------------------------
// Read-only store handles.

/// A store handle that cannot write: see the module docs. Returns the
/// handle and the count of writes it refused.
///
/// A local store must exist (a mistyped path is an error, not an empty
/// store created on the spot); no staging file is cleaned up.
pub(crate) fn open_read_only(url: &str, config: StoreConfig) -> Result<(Store, Refusals)> {
    let inner: Arc<dyn ObjectStore> = if url.starts_with("s3://") || url.starts_with("memory:") {
        deltapack_store::open_backend(url)
            .with_context(|| format!("cannot open store {url}"))?
            .store
    } else {
        let path = match url.strip_prefix("file://") {
            Some(p) => PathBuf::from(p),
            None if url.contains("://") => {
                bail!("store URL {url}: expected file://, s3:// or memory://")
            }
            None => PathBuf::from(url),
        };
        if !path.is_dir() {
            bail!("store {url}: {} is not a directory", path.display());
        }
        let root =
            std::fs::canonicalize(&path).with_context(|| format!("cannot open store {url}"))?;
        Arc::new(
            object_store::local::LocalFileSystem::new_with_prefix(&root)
                .with_context(|| format!("cannot open store {url}"))?,
        )
    };
    let (backend, refused) = Backend {
        store: inner,
        kind: BackendKind::Memory,
    }
    .read_only();
    let config = config
        .with_ledger(Some("sqlite://:memory:".into()))
        .with_cold_start(deltapack_store::ColdStart::Load)
        .with_budget_bytes(None)
        .with_min_free_bytes(None)
        // Every restore reads the store: a base verified for an earlier
        // root is not reused from memory.
        .with_base_cache_bytes(0);
    let store =
        Store::from_backend(backend, config).with_context(|| format!("cannot open store {url}"))?;
    Ok((store, refused))
}

/// The two handles a check needs: without a key (unkeyed roots, and keyed
/// ones when no key is given) and with the key (keyed roots).
struct Handles {
    plain: Store,
    keyed: Option<Store>,
    key: Option<[u8; 32]>,
    refused: Vec<Refusals>,
}

impl Handles {
    fn open(url: &str, secret: Option<Vec<u8>>) -> Result<Self> {
        let (plain, r1) = open_read_only(url, StoreConfig::default())?;
        let mut refused = vec![r1];
        let key = secret.as_deref().map(root::mac_key);
        let keyed = match secret {
            Some(s) => {
                let (k, r2) = open_read_only(url, StoreConfig::default().with_mac_secret(Some(s)))?;
                refused.push(r2);
                Some(k)
            }
            None => None,
        };
        Ok(Handles {
            plain,
            keyed,
            key,
            refused,
        })
    }

    fn refused(&self) -> u64 {
        self.refused.iter().map(Refusals::count).sum()
    }
}

// ---------------------------------------------------------------------
// One root's checks.

/// The outcome of one root's checks (one line of output).
#[derive(Debug, Clone, Serialize)]
struct RootResult {
    /// The root's key, `roots/<namespace>/<context>`.
    root: String,
    namespace: String,
    context: String,
    /// A fixture set's label of the root.
    #[serde(skip_serializing_if = "Option::is_none")]
    label: Option<String>,
    /// The schema (when the root decodes).
    schema: Option<String>,
    /// `ok`, `fail` or `missing` (listed in --expect or expected.json,
    /// absent from the store).
    status: &'static str,
    /// The snapshot digest the root records (when it decodes).
    snapshot_digest: Option<String>,
    /// `verified` (keyed, checked with the key), `unchecked` (keyed, no key
    /// given) or `none` (an unkeyed root).
    #[serde(skip_serializing_if = "Option::is_none")]
    mac: Option<&'static str>,
    /// Whether --expect lists the root (only with --expect).
    #[serde(skip_serializing_if = "Option::is_none")]
    expected: Option<bool>,
    /// The first check that failed: read, decode, mac, reencode, object,
    /// restore, digest, expect, schema, keyed, identity, snapshot-file,
    /// unlisted, present.
    #[serde(skip_serializing_if = "Option::is_none")]
    check: Option<&'static str>,
    /// The object at fault (its store key), when the failure is an object's.
    #[serde(skip_serializing_if = "Option::is_none")]
    object: Option<String>,
    /// What failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

impl RootResult {
    fn new(ns: &Namespace, ctx: &ContextDigest) -> Self {
        RootResult {
            root: keys::root_key(ns, ctx).to_string(),
            namespace: ns.hex(),
            context: ctx.hex(),
            label: None,
            schema: None,
            status: "ok",
            snapshot_digest: None,
            mac: None,
            expected: None,
            check: None,
            object: None,
            detail: None,
        }
    }

    fn fail(&mut self, check: &'static str, detail: impl Into<String>) {
        if self.check.is_none() {
            self.status = "fail";
            self.check = Some(check);
            self.detail = Some(detail.into());
        }
    }

    fn failed(&self) -> bool {
        self.status != "ok"
    }
}

/// What a passing root leaves for the caller: its bytes, summary and
/// restored snapshot.
struct Checked {
    raw: bytes::Bytes,
    summary: RootSummary,
    keyed: bool,
    max_extent_bytes: Option<u64>,
    snapshot: Option<Arc<Snapshot>>,
}

/// Runs every check on the root `(ns, ctx)`; the result says which failed
/// first. `Err` only for a failure of the backend or the process.
async fn check_root(
    h: &Handles,
    ns: Namespace,
    ctx: ContextDigest,
) -> Result<(RootResult, Option<Checked>)> {
    let mut r = RootResult::new(&ns, &ctx);
    let key = keys::root_key(&ns, &ctx);
    let Some(raw) = h
        .plain
        .raw_root((ns, ctx))
        .await
        .with_context(|| format!("reading {key}"))?
    else {
        r.fail("read", "the root was listed but is gone");
        return Ok((r, None));
    };
    // Decode: envelope, body hash, schema, MAC (with a key).
    let keyed = root::has_mac(&raw);
    let mac = if keyed { h.key.as_ref() } else { None };
    r.mac = Some(match (keyed, mac.is_some()) {
        (false, _) => "none",
        (true, true) => "verified",
        (true, false) => "unchecked",
    });
    let decoded = match root::decode(&raw, mac) {
        Ok(DecodedRoot::Incompatible { reason }) => {
            r.fail("decode", format!("incompatible: {reason}"));
            return Ok((r, None));
        }
        Ok(d) => d,
        Err(deltapack_format::Error::Unauthenticated(detail)) => {
            r.fail("mac", detail);
            return Ok((r, None));
        }
        Err(e) => {
            r.fail("decode", e.to_string());
            return Ok((r, None));
        }
    };
    let Some(summary) = decoded.summary() else {
        r.fail("decode", "no summary of a readable root");
        return Ok((r, None));
    };
    r.schema = Some(summary.schema.to_string());
    r.snapshot_digest = Some(summary.result_snapshot_digest.to_string());
    if summary.namespace != ns || summary.context != ctx {
        r.fail(
            "decode",
            format!(
                "the root names {}/{} (stored under another key)",
                summary.namespace.hex(),
                summary.context.hex()
            ),
        );
        return Ok((r, None));
    }
    if keyed && mac.is_some() {
        let other = root::mac_key(OTHER_KEY);
        if !matches!(
            root::decode(&raw, Some(&other)),
            Err(deltapack_format::Error::Unauthenticated(_))
        ) {
            r.fail(
                "mac",
                "the root verifies under a key that is not the store's",
            );
            return Ok((r, None));
        }
    }
    // Re-encode: byte-identical (a keyed root checked without its key is
    // compared without its MAC trailer and flag).
    match root::encode(&decoded, mac) {
        Ok(again) => {
            let same = if keyed && mac.is_none() {
                let mut want = raw[..raw.len().saturating_sub(32)].to_vec();
                if want.len() >= 12 {
                    want[10] &= !(root::FLAG_KEYED_MAC as u8);
                }
                again == want
            } else {
                again[..] == raw[..]
            };
            if !same {
                r.fail("reencode", "the decoded root re-encodes to other bytes");
                return Ok((r, None));
            }
        }
        Err(e) => {
            r.fail("reencode", e.to_string());
            return Ok((r, None));
        }
    }
    // Every referenced object, on its own, by the store that restores it.
    let store = match (keyed, &h.keyed) {
        (true, Some(k)) => k,
        _ => &h.plain,
    };
    let verdict = store.verify_root((ns, ctx)).await?;
    if let Some(m) = verdict.unusable.as_ref() {
        r.fail("decode", m.to_string());
        return Ok((r, None));
    }
    if let Some((object, check)) = verdict.first_failure() {
        r.object = Some(object.to_string());
        r.fail("object", check.to_string());
        return Ok((r, None));
    }
    // Restore, bit-exactly.
    let want = summary.result_snapshot_digest;
    let snapshot = match store.restore((ns, ctx), Default::default()).await? {
        RestoreOutcome::Hit(hit) => {
            // By the root's own definition: BLAKE3 of the encoding, or the
            // layered digest of a v2.2 root.
            let found = {
                let s = hit.snapshot.clone();
                tokio::task::spawn_blocking(move || {
                    deltapack_format::layer_digest::digest_like(&s, &want)
                })
                .await??
            };
            if hit.digest != want || found != want {
                r.fail(
                    "digest",
                    format!(
                        "restored {found} (reported {}), the root records {want}",
                        hit.digest
                    ),
                );
                return Ok((r, None));
            }
            if hit.snapshot.encoded().len() as u64 != summary.result_snapshot_len {
                r.fail(
                    "digest",
                    format!(
                        "restored {} bytes, the root records {}",
                        hit.snapshot.encoded().len(),
                        summary.result_snapshot_len
                    ),
                );
                return Ok((r, None));
            }
            if hit.schema != summary.schema {
                r.fail(
                    "restore",
                    format!("restored as {}, decoded as {}", hit.schema, summary.schema),
                );
                return Ok((r, None));
            }
            hit.snapshot
        }
        RestoreOutcome::Miss(m) => {
            r.object = m.object().map(ToString::to_string);
            r.fail("restore", m.to_string());
            return Ok((r, None));
        }
    };
    let max_extent_bytes = match &decoded {
        DecodedRoot::V2(m) => Some(m.max_extent_bytes),
        _ => None,
    };
    Ok((
        r,
        Some(Checked {
            raw,
            summary,
            keyed,
            max_extent_bytes,
            snapshot: Some(snapshot),
        }),
    ))
}

/// Every root of the store, sorted.
async fn list_roots(store: &Store) -> Result<Vec<(Namespace, ContextDigest)>> {
    Ok(store.list_roots(None).await?)
}

// ---------------------------------------------------------------------
// Output.

/// Prints one root's line (text, or a JSON line).
fn print_result(r: &RootResult, json: bool) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string(r).context("serializing JSON output")?
        );
        return Ok(());
    }
    let schema = r.schema.as_deref().map(common::short_schema).unwrap_or("?");
    let name = format!(
        "{}/{}",
        common::short(&r.namespace),
        common::short(&r.context)
    );
    let label = r
        .label
        .as_deref()
        .map(|l| format!(" [{l}]"))
        .unwrap_or_default();
    match r.status {
        "ok" => {
            let note = match (r.mac, r.expected) {
                (Some("unchecked"), _) => " (keyed: MAC not checked, no key given)",
                (_, Some(false)) => " (not in --expect)",
                _ => "",
            };
            println!(
                "ok       {schema:<5} {name}  {}{label}{note}",
                r.snapshot_digest.as_deref().unwrap_or("")
            );
        }
        status => {
            let object = r
                .object
                .as_deref()
                .map(|o| format!(" {o}"))
                .unwrap_or_default();
            println!(
                "{:<8} {schema:<5} {name}{label}  {}{object}: {}",
                status.to_uppercase(),
                r.check.unwrap_or("?"),
                r.detail.as_deref().unwrap_or("")
            );
        }
    }
    Ok(())
}

/// Prints the summary (stdout in text mode, stderr with --json) and
/// returns the exit code: 0 when every root passed, 3 otherwise.
fn finish(what: &str, results: &[RootResult], refused: u64, json: bool) -> ExitCode {
    let failed = results.iter().filter(|r| r.failed()).count();
    let mut line = format!(
        "{what}: {} roots, {} ok, {failed} failed",
        results.len(),
        results.len() - failed
    );
    if refused > 0 {
        line.push_str(&format!(
            "; {refused} writes refused (a restore's quarantine of damaged data: the store was not changed)"
        ));
    }
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::EXIT_MISS)
    }
}

// ---------------------------------------------------------------------
// check / record.

/// The file `compat record` writes and `compat check --expect` reads.
#[derive(Debug, Serialize, Deserialize)]
struct ExpectFile {
    /// Always [`EXPECT_FORMAT`].
    format: String,
    /// Root key (`roots/<namespace>/<context>`) → what it must restore to.
    roots: BTreeMap<String, ExpectRoot>,
}

/// One recorded root.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ExpectRoot {
    namespace: Namespace,
    context: ContextDigest,
    schema: String,
    snapshot_digest: Digest,
}

fn read_expect(path: &Path) -> Result<BTreeMap<(Namespace, ContextDigest), ExpectRoot>> {
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
async fn check_store(
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
            let mut r = RootResult::new(ns, ctx);
            r.schema = Some(want.schema.clone());
            r.snapshot_digest = Some(want.snapshot_digest.to_string());
            r.expected = Some(true);
            r.fail(
                "present",
                "--expect lists this root; the store does not hold it",
            );
            r.status = "missing";
            print_result(&r, json)?;
            results.push(r);
        }
    }
    Ok((results, passed, h.refused()))
}

async fn check(a: CheckArgs) -> Result<ExitCode> {
    let expect = a.expect.as_deref().map(read_expect).transpose()?;
    let (results, _, refused) = check_store(&a.store, &a.key, expect.as_ref(), a.json).await?;
    Ok(finish("compat check", &results, refused, a.json))
}

async fn record(a: RecordArgs) -> Result<ExitCode> {
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

// ---------------------------------------------------------------------
// Fixture sets.

/// `expected.json` of a fixture set (the format of this repository's
/// `fixtures/*/expected.json`; `identity_file` and `max_extent_bytes` may
/// be absent in sets `compat freeze` wrote).
#[derive(Debug, Serialize, Deserialize)]
struct FixtureSet {
    description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_extent_bytes: Option<u64>,
    roots: Vec<FixtureRoot>,
}

/// One root of a fixture set.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct FixtureRoot {
    label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    identity_file: Option<String>,
    namespace: Namespace,
    context: ContextDigest,
    schema: String,
    keyed: bool,
    snapshot_file: String,
    snapshot_digest: Digest,
}

/// `dir/rel` for a relative path inside the set (no `..`, not absolute).
fn inside(dir: &Path, rel: &str) -> Result<PathBuf> {
    let p = Path::new(rel);
    if p.components().any(|c| !matches!(c, Component::Normal(_))) {
        bail!("expected.json names {rel:?}, which is not a plain path inside the set");
    }
    Ok(dir.join(p))
}

/// Checks a fixture directory; prints per-root lines; the results.
async fn check_fixture_dir(
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
            let mut r = RootResult::new(&want.namespace, &want.context);
            r.label = Some(want.label.clone());
            r.schema = Some(want.schema.clone());
            r.fail(
                "present",
                "expected.json lists this root; store/ does not hold it",
            );
            r.status = "missing";
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
fn fixture_extras(dir: &Path, want: &FixtureRoot, c: &Checked, r: &mut RootResult) -> Result<()> {
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
    // Mapped when large (a fixture's snapshot is compared, never copied).
    let input = crate::common::map_or_read(&snap_path)?;
    match &c.snapshot {
        Some(s) if s.encoded() == &input[..] => {}
        _ => r.fail(
            "snapshot-file",
            format!("the restored snapshot differs from {}", want.snapshot_file),
        ),
    }
    Ok(())
}

async fn fixtures(a: FixturesArgs) -> Result<ExitCode> {
    let (results, refused) = check_fixture_dir(&a.dir, &a.key, a.json).await?;
    Ok(finish("compat fixtures", &results, refused, a.json))
}

async fn freeze(a: FreezeArgs) -> Result<ExitCode> {
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
async fn write_set(
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
fn write_file(dir: &Path, key: &ObjPath, bytes: &[u8]) -> Result<()> {
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

// ---------------------------------------------------------------------
// migrate --check.

/// `deltapack migrate --check`: proves every v1 root would migrate to a v2
/// root with the same snapshot digest, through a read-only handle.
pub(crate) async fn migrate_check(
    s: &StoreArgs,
    namespace: Option<Namespace>,
    json: bool,
) -> Result<ExitCode> {
    let resolved = s.resolve()?;
    let config = StoreConfig::default().with_mac_secret(resolved.config.mac_secret.clone());
    let (store, refused) = open_read_only(&resolved.url()?, config)?;
    let proofs = store.migrate_check(namespace).await?;
    let mut failed = 0;
    for p in &proofs {
        if !p.proven {
            failed += 1;
        }
        if json {
            println!(
                "{}",
                serde_json::to_string(p).context("serializing JSON output")?
            );
        } else if p.proven {
            println!(
                "proven   {}/{}  {}  → v2 with {} extents ({} B root)",
                common::short(&p.namespace),
                common::short(&p.context),
                p.snapshot_digest,
                p.extents,
                p.v2_root_bytes
            );
        } else {
            println!(
                "FAIL     {}/{}  {}: {}",
                common::short(&p.namespace),
                common::short(&p.context),
                p.snapshot_digest,
                p.reason.as_deref().unwrap_or("")
            );
        }
    }
    let refused = refused.count();
    let mut line = format!(
        "migrate --check (nothing written): {} v1 roots, {} proven, {failed} would not migrate identically",
        proofs.len(),
        proofs.len() - failed
    );
    if refused > 0 {
        line.push_str(&format!("; {refused} writes refused"));
    }
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::EXIT_MISS)
    })
}

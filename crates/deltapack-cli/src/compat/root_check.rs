//! One root's checks: decode, MAC, re-encode, every object (through the
//! store's `verify_root`), a bit-exact restore. Never writes.

use std::sync::Arc;

use anyhow::{Context, Result};
use deltapack_format::root::{self, DecodedRoot, RootSummary};
use deltapack_format::{ContextDigest, Namespace, Snapshot};
use deltapack_store::{keys, RestoreOutcome, Store};
use serde::Serialize;

use super::handles::Handles;

/// A secret no store uses: a keyed root must refuse it.
const OTHER_KEY: &[u8] = b"deltapack compat: a key no store uses";

/// The outcome of one root's checks (one line of output).
#[derive(Debug, Clone, Serialize)]
pub(super) struct RootResult {
    /// The root's key, `roots/<namespace>/<context>`.
    pub(super) root: String,
    pub(super) namespace: String,
    pub(super) context: String,
    /// A fixture set's label of the root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) label: Option<String>,
    /// The schema (when the root decodes).
    pub(super) schema: Option<String>,
    /// `ok`, `fail` or `missing` (listed in --expect or expected.json,
    /// absent from the store).
    pub(super) status: &'static str,
    /// The snapshot digest the root records (when it decodes).
    pub(super) snapshot_digest: Option<String>,
    /// `verified` (keyed, checked with the key), `unchecked` (keyed, no key
    /// given) or `none` (an unkeyed root).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) mac: Option<&'static str>,
    /// Whether --expect lists the root (only with --expect).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) expected: Option<bool>,
    /// The first check that failed: read, decode, mac, reencode, object,
    /// restore, digest, expect, schema, keyed, identity, snapshot-file,
    /// unlisted, present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) check: Option<&'static str>,
    /// The object at fault (its store key), when the failure is an object's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) object: Option<String>,
    /// What failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) detail: Option<String>,
}

impl RootResult {
    pub(super) fn new(ns: &Namespace, ctx: &ContextDigest) -> Self {
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

    pub(super) fn fail(&mut self, check: &'static str, detail: impl Into<String>) {
        if self.check.is_none() {
            self.status = "fail";
            self.check = Some(check);
            self.detail = Some(detail.into());
        }
    }

    /// A root an expectation lists and the store does not hold (`detail`
    /// says which expectation).
    pub(super) fn missing(ns: &Namespace, ctx: &ContextDigest, schema: &str, detail: &str) -> Self {
        let mut r = RootResult::new(ns, ctx);
        r.schema = Some(schema.to_string());
        r.fail("present", detail);
        r.status = "missing";
        r
    }

    pub(super) fn failed(&self) -> bool {
        self.status != "ok"
    }
}

/// What a passing root leaves for the caller: its bytes, summary and
/// restored snapshot.
pub(super) struct Checked {
    pub(super) raw: bytes::Bytes,
    pub(super) summary: RootSummary,
    pub(super) keyed: bool,
    pub(super) max_extent_bytes: Option<u64>,
    pub(super) snapshot: Option<Arc<Snapshot>>,
}

/// Runs every check on the root `(ns, ctx)`; the result says which failed
/// first. `Err` only for a failure of the backend or the process.
pub(super) async fn check_root(
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
    if let Err((check, detail)) = check_encoding(&decoded, &raw, keyed, mac) {
        r.fail(check, detail);
        return Ok((r, None));
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
    let snapshot = match restore_bit_exactly(store, ns, ctx, &summary).await? {
        Ok(s) => s,
        Err((check, detail, object)) => {
            r.object = object;
            r.fail(check, detail);
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

/// A failed check: which one, and what it found.
type Failed = (&'static str, String);

/// The root's bytes against a foreign key (a keyed root must not verify
/// under one) and against its own re-encoding (byte-identical; a keyed root
/// checked without its key is compared without its MAC trailer and flag).
fn check_encoding(
    decoded: &DecodedRoot,
    raw: &[u8],
    keyed: bool,
    mac: Option<&[u8; 32]>,
) -> std::result::Result<(), Failed> {
    if keyed && mac.is_some() {
        let other = root::mac_key(OTHER_KEY);
        if !matches!(
            root::decode(raw, Some(&other)),
            Err(deltapack_format::Error::Unauthenticated(_))
        ) {
            return Err((
                "mac",
                "the root verifies under a key that is not the store's".into(),
            ));
        }
    }
    let again = root::encode(decoded, mac).map_err(|e| ("reencode", e.to_string()))?;
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
        return Err((
            "reencode",
            "the decoded root re-encodes to other bytes".into(),
        ));
    }
    Ok(())
}

/// Restores the root through `store` and checks the result against what
/// the root records: digest (recomputed here by the root's own definition),
/// length and schema. The inner error is the failed check, its finding and
/// the object a miss names.
async fn restore_bit_exactly(
    store: &Store,
    ns: Namespace,
    ctx: ContextDigest,
    summary: &RootSummary,
) -> Result<std::result::Result<Arc<Snapshot>, (&'static str, String, Option<String>)>> {
    let want = summary.result_snapshot_digest;
    let hit = match store.restore((ns, ctx), Default::default()).await? {
        RestoreOutcome::Hit(hit) => hit,
        RestoreOutcome::Miss(m) => {
            return Ok(Err((
                "restore",
                m.to_string(),
                m.object().map(ToString::to_string),
            )))
        }
    };
    // By the root's own definition: BLAKE3 of the encoding, or the layered
    // digest of a v2.2 root.
    let found = {
        let s = hit.snapshot.clone();
        tokio::task::spawn_blocking(move || deltapack_format::layer_digest::digest_like(&s, &want))
            .await??
    };
    let failed = if hit.digest != want || found != want {
        Some((
            "digest",
            format!(
                "restored {found} (reported {}), the root records {want}",
                hit.digest
            ),
        ))
    } else if hit.snapshot.encoded().len() as u64 != summary.result_snapshot_len {
        Some((
            "digest",
            format!(
                "restored {} bytes, the root records {}",
                hit.snapshot.encoded().len(),
                summary.result_snapshot_len
            ),
        ))
    } else if hit.schema != summary.schema {
        Some((
            "restore",
            format!("restored as {}, decoded as {}", hit.schema, summary.schema),
        ))
    } else {
        None
    };
    Ok(match failed {
        Some((check, detail)) => Err((check, detail, None)),
        None => Ok(hit.snapshot),
    })
}

/// Every root of the store, sorted.
pub(super) async fn list_roots(store: &Store) -> Result<Vec<(Namespace, ContextDigest)>> {
    Ok(store.list_roots(None).await?)
}

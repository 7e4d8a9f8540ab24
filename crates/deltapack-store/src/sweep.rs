//! The integrity sweep: verify what roots reference, reclaim what nothing
//! references.
//!
//! 1. Read every root (corrupt roots are quarantined by `read_root`).
//! 2. Collect every object a readable root references, with what is needed
//!    to verify it on its own: v2 extents by their BLAKE3 subtree name (zstd:
//!    stored digest first, then bounded decompression), v1 chunks by SHA-256.
//! 3. List the objects. A referenced object that is absent is *missing*; one
//!    that fails verification is *corrupt* and is quarantined. Every root
//!    referencing a missing or corrupt object is invalidated (its root object
//!    is moved to quarantine), and so — transitively — is every delta whose
//!    base was invalidated, so no delta outlives its base.
//! 4. Objects referenced by no root whose last modification is older than
//!    the grace period are deleted (two-phase deletion relies on that grace:
//!    a publisher on another process may be about to reference a fresh
//!    object); on local disk, staging files older than the grace are removed.
//!
//! The sweep can be budgeted: `subset = (n, m)` verifies only objects whose
//! first digest byte is ≡ n (mod m) — m runs with n = 0..m cover everything —
//! and `bytes_per_second` paces verification. `dry_run` reports without
//! changing anything.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime};

use deltapack_format::{ContextDigest, DecodedRoot, Digest, ExtentPlan, Namespace};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use serde::Serialize;

use crate::backend::{self, BackendKind};
use crate::error::{Result, StoreError};
use crate::keys;
use crate::store::{RootStatus, Store};

/// Staging files younger than this are never removed, whatever the grace:
/// a writer (in this or another process) may be about to link one into
/// place. Writers touch their staging file continuously while writing, so
/// one untouched for this long is abandoned.
pub const STAGING_MIN_AGE: Duration = Duration::from_secs(2);

/// Options of a sweep.
#[derive(Debug, Clone, Default)]
pub struct SweepOptions {
    /// Unreferenced objects (and staging files) younger than this are kept.
    pub grace: Duration,
    /// Verify only objects whose first digest byte ≡ n (mod m).
    pub subset: Option<(u8, u8)>,
    /// Pace verification to at most this many bytes per second.
    pub bytes_per_second: Option<u64>,
    /// Report what would be done without doing it.
    pub dry_run: bool,
}

/// What a sweep found and did.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct SweepReport {
    /// Roots read.
    pub roots: u64,
    /// Roots that could not be used (corrupt, incompatible, unauthenticated).
    pub unusable_roots: Vec<String>,
    /// Objects verified.
    pub checked: u64,
    /// Bytes verified.
    pub checked_bytes: u64,
    /// Corrupt objects (keys).
    pub corrupt: Vec<String>,
    /// Referenced objects that do not exist (keys).
    pub missing: Vec<String>,
    /// Objects and roots moved to quarantine.
    pub quarantined: u64,
    /// Roots invalidated because something they need is gone or damaged.
    pub invalidated_roots: Vec<String>,
    /// Unreferenced objects deleted.
    pub orphans_deleted: u64,
    /// Unreferenced objects kept because they are younger than the grace.
    pub orphans_in_grace: u64,
    /// Bytes reclaimed by deleting orphans.
    pub reclaimed_bytes: u64,
    /// Staging files removed (local disk).
    pub staging_removed: u64,
    /// Whether this was a dry run.
    pub dry_run: bool,
}

/// Length of the base chain above a root (0 for a snapshot root).
fn depth_of(
    r: &(Namespace, ContextDigest),
    bases: &BTreeMap<(Namespace, ContextDigest), (Namespace, ContextDigest)>,
) -> usize {
    let mut d = 0;
    let mut cur = *r;
    while let Some(b) = bases.get(&cur) {
        d += 1;
        cur = *b;
        if d > 64 {
            break;
        }
    }
    d
}

/// How to verify one object on its own.
#[derive(Debug, Clone)]
enum Check {
    V2 {
        plan: ExtentPlan,
        index: u64,
        entry: deltapack_format::ExtentEntry,
    },
    V1 {
        digest: Digest,
    },
}

struct Referenced {
    stored_len: u64,
    check: Check,
    roots: BTreeSet<(Namespace, ContextDigest)>,
}

impl Store {
    /// Runs an integrity sweep (see the module docs).
    pub async fn sweep(&self, opts: &SweepOptions) -> Result<SweepReport> {
        let mut report = SweepReport {
            dry_run: opts.dry_run,
            ..Default::default()
        };
        let quarantined_before = self.stats().quarantined;

        // 1–2. Roots and what they reference.
        let mut refs: HashMap<Path, Referenced> = HashMap::new();
        let mut bases: BTreeMap<(Namespace, ContextDigest), (Namespace, ContextDigest)> =
            BTreeMap::new();
        let mut live: BTreeSet<(Namespace, ContextDigest)> = BTreeSet::new();
        for (ns, ctx) in self.list_roots(None).await? {
            report.roots += 1;
            let root = match self.read_root_for_sweep(&ns, &ctx, opts.dry_run).await? {
                RootStatus::Found(r) => *r,
                RootStatus::Absent => continue,
                RootStatus::Unusable(reason) => {
                    report
                        .unusable_roots
                        .push(format!("{}: {reason}", keys::root_key(&ns, &ctx)));
                    continue;
                }
            };
            live.insert((ns, ctx));
            let mut add = |key: Path, stored_len: u64, check: Check| {
                refs.entry(key)
                    .or_insert_with(|| Referenced {
                        stored_len,
                        check,
                        roots: BTreeSet::new(),
                    })
                    .roots
                    .insert((ns, ctx));
            };
            match &root {
                DecodedRoot::V2(m) => {
                    let plan = ExtentPlan::new(m.payload_len, m.max_extent_bytes)?;
                    for (i, e) in m.extents.iter().enumerate() {
                        add(
                            keys::object_key(&e.object_digest()),
                            e.stored_len,
                            Check::V2 {
                                plan,
                                index: i as u64,
                                entry: *e,
                            },
                        );
                    }
                    if let Some(b) = m.base {
                        bases.insert((ns, ctx), (b.namespace, b.context));
                    }
                }
                DecodedRoot::V1(m) => {
                    for c in &m.chunks {
                        add(
                            keys::object_key(&c.digest),
                            c.bytes,
                            Check::V1 { digest: c.digest },
                        );
                    }
                    if let Some(b) = m.base {
                        bases.insert((ns, ctx), (b.namespace, b.context));
                    }
                }
                DecodedRoot::Incompatible { .. } => {}
            }
        }

        // 3. Objects: verify referenced ones, note orphans.
        let listed: Vec<object_store::ObjectMeta> = self
            .object_store()
            .list(Some(&Path::from(keys::OBJECTS)))
            .try_collect()
            .await
            .map_err(|e| StoreError::io(&Path::from(keys::OBJECTS), e))?;
        let present: HashMap<Path, &object_store::ObjectMeta> =
            listed.iter().map(|m| (m.location.clone(), m)).collect();
        let mut bad_roots: BTreeSet<(Namespace, ContextDigest)> = BTreeSet::new();
        let started = Instant::now();
        let mut keys_sorted: Vec<&Path> = refs.keys().collect();
        keys_sorted.sort();
        for key in keys_sorted {
            let r = &refs[key];
            if !present.contains_key(key) {
                report.missing.push(key.to_string());
                bad_roots.extend(r.roots.iter().copied());
                continue;
            }
            if let (Some((n, m)), Some(d)) = (opts.subset, keys::parse_object_key(key)) {
                if m > 0 && d.as_bytes()[0] % m != n % m {
                    continue;
                }
            }
            let ok = self.verify_object(key, r).await?;
            report.checked += 1;
            report.checked_bytes += r.stored_len;
            if !ok {
                report.corrupt.push(key.to_string());
                bad_roots.extend(r.roots.iter().copied());
                if !opts.dry_run {
                    self.quarantine(key).await;
                }
            }
            if let Some(rate) = opts.bytes_per_second.filter(|r| *r > 0) {
                let due = Duration::from_secs_f64(report.checked_bytes as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
        }

        // Invalidate damaged roots and, transitively, deltas over them. The
        // listing may be stale by now (another writer may have re-published
        // a context or rewritten an object), so each root with damage of its
        // own is re-checked just before it is invalidated, and a delta is
        // invalidated only if its base was, or its base root is gone now.
        let mut confirmed: BTreeSet<(Namespace, ContextDigest)> = BTreeSet::new();
        for (ns, ctx) in &bad_roots {
            if opts.dry_run || !self.root_now_intact(ns, ctx).await? {
                confirmed.insert((*ns, *ctx));
            }
        }
        let mut changed = true;
        while changed {
            changed = false;
            for (child, base) in &bases {
                if !live.contains(child) || confirmed.contains(child) {
                    continue;
                }
                let base_gone = confirmed.contains(base)
                    || (!live.contains(base)
                        && (opts.dry_run
                            || !matches!(
                                self.peek_root(&base.0, &base.1).await?,
                                RootStatus::Found(_)
                            )));
                if base_gone {
                    confirmed.insert(*child);
                    changed = true;
                }
            }
        }
        // Dependents first, so no delta is ever left without its base.
        let mut order: Vec<_> = confirmed.iter().copied().collect();
        order.sort_by_key(|r| std::cmp::Reverse(depth_of(r, &bases)));
        for (ns, ctx) in &order {
            let key = keys::root_key(ns, ctx);
            report.invalidated_roots.push(key.to_string());
            if !opts.dry_run {
                self.quarantine(&key).await;
                if let Err(e) = self
                    .ledger()
                    .await?
                    .remove_root(ns, ctx, crate::ledger::now_ms())
                {
                    tracing::warn!(error = %e, "ledger update failed during sweep (it will rebuild at next open)");
                }
            }
        }

        // The ledger may still list roots removed behind its back (another
        // tool, a lost update). Forget those that are gone *now* — a root
        // recorded after this sweep's listing still exists and is kept — so
        // their objects become collectable.
        let mut ledger_degraded = false;
        // On a full local disk the ledger may not even open (a rebuild
        // needs space): reclaim by the listing's view, which is what frees
        // the space the ledger needs.
        let ledger = if opts.dry_run {
            None
        } else {
            match self.ledger().await {
                Ok(l) => Some(l),
                Err(e @ StoreError::Capacity(_))
                    if matches!(self.backend_kind(), BackendKind::Local { .. }) =>
                {
                    tracing::warn!(error = %e, "ledger unavailable on a full disk; deleting orphans by listing");
                    ledger_degraded = true;
                    None
                }
                Err(e) => return Err(e),
            }
        };
        if let Some(ledger) = ledger {
            for row in ledger.roots_lru()? {
                let k = (row.namespace, row.context);
                if live.contains(&k) || confirmed.contains(&k) {
                    continue;
                }
                let key = keys::root_key(&k.0, &k.1);
                if let Err(object_store::Error::NotFound { .. }) =
                    self.object_store().head(&key).await
                {
                    if let Err(e) = ledger.remove_root(&k.0, &k.1, crate::ledger::now_ms()) {
                        // Typically a full disk: reclaim space from the
                        // listing's view first; the ledger is rebuilt after.
                        tracing::warn!(error = %e, "ledger update failed during sweep; deleting orphans by listing");
                        ledger_degraded = true;
                        break;
                    }
                }
            }
        }

        // 4. Orphans past the grace period, and old staging files.
        let now = SystemTime::now();
        for meta in &listed {
            if refs.contains_key(&meta.location) {
                continue;
            }
            let age = now
                .duration_since(meta.last_modified.into())
                .unwrap_or(Duration::ZERO);
            if age < opts.grace {
                report.orphans_in_grace += 1;
                continue;
            }
            if !opts.dry_run {
                // Re-check against the ledger at deletion time: a root
                // recorded after this sweep listed the roots, or a
                // publication in progress, may use the object by now.
                let deleted = match (self.backend_kind(), ledger) {
                    (BackendKind::Local { root }, _) if ledger_degraded => {
                        match std::fs::remove_file(root.join(meta.location.as_ref())) {
                            Ok(()) => true,
                            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                        }
                    }
                    (BackendKind::Local { root }, Some(ledger)) => {
                        let root = root.clone();
                        let rm = |k: &str| match std::fs::remove_file(root.join(k)) {
                            Ok(()) => true,
                            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                        };
                        match ledger.delete_if_unused(meta.location.as_ref(), rm) {
                            Ok(d) => d,
                            Err(e) => {
                                // The ledger cannot be written (full disk):
                                // reclaim by the listing's view.
                                tracing::warn!(error = %e, "ledger unavailable; deleting orphan by listing");
                                ledger_degraded = true;
                                rm(meta.location.as_ref())
                            }
                        }
                    }
                    (_, None) => {
                        return Err(StoreError::Internal(
                            "sweep without a ledger outside degraded mode".into(),
                        ))
                    }
                    (_, Some(ledger)) => {
                        if ledger.is_used(meta.location.as_ref())? {
                            false
                        } else {
                            match self.object_store().delete(&meta.location).await {
                                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                                Err(e) => return Err(StoreError::io(&meta.location, e)),
                            }
                            let _ = ledger.forget_object(meta.location.as_ref());
                            true
                        }
                    }
                };
                if !deleted {
                    report.orphans_in_grace += 1;
                    continue;
                }
                if let (true, Some(ledger)) = (ledger_degraded, ledger) {
                    let _ = ledger.forget_object(meta.location.as_ref());
                }
            }
            report.orphans_deleted += 1;
            report.reclaimed_bytes += meta.size;
        }
        if let BackendKind::Local { root } = self.backend_kind() {
            if !opts.dry_run {
                report.staging_removed = backend::remove_staging_files(
                    root,
                    opts.grace.max(STAGING_MIN_AGE),
                )
                .map_err(|e| {
                    StoreError::Invalid(format!("staging cleanup in {}: {e}", root.display()))
                })? as u64;
            }
        }
        if ledger_degraded {
            // Not rebuilt here: on a full disk a rebuild's journal would eat
            // the space just reclaimed. The next open sees the root count
            // disagree and rebuilds.
            tracing::warn!(
                "ledger is behind the store after a degraded sweep; it will rebuild at next open"
            );
        }
        report.quarantined = self.stats().quarantined - quarantined_before;
        tracing::info!(
            roots = report.roots,
            checked = report.checked,
            corrupt = report.corrupt.len(),
            missing = report.missing.len(),
            orphans_deleted = report.orphans_deleted,
            "sweep finished"
        );
        Ok(report)
    }

    /// Whether the root at `(ns, ctx)` is, right now, readable with every
    /// object it references present at its recorded size.
    async fn root_now_intact(&self, ns: &Namespace, ctx: &ContextDigest) -> Result<bool> {
        let RootStatus::Found(r) = self.peek_root(ns, ctx).await? else {
            return Ok(false);
        };
        let Some(s) = r.summary() else {
            return Ok(false);
        };
        for (d, len) in &s.objects {
            match self.object_store().head(&keys::object_key(d)).await {
                Ok(m) if m.size == *len => {}
                _ => return Ok(false),
            }
        }
        // Present is not verified: a corrupt object found by this sweep was
        // quarantined, so it is absent here.
        Ok(true)
    }

    async fn read_root_for_sweep(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        dry_run: bool,
    ) -> Result<RootStatus> {
        if dry_run {
            self.peek_root(ns, ctx).await
        } else {
            self.read_root(ns, ctx).await
        }
    }

    /// Whether `key` is what the roots referencing it say. Quarantine needs
    /// proof: a failed check is read and checked once more (damage in
    /// transit is not damage at rest), and a read error is retried once,
    /// then reported as an error — never as corruption.
    async fn verify_object(&self, key: &Path, r: &Referenced) -> Result<bool> {
        match self.verify_object_once(key, r).await {
            Ok(true) => Ok(true),
            Ok(false) | Err(StoreError::Io { .. }) => {
                tracing::warn!(%key, "object failed a check or a read; reading it once more");
                self.verify_object_once(key, r).await
            }
            Err(e) => Err(e),
        }
    }

    async fn verify_object_once(&self, key: &Path, r: &Referenced) -> Result<bool> {
        let bytes = match self.fetch_exact(key, r.stored_len).await {
            Ok(b) => b,
            Err(f) => return f.into_error().map(|_| false),
        };
        let check = r.check.clone();
        tokio::task::spawn_blocking(move || match check {
            Check::V1 { digest } => Digest::sha256(&bytes) == digest,
            Check::V2 { plan, index, entry } => {
                crate::restore::reassembly::verify_extent(&plan, index, &entry, bytes).is_ok()
            }
        })
        .await
        .map_err(|e| StoreError::task("verify", e))
    }
}

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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use bytes::Bytes;
use std::time::{Duration, Instant, SystemTime};

use deltapack_format::{ContextDigest, DecodedRoot, Namespace};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use serde::Serialize;

use crate::backend::{self, BackendKind};
use crate::base_graph::{BaseGraph, RootId};
use crate::error::{Result, StoreError};
use crate::fault::{FaultKind, ObjectFault, Proof};
use crate::keys;
use crate::ledger::{Claimant, Ledger};
use crate::store::{RootStatus, Store};
use crate::verify::{check_object, Expected};

/// Staging files younger than this are never removed, whatever the grace:
/// a writer (in this or another process) may be about to link one into
/// place. Writers touch their staging file continuously while writing, so
/// one untouched for this long is abandoned.
pub(crate) const STAGING_MIN_AGE: Duration = Duration::from_secs(2);

/// Options of a sweep.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
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
#[non_exhaustive]
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

/// What the sweep concluded about one object.
enum Verdict {
    /// It verifies.
    Intact,
    /// It failed its check twice (proven; quarantined).
    Corrupt,
    /// It vanished since the listing.
    Missing,
    /// Neither verified nor proven corrupt (one bad read among others).
    Unproven,
}

struct Referenced {
    want: Expected,
    roots: BTreeSet<RootId>,
}

/// What the readable roots reference (steps 1–2).
#[derive(Default)]
struct References {
    /// Every referenced object, with how to verify it and who uses it.
    objects: HashMap<Path, Referenced>,
    /// Delta roots and their bases.
    graph: BaseGraph,
    /// Roots read successfully, with the bytes read (an invalidation acts
    /// only on a root that still holds them).
    live: BTreeMap<RootId, Bytes>,
}

/// The ledger as the sweep can use it: absent on a dry run, and "degraded"
/// once it cannot be written (a full disk), when orphans are reclaimed by
/// the listing's view alone.
struct LedgerUse<'a> {
    ledger: Option<&'a Ledger>,
    degraded: bool,
}

impl Store {
    /// Runs an integrity sweep (see the module docs), in its named steps.
    #[tracing::instrument(level = "info", name = "sweep", skip_all, fields(
        dry_run = opts.dry_run,
        roots = tracing::field::Empty,
        checked = tracing::field::Empty,
        corrupt = tracing::field::Empty,
        missing = tracing::field::Empty,
        orphans_deleted = tracing::field::Empty,
    ))]
    pub async fn sweep(&self, opts: &SweepOptions) -> Result<SweepReport> {
        let mut report = SweepReport {
            dry_run: opts.dry_run,
            ..Default::default()
        };
        // Its moves (quarantine, invalidation, reclaim) are deletions: only
        // the store's own ledger may make them. A dry run verifies from any.
        if !opts.dry_run {
            self.require_owner("sweep").await?;
        }
        let quarantined_before = self.stats().quarantined;
        let refs = self.sweep_read_roots(opts, &mut report).await?;
        let listed = self.sweep_list_objects().await?;
        let damaged = self
            .sweep_verify_objects(opts, &refs, &listed, &mut report)
            .await?;
        let invalidated = self
            .sweep_invalidate(opts, &refs, damaged, &mut report)
            .await?;
        let mut ledger = self
            .sweep_forget_vanished(opts, &refs, &invalidated)
            .await?;
        // Ownership is checked again before the orphans are reclaimed and
        // at least every second while they are: an adoption during a long
        // reclaim stops it within a second (the adoption's fence covers
        // that second).
        let mut fence = if opts.dry_run {
            None
        } else {
            Some(crate::ownership::OwnerFence::start(self, "sweep").await?)
        };
        self.sweep_reclaim_orphans(opts, &refs, &listed, &mut ledger, &mut fence, &mut report)
            .await?;
        self.sweep_remove_staging(opts, &mut report)?;
        if ledger.degraded {
            // Not rebuilt here: on a full disk a rebuild's journal would eat
            // the space just reclaimed. The next open reconciles it in the
            // background (and `ledger rebuild` rebuilds it).
            tracing::warn!(
                "ledger is behind the store after a degraded sweep; it is reconciled at next open"
            );
        }
        report.quarantined = self.stats().quarantined - quarantined_before;
        tracing::Span::current()
            .record("roots", report.roots)
            .record("checked", report.checked)
            .record("corrupt", report.corrupt.len())
            .record("missing", report.missing.len())
            .record("orphans_deleted", report.orphans_deleted);
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

    /// Steps 1–2: read every root (damaged ones are quarantined by
    /// `read_root`) and collect what each readable root references.
    async fn sweep_read_roots(
        &self,
        opts: &SweepOptions,
        report: &mut SweepReport,
    ) -> Result<References> {
        let mut refs = References::default();
        for (ns, ctx) in self.list_roots(None).await? {
            report.roots += 1;
            let (root, bytes) = match self.read_root_bytes(&ns, &ctx, !opts.dry_run).await? {
                (RootStatus::Found(r), Some(b)) => (*r, b),
                (RootStatus::Found(_), None) | (RootStatus::Absent, _) => continue,
                (RootStatus::Unusable(reason), _) => {
                    report
                        .unusable_roots
                        .push(format!("{}: {reason}", keys::root_key(&ns, &ctx)));
                    continue;
                }
            };
            refs.live.insert((ns, ctx), bytes);
            let objects = &mut refs.objects;
            for want in Expected::of_root(&root)? {
                objects
                    .entry(want.object().path())
                    .or_insert_with(|| Referenced {
                        want,
                        roots: BTreeSet::new(),
                    })
                    .roots
                    .insert((ns, ctx));
            }
            let base = match &root {
                DecodedRoot::V2(m) => m.base,
                DecodedRoot::V1(m) => m.base,
                DecodedRoot::Incompatible { .. } => None,
            };
            if let Some(b) = base {
                refs.graph.link((ns, ctx), (b.namespace, b.context));
            }
        }
        Ok(refs)
    }

    /// Every object in the store.
    async fn sweep_list_objects(&self) -> Result<Vec<object_store::ObjectMeta>> {
        self.list_all(&Path::from(keys::OBJECTS)).await
    }

    /// Step 3: every referenced object (of the chosen subset) is present and
    /// verifies; a corrupt one is quarantined. Returns the roots that
    /// reference a missing or corrupt object.
    async fn sweep_verify_objects(
        &self,
        opts: &SweepOptions,
        refs: &References,
        listed: &[object_store::ObjectMeta],
        report: &mut SweepReport,
    ) -> Result<BTreeSet<RootId>> {
        let present: HashSet<&Path> = listed.iter().map(|m| &m.location).collect();
        let mut damaged = BTreeSet::new();
        let started = Instant::now();
        let mut keys_sorted: Vec<&Path> = refs.objects.keys().collect();
        keys_sorted.sort();
        for key in keys_sorted {
            let r = &refs.objects[key];
            if !present.contains(key) {
                report.missing.push(key.to_string());
                damaged.extend(r.roots.iter().copied());
                continue;
            }
            if let (Some((n, m)), Some(d)) = (opts.subset, keys::parse_object_key(key)) {
                if m > 0 && d.as_bytes()[0] % m != n % m {
                    continue;
                }
            }
            let verdict = self.verify_object(key, r).await?;
            report.checked += 1;
            report.checked_bytes += r.want.stored_len();
            match verdict {
                Verdict::Intact => {}
                Verdict::Corrupt => {
                    report.corrupt.push(key.to_string());
                    damaged.extend(r.roots.iter().copied());
                    if !opts.dry_run {
                        self.quarantine(key).await;
                    }
                }
                // Gone since the listing (collected, or quarantined by a
                // restore): its roots are re-checked before invalidation.
                Verdict::Missing => {
                    report.missing.push(key.to_string());
                    damaged.extend(r.roots.iter().copied());
                }
                Verdict::Unproven => {
                    tracing::warn!(%key, "object could not be judged; left in place");
                }
            }
            if let Some(rate) = opts.bytes_per_second.filter(|r| *r > 0) {
                let due = Duration::from_secs_f64(report.checked_bytes as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
        }
        Ok(damaged)
    }

    /// Step 3, continued: invalidate damaged roots and, transitively, every
    /// delta over them (dependents first, so no delta is ever left without
    /// its base). The listing may be stale by now (another writer may have
    /// re-published a context or rewritten an object), so a root with
    /// damage of its own is re-checked just before it is invalidated, and a
    /// delta whose base was not read by this sweep is invalidated only if
    /// that base is gone now. Returns the invalidated roots.
    async fn sweep_invalidate(
        &self,
        opts: &SweepOptions,
        refs: &References,
        damaged: BTreeSet<RootId>,
        report: &mut SweepReport,
    ) -> Result<BTreeSet<RootId>> {
        // The whole phase holds the root lock (local disk): no root is
        // created, replaced or removed by anyone while the sweep re-judges
        // and moves them, so a root republished at the last moment — even
        // byte-identical — is seen complete, never judged by a stale read.
        // The ledger is opened first: opening it may rebuild it, which takes
        // the root lock itself (the lock is not reentrant).
        let (ledger, _lock) = if opts.dry_run {
            (None, None)
        } else {
            let ledger = self.ledger().await?;
            (Some(ledger), self.root_lock().await?)
        };
        let mut seeds = Vec::new();
        for (ns, ctx) in &damaged {
            if opts.dry_run || !self.root_now_intact(ns, ctx).await? {
                seeds.push((*ns, *ctx));
            }
        }
        for (child, base) in refs.graph.links() {
            if refs.live.contains_key(child) && !refs.live.contains_key(base) {
                let gone = opts.dry_run
                    || !matches!(
                        self.peek_root(&base.0, &base.1).await?,
                        RootStatus::Found(_)
                    );
                if gone {
                    seeds.push(*child);
                }
            }
        }
        let order: Vec<RootId> = refs
            .graph
            .with_dependents(seeds)
            .into_iter()
            .filter(|r| refs.live.contains_key(r))
            .collect();
        let mut invalidated = BTreeSet::new();
        for (ns, ctx) in &order {
            let key = keys::root_key(ns, ctx);
            if !opts.dry_run {
                // Only the root this sweep read: one removed or republished
                // with other bytes since is left alone (the next sweep
                // judges it afresh).
                let read = refs
                    .live
                    .get(&(*ns, *ctx))
                    .map(|b| b.as_ref())
                    .unwrap_or(&[]);
                if !self.quarantine_root_locked(&key, read).await? {
                    continue;
                }
                let removed = match ledger {
                    Some(l) => {
                        let (ns, ctx) = (*ns, *ctx);
                        l.run(move |l| l.remove_root(&ns, &ctx, crate::ledger::now_ms()))
                            .await
                    }
                    None => Ok(Vec::new()),
                };
                if let Err(e) = removed {
                    tracing::warn!(error = %e, "ledger update failed during sweep (it will rebuild at next open)");
                }
            }
            report.invalidated_roots.push(key.to_string());
            invalidated.insert((*ns, *ctx));
        }
        Ok(invalidated)
    }

    /// The ledger may still list roots removed behind its back (another
    /// tool, a lost update). Forget those that are gone *now* — a root
    /// recorded after this sweep's listing still exists and is kept — so
    /// their objects become collectable. On a full local disk the ledger
    /// may not even open (a rebuild needs space): the sweep then reclaims
    /// by the listing's view, which is what frees the space the ledger
    /// needs.
    async fn sweep_forget_vanished(
        &self,
        opts: &SweepOptions,
        refs: &References,
        invalidated: &BTreeSet<RootId>,
    ) -> Result<LedgerUse<'_>> {
        if opts.dry_run {
            return Ok(LedgerUse {
                ledger: None,
                degraded: false,
            });
        }
        let ledger = match self.ledger().await {
            Ok(l) => l,
            Err(e @ StoreError::Capacity(_))
                if matches!(self.backend_kind(), BackendKind::Local { .. }) =>
            {
                tracing::warn!(error = %e, "ledger unavailable on a full disk; deleting orphans by listing");
                return Ok(LedgerUse {
                    ledger: None,
                    degraded: true,
                });
            }
            Err(e) => return Err(e),
        };
        let mut degraded = false;
        // Reconcile first (one more listing, GETs only for roots the
        // ledger does not know): a root written by a process that died
        // before recording it is recorded, so its objects are never taken
        // for orphans by a collector that trusts the ledger.
        if let Err(e) = self.reconcile_into(ledger, false).await {
            tracing::warn!(error = %e, "ledger reconciliation failed during sweep");
            degraded = matches!(e, StoreError::Ledger(_));
        }
        for row in self.lru_rows(ledger).await? {
            let k = (row.namespace, row.context);
            if refs.live.contains_key(&k) || invalidated.contains(&k) {
                continue;
            }
            let key = keys::root_key(&k.0, &k.1);
            if let Err(object_store::Error::NotFound { .. }) = self.object_store().head(&key).await
            {
                if let Err(e) = ledger
                    .run(move |l| l.remove_root(&k.0, &k.1, crate::ledger::now_ms()))
                    .await
                {
                    // Typically a full disk: reclaim space from the
                    // listing's view first; the ledger is rebuilt after.
                    tracing::warn!(error = %e, "ledger update failed during sweep; deleting orphans by listing");
                    degraded = true;
                    break;
                }
            }
        }
        Ok(LedgerUse {
            ledger: Some(ledger),
            degraded,
        })
    }

    /// Step 4: delete objects no root references once they are older than
    /// the grace period, each re-checked against the ledger at deletion
    /// time (a root recorded after this sweep listed the roots, or a
    /// publication in progress, may use the object by now).
    async fn sweep_reclaim_orphans(
        &self,
        opts: &SweepOptions,
        refs: &References,
        listed: &[object_store::ObjectMeta],
        lu: &mut LedgerUse<'_>,
        fence: &mut Option<crate::ownership::OwnerFence>,
        report: &mut SweepReport,
    ) -> Result<()> {
        let now = SystemTime::now();
        // One collector identity for the whole reclaim: its heartbeat keeps
        // every orphan claim it holds fresh.
        let mut claimant = lu.ledger.map(Claimant::new).transpose()?;
        for meta in listed {
            if refs.objects.contains_key(&meta.location) {
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
                if let Some(f) = fence.as_mut() {
                    f.check(self).await?;
                }
                if !self.delete_orphan(meta, lu, claimant.as_mut()).await? {
                    report.orphans_in_grace += 1;
                    continue;
                }
                if let (true, Some(ledger)) = (lu.degraded, lu.ledger) {
                    let key = meta.location.to_string();
                    let _ = ledger.run(move |l| l.forget_object(&key)).await;
                }
            }
            report.orphans_deleted += 1;
            report.reclaimed_bytes += meta.size;
        }
        Ok(())
    }

    /// Deletes one orphan unless the ledger says it is in use now. Returns
    /// whether it is gone.
    async fn delete_orphan(
        &self,
        meta: &object_store::ObjectMeta,
        lu: &mut LedgerUse<'_>,
        claimant: Option<&mut Claimant>,
    ) -> Result<bool> {
        Ok(match (self.backend_kind(), lu.ledger) {
            (BackendKind::Local { root }, _) if lu.degraded => {
                match std::fs::remove_file(root.join(meta.location.as_ref())) {
                    Ok(()) => true,
                    Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                }
            }
            (BackendKind::Local { root }, Some(ledger)) => {
                let root = root.clone();
                let rm = move |k: &str| match std::fs::remove_file(root.join(k)) {
                    Ok(()) => true,
                    Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                };
                let (key, rm2) = (meta.location.to_string(), rm.clone());
                match ledger.run(move |l| l.delete_if_unused(&key, rm2)).await {
                    Ok(d) => d,
                    Err(e) => {
                        // The ledger cannot be written (full disk):
                        // reclaim by the listing's view.
                        tracing::warn!(error = %e, "ledger unavailable; deleting orphan by listing");
                        lu.degraded = true;
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
                let Some(claimant) = claimant else {
                    return Err(StoreError::Internal(
                        "orphan reclaim without a claimant".into(),
                    ));
                };
                let (key, id, began) = (meta.location.to_string(), claimant.id(), Instant::now());
                let mine = ledger.run(move |l| l.claim_orphan(&key, id)).await?;
                claimant.claimed(began);
                if !mine {
                    false
                } else {
                    crate::failpoint::reached("sweep.claimed");
                    let res = crate::gc::delete_claimed(
                        self.object_store().as_ref(),
                        claimant,
                        &meta.location,
                    )
                    .await;
                    if res.is_ok() {
                        crate::failpoint::reached("sweep.deleted");
                    }
                    let deleted = matches!(res, Ok(Ok(())));
                    let key = meta.location.to_string();
                    let _ = ledger.run(move |l| l.finish_delete(&key, deleted)).await;
                    match res? {
                        Ok(()) => true,
                        Err(e) => return Err(StoreError::io(&meta.location, e)),
                    }
                }
            }
        })
    }

    /// Step 4, local disk: staging files abandoned by crashed writers.
    fn sweep_remove_staging(&self, opts: &SweepOptions, report: &mut SweepReport) -> Result<()> {
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
        Ok(())
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

    /// Whether `key` is what the roots referencing it say, by the
    /// quarantine rule: a failed check or read is read again, and the
    /// object is corrupt only if it fails its check twice. A read that
    /// keeps failing is an error, never a quarantine.
    async fn verify_object(&self, key: &Path, r: &Referenced) -> Result<Verdict> {
        let mut proof = Proof::default();
        loop {
            let fault = match self.verify_object_once(key, r).await? {
                Ok(()) => return Ok(Verdict::Intact),
                Err(f) => f,
            };
            tracing::warn!(%key, what = %fault.what, "object failed a check or a read");
            let Some(f) = proof.record(fault) else {
                continue;
            };
            return match f.kind {
                FaultKind::Corrupt if f.key.is_some() => Ok(Verdict::Corrupt),
                FaultKind::Missing => Ok(Verdict::Missing),
                FaultKind::Io(e) => Err(*e),
                FaultKind::Corrupt | FaultKind::Deadline => Ok(Verdict::Unproven),
            };
        }
    }

    /// One read and check of `key`; `Err` only for an internal failure.
    async fn verify_object_once(
        &self,
        key: &Path,
        r: &Referenced,
    ) -> Result<std::result::Result<(), ObjectFault>> {
        let bytes = match self.fetch_exact(key, r.want.stored_len()).await {
            Ok(b) => b,
            Err(f) => return Ok(Err(f)),
        };
        let want = r.want.clone();
        let checked = tokio::task::spawn_blocking(move || check_object(&want, bytes).err())
            .await
            .map_err(|e| StoreError::task("verify", e))?;
        Ok(match checked {
            None => Ok(()),
            Some(c) => {
                // The sweep's proof rule counts two failed checks of the
                // same object, whatever bytes each read saw.
                let mut f = ObjectFault::of(key, FaultKind::Corrupt, "does not match its name");
                f.check = Some(Box::new(c));
                Err(f)
            }
        })
    }
}

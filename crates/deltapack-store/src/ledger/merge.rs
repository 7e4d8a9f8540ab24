//! Rebuilds and reconciliations: merging a listing of the store into the
//! ledger, and the comparable image of a ledger.
//!
//! A merge never forgets a row recorded after the listing began and never
//! revives a root removed after it (tombstones).

use std::time::Duration;

use deltapack_format::{ContextDigest, Namespace};
use serde::Serialize;

use super::db::{Db, V};
use super::error::LedgerError;
use super::handle::Ledger;
use super::roots::{hexpair, record_in, RootEntry};

/// One root of a [`LedgerImage`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ImageRoot {
    /// Namespace (hex).
    pub namespace: String,
    /// Context (hex).
    pub context: String,
    /// Root schema.
    pub schema: String,
    /// `snapshot` or `delta`.
    pub kind: String,
    /// Result boundary in tokens.
    pub boundary: u64,
    /// Base `(namespace, context)` (hex), for a delta.
    pub base: Option<(String, String)>,
    /// Size of the root object.
    pub root_bytes: u64,
    /// Keys of the objects it references, sorted.
    pub objects: Vec<String>,
}

/// One object of a [`LedgerImage`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ImageObject {
    /// Object key.
    pub key: String,
    /// Stored bytes.
    pub bytes: u64,
    /// Roots referencing it.
    pub refs: u64,
    /// Whether it is condemned (awaiting deletion).
    pub condemned: bool,
}

/// One hold of a [`LedgerImage`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ImageHold {
    /// Hold name.
    pub name: String,
    /// Namespace (hex).
    pub namespace: String,
    /// Context (hex).
    pub context: String,
}

/// The comparable content of a ledger (everything but access times).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LedgerImage {
    /// Roots with their references, sorted.
    pub roots: Vec<ImageRoot>,
    /// Objects, sorted by key.
    pub objects: Vec<ImageObject>,
    /// Holds, sorted.
    pub holds: Vec<ImageHold>,
}

/// How far the clocks of a fleet's nodes may disagree. A tombstone this
/// much older than a rebuild's listing still keeps the removed root out.
pub(crate) const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// Roots merged per transaction by [`Ledger::merge_listing`].
pub(super) const MERGE_BATCH: usize = 1000;

/// How long tombstones are kept: far longer than any rebuild runs.
pub(super) const TOMBSTONE_KEEP: Duration = Duration::from_secs(24 * 3600);

/// What a listing of the store showed, for [`Ledger::merge_listing`].
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// When the listing began (ms since the epoch).
    pub began: u64,
    /// Whether `roots` holds every listed root (a full rebuild, which also
    /// corrects recorded roots) or only the ones the ledger did not know.
    pub full: bool,
    /// Roots read from the store.
    pub roots: Vec<RootEntry>,
    /// Recorded roots the listing did not show and a HEAD after the
    /// listing found absent.
    pub vanished: Vec<(Namespace, ContextDigest)>,
    /// Hold markers listed.
    pub holds: Vec<(String, Namespace, ContextDigest)>,
    /// Objects listed: `(key, bytes, last modified ms)`.
    pub present: Vec<(String, u64, u64)>,
}

/// What a rebuild or reconciliation changed in the ledger (the merge of a
/// listing of the store).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MergeReport {
    /// Roots the ledger did not know, recorded.
    pub added: u64,
    /// Recorded roots replaced by what the store holds (full rebuild).
    pub replaced: u64,
    /// Recorded roots kept as they were (known, or recorded after the
    /// listing began).
    pub kept: u64,
    /// Listed roots not recorded because they were removed after the
    /// listing began.
    pub skipped_removed: u64,
    /// Recorded roots gone from the store, forgotten.
    pub removed: u64,
    /// Holds added from markers.
    pub holds_added: u64,
    /// Holds dropped (no marker).
    pub holds_removed: u64,
    /// Unreferenced object rows dropped (the object is gone).
    pub objects_dropped: u64,
}

impl Ledger {
    /// Merges what a listing of the store showed into the ledger (roots in
    /// transactions of [`MERGE_BATCH`], then one for the rest), losing
    /// nothing recorded meanwhile:
    ///
    /// - a listed root the ledger lacks is recorded, unless it was removed
    ///   after the listing began (a tombstone); on a full rebuild a
    ///   recorded root is replaced by what the store holds, unless it was
    ///   recorded after the listing began;
    /// - a recorded root is forgotten only if a HEAD after the listing
    ///   confirmed it absent ([`Listing::vanished`]) and it was recorded
    ///   before the listing began;
    /// - holds likewise (listed ones added unless released meanwhile,
    ///   unlisted ones dropped if placed before the listing);
    /// - listed objects the ledger lacks are added as condemned (as of
    ///   their last modification); reference counts are recounted from the
    ///   roots; unreferenced rows of objects the listing did not show are
    ///   dropped unless a publication protects them or a collector is
    ///   deleting them.
    pub(crate) fn merge_listing(
        &self,
        listing: &Listing,
        now: u64,
    ) -> Result<MergeReport, LedgerError> {
        let began = listing.began;
        let tomb_since = began.saturating_sub(CLOCK_SKEW.as_millis() as u64);
        let mut report = MergeReport::default();
        // Roots in batches, one transaction each: a fleet's writers wait
        // for one batch at a time, not for the whole rebuild. Each root's
        // rule is checked against the ledger as it is in its batch.
        for batch in listing.roots.chunks(MERGE_BATCH) {
            let r = self.write(|db| merge_roots(db, listing, batch, tomb_since))?;
            report.added += r.added;
            report.replaced += r.replaced;
            report.kept += r.kept;
            report.skipped_removed += r.skipped_removed;
        }
        let r = self.write(|db| merge_rest(db, listing, now, tomb_since))?;
        report.removed = r.removed;
        report.holds_added = r.holds_added;
        report.holds_removed = r.holds_removed;
        report.objects_dropped = r.objects_dropped;
        Ok(report)
    }

    /// The comparable content (everything but access and condemnation times).
    pub(crate) fn image(&self) -> Result<LedgerImage, LedgerError> {
        self.with(|db| {
            let mut refs: std::collections::HashMap<(String, String), Vec<String>> =
                std::collections::HashMap::new();
            for r in db.query("SELECT ns, ctx, key FROM refs", &[])? {
                refs.entry((r.text(0)?, r.text(1)?))
                    .or_default()
                    .push(r.text(2)?);
            }
            let mut roots = Vec::new();
            for r in db.query(
                "SELECT ns, ctx, schema, kind, boundary, base_ns, base_ctx, root_bytes FROM roots ORDER BY ns, ctx",
                &[],
            )? {
                let (ns, ctx) = (r.text(0)?, r.text(1)?);
                let mut keys = refs.remove(&(ns.clone(), ctx.clone())).unwrap_or_default();
                keys.sort();
                let base = r.opt_text(5)?.zip(r.opt_text(6)?);
                roots.push(ImageRoot {
                    namespace: ns,
                    context: ctx,
                    schema: r.text(2)?,
                    kind: r.text(3)?,
                    boundary: r.u64(4)?,
                    base,
                    root_bytes: r.u64(7)?,
                    objects: keys,
                });
            }
            let objects = db.query_map(
                "SELECT key, bytes, refs, condemned_at FROM objects ORDER BY key",
                &[],
                |r| {
                    Ok(ImageObject {
                        key: r.text(0)?,
                        bytes: r.u64(1)?,
                        refs: r.u64(2)?,
                        condemned: r.opt_i64(3)?.is_some(),
                    })
                },
            )?;
            let holds = db.query_map(
                "SELECT name, ns, ctx FROM holds ORDER BY name, ns, ctx",
                &[],
                |r| {
                    Ok(ImageHold {
                        name: r.text(0)?,
                        namespace: r.text(1)?,
                        context: r.text(2)?,
                    })
                },
            )?;
            Ok(LedgerImage { roots, objects, holds })
        })
    }
}

/// Tombstones of roots and holds removed since `since` (ms), as
/// `(kind, id)`.
fn tombs_in(
    db: &mut Db,
    since: u64,
) -> Result<std::collections::HashSet<(String, String)>, LedgerError> {
    db.query(
        "SELECT kind, id FROM tombstones WHERE at >= ?1",
        &[V::from(since)],
    )?
    .iter()
    .map(|r| Ok((r.text(0)?, r.text(1)?)))
    .collect()
}

/// One transaction of [`Ledger::merge_listing`]: the listed roots of
/// `batch`, each recorded, replaced (full rebuild) or kept by the rule
/// checked against the ledger as it is now.
fn merge_roots(
    db: &mut Db,
    listing: &Listing,
    batch: &[RootEntry],
    tomb_since: u64,
) -> Result<MergeReport, LedgerError> {
    let began = listing.began;
    let mut report = MergeReport::default();
    let tombs = tombs_in(db, tomb_since)?;
    for e in batch {
        let (ns, ctx) = hexpair(&e.namespace, &e.context);
        if tombs.contains(&("root".to_string(), format!("{ns}/{ctx}"))) {
            report.skipped_removed += 1;
            continue;
        }
        let pair = [V::from(&ns), V::from(&ctx)];
        match db.opt(
            "SELECT recorded_at, last_access FROM roots WHERE ns = ?1 AND ctx = ?2",
            &pair,
        )? {
            Some(r) if !listing.full || r.u64(0)? >= began => report.kept += 1,
            Some(r) => {
                // Replaced by what the store holds; reference
                // counts are recounted below.
                let last = r.u64(1)?;
                db.exec("DELETE FROM refs WHERE ns = ?1 AND ctx = ?2", &pair)?;
                db.exec("DELETE FROM roots WHERE ns = ?1 AND ctx = ?2", &pair)?;
                record_in(db, e, began)?;
                db.exec(
                    "UPDATE roots SET last_access = ?3 WHERE ns = ?1 AND ctx = ?2",
                    &[V::from(&ns), V::from(&ctx), V::from(last)],
                )?;
                report.replaced += 1;
            }
            None => {
                record_in(db, e, began)?;
                report.added += 1;
            }
        }
    }
    Ok(report)
}

/// The last transaction of [`Ledger::merge_listing`]: vanished roots, holds,
/// objects (added, recounted, dropped) and old tombstones.
fn merge_rest(
    db: &mut Db,
    listing: &Listing,
    now: u64,
    tomb_since: u64,
) -> Result<MergeReport, LedgerError> {
    let began = listing.began;
    let present: std::collections::HashSet<&str> =
        listing.present.iter().map(|(k, _, _)| k.as_str()).collect();
    let listed_holds: std::collections::HashSet<(String, String, String)> = listing
        .holds
        .iter()
        .map(|(n, ns, c)| (n.clone(), ns.hex(), c.hex()))
        .collect();
    let mut report = MergeReport::default();
    let tombs = tombs_in(db, tomb_since)?;
    for (vns, vctx) in &listing.vanished {
        let (ns, ctx) = hexpair(vns, vctx);
        let pair = [V::from(&ns), V::from(&ctx), V::from(began)];
        if db.exec(
            "DELETE FROM roots WHERE ns = ?1 AND ctx = ?2 AND recorded_at < ?3",
            &pair,
        )? > 0
        {
            db.exec("DELETE FROM refs WHERE ns = ?1 AND ctx = ?2", &pair[..2])?;
            db.exec("DELETE FROM holds WHERE ns = ?1 AND ctx = ?2", &pair[..2])?;
            report.removed += 1;
        }
    }
    for (name, ns, ctx) in &listed_holds {
        if tombs.contains(&("hold".to_string(), format!("{name}/{ns}/{ctx}"))) {
            continue;
        }
        report.holds_added += db.exec(
            "INSERT INTO holds(name, ns, ctx, since) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
            &[V::from(name), V::from(ns), V::from(ctx), V::from(began)],
        )?;
    }
    for r in db.query(
        "SELECT name, ns, ctx FROM holds WHERE since < ?1",
        &[V::from(began)],
    )? {
        let h = (r.text(0)?, r.text(1)?, r.text(2)?);
        if !listed_holds.contains(&h) {
            report.holds_removed += db.exec(
                "DELETE FROM holds WHERE name = ?1 AND ns = ?2 AND ctx = ?3",
                &[V::from(&h.0), V::from(&h.1), V::from(&h.2)],
            )?;
        }
    }
    for (key, bytes, mtime) in &listing.present {
        db.exec(
            "INSERT INTO objects(key, bytes, refs, condemned_at) VALUES (?1, ?2, 0, ?3) ON CONFLICT(key) DO NOTHING",
            &[V::from(key), V::from(*bytes), V::from(*mtime)],
        )?;
    }
    db.batch(
        "UPDATE objects SET refs = (SELECT COUNT(*) FROM refs WHERE refs.key = objects.key);
         UPDATE objects SET condemned_at = NULL WHERE refs > 0 AND condemned_at IS NOT NULL;",
    )?;
    db.exec(
        "UPDATE objects SET condemned_at = ?1 WHERE refs = 0 AND condemned_at IS NULL",
        &[V::from(now)],
    )?;
    for r in db.query("SELECT key FROM objects WHERE refs = 0", &[])? {
        let key = r.text(0)?;
        if present.contains(key.as_str()) {
            continue;
        }
        report.objects_dropped += db.exec(
            "DELETE FROM objects WHERE key = ?1 AND refs = 0
             AND NOT EXISTS (SELECT 1 FROM protected p WHERE p.key = ?1 AND p.until > ?2)
             AND NOT EXISTS (SELECT 1 FROM deleting d WHERE d.key = ?1)",
            &[V::from(&key), V::from(now)],
        )?;
    }
    db.exec(
        "DELETE FROM tombstones WHERE at < ?1",
        &[V::from(
            now.saturating_sub(TOMBSTONE_KEEP.as_millis() as u64),
        )],
    )?;
    Ok(report)
}

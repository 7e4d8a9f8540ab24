//! Objects: totals, usage, and the second phase of deletion.
//!
//! An object is deleted only inside a transaction that re-checks it is
//! still condemned and unreferenced; nothing here deletes a referenced
//! object or one a publication in progress protects.

use serde::Serialize;

use super::db::{Db, V};
use super::error::LedgerError;
use super::handle::{now_ms, Ledger};

/// Ledger totals.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct Totals {
    /// Roots.
    pub roots: u64,
    /// Live (referenced) objects.
    pub objects: u64,
    /// Bytes of live objects, each counted once.
    pub object_bytes: u64,
    /// Bytes of root objects.
    pub root_bytes: u64,
    /// Condemned objects awaiting deletion.
    pub condemned_objects: u64,
    /// Bytes of condemned objects (they still occupy storage).
    pub condemned_bytes: u64,
    /// Bytes reserved by publications in progress (their objects and roots
    /// are not recorded yet).
    pub reserved_bytes: u64,
    /// Bytes counted against the budget: live + condemned + roots +
    /// reserved.
    pub used_bytes: u64,
    /// Physical bytes per namespace (objects shared within a namespace
    /// counted once; shared across namespaces counted in each).
    pub per_namespace: Vec<(String, u64)>,
}

/// Condemned objects due for deletion: unreferenced, condemned at or before
/// ?1, and not protected by a publication in progress at ?2.
pub(super) const DUE: &str =
    "SELECT key, bytes FROM objects WHERE refs = 0 AND condemned_at IS NOT NULL AND condemned_at <= ?1
    AND NOT EXISTS (SELECT 1 FROM protected p WHERE p.key = objects.key AND p.until > ?2)";
pub(super) const STILL_DUE: &str = "SELECT bytes FROM objects WHERE key = ?1 AND refs = 0 AND condemned_at IS NOT NULL
    AND condemned_at <= ?2 AND NOT EXISTS (SELECT 1 FROM protected p WHERE p.key = objects.key AND p.until > ?3)";
pub(super) const IS_USED: &str = "SELECT COALESCE((SELECT refs FROM objects WHERE key = ?1), 0) > 0
    OR EXISTS (SELECT 1 FROM protected WHERE key = ?1 AND until > ?2)";

/// The totals, read on `db` (inside a transaction or not).
pub(super) fn totals_in(db: &mut Db) -> Result<Totals, LedgerError> {
    let mut t = usage_in(db)?;
    t.per_namespace = db.query_map(
        "SELECT ns, CAST(SUM(bytes) AS BIGINT) FROM (SELECT DISTINCT refs.ns AS ns, objects.key AS key, objects.bytes AS bytes
           FROM refs JOIN objects ON objects.key = refs.key) AS d GROUP BY ns ORDER BY ns",
        &[],
        |r| Ok((r.text(0)?, r.u64(1)?)),
    )?;
    Ok(t)
}

/// [`totals_in`] without the per-namespace breakdown (a join of every
/// reference with its object, most of the cost at 100,000 roots): what a
/// budget check needs.
pub(super) fn usage_in(db: &mut Db) -> Result<Totals, LedgerError> {
    let roots = db.one("SELECT COUNT(*) FROM roots", &[])?.u64(0)?;
    let root_bytes = db
        .one(
            "SELECT CAST(COALESCE(SUM(root_bytes), 0) AS BIGINT) FROM roots",
            &[],
        )?
        .u64(0)?;
    let live = db.one(
        "SELECT COUNT(*), CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM objects WHERE refs > 0",
        &[],
    )?;
    let condemned = db.one(
        "SELECT COUNT(*), CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM objects WHERE refs = 0",
        &[],
    )?;
    let reserved = db.one(RESERVED, &[V::from(now_ms())])?.u64(0)?;
    let (object_bytes, condemned_bytes) = (live.u64(1)?, condemned.u64(1)?);
    Ok(Totals {
        roots,
        objects: live.u64(0)?,
        object_bytes,
        root_bytes,
        condemned_objects: condemned.u64(0)?,
        condemned_bytes,
        reserved_bytes: reserved,
        used_bytes: object_bytes + condemned_bytes + root_bytes + reserved,
        per_namespace: Vec::new(),
    })
}

impl Ledger {
    /// Runs `delete(key)` for every condemned object condemned at or before
    /// `cutoff`, each inside a transaction that re-checks the object is still
    /// condemned and unreferenced; forgets the ones deleted. Stops before
    /// the next object when `proceed` says no (the owner fence). Returns
    /// `(objects, bytes)` reclaimed and whether it stopped early.
    pub(crate) fn collect(
        &self,
        cutoff: u64,
        mut delete: impl FnMut(&str) -> bool,
        mut proceed: impl FnMut() -> bool,
    ) -> Result<(u64, u64, bool), LedgerError> {
        let due = self.due(cutoff)?;
        let (mut n, mut bytes) = (0u64, 0u64);
        for (key, _) in due {
            if !proceed() {
                return Ok((n, bytes, true));
            }
            let done = self.write(|db| {
                let still = db.opt(
                    STILL_DUE,
                    &[V::from(&key), V::from(cutoff), V::from(now_ms())],
                )?;
                let Some(b) = still else {
                    return Ok(None);
                };
                if !delete(&key) {
                    return Ok(None);
                }
                db.exec("DELETE FROM objects WHERE key = ?1", &[V::from(&key)])?;
                Ok(Some(b.u64(0)?))
            })?;
            if let Some(b) = done {
                n += 1;
                bytes += b;
            }
        }
        Ok((n, bytes, false))
    }

    /// Deletes an object the sweep found unreferenced, unless — checked in
    /// the same transaction as the deletion — a root recorded since the
    /// sweep's listing references it or a publication protects it. Returns
    /// whether `delete` ran and succeeded.
    pub(crate) fn delete_if_unused(
        &self,
        key: &str,
        delete: impl FnOnce(&str) -> bool,
    ) -> Result<bool, LedgerError> {
        // `with` may retry on a busy database; the deletion itself runs at
        // most once (a retry after it only finishes the bookkeeping).
        let mut delete = Some(delete);
        let mut ran: Option<bool> = None;
        self.write(|db| {
            let used = db
                .one(IS_USED, &[V::from(key), V::from(now_ms())])?
                .bool(0)?;
            if used && ran.is_none() {
                return Ok(false);
            }
            let done = match ran {
                Some(d) => d,
                None => {
                    let d = delete.take().is_some_and(|f| f(key));
                    ran = Some(d);
                    d
                }
            };
            if done {
                db.exec(
                    "DELETE FROM objects WHERE key = ?1 AND refs = 0",
                    &[V::from(key)],
                )?;
            }
            Ok(done)
        })
    }

    /// Whether a recorded root references the object or a publication
    /// protects it.
    #[cfg(test)]
    pub(crate) fn is_used(&self, key: &str) -> Result<bool, LedgerError> {
        self.with(|db| db.one(IS_USED, &[V::from(key), V::from(now_ms())])?.bool(0))
    }

    /// Keys due for deletion, with their bytes.
    pub(crate) fn due(&self, cutoff: u64) -> Result<Vec<(String, u64)>, LedgerError> {
        self.with(|db| {
            db.query(DUE, &[V::from(cutoff), V::from(now_ms())])?
                .iter()
                .map(|r| Ok((r.text(0)?, r.u64(1)?)))
                .collect()
        })
    }

    /// Forgets an object if it is still unreferenced.
    pub(crate) fn forget_if_condemned(&self, key: &str) -> Result<(), LedgerError> {
        self.with(|db| {
            db.exec(
                "DELETE FROM objects WHERE key = ?1 AND refs = 0",
                &[V::from(key)],
            )?;
            Ok(())
        })
    }

    /// Forgets an object (e.g. deleted or quarantined by the sweep).
    pub(crate) fn forget_object(&self, key: &str) -> Result<(), LedgerError> {
        self.forget_if_condemned(key)
    }

    /// Totals.
    pub(crate) fn totals(&self) -> Result<Totals, LedgerError> {
        self.with(totals_in)
    }

    /// Totals without the per-namespace breakdown (what a budget check
    /// needs; `per_namespace` is empty).
    pub(crate) fn usage(&self) -> Result<Totals, LedgerError> {
        self.with(usage_in)
    }
}

/// Bytes reserved by publications in progress (not expired) at `?1`.
pub(super) const RESERVED: &str =
    "SELECT CAST(COALESCE(SUM(reserved), 0) AS BIGINT) FROM publications WHERE until > ?1";

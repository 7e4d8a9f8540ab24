//! Publications in progress: their sequence ids, leases, budget
//! reservations and the objects they protect from the collector.
//!
//! A publication's protections end with it (or with its lease); nothing
//! here records roots.

use super::claims::{fresh_since, CLAIM_SINCE};
use super::db::V;
use super::error::LedgerError;
use super::handle::{now_ms, Ledger};
use super::objects::{usage_in, Totals};

impl Ledger {
    /// Starts a publication: a fresh id from the database's sequence
    /// (never reused, so one publication's protections and reservation can
    /// never be dropped by another's end). Its reservation is a lease until
    /// `until` (ms), which the publisher renews while it runs
    /// ([`Ledger::renew_publication`]): a killed publisher's reservation
    /// lapses within one lease. Expired publications are cleaned up.
    pub(crate) fn begin_publication(&self, until: u64) -> Result<i64, LedgerError> {
        self.write(|db| {
            db.lease_commit()?;
            let now = V::from(now_ms());
            db.exec(
                "DELETE FROM publications WHERE until <= ?1",
                std::slice::from_ref(&now),
            )?;
            db.exec(
                "DELETE FROM protected WHERE until <= ?1",
                std::slice::from_ref(&now),
            )?;
            db.one(
                "INSERT INTO publications(reserved, until) VALUES (0, ?1) RETURNING id",
                &[V::from(until)],
            )?
            .i64(0)
        })
    }

    /// Extends publication `id`'s lease to `until` (ms).
    pub(crate) fn renew_publication(&self, id: i64, until: u64) -> Result<(), LedgerError> {
        self.with(|db| {
            db.exec(
                "UPDATE publications SET until = CASE WHEN until < ?2 THEN ?2 ELSE until END WHERE id = ?1",
                &[V::from(id), V::from(until)],
            )?;
            Ok(())
        })
    }

    /// Reserves `need` bytes for publication `id` against `budget`, in the
    /// transaction that checks them: bytes in use (live + condemned + roots)
    /// plus every other publication's reservation plus `need` must fit.
    /// Returns `None` when reserved, or the totals that did not fit.
    pub(crate) fn reserve(
        &self,
        id: i64,
        need: u64,
        budget: u64,
    ) -> Result<Option<Totals>, LedgerError> {
        self.write(|db| {
            db.lease_commit()?;
            db.exec(
                "UPDATE publications SET reserved = 0 WHERE id = ?1",
                &[V::from(id)],
            )?;
            let t = usage_in(db)?;
            if t.used_bytes.saturating_add(need) > budget {
                return Ok(Some(t));
            }
            db.exec(
                "UPDATE publications SET reserved = ?2 WHERE id = ?1",
                &[V::from(id), V::from(need)],
            )?;
            Ok(None)
        })
    }

    /// Protects objects a publication is about to rely on (or write) from
    /// garbage collection until `until` (ms), under the publication's
    /// `owner` id. Serialised with [`Ledger::collect`] and
    /// [`Ledger::claim_due`] by the write lock. Returns the keys a collector
    /// has already claimed for deletion from an object store: the
    /// publication must not rely on those, but wait until their deletion is
    /// over ([`Ledger::deleting`]) and write them again.
    pub(crate) fn protect(
        &self,
        owner: i64,
        keys: &[String],
        until: u64,
    ) -> Result<Vec<String>, LedgerError> {
        self.write(|db| {
            db.lease_commit()?;
            // Claims as rows first; the ledger's clock (a round trip on
            // PostgreSQL) is read only when some key has one, which a
            // publication almost never meets.
            let mut rows = Vec::new();
            for k in keys {
                db.exec(
                    "INSERT INTO protected(owner, key, until) VALUES (?1, ?2, ?3)
                     ON CONFLICT(owner, key) DO UPDATE SET until = excluded.until",
                    &[V::from(owner), V::from(k), V::from(until)],
                )?;
                if let Some(r) = db.opt(CLAIM_SINCE, &[V::from(k)])? {
                    rows.push((k.clone(), r.u64(0)?));
                }
            }
            if rows.is_empty() {
                return Ok(Vec::new());
            }
            let fresh = fresh_since(db)?;
            Ok(rows
                .into_iter()
                .filter(|(_, since)| *since > fresh)
                .map(|(k, _)| k)
                .collect())
        })
    }

    /// Ends a publication: drops its protections and its reservation (and
    /// any that expired).
    pub(crate) fn end_publication(&self, owner: i64) -> Result<(), LedgerError> {
        self.write(|db| {
            db.lease_commit()?;
            let p = [V::from(owner), V::from(now_ms())];
            db.exec("DELETE FROM protected WHERE owner = ?1 OR until <= ?2", &p)?;
            db.exec("DELETE FROM publications WHERE id = ?1 OR until <= ?2", &p)?;
            Ok(())
        })
    }
}

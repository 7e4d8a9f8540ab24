//! Delete claims (`deleting`): which collector is deleting which object.
//!
//! A claim stands for [`DELETING_LEASE`]; a claimed object is never
//! re-referenced by a publisher while the claim is fresh.

use std::time::Duration;

use super::db::V;
use super::error::LedgerError;
use super::handle::{now_ms, Ledger};
use super::objects::{DUE, IS_USED};

/// How long a claim in `deleting` stands: a collector that claimed an
/// object and then died (or hangs) is presumed gone after this, and its
/// claim is taken over or ignored. Far longer than any one DELETE request.
pub(crate) const DELETING_LEASE: Duration = Duration::from_secs(120);

/// Keys among ?2.. claimed for deletion since ?1 (a fresh claim).
pub(super) const FRESH_CLAIM: &str = "SELECT 1 FROM deleting WHERE key = ?1 AND since > ?2";

impl Ledger {
    /// Which of `keys` are still claimed for deletion (fresh claims only).
    pub(crate) fn deleting(&self, keys: &[String]) -> Result<Vec<String>, LedgerError> {
        let fresh = now_ms().saturating_sub(DELETING_LEASE.as_millis() as u64);
        self.with(|db| {
            let mut out = Vec::new();
            for k in keys {
                if db
                    .opt(FRESH_CLAIM, &[V::from(k), V::from(fresh)])?
                    .is_some()
                {
                    out.push(k.clone());
                }
            }
            Ok(out)
        })
    }

    /// Claims every object due for deletion (condemned at or before
    /// `cutoff`, unreferenced, unprotected, not freshly claimed by another
    /// collector) for deletion from an object store, in one transaction.
    /// The caller deletes each and then calls [`Ledger::finish_delete`].
    /// Between the claim and the finish, a publisher that protects the key
    /// learns it is being deleted and rewrites it afterwards instead of
    /// relying on it: no DELETE can land on an object a root relies on.
    pub(crate) fn claim_due(&self, cutoff: u64) -> Result<Vec<(String, u64)>, LedgerError> {
        let now = now_ms();
        let fresh = now.saturating_sub(DELETING_LEASE.as_millis() as u64);
        self.write(|db| {
            let mut claimed = Vec::new();
            for r in db.query(DUE, &[V::from(cutoff), V::from(now)])? {
                let (key, bytes) = (r.text(0)?, r.u64(1)?);
                if db
                    .opt(FRESH_CLAIM, &[V::from(&key), V::from(fresh)])?
                    .is_some()
                {
                    continue;
                }
                db.exec(
                    "INSERT INTO deleting(key, since) VALUES (?1, ?2)
                     ON CONFLICT(key) DO UPDATE SET since = excluded.since",
                    &[V::from(&key), V::from(now)],
                )?;
                claimed.push((key, bytes));
            }
            Ok(claimed)
        })
    }

    /// Claims one object the sweep found unreferenced in a listing, unless
    /// a recorded root references it, a publication protects it, or another
    /// collector claimed it. Returns whether it is now this caller's to
    /// delete (then [`Ledger::finish_delete`]).
    pub(crate) fn claim_orphan(&self, key: &str) -> Result<bool, LedgerError> {
        let now = now_ms();
        let fresh = now.saturating_sub(DELETING_LEASE.as_millis() as u64);
        self.write(|db| {
            if db.one(IS_USED, &[V::from(key), V::from(now)])?.bool(0)?
                || db
                    .opt(FRESH_CLAIM, &[V::from(key), V::from(fresh)])?
                    .is_some()
            {
                return Ok(false);
            }
            db.exec(
                "INSERT INTO deleting(key, since) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET since = excluded.since",
                &[V::from(key), V::from(now)],
            )?;
            Ok(true)
        })
    }

    /// Ends a claim: if the object was deleted, forgets it (unless a root
    /// references it again, which the protocol rules out); either way the
    /// claim goes.
    pub(crate) fn finish_delete(&self, key: &str, deleted: bool) -> Result<(), LedgerError> {
        self.write(|db| {
            if deleted {
                db.exec(
                    "DELETE FROM objects WHERE key = ?1 AND refs = 0",
                    &[V::from(key)],
                )?;
            }
            db.exec("DELETE FROM deleting WHERE key = ?1", &[V::from(key)])?;
            Ok(())
        })
    }
}

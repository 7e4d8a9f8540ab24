//! Holds as the ledger caches them (named, persistent protections).
//!
//! The store's `holds/` markers are the source of truth; this cache must
//! never be the only record of a hold.

use deltapack_format::{ContextDigest, Namespace};

use super::db::V;
use super::error::LedgerError;
use super::handle::{now_ms, Ledger};
use super::roots::{hexpair, tombstone_in};

impl Ledger {
    /// Adds a hold (idempotent).
    pub(crate) fn add_hold(
        &self,
        name: &str,
        ns: &Namespace,
        ctx: &ContextDigest,
    ) -> Result<(), LedgerError> {
        let (ns, ctx) = hexpair(ns, ctx);
        let id = format!("{name}/{ns}/{ctx}");
        self.write(|db| {
            db.exec(
                "INSERT INTO holds(name, ns, ctx, since) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                &[V::from(name), V::from(&ns), V::from(&ctx), V::from(now_ms())],
            )?;
            db.exec(
                "DELETE FROM tombstones WHERE kind = 'hold' AND id = ?1",
                &[V::from(&id)],
            )?;
            Ok(())
        })
    }

    /// Releases a hold (and leaves a tombstone, so a rebuild whose listing
    /// still saw the marker does not bring it back).
    pub(crate) fn release_hold(
        &self,
        name: &str,
        ns: &Namespace,
        ctx: &ContextDigest,
    ) -> Result<bool, LedgerError> {
        let (ns, ctx) = hexpair(ns, ctx);
        let id = format!("{name}/{ns}/{ctx}");
        self.write(|db| {
            let released = db.exec(
                "DELETE FROM holds WHERE name = ?1 AND ns = ?2 AND ctx = ?3",
                &[V::from(name), V::from(&ns), V::from(&ctx)],
            )? > 0;
            tombstone_in(db, "hold", &id, now_ms())?;
            Ok(released)
        })
    }

    /// Whether any hold protects the root.
    pub(crate) fn is_held(&self, ns: &Namespace, ctx: &ContextDigest) -> Result<bool, LedgerError> {
        let (ns, ctx) = hexpair(ns, ctx);
        self.with(|db| {
            Ok(db
                .opt(
                    "SELECT 1 FROM holds WHERE ns = ?1 AND ctx = ?2 LIMIT 1",
                    &[V::from(&ns), V::from(&ctx)],
                )?
                .is_some())
        })
    }
}

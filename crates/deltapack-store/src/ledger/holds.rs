//! Holds as the ledger caches them (named, persistent protections).
//!
//! The store's `holds/` markers are the source of truth; this cache must
//! never be the only record of a hold.

use deltapack_format::{ContextDigest, Namespace};

use super::db::V;
use super::error::LedgerError;
use super::handle::{now_ms, Ledger};
use super::roots::{hexpair, tombstone_in};

/// A root and the names of the holds on it.
pub(crate) type HeldRoot = ((Namespace, ContextDigest), Vec<String>);

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

    /// The names of the holds on each of `roots` that has any, in the
    /// order of `roots` (one read of the holds, which are few).
    pub(crate) fn holds_on(
        &self,
        roots: &[(Namespace, ContextDigest)],
    ) -> Result<Vec<HeldRoot>, LedgerError> {
        let rows =
            self.with(|db| db.query("SELECT name, ns, ctx FROM holds ORDER BY name", &[]))?;
        let mut by_root: std::collections::HashMap<(String, String), Vec<String>> =
            std::collections::HashMap::new();
        for r in rows {
            by_root
                .entry((r.text(1)?, r.text(2)?))
                .or_default()
                .push(r.text(0)?);
        }
        Ok(roots
            .iter()
            .filter_map(|(ns, ctx)| {
                let names = by_root.get(&hexpair(ns, ctx))?;
                Some(((*ns, *ctx), names.clone()))
            })
            .collect())
    }
}

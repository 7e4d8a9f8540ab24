//! Persisted counters (publications, restores, …) kept with the ledger.
//!
//! Counters are advisory: nothing decides on them.

use super::db::V;
use super::error::LedgerError;
use super::handle::Ledger;

impl Ledger {
    /// Adds counter deltas to the persisted counters.
    pub(crate) fn add_counters(&self, deltas: &[(&str, u64)]) -> Result<(), LedgerError> {
        self.write(|db| {
            for (name, v) in deltas {
                if *v > 0 {
                    db.exec(
                        "INSERT INTO counters(name, value) VALUES (?1, ?2)
                         ON CONFLICT(name) DO UPDATE SET value = counters.value + excluded.value",
                        &[V::from(*name), V::from(*v)],
                    )?;
                }
            }
            Ok(())
        })
    }

    /// The persisted counters.
    pub(crate) fn counters(&self) -> Result<Vec<(String, u64)>, LedgerError> {
        self.with(|db| {
            db.query("SELECT name, value FROM counters ORDER BY name", &[])?
                .iter()
                .map(|r| Ok((r.text(0)?, r.u64(1)?)))
                .collect()
        })
    }
}

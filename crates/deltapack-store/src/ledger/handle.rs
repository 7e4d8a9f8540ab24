//! The ledger handle: one shared connection, transactions, retries.
//!
//! Owns [`Ledger`] (a cheap clonable handle), where it lives, and the
//! helpers every other ledger module runs its statements through
//! (`with`, `write`, `run`). Holds no SQL of its own and must never depend
//! on a concept module (roots, objects, …): they depend on it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deltapack_format::LedgerId;
use serde::Serialize;

use super::db::Db;
use super::error::LedgerError;

/// What to do with a persisted ledger when a store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ColdStart {
    /// Trust a persisted ledger at open, without listing the store, and
    /// reconcile it with the store in the background (see
    /// [`crate::Store::reconcile_ledger`]); an in-memory ledger, or one new
    /// to the store, is built from the store.
    #[default]
    Load,
    /// Always rebuild from the store.
    Rebuild,
    /// Start genuinely empty: delete every root, object and hold.
    Clear,
}

impl std::str::FromStr for ColdStart {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "load" => Ok(ColdStart::Load),
            "rebuild" => Ok(ColdStart::Rebuild),
            "clear" => Ok(ColdStart::Clear),
            other => Err(format!(
                "unknown cold-start policy {other:?} (expected load, rebuild or clear)"
            )),
        }
    }
}

pub(crate) use super::db::now_ms;

/// Where a ledger lives, for `ledger show` and messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LedgerLocation {
    /// `sqlite` or `postgres`.
    pub engine: &'static str,
    /// The database: a file path, `:memory:`, or a PostgreSQL URL without
    /// its password.
    pub location: String,
    /// Whether the ledger outlives the process.
    pub persisted: bool,
}

/// The ledger: a cheap handle (clones share one connection).
#[derive(Clone)]
pub(crate) struct Ledger {
    pub(super) db: Arc<Mutex<Db>>,
    pub(super) location: LedgerLocation,
    /// The database's own random id (`meta.ledger_id`), chosen when the
    /// database was created: what a store's ledger binding names.
    pub(super) id: LedgerId,
    /// Called after every call that succeeded (the store's "last reached"
    /// gauge), once set ([`Ledger::on_reached`]).
    pub(super) reached: Arc<std::sync::OnceLock<Reached>>,
}

/// What a ledger calls after each call that succeeded.
pub(crate) type Reached = Box<dyn Fn() + Send + Sync>;

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Ledger({} {})",
            self.location.engine, self.location.location
        )
    }
}

/// How long [`retry_busy`] keeps trying.
pub(super) const BUSY_PATIENCE: Duration = Duration::from_secs(30);

/// Runs `op` again (with a growing pause) while it fails with a busy
/// database, for up to [`BUSY_PATIENCE`]. The busy timeout covers waiting
/// for a lock, but in WAL mode SQLite also returns `SQLITE_BUSY` at once in
/// a few cases — another process recovering the WAL index, or closing and
/// checkpointing the last connection while this one opens — which a
/// multi-process test hit about once in 30 runs (`database is locked` from
/// an `evict` process). Ledger calls run on blocking threads
/// ([`Ledger::run`]), so the pauses never stall an async worker.
pub(super) fn retry_busy<T>(
    mut op: impl FnMut() -> Result<T, LedgerError>,
) -> Result<T, LedgerError> {
    let start = std::time::Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        match op() {
            Err(e) if Db::is_busy(&e) && start.elapsed() < BUSY_PATIENCE => {
                tracing::debug!(error = %e, "ledger busy; retrying");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

impl Ledger {
    /// Where this ledger lives.
    pub(crate) fn location(&self) -> &LedgerLocation {
        &self.location
    }

    /// This ledger's id (see [`deltapack_format::binding`]).
    pub(crate) fn id(&self) -> LedgerId {
        self.id
    }

    /// Runs `f` on a blocking thread, never on an async worker: the
    /// database may wait for another process's lock (busy timeout,
    /// retries) or the network, and a worker blocked there could not run
    /// anything else — not even the deadline of the request that is
    /// waiting.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Ledger) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        let l = self.clone();
        let out = tokio::task::spawn_blocking(move || f(&l))
            .await
            .map_err(|e| LedgerError::Task(e.to_string()))?;
        if out.is_ok() {
            if let Some(reached) = self.reached.get() {
                reached();
            }
        }
        out
    }

    /// Sets what is called after each call that succeeded (once: a later
    /// call of this is ignored).
    pub(crate) fn on_reached(&self, f: Reached) {
        let _ = self.reached.set(f);
    }

    /// Runs `f` on the connection; retried while SQLite reports the
    /// database busy (see [`retry_busy`]). Every `f` is one transaction (or
    /// reads only), so a retry repeats nothing that took effect.
    pub(super) fn with<T>(
        &self,
        mut f: impl FnMut(&mut Db) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        let mut guard = match self.db.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        retry_busy(|| f(&mut guard))
    }

    /// Runs `f` as one write transaction (see [`Db::write`]), retried while
    /// busy.
    pub(super) fn write<T>(
        &self,
        mut f: impl FnMut(&mut Db) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        self.with(|db| db.write(&mut f))
    }
}

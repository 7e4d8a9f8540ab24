//! Delete claims (`deleting`): which collector is deleting which object.
//!
//! A collector claims what it is about to delete (one row per key, naming
//! the collector by a random [`Claimant`] id) and, while it works, renews
//! all its claims every [`CLAIM_RENEW`] (a heartbeat). A claim not renewed
//! for [`CLAIM_TTL`] has lapsed: its collector died or lost the ledger.
//! Freshness is judged on the ledger's clock (the database server's, for
//! PostgreSQL), so nodes whose clocks disagree still agree on it. A claimed
//! object is never re-referenced by a publisher while the claim is fresh;
//! a publisher blocked by a dead collector proceeds within `CLAIM_TTL`
//! plus one poll.
//!
//! The collector's side of the bargain: it acts on a claim only while its
//! last successful renewal *began* less than [`CLAIM_SAFE`] ago (measured
//! on its own monotonic clock, so no two clocks are compared), and bounds
//! each DELETE by what is left of that. A renewal stamps the ledger's
//! clock at or after the moment it began, so the claim stays fresh in the
//! ledger at least as long as the collector believes it does.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::db::V;
use super::error::LedgerError;
use super::handle::Ledger;
use super::objects::{DUE, IS_USED};

/// How long a claim stands without renewal: a collector that claimed an
/// object and then died (or lost the ledger) is presumed gone after this,
/// and its claim is taken over or ignored.
pub(crate) const CLAIM_TTL: Duration = Duration::from_secs(3);

/// How often a live collector renews its claims.
pub(crate) const CLAIM_RENEW: Duration = Duration::from_millis(500);

/// How long after its last renewal began a collector still acts on its
/// claims: [`CLAIM_TTL`] less a second of margin for the DELETE in flight.
pub(crate) const CLAIM_SAFE: Duration = Duration::from_secs(2);

/// The longest a publication waits for live collectors to finish deleting
/// objects it needs (a collector renewing its claims for longer than this
/// is stuck, and the publication fails rather than wait on it).
pub(crate) const CLAIM_WAIT_LIMIT: Duration = Duration::from_secs(120);

/// When key ?1's claim was stamped, if it has one (fresh or lapsed).
pub(super) const CLAIM_SINCE: &str = "SELECT since FROM deleting WHERE key = ?1";

/// Keys among ?2.. claimed for deletion since ?1 (a fresh claim).
const FRESH_CLAIM: &str = "SELECT 1 FROM deleting WHERE key = ?1 AND since > ?2";

/// Claims (or takes over a lapsed claim on) key ?1 for claimant ?3 at ?2.
const CLAIM: &str = "INSERT INTO deleting(key, since, claimant) VALUES (?1, ?2, ?3)
     ON CONFLICT(key) DO UPDATE SET since = excluded.since, claimant = excluded.claimant";

/// The oldest renewal time a fresh claim can have, on the ledger's clock.
pub(super) fn fresh_since(db: &mut super::db::Db) -> Result<u64, LedgerError> {
    Ok(db.clock_ms()?.saturating_sub(CLAIM_TTL.as_millis() as u64))
}

/// One collector's identity in `deleting`, and the heartbeat that keeps
/// its claims fresh while it lives.
///
/// Made once per collection run (a garbage collection, a sweep, a removal
/// plan's execution); the heartbeat starts with the first claim and stops
/// when the `Claimant` is dropped — or when the process dies, which is the
/// point: its claims then lapse within [`CLAIM_TTL`].
pub(crate) struct Claimant {
    id: i64,
    ledger: Ledger,
    /// When the last successful claim or renewal began (`None`: nothing
    /// claimed yet).
    renewed: Arc<Mutex<Option<Instant>>>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
}

impl Claimant {
    /// A new collector identity on `ledger` (a random non-zero id; 0 marks
    /// claims written before claims had claimants).
    pub(crate) fn new(ledger: &Ledger) -> Result<Self, LedgerError> {
        let mut b = [0u8; 8];
        getrandom::getrandom(&mut b).map_err(|e| LedgerError::Io {
            path: "the system's random source".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok(Claimant {
            id: (i64::from_le_bytes(b) & i64::MAX).max(1),
            ledger: ledger.clone(),
            renewed: Arc::new(Mutex::new(None)),
            heartbeat: None,
        })
    }

    /// The id claims of this collector carry.
    pub(crate) fn id(&self) -> i64 {
        self.id
    }

    /// Records a claim call that began at `began` and succeeded (whether
    /// or not it claimed anything); starts the heartbeat if it is not
    /// running. Needs a tokio runtime.
    pub(crate) fn claimed(&mut self, began: Instant) {
        note(&self.renewed, began);
        if self.heartbeat.is_none() {
            let (ledger, id, renewed) = (self.ledger.clone(), self.id, self.renewed.clone());
            self.heartbeat = Some(tokio::spawn(async move {
                loop {
                    tokio::time::sleep(CLAIM_RENEW).await;
                    let began = Instant::now();
                    match ledger.run(move |l| l.renew_claims(id)).await {
                        Ok(_) => note(&renewed, began),
                        Err(e) => tracing::warn!(error = %e, "could not renew delete claims"),
                    }
                }
            }));
        }
    }

    /// How much longer this collector may act on its claims; an error once
    /// its heartbeat has not got through for [`CLAIM_SAFE`] (its claims may
    /// have lapsed, and a publisher may rely on what it claimed).
    pub(crate) fn time_left(&self) -> Result<Duration, LedgerError> {
        let last = *self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        let age = last.map(|t| t.elapsed()).unwrap_or(Duration::MAX);
        CLAIM_SAFE
            .checked_sub(age)
            .filter(|left| *left >= Duration::from_millis(100))
            .ok_or_else(|| {
                LedgerError::Unreachable(format!(
                    "delete claims not renewed for {age:.1?} (they lapse after {CLAIM_TTL:?}): \
                     stopped deleting"
                ))
            })
    }
}

/// Records a renewal that began at `began`, unless a later one is known.
fn note(renewed: &Mutex<Option<Instant>>, began: Instant) {
    let mut r = renewed.lock().unwrap_or_else(|p| p.into_inner());
    if r.is_none_or(|t| t < began) {
        *r = Some(began);
    }
}

impl Drop for Claimant {
    fn drop(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
}

impl Ledger {
    /// Which of `keys` are still claimed for deletion (fresh claims only).
    pub(crate) fn deleting(&self, keys: &[String]) -> Result<Vec<String>, LedgerError> {
        self.with(|db| {
            let fresh = fresh_since(db)?;
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

    /// Claims up to `limit` objects due for deletion (condemned at or
    /// before `cutoff`, unreferenced, unprotected, not freshly claimed by
    /// another collector) for `claimant` to delete from an object store,
    /// in one transaction.
    /// The caller deletes each and then calls [`Ledger::finish_delete`].
    /// Between the claim and the finish, a publisher that protects the key
    /// learns it is being deleted and rewrites it afterwards instead of
    /// relying on it: no DELETE can land on an object a root relies on.
    pub(crate) fn claim_due(
        &self,
        cutoff: u64,
        claimant: i64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, LedgerError> {
        let now = super::handle::now_ms();
        self.write(|db| {
            let clock = db.clock_ms()?;
            let fresh = clock.saturating_sub(CLAIM_TTL.as_millis() as u64);
            let mut claimed = Vec::new();
            for r in db.query(DUE, &[V::from(cutoff), V::from(now)])? {
                if claimed.len() >= limit {
                    break;
                }
                let (key, bytes) = (r.text(0)?, r.u64(1)?);
                if db
                    .opt(FRESH_CLAIM, &[V::from(&key), V::from(fresh)])?
                    .is_some()
                {
                    continue;
                }
                db.exec(CLAIM, &[V::from(&key), V::from(clock), V::I(claimant)])?;
                claimed.push((key, bytes));
            }
            Ok(claimed)
        })
    }

    /// Claims one object the sweep found unreferenced in a listing for
    /// `claimant`, unless a recorded root references it, a publication
    /// protects it, or another collector claimed it. Returns whether it is
    /// now this caller's to delete (then [`Ledger::finish_delete`]).
    pub(crate) fn claim_orphan(&self, key: &str, claimant: i64) -> Result<bool, LedgerError> {
        let now = super::handle::now_ms();
        self.write(|db| {
            let clock = db.clock_ms()?;
            let fresh = clock.saturating_sub(CLAIM_TTL.as_millis() as u64);
            if db.one(IS_USED, &[V::from(key), V::from(now)])?.bool(0)?
                || db
                    .opt(FRESH_CLAIM, &[V::from(key), V::from(fresh)])?
                    .is_some()
            {
                return Ok(false);
            }
            db.exec(CLAIM, &[V::from(key), V::from(clock), V::I(claimant)])?;
            Ok(true)
        })
    }

    /// Renews every claim of `claimant` (its heartbeat); returns how many
    /// it holds.
    pub(crate) fn renew_claims(&self, claimant: i64) -> Result<u64, LedgerError> {
        self.write(|db| {
            let clock = db.clock_ms()?;
            db.exec(
                "UPDATE deleting SET since = ?1 WHERE claimant = ?2",
                &[V::from(clock), V::I(claimant)],
            )
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

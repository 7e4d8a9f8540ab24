//! The collector's side of publication: the publication lease.
//!
//! A publication in progress registers in the ledger (a lease renewed while
//! it runs) and protects every key it writes or reuses; the garbage
//! collector deletes nothing so protected. This module must stay the only
//! place that begins, renews and ends a publication's lease.
//!
//! It also holds the collector itself ([`Store::collect_garbage`]), next to
//! the lease it must respect: an object is deleted only when it is
//! condemned, past its grace, and protected by no publication.

use std::time::{Duration, Instant};

use object_store::path::Path;
use object_store::ObjectStoreExt;

use crate::backend::BackendKind;
use crate::error::{Result, StoreError};
use crate::ledger::{now_ms, Claimant};
use crate::store::Store;

/// Protects the objects a publication writes or reuses from garbage
/// collection until the publication ends (its root is recorded, or it
/// fails); protections also expire on their own if the process dies.
pub(crate) struct ProtectGuard {
    store: Store,
    /// The publication's id in the ledger (a database sequence).
    owner: Option<i64>,
    until: u64,
    /// Renews the publication's lease while it runs.
    renewer: Option<tokio::task::JoinHandle<()>>,
}

/// How long a publication's reservation lasts without renewal: a killed
/// publisher's reserved bytes come back within this time. Renewed every
/// third of it.
pub(super) const PUBLICATION_LEASE: Duration = Duration::from_secs(10);

impl ProtectGuard {
    pub(crate) async fn new(store: &Store) -> Result<Self> {
        let ledger = store.ledger().await?;
        let now = crate::ledger::now_ms();
        let until = now
            + store
                .config()
                .capacity
                .grace
                .max(Duration::from_secs(3600))
                .as_millis() as u64;
        let lease = |now: u64| now + PUBLICATION_LEASE.as_millis() as u64;
        let owner = ledger.run(move |l| l.begin_publication(lease(now))).await?;
        let renewing = ledger.clone();
        let renewer = tokio::spawn(async move {
            loop {
                tokio::time::sleep(PUBLICATION_LEASE / 3).await;
                let until = lease(crate::ledger::now_ms());
                if let Err(e) = renewing
                    .run(move |l| l.renew_publication(owner, until))
                    .await
                {
                    tracing::warn!(error = %e, "could not renew a publication's lease");
                }
            }
        });
        Ok(ProtectGuard {
            store: store.clone(),
            owner: Some(owner),
            until,
            renewer: Some(renewer),
        })
    }

    /// The publication's ledger id.
    pub(crate) fn id(&self) -> i64 {
        self.owner.unwrap_or(-1)
    }

    pub(super) async fn protect(&self, keys: Vec<String>) -> Result<()> {
        self.protector().protect(keys).await
    }

    /// A handle that protects keys for this publication from another task
    /// (it does not end the publication).
    pub(super) fn protector(&self) -> Protector {
        Protector {
            ledger: self.store.inner.ledger.get().cloned(),
            owner: self.owner,
            until: self.until,
        }
    }

    /// Ends the publication: its protections and its reservation go.
    pub(crate) async fn finish(mut self) {
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        let (Some(l), Some(owner)) = (self.store.inner.ledger.get(), self.owner.take()) else {
            return;
        };
        if let Err(e) = l.run(move |l| l.end_publication(owner)).await {
            tracing::warn!(error = %e, "could not drop publication protections");
        }
    }
}

/// A task aborted when its handle goes (a publication that fails stops its
/// extent producer, which would otherwise protect keys after the end).
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Protects keys for one publication (see [`ProtectGuard`]); cheap to clone
/// into a task.
#[derive(Clone)]
pub(crate) struct Protector {
    ledger: Option<crate::ledger::Ledger>,
    owner: Option<i64>,
    until: u64,
}

impl Protector {
    /// Protects `keys` from garbage collection until the publication ends;
    /// returns once none of them is being deleted by a collector (a key
    /// that was is gone by then, and the caller writes it again).
    pub(crate) async fn protect(&self, keys: Vec<String>) -> Result<()> {
        let (Some(l), Some(owner)) = (self.ledger.as_ref(), self.owner) else {
            return Ok(());
        };
        let until = self.until;
        let mut claimed = match l.run(move |l| l.protect(owner, &keys, until)).await {
            Ok(c) => c,
            Err(e) => {
                // A ledger that cannot be written (full disk) cannot run a
                // collection either, so publishing on is safe; the grace
                // period still protects against other processes' sweeps.
                tracing::warn!(error = %e, "could not record publication protections");
                return Ok(());
            }
        };
        // Objects a collector (of any node) is deleting right now: never
        // relied upon. Wait until each deletion is over; the caller then
        // writes the object again (create-if-absent finds it gone).
        let start = Instant::now();
        let mut pause = Duration::from_millis(5);
        while !claimed.is_empty() {
            if start.elapsed() > crate::ledger::CLAIM_WAIT_LIMIT {
                return Err(StoreError::Internal(format!(
                    "{} objects stayed claimed for deletion by a live collector for over {:?}",
                    claimed.len(),
                    crate::ledger::CLAIM_WAIT_LIMIT
                )));
            }
            tracing::debug!(
                objects = claimed.len(),
                "waiting for a collector's deletion"
            );
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
            claimed = l.run(move |l| l.deleting(&claimed)).await?;
        }
        Ok(())
    }
}

/// A publication that fails (or is cancelled) ends here: on a blocking
/// thread if a runtime is there, else in place. Protections left behind by
/// a dead process expire on their own.
impl Drop for ProtectGuard {
    fn drop(&mut self) {
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        let (Some(l), Some(owner)) = (self.store.inner.ledger.get(), self.owner.take()) else {
            return;
        };
        let l = l.clone();
        let end = move || {
            if let Err(e) = l.end_publication(owner) {
                tracing::warn!(error = %e, "could not drop publication protections");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => drop(h.spawn_blocking(end)),
            Err(_) => end(),
        }
    }
}

/// What one garbage collection deleted ([`Store::collect_garbage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct GcReport {
    /// Objects deleted.
    pub objects: u64,
    /// Stored bytes they held.
    pub bytes: u64,
}

impl Store {
    /// Deletes condemned objects whose grace period has passed and that no
    /// publication in progress protects. On local disk each file is removed
    /// inside the ledger transaction that re-checks the object, so a
    /// concurrent publisher (which protects objects before relying on them)
    /// either sees the object gone and rewrites it, or protects it first.
    #[tracing::instrument(level = "debug", name = "collect_garbage", skip_all, fields(
        objects = tracing::field::Empty,
        bytes = tracing::field::Empty,
    ))]
    pub async fn collect_garbage(&self) -> Result<GcReport> {
        let ledger = self.ledger().await?;
        let mut fence = crate::ownership::OwnerFence::start(self, "collect garbage").await?;
        // An object the ledger thinks unreferenced may be used by a root
        // it has not seen yet (written by a process that died before
        // recording it): reconcile first.
        self.reconcile_ledger().await?;
        let cutoff = now_ms().saturating_sub(self.config().capacity.grace.as_millis() as u64);
        let (n, b) = match self.backend_kind() {
            BackendKind::Local { root } => {
                let root = root.clone();
                // The fence on local disk, checked on the ledger's thread:
                // the binding file still holds the bytes the owner check
                // read, looked at every second.
                let mut watch = crate::ownership::LocalBindingWatch::new(&root);
                let (n, b, stopped) = ledger
                    .run(move |l| {
                        l.collect(
                            cutoff,
                            |key| match std::fs::remove_file(root.join(key)) {
                                Ok(()) => true,
                                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                            },
                            || watch.unchanged(),
                        )
                    })
                    .await?;
                if stopped {
                    // The binding changed: refused if another ledger owns
                    // the store now; otherwise (its owner rewrote it) the
                    // next collection goes on.
                    fence.check_now(self).await?;
                }
                (n, b)
            }
            _ => collect_claimed(self, ledger, &mut fence, cutoff).await?,
        };
        tracing::Span::current()
            .record("objects", n)
            .record("bytes", b);
        if n > 0 {
            tracing::info!(objects = n, bytes = b, "garbage collected");
        }
        Ok(GcReport {
            objects: n,
            bytes: b,
        })
    }
}

/// Objects one claim–delete–finish round of a collection on an object
/// store takes at most: a publisher waiting for one of them waits for at
/// most this many DELETEs.
const CLAIM_BATCH: usize = 64;

/// Deletes `p` for a collector holding a claim on it, only while its
/// claims are surely fresh ([`Claimant::time_left`]): a DELETE still in
/// flight when the heartbeat stops getting through is abandoned.
/// `Ok(Ok(()))` deleted (or already gone), `Ok(Err)` the DELETE failed or
/// was abandoned (the object may be there or not; a publication writes
/// what it needs with create-if-absent either way), `Err` the claims may
/// have lapsed before the DELETE was sent (the collector stops).
pub(crate) async fn delete_claimed(
    store: &dyn object_store::ObjectStore,
    claimant: &Claimant,
    p: &Path,
) -> Result<std::result::Result<(), object_store::Error>> {
    claimant.time_left()?;
    let mut delete = std::pin::pin!(store.delete(p));
    loop {
        // Re-judged as the heartbeat renews the claims: a slow DELETE goes
        // on as long as its claim is kept fresh.
        let Ok(left) = claimant.time_left() else {
            return Ok(Err(object_store::Error::Generic {
                store: "deltapack",
                source: "the DELETE outlived the collector's claim (its heartbeat stopped \
                         getting through): abandoned"
                    .into(),
            }));
        };
        if let Ok(r) = tokio::time::timeout(left.min(Duration::from_millis(200)), &mut delete).await
        {
            return Ok(match r {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            });
        }
    }
}

/// Garbage collection on an object store: claim a batch of due
/// objects, delete each under the claim, finish each; until none is
/// due. A publisher that protects a claimed key waits for the deletion
/// (or for the claim to lapse, if this collector dies) and writes the
/// object again.
async fn collect_claimed(
    store: &Store,
    ledger: &crate::ledger::Ledger,
    fence: &mut crate::ownership::OwnerFence,
    cutoff: u64,
) -> Result<(u64, u64)> {
    let (mut n, mut b) = (0, 0);
    let mut claimant = Claimant::new(ledger)?;
    let mut seen = std::collections::HashSet::new();
    loop {
        let id = claimant.id();
        let began = Instant::now();
        let claimed = ledger
            .run(move |l| l.claim_due(cutoff, id, CLAIM_BATCH))
            .await?;
        claimant.claimed(began);
        // Nothing left, or only what this run already tried (a DELETE
        // that failed leaves its object due): done.
        if claimed.is_empty() || !claimed.iter().any(|(k, _)| seen.insert(k.clone())) {
            hand_back(ledger, claimed.into_iter().map(|(k, _)| k).collect()).await;
            return Ok((n, b));
        }
        crate::failpoint::reached("gc.claimed");
        for (i, (key, bytes)) in claimed.iter().enumerate() {
            // An adoption since the last check, or claims this
            // collector can no longer vouch for: stop, and hand the
            // claims not acted on back (the new owner decides).
            let stop = match fence.check(store).await {
                Ok(()) => claimant.time_left().err().map(StoreError::from),
                Err(e) => Some(e),
            };
            if let Some(e) = stop {
                hand_back(
                    ledger,
                    claimed[i..].iter().map(|(k, _)| k.clone()).collect(),
                )
                .await;
                return Err(e);
            }
            let p = Path::from(key.as_str());
            let res = delete_claimed(store.object_store().as_ref(), &claimant, &p).await?;
            crate::failpoint::reached("gc.deleted");
            let (k, deleted) = (key.clone(), res.is_ok());
            ledger.run(move |l| l.finish_delete(&k, deleted)).await?;
            match res {
                Ok(()) => {
                    n += 1;
                    b += bytes;
                }
                Err(e) => return Err(StoreError::io(&p, e)),
            }
        }
    }
}

/// Ends claims a collector will not act on, deleting nothing (the next
/// collector decides); failures are left to the claims' lapse.
async fn hand_back(ledger: &crate::ledger::Ledger, keys: Vec<String>) {
    let _ = ledger
        .run(move |l| keys.iter().try_for_each(|k| l.finish_delete(k, false)))
        .await;
}

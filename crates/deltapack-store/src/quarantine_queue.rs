//! Quarantine off the read path: a restore that proves an object damaged
//! refuses it at once and queues the move to `quarantine/…` here.
//!
//! Moving damaged bytes aside is a deletion from the live keys, so only a
//! handle whose ledger owns the store may make it (`Store::may_quarantine`),
//! and that judgement asks the ledger. A restore must not wait for that:
//! against a ledger that accepts connections and never answers it used to
//! wait out the connect deadline (and with `--deadline 500ms` reported
//! `deadline-exceeded` instead of `corrupt`). So the read path hands the
//! job to a background task and returns its miss; the task judges and
//! moves when the ledger answers (trying to open it again, with growing
//! pauses, for up to [`PATIENCE`]), or gives up (a damaged object that
//! stays is proved damaged again by the next read, and refused again).
//!
//! Bounded: one job per key at a time, at most [`MAX_PENDING`] jobs; more
//! are dropped with a warning (the next read that proves the damage queues
//! it again). `Store::settle_quarantines` waits for the jobs (`Store::close`
//! does, so the CLI's restore still quarantines before it exits when the
//! ledger answers).

use std::collections::HashSet;
use std::sync::Mutex;

use bytes::Bytes;
use object_store::path::Path;

/// How long a job waits for a ledger that cannot be opened before it
/// gives up (the damaged object stays, refused by every read, and the next
/// read that proves the damage queues it again).
pub(crate) const PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// Most quarantine jobs queued at once.
pub(crate) const MAX_PENDING: usize = 64;

/// One queued move to quarantine.
pub(crate) enum Job {
    /// An object proved damaged (two reads agreeing on wrong bytes).
    Object(Path),
    /// A root proved damaged, moved only if it still holds `expected`.
    Root {
        /// The root's key.
        key: Path,
        /// The damaged bytes it held when judged.
        expected: Bytes,
    },
}

impl Job {
    /// The key the job moves.
    pub(crate) fn key(&self) -> &Path {
        match self {
            Job::Object(k) | Job::Root { key: k, .. } => k,
        }
    }
}

/// The keys with a job pending, and a signal when none is.
#[derive(Default)]
pub(crate) struct QuarantineQueue {
    pending: Mutex<HashSet<Path>>,
    idle: tokio::sync::Notify,
}

impl QuarantineQueue {
    /// Takes `key` for a new job: `false` if one is pending for it already
    /// or the queue is full (then nothing is queued).
    fn admit(&self, key: &Path) -> bool {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.contains(key) {
            return false;
        }
        if p.len() >= MAX_PENDING {
            tracing::warn!(%key, "quarantine queue full: this damaged object waits for the next read that finds it");
            return false;
        }
        p.insert(key.clone());
        true
    }

    /// Runs `work`, the job for `key`, in the background unless one is
    /// pending for the key already or the queue is full. Needs a tokio
    /// runtime.
    pub(crate) fn submit(
        self: &std::sync::Arc<Self>,
        key: &Path,
        work: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        if !self.admit(key) {
            return;
        }
        // The key leaves the queue however the job ends (a panic too).
        let done = Done(self.clone(), key.clone());
        tokio::spawn(async move {
            let _done = done;
            work.await
        });
    }

    /// The job for `key` ended (done or given up).
    fn done(&self, key: &Path) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.remove(key);
        if p.is_empty() {
            self.idle.notify_waiters();
        }
    }

    /// Waits until no job is pending.
    pub(crate) async fn settled(&self) {
        loop {
            let idle = self.idle.notified();
            let mut idle = std::pin::pin!(idle);
            idle.as_mut().enable();
            if self
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
            {
                return;
            }
            idle.await;
        }
    }
}

/// Takes a key off the queue when dropped.
struct Done(std::sync::Arc<QuarantineQueue>, Path);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.done(&self.1);
    }
}

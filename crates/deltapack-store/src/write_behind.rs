//! Write-behind publication: return as soon as the snapshot is buffered.
//!
//! [`WriteBehind::publish_async`] follows the order *buffer → index →
//! queue*: the snapshot is placed in an in-process buffer (which is also the
//! index restores consult), then a job is queued for the writer tasks. A
//! restore through [`WriteBehind::restore`] is served from the buffer until
//! the writer has made the root durable, and only then is the entry removed —
//! so a reader of this process never sees the context missing between the
//! call and the durable root (read-your-writes). An index entry without its
//! payload cannot exist by construction (one map holds both); if the map were
//! ever inconsistent that would be reported as an error, never a quiet miss.
//!
//! The buffer serves only what will publish: a publication is checked when
//! it is queued — against the root already stored for its context and any
//! other snapshot buffered for it (a conflict is refused at once), and, for a
//! delta, against its base, which must be stored or itself buffered with the
//! same digest. A delta whose base is still queued waits for that base's
//! publication before its own starts, so turns of one conversation publish
//! in order whatever the number of writers.
//!
//! The queue is bounded and never drops: when it is full the caller publishes
//! inline (and that is counted). [`WriteBehind::shutdown`] stops accepting
//! work and waits until every queued publication finished.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deltapack_format::{ContextDigest, Namespace, Snapshot};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::error::{Result, StoreError};
use crate::keys::RootKey;
use crate::publish::{PublishOutcome, PublishRequest};
use crate::restore::{RestoreOptions, RestoreOutcome, Restored};
use crate::store::{RootStatus, Store};

type Key = (Namespace, ContextDigest);

/// A buffered snapshot: served to readers until its publication finished,
/// which `done` announces (a delta waiting for this base listens to it).
struct Entry {
    snapshot: Arc<Snapshot>,
    digest: deltapack_format::Digest,
    done: tokio::sync::watch::Sender<bool>,
}

/// A queued publication, and the base publication it must wait for.
struct Job {
    req: PublishRequest,
    after: Option<tokio::sync::watch::Receiver<bool>>,
}

/// Waits until a base's publication finished (or its entry is gone).
async fn wait_for(after: Option<tokio::sync::watch::Receiver<bool>>) {
    let Some(mut rx) = after else { return };
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Counters of a write-behind queue.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteBehindReport {
    /// Publications accepted.
    pub accepted: u64,
    /// Publications completed (by the writer tasks or inline).
    pub written: u64,
    /// Publications made inline because the queue was full.
    pub inline: u64,
    /// Restores served from the buffer.
    pub served_from_buffer: u64,
    /// Publications that failed (with their errors).
    pub failed: Vec<String>,
}

struct Shared {
    buffer: Mutex<HashMap<Key, Entry>>,
    accepted: AtomicU64,
    written: AtomicU64,
    inline: AtomicU64,
    served: AtomicU64,
    failed: Mutex<Vec<String>>,
}

/// A write-behind publisher over a store.
pub struct WriteBehind {
    store: Store,
    tx: Option<mpsc::Sender<Job>>,
    shared: Arc<Shared>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Shared {
    fn finish(&self, key: &Key, snapshot: &Arc<Snapshot>, result: Result<PublishOutcome>) {
        match result {
            Ok(_) => {
                self.written.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(error = %e, "write-behind publication failed");
                if let Ok(mut f) = self.failed.lock() {
                    f.push(format!("{}: {e}", key.1));
                }
            }
        }
        // Durable (or failed): the buffer no longer stands in for the store,
        // and deltas waiting for this base may go.
        if let Ok(mut b) = self.buffer.lock() {
            if b.get(key)
                .is_some_and(|e| Arc::ptr_eq(&e.snapshot, snapshot))
            {
                if let Some(e) = b.remove(key) {
                    e.done.send_replace(true);
                }
            }
        }
    }
}

impl WriteBehind {
    /// Starts `workers` writer tasks with a queue of `capacity` jobs.
    pub fn new(store: Store, capacity: usize, workers: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Job>(capacity.max(1));
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let shared = Arc::new(Shared {
            buffer: Mutex::new(HashMap::new()),
            accepted: AtomicU64::new(0),
            written: AtomicU64::new(0),
            inline: AtomicU64::new(0),
            served: AtomicU64::new(0),
            failed: Mutex::new(Vec::new()),
        });
        let workers = (0..workers.max(1))
            .map(|_| {
                let (rx, store, shared) = (rx.clone(), store.clone(), shared.clone());
                tokio::spawn(async move {
                    loop {
                        let job = rx.lock().await.recv().await;
                        let Some(Job { req, after }) = job else { break };
                        wait_for(after).await;
                        let key = (req.identity.namespace(), req.context);
                        let snapshot = req.snapshot.clone();
                        let r = store.publish(req).await.map(|r| r.outcome);
                        shared.finish(&key, &snapshot, r);
                    }
                })
            })
            .collect();
        WriteBehind {
            store,
            tx: Some(tx),
            shared,
            workers,
        }
    }

    /// Checks the publication, buffers the snapshot, makes it visible to
    /// [`WriteBehind::restore`], and queues its publication (after its base's,
    /// if that is still queued); publishes inline if the queue is full.
    ///
    /// Refused at once (nothing buffered): an invalid identity; a context
    /// whose stored root, or another buffered snapshot, holds other bytes
    /// (a conflict); a delta whose base is neither stored nor buffered with
    /// the base snapshot's digest. Publishing a snapshot that is already
    /// stored or buffered is a no-op.
    pub async fn publish_async(&self, req: PublishRequest) -> Result<()> {
        req.identity.validate()?;
        let ns = req.identity.namespace();
        let key = (ns, req.context);
        let snapshot = req.snapshot.clone();
        // The digest the publication will record: layered when the layout
        // allows (a v2.2 root), else BLAKE3 of the encoding.
        let digest = {
            let s = snapshot.clone();
            tokio::task::spawn_blocking(move || publication_digest(&s))
                .await
                .map_err(|e| StoreError::task("digest", e))??
        };
        let conflict = |held: deltapack_format::Digest| {
            Err(StoreError::Invalid(format!(
                "conflict: context {} already holds {held}, this snapshot is {digest}; \
                 nothing was buffered",
                req.context
            )))
        };
        if let Some(held) = self.buffered_digest(&key) {
            return if held == digest {
                Ok(())
            } else {
                conflict(held)
            };
        }
        match self.store.peek_root(&ns, &req.context).await? {
            RootStatus::Found(root) => {
                if let Some(s) = root.summary() {
                    let same = s.result_snapshot_digest == digest
                        || (s.result_snapshot_digest.algorithm() != digest.algorithm()
                            && deltapack_format::layer_digest::digest_like(
                                &snapshot,
                                &s.result_snapshot_digest,
                            )? == s.result_snapshot_digest);
                    return if same {
                        Ok(())
                    } else {
                        conflict(s.result_snapshot_digest)
                    };
                }
            }
            RootStatus::Absent | RootStatus::Unusable(_) => {}
        }
        // A delta's base: buffered here (then this waits for it), or stored.
        let after = match &req.base {
            Some(b) => self.base_ready(ns, b).await?,
            None => None,
        };
        // buffer → index (one map) …
        if let Ok(mut b) = self.shared.buffer.lock() {
            if let Some(e) = b.get(&key) {
                // Buffered meanwhile by a concurrent call.
                return if e.digest == digest {
                    Ok(())
                } else {
                    conflict(e.digest)
                };
            }
            let (done, _) = tokio::sync::watch::channel(false);
            b.insert(
                key,
                Entry {
                    snapshot: snapshot.clone(),
                    digest,
                    done,
                },
            );
        }
        self.shared.accepted.fetch_add(1, Ordering::Relaxed);
        // … → queue.
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| StoreError::Invalid("write-behind queue is shut down".into()))?;
        match tx.try_send(Job { req, after }) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(job))
            | Err(mpsc::error::TrySendError::Closed(job)) => {
                self.shared.inline.fetch_add(1, Ordering::Relaxed);
                wait_for(job.after).await;
                let r = self.store.publish(job.req).await.map(|r| r.outcome);
                let failed = r.as_ref().err().map(|e| e.to_string());
                self.shared.finish(&key, &snapshot, r);
                match failed {
                    None => Ok(()),
                    Some(e) => Err(StoreError::Invalid(format!(
                        "inline publication failed: {e}"
                    ))),
                }
            }
        }
    }

    /// A delta's base `b`: buffered here (the receiver says when its
    /// publication is done, which the delta's waits for) or stored with
    /// the same bytes (`None`); otherwise a base mismatch.
    async fn base_ready(
        &self,
        ns: deltapack_format::Namespace,
        b: &crate::publish::BaseInput,
    ) -> Result<Option<tokio::sync::watch::Receiver<bool>>> {
        let base_key = (ns, b.context);
        let buffered = self.shared.buffer.lock().ok().and_then(|buf| {
            buf.get(&base_key).map(|e| {
                // The caller usually hands back the very snapshot it
                // buffered: then nothing needs hashing here.
                let same = Arc::ptr_eq(&e.snapshot, &b.snapshot);
                (same, e.digest, e.done.subscribe())
            })
        });
        let want = || publication_digest(&b.snapshot).unwrap_or_else(|_| b.snapshot.digest());
        match buffered {
            Some((true, _, rx)) => Ok(Some(rx)),
            Some((false, d, rx)) if d == want() => Ok(Some(rx)),
            Some((_, d, _)) => Err(StoreError::BaseMismatch {
                namespace: ns,
                context: b.context,
                detail: format!("the buffered base is {d}, the given one {}", want()),
            }),
            None => match self.store.peek_root(&ns, &b.context).await? {
                RootStatus::Found(root)
                    if root.summary().is_some_and(|s| {
                        deltapack_format::layer_digest::digest_like(
                            &b.snapshot,
                            &s.result_snapshot_digest,
                        )
                        .is_ok_and(|d| d == s.result_snapshot_digest)
                    }) =>
                {
                    Ok(None)
                }
                _ => Err(StoreError::BaseMismatch {
                    namespace: ns,
                    context: b.context,
                    detail: "the base is neither stored nor queued with these bytes".into(),
                }),
            },
        }
    }

    /// The digest of the snapshot buffered for `key`, if any.
    fn buffered_digest(&self, key: &Key) -> Option<deltapack_format::Digest> {
        self.shared
            .buffer
            .lock()
            .ok()
            .and_then(|b| b.get(key).map(|e| e.digest))
    }

    /// [`Store::restore`], serving buffered (not yet durable) snapshots
    /// from memory.
    pub async fn restore(
        &self,
        key: impl Into<RootKey>,
        opts: RestoreOptions,
    ) -> Result<RestoreOutcome> {
        let root = key.into();
        let key = (root.namespace, root.context);
        let buffered = self
            .shared
            .buffer
            .lock()
            .ok()
            .and_then(|b| b.get(&key).map(|e| (e.snapshot.clone(), e.digest)));
        if let Some((snapshot, digest)) = buffered {
            self.shared.served.fetch_add(1, Ordering::Relaxed);
            return Ok(RestoreOutcome::Hit(Restored {
                snapshot,
                digest,
                schema: "write-behind-buffer",
            }));
        }
        self.store.restore(root, opts).await
    }

    /// Counters so far.
    pub fn report(&self) -> WriteBehindReport {
        WriteBehindReport {
            accepted: self.shared.accepted.load(Ordering::Relaxed),
            written: self.shared.written.load(Ordering::Relaxed),
            inline: self.shared.inline.load(Ordering::Relaxed),
            served_from_buffer: self.shared.served.load(Ordering::Relaxed),
            failed: self
                .shared
                .failed
                .lock()
                .map(|f| f.clone())
                .unwrap_or_default(),
        }
    }

    /// Stops accepting work and waits for every queued publication.
    pub async fn shutdown(mut self) -> Result<WriteBehindReport> {
        drop(self.tx.take());
        for w in self.workers.drain(..) {
            w.await
                .map_err(|e| StoreError::task("write-behind worker", e))?;
        }
        let pending = self.shared.buffer.lock().map(|b| b.len()).unwrap_or(0);
        if pending != 0 {
            return Err(StoreError::Internal(format!(
                "{pending} buffered snapshots left after shutdown"
            )));
        }
        Ok(self.report())
    }
}

/// The snapshot digest a v2 publication of `s` records: the layered digest
/// when the layout allows it, else BLAKE3 of the encoding.
fn publication_digest(s: &deltapack_format::Snapshot) -> Result<deltapack_format::Digest> {
    if deltapack_format::layer_digest::supported(s.header()) {
        Ok(deltapack_format::layer_digest::of_snapshot(s)?.snapshot)
    } else {
        Ok(s.digest())
    }
}

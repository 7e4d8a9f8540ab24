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
//! The queue is bounded and never drops: when it is full the caller publishes
//! inline (and that is counted). [`WriteBehind::shutdown`] stops accepting
//! work and waits until every queued publication finished.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deltapack_format::{CacheIdentity, ContextDigest, Namespace, Snapshot};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::error::{Result, StoreError};
use crate::publish::{PublishOutcome, PublishRequest};
use crate::restore::{RestoreOutcome, Restored};
use crate::store::Store;

type Key = (Namespace, ContextDigest);

/// Counters of a write-behind queue.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
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
    buffer: Mutex<HashMap<Key, (Arc<Snapshot>, deltapack_format::Digest)>>,
    accepted: AtomicU64,
    written: AtomicU64,
    inline: AtomicU64,
    served: AtomicU64,
    failed: Mutex<Vec<String>>,
}

/// A write-behind publisher over a store.
pub struct WriteBehind {
    store: Store,
    tx: Option<mpsc::Sender<PublishRequest>>,
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
        // Durable (or failed): the buffer no longer stands in for the store.
        if let Ok(mut b) = self.buffer.lock() {
            if b.get(key).is_some_and(|s| Arc::ptr_eq(&s.0, snapshot)) {
                b.remove(key);
            }
        }
    }
}

impl WriteBehind {
    /// Starts `workers` writer tasks with a queue of `capacity` jobs.
    pub fn new(store: Store, capacity: usize, workers: usize) -> Self {
        let (tx, rx) = mpsc::channel::<PublishRequest>(capacity.max(1));
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
                        let Some(req) = job else { break };
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

    /// Buffers the snapshot, makes it visible to [`WriteBehind::restore`],
    /// and queues its publication; publishes inline if the queue is full.
    pub async fn publish_async(&self, req: PublishRequest) -> Result<()> {
        req.identity.validate()?;
        let key = (req.identity.namespace(), req.context);
        let snapshot = req.snapshot.clone();
        // buffer → index (one map) …
        let digest = snapshot.digest();
        if let Ok(mut b) = self.shared.buffer.lock() {
            b.insert(key, (snapshot.clone(), digest));
        }
        self.shared.accepted.fetch_add(1, Ordering::Relaxed);
        // … → queue.
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| StoreError::Invalid("write-behind queue is shut down".into()))?;
        match tx.try_send(req) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(req))
            | Err(mpsc::error::TrySendError::Closed(req)) => {
                self.shared.inline.fetch_add(1, Ordering::Relaxed);
                let r = self.store.publish(req).await.map(|r| r.outcome);
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

    /// Restores a context, serving buffered (not yet durable) snapshots from
    /// memory.
    pub async fn restore(
        &self,
        identity: &CacheIdentity,
        context: ContextDigest,
    ) -> Result<RestoreOutcome> {
        let key = (identity.namespace(), context);
        let buffered = self
            .shared
            .buffer
            .lock()
            .ok()
            .and_then(|b| b.get(&key).cloned());
        if let Some((snapshot, digest)) = buffered {
            self.shared.served.fetch_add(1, Ordering::Relaxed);
            return Ok(RestoreOutcome::Hit(Restored {
                snapshot,
                digest,
                schema: "write-behind-buffer",
            }));
        }
        self.store.restore(identity, context).await
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
                .map_err(|e| StoreError::Internal(format!("write-behind worker: {e}")))?;
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

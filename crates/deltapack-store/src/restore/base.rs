//! Bases the old way: a legacy (v1) link's base snapshot, rebuilt or taken
//! from the cache of verified snapshots.
//!
//! Only verified snapshots enter or leave the cache.

use std::sync::Arc;

use bytes::Bytes;
use deltapack_format::{BaseRef, Snapshot};
use object_store::ObjectStoreExt;

use super::outcome::{RestoreOutcome, RESTORE_IN_FLIGHT};
use super::plan::{Plan, Visited};
use crate::error::{MissReason, Result, StoreError};
use crate::fault::{FaultKind, ObjectFault};
use crate::keys::{self};
use crate::stats::Stats;
use crate::store::{RootStatus, Store};
use crate::verify::{check_object, Expected};

impl Store {
    /// Rebuilds a resolved v2 root (flat or chain) into `into` or a new
    /// buffer, on blocking threads. A pass that fails on an object's bytes
    /// or a read error runs once more: damage in transit, or an error that
    /// passed, is not damage at rest; a digest mismatch of the same object
    /// twice is (the caller quarantines it).
    pub(super) fn rebuild(
        &self,
        what: &Plan,
        mut into: Option<&mut [u8]>,
        deadline: Option<std::time::Instant>,
        tally: &super::read::ReadTally,
        tap: Option<&dyn super::read::Tap>,
    ) -> std::result::Result<super::reassembly::Output, super::reassembly::ObjectFault> {
        let source = self.reassembly_source();
        let threads = match (&source, what) {
            // A remote flat root: enough extents at once that their ranges
            // fill the budget of ranges in flight.
            (super::read::Source::Remote(r), Plan::Flat(m)) => {
                r.extent_workers(m.max_extent_bytes.min(m.payload_len.max(1)))
            }
            _ => source.threads(RESTORE_IN_FLIGHT),
        };
        let chain_threads = source.threads(self.config().remote.chain_gets_in_flight.max(1));
        let ctx = |threads| super::read::ReadCtx {
            source: &source,
            threads,
            deadline,
            tally,
            tap,
        };
        let pass = |into: Option<&mut [u8]>, deferred: bool| match what {
            Plan::Flat(m) => super::reassembly::restore_flat(ctx(threads), m, into),
            Plan::Chain { bottom, deltas } => {
                super::compose::restore_chain(ctx(chain_threads), bottom, deltas, into, deferred)
            }
            Plan::V1 { .. } => Err(super::reassembly::ObjectFault::plain(
                "internal: a v1 root reached the v2 rebuild",
            )),
        };
        if matches!(what, Plan::Flat(_)) {
            // A flat restore applies the quarantine rule per extent itself.
            return pass(into, false);
        }
        // A composed pass that fails on an object (or a read) runs again;
        // the object is quarantined only if it fails its check twice. Only
        // the first pass may be deferred (extents read unchecked, the
        // result digest checking every placed byte): a later pass must check
        // every object it reads, or an unchecked read between two failed
        // checks of one object could hide a clean read, and the "two
        // consecutive failed reads" the quarantine rule needs would not be.
        let mut proof = super::reassembly::Proof::default();
        let mut deferred = true;
        loop {
            match pass(into.as_deref_mut(), deferred) {
                Ok(o) => return Ok(o),
                Err(d) => {
                    deferred = false;
                    tracing::warn!(what = %d.what, "composed restore failed");
                    if let Some(f) = proof.record(d) {
                        return Err(f);
                    }
                }
            }
        }
    }

    /// A verified base from the cache, if its root still exists (an
    /// evicted or invalidated base must not keep serving deltas).
    pub(super) async fn cached_base(&self, b: &BaseRef) -> Result<Option<Arc<Snapshot>>> {
        let key = (b.namespace, b.context, b.snapshot_digest);
        let cached = self
            .inner
            .base_cache
            .lock()
            .ok()
            .and_then(|mut c| c.get(&key));
        let Some(s) = cached else { return Ok(None) };
        let rk = keys::root_key(&b.namespace, &b.context);
        match self.object_store().head(&rk).await {
            Ok(_) => {
                Stats::add(&self.stats_ref().base_cache_hits, 1);
                Ok(Some(s))
            }
            Err(object_store::Error::NotFound { .. }) => {
                if let Ok(mut c) = self.inner.base_cache.lock() {
                    c.remove(&key);
                }
                Ok(None)
            }
            Err(e) => Err(StoreError::io(&rk, e)),
        }
    }

    /// Restores (or takes from cache) a whole base snapshot — the old way,
    /// for legacy v1 links — and checks its digest. The base root is read
    /// and checked against the reference *before* its restore is joined, so
    /// links only ever lead to strictly smaller boundaries and no restore
    /// can end up awaiting itself.
    pub(super) async fn base_snapshot(
        &self,
        b: BaseRef,
        visited: Visited,
    ) -> Result<std::result::Result<Arc<Snapshot>, MissReason>> {
        let gone = |detail: String| {
            Ok(Err(MissReason::base_missing(format!(
                "base {}: {detail}",
                b.context
            ))))
        };
        if visited.contains(&(b.namespace, b.context)) {
            return Ok(Err(MissReason::damaged(format!(
                "the base chain loops back to {}",
                b.context
            ))));
        }
        if visited.len() >= self.config().restore.max_base_depth {
            return Ok(Err(MissReason::damaged(format!(
                "base chain deeper than {}",
                self.config().restore.max_base_depth
            ))));
        }
        if let Some(s) = self.cached_base(&b).await? {
            return Ok(Ok(s));
        }
        match self.peek_root(&b.namespace, &b.context).await? {
            RootStatus::Found(d) => match d.summary() {
                Some(s)
                    if s.result_snapshot_digest == b.snapshot_digest
                        && s.boundary == b.boundary => {}
                Some(s) => {
                    return gone(format!(
                        "the root holds {} at {} tokens, the delta needs {} at {}",
                        s.result_snapshot_digest, s.boundary, b.snapshot_digest, b.boundary
                    ))
                }
                None => return gone("incompatible".into()),
            },
            RootStatus::Absent => return gone("absent".into()),
            RootStatus::Unusable(r) => return gone(r.to_string()),
        }
        let (out, _) = self
            .restore_root(b.namespace, b.context, visited)
            .await
            .map_err(|e| match Arc::try_unwrap(e) {
                Ok(e) => e,
                Err(shared) => {
                    StoreError::Internal(format!("shared base restore failed: {shared}"))
                }
            })?;
        match out {
            RestoreOutcome::Hit(r) if r.digest == b.snapshot_digest => {
                // A base materialised the old way is kept for its next delta.
                if let Ok(mut c) = self.inner.base_cache.lock() {
                    c.put(
                        (b.namespace, b.context, b.snapshot_digest),
                        r.snapshot.clone(),
                        self.config().restore.base_cache_bytes,
                    );
                }
                Ok(Ok(r.snapshot))
            }
            RestoreOutcome::Hit(r) => gone(format!("restores to {}", r.digest)),
            RestoreOutcome::Miss(m) => Ok(Err(MissReason::BaseMissing {
                object: m.object().copied(),
                detail: format!("base {}: {m}", b.context),
            })),
        }
    }
    /// Fetches and verifies one object; quarantines it if damaged. `Err`
    /// is an error (the backend failed); `Ok(Err(fault))` a missing or
    /// corrupt object.
    pub(super) async fn fetch_verified(
        &self,
        want: Expected,
    ) -> Result<std::result::Result<Bytes, ObjectFault>> {
        let key = want.object().path();
        let stored_len = want.stored_len();
        // A bad read may be damage in transit (a proxy, a flaky link) rather
        // than at rest: the object is quarantined only if it fails its
        // check twice (the quarantine rule, `Proof`).
        let mut proof = super::reassembly::Proof::default();
        loop {
            let fault = match self.fetch_exact(&key, stored_len).await {
                Ok(bytes) => {
                    let w = want.clone();
                    let checked = tokio::task::spawn_blocking(move || check_object(&w, bytes))
                        .await
                        .map_err(|e| StoreError::task("verify", e))?;
                    match checked {
                        Ok(b) => return Ok(Ok(b)),
                        Err(c) => ObjectFault::failed(&key, c),
                    }
                }
                Err(f) => f,
            };
            tracing::warn!(%key, what = %fault.what, "object failed a read or its check");
            let Some(f) = proof.record(fault) else {
                continue;
            };
            let f = f.into_error()?;
            if matches!(f.kind, FaultKind::Corrupt) && f.key.is_some() {
                self.queue_quarantine(crate::quarantine_queue::Job::Object(key.clone()));
            }
            return Ok(Err(f));
        }
    }
}

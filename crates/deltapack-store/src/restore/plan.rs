//! Planning a restore from roots alone: a flat root, a delta chain walked
//! link by link (or fetched in one round from a v2.1 root's hints, started
//! early when the ledger names the chain), or a legacy v1 root.
//!
//! Reads roots only, never an extent; every link's boundary and digest is
//! checked, cycles are refused and the depth is bounded.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use deltapack_format::{
    BaseRef, ContextDigest, DecodedRoot, Digest, ManifestV1, ManifestV2, Namespace, Snapshot,
};

use super::outcome::RestoreOutcome;
use crate::backend::BackendKind;
use crate::error::{MissReason, Result, StoreError};
use crate::keys::{self};
use crate::stats::Stats;
use crate::store::{RootStatus, Store};

/// A readable root and everything its payload restore needs: the chain
/// below it resolved from roots alone.
pub(super) struct Resolved {
    pub(super) what: Plan,
    pub(super) schema: &'static str,
    pub(super) want: Digest,
    pub(super) result_len: u64,
    pub(super) boundary: u64,
}

/// How a resolved root is rebuilt.
pub(super) enum Plan {
    /// A flat v2 root: its payload is the snapshot.
    Flat(ManifestV2),
    /// A v2 delta chain (oldest delta first) over its bottom: one composed
    /// pass (see `compose`).
    Chain {
        bottom: super::compose::Bottom,
        deltas: Vec<ManifestV2>,
    },
    /// A legacy v1 root, with its base (if any) restored the old way.
    V1 {
        m: ManifestV1,
        base: Option<(Arc<Snapshot>, Digest)>,
    },
}

/// Roots already on the base chain being resolved (a repeat is a cycle).
pub(super) type Visited = Vec<(Namespace, ContextDigest)>;

/// A root's identity: its namespace and context.
pub(super) type RootId = (Namespace, ContextDigest);

/// Roots of a chain being fetched on the ledger's word while the requested
/// root is still being read, so that a long chain costs one round trip for
/// its roots, not two (the requested root, then the ancestors it names).
///
/// Only a hint: each root is read, hashed and authenticated like any other,
/// and the walk follows the roots' own base links, so a stale or forged
/// ledger costs reads, never a wrong result. Dropping it aborts the reads.
pub(super) struct EarlyChain {
    /// The roots the ledger named, once it answered.
    pub(super) named: tokio::sync::oneshot::Receiver<Vec<RootId>>,
    /// Their reads (roots that could not be read are left out).
    pub(super) task: tokio::task::JoinHandle<HashMap<RootId, RootStatus>>,
}

impl Drop for EarlyChain {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Store {
    /// Reads and checks the root of `(ns, ctx)` and resolves what its
    /// payload restore needs — for a v2 delta the whole chain below it, from
    /// roots alone — or the miss that ends it.
    /// `schema` is set as soon as the root is read (a miss below it still
    /// has one).
    #[tracing::instrument(level = "debug", name = "resolve", skip_all, fields(
        namespace = %crate::metrics::short_hex(&ns.hex()),
        context = %crate::metrics::short_hex(&ctx.hex()),
    ))]
    pub(super) async fn resolve(
        &self,
        ns: Namespace,
        ctx: ContextDigest,
        mut visited: Visited,
        schema: &mut Option<&'static str>,
    ) -> Result<std::result::Result<Resolved, MissReason>> {
        // While the requested root is read, the roots the ledger records
        // below it are already being fetched (a hint; see `EarlyChain`).
        let early = self.early_chain(ns, ctx, &visited);
        let root = match self.read_root(&ns, &ctx).await? {
            RootStatus::Absent => return Ok(Err(MissReason::Absent)),
            RootStatus::Unusable(r) => return Ok(Err(r)),
            RootStatus::Found(d) => *d,
        };
        let summary = match root.summary() {
            Some(s) => {
                *schema = Some(s.schema);
                s
            }
            None => {
                return Ok(Err(MissReason::Incompatible {
                    detail: match &root {
                        DecodedRoot::Incompatible { reason } => reason.clone(),
                        _ => "unreadable root".into(),
                    },
                }))
            }
        };
        let limit = self.config().restore.max_restore_bytes;
        if summary.payload_len > limit || summary.result_snapshot_len > limit {
            return Ok(Err(MissReason::damaged(format!(
                    "root {} declares {} payload / {} result bytes, above this store's restore limit {limit}",
                    keys::root_key(&ns, &ctx),
                    summary.payload_len,
                    summary.result_snapshot_len
            ))));
        }
        visited.push((ns, ctx));
        let what = match root {
            DecodedRoot::V2(m) if m.base.is_none() => Plan::Flat(m),
            DecodedRoot::V2(m) => match self.walk_chain(m, visited, early).await? {
                Ok((bottom, deltas)) => Plan::Chain { bottom, deltas },
                Err(miss) => return Ok(Err(miss)),
            },
            DecodedRoot::V1(m) => {
                let base = match m.base {
                    None => None,
                    Some(b) => match self.base_snapshot(b, visited).await? {
                        Ok(s) => Some((s, b.snapshot_digest)),
                        Err(miss) => return Ok(Err(miss)),
                    },
                };
                Plan::V1 { m, base }
            }
            DecodedRoot::Incompatible { reason } => {
                return Ok(Err(MissReason::Incompatible { detail: reason }))
            }
        };
        Ok(Ok(Resolved {
            what,
            schema: summary.schema,
            want: summary.result_snapshot_digest,
            result_len: summary.result_snapshot_len,
            boundary: summary.boundary,
        }))
    }

    /// Follows the base links of the v2 delta `top` down to the chain's
    /// bottom: a flat v2 root, a verified snapshot in the base cache (or
    /// being restored right now by another caller), or a legacy root
    /// restored the old way. Every link is checked from the roots: the base
    /// root must exist, name the boundary and snapshot digest its child
    /// needs, and not repeat (a cycle), within `max_base_depth`.
    pub(super) async fn walk_chain(
        &self,
        top: ManifestV2,
        mut visited: Visited,
        early: Option<EarlyChain>,
    ) -> Result<std::result::Result<(super::compose::Bottom, Vec<ManifestV2>), MissReason>> {
        let max_depth = self.config().restore.max_base_depth;
        let started = Instant::now();
        let mut prefetched = self.prefetch_chain(&top, &visited, early).await?;
        tracing::debug!(
            roots = prefetched.len(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "read the chain's roots"
        );
        let mut deltas = vec![top];
        let corrupt = |what: String| Ok(Err(MissReason::damaged(what)));
        let gone = |b: &BaseRef, detail: String| {
            Ok(Err(MissReason::base_missing(format!(
                "base {}: {detail}",
                b.context
            ))))
        };
        let bottom = loop {
            let Some(b) = deltas.last().and_then(|m| m.base) else {
                return Err(StoreError::Internal("a chain link without a base".into()));
            };
            if visited.contains(&(b.namespace, b.context)) {
                return corrupt(format!(
                    "the base chain of {} loops back to {}",
                    visited[0].1, b.context
                ));
            }
            if deltas.len() >= max_depth {
                return corrupt(format!("base chain deeper than {max_depth}"));
            }
            if let Some(s) = self.cached_base(&b).await? {
                break super::compose::Bottom::Memory(s, b.snapshot_digest);
            }
            let status = match prefetched.remove(&(b.namespace, b.context)) {
                Some(s) => s,
                None => self.read_root(&b.namespace, &b.context).await?,
            };
            let m = match status {
                RootStatus::Absent => return gone(&b, "absent".into()),
                RootStatus::Unusable(r) => return gone(&b, r.to_string()),
                RootStatus::Found(d) => match *d {
                    DecodedRoot::V2(m) => m,
                    DecodedRoot::V1(_) => {
                        // A legacy base: restored the old way, then the
                        // bottom of the composed pass.
                        match self.base_snapshot(b, visited).await? {
                            Ok(s) => break super::compose::Bottom::Memory(s, b.snapshot_digest),
                            Err(miss) => return Ok(Err(miss)),
                        }
                    }
                    DecodedRoot::Incompatible { reason } => return gone(&b, reason),
                },
            };
            if m.result_snapshot_digest != b.snapshot_digest || m.boundary != b.boundary {
                return gone(
                    &b,
                    format!(
                        "the root holds {} at {} tokens, the delta needs {} at {}",
                        m.result_snapshot_digest, m.boundary, b.snapshot_digest, b.boundary
                    ),
                );
            }
            // Another caller is restoring this very base: share its work.
            // (Safe from waiting on ourselves: its chain lies strictly
            // below this link's boundary, checked just above.)
            if let Some(running) = self.inflight(b.namespace, b.context) {
                Stats::add(&self.stats_ref().restores_shared, 1);
                match running.await {
                    Ok((RestoreOutcome::Hit(r), _)) if r.digest == b.snapshot_digest => {
                        break super::compose::Bottom::Memory(r.snapshot, b.snapshot_digest)
                    }
                    Ok((RestoreOutcome::Hit(r), _)) => {
                        return gone(&b, format!("restores to {}", r.digest))
                    }
                    Ok((RestoreOutcome::Miss(miss), _)) => return gone(&b, miss.to_string()),
                    Err(e) => {
                        return Err(StoreError::Internal(format!(
                            "shared base restore failed: {e}"
                        )))
                    }
                }
            }
            visited.push((b.namespace, b.context));
            if m.base.is_none() {
                break super::compose::Bottom::Flat(Box::new(m));
            }
            deltas.push(m);
        };
        deltas.reverse();
        Ok(Ok((bottom, deltas)))
    }

    /// Starts fetching the roots the ledger records below `(ns, ctx)`, if
    /// this process has its ledger open (a restore never opens it) and the
    /// ledger's connection is free right now (a restore never waits for
    /// it). See [`EarlyChain`].
    pub(super) fn early_chain(
        &self,
        ns: Namespace,
        ctx: ContextDigest,
        visited: &Visited,
    ) -> Option<EarlyChain> {
        let ledger = self.inner.ledger.get()?.clone();
        let limit = self.config().restore.max_base_depth as u64;
        let (tx, named) = tokio::sync::oneshot::channel();
        let this = self.clone();
        let mut skip = visited.clone();
        skip.push((ns, ctx));
        let task = tokio::spawn(async move {
            let answer =
                tokio::task::spawn_blocking(move || ledger.try_bases_below(&ns, &ctx, limit)).await;
            let found = match answer {
                Ok(Ok(Some(found))) => found,
                // Busy: the walk goes by the root's own hints.
                Ok(Ok(None)) => return HashMap::new(),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "ledger chain lookup failed; going by the root's hints");
                    return HashMap::new();
                }
                Err(e) => {
                    tracing::debug!(error = %e, "ledger chain lookup task failed");
                    return HashMap::new();
                }
            };
            let found: Vec<RootId> = found.into_iter().filter(|r| !skip.contains(r)).collect();
            if tx.send(found.clone()).is_err() {
                return HashMap::new();
            }
            this.fetch_roots(found, true).await.unwrap_or_default()
        });
        Some(EarlyChain { named, task })
    }

    /// Reads, concurrently, the base and the roots a v2.1 root's chain
    /// hints name (nothing for roots written without hints): one round trip
    /// for the whole chain instead of one per turn. The roots `early`
    /// already fetches on the ledger's word are not read twice; it gives up
    /// (and the hints alone count) if the ledger had not answered by the
    /// time the requested root was read. The walk checks every root it
    /// uses.
    pub(super) async fn prefetch_chain(
        &self,
        top: &ManifestV2,
        visited: &Visited,
        early: Option<EarlyChain>,
    ) -> Result<HashMap<(Namespace, ContextDigest), RootStatus>> {
        let hinted: Vec<RootId> = if top.chain.is_none() {
            Vec::new()
        } else {
            top.base
                .iter()
                .chain(top.chain_hints())
                .map(|b| (b.namespace, b.context))
                .filter(|r| !visited.contains(r))
                .take(self.config().restore.max_base_depth)
                .collect()
        };
        let mut running = None;
        let mut covered = std::collections::HashSet::new();
        if let Some(mut e) = early {
            match e.named.try_recv() {
                Ok(named) => {
                    covered = named.into_iter().collect();
                    running = Some(e);
                }
                // Not answered yet (or failed): dropping `e` aborts it.
                Err(_) => tracing::debug!("the ledger had not named the chain's roots in time"),
            }
        }
        let missing: Vec<RootId> = hinted
            .into_iter()
            .filter(|r| !covered.contains(r))
            .collect();
        tracing::debug!(
            from_ledger = covered.len(),
            from_hints = missing.len(),
            "prefetching the chain's roots"
        );
        let Some(mut e) = running else {
            return self.fetch_roots(missing, false).await;
        };
        let (out, early) = tokio::join!(self.fetch_roots(missing, false), &mut e.task);
        let mut out = out?;
        match early {
            Ok(found) => {
                for (k, v) in found {
                    out.entry(k).or_insert(v);
                }
            }
            Err(e) => return Err(StoreError::task("chain root read", e)),
        }
        Ok(out)
    }

    /// Reads the roots `refs` names, `roots_in_flight` at once, each as its
    /// own task, so that decoding them (a long chain's roots add up to
    /// megabytes of CBOR) runs on every runtime thread, not only on the
    /// one polling the walk. The set aborts whatever is still running if
    /// the restore is dropped (a deadline, a caller gone). `lenient`: a
    /// root that cannot be read is left out (the walk reads it again if it
    /// needs it) instead of failing the whole set.
    pub(super) async fn fetch_roots(
        &self,
        refs: Vec<RootId>,
        lenient: bool,
    ) -> Result<HashMap<(Namespace, ContextDigest), RootStatus>> {
        let mut out = HashMap::new();
        if refs.is_empty() {
            return Ok(out);
        }
        // Local disk: one blocking pass per core reads and checks the
        // roots straight from the directory; what it does not settle
        // (damage, read errors) takes the general path below.
        let mut refs = refs;
        if let BackendKind::Local { root } = self.backend_kind() {
            let lanes = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(refs.len());
            let mut set = tokio::task::JoinSet::new();
            for part in refs.chunks(refs.len().div_ceil(lanes)) {
                let (this, dir, part) = (self.clone(), root.clone(), part.to_vec());
                set.spawn_blocking(move || this.read_chain_roots_local(&dir, &part));
            }
            while let Some(settled) = set.join_next().await {
                let settled = settled.map_err(|e| StoreError::task("chain root read", e))?;
                out.extend(settled);
            }
            refs.retain(|id| !out.contains_key(id));
        }
        let width = self.config().remote.roots_in_flight.max(1);
        let mut pending = refs.into_iter();
        let mut set = tokio::task::JoinSet::new();
        loop {
            while set.len() < width {
                let Some((ns, ctx)) = pending.next() else {
                    break;
                };
                let this = self.clone();
                set.spawn(async move {
                    // The requested root's hints name every root below it:
                    // their own lists of ancestors are not needed.
                    let s = this.read_chain_root(&ns, &ctx).await;
                    ((ns, ctx), s)
                });
            }
            match set.join_next().await {
                None => return Ok(out),
                Some(Ok((id, Ok(s)))) => {
                    out.insert(id, s);
                }
                Some(Ok((id, Err(e)))) if lenient => {
                    tracing::debug!(error = %e, root = %id.1, "prefetch of a root the ledger named failed");
                }
                Some(Ok((_, Err(e)))) => return Err(e),
                Some(Err(e)) => return Err(StoreError::task("chain root read", e)),
            }
        }
    }
}

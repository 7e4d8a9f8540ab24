//! A delta's base: checked against its root before anything is written
//! (digest, boundary, layout), and the chain below it for v2.1 hints.
//!
//! Reads roots only; the base's bytes are hashed only when no verified
//! digest state vouches for them.

use std::sync::Arc;

use deltapack_format::root::MAX_CHAIN_HINTS;
use deltapack_format::{
    BaseRef, CacheIdentity, ContextDigest, DecodedRoot, Digest, DigestState, Namespace, Snapshot,
};

use super::receipt::CheckedBase;
use super::request::BaseInput;
use crate::error::{Result, StoreError};
use crate::stats::Stats;
use crate::store::{RootStatus, Store};

impl Store {
    /// Validates a delta's base against its root; returns the reference and
    /// what lies below the base (see [`Store::chain_below`]).
    pub(super) async fn check_base(
        &self,
        ns: &Namespace,
        id: &CacheIdentity,
        b: &BaseInput,
        result: &Snapshot,
    ) -> Result<CheckedBase> {
        let mismatch = |detail: String| StoreError::BaseMismatch {
            namespace: *ns,
            context: b.context,
            detail,
        };
        let ct = u64::from(id.chunk_tokens);
        let bb = b.snapshot.boundary();
        if bb == 0 || bb % ct != 0 {
            return Err(StoreError::Invalid(format!(
                "base boundary {bb} is not a positive multiple of {ct}"
            )));
        }
        if bb >= result.boundary() {
            return Err(StoreError::Invalid(format!(
                "base boundary {bb} must be below the result boundary {}",
                result.boundary()
            )));
        }
        if b.snapshot.layout() != result.layout() {
            return Err(StoreError::Invalid("base and result layouts differ".into()));
        }
        let (digest, state, below) = match self.read_root(ns, &b.context).await? {
            RootStatus::Found(root) => {
                let s = root
                    .summary()
                    .ok_or_else(|| StoreError::Internal("summary".into()))?;
                if s.boundary != bb {
                    return Err(mismatch(format!(
                        "base root boundary {} != {bb}",
                        s.boundary
                    )));
                }
                let want = s.result_snapshot_digest;
                let (digest, state) = self
                    .verify_base(ns, &b.context, &b.snapshot, want, &root)
                    .await?;
                if digest != want {
                    return Err(mismatch(format!(
                        "the base root holds {want} but the given base snapshot is {digest}"
                    )));
                }
                (digest, state, self.chain_below(&root).await?)
            }
            RootStatus::Absent => return Err(mismatch("no base root is published".into())),
            RootStatus::Unusable(r) => {
                return Err(mismatch(format!("the base root is unusable: {r}")))
            }
        };
        Ok(CheckedBase {
            base: BaseRef {
                namespace: *ns,
                context: b.context,
                snapshot_digest: digest,
                boundary: bb,
            },
            below,
            state,
        })
    }

    /// The digest of a caller's base snapshot by the definition of `want`
    /// (its root's), and the base's digest state when there is one. A
    /// snapshot this handle published or restored under that root and the
    /// caller still holds (the same `Arc`) was verified then: it is not
    /// hashed again. Any other base is hashed (for a layered digest keeping
    /// the state, so the result's digest extends it).
    pub(super) async fn verify_base(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        snapshot: &Arc<Snapshot>,
        want: Digest,
        root: &DecodedRoot,
    ) -> Result<(Digest, Option<Arc<DigestState>>)> {
        let key = (*ns, *ctx, want);
        let held = match self.inner.base_cache.lock() {
            Ok(c) if c.holds(&key, snapshot) => Some(c.state(&key)),
            _ => None,
        };
        match held {
            Some(Some(state)) => return Ok((want, Some(state))),
            // Verified when handed out, but without a state (a restore does
            // not build one): the root's recorded turn state, proven with
            // about a page per stream, or none.
            Some(None) => {
                let state = self.resume_state(*ns, *ctx, root, snapshot).await;
                return Ok((want, state));
            }
            None => {}
        }
        let s = snapshot.clone();
        let layered = want.algorithm() == deltapack_format::Algorithm::Blake3Layers;
        let hashed = s.encoded().len() as u64;
        let (digest, state) = tokio::task::spawn_blocking(move || {
            if layered {
                DigestState::capture(&s).map(|(d, st)| (d.snapshot, Some(Arc::new(st))))
            } else {
                Ok((s.digest(), None))
            }
        })
        .await
        .map_err(|e| StoreError::task("base digest", e))??;
        Stats::add(&self.stats_ref().snapshot_bytes_hashed, hashed);
        if digest == want {
            if let (Ok(mut c), Some(st)) = (self.inner.base_cache.lock(), &state) {
                c.put_handed_out(key, snapshot);
                c.put_state(key, st.clone());
            }
        }
        Ok((digest, state))
    }

    /// The chain a delta on `base` would sit on: the roots below `base`,
    /// nearest first, down to the flat root, and the payload bytes of
    /// `base` and all of them. From `base`'s own hints when it has them,
    /// else by reading the roots link by link (a chain written before v2.1,
    /// or through legacy roots). `None` if the chain cannot be followed to
    /// a flat root within `max_base_depth`.
    pub(super) async fn chain_below(
        &self,
        base: &DecodedRoot,
    ) -> Result<Option<(Vec<BaseRef>, u64)>> {
        let Some(s) = base.summary() else {
            return Ok(None);
        };
        let Some(next) = s.base else {
            return Ok(Some((Vec::new(), s.payload_len)));
        };
        if let DecodedRoot::V2(m) = base {
            if let Some(c) = &m.chain {
                let mut ancestors = Vec::with_capacity(c.ancestors.len() + 1);
                ancestors.push(next);
                ancestors.extend_from_slice(&c.ancestors);
                return Ok(Some((ancestors, c.payload_bytes)));
            }
        }
        let mut ancestors = Vec::new();
        let mut bytes = s.payload_len;
        let mut link = Some(next);
        while let Some(b) = link {
            if ancestors.len() >= self.config().restore.max_base_depth.min(MAX_CHAIN_HINTS) {
                return Ok(None);
            }
            let summary = match self.peek_root(&b.namespace, &b.context).await? {
                RootStatus::Found(d) => match d.summary() {
                    Some(x) => x,
                    None => return Ok(None),
                },
                _ => return Ok(None),
            };
            if summary.result_snapshot_digest != b.snapshot_digest
                || summary.boundary != b.boundary
                || ancestors
                    .last()
                    .is_some_and(|a: &BaseRef| a.boundary <= b.boundary)
            {
                return Ok(None);
            }
            ancestors.push(b);
            bytes += summary.payload_len;
            link = summary.base;
        }
        Ok(Some((ancestors, bytes)))
    }
}

//! The commit, the last step of a publication: encoding the v2 root and creating it
//! (create-if-absent), and what an existing root means for a request
//! (idempotent success or a conflict; the existing root always wins).
//!
//! The root is written only after every object it names is durable.

use std::sync::Arc;

use bytes::Bytes;
use deltapack_format::layer_digest;
use deltapack_format::root::{self, RootMeta};
use deltapack_format::{ChainHints, ContextDigest, Digest, DigestState, Namespace, Snapshot};

use super::receipt::{PublishOutcome, PublishReceipt};
use crate::backend::{put_create, PutOutcome};
use crate::error::{Result, StoreError};
use crate::keys;
use crate::stats::Stats;
use crate::store::{RootStatus, Store};

impl Store {
    /// Creates the root of a publication whose objects are durable (their
    /// protection is the caller's), records it in the ledger, and settles
    /// the receipt's outcome: created, or whatever an existing root implies.
    pub(crate) async fn create_root(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        root_bytes: Bytes,
        receipt: &mut PublishReceipt,
        snapshot: Option<&Arc<Snapshot>>,
    ) -> Result<()> {
        let entry = match root::decode(&root_bytes, self.inner.mac_key.as_ref())?.summary() {
            Some(s) => crate::ledger::RootEntry::from_summary(&s, root_bytes.len() as u64),
            None => {
                return Err(StoreError::Internal(
                    "a root just encoded does not decode".into(),
                ))
            }
        };

        let key = keys::root_key(ns, ctx);
        let root_len = root_bytes.len() as u64;
        let root_digest = Digest::blake3(&root_bytes);
        // An I/O error on the root write may hide a PUT that landed but whose
        // response was lost: read the root back before reporting failure.
        // Root creation holds the root lock (local disk), so a sweep judging
        // this context under the lock sees it either absent or complete.
        // A create can lose to a root that another process then removes
        // (eviction, prune, invalidation) before this one reads it back. That
        // is an ordinary race, not a broken invariant: this publication's
        // objects are still protected by `guard`, so it simply creates again.
        // Bounded, because each retry needs another writer to create and
        // another to delete the same context in between.
        const CREATE_ATTEMPTS: usize = 8;
        let mut attempt = 0;
        loop {
            attempt += 1;
            // The lock also covers the ledger record: a removal of this
            // context (root deleted, then forgotten in the ledger) cannot
            // interleave with the creation and record of the new root.
            let lock = self.root_lock().await?;
            let put = put_create(self.object_store().as_ref(), &key, root_bytes.clone()).await;
            if matches!(put, Ok(PutOutcome::Created)) {
                self.ledger_record(&entry).await;
            }
            drop(lock);
            let created = match put {
                Ok(o) => o,
                Err(e @ StoreError::Io { .. }) => {
                    tracing::warn!(error = %e, %key, "root write failed; reading the root back");
                    match self.existing_outcome(ns, ctx, receipt, snapshot).await {
                        Ok(Some(_)) => PutOutcome::Existed,
                        _ => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            match created {
                PutOutcome::Created => {
                    receipt.outcome = PublishOutcome::Created;
                    receipt.root_digest = Some(root_digest);
                    receipt.bytes_written += root_len;
                    Stats::add(&self.stats_ref().roots_written, 1);
                    Stats::add(&self.stats_ref().bytes_written, root_len);
                    break;
                }
                PutOutcome::Existed => {
                    // Lost a race (or an earlier attempt whose response was
                    // lost landed): the root that is there decides.
                    match self.existing_outcome(ns, ctx, receipt, snapshot).await? {
                        Some(done) => {
                            if done == PublishOutcome::AlreadyPresent {
                                self.ledger_touch(ns, ctx).await;
                            }
                            receipt.outcome = done;
                            break;
                        }
                        None if attempt < CREATE_ATTEMPTS => {
                            tracing::info!(
                                %key,
                                attempt,
                                "the root this publication lost to is gone again; creating it again"
                            );
                        }
                        // Not a broken invariant: other writers keep
                        // creating and removing this context. A typed,
                        // retryable outcome; nothing of this publication's
                        // is visible.
                        None => {
                            return Err(StoreError::Concurrent(format!(
                                "root {key} existed at create but was removed before it could \
                                 be read, {CREATE_ATTEMPTS} times in a row (other processes \
                                 keep publishing and evicting this context); publish again"
                            )))
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// If a root exists at `(ns, ctx)`, the outcome it implies for this
    /// request. A damaged existing root is quarantined and treated as absent.
    pub(super) async fn existing_outcome(
        &self,
        ns: &Namespace,
        ctx: &ContextDigest,
        receipt: &mut PublishReceipt,
        snapshot: Option<&Arc<Snapshot>>,
    ) -> Result<Option<PublishOutcome>> {
        match self.read_root(ns, ctx).await? {
            RootStatus::Absent => Ok(None),
            RootStatus::Unusable(reason) => {
                // Corrupt roots were already quarantined by read_root; an
                // incompatible or unauthenticated root is left alone and wins.
                match reason {
                    crate::MissReason::Corrupt { .. } => Ok(None),
                    other => {
                        receipt.schema = format!("unusable ({other})");
                        Ok(Some(PublishOutcome::Conflict))
                    }
                }
            }
            RootStatus::Found(root) => {
                let s = root
                    .summary()
                    .ok_or_else(|| StoreError::Internal("summary".into()))?;
                receipt.schema = s.schema.to_string();
                receipt.root_digest = None;
                let existing = s.result_snapshot_digest;
                // A root written with the other digest definition (a v1 or
                // v2.1 root of the same bytes, say) is the same snapshot if
                // the caller's bytes hash to its digest by its definition.
                let same = existing == receipt.snapshot_digest
                    || match snapshot {
                        Some(snap)
                            if existing.algorithm() != receipt.snapshot_digest.algorithm() =>
                        {
                            let snap = snap.clone();
                            tokio::task::spawn_blocking(move || {
                                deltapack_format::layer_digest::digest_like(&snap, &existing)
                            })
                            .await
                            .map_err(|e| StoreError::task("digest", e))??
                                == existing
                        }
                        _ => false,
                    };
                if same {
                    Ok(Some(PublishOutcome::AlreadyPresent))
                } else {
                    receipt.existing_snapshot_digest = Some(s.result_snapshot_digest);
                    Ok(Some(PublishOutcome::Conflict))
                }
            }
        }
    }

    /// Encodes (and, on keyed stores, MACs) a v2 root.
    pub(crate) fn encode_v2(
        &self,
        meta: &RootMeta,
        layers: Option<(&[layer_digest::StreamDigest], &DigestState)>,
        payload_len: u64,
        payload_digest: Digest,
        entries: Vec<deltapack_format::ExtentEntry>,
        chain: Option<ChainHints>,
    ) -> Result<Bytes> {
        let m = self.inner.config.publication.max_extent_bytes;
        let mut manifest = match layers {
            // A layered root records the result's turn state, so whoever
            // holds the result later publishes the next turn without
            // hashing it (`Store::turn_from`).
            Some((l, state)) => deltapack_format::ManifestV2::new_layered(
                meta,
                l,
                payload_len,
                payload_digest,
                m,
                entries,
            )?
            .with_turn_state(&state.stored())?,
            None => {
                deltapack_format::ManifestV2::new(meta, payload_len, payload_digest, m, entries)?
            }
        };
        if let Some(c) = chain {
            manifest = manifest.with_chain(c)?;
        }
        Ok(Bytes::from(root::encode_v2(
            &manifest,
            self.inner.mac_key.as_ref(),
        )?))
    }
}

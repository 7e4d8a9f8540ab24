//! What a publication writes, settled before its first write: a delta laid
//! out or rebased flat (the decision is `plan.rs`'s), the result digest
//! started on blocking threads and awaited only where needed, and the
//! payload as zero-copy parts of the caller's snapshot.
//!
//! Nothing here writes to the store; `mod.rs` runs these steps in order and
//! `write.rs`/`commit.rs` do the writing.

use std::sync::Arc;

use bytes::Bytes;
use deltapack_format::layer_digest::StreamDigest;
use deltapack_format::{BaseRef, ChainHints, DeltaHeader, DeltaLayout, Digest, DigestState};
use deltapack_format::{Snapshot, SnapshotHeader};
use futures::FutureExt;

use super::payload::{LateDigest, Payload};
use super::plan;
use super::receipt::{CheckedBase, ResultDigest};
use super::request::PublishRequest;
use crate::error::{Result, StoreError};
use crate::stats::Stats;
use crate::store::Store;

/// The shape of a publication: a delta (its layout and chain hints) or a
/// flat snapshot (no base, or rebased by the chain policy).
pub(super) struct Shape {
    /// Whether the root records the layered digest (v2.2).
    pub(super) layered: bool,
    /// A delta's layout (`None`: flat).
    pub(super) layout: Option<DeltaLayout>,
    /// A v2 delta's chain hints.
    pub(super) chain: Option<ChainHints>,
    /// A delta asked for was published flat.
    pub(super) rebased: bool,
    /// The base the root records (`None`: flat).
    pub(super) base_ref: Option<BaseRef>,
    /// The base's digest state, when known: a layered result digest
    /// extends it instead of hashing the whole result.
    pub(super) base_state: Option<Arc<DigestState>>,
}

impl Store {
    /// Lays out a delta (the header's length does not depend on the result
    /// digest, so a stand-in serves) and lets its size decide, with the
    /// chain below the base, whether the chain policy rebases it.
    pub(super) async fn shape(
        &self,
        req: &PublishRequest,
        checked: Option<CheckedBase>,
    ) -> Result<Shape> {
        let snap = &req.snapshot;
        let layered = plan::layered(req.format, snap.header());
        let mut layout: Option<DeltaLayout> = None;
        let mut chain: Option<ChainHints> = None;
        let mut rebased = false;
        if let (Some(b), Some(CheckedBase { base: r, below, .. })) = (&req.base, &checked) {
            let (base, result) = (b.snapshot.clone(), snap.clone());
            let (chunk, base_digest) = (req.identity.chunk_tokens, r.snapshot_digest);
            let stand_in = plan::stand_in_digest(layered);
            let l = tokio::task::spawn_blocking(move || {
                DeltaLayout::new(chunk, &base, &result, base_digest, stand_in)
            })
            .await
            .map_err(|e| StoreError::task("delta layout", e))??;
            let delta_len = l.header_bytes()?.len() as u64 + l.tails_len();
            let decided = plan::decide_chain(
                req.format,
                below.as_ref(),
                delta_len,
                snap.encoded().len() as u64,
                &self.config().publication.chain,
            );
            (rebased, chain) = (decided.rebased, decided.chain);
            if rebased {
                tracing::info!(context = %req.context, "chain policy: publishing flat");
            } else {
                layout = Some(l);
            }
        }
        let (base_ref, base_state) = match checked.filter(|_| !rebased) {
            Some(c) => (Some(c.base), c.state),
            None => (None, None),
        };
        Ok(Shape {
            layered,
            layout,
            chain,
            rebased,
            base_ref,
            base_state,
        })
    }

    /// Starts the result digest on blocking threads, when one is needed
    /// beyond the payload digest (a layered digest, or a delta's result):
    /// a flat snapshot's `blake3:` digest is its payload digest, which the
    /// extent names give for free. A layered digest extends the base's
    /// state when the result keeps the base's settled pages (compared byte
    /// for byte by the delta's layout), so only the new pages are hashed.
    pub(super) fn start_digest(&self, snap: &Arc<Snapshot>, shape: &Shape) -> Option<LateDigest> {
        if !shape.layered && shape.base_ref.is_none() {
            return None;
        }
        let (s, layered, stats) = (snap.clone(), shape.layered, self.clone());
        let reused = shape.layout.as_ref().map(|l| l.header.reused_pages.clone());
        let base_state = shape.base_state.clone();
        // Hashing runs beside the extent writes, whose copy and naming
        // threads need a core too.
        let h = tokio::task::spawn_blocking(move || {
            let extend = base_state.filter(|st| {
                reused
                    .as_ref()
                    .is_some_and(|r| r.iter().zip(st.settled()).all(|(have, need)| have >= need))
            });
            let hashed = |n: u64| Stats::add(&stats.stats_ref().snapshot_bytes_hashed, n);
            if !layered {
                hashed(s.encoded().len() as u64);
                return Ok(Arc::new(ResultDigest {
                    digest: Digest::blake3(s.encoded()),
                    layered: None,
                }));
            }
            let (d, st) = match &extend {
                Some(st) => {
                    hashed(s.payload().len() as u64 - settled_bytes(s.header(), st.settled()));
                    st.extend_to(&s)
                }
                None => {
                    hashed(s.encoded().len() as u64);
                    DigestState::capture(&s)
                }
            }
            .map_err(|e| e.to_string())?;
            Ok::<_, String>(Arc::new(ResultDigest {
                digest: d.snapshot,
                layered: Some((d, Arc::new(st))),
            }))
        });
        Some(
            async move { h.await.map_err(|e| format!("digest task: {e}"))? }
                .boxed()
                .shared(),
        )
    }
}

/// The result's snapshot digest: the started one, or (a flat snapshot
/// whose digest is needed before its payload is written, e.g. to compare
/// with an existing root) hashed now.
pub(super) async fn snapshot_digest(
    digest: Option<&LateDigest>,
    snap: &Arc<Snapshot>,
) -> Result<Digest> {
    match digest {
        Some(d) => d
            .clone()
            .await
            .map(|r| r.digest)
            .map_err(StoreError::Internal),
        None => {
            let s = snap.clone();
            tokio::task::spawn_blocking(move || s.digest())
                .await
                .map_err(|e| StoreError::task("digest", e))
        }
    }
}

/// The result's stream digests and digest state, once the started digest
/// is done (`None` for a digest that is not layered).
pub(super) async fn layered_result(
    digest: Option<&LateDigest>,
) -> Result<Option<(Vec<StreamDigest>, Arc<DigestState>)>> {
    Ok(match digest {
        Some(d) => d
            .clone()
            .await
            .map_err(StoreError::Internal)?
            .layered
            .as_ref()
            .map(|(l, st)| (l.streams.clone(), st.clone())),
        None => None,
    })
}

/// A delta's payload as parts of the caller's snapshot (nothing copied):
/// a stand-in header, written last once the result digest is known (it has
/// the same length), then the changed and appended tails. Also returns the
/// header to record in the root's chain hints.
pub(super) fn delta_payload(
    layout: DeltaLayout,
    digest: &LateDigest,
    whole: &Bytes,
) -> Result<(Payload, DeltaHeader)> {
    let stand_in = Bytes::from(layout.header_bytes()?);
    let mut parts = vec![stand_in.clone()];
    parts.extend(layout.tails.iter().map(|r| whole.slice(r.clone())));
    let template = layout.header.clone();
    let (d, mut late) = (digest.clone(), layout.header);
    let header = async move {
        late.result_digest = d.await?.digest;
        let bytes = DeltaLayout {
            header: late,
            tails: Vec::new(),
        }
        .header_bytes()
        .map_err(|e| e.to_string())?;
        if bytes.len() != stand_in.len() {
            return Err("the delta header changed length".to_string());
        }
        Ok(Bytes::from(bytes))
    }
    .boxed()
    .shared();
    Ok((Payload::from_parts(parts, Some(header)), template))
}

/// Bytes of a snapshot's payload in the settled pages `settled` (per
/// stream) — what a digest extension does not hash again.
pub(super) fn settled_bytes(h: &SnapshotHeader, settled: &[u64]) -> u64 {
    h.layout
        .groups
        .iter()
        .zip(settled)
        .map(|(g, &k)| g.page_bytes() * k)
        .sum()
}

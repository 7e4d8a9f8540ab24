//! The one place this crate calls `deltapack-store`.
//!
//! Everything else in the crate (the Python classes, buffer handling, the
//! runtime glue) talks to [`Engine`] and the plain types below, never to
//! `deltapack_store` directly, so that a change of the store's Rust API
//! (e.g. the restore calls being narrowed to `restore(key, opts)` /
//! `restore_into(key, buf, opts)`) is adapted here and nowhere else.
//!
//! No Python types appear in this module: it is async Rust over the store,
//! and the callers decide where it runs (a Python thread with the GIL
//! released, or the asyncio bridge's tokio runtime).

use std::sync::Arc;
use std::time::Duration;

use deltapack_format::{CacheIdentity, ContextDigest, Namespace, Snapshot};
use deltapack_store as ds;

/// How a store call failed. Each kind becomes one Python exception class
/// (see `errors.rs`); the text is the Rust error's message.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The store is full (budget or disk) and nothing evictable frees
    /// enough; nothing was written.
    Capacity(String),
    /// The context already holds a different snapshot; the existing root
    /// wins and nothing was written.
    Conflict(String),
    /// The caller's input is invalid (identity, boundaries, buffer size,
    /// a base that does not match its root, …); nothing was read or written.
    BadInput(String),
    /// Storage or ledger I/O failed (permissions, network, a full ledger
    /// disk, …).
    Io(String),
    /// This handle's ledger is not the one the store names: it may read,
    /// not publish or delete; nothing was changed.
    LedgerMismatch(String),
    /// Anything else (unsupported operation, broken internal invariant).
    Other(String),
}

impl From<ds::StoreError> for Failure {
    fn from(e: ds::StoreError) -> Self {
        use ds::StoreError as E;
        let text = e.to_string();
        match e {
            E::Capacity(_) => Failure::Capacity(text),
            E::Invalid(_) | E::InputChanged(_) | E::Format(_) | E::BaseMismatch { .. } => {
                Failure::BadInput(text)
            }
            E::Io { .. } | E::Open(_) | E::Ledger(_) | E::LedgerUnavailable(_) => Failure::Io(text),
            E::LedgerMismatch { .. } => Failure::LedgerMismatch(text),
            E::Concurrent(_) => Failure::Conflict(text),
            _ => Failure::Other(text),
        }
    }
}

/// Result of this module's calls.
pub(crate) type Result<T> = std::result::Result<T, Failure>;

/// Why a restore did not produce a snapshot: a stable label (`absent`,
/// `corrupt`, `incompatible`, `base-missing`, `deadline-exceeded`,
/// `unauthenticated`) and the store's explanation.
#[derive(Debug, Clone)]
pub(crate) struct MissInfo {
    /// Stable label.
    pub(crate) reason: &'static str,
    /// Full text (label and detail).
    pub(crate) detail: String,
    /// The store key of the object that failed verification or is missing
    /// (`corrupt`, `base-missing`), when the store names one.
    pub(crate) object: Option<String>,
}

impl From<&ds::MissReason> for MissInfo {
    fn from(m: &ds::MissReason) -> Self {
        MissInfo {
            reason: m.label(),
            detail: m.to_string(),
            object: m.object().map(|o| o.to_string()),
        }
    }
}

/// A verified snapshot handed out by [`Engine::restore`].
pub(crate) struct Verified {
    /// The snapshot (shared with the store's base cache, read-only).
    pub(crate) snapshot: Arc<Snapshot>,
    /// Its digest (`blake3:…`).
    pub(crate) digest: String,
    /// Schema of the root it came from.
    pub(crate) schema: &'static str,
}

/// The result of [`Engine::restore`].
pub(crate) enum Restore {
    /// Verified.
    Hit(Verified),
    /// No usable state.
    Miss(MissInfo),
}

/// The result of [`Engine::restore_into`].
pub(crate) enum RestoreInto {
    /// The buffer holds the verified snapshot encoding.
    Hit {
        /// Bytes written (the buffer's length).
        len: u64,
        /// Snapshot digest.
        digest: String,
    },
    /// No usable state; see the buffer contract in the module docs of the
    /// Python package.
    Miss(MissInfo),
}

/// In which order a layer-wise restore ([`Engine::restore_layers`]) reads
/// and hands out the layers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum LayerOrder {
    /// Layer 0 of every group, then layer 1 of every group, … (the order a
    /// forward pass needs them).
    #[default]
    LayerMajor,
    /// Group by group, each group's layers in order (payload order).
    GroupMajor,
    /// These `(group, layer)` pairs first, in this order; the layers left
    /// out follow in payload order.
    Custom(Vec<(usize, usize)>),
}

/// A layer handed out by [`Engine::restore_layers`]: where its proven
/// bytes are in the caller's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LayerOut {
    /// The page group (index in the layout).
    pub(crate) group: usize,
    /// The layer within its group.
    pub(crate) layer: usize,
    /// The stream's index in payload order.
    pub(crate) stream: usize,
    /// Offset of the layer's first byte in the snapshot encoding.
    pub(crate) start: u64,
    /// Offset just past its last byte.
    pub(crate) end: u64,
    /// How it was proven: `stream-digest` (its own digest, recorded by a
    /// v2.2 root) or `whole-snapshot` (roots without stream digests: the
    /// whole snapshot was verified first).
    pub(crate) proof: &'static str,
}

impl From<&ds::LayerReady> for LayerOut {
    fn from(r: &ds::LayerReady) -> Self {
        LayerOut {
            group: r.group,
            layer: r.layer,
            stream: r.stream,
            start: r.range.start,
            end: r.range.end,
            proof: match r.proof {
                ds::LayerProof::StreamDigest => "stream-digest",
                ds::LayerProof::WholeSnapshot => "whole-snapshot",
                _ => "unknown",
            },
        }
    }
}

/// The caller's memory of a layer-wise restore, carried into its future.
#[derive(Clone, Copy)]
struct RawMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: only an address and a length; what may be done with the memory
// is `Engine::restore_layers`'s contract, whose future carries it.
unsafe impl Send for RawMemory {}

impl RawMemory {
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// Which ledger policy to apply when the store is opened.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) enum LedgerPolicy {
    /// Trust the persisted ledger after a consistency check (rebuilt if it
    /// disagrees with the store).
    #[default]
    Load,
    /// Rebuild the ledger from the store.
    Rebuild,
}

/// A publication's result: its receipt (as JSON) and the [`ds::Turn`] that
/// continues the conversation, when the root records one.
pub(crate) type Published = (serde_json::Value, Option<ds::Turn>);

/// Everything needed to open a store.
#[derive(Debug, Clone, Default)]
pub(crate) struct OpenOptions {
    /// `file:///dir` (or a plain path), `s3://bucket/prefix`, `memory://`.
    pub(crate) url: String,
    /// Ledger policy at open.
    pub(crate) ledger: LedgerPolicy,
    /// The ledger's database (`sqlite:///path`, `postgres://…`); `None`:
    /// the store's default.
    pub(crate) ledger_url: Option<String>,
    /// Hard byte budget.
    pub(crate) budget: Option<u64>,
    /// Minimum free space to keep on a local store's filesystem.
    pub(crate) min_free: Option<u64>,
    /// Grace period of condemned objects (`None`: the store's default, 1 h).
    pub(crate) grace: Option<Duration>,
    /// Secret authenticating roots.
    pub(crate) root_key: Option<Vec<u8>>,
    /// Extent size for v2 publication.
    pub(crate) max_extent_bytes: Option<u64>,
    /// zstd level for extents (`None`: raw).
    pub(crate) compression: Option<i32>,
    /// Chain policy: most deltas above a flat root (`Some(0)`: unbounded).
    pub(crate) max_chain_depth: Option<u32>,
    /// Chain policy: largest read overhead (negative: unbounded).
    pub(crate) max_read_overhead: Option<f64>,
    /// Prefill rate in tokens/s, to count hits that beat recomputation.
    pub(crate) prefill_rate: Option<f64>,
    /// A node-local tier in front of the store (its directory).
    pub(crate) tier: Option<String>,
    /// The tier's byte budget.
    pub(crate) tier_budget: Option<u64>,
    /// Whether publications are acknowledged in the tier (uploaded behind)
    /// rather than in the origin.
    pub(crate) tier_ack_tier: bool,
}

/// A base for a delta publication: its context and its snapshot.
pub(crate) struct Base {
    /// Context of the base root (same namespace).
    pub(crate) context: ContextDigest,
    /// The base snapshot the caller holds.
    pub(crate) snapshot: Arc<Snapshot>,
}

/// An open store.
#[derive(Clone)]
pub(crate) struct Engine {
    store: ds::Store,
    url: String,
}

impl Engine {
    /// Opens a store (no I/O beyond preparing a local directory; the
    /// ledger is opened on first use).
    pub(crate) fn open(o: OpenOptions) -> Result<Engine> {
        let defaults = ds::StoreConfig::default();
        let mut chain = defaults.publication.chain;
        if let Some(k) = o.max_chain_depth {
            chain.max_depth = Some(k).filter(|k| *k > 0);
        }
        if let Some(x) = o.max_read_overhead {
            chain.max_read_overhead = Some(x).filter(|x| *x >= 0.0);
        }
        let (extent, grace) = (
            defaults.publication.max_extent_bytes,
            defaults.capacity.grace,
        );
        let config = defaults
            .with_max_extent_bytes(o.max_extent_bytes.unwrap_or(extent))
            .with_compression(o.compression)
            .with_mac_secret(o.root_key)
            .with_chain(chain)
            .with_budget_bytes(o.budget)
            .with_min_free_bytes(o.min_free)
            .with_grace(o.grace.unwrap_or(grace))
            .with_cold_start(match o.ledger {
                LedgerPolicy::Load => ds::ColdStart::Load,
                LedgerPolicy::Rebuild => ds::ColdStart::Rebuild,
            })
            .with_prefill_tokens_per_s(o.prefill_rate)
            .with_ledger(o.ledger_url)
            .with_tier(o.tier.map(|url| {
                ds::TierConfig::new(url)
                    .with_budget_bytes(o.tier_budget)
                    .with_ack(if o.tier_ack_tier {
                        ds::TierAck::Tier
                    } else {
                        ds::TierAck::Origin
                    })
            }));
        let store = ds::Store::open(&o.url, config)?;
        Ok(Engine { store, url: o.url })
    }

    /// The URL the store was opened with.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Publishes `snapshot` under `context` (flat, or a delta on `base`).
    /// Returns the receipt as JSON. A conflict (the context holds another
    /// snapshot) is a [`Failure::Conflict`].
    pub(crate) async fn publish(
        &self,
        identity: CacheIdentity,
        context: ContextDigest,
        snapshot: Arc<Snapshot>,
        base: Option<Base>,
    ) -> Result<Published> {
        let req = ds::PublishRequest {
            identity,
            context,
            snapshot,
            base: base.map(|b| ds::BaseInput {
                context: b.context,
                snapshot: b.snapshot,
            }),
            format: ds::RootFormat::V2,
        };
        let receipt = self.store.publish(req).await?;
        receipt_value(receipt)
    }

    /// Publishes the turn after `prev` from its new pages alone (see
    /// `deltapack_store::Store::publish_turn`); returns the receipt as JSON
    /// and the handle for the turn after.
    pub(crate) async fn publish_turn(
        &self,
        prev: ds::Turn,
        identity: CacheIdentity,
        context: ContextDigest,
        boundary: u64,
        tail: bytes::Bytes,
    ) -> Result<Published> {
        let req = ds::TurnRequest {
            identity,
            context,
            boundary,
            tail,
        };
        let receipt = self.store.publish_turn(&prev, req).await?;
        receipt_value(receipt)
    }

    /// A turn handle for a snapshot published under `context`.
    pub(crate) async fn turn_from(
        &self,
        identity: CacheIdentity,
        context: ContextDigest,
        snapshot: Arc<Snapshot>,
    ) -> Result<ds::Turn> {
        Ok(self.store.turn_from(&identity, context, &snapshot).await?)
    }

    /// Restores `(ns, context)` into a snapshot owned by the store
    /// (single-flight with concurrent restores of the same root).
    pub(crate) async fn restore(
        &self,
        ns: Namespace,
        context: ContextDigest,
        timeout: Option<Duration>,
    ) -> Result<Restore> {
        let opts = options(timeout);
        Ok(match self.store.restore((ns, context), opts).await? {
            ds::RestoreOutcome::Hit(r) => Restore::Hit(Verified {
                snapshot: r.snapshot,
                digest: r.digest.to_string(),
                schema: r.schema,
            }),
            ds::RestoreOutcome::Miss(m) => Restore::Miss(MissInfo::from(&m)),
        })
    }

    /// Restores `(ns, context)` into `buf`, which must be exactly the
    /// snapshot's encoded length (a wrong size is [`Failure::BadInput`],
    /// found from the roots before any payload byte is read). After a miss
    /// or an error the buffer holds no unverified byte: zeroed if anything
    /// had been placed, untouched otherwise.
    pub(crate) async fn restore_into(
        &self,
        ns: Namespace,
        context: ContextDigest,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<RestoreInto> {
        let opts = options(timeout);
        let out = self.store.restore_into((ns, context), buf, opts).await?;
        Ok(restore_into_outcome(out))
    }

    /// Restores `(ns, context)` into the memory at `ptr..ptr+len` layer by
    /// layer (`deltapack_store::Store::restore_layers_raw`): `on_layer` is
    /// called, on a runtime thread, for each (group, layer) as soon as its
    /// bytes are proven, in `order`; the outcome is the final word. Errors
    /// as [`Engine::restore_into`] (a wrong-sized buffer, or an `order`
    /// that does not fit the layout, is [`Failure::BadInput`], found from
    /// the root before any payload byte is read). After a miss the layers
    /// handed out keep their proven bytes and every other byte is zeroed
    /// (untouched if the miss came before anything was written).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes until the returned
    /// future completes (or is dropped), and nothing else may write it in
    /// that time; a layer's bytes may be read by anyone once `on_layer` was
    /// called for it, and nothing else of the memory may be read before the
    /// future completes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn restore_layers<'a>(
        &'a self,
        ns: Namespace,
        context: ContextDigest,
        ptr: *mut u8,
        len: usize,
        timeout: Option<Duration>,
        order: LayerOrder,
        mut on_layer: impl FnMut(LayerOut) + Send + 'a,
    ) -> impl std::future::Future<Output = Result<RestoreInto>> + Send + 'a {
        let opts = options(timeout);
        let order = match order {
            LayerOrder::LayerMajor => ds::LayerOrder::LayerMajor,
            LayerOrder::GroupMajor => ds::LayerOrder::GroupMajor,
            LayerOrder::Custom(pairs) => ds::LayerOrder::Custom(pairs),
        };
        let mem = RawMemory { ptr, len };
        async move {
            let mut hand_out = move |r: &ds::LayerReady, _: &[u8]| on_layer(LayerOut::from(r));
            // SAFETY: the caller's contract is `restore_layers_raw`'s.
            let fut = unsafe {
                self.store.restore_layers_raw(
                    (ns, context),
                    mem.ptr(),
                    mem.len(),
                    opts,
                    &order,
                    &mut hand_out,
                )
            };
            Ok(restore_into_outcome(fut.await?))
        }
    }

    /// The exact encoded size of the snapshot stored under `(ns, context)`,
    /// from its root alone (no payload read, no side effects); `None` if
    /// there is no usable root.
    pub(crate) async fn snapshot_size(
        &self,
        ns: Namespace,
        context: ContextDigest,
    ) -> Result<Option<u64>> {
        Ok(match self.store.peek_root(&ns, &context).await? {
            ds::RootStatus::Found(d) => d.summary().map(|s| s.result_snapshot_len),
            ds::RootStatus::Absent | ds::RootStatus::Unusable(_) => None,
        })
    }

    /// The longest of `candidates` (boundary, context) that has a root
    /// (existence checks only), and where the answer came from (`ledger`,
    /// or `store` when the ledger was down, slow or knew none).
    pub(crate) async fn lookup(
        &self,
        identity: &CacheIdentity,
        candidates: &[(u64, ContextDigest)],
    ) -> Result<Option<(u64, ContextDigest, &'static str)>> {
        let answer = self.store.lookup_detailed(identity, candidates).await?;
        let source = match answer.source {
            ds::LookupSource::Ledger => "ledger",
            _ => "store",
        };
        Ok(answer.found.map(|(b, c)| (b, c, source)))
    }

    /// Ledger gauges, persisted counters and this process's counters.
    pub(crate) async fn stats(&self) -> Result<serde_json::Value> {
        json(&self.store.stats_report().await?)
    }

    /// Uploads what was acknowledged in the tier; the report.
    pub(crate) async fn tier_upload(&self) -> Result<serde_json::Value> {
        json(&self.store.tier_upload().await?)
    }

    /// An integrity sweep.
    pub(crate) async fn sweep(&self, grace: Duration, dry_run: bool) -> Result<serde_json::Value> {
        let opts = ds::SweepOptions::default()
            .with_grace(grace)
            .with_dry_run(dry_run);
        json(&self.store.sweep(&opts).await?)
    }

    /// Evicts least recently used roots until the store fits `to` bytes.
    pub(crate) async fn evict(&self, to: u64, dry_run: bool) -> Result<serde_json::Value> {
        let plan = self.store.evict_plan(to).await?;
        let report = if dry_run {
            plan.preview()
        } else {
            self.store.execute(plan).await?
        };
        json(&report)
    }

    /// Places a named, persistent hold on a root.
    pub(crate) async fn hold(&self, name: &str, ns: Namespace, ctx: ContextDigest) -> Result<()> {
        Ok(self.store.hold(name, ns, ctx).await?)
    }

    /// Releases a named hold; whether it existed.
    pub(crate) async fn release(
        &self,
        name: &str,
        ns: Namespace,
        ctx: ContextDigest,
    ) -> Result<bool> {
        Ok(self.store.release(name, ns, ctx).await?)
    }

    /// Summaries of every root (optionally one namespace).
    pub(crate) async fn inspect(&self, ns: Option<Namespace>) -> Result<serde_json::Value> {
        json(&self.store.inspect(ns.as_ref()).await?)
    }

    /// Persists this handle's counters into the ledger (so `deltapack stats`
    /// in another process sees them).
    pub(crate) async fn flush(&self) -> Result<()> {
        Ok(self.store.close().await?)
    }
}

/// The store's `restore_into` outcome as this module's.
fn restore_into_outcome(out: ds::RestoreIntoOutcome) -> RestoreInto {
    match out {
        ds::RestoreIntoOutcome::Hit { len, digest } => RestoreInto::Hit {
            len,
            digest: digest.to_string(),
        },
        ds::RestoreIntoOutcome::Miss { reason } => RestoreInto::Miss(MissInfo::from(&reason)),
    }
}

fn options(timeout: Option<Duration>) -> ds::RestoreOptions {
    ds::RestoreOptions::default().with_deadline(timeout.map(|t| tokio::time::Instant::now() + t))
}

fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

fn json(v: &impl serde::Serialize) -> Result<serde_json::Value> {
    serde_json::to_value(v).map_err(|e| Failure::Other(format!("serializing a report: {e}")))
}

/// A receipt as JSON (timings in ms) and its turn handle; a conflict is a
/// [`Failure::Conflict`].
fn receipt_value(receipt: ds::PublishReceipt) -> Result<Published> {
    if let Some(conflict) = receipt.conflict_message() {
        return Err(Failure::Conflict(conflict));
    }
    let mut v = json(&receipt)?;
    if let Some(obj) = v.as_object_mut() {
        obj.insert("encode_ms".into(), ms(receipt.encode_time).into());
        obj.insert("write_ms".into(), ms(receipt.write_time).into());
        obj.insert("total_ms".into(), ms(receipt.total_time).into());
    }
    Ok((v, receipt.turn))
}

//! The fill from a restore's own verified bytes: while a tiered handle
//! restores a root from the origin, every whole object the restore
//! verified is written into the tier as it verifies, so that the fill
//! which follows finds it there and downloads only what the restore did
//! not verify whole (first-restore egress about 1 × the root's stored
//! bytes instead of 2 ×).
//!
//! Owns the copies' memory and their protection in the tier until the
//! fill takes over. Memory: the copies of a handle's restores hold at most
//! [`super::TierConfig::tap_buffer_bytes`] (of the origin's extent size:
//! 512 MiB at the defaults) at once, each from its first byte until it is written into the tier;
//! an object that does not fit is simply not kept, and the fill downloads
//! it. (The fills and uploads have the same bound of their own, and a
//! fill starts only once the copies of its restore are written.) Space: the copies are protected from collection and
//! reserved against the tier's budget (one publication in the tier's
//! ledger, its reservation growing with each copy) until the fill, which
//! takes that publication over, records the root; if no fill follows (the
//! restore missed), the publication ends and the copies are ordinary
//! unreferenced objects, reclaimed after the grace period.
//!
//! The parts of objects a chain's deferred pass read without their names
//! are kept on the tier's disk instead (`staging.rs`): the fill completes
//! each from the origin and checks it whole before the tier holds it.
//!
//! Must never write an object the restore did not verify against its
//! name, or block the restore: a copy is handed to a task at once.

use std::any::Any;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use bytes::Bytes;
use object_store::path::Path;
use object_store::ObjectStoreExt;

use super::handle::Tier;
use super::staging::Staging;
use super::state::{join_all, lock, TierState};
use crate::gc::ProtectGuard;
use crate::keys::RootKey;
use crate::restore::{Tap, Tapped};
use crate::stats::Stats;
use crate::store::Store;

/// The copies of one restore from the origin on their way into the tier.
pub(crate) struct FillTap {
    /// The tier's store.
    tier: Store,
    /// The handle's tier state (permits and counters).
    state: Arc<TierState>,
    /// Where the writes run (the restore's workers have no runtime).
    handle: tokio::runtime::Handle,
    /// The copies' protection and reservation in the tier, and the bytes
    /// reserved, once the first copy is written.
    guard: tokio::sync::Mutex<Option<(ProtectGuard, u64)>>,
    /// The writes started.
    writes: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// This tap, for the writes to hold.
    me: Weak<FillTap>,
    /// Where the parts a chain's deferred pass read are kept for the fill
    /// (`staging.rs`), written by a thread of their own so that the
    /// restore never waits for the disk. Made at the first part; `None`
    /// inside if it could not be made (or there is no directory).
    keeper: OnceLock<Option<Keeper>>,
    /// The tier's directory, if it is local.
    staging_dir: Option<std::path::PathBuf>,
    /// The most bytes the staging file may hold (the tier's budget).
    staging_limit: u64,
}

/// The staging file of one restore and the thread writing into it.
struct Keeper {
    staging: Arc<Staging>,
    /// Parts on their way to the thread; closed by [`FillTap::settle`].
    parts: Mutex<Option<std::sync::mpsc::Sender<Part>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// One part on its way into the staging file, with the permit of the fill
/// buffer it holds until it is written.
struct Part {
    key: Path,
    len: u64,
    at: u64,
    bytes: Bytes,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Keeper {
    /// A staging file in `dir` and its writing thread.
    fn start(dir: &std::path::Path, limit: u64) -> std::io::Result<Keeper> {
        let staging = Arc::new(Staging::new(dir, limit)?);
        let (tx, rx) = std::sync::mpsc::channel::<Part>();
        let s = staging.clone();
        let thread = std::thread::Builder::new()
            .name("deltapack-tier-keep".into())
            .spawn(move || {
                for p in rx {
                    s.keep(&p.key, p.len, p.at, &p.bytes);
                }
            })?;
        Ok(Keeper {
            staging,
            parts: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }
}

impl Tier<'_> {
    /// A tap for a restore of `key` from the origin, registered for the
    /// fill that follows it; `None` if the tier is configured without
    /// ([`super::TierConfig::fill_from_restore`]), the root is being filled
    /// already (that fill downloads it) or no runtime is at hand.
    pub(crate) fn open_tap(&self, key: RootKey) -> Option<Arc<FillTap>> {
        if !self.config.fill_from_restore
            || lock(&self.filling).contains(&(key.namespace, key.context))
        {
            return None;
        }
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let tap = Arc::new_cyclic(|me| FillTap {
            tier: self.store.clone(),
            state: self.state.clone(),
            handle,
            guard: tokio::sync::Mutex::new(None),
            writes: Mutex::new(Vec::new()),
            me: me.clone(),
            keeper: OnceLock::new(),
            staging_dir: match self.store.backend_kind() {
                crate::BackendKind::Local { root } => Some(root.clone()),
                _ => None,
            },
            staging_limit: self.config.budget_bytes.unwrap_or(u64::MAX),
        });
        let any: Arc<dyn Any + Send + Sync> = tap.clone();
        let mut taps = lock(&self.taps);
        taps.retain(|_, t| t.strong_count() > 0);
        taps.insert(key, Arc::downgrade(&any));
        Some(tap)
    }

    /// The open tap of a restore of `key`, if there is one.
    pub(crate) fn tap_of(&self, key: RootKey) -> Option<Arc<FillTap>> {
        let any = lock(&self.taps).get(&key).and_then(Weak::upgrade)?;
        any.downcast::<FillTap>().ok()
    }
}

impl FillTap {
    /// Waits for every copy to be written; the publication protecting
    /// them, for the fill to take over (`None`: nothing was written), and
    /// the parts kept unchecked, for the fill to complete.
    pub(crate) async fn settle(&self) -> (Option<ProtectGuard>, Option<Arc<Staging>>) {
        join_all(&self.writes).await;
        let guard = self.guard.lock().await.take().map(|(g, _)| g);
        let staged = match self.keeper.get() {
            Some(Some(k)) => {
                // No part comes after the restore; the thread writes what
                // it was given and ends.
                lock(&k.parts).take();
                let thread = lock(&k.thread).take();
                if let Some(t) = thread {
                    let _ = tokio::task::spawn_blocking(move || t.join()).await;
                }
                Some(k.staging.clone())
            }
            _ => None,
        };
        (guard, staged)
    }

    /// Writes one verified copy into the tier: protected and reserved
    /// first, skipped if the tier holds the object already. Failures are
    /// logged: the fill downloads what is missing.
    async fn write(self: Arc<Self>, key: Path, copy: Tapped) {
        let Tapped { buf, hold } = copy;
        let len = buf.len() as u64;
        match self.write_inner(&key, Bytes::from(buf)).await {
            Ok(true) => Stats::add(&self.state.counters.fill_reused_bytes, len),
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(error = %e, %key, "tier copy of a restored object not written")
            }
        }
        drop(hold);
    }

    /// [`FillTap::write`]; whether the object was written.
    async fn write_inner(&self, key: &Path, bytes: Bytes) -> crate::Result<bool> {
        let len = bytes.len() as u64;
        {
            let mut g = self.guard.lock().await;
            if g.is_none() {
                // Only the tier's own ledger may write into it.
                self.tier.require_owner("copy").await?;
                *g = Some((ProtectGuard::new(&self.tier).await?, 0));
            }
            let Some((guard, reserved)) = g.as_mut() else {
                return Ok(false);
            };
            self.tier.make_room(*reserved + len, guard).await?;
            *reserved += len;
            guard.protector().protect(vec![key.to_string()]).await?;
        }
        if let Ok(meta) = self.tier.object_store().head(key).await {
            if meta.size == len {
                return Ok(false);
            }
        }
        self.tier.write_object(key, bytes.into(), None).await?;
        Ok(true)
    }
}

impl Tap for FillTap {
    fn start(&self, _key: &Path, len: u64) -> Option<Tapped> {
        let permit = self
            .state
            .tap_bytes
            .clone()
            .try_acquire_many_owned(u32::try_from(len).ok()?)
            .ok()?;
        let len = usize::try_from(len).ok()?;
        Some(Tapped {
            buf: vec![0u8; len],
            hold: Box::new(permit),
        })
    }

    fn verified(&self, key: &Path, copy: Tapped) {
        let Some(me) = self.me.upgrade() else { return };
        let task = self.handle.spawn(me.write(key.clone(), copy));
        lock(&self.writes).push(task);
    }

    fn unverified(&self, key: &Path, len: u64, at: u64, bytes: Bytes) {
        let keeper = self.keeper.get_or_init(|| {
            let dir = self.staging_dir.as_deref()?;
            match Keeper::start(dir, self.staging_limit) {
                Ok(k) => Some(k),
                Err(e) => {
                    tracing::debug!(error = %e, "no staging file in the tier: the fill downloads whole objects");
                    None
                }
            }
        });
        let Some(keeper) = keeper else { return };
        // Memory: the fill buffer's permits, never waited for (a part that
        // does not fit is not kept: the fill downloads it).
        let Ok(n) = u32::try_from(bytes.len()) else {
            return;
        };
        let Ok(permit) = self.state.tap_bytes.clone().try_acquire_many_owned(n) else {
            return;
        };
        if let Some(tx) = lock(&keeper.parts).as_ref() {
            let _ = tx.send(Part {
                key: key.clone(),
                len,
                at,
                bytes,
                _permit: permit,
            });
        }
    }
}

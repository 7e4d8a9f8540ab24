//! Capacity: the ledger's life cycle, budgets, eviction, pins and holds,
//! garbage collection, prune / clear / invalidate, and the stats report.
//!
//! **Budget accounting.** Bytes counted against the budget are live objects
//! (each once) + condemned objects not yet deleted + root objects. A
//! publication first collects due garbage, then evicts least recently used
//! roots until the *live* bytes plus what it needs fit; if the total
//! (including condemned bytes still inside their grace period) still does not
//! fit, it fails with a capacity error before writing anything — the space
//! comes back once the grace period passes (at once with `grace = 0`).
//!
//! **Eviction order and safety.** Least recently used first (restores and
//! publications are accesses). A root is evicted together with every delta
//! built on it, dependents first, so no delta outlives its base; a root whose
//! closure contains a pinned (in use by this process) or held (persistent,
//! named) root is skipped. Objects still referenced by another root stay.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use deltapack_format::{ContextDigest, Namespace};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use serde::Serialize;

use crate::backend::{put_create, BackendKind};
use crate::base_graph::{BaseGraph, RootId};
use crate::error::{Result, StoreError};
use crate::keys;
use crate::ledger::{now_ms, ColdStart, Ledger, Listing, RootEntry, RootRow, Totals};

/// Root reads in flight while the ledger is rebuilt or reconciled.
const REBUILD_READS: usize = 32;
use crate::stats::Stats;
use crate::store::{RootStatus, Store};

/// A root protected from eviction while this guard lives (in-process).
#[derive(Debug)]
pub struct Pin {
    store: Store,
    key: (Namespace, ContextDigest),
}

impl Drop for Pin {
    fn drop(&mut self) {
        if let Ok(mut pins) = self.store.inner.pins.lock() {
            if let Some(n) = pins.get_mut(&self.key) {
                *n -= 1;
                if *n == 0 {
                    pins.remove(&self.key);
                }
            }
        }
    }
}

/// Which roots `prune` removes.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct PruneFilter {
    /// Only this namespace.
    pub namespace: Option<Namespace>,
    /// Only roots of this schema (`…/v1` or `…/v2`).
    pub schema: Option<String>,
    /// Only roots not accessed for at least this long.
    pub idle_for: Option<Duration>,
}

/// What a removal did (or would do, on a dry run).
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct RemovalReport {
    /// Root keys removed (dependents included).
    pub roots: Vec<String>,
    /// Objects condemned by the removal.
    pub condemned_objects: u64,
    /// Bytes condemned by the removal.
    pub condemned_bytes: u64,
    /// Objects deleted by garbage collection afterwards.
    pub deleted_objects: u64,
    /// Bytes deleted by garbage collection afterwards.
    pub deleted_bytes: u64,
    /// Whether nothing was changed.
    pub dry_run: bool,
}

/// Why roots are being removed (decides whether holds and pins count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum RemovalKind {
    /// Least recently used roots, to fit a budget (pins and holds respected).
    Evict,
    /// Roots matching a filter (pins and holds respected).
    Prune,
    /// Every root, or every root of a namespace (holds included).
    Clear,
    /// A namespace or one context, e.g. after a model change (holds
    /// included).
    Invalidate,
}

impl RemovalKind {
    /// The operation's name in messages (`evict`, `prune`, …).
    pub(crate) fn op(self) -> &'static str {
        match self {
            RemovalKind::Evict => "evict",
            RemovalKind::Prune => "prune",
            RemovalKind::Clear => "clear",
            RemovalKind::Invalidate => "invalidate",
        }
    }
}

/// Roots chosen for removal, dependents before their bases; nothing has
/// been changed yet. Made by [`Store::evict_plan`], [`Store::prune_plan`],
/// [`Store::clear_plan`] or [`Store::invalidate_plan`]; shown as is for a
/// dry run ([`RemovalPlan::preview`]) and carried out by
/// [`Store::execute`].
#[derive(Debug, Clone)]
pub struct RemovalPlan {
    kind: RemovalKind,
    /// The chosen roots, each with its dependents, dependents first.
    targets: Vec<RootId>,
}

impl RemovalPlan {
    /// Why these roots are removed.
    pub fn kind(&self) -> RemovalKind {
        self.kind
    }

    /// Root keys the plan removes, in order.
    pub fn roots(&self) -> Vec<String> {
        self.targets
            .iter()
            .map(|(ns, ctx)| keys::root_key(ns, ctx).to_string())
            .collect()
    }

    /// Whether the plan removes nothing.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// The report of a dry run: what [`Store::execute`] would remove now.
    pub fn preview(&self) -> RemovalReport {
        RemovalReport {
            roots: self.roots(),
            dry_run: true,
            ..Default::default()
        }
    }
}

/// How long a publication waits for other publications' reservations to
/// end when nothing else can be evicted to fit it under the budget.
const RESERVATION_PATIENCE: Duration = Duration::from_secs(60);

/// Opens the ledger a store of `kind` uses (see [`Store::ledger`]); with
/// the store's identity when the ledger lives outside the store.
fn open_ledger(kind: &BackendKind, url: Option<&str>) -> Result<(Ledger, Option<String>)> {
    let identity = match kind {
        BackendKind::Local { root } => format!("file://{}", root.display()),
        BackendKind::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
        BackendKind::Memory => "memory://".to_string(),
    };
    if let Some(url) = url {
        let ledger = if let Some(rest) = url.strip_prefix("sqlite://") {
            if rest.is_empty() || rest == ":memory:" {
                Ledger::open_memory()?
            } else {
                Ledger::open_file(std::path::Path::new(rest))?
            }
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ledger::open_postgres(url)?
        } else {
            return Err(StoreError::Invalid(format!(
                "ledger URL {:?}: use sqlite:///path/ledger.sqlite3 or postgres://user@host/db",
                url.split('@').next_back().unwrap_or(url)
            )));
        };
        let external = ledger.location().persisted.then_some(identity);
        return Ok((ledger, external));
    }
    Ok(match kind {
        BackendKind::Local { root } => (
            Ledger::open_file(&root.join("ledger").join("ledger.sqlite3"))?,
            None,
        ),
        BackendKind::S3 { .. } => {
            let name = blake3::hash(identity.as_bytes()).to_hex();
            let path = crate::paths::state_dir()
                .join("ledgers")
                .join(format!("{}.sqlite3", &name[..32]));
            (Ledger::open_file(&path)?, Some(identity))
        }
        BackendKind::Memory => (Ledger::open_memory()?, None),
    })
}

/// Waiting for other publications' reservations: pauses backing off from 5
/// to 100 ms, for at most [`RESERVATION_PATIENCE`] in all.
#[derive(Default)]
struct ReservationWait {
    waited: Duration,
    pause: Duration,
}

impl ReservationWait {
    /// Sleeps one pause; `false` (without sleeping) once patience is spent.
    async fn pause(&mut self) -> bool {
        if self.waited >= RESERVATION_PATIENCE {
            return false;
        }
        self.pause = (self.pause * 2).clamp(Duration::from_millis(5), Duration::from_millis(100));
        tokio::time::sleep(self.pause).await;
        self.waited += self.pause;
        true
    }
}

fn valid_hold_name(name: &str) -> Result<()> {
    if keys::valid_hold_name(name) {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "hold name {name:?}: use 1–64 characters [A-Za-z0-9._-], not starting with '.'"
        )))
    }
}

/// Free bytes on the filesystem holding `path`.
#[cfg(unix)]
pub fn free_space(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// Free bytes on the filesystem holding `path` (unknown off Unix).
#[cfg(not(unix))]
pub fn free_space(_path: &std::path::Path) -> Option<u64> {
    None
}

impl Store {
    /// Opens the ledger on first use and applies the cold-start policy.
    ///
    /// Which ledger ([`StoreConfig::ledger`](crate::StoreConfig::ledger)):
    /// a `sqlite://` or `postgres://` URL if given; otherwise the store's
    /// own file for `file://` stores, a SQLite file under the state
    /// directory ([`crate::paths::state_dir`]) for `s3://` stores, and an in-memory
    /// one for `memory://`. A ledger outside the store is bound to the
    /// first store that uses it (`meta.store`) and refuses any other: two
    /// buckets' accounts in one database would corrupt both.
    ///
    /// Boxed: a quarantine can happen inside the ledger's own opening (its
    /// reconciliation reads roots), and quarantining asks the ledger whether
    /// this handle may; an async call cycle needs one boxed step.
    pub(crate) fn ledger(&self) -> futures::future::BoxFuture<'_, Result<&Ledger>> {
        Box::pin(self.open_ledger_once())
    }

    async fn open_ledger_once(&self) -> Result<&Ledger> {
        self.inner
            .ledger
            .get_or_try_init(|| async {
                let kind = self.backend_kind().clone();
                let url = self.config().ledger.clone();
                let (ledger, external) =
                    tokio::task::spawn_blocking(move || open_ledger(&kind, url.as_deref()))
                        .await
                        .map_err(|e| StoreError::task("ledger open", e))??;
                let policy = self.config().cold_start;
                let mut fresh = false;
                if let Some(id) = external {
                    fresh = ledger.run(move |l| l.bind_store(&id)).await?;
                }
                let location = ledger.location().clone();
                let mut background = false;
                match policy {
                    ColdStart::Clear => {
                        self.require_owner_with(&ledger, "clear").await?;
                        self.clear_store().await?;
                        self.reconcile_into(&ledger, true).await?;
                    }
                    ColdStart::Rebuild => {
                        self.reconcile_into(&ledger, true).await?;
                    }
                    // An in-memory ledger starts empty: built now (a
                    // `memory://` store is small, or empty, at open).
                    ColdStart::Load if !location.persisted => {
                        self.reconcile_into(&ledger, true).await?;
                    }
                    // A fleet's shared ledger is trusted at open: listing
                    // a bucket is what a node must not wait for. Roots
                    // written behind its back are reconciled by `sweep`
                    // and `ledger rebuild`; a ledger new to the store is
                    // built in the background.
                    ColdStart::Load if location.engine == "postgres" && !fresh => {}
                    // A persisted ledger is trusted at open, without a
                    // listing (O(1) open); it is reconciled with the store
                    // in the background. Garbage collection and the sweep
                    // wait for that reconciliation (so does a first
                    // publication under a budget: it collects first);
                    // restores and unbudgeted publications never do.
                    ColdStart::Load => {
                        background = true;
                        self.inner
                            .reconcile_full
                            .store(fresh, std::sync::atomic::Ordering::Relaxed);
                        let (store, l) = (self.clone(), ledger.clone());
                        tokio::spawn(async move {
                            if let Err(e) = store.reconcile_once(&l).await {
                                tracing::warn!(error = %e, "background ledger reconciliation failed (garbage collection will retry it)");
                            }
                        });
                    }
                }
                if !background {
                    let _ = self.inner.reconciled.set(());
                }
                Ok::<_, StoreError>(ledger)
            })
            .await
    }

    /// Which ledger this store uses: engine and location.
    pub async fn ledger_location(&self) -> Result<crate::ledger::LedgerLocation> {
        Ok(self.ledger().await?.location().clone())
    }

    /// Recomputes the ledger from the store (roots, holds, objects): every
    /// root is read again (32 reads in flight) and the result merged in,
    /// so roots recorded or removed while the rebuild runs are kept or
    /// stay removed. Safe on a busy store and fleet.
    pub async fn rebuild_ledger(&self) -> Result<Totals> {
        let ledger = self.ledger().await?;
        self.reconcile_into(ledger, true).await?;
        Ok(ledger.run(|l| l.totals()).await?)
    }

    /// Waits until the ledger has been reconciled with the store once by
    /// this handle: roots written by a process that died before recording
    /// them are recorded, roots deleted behind the ledger's back are
    /// forgotten. A persisted ledger is opened without a listing and
    /// reconciled in the background; garbage collection and the sweep
    /// wait for it, and so do removal plans (evict, prune, clear,
    /// invalidate: a root the ledger has not seen would escape them) and a
    /// handle's first publication under a budget (it collects garbage
    /// first); restores and unbudgeted publications never do. Bounded in
    /// requests: one listing, one GET per root the ledger did not know,
    /// one HEAD per recorded root the listing did not show.
    pub async fn reconcile_ledger(&self) -> Result<()> {
        let ledger = self.ledger().await?;
        self.reconcile_once(ledger).await
    }

    /// [`Store::reconcile_ledger`] on an open ledger.
    async fn reconcile_once(&self, ledger: &Ledger) -> Result<()> {
        self.inner
            .reconciled
            .get_or_try_init(|| async {
                let full = self
                    .inner
                    .reconcile_full
                    .load(std::sync::atomic::Ordering::Relaxed);
                self.reconcile_into(ledger, full).await.map(|_| ())
            })
            .await?;
        Ok(())
    }

    /// Lists the store and merges what it shows into the ledger (see
    /// [`Ledger::merge_listing`]). `full` reads every root; otherwise only
    /// roots the ledger does not know are read.
    pub(crate) async fn reconcile_into(
        &self,
        ledger: &Ledger,
        full: bool,
    ) -> Result<crate::ledger::MergeReport> {
        use futures::StreamExt;
        let began = now_ms();
        let prefix = Path::from(keys::ROOTS);
        let listed: Vec<(Namespace, ContextDigest, u64)> = self
            .object_store()
            .list(Some(&prefix))
            .try_collect::<Vec<_>>()
            .await
            .map_err(|e| StoreError::io(&prefix, e))?
            .iter()
            .filter_map(|m| keys::parse_root_key(&m.location).map(|(n, c)| (n, c, m.size)))
            .collect();
        let holds = self.list_holds().await?;
        let objects: Vec<object_store::ObjectMeta> = self
            .object_store()
            .list(Some(&Path::from(keys::OBJECTS)))
            .try_collect()
            .await
            .map_err(|e| StoreError::io(&Path::from(keys::OBJECTS), e))?;
        let present: Vec<(String, u64, u64)> = objects
            .iter()
            .map(|m| {
                (
                    m.location.to_string(),
                    m.size,
                    m.last_modified.timestamp_millis().max(0) as u64,
                )
            })
            .collect();
        let known: std::collections::HashSet<(Namespace, ContextDigest)> = ledger
            .run(|l| l.recorded_roots())
            .await?
            .into_iter()
            .collect();
        let listed_ids: std::collections::HashSet<(Namespace, ContextDigest)> =
            listed.iter().map(|(n, c, _)| (*n, *c)).collect();
        let to_read: Vec<_> = listed
            .into_iter()
            .filter(|(n, c, _)| full || !known.contains(&(*n, *c)))
            .collect();
        let roots: Vec<RootEntry> = futures::stream::iter(to_read)
            .map(|(ns, ctx, size)| async move {
                Ok::<_, StoreError>(match self.peek_root(&ns, &ctx).await? {
                    RootStatus::Found(r) => r.summary().map(|s| RootEntry::from_summary(&s, size)),
                    _ => None,
                })
            })
            .buffer_unordered(REBUILD_READS)
            .try_collect::<Vec<_>>()
            .await?
            .into_iter()
            .flatten()
            .collect();
        let unlisted: Vec<_> = known
            .iter()
            .filter(|k| !listed_ids.contains(k))
            .copied()
            .collect();
        let vanished: Vec<(Namespace, ContextDigest)> = futures::stream::iter(unlisted)
            .map(|(ns, ctx)| async move {
                let key = keys::root_key(&ns, &ctx);
                match self.object_store().head(&key).await {
                    Ok(_) => Ok(None),
                    Err(object_store::Error::NotFound { .. }) => Ok(Some((ns, ctx))),
                    Err(e) => Err(StoreError::io(&key, e)),
                }
            })
            .buffer_unordered(REBUILD_READS)
            .try_collect::<Vec<_>>()
            .await?
            .into_iter()
            .flatten()
            .collect();
        let listing = Listing {
            began,
            full,
            roots,
            vanished,
            holds,
            present,
        };
        let report = ledger
            .run(move |l| l.merge_listing(&listing, now_ms()))
            .await?;
        tracing::info!(full, ?report, "ledger reconciled with the store");
        Ok(report)
    }

    async fn list_holds(&self) -> Result<Vec<(String, Namespace, ContextDigest)>> {
        let prefix = Path::from(keys::HOLDS);
        let metas: Vec<object_store::ObjectMeta> = self
            .object_store()
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| StoreError::io(&prefix, e))?;
        Ok(metas
            .iter()
            .filter_map(|m| keys::parse_hold_key(&m.location))
            .collect())
    }

    /// Deletes every root, object and hold (the `clear` cold start).
    async fn clear_store(&self) -> Result<()> {
        for prefix in [keys::ROOTS, keys::OBJECTS, keys::HOLDS] {
            let p = Path::from(prefix);
            let metas: Vec<object_store::ObjectMeta> = self
                .object_store()
                .list(Some(&p))
                .try_collect()
                .await
                .map_err(|e| StoreError::io(&p, e))?;
            for m in metas {
                match self.object_store().delete(&m.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(StoreError::io(&m.location, e)),
                }
            }
        }
        Ok(())
    }

    /// Ledger totals.
    pub async fn ledger_totals(&self) -> Result<Totals> {
        Ok(self.ledger().await?.run(|l| l.totals()).await?)
    }

    /// The ledger's comparable content (for tests and `ledger check`).
    pub async fn ledger_image(&self) -> Result<crate::ledger::LedgerImage> {
        Ok(self.ledger().await?.run(|l| l.image()).await?)
    }

    /// Records a freshly created root in the ledger. The root is already
    /// durable and visible, so a ledger failure here is logged, not returned:
    /// the ledger is derived state, and the next reconciliation (at open,
    /// in the background, or by `sweep`) records the missing root.
    pub(crate) async fn ledger_record(&self, entry: &RootEntry) {
        match self.ledger().await {
            Ok(l) => {
                let entry = entry.clone();
                if let Err(e) = l.run(move |l| l.record_root(&entry, now_ms())).await {
                    tracing::warn!(error = %e, "published root not recorded in the ledger (the next reconciliation records it)");
                }
            }
            Err(e) => tracing::warn!(error = %e, "ledger unavailable"),
        }
    }

    /// Marks an access. The access is queued and written by a background
    /// task, batched with others: a restore hit never waits for the ledger
    /// (which another process may hold locked). Anything that reads the
    /// access order (eviction, pruning) applies the queue first.
    pub(crate) async fn ledger_touch(&self, ns: &Namespace, ctx: &ContextDigest) {
        let now = now_ms();
        if let Ok(mut t) = self.inner.touches.lock() {
            let e = t.entry((*ns, *ctx)).or_insert(now);
            *e = (*e).max(now);
        }
        if !self
            .inner
            .touch_flush_scheduled
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let store = self.clone();
            let task = tokio::spawn(async move {
                match store.flush_touches().await {
                    Ok(()) => {}
                    // Counted in `touches_dropped`; reads go on without it.
                    Err(e @ StoreError::LedgerUnavailable(_)) => {
                        store.note_ledger_down(&format!("accesses dropped: {e}"))
                    }
                    Err(e) => tracing::warn!(error = %e, "ledger touch failed"),
                }
            });
            if let Ok(mut t) = self.inner.touch_task.lock() {
                *t = Some(task);
            }
        }
    }

    /// Writes what this handle still owes the ledger (queued accesses, an
    /// access flush already under way, counters) and waits for it. Call it
    /// before the runtime shuts down (a process about to exit): a flush
    /// still in flight then would be cancelled, and its accesses lost. A
    /// handle that owes nothing opens no ledger, and one whose ledger was
    /// found down within [`crate::LEDGER_RETRY`] does not ask it again
    /// (bound the call with a timeout where a hanging ledger must not hold
    /// a process's exit, as the CLI does).
    pub async fn close(&self) -> Result<()> {
        let task = self.inner.touch_task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            let _ = task.await;
        }
        // A ledger this handle found down moments ago is not asked again
        // (the accesses were dropped and counted; the counters stay this
        // process's). Nothing owed: nothing to open.
        if self.ledger_resting() {
            return Ok(());
        }
        let touches = !self
            .inner
            .touches
            .lock()
            .map(|t| t.is_empty())
            .unwrap_or(true);
        let last = match self.inner.flushed.lock() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let counted = crate::stats::counter_deltas(&self.stats(), &last)
            .iter()
            .any(|(_, n)| *n > 0);
        if !touches && !counted {
            return Ok(());
        }
        self.flush_touches().await?;
        self.flush_counters().await
    }

    /// Pins a root against eviction by this process while the guard lives.
    pub fn pin(&self, ns: Namespace, ctx: ContextDigest) -> Pin {
        if let Ok(mut pins) = self.inner.pins.lock() {
            *pins.entry((ns, ctx)).or_insert(0) += 1;
        }
        Pin {
            store: self.clone(),
            key: (ns, ctx),
        }
    }

    fn is_pinned(&self, key: &(Namespace, ContextDigest)) -> bool {
        self.inner
            .pins
            .lock()
            .map(|p| p.contains_key(key))
            .unwrap_or(true)
    }

    /// Places a named, persistent hold on a root (it must exist).
    pub async fn hold(&self, name: &str, ns: Namespace, ctx: ContextDigest) -> Result<()> {
        valid_hold_name(name)?;
        self.require_owner("hold").await?;
        if !matches!(self.peek_root(&ns, &ctx).await?, RootStatus::Found(_)) {
            return Err(StoreError::Invalid(format!(
                "no readable root {}",
                keys::root_key(&ns, &ctx)
            )));
        }
        let marker = keys::hold_key(name, &ns, &ctx);
        put_create(self.object_store().as_ref(), &marker, Bytes::new()).await?;
        let name = name.to_string();
        self.ledger()
            .await?
            .run(move |l| l.add_hold(&name, &ns, &ctx))
            .await?;
        Ok(())
    }

    /// Releases a named hold. Returns whether it existed.
    pub async fn release(&self, name: &str, ns: Namespace, ctx: ContextDigest) -> Result<bool> {
        valid_hold_name(name)?;
        self.require_owner("release").await?;
        let marker = keys::hold_key(name, &ns, &ctx);
        // Whether the hold existed: its marker (the source of truth) or the
        // ledger's row. Both are looked at before anything is removed, since
        // a reconciliation running meanwhile drops a row whose marker is
        // gone. The row goes first (with a tombstone, so that no
        // reconciliation brings it back from the marker), then the marker.
        let marked = match self.object_store().head(&marker).await {
            Ok(_) => true,
            Err(object_store::Error::NotFound { .. }) => false,
            Err(e) => return Err(StoreError::io(&marker, e)),
        };
        let name = name.to_string();
        let recorded = self
            .ledger()
            .await?
            .run(move |l| l.release_hold(&name, &ns, &ctx))
            .await?;
        match self.object_store().delete(&marker).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(StoreError::io(&marker, e)),
        }
        Ok(marked || recorded)
    }

    /// The base graph of the roots the ledger knows.
    fn ledger_graph(rows: &[RootRow]) -> BaseGraph {
        let mut graph = BaseGraph::default();
        for r in rows {
            if let Some(b) = r.base {
                graph.link((r.namespace, r.context), b);
            }
        }
        graph
    }

    /// Whether a pin or a hold protects any of `roots`.
    async fn any_protected(&self, ledger: &Ledger, roots: &[RootId]) -> Result<bool> {
        if roots.iter().any(|k| self.is_pinned(k)) {
            return Ok(true);
        }
        let roots = roots.to_vec();
        Ok(ledger
            .run(move |l| {
                for k in &roots {
                    if l.is_held(&k.0, &k.1)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            })
            .await?)
    }

    /// The ledger's roots, least recently used first, after applying the
    /// accesses still queued in this process (so eviction order sees them).
    pub(crate) async fn lru_rows(&self, ledger: &Ledger) -> Result<Vec<RootRow>> {
        let pending = self.take_touches();
        Ok(ledger
            .run(move |l| {
                l.touch_many(&pending)?;
                l.roots_lru()
            })
            .await?)
    }

    /// Takes the queued accesses (see [`Store::ledger_touch`]).
    fn take_touches(&self) -> Vec<(RootId, u64)> {
        match self.inner.touches.lock() {
            Ok(mut t) => t.drain().collect(),
            Err(p) => p.into_inner().drain().collect(),
        }
    }

    /// Writes the queued accesses into the ledger.
    pub(crate) async fn flush_touches(&self) -> Result<()> {
        self.inner
            .touch_flush_scheduled
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let pending = self.take_touches();
        if pending.is_empty() {
            return Ok(());
        }
        // Accesses only order eviction: with the ledger away they are
        // dropped (counted), never retried on a request's path.
        let n = pending.len() as u64;
        let written = async {
            let ledger = self.ledger().await?;
            ledger.run(move |l| l.touch_many(&pending)).await?;
            Ok::<_, StoreError>(())
        }
        .await;
        match written {
            Ok(()) => {
                self.note_ledger_up();
                Ok(())
            }
            Err(e) => {
                Stats::add(&self.stats_ref().touches_dropped, n);
                Err(e)
            }
        }
    }

    /// A plan removing `seeds`, each with every delta built on it.
    fn plan_with_dependents(
        kind: RemovalKind,
        rows: &[RootRow],
        seeds: Vec<RootId>,
    ) -> RemovalPlan {
        RemovalPlan {
            kind,
            targets: Self::ledger_graph(rows).with_dependents(seeds),
        }
    }

    /// Carries out a removal plan: deletes each root (dependents first),
    /// condemns the objects no remaining root uses, then collects due
    /// garbage. The base graph is read again first, so a delta published on
    /// a planned root since the plan was made goes with it; for eviction and
    /// pruning, a root that became pinned or held meanwhile is kept, with
    /// every root it depends on.
    #[tracing::instrument(level = "info", name = "execute", skip_all, fields(
        kind = ?plan.kind,
        planned = plan.targets.len(),
        removed = tracing::field::Empty,
        deleted_bytes = tracing::field::Empty,
    ))]
    pub async fn execute(&self, plan: RemovalPlan) -> Result<RemovalReport> {
        let ledger = self.ledger().await?;
        let mut fence = crate::ownership::OwnerFence::start(self, plan.kind.op()).await?;
        let rows = self.lru_rows(ledger).await?;
        let graph = Self::ledger_graph(&rows);
        let respect = matches!(plan.kind, RemovalKind::Evict | RemovalKind::Prune);
        let mut report = RemovalReport::default();
        let mut done = BTreeSet::new();
        for t in plan.targets {
            if done.contains(&t) {
                continue;
            }
            let group = graph.with_dependents([t]);
            if respect && self.any_protected(ledger, &group).await? {
                continue;
            }
            for k in group {
                if !done.insert(k) {
                    continue;
                }
                fence.check(self).await?;
                // Eviction and pruning claim each root first: one that a
                // publication (of any node) is building a delta on, or that
                // a delta recorded since the plan builds on, is kept — and
                // with it, through the same check, every root below it.
                if !self.remove_one(ledger, k, respect, &mut report).await? {
                    tracing::info!(root = %keys::root_key(&k.0, &k.1), "kept: a delta is being built on it");
                    continue;
                }
                report.roots.push(keys::root_key(&k.0, &k.1).to_string());
                if plan.kind == RemovalKind::Evict {
                    Stats::add(&self.stats_ref().evictions, 1);
                }
            }
        }
        if plan.kind == RemovalKind::Invalidate {
            if let Ok(mut c) = self.inner.base_cache.lock() {
                c.clear();
            }
        }
        let gc = self.collect_garbage().await?;
        report.deleted_objects = gc.objects;
        report.deleted_bytes = gc.bytes;
        tracing::Span::current()
            .record("removed", report.roots.len())
            .record("deleted_bytes", gc.bytes);
        Ok(report)
    }

    /// Removes one root: deletes its object, forgets it in the ledger and
    /// its hold markers. With `claim` (eviction, pruning) it first claims the
    /// root in the ledger ([`crate::ledger::Ledger::claim_root_removal`]) and
    /// returns `false`, removing nothing, if the claim is refused.
    #[tracing::instrument(level = "debug", name = "remove_root", skip_all, fields(
        namespace = %crate::metrics::short_hex(&k.0.hex()),
        context = %crate::metrics::short_hex(&k.1.hex()),
        claim,
    ))]
    async fn remove_one(
        &self,
        ledger: &Ledger,
        k: (Namespace, ContextDigest),
        claim: bool,
        report: &mut RemovalReport,
    ) -> Result<bool> {
        let key = keys::root_key(&k.0, &k.1);
        // Root deletion and the ledger update under one root lock: a
        // republication of this context (which creates and records its root
        // under the same lock) comes entirely before — and is removed — or
        // entirely after, recorded afresh with its objects live.
        let lock = self.root_lock().await?;
        if claim
            && !ledger
                .run(move |l| l.claim_root_removal(&k.0, &k.1))
                .await?
        {
            return Ok(false);
        }
        if let Err(e) = self.delete_root_object_locked(&key).await {
            if claim {
                let claimed = key.to_string();
                let _ = ledger.run(move |l| l.finish_delete(&claimed, false)).await;
            }
            return Err(e);
        }
        let condemned = ledger
            .run(move |l| l.remove_root(&k.0, &k.1, now_ms()))
            .await;
        drop(lock);
        for (_, bytes) in condemned? {
            report.condemned_objects += 1;
            report.condemned_bytes += bytes;
        }
        for (name, ns, ctx) in self
            .list_holds()
            .await?
            .into_iter()
            .filter(|h| (h.1, h.2) == k)
        {
            let marker = keys::hold_key(&name, &ns, &ctx);
            let _ = self.object_store().delete(&marker).await;
        }
        Ok(true)
    }

    /// Makes room for `need` more bytes under the budget and minimum free
    /// space (see the module docs) and reserves them for the publication
    /// `guard` stands for; a capacity error if impossible.
    ///
    /// The reservation is taken in the ledger transaction that checks the
    /// budget, counting every other publication's reservation: concurrent
    /// publications (in this process or any other sharing the ledger) can
    /// never together exceed a hard budget. It lasts until the publication
    /// ends ([`crate::gc::ProtectGuard::finish`]), by which time its
    /// root and objects are recorded and counted instead.
    #[tracing::instrument(level = "debug", name = "make_room", skip_all, fields(
        need,
        evicted = tracing::field::Empty,
    ))]
    pub(crate) async fn make_room(&self, need: u64, guard: &crate::gc::ProtectGuard) -> Result<()> {
        let (budget, min_free) = (self.config().budget_bytes, self.config().min_free_bytes);
        if budget.is_none() && min_free.is_none() {
            return Ok(());
        }
        let local_root = match self.backend_kind() {
            BackendKind::Local { root } => Some(root.clone()),
            _ => None,
        };
        let ledger = self.ledger().await?;
        let id = guard.id();
        let mut wait = ReservationWait::default();
        // Roots whose removal claim was refused (a delta is being built on
        // them): skipped, with everything they belong to, from then on.
        let mut kept = BTreeSet::new();
        let mut evicted = 0u64;
        loop {
            self.collect_garbage().await?;
            let t = ledger.run(|l| l.usage()).await?;
            self.metrics().ledger_totals(&t, false);
            tracing::Span::current().record("evicted", evicted);
            // Eviction makes room among recorded roots only; other
            // publications' reservations are waited for, not evicted for
            // (a reservation is an upper bound, and most concurrent
            // publications of one context write nothing).
            let live = t.object_bytes + t.root_bytes;
            let free_short = match (min_free, local_root.as_deref().and_then(free_space)) {
                (Some(m), Some(free)) => free < m.saturating_add(need),
                _ => false, // cannot tell: trust the budget
            };
            let live_over = budget.is_some_and(|b| live.saturating_add(need) > b);
            if !live_over && !free_short {
                let Some(b) = budget else {
                    return Ok(());
                };
                let Some(t) = ledger.run(move |l| l.reserve(id, need, b)).await? else {
                    return Ok(());
                };
                let live = t.object_bytes + t.root_bytes;
                if live.saturating_add(need) > b {
                    // Roots were recorded meanwhile: evict again.
                    continue;
                }
                // Other publications in progress hold the space: their
                // roots become evictable, or their bytes come back, when
                // they end.
                if t.reserved_bytes > 0 && wait.pause().await {
                    continue;
                }
                return Err(StoreError::Capacity(format!(
                    "need {need} bytes: {} bytes are condemned and will be reclaimed after the grace period \
                     ({:?}); budget {b}, in use {} (of which {} reserved by publications in progress)",
                    t.condemned_bytes,
                    self.config().grace,
                    t.used_bytes,
                    t.reserved_bytes,
                )));
            }
            // Evict the least recently used evictable root (with dependents).
            let rows = self.lru_rows(ledger).await?;
            let graph = Self::ledger_graph(&rows);
            let mut victim = None;
            for r in &rows {
                let group = graph.with_dependents([(r.namespace, r.context)]);
                if group.iter().any(|k| kept.contains(k)) {
                    continue;
                }
                if !self.any_protected(ledger, &group).await? {
                    victim = Some(group);
                    break;
                }
            }
            let Some(group) = victim else {
                // Other publications hold reservations: once they end, their
                // roots are evictable (or their bytes released). Wait for
                // that, a bounded time, rather than fail at once.
                if t.reserved_bytes > 0 && wait.pause().await {
                    continue;
                }
                return Err(StoreError::Capacity(format!(
                    "need {need} bytes but nothing evictable is left (budget {:?}, live {live} bytes, \
                     free space short: {free_short}); nothing was written",
                    budget
                )));
            };
            let mut report = RemovalReport::default();
            for k in group {
                self.require_owner("evict").await?;
                if !self.remove_one(ledger, k, true, &mut report).await? {
                    // A delta is being built on it (here or on another
                    // node): not evictable for this publication.
                    kept.insert(k);
                    break;
                }
                Stats::add(&self.stats_ref().evictions, 1);
                evicted += 1;
                tracing::info!(root = %keys::root_key(&k.0, &k.1), "evicted");
            }
        }
    }

    /// Plans the eviction of least recently used roots (each with its
    /// dependents; pinned and held ones skipped) until the ledger's live
    /// bytes fit `budget`. Carry it out with [`Store::execute`].
    #[tracing::instrument(level = "info", name = "evict_plan", skip_all, fields(
        budget,
        targets = tracing::field::Empty,
    ))]
    pub async fn evict_plan(&self, budget: u64) -> Result<RemovalPlan> {
        let ledger = self.ledger().await?;
        self.reconcile_ledger().await?;
        let rows = self.lru_rows(ledger).await?;
        let graph = Self::ledger_graph(&rows);
        let t = ledger.run(|l| l.usage()).await?;
        self.metrics().ledger_totals(&t, false);
        let mut live = t.object_bytes + t.root_bytes;
        let mut targets = Vec::new();
        let mut gone = BTreeSet::new();
        let image = ledger.run(|l| l.image()).await?;
        for r in &rows {
            if live <= budget {
                break;
            }
            let k = (r.namespace, r.context);
            if gone.contains(&k) {
                continue;
            }
            let group = graph.with_dependents([k]);
            if self.any_protected(ledger, &group).await? {
                continue;
            }
            // Estimate: root objects + objects used only by the group.
            let mut freed = 0;
            let names: BTreeSet<(String, String)> =
                group.iter().map(|c| (c.0.hex(), c.1.hex())).collect();
            let mut mine: HashMap<&str, usize> = HashMap::new();
            for root in &image.roots {
                if names.contains(&(root.0.clone(), root.1.clone())) {
                    freed += root.6;
                    for k in &root.7 {
                        *mine.entry(k.as_str()).or_default() += 1;
                    }
                }
            }
            for (key, bytes, refs, _) in &image.objects {
                if mine.get(key.as_str()).copied().unwrap_or(0) as u64 == *refs && *refs > 0 {
                    freed += bytes;
                }
            }
            live = live.saturating_sub(freed);
            for g in group {
                if gone.insert(g) {
                    targets.push(g);
                }
            }
        }
        tracing::Span::current().record("targets", targets.len());
        Ok(RemovalPlan {
            kind: RemovalKind::Evict,
            targets,
        })
    }

    /// Plans the removal of roots matching `filter` (pinned and held ones
    /// skipped), each with its dependents.
    #[tracing::instrument(level = "info", name = "prune_plan", skip_all, fields(
        targets = tracing::field::Empty,
    ))]
    pub async fn prune_plan(&self, filter: &PruneFilter) -> Result<RemovalPlan> {
        let ledger = self.ledger().await?;
        self.reconcile_ledger().await?;
        let now = now_ms();
        let rows = self.lru_rows(ledger).await?;
        let mut seeds = Vec::new();
        for r in &rows {
            let k = (r.namespace, r.context);
            if filter.namespace.is_some_and(|n| n != r.namespace)
                || filter
                    .schema
                    .as_deref()
                    .is_some_and(|s| s != r.schema && !r.schema.ends_with(s))
                || filter
                    .idle_for
                    .is_some_and(|d| now.saturating_sub(r.last_access_ms) < d.as_millis() as u64)
            {
                continue;
            }
            seeds.push(k);
        }
        let graph = Self::ledger_graph(&rows);
        let mut targets = Vec::new();
        let mut seen = BTreeSet::new();
        for k in seeds {
            let group = graph.with_dependents([k]);
            if self.any_protected(ledger, &group).await? {
                continue;
            }
            for g in group {
                if seen.insert(g) {
                    targets.push(g);
                }
            }
        }
        tracing::Span::current().record("targets", targets.len());
        Ok(RemovalPlan {
            kind: RemovalKind::Prune,
            targets,
        })
    }

    /// Plans the removal of every root (or every root of one namespace),
    /// holds included, with every delta built on them.
    pub async fn clear_plan(&self, namespace: Option<Namespace>) -> Result<RemovalPlan> {
        self.reconcile_ledger().await?;
        let rows = self.lru_rows(self.ledger().await?).await?;
        let seeds = rows
            .iter()
            .filter(|r| namespace.is_none_or(|n| n == r.namespace))
            .map(|r| (r.namespace, r.context))
            .collect();
        Ok(Self::plan_with_dependents(RemovalKind::Clear, &rows, seeds))
    }

    /// Plans the invalidation of a namespace (e.g. the model changed) or one
    /// context of it, with every delta built on them, regardless of holds.
    pub async fn invalidate_plan(
        &self,
        namespace: Namespace,
        context: Option<ContextDigest>,
    ) -> Result<RemovalPlan> {
        self.reconcile_ledger().await?;
        let rows = self.lru_rows(self.ledger().await?).await?;
        let seeds = rows
            .iter()
            .filter(|r| r.namespace == namespace && context.is_none_or(|c| c == r.context))
            .map(|r| (r.namespace, r.context))
            .collect();
        Ok(Self::plan_with_dependents(
            RemovalKind::Invalidate,
            &rows,
            seeds,
        ))
    }

    /// Writes this handle's counters into the ledger (accumulating across
    /// processes for a local store). The CLI calls it after each restore,
    /// publication and lookup; a handle's drop writes what is left.
    pub async fn flush_counters(&self) -> Result<()> {
        let now = self.stats();
        let mut last = match self.inner.flushed.lock() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let deltas = crate::stats::counter_deltas(&now, &last);
        self.ledger()
            .await?
            .run(move |l| l.add_counters(&deltas))
            .await?;
        last = now;
        if let Ok(mut l) = self.inner.flushed.lock() {
            *l = last;
        }
        Ok(())
    }

    /// Gauges, persisted counters and this process's counters. Also
    /// refreshes the ledger gauges of [`Store::register_metrics`].
    pub async fn stats_report(&self) -> Result<crate::stats::StatsReport> {
        self.flush_counters().await?;
        let ledger = self.ledger().await?;
        let free_bytes = match self.backend_kind() {
            BackendKind::Local { root } => free_space(root),
            _ => None,
        };
        let report = crate::stats::StatsReport {
            ledger: ledger.run(|l| l.totals()).await?,
            free_bytes,
            budget_bytes: self.config().budget_bytes,
            counters: ledger.run(|l| l.counters()).await?,
            process: self.stats(),
        };
        self.metrics().ledger_totals(&report.ledger, true);
        self.metrics()
            .report(&report.counters, report.budget_bytes, report.free_bytes);
        Ok(report)
    }
}

//! The ledger's life cycle in a store handle: opening it (by URL or by
//! the backend's default), rebuilding it from a listing, reconciling it
//! with the store (a merge, never a replacement).
//!
//! The ledger is derived state: nothing here treats it as the source of
//! truth over the store's own objects.

use deltapack_format::{ContextDigest, Namespace};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStoreExt;

use crate::backend::BackendKind;
use crate::error::{Result, StoreError};
use crate::keys;
use crate::ledger::{now_ms, ColdStart, Ledger, Listing, RootEntry, Totals};
use crate::store::{RootStatus, Store};

/// Root reads in flight while the ledger is rebuilt or reconciled.
pub(crate) const REBUILD_READS: usize = 32;

/// Opens the ledger a store of `kind` uses (see [`Store::ledger`]); with
/// the store's identity when the ledger lives outside the store.
pub(crate) fn open_ledger(
    kind: &BackendKind,
    url: Option<&str>,
) -> Result<(Ledger, Option<String>)> {
    let identity = kind.identity();
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
            // Never echo the setting: it may hold credentials.
            let scheme = url.split_once("://").map_or("no scheme", |(s, _)| s);
            return Err(StoreError::Invalid(format!(
                "a ledger URL of scheme {scheme:?}: use sqlite:///path/ledger.sqlite3 or \
                 postgres://user@host/db"
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

    pub(crate) async fn open_ledger_once(&self) -> Result<&Ledger> {
        self.inner
            .ledger
            .get_or_try_init(|| async {
                let kind = self.backend_kind().clone();
                let url = self.config().capacity.ledger.clone();
                let (ledger, external) =
                    tokio::task::spawn_blocking(move || open_ledger(&kind, url.as_deref()))
                        .await
                        .map_err(|e| StoreError::task("ledger open", e))??;
                // Opening it was a contact; so is every call that succeeds.
                self.metrics().ledger_reached();
                ledger.on_reached(self.metrics().ledger_reached_hook());
                let policy = self.config().capacity.cold_start;
                let mut fresh = false;
                if let Some(id) = external {
                    fresh = ledger.run(move |l| l.bind_store(&id)).await?;
                }
                let location = ledger.location().clone();
                let mut background = false;
                match policy {
                    ColdStart::Clear => {
                        self.clear_store(&ledger).await?;
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
    pub(crate) async fn reconcile_once(&self, ledger: &Ledger) -> Result<()> {
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
        let began = now_ms();
        let listed: Vec<(Namespace, ContextDigest, u64)> = self
            .list_all(&Path::from(keys::ROOTS))
            .await?
            .iter()
            .filter_map(|m| keys::parse_root_key(&m.location).map(|(n, c)| (n, c, m.size)))
            .collect();
        let holds: Vec<_> = self
            .list_holds()
            .await?
            .into_iter()
            .map(|(name, ns, ctx)| (name.as_str().to_string(), ns, ctx))
            .collect();
        let objects = self.list_all(&Path::from(keys::OBJECTS)).await?;
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
        let roots: Vec<RootEntry> = filter_concurrently(to_read, |(ns, ctx, size)| async move {
            Ok(match self.peek_root(&ns, &ctx).await? {
                RootStatus::Found(r) => r.summary().map(|s| RootEntry::from_summary(&s, size)),
                _ => None,
            })
        })
        .await?;
        let unlisted: Vec<_> = known
            .iter()
            .filter(|k| !listed_ids.contains(k))
            .copied()
            .collect();
        let vanished: Vec<(Namespace, ContextDigest)> =
            filter_concurrently(unlisted, |(ns, ctx)| async move {
                let key = keys::root_key(&ns, &ctx);
                match self.object_store().head(&key).await {
                    Ok(_) => Ok(None),
                    Err(object_store::Error::NotFound { .. }) => Ok(Some((ns, ctx))),
                    Err(e) => Err(StoreError::io(&key, e)),
                }
            })
            .await?;
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
}

/// Runs `f` on every item, [`REBUILD_READS`] at a time, and keeps the
/// `Some` answers (in completion order); the first error ends it.
async fn filter_concurrently<I, F, Fut, U>(items: I, f: F) -> Result<Vec<U>>
where
    I: IntoIterator,
    F: FnMut(I::Item) -> Fut,
    Fut: std::future::Future<Output = Result<Option<U>>>,
{
    use futures::StreamExt;
    let found: Vec<Option<U>> = futures::stream::iter(items)
        .map(f)
        .buffer_unordered(REBUILD_READS)
        .try_collect()
        .await?;
    Ok(found.into_iter().flatten().collect())
}

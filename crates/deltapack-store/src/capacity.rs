//! The ledger as a store handle uses it day to day: recording roots,
//! batching last-access touches, totals and images, persisted counters,
//! the stats report, closing, and the free space of a local disk.
//!
//! Decisions (what to evict, what to delete) are in `removal.rs` and
//! `gc.rs`.

use deltapack_format::{ContextDigest, Namespace};

use crate::backend::BackendKind;
use crate::base_graph::RootId;
use crate::error::{Result, StoreError};
use crate::ledger::{now_ms, RootEntry, Totals};
use crate::stats::Stats;
use crate::store::Store;

/// Free bytes on the filesystem holding `path`.
#[cfg(unix)]
pub fn free_space(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statvfs` is a plain C struct of integers, for which all
    // zero bytes is a valid value.
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

/// How long [`Store::close`] waits for queued moves to quarantine.
const QUARANTINE_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

impl Store {
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
    /// access flush already under way, counters) and waits for it, after
    /// the moves to quarantine its reads queued
    /// ([`Store::settle_quarantines`], at most 500 ms). Call it
    /// before the runtime shuts down (a process about to exit): a flush
    /// still in flight then would be cancelled, and its accesses lost. A
    /// handle that owes nothing opens no ledger, and one whose ledger was
    /// found down within [`crate::LEDGER_RETRY`] does not ask it again
    /// (bound the call with a timeout where a hanging ledger must not hold
    /// a process's exit, as the CLI does).
    pub async fn close(&self) -> Result<()> {
        // Queued moves to quarantine, for a while: one waiting for a ledger
        // that does not answer is left to its retries (or to the next read).
        let _ = tokio::time::timeout(QUARANTINE_CLOSE_WAIT, self.settle_quarantines()).await;
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

    /// Takes the queued accesses (see [`Store::ledger_touch`]).
    pub(crate) fn take_touches(&self) -> Vec<(RootId, u64)> {
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

    /// The tier's part of [`Store::stats_report`].
    async fn tier_report(&self) -> Result<Option<crate::stats::TierReport>> {
        let Some(t) = self.tier() else {
            return Ok(None);
        };
        let tier = &t.store;
        let ledger = tier.ledger().await?;
        let free_bytes = match tier.backend_kind() {
            BackendKind::Local { root } => free_space(root),
            _ => None,
        };
        let upload_backlog = self.tier_backlog().await?;
        let mut process = t.stats();
        process.upload_backlog = upload_backlog;
        Ok(Some(crate::stats::TierReport {
            url: t.config.url.clone(),
            ledger: ledger.run(|l| l.totals()).await?,
            budget_bytes: t.config.budget_bytes,
            free_bytes,
            upload_backlog,
            process,
        }))
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
            budget_bytes: self.config().capacity.budget_bytes,
            counters: ledger.run(|l| l.counters()).await?,
            process: self.stats(),
            tier: self.tier_report().await?,
        };
        self.metrics().ledger_totals(&report.ledger, true);
        self.metrics()
            .report(&report.counters, report.budget_bytes, report.free_bytes);
        Ok(report)
    }
}

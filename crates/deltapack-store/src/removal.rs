//! Removals: plans (evict, prune, clear, invalidate) → execute, and making
//! room for a publication under the budget. Objects are only condemned
//! here; `gc.rs` deletes them.
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

use deltapack_format::{ContextDigest, Namespace};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use serde::Serialize;

use crate::backend::BackendKind;
use crate::base_graph::{BaseGraph, RootId};
use crate::capacity::free_space;
use crate::error::{CapacityError, Result, StoreError};
use crate::keys;
use crate::ledger::{now_ms, Ledger, RootRow};
use crate::stats::Stats;
use crate::store::Store;

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
    /// Roots removed (or to be removed) although a hold protected them —
    /// `clear` and `invalidate` override holds — each with its holds'
    /// names, as `root key: name, name`.
    pub overridden_holds: Vec<String>,
    /// How long condemned objects stay in the store before garbage
    /// collection may delete them (the store's grace period), in seconds:
    /// what was condemned and not deleted is still there until then.
    pub grace_seconds: u64,
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
    /// Of those, the ones a hold protects, with the holds' names (filled
    /// for the kinds that override holds: clear, invalidate).
    held: Vec<(RootId, Vec<String>)>,
    /// The store's grace period, in seconds.
    grace_seconds: u64,
}

/// A plan being gathered: each chosen root once, in the order first met.
struct Gathering {
    kind: RemovalKind,
    targets: Vec<RootId>,
    seen: BTreeSet<RootId>,
}

impl Gathering {
    fn new(kind: RemovalKind) -> Gathering {
        Gathering {
            kind,
            targets: Vec::new(),
            seen: BTreeSet::new(),
        }
    }

    /// Whether `root` is in the plan already.
    fn has(&self, root: &RootId) -> bool {
        self.seen.contains(root)
    }

    /// Adds a root with its dependents (those already in, once).
    fn add(&mut self, group: Vec<RootId>) {
        for g in group {
            if self.seen.insert(g) {
                self.targets.push(g);
            }
        }
    }

    /// The plan, its size recorded on the current span (`targets`).
    fn plan(self) -> RemovalPlan {
        tracing::Span::current().record("targets", self.targets.len());
        RemovalPlan {
            kind: self.kind,
            targets: self.targets,
            held: Vec::new(),
            grace_seconds: 0,
        }
    }
}

impl RemovalPlan {
    /// A plan of `kind` removing nothing.
    fn empty(kind: RemovalKind) -> RemovalPlan {
        RemovalPlan {
            kind,
            targets: Vec::new(),
            held: Vec::new(),
            grace_seconds: 0,
        }
    }

    /// Why these roots are removed.
    pub fn kind(&self) -> RemovalKind {
        self.kind
    }

    /// The roots the plan removes, dependents first.
    pub(crate) fn targets(&self) -> Vec<RootId> {
        self.targets.clone()
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
            overridden_holds: self.overridden_holds(),
            grace_seconds: self.grace_seconds,
            dry_run: true,
            ..Default::default()
        }
    }

    /// The held roots the plan removes anyway, as reported.
    fn overridden_holds(&self) -> Vec<String> {
        self.held
            .iter()
            .map(|((ns, ctx), names)| format!("{}: {}", keys::root_key(ns, ctx), names.join(", ")))
            .collect()
    }
}

/// How long a publication waits for other publications' reservations to
/// end when nothing else can be evicted to fit it under the budget.
pub(crate) const RESERVATION_PATIENCE: Duration = Duration::from_secs(60);

/// Waiting for other publications' reservations: pauses backing off from 5
/// to 100 ms, for at most [`RESERVATION_PATIENCE`] in all.
#[derive(Default)]
pub(crate) struct ReservationWait {
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

impl Store {
    /// Deletes every root, object and hold (the `clear` cold start).
    pub(crate) async fn clear_store(&self, ledger: &Ledger) -> Result<()> {
        // Checked at least every second: an adoption stops a long clear.
        let mut fence =
            crate::ownership::OwnerFence::start_with(self, ledger.clone(), "clear").await?;
        for prefix in [keys::ROOTS, keys::OBJECTS, keys::HOLDS] {
            let p = Path::from(prefix);
            for m in self.list_all(&p).await? {
                fence.check(self).await?;
                match self.object_store().delete(&m.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(StoreError::io(&m.location, e)),
                }
            }
        }
        Ok(())
    }

    /// The base graph of the roots the ledger knows.
    pub(crate) fn ledger_graph(rows: &[RootRow]) -> BaseGraph {
        let mut graph = BaseGraph::default();
        for r in rows {
            if let Some(b) = r.base {
                graph.link((r.namespace, r.context), b);
            }
        }
        graph
    }

    /// Whether a pin or a hold protects any of `roots`.
    pub(crate) async fn any_protected(&self, ledger: &Ledger, roots: &[RootId]) -> Result<bool> {
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

    /// Completes a plan for its report: the store's grace period and, for
    /// the kinds that override holds, the held roots it removes.
    async fn finish_plan(&self, mut plan: RemovalPlan) -> Result<RemovalPlan> {
        plan.grace_seconds = self.config().capacity.grace.as_secs();
        if matches!(plan.kind, RemovalKind::Clear | RemovalKind::Invalidate) {
            let targets = plan.targets.clone();
            let ledger = self.ledger().await?;
            plan.held = ledger.run(move |l| l.holds_on(&targets)).await?;
        }
        Ok(plan)
    }

    /// A plan removing `seeds`, each with every delta built on it.
    pub(crate) fn plan_with_dependents(
        kind: RemovalKind,
        rows: &[RootRow],
        seeds: Vec<RootId>,
    ) -> RemovalPlan {
        RemovalPlan {
            kind,
            targets: Self::ledger_graph(rows).with_dependents(seeds),
            held: Vec::new(),
            grace_seconds: 0,
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
        let mut report = RemovalReport {
            grace_seconds: self.config().capacity.grace.as_secs(),
            ..RemovalReport::default()
        };
        // The holds this removal overrides: as planned, and any taken on a
        // planned root since.
        let held = if respect {
            Vec::new()
        } else {
            let targets = plan.targets.clone();
            ledger.run(move |l| l.holds_on(&targets)).await?
        };
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
        report.overridden_holds = RemovalPlan {
            held: held.into_iter().filter(|(k, _)| done.contains(k)).collect(),
            ..RemovalPlan::empty(plan.kind)
        }
        .overridden_holds();
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
    pub(crate) async fn remove_one(
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
        // The claim's collector identity: its heartbeat keeps the claim
        // fresh until the removal is recorded (dropped at return).
        let mut claimant = None;
        if claim {
            let mut c = crate::ledger::Claimant::new(ledger)?;
            let (id, began) = (c.id(), std::time::Instant::now());
            if !ledger
                .run(move |l| l.claim_root_removal(&k.0, &k.1, id))
                .await?
            {
                return Ok(false);
            }
            c.claimed(began);
            crate::failpoint::reached("remove.claimed");
            claimant = Some(c);
        }
        // A claim this remover can no longer vouch for is not acted on.
        let deleted = match claimant.as_ref().map(|c| c.time_left()) {
            Some(Err(e)) => Err(StoreError::from(e)),
            _ => self.delete_root_object_locked(&key).await,
        };
        if let Err(e) = deleted {
            if claim {
                let claimed = key.to_string();
                let _ = ledger.run(move |l| l.finish_delete(&claimed, false)).await;
            }
            return Err(e);
        }
        if claim {
            crate::failpoint::reached("remove.deleted");
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
        let (budget, min_free) = (
            self.config().capacity.budget_bytes,
            self.config().capacity.min_free_bytes,
        );
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
                return Err(StoreError::Capacity(CapacityError::AwaitingGrace {
                    need,
                    condemned: t.condemned_bytes,
                    grace: self.config().capacity.grace,
                    budget: b,
                    used: t.used_bytes,
                    reserved: t.reserved_bytes,
                }));
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
                return Err(StoreError::Capacity(CapacityError::NothingEvictable {
                    need,
                    budget,
                    live,
                    free_short,
                }));
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
        let mut plan = Gathering::new(RemovalKind::Evict);
        let image = ledger.run(|l| l.image()).await?;
        for r in &rows {
            if live <= budget {
                break;
            }
            let k = (r.namespace, r.context);
            if plan.has(&k) {
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
                if names.contains(&(root.namespace.clone(), root.context.clone())) {
                    freed += root.root_bytes;
                    for k in &root.objects {
                        *mine.entry(k.as_str()).or_default() += 1;
                    }
                }
            }
            for o in &image.objects {
                if mine.get(o.key.as_str()).copied().unwrap_or(0) as u64 == o.refs && o.refs > 0 {
                    freed += o.bytes;
                }
            }
            live = live.saturating_sub(freed);
            plan.add(group);
        }
        self.finish_plan(plan.plan()).await
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
        let mut plan = Gathering::new(RemovalKind::Prune);
        for k in seeds {
            let group = graph.with_dependents([k]);
            if !self.any_protected(ledger, &group).await? {
                plan.add(group);
            }
        }
        self.finish_plan(plan.plan()).await
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
        let plan = Self::plan_with_dependents(RemovalKind::Clear, &rows, seeds);
        self.finish_plan(plan).await
    }

    /// Plans the removal of one root with every delta built on it,
    /// respecting pins and holds as a pruning does (a tier dropping a root
    /// the origin no longer holds: nothing journaled for upload, nor what
    /// it needs, goes).
    pub(crate) async fn drop_plan(
        &self,
        namespace: Namespace,
        context: ContextDigest,
    ) -> Result<RemovalPlan> {
        let rows = self.lru_rows(self.ledger().await?).await?;
        let seeds = rows
            .iter()
            .filter(|r| r.namespace == namespace && r.context == context)
            .map(|r| (r.namespace, r.context))
            .collect();
        Ok(Self::plan_with_dependents(RemovalKind::Prune, &rows, seeds))
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
        let plan = Self::plan_with_dependents(RemovalKind::Invalidate, &rows, seeds);
        self.finish_plan(plan).await
    }
}

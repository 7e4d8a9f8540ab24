//! A fault-injecting `ObjectStore` layer ([`Intercept`]): forwards every
//! trait method to a real backend, and can fail the Nth operation, fail a
//! fraction of operations, add latency, return truncated or bit-flipped
//! bodies, or "crash" — refuse every operation after the Nth, as if the
//! process had died there.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use deltapack_store::wrap::{Intercept, ReadHead, Wrapped};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

use super::{mix64, GOLDEN_GAMMA};

/// What to inject.
#[derive(Debug, Clone, Default)]
pub(crate) struct FaultPlan {
    /// Fail exactly this operation (1-based).
    pub(crate) fail_nth: Option<u64>,
    /// After this many operations, every further operation fails.
    pub(crate) crash_after: Option<u64>,
    /// Fail this fraction of operations (deterministic from `seed`).
    pub(crate) fail_fraction: f64,
    /// Added to every operation.
    pub(crate) latency: Duration,
    /// Truncate GET bodies by one byte.
    pub(crate) truncate_bodies: bool,
    /// Flip one bit in GET bodies of objects.
    pub(crate) flip_bodies: bool,
    /// Seed for `fail_fraction`.
    pub(crate) seed: u64,
    /// Flip one bit in the bodies of the next this many GETs whose key
    /// starts with `once_prefix` (damage in transit), then stop.
    pub(crate) flip_next: u64,
    /// Fail the next this many GETs whose key starts with `once_prefix`
    /// (a transient error), then stop.
    pub(crate) fail_next: u64,
    /// Key prefix `flip_next` and `fail_next` apply to ("" = every key).
    pub(crate) once_prefix: &'static str,
    /// Another actor's change to the inner store, made once: armed by the
    /// first successful PUT whose key starts with `race_after_put`, applied
    /// right after the next GET of the race's key has been served — the
    /// window between a writer's check of a key and its overwrite (e.g. an
    /// eviction in another process during a migration).
    pub(crate) race: Option<Race>,
    /// Key prefix of the PUT that arms `race`.
    pub(crate) race_after_put: &'static str,
    /// Conditional overwrites (`PutMode::Update`) fail as not implemented,
    /// like a backend without `If-Match`.
    pub(crate) updates_unsupported: bool,
    /// Flip one random bit in this fraction of GET bodies, objects and
    /// roots alike (damage in transit; random from `seed`). Never in two
    /// reads of one key in a row (failed reads in between do not count):
    /// damage seen again on the re-read is, by the quarantine rule, damage
    /// at rest.
    pub(crate) flip_fraction: f64,
    /// Fail this fraction of GETs (not HEADs) with a transient error.
    pub(crate) get_fail_fraction: f64,
    /// Delay this fraction of GETs by a random time up to `slow_get`.
    pub(crate) slow_get_fraction: f64,
    /// Longest delay of a slow GET.
    pub(crate) slow_get: Duration,
    /// Never flip a read right after a failed read of the same key (so a
    /// failed read and a flipped re-read never meet).
    pub(crate) no_flip_after_error: bool,
    /// The next create-if-absent PUT whose key starts with this prefix
    /// answers "already exists" without writing anything: another writer's
    /// object, gone again by the time anyone reads it (then the prefix is
    /// cleared).
    pub(crate) create_exists_once: Option<&'static str>,
    /// Runs once, right after the first delete of a key starting with its
    /// prefix has been carried out and before the delete returns (or, with
    /// `before`, right before it is carried out): another
    /// actor working in the window between a remover's deletion and its
    /// next step (e.g. its ledger update).
    pub(crate) after_delete: Option<Hook>,
    /// Runs once, after the first listing of a prefix starting with its
    /// prefix has been read from the inner store and before any of it is
    /// served: another actor working while a lister (e.g. a ledger
    /// rebuild) acts on a listing that is already out of date. A hook that
    /// waits holds the listing back.
    pub(crate) after_list: Option<Hook>,
    /// Runs once, after the first GET (not HEAD) of a key starting with its
    /// prefix has been answered by the inner store and before its body is
    /// served: another actor working while a reader acts on what it read
    /// (e.g. a publisher that has just checked its base root).
    pub(crate) after_get: Option<Hook>,
}

/// Work another actor does in a window of this store's caller (see
/// [`FaultPlan::after_delete`], [`FaultPlan::after_list`] and
/// [`FaultPlan::after_get`]).
#[derive(Clone)]
pub(crate) struct Hook {
    /// Key prefix of the delete (or listing) that triggers the hook.
    pub(crate) prefix: &'static str,
    /// Run before the delete is carried out (not after; deletes only).
    pub(crate) before: bool,
    /// Set once the hook has run (it runs once).
    pub(crate) fired: Arc<std::sync::atomic::AtomicBool>,
    /// The work.
    pub(crate) run: Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>,
}

impl Hook {
    /// A hook on `prefix` that runs `run` once, after the operation (a
    /// delete hook can run before it instead: set [`Hook::before`]).
    pub(crate) fn after<F, Fut>(prefix: &'static str, run: F) -> Hook
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        Hook {
            prefix,
            before: false,
            fired: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            run: Arc::new(move || run().boxed()),
        }
    }

    /// Whether the hook has run.
    pub(crate) fn has_fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// Runs the hook (once) if `r` is a delete of a key under its prefix;
    /// passes `r` through.
    async fn fire(self, r: Result<Path>) -> Result<Path> {
        if let Ok(path) = &r {
            if path.as_ref().starts_with(self.prefix) && !self.fired.swap(true, Ordering::SeqCst) {
                (self.run)().await;
            }
        }
        r
    }
}

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hook({:?})", self.prefix)
    }
}

/// A publication running in a task of its own.
type PublishTask =
    tokio::task::JoinHandle<deltapack_store::Result<deltapack_store::PublishReceipt>>;

/// The republication a hook of [`republish_on_delete`] starts, once the
/// hook has run.
#[derive(Clone, Default)]
pub(crate) struct Republication(Arc<Mutex<Option<PublishTask>>>);

impl Republication {
    /// The republication's receipt. The test fails with `ran` if the hook
    /// has not run, or if the republication failed.
    pub(crate) async fn receipt(&self, ran: &str) -> deltapack_store::PublishReceipt {
        let task = self.0.lock().expect("slot").take().expect(ran);
        task.await.expect("task").expect("the republication")
    }
}

/// Replaces `faulty`'s plan with a delete hook on `prefix` (run `before`
/// the delete, or right after it) in which another handle, `s`, republishes
/// `snap` flat under `c`: the republication is given up to 2 s to finish
/// inside the window, and is returned for the test to await.
pub(crate) fn republish_on_delete(
    faulty: &Faulty,
    prefix: &'static str,
    before: bool,
    s: &deltapack_store::Store,
    id: &deltapack_format::CacheIdentity,
    c: deltapack_format::ContextDigest,
    snap: &Arc<deltapack_format::Snapshot>,
) -> Republication {
    let slot = Republication::default();
    let (s2, id2, snap2, slot2) = (s.clone(), id.clone(), snap.clone(), slot.clone());
    let hook = Hook::after(prefix, move || {
        let (s2, id2, snap2, slot2) = (s2.clone(), id2.clone(), snap2.clone(), slot2.clone());
        async move {
            let h = tokio::spawn(async move {
                s2.publish(super::flat(
                    &id2,
                    c,
                    &snap2,
                    deltapack_store::RootFormat::V2,
                ))
                .await
            });
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                while !h.is_finished() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
            *slot2.0.lock().expect("slot") = Some(h);
        }
    });
    faulty.set_plan(FaultPlan {
        after_delete: Some(Hook { before, ..hook }),
        ..Default::default()
    });
    slot
}

/// What the random transient faults (`flip_fraction`, `get_fail_fraction`,
/// `slow_get_fraction`) injected so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TransientCounts {
    /// GET bodies with a flipped bit.
    pub(crate) flips: u64,
    /// GETs failed.
    pub(crate) errors: u64,
    /// GETs delayed.
    pub(crate) slowed: u64,
}

/// State of the random transient faults.
#[derive(Debug, Default)]
struct Transient {
    /// Draws taken (the random stream's position).
    draws: u64,
    /// Keys whose last read was flipped (the next read of each is clean).
    flipped: std::collections::HashSet<String>,
    /// Keys whose last read failed.
    failed: std::collections::HashSet<String>,
    /// Per key, what each GET met: `.` clean, `e` error, `f` flip.
    history: std::collections::HashMap<String, String>,
    counts: TransientCounts,
}

/// A change another actor makes to the store behind the wrapper's back.
#[derive(Debug, Clone)]
pub(crate) enum Race {
    /// The key is deleted.
    Delete(Path),
    /// The key is overwritten with these bytes.
    Put(Path, Bytes),
}

impl Race {
    fn key(&self) -> &Path {
        match self {
            Race::Delete(k) | Race::Put(k, _) => k,
        }
    }
}

/// The fault layer; [`Faulty::new`] puts it in front of a store.
#[derive(Debug)]
pub(crate) struct Faulty {
    inner: Arc<dyn ObjectStore>,
    plan: Mutex<FaultPlan>,
    ops: AtomicU64,
    injected: AtomicU64,
    race_armed: std::sync::atomic::AtomicBool,
    transient: Mutex<Transient>,
}

fn injected(op: &str, n: u64) -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: format!("injected fault in {op} (operation {n})").into(),
    }
}

/// A store behind a [`Faulty`] layer (the layer's methods through `Deref`).
pub(crate) type FaultyStore = Wrapped<Faulty>;

impl Faulty {
    /// `inner` with `latency` added to every operation, and no faults.
    pub(crate) fn slowed(inner: Arc<dyn ObjectStore>, latency: Duration) -> Arc<FaultyStore> {
        Arc::new(Faulty::new(
            inner,
            FaultPlan {
                latency,
                ..Default::default()
            },
        ))
    }

    /// `inner` behind a fault layer that follows `plan`.
    pub(crate) fn new(inner: Arc<dyn ObjectStore>, plan: FaultPlan) -> FaultyStore {
        Wrapped(Faulty {
            inner,
            plan: Mutex::new(plan),
            ops: AtomicU64::new(0),
            injected: AtomicU64::new(0),
            race_armed: std::sync::atomic::AtomicBool::new(false),
            transient: Mutex::new(Transient::default()),
        })
    }

    /// What the random transient faults injected so far.
    pub(crate) fn transient_counts(&self) -> TransientCounts {
        self.transient.lock().map(|t| t.counts).unwrap_or_default()
    }

    /// What the GETs of `key` met while random transient faults were on,
    /// in order: `.` clean, `e` failed, `f` flipped.
    pub(crate) fn read_history(&self, key: &str) -> String {
        self.transient
            .lock()
            .ok()
            .and_then(|t| t.history.get(key).cloned())
            .unwrap_or_default()
    }

    /// Draws the random transient faults of one GET of `key`: an optional
    /// delay, whether it fails, and a flip position (a random `u64`).
    fn draw_transient(&self, key: &str) -> (Option<Duration>, bool, Option<u64>) {
        let plan = self.plan();
        if plan.flip_fraction <= 0.0
            && plan.get_fail_fraction <= 0.0
            && plan.slow_get_fraction <= 0.0
        {
            return (None, false, None);
        }
        let Ok(mut t) = self.transient.lock() else {
            return (None, false, None);
        };
        let mut next = || {
            t.draws += 1;
            mix64(plan.seed ^ t.draws.wrapping_mul(GOLDEN_GAMMA))
        };
        let unit = |z: u64| z as f64 / u64::MAX as f64;
        let (a, b, c, d) = (next(), next(), next(), next());
        let slow = (unit(a) < plan.slow_get_fraction).then(|| plan.slow_get.mul_f64(unit(b)));
        let fail = unit(c) < plan.get_fail_fraction;
        let after_error = t.failed.remove(key);
        if fail {
            t.failed.insert(key.to_string());
        }
        let flip = if fail {
            false
        } else {
            // The read after a flipped read of the same key is clean (failed
            // reads in between do not count), and with `no_flip_after_error`
            // so is the read right after a failed one.
            let spared = t.flipped.remove(key) || (after_error && plan.no_flip_after_error);
            let flip = !spared && unit(d) < plan.flip_fraction;
            if flip {
                t.flipped.insert(key.to_string());
            }
            flip
        };
        t.counts.slowed += u64::from(slow.is_some());
        t.counts.errors += u64::from(fail);
        t.counts.flips += u64::from(flip);
        let mark = if fail {
            'e'
        } else if flip {
            'f'
        } else {
            '.'
        };
        t.history.entry(key.to_string()).or_default().push(mark);
        (slow, fail, flip.then(|| mix64(d)))
    }

    /// Operations seen so far.
    pub(crate) fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }

    /// Replaces the plan (e.g. arms a one-shot fault after setting up).
    pub(crate) fn set_plan(&self, plan: FaultPlan) {
        if let Ok(mut p) = self.plan.lock() {
            *p = plan;
        }
    }

    /// Takes one of the one-shot faults for a GET of `key`: (fail, flip).
    fn one_shot(&self, key: &str) -> (bool, bool) {
        let Ok(mut p) = self.plan.lock() else {
            return (false, false);
        };
        if !key.starts_with(p.once_prefix) {
            return (false, false);
        }
        if p.fail_next > 0 {
            p.fail_next -= 1;
            return (true, false);
        }
        if p.flip_next > 0 {
            p.flip_next -= 1;
            return (false, true);
        }
        (false, false)
    }

    fn plan(&self) -> FaultPlan {
        self.plan.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Counts an operation and decides whether it fails.
    async fn gate(&self, op: &str) -> Result<()> {
        let n = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
        let plan = self.plan();
        if !plan.latency.is_zero() {
            tokio::time::sleep(plan.latency).await;
        }
        let crash = plan.crash_after.is_some_and(|c| n > c);
        let nth = plan.fail_nth == Some(n);
        let frac = plan.fail_fraction > 0.0 && {
            let z = mix64(plan.seed ^ n.wrapping_mul(GOLDEN_GAMMA));
            (z as f64 / u64::MAX as f64) < plan.fail_fraction
        };
        if crash || nth || frac {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(injected(op, n));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Intercept for Faulty {
    deltapack_store::layer_basics!("Faulty");

    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.gate("put").await?;
        if matches!(opts.mode, object_store::PutMode::Update(_)) && self.plan().updates_unsupported
        {
            return Err(object_store::Error::NotImplemented {
                operation: "conditional overwrite".into(),
                implementer: format!("Faulty({})", self.inner),
            });
        }
        if matches!(opts.mode, object_store::PutMode::Create) {
            let lost = self.plan.lock().ok().is_some_and(|mut p| {
                let hit = p
                    .create_exists_once
                    .is_some_and(|prefix| location.as_ref().starts_with(prefix));
                if hit {
                    p.create_exists_once = None;
                }
                hit
            });
            if lost {
                return Err(object_store::Error::AlreadyExists {
                    path: location.to_string(),
                    source: "injected: another writer created it".into(),
                });
            }
        }
        let r = self.inner.put_opts(location, payload, opts).await?;
        if let Ok(p) = self.plan.lock() {
            if p.race.is_some() && location.as_ref().starts_with(p.race_after_put) {
                self.race_armed.store(true, Ordering::SeqCst);
            }
        }
        Ok(r)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.gate("put_multipart").await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.gate("get").await?;
        let head = options.head;
        let (fail_once, flip_once) = if head {
            (false, false)
        } else {
            self.one_shot(location.as_ref())
        };
        if fail_once {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(injected("get (one-shot)", self.ops()));
        }
        let (slow, fail_random, flip_random) = if head {
            (None, false, None)
        } else {
            self.draw_transient(location.as_ref())
        };
        if let Some(d) = slow {
            tokio::time::sleep(d).await;
        }
        if fail_random {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(injected("get (transient)", self.ops()));
        }
        let r = self.inner.get_opts(location, options).await?;
        let plan = self.plan();
        if let Some(hook) = plan.after_get.clone().filter(|_| !head) {
            if location.as_ref().starts_with(hook.prefix)
                && !hook.fired.swap(true, Ordering::SeqCst)
            {
                (hook.run)().await;
            }
        }
        let race = match self.plan.lock() {
            Ok(mut p)
                if !head
                    && self.race_armed.load(Ordering::SeqCst)
                    && p.race.as_ref().is_some_and(|r| r.key() == location) =>
            {
                p.race.take()
            }
            _ => None,
        };
        let damage = flip_once
            || flip_random.is_some()
            || ((plan.truncate_bodies || plan.flip_bodies)
                && location.as_ref().starts_with("objects/"));
        if !damage && race.is_none() {
            return Ok(r);
        }
        let (reply, b) = ReadHead::read(r).await?;
        let mut b = b.to_vec();
        match race {
            Some(Race::Delete(key)) => {
                object_store::ObjectStoreExt::delete(&*self.inner, &key).await?
            }
            Some(Race::Put(key, bytes)) => {
                object_store::ObjectStoreExt::put(&*self.inner, &key, bytes.into()).await?;
            }
            None => {}
        }
        if !damage {
            return Ok(reply.once(Bytes::from(b)));
        }
        if plan.truncate_bodies {
            b.pop();
        }
        if (plan.flip_bodies || flip_once) && !b.is_empty() {
            let i = b.len() / 3;
            b[i] ^= 0x04;
        }
        if let (Some(z), false) = (flip_random, b.is_empty()) {
            let i = (z % b.len() as u64) as usize;
            b[i] ^= 1 << ((z >> 56) % 8);
        }
        self.injected.fetch_add(1, Ordering::SeqCst);
        Ok(reply.once(Bytes::from(b)))
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let crashed = self.plan().crash_after.is_some_and(|c| self.ops() >= c);
        self.ops.fetch_add(1, Ordering::SeqCst);
        if crashed {
            return futures::stream::once(async { Err(injected("delete", 0)) }).boxed();
        }
        let Some(hook) = self.plan().after_delete else {
            return self.inner.delete_stream(locations);
        };
        if hook.before {
            let locations = locations.then(move |r| hook.clone().fire(r)).boxed();
            return self.inner.delete_stream(locations);
        }
        self.inner
            .delete_stream(locations)
            .then(move |r| hook.clone().fire(r))
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let crashed = self.plan().crash_after.is_some_and(|c| self.ops() >= c);
        self.ops.fetch_add(1, Ordering::SeqCst);
        if crashed {
            return futures::stream::once(async { Err(injected("list", 0)) }).boxed();
        }
        let listing = self.inner.list(prefix);
        let Some(hook) = self.plan().after_list else {
            return listing;
        };
        let p = prefix.map(|p| p.to_string()).unwrap_or_default();
        if !p.starts_with(hook.prefix) || hook.fired.load(Ordering::SeqCst) {
            return listing;
        }
        async move {
            let items: Vec<Result<ObjectMeta>> = listing.collect().await;
            if !hook.fired.swap(true, Ordering::SeqCst) {
                (hook.run)().await;
            }
            futures::stream::iter(items)
        }
        .flatten_stream()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.gate("list_with_delimiter").await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.gate("copy").await?;
        self.inner.copy_opts(from, to, options).await
    }
}

/// Deletes that take `delay` each (a slow or distant backend), counted.
#[derive(Debug)]
pub(crate) struct SlowDeletes {
    pub(crate) inner: Arc<dyn object_store::ObjectStore>,
    pub(crate) delay: Duration,
    pub(crate) started: Arc<std::sync::atomic::AtomicU64>,
}

#[async_trait::async_trait]
impl deltapack_store::wrap::Intercept for SlowDeletes {
    deltapack_store::layer_basics!("SlowDeletes");

    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<
            'static,
            object_store::Result<object_store::path::Path>,
        >,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        use futures::StreamExt;
        let (inner, delay, started) = (self.inner.clone(), self.delay, self.started.clone());
        locations
            .then(move |p| {
                let (inner, started) = (inner.clone(), started.clone());
                async move {
                    started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(delay).await;
                    let p = p?;
                    object_store::ObjectStoreExt::delete(&*inner, &p)
                        .await
                        .map(|()| p)
                }
            })
            .boxed()
    }
}

//! Disk full: a publication that runs out of space fails with a clear
//! `StoreError::Capacity` error, leaves no torn root behind (every root that
//! exists restores exactly, the sweep finds nothing missing or corrupt, the
//! failed context has no root), and the store works again once space is
//! freed (roots deleted, orphans swept).
//!
//! Two variants run:
//!
//! * `real_tmpfs_fills_up` — when running as root, the test mounts small
//!   tmpfs filesystems (3, 4 and 16 MiB by default; unmounted by a drop
//!   guard) and publishes a local `file://` store onto each until the kernel
//!   returns ENOSPC — in the ledger database on the small ones, in an extent
//!   on the larger one. Without root (or when the mount is not permitted,
//!   e.g. in an unprivileged container) it says so and skips.
//! * `injected_enospc` — always: a wrapper `ObjectStore` with a byte budget
//!   whose `put_opts` fails with `io::Error` 28 (ENOSPC) once the budget is
//!   spent, exactly as `object_store` reports a full local disk.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::*;
use deltapack_format::{CacheIdentity, ContextDigest, Snapshot};
use deltapack_store::wrap::{Intercept, Wrapped};
use deltapack_store::{
    keys, MissReason, PublishOutcome, PublishRequest, RestoreOutcome, RootFormat, Store,
    StoreError, SweepOptions,
};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, MultipartUpload, ObjectStore, ObjectStoreExt, PutMultipartOptions, PutOptions,
    PutPayload, PutResult, Result as OsResult,
};

// ------------------------------------------------------------ tmpfs mount

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A mounted tmpfs, unmounted on drop (lazily if still busy).
struct Tmpfs {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Self, String> {
        let parent = tempfile::tempdir().map_err(|e| e.to_string())?;
        let dir = parent.path().join("fs");
        std::fs::create_dir(&dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            dir,
            _parent: parent,
        })
    }

    fn available_bytes(&self) -> u64 {
        Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&self.dir)
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .nth(1)
                    .and_then(|l| l.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

// ------------------------------------------------------- injected ENOSPC

/// Forwards to an in-memory store; `put_opts` fails with ENOSPC (as
/// `object_store` reports it: a `Generic` error whose source is the
/// `io::Error`) once `budget` bytes have been written.
#[derive(Debug)]
struct SmallDisk {
    inner: Arc<dyn ObjectStore>,
    budget: AtomicI64,
    refused: AtomicU64,
}

fn enospc() -> object_store::Error {
    object_store::Error::Generic {
        store: "x",
        source: Box::new(std::io::Error::from_raw_os_error(28)),
    }
}

/// A handle on an in-memory store that refuses writes past `budget` bytes,
/// and the disk (to move its budget).
fn small_disk(budget: i64) -> (Arc<Wrapped<SmallDisk>>, Store) {
    let disk = Arc::new(Wrapped(SmallDisk {
        inner: Arc::new(InMemory::new()),
        budget: AtomicI64::new(budget),
        refused: AtomicU64::new(0),
    }));
    let store = memory_kind(disk.clone(), config());
    (disk, store)
}

#[async_trait::async_trait]
impl Intercept for SmallDisk {
    deltapack_store::layer_basics!("SmallDisk");

    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> OsResult<PutResult> {
        let len = payload.content_length() as i64;
        if self.budget.fetch_sub(len, Ordering::SeqCst) < len {
            self.budget.fetch_add(len, Ordering::SeqCst);
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(enospc());
        }
        let r = self.inner.put_opts(location, payload, opts).await;
        if r.is_err() {
            self.budget.fetch_add(len, Ordering::SeqCst);
        }
        r
    }

    async fn put_multipart_opts(
        &self,
        _location: &Path,
        _opts: PutMultipartOptions,
    ) -> OsResult<Box<dyn MultipartUpload>> {
        Err(enospc())
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> OsResult<()> {
        // A copy allocates space too (quarantine uses copy).
        if self.budget.load(Ordering::SeqCst) <= 0 {
            return Err(enospc());
        }
        self.inner.copy_opts(from, to, options).await
    }
}

// ------------------------------------------------------------- the scenario

/// One published context and the bytes it must restore to.
struct Published {
    conversation: u64,
    snapshot: Arc<Snapshot>,
}

struct Scenario {
    store: Store,
    id: CacheIdentity,
    published: BTreeMap<ContextDigest, Published>,
}

const BASE_TOKENS: u64 = 8192;
const DELTA_TOKENS: u64 = 16384;

impl Scenario {
    fn new(store: Store) -> Self {
        Scenario {
            store,
            id: identity("disk-full"),
            published: BTreeMap::new(),
        }
    }

    /// Publishes conversation `c` (a flat base, then a delta on it) until a
    /// publication fails; returns the error and the request that failed.
    async fn fill(&mut self, max_conversations: u64) -> (StoreError, PublishRequest) {
        for c in 0..max_conversations {
            let format = if c % 3 == 2 {
                RootFormat::V1
            } else {
                RootFormat::V2
            };
            let (a, b) = (turn(c, BASE_TOKENS), turn(c, DELTA_TOKENS));
            let (ca, cb) = (
                ctx(&self.id, c, BASE_TOKENS as usize),
                ctx(&self.id, c, DELTA_TOKENS as usize),
            );
            let reqs = [
                flat(&self.id, ca, &a, format),
                delta(&self.id, cb, &b, ca, &a, format),
            ];
            for req in reqs {
                match self.store.publish(req.clone()).await {
                    Ok(r) => {
                        assert_eq!(r.outcome, PublishOutcome::Created);
                        self.published.insert(
                            req.context,
                            Published {
                                conversation: c,
                                snapshot: req.snapshot.clone(),
                            },
                        );
                    }
                    Err(e) => return (e, req),
                }
            }
        }
        panic!("the store never filled up after {max_conversations} conversations");
    }

    /// Every root present restores exactly; nothing but published contexts
    /// has a root; the sweep finds nothing missing or corrupt.
    async fn check_consistent(&self, failed: Option<&PublishRequest>) {
        let roots = self.store.list_roots(None).await.expect("list roots");
        for (ns, ctx) in &roots {
            assert_eq!(*ns, self.id.namespace());
            let p = self
                .published
                .get(ctx)
                .unwrap_or_else(|| panic!("root {ctx} was never reported published (torn?)"));
            let got = restore_bytes(&self.store, &self.id, *ctx).await;
            assert!(
                got == p.snapshot.encoded(),
                "root {ctx} restored different bytes"
            );
        }
        assert_eq!(
            roots.len(),
            self.published.len(),
            "a reported publication has no root"
        );
        if let Some(req) = failed {
            match self
                .store
                .restore((&self.id, req.context), Default::default())
                .await
                .expect("restore")
            {
                RestoreOutcome::Miss(MissReason::Absent) => {}
                other => panic!("the failed publication left something behind: {other:?}"),
            }
        }
        let report = dry_sweep(&self.store).await;
        assert_nothing_lost(&report);
        assert!(report.invalidated_roots.is_empty());
    }

    /// Frees space the way an operator (or eviction) would: delete the roots
    /// of the oldest `n` conversations, then sweep orphans with no grace.
    async fn free(&mut self, n: u64) -> u64 {
        let victims: Vec<ContextDigest> = self
            .published
            .iter()
            .filter(|(_, p)| p.conversation < n)
            .map(|(c, _)| *c)
            .collect();
        for c in &victims {
            self.store
                .object_store()
                .delete(&keys::root_key(&self.id.namespace(), c))
                .await
                .expect("delete root");
            self.published.remove(c);
        }
        let report = self
            .store
            .sweep(&SweepOptions::default().with_grace(std::time::Duration::ZERO))
            .await
            .expect("sweep after freeing");
        assert!(report.orphans_deleted > 0, "{report:?}");
        report.reclaimed_bytes
    }

    async fn republish(&mut self, req: PublishRequest) {
        let r = self
            .store
            .publish(req.clone())
            .await
            .expect("publication succeeds once space is freed");
        assert_eq!(r.outcome, PublishOutcome::Created);
        self.published.insert(
            req.context,
            Published {
                conversation: u64::MAX,
                snapshot: req.snapshot.clone(),
            },
        );
    }
}

fn assert_capacity(e: &StoreError) {
    match e {
        StoreError::Capacity(kind) => {
            // The device (objects or ledger) filled up, or the free-space
            // floor left nothing evictable: never a budget wait.
            assert!(
                !matches!(kind, deltapack_store::CapacityError::AwaitingGrace { .. }),
                "{kind:?}"
            );
            eprintln!("disk full reported as: {e}");
        }
        other => panic!("expected StoreError::Capacity, got {other:?} ({other})"),
    }
}

fn dir_bytes(p: &FsPath) -> u64 {
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                match e.metadata() {
                    Ok(m) if m.is_dir() => stack.push(e.path()),
                    Ok(m) => total += m.len(),
                    Err(_) => {}
                }
            }
        }
    }
    total
}

/// Sizes of the tmpfs runs (override with `DELTAPACK_DISK_FULL_SIZES`, e.g.
/// `3m,4m,6m,16m,32m`): the space runs out at different writes — the
/// ledger database on the small ones, extents on the larger ones.
fn tmpfs_sizes() -> Vec<String> {
    std::env::var("DELTAPACK_DISK_FULL_SIZES")
        .unwrap_or_else(|_| "3m,4m,16m".into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

#[tokio::test]
async fn real_tmpfs_fills_up() {
    if !running_as_root() {
        eprintln!(
            "not running as root: skipping the tmpfs variant (injected_enospc covers the mapping)"
        );
        return;
    }
    for size in tmpfs_sizes() {
        let fs = match Tmpfs::mount(&size) {
            Ok(fs) => fs,
            Err(e) => {
                eprintln!("{e}: skipping the tmpfs variant (injected_enospc covers the mapping)");
                return;
            }
        };
        let dir = fs.dir.join("store");
        let store = Store::open(&format!("file://{}", dir.display()), config()).expect("open");
        let mut s = Scenario::new(store);
        let (err, failed) = s.fill(400).await;
        assert_capacity(&err);
        eprintln!(
            "{size} tmpfs full after {} publications ({} bytes of files, {} bytes free)",
            s.published.len(),
            dir_bytes(&dir),
            fs.available_bytes()
        );
        assert!(s.published.len() >= 2, "the filesystem filled up too early");
        s.check_consistent(Some(&failed)).await;

        // The store still reads after a reopen (staging leftovers are harmless).
        let reopened = Store::open(&format!("file://{}", dir.display()), config()).expect("reopen");
        s.store = reopened;
        s.check_consistent(Some(&failed)).await;

        let reclaimed = s.free(3).await;
        eprintln!(
            "{size}: freed {reclaimed} bytes by deleting 3 conversations; {} bytes free now",
            fs.available_bytes()
        );
        s.republish(failed).await;
        s.check_consistent(None).await;
        drop(s);
    }
}

#[tokio::test]
async fn injected_enospc() {
    let (disk, store) = small_disk(2 << 20);
    let mut s = Scenario::new(store);
    let (err, failed) = s.fill(200).await;
    assert_capacity(&err);
    assert!(disk.refused.load(Ordering::SeqCst) >= 1);
    eprintln!("injected ENOSPC after {} publications", s.published.len());
    s.check_consistent(Some(&failed)).await;
    // Space comes back (the budget models the bytes deletion frees).
    let reclaimed = s.free(3).await;
    disk.budget.fetch_add(
        i64::try_from(reclaimed).unwrap_or(i64::MAX),
        Ordering::SeqCst,
    );
    s.republish(failed).await;
    s.check_consistent(None).await;
}

#[test]
fn enospc_in_an_error_chain_is_recognised() {
    // The exact shape the brief's fault wrapper returns, and a nested one.
    assert!(deltapack_store::is_storage_full(&enospc()));
    let nested = object_store::Error::Generic {
        store: "LocalFileSystem",
        source: Box::new(std::io::Error::other(std::io::Error::from_raw_os_error(28))),
    };
    assert!(deltapack_store::is_storage_full(&nested));
    let other = object_store::Error::Generic {
        store: "x",
        source: Box::new(std::io::Error::from_raw_os_error(5)),
    };
    assert!(!deltapack_store::is_storage_full(&other));
}

#[tokio::test]
async fn every_failure_point_is_clean() {
    // One v2 and one v1 publication, with the space running out at every
    // write (objects, then the root): each attempt either succeeds or fails
    // with Capacity and leaves no root; after space returns it succeeds.
    let id = identity("disk-full-points");
    let snap = turn(7, 4096);
    let c = ctx(&id, 7, 4096);
    for format in [RootFormat::V2, RootFormat::V1] {
        // Learn the total bytes one publication writes.
        let probe = memory_kind(Arc::new(InMemory::new()), config());
        let total = publish_base(&probe, &id, c, snap.clone(), format)
            .await
            .bytes_written as i64;
        let mut budgets: Vec<i64> = (0..total).step_by(1 + total as usize / 40).collect();
        budgets.extend([total - 1, total]);
        let (mut failed, mut root_failures) = (0, 0);
        for budget in budgets {
            let (disk, store) = small_disk(budget);
            let req = flat(&id, c, &snap, format);
            match store.publish(req.clone()).await {
                Ok(r) => assert_eq!(r.outcome, PublishOutcome::Created),
                Err(e) => {
                    assert_capacity_quiet(&e);
                    failed += 1;
                    if budget == total - 1 {
                        // Every object fit; the root write itself hit ENOSPC.
                        root_failures += 1;
                        let mut l = store.object_store().list(Some(&Path::from("objects")));
                        use futures::StreamExt;
                        assert!(l.next().await.is_some(), "objects were written");
                    }
                    match store
                        .restore((&id, c), Default::default())
                        .await
                        .expect("restore")
                    {
                        RestoreOutcome::Miss(MissReason::Absent) => {}
                        other => panic!("budget {budget}: failed publication left {other:?}"),
                    }
                    disk.budget.fetch_add(total, Ordering::SeqCst);
                    let r = store.publish(req).await.expect("retry after space returns");
                    assert_eq!(r.outcome, PublishOutcome::Created);
                }
            }
            let got = restore_bytes(&store, &id, c).await;
            assert!(got == snap.encoded(), "budget {budget}: wrong bytes");
        }
        assert!(
            failed > 0 && root_failures > 0,
            "{format:?}: {failed} failures, {root_failures} at the root"
        );
    }
}

fn assert_capacity_quiet(e: &StoreError) {
    assert!(
        matches!(e, StoreError::Capacity(_)),
        "expected StoreError::Capacity, got {e:?}"
    );
}

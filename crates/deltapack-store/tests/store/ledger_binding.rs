//! One store, one ledger: a store names the ledger that accounts for it,
//! and a handle with any other ledger may read but never publish or delete.
//!
//! Why: two nodes sharing a bucket with their default ledgers (a SQLite file
//! each) lost acknowledged data. A evicted a root and condemned its objects
//! in A's ledger, B republished the same context reusing those objects (B's
//! ledger knew nothing of A's condemnation), A collected them, and B's
//! acknowledged root restored as a miss. The grace period did not help: it
//! ran from A's eviction, and B's reuse inside it was invisible to A. These
//! tests run against the real S3-compatible server (and local disk), with
//! real SQLite ledger files.

use std::sync::Arc;
use std::time::Duration;

use deltapack_format::Snapshot;
use deltapack_store::{
    MissReason, Ownership, PublishOutcome, RestoreOutcome, RootFormat, Store, StoreConfig,
    StoreError, SweepOptions,
};
use futures::TryStreamExt;
use object_store::ObjectStoreExt;

use crate::common::*;

/// A config whose ledger is the SQLite file `path`.
fn with_sqlite(path: &std::path::Path) -> StoreConfig {
    config().with_ledger(Some(format!("sqlite://{}", path.display())))
}

/// Every key under the store's prefix with its size (what the bucket holds).
async fn listing(s: &Store) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = s
        .object_store()
        .list(None)
        .map_ok(|m| (m.location.to_string(), m.size))
        .try_collect()
        .await
        .expect("list");
    out.sort();
    out
}

/// A store in `dir`, and a fresh S3 prefix when the test server is there.
fn local_and_s3(dir: &tempfile::TempDir) -> Vec<String> {
    let local = format!("file://{}", dir.path().join("store").display());
    std::iter::once(local).chain(s3_url()).collect()
}

fn is_mismatch<T: std::fmt::Debug>(r: &Result<T, StoreError>) -> bool {
    matches!(r, Err(StoreError::LedgerMismatch { .. }))
}

/// Publishes `turns[k]` as a delta on `turns[k - 1]`.
async fn publish_on_previous(
    s: &Store,
    id: &deltapack_format::CacheIdentity,
    turns: &[(deltapack_format::ContextDigest, Arc<Snapshot>)],
    k: usize,
) {
    let ((c, snap), (bc, base)) = (&turns[k], &turns[k - 1]);
    publish_delta(s, id, *c, snap.clone(), *bc, base.clone(), RootFormat::V2).await;
}

async fn publish(
    s: &Store,
    id: &deltapack_format::CacheIdentity,
    c: deltapack_format::ContextDigest,
    snap: &Arc<Snapshot>,
) -> Result<deltapack_store::PublishReceipt, StoreError> {
    s.publish(flat(id, c, snap, RootFormat::V2)).await
}

/// The reproduced loss, as steps in every order: node A (its own SQLite
/// ledger, grace 0) has published context C; then A evicts everything, B
/// (another SQLite ledger) publishes C, B' (a handle of B's node opened
/// with A's ledger, the fix the error names) publishes C, and A collects
/// garbage, in all 24 orders. B is refused with `ledger-mismatch` and
/// writes nothing; whatever order, C restores exactly when the last
/// acknowledged change was a publication, and is never a corrupt miss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ledgers_on_one_bucket_never_lose_an_acknowledged_root() {
    let Some(_) = s3_url() else {
        return;
    };
    let id = identity("two-ledgers");
    let (c, snap) = (ctx(&id, 31, 4096), turn(31, 4096));
    let steps = [
        "a-evicts",
        "b-publishes",
        "b-with-a-ledger-publishes",
        "a-collects",
    ];
    let mut orders = Vec::new();
    permutations(&mut steps.to_vec(), 0, &mut orders);
    assert_eq!(orders.len(), 24);
    for order in orders {
        let url = s3_url().expect("s3");
        let dir = tempfile::tempdir().expect("tmp");
        let (la, lb) = (dir.path().join("a.sqlite3"), dir.path().join("b.sqlite3"));
        let a = Store::open(&url, with_sqlite(&la).with_grace(Duration::ZERO)).expect("A");
        let b = Store::open(&url, with_sqlite(&lb)).expect("B");
        let b_fixed = Store::open(&url, with_sqlite(&la)).expect("B with A's ledger");
        let r = publish(&a, &id, c, &snap).await.expect("A publishes");
        assert_eq!(r.outcome, PublishOutcome::Created);
        // Present: the last acknowledged change leaves C in the store.
        let mut present = true;
        for step in &order {
            match *step {
                "a-evicts" => {
                    let plan = a.evict_plan(0).await.expect("plan");
                    let report = a.execute(plan).await.expect("evict");
                    if !report.roots.is_empty() {
                        present = false;
                    }
                }
                "b-publishes" => {
                    let before = listing(&b).await;
                    let out = publish(&b, &id, c, &snap).await;
                    assert!(is_mismatch(&out), "{order:?}: B published: {out:?}");
                    assert_eq!(listing(&b).await, before, "{order:?}: B wrote");
                }
                "b-with-a-ledger-publishes" => {
                    let r = publish(&b_fixed, &id, c, &snap).await.expect("B'");
                    assert!(
                        matches!(
                            r.outcome,
                            PublishOutcome::Created | PublishOutcome::AlreadyPresent
                        ),
                        "{order:?}: {r:?}"
                    );
                    present = true;
                }
                "a-collects" => {
                    a.collect_garbage().await.expect("A collects");
                }
                _ => unreachable!(),
            }
        }
        a.collect_garbage().await.expect("A collects at the end");
        let reader = Store::open(&url, with_sqlite(&dir.path().join("r.sqlite3"))).expect("R");
        let out = reader
            .restore((&id, c), Default::default())
            .await
            .expect("restore");
        match (present, out) {
            (true, RestoreOutcome::Hit(h)) => {
                assert_eq!(h.snapshot.encoded(), snap.encoded(), "{order:?}")
            }
            (false, RestoreOutcome::Miss(MissReason::Absent)) => {}
            (p, o) => panic!("{order:?}: present {p}, restore {:?}", o.miss()),
        }
        assert_no_damage(&sweep(&a).await, &format!("{order:?}"));
    }
}

fn permutations(v: &mut Vec<&'static str>, k: usize, out: &mut Vec<Vec<&'static str>>) {
    if k == v.len() {
        out.push(v.clone());
        return;
    }
    for i in k..v.len() {
        v.swap(k, i);
        permutations(v, k + 1, out);
        v.swap(k, i);
    }
}

/// A handle whose ledger is not the store's reads normally — restore,
/// `restore_into`, lookup, inspect, a dry-run sweep — and is refused, with
/// nothing changed, for every publication and deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_ledger_reads_and_is_refused_every_change() {
    let dir = tempfile::tempdir().expect("tmp");
    for url in local_and_s3(&dir) {
        let owner = Store::open(&url, config()).expect("owner");
        let id = identity("foreign-reader");
        let (c1, s1) = (ctx(&id, 41, 2048), turn(41, 2048));
        let (c2, s2) = (ctx(&id, 41, 4096), turn(41, 4096));
        publish_base(&owner, &id, c1, s1.clone(), RootFormat::V2).await;
        publish_delta(&owner, &id, c2, s2.clone(), c1, s1.clone(), RootFormat::V2).await;
        assert_eq!(
            owner.ownership().await.expect("ownership"),
            Ownership::Owner
        );

        let other = tempfile::tempdir().expect("tmp");
        let f = Store::open(&url, with_sqlite(&other.path().join("f.sqlite3"))).expect("f");
        assert!(
            matches!(
                f.ownership().await.expect("ownership"),
                Ownership::Foreign { .. }
            ),
            "{url}"
        );
        let before = listing(&owner).await;
        // Reads.
        assert_eq!(restore_bytes(&f, &id, c2).await, s2.encoded(), "{url}");
        let mut buf = vec![0u8; s2.encoded().len()];
        assert_restored_into(&f, (&id, c2), &mut buf, s2.encoded(), &url).await;
        let found = f
            .lookup(&id, &[(2048, c1), (4096, c2)])
            .await
            .expect("lookup");
        assert_eq!(found, Some((4096, c2)), "{url}");
        assert_eq!(f.inspect(None).await.expect("inspect").len(), 2, "{url}");
        let dry = f
            .sweep(&SweepOptions::default().with_dry_run(true))
            .await
            .expect("a dry-run sweep reads");
        assert_no_damage(&dry, &url);
        // Changes.
        let (c3, s3) = (ctx(&id, 42, 2048), turn(42, 2048));
        assert!(
            is_mismatch(&publish(&f, &id, c3, &s3).await),
            "{url}: publish"
        );
        assert!(
            is_mismatch(&f.execute(f.evict_plan(0).await.expect("plan")).await),
            "{url}: evict"
        );
        assert!(
            is_mismatch(&f.execute(f.clear_plan(None).await.expect("plan")).await),
            "{url}: clear"
        );
        assert!(is_mismatch(&f.collect_garbage().await), "{url}: gc");
        let ns = id.namespace();
        assert!(is_mismatch(&f.hold("h", ns, c2).await), "{url}: hold");
        assert!(is_mismatch(&f.release("h", ns, c2).await), "{url}: release");
        assert!(
            is_mismatch(&f.sweep(&SweepOptions::default()).await),
            "{url}: sweep"
        );
        assert!(is_mismatch(&f.migrate(None, false).await), "{url}: migrate");
        let err = publish(&f, &id, c3, &s3).await.expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("ledger mismatch") && text.contains("ledger adopt"),
            "{text}"
        );
        assert_eq!(
            listing(&owner).await,
            before,
            "{url}: a refused handle changed the store"
        );
        // The owner still works.
        publish_base(&owner, &id, c3, s3.clone(), RootFormat::V2).await;
    }
}

/// A node that lost its ledger (state directory deleted) gets a fresh one,
/// which is refused until it adopts the store; after `adopt`, everything
/// stored restores, it publishes and collects, and the old ledger (a copy of
/// the lost file) is refused from then on — even for its deletions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopting_a_store_after_losing_the_ledger_loses_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    for url in local_and_s3(&dir) {
        let state = tempfile::tempdir().expect("state");
        let ledger = state.path().join("ledger.sqlite3");
        let id = identity("adopt");
        let turns: Vec<_> = [2048u64, 4096, 6144]
            .iter()
            .map(|&n| (ctx(&id, 51, n as usize), turn(51, n)))
            .collect();
        {
            let old = Store::open(&url, with_sqlite(&ledger)).expect("old");
            publish_base(&old, &id, turns[0].0, turns[0].1.clone(), RootFormat::V2).await;
            publish_on_previous(&old, &id, &turns, 1).await;
            old.close().await.expect("close");
        }
        // The state directory is lost; a copy of the old ledger survives
        // elsewhere (to show it is refused afterwards).
        let kept = tempfile::tempdir().expect("kept");
        let old_copy = kept.path().join("old.sqlite3");
        std::fs::copy(&ledger, &old_copy).expect("copy the old ledger");
        for f in std::fs::read_dir(state.path()).expect("ls") {
            std::fs::remove_file(f.expect("entry").path()).expect("rm");
        }
        let fresh = Store::open(&url, with_sqlite(&ledger)).expect("fresh");
        let refused = publish(&fresh, &id, turns[2].0, &turns[2].1).await;
        assert!(is_mismatch(&refused), "{url}: {refused:?}");
        let report = fresh.adopt(Duration::ZERO).await.expect("adopt");
        assert!(report.changed, "{url}");
        let previous = report.previous.as_ref().expect("the old binding");
        assert_eq!(previous.generation, 1);
        assert_eq!(report.binding.generation, 2);
        // The rebuild accounts for both roots (the background
        // reconciliation at open may have recorded them first).
        assert_eq!(
            report.merge.added + report.merge.replaced + report.merge.kept,
            2,
            "{url}: {report:?}"
        );
        assert_eq!(
            fresh.ledger_totals().await.expect("totals").roots,
            2,
            "{url}"
        );
        assert_eq!(fresh.ownership().await.expect("own"), Ownership::Owner);
        // Nothing lost, and the new owner publishes and collects.
        assert_restores(&fresh, &id, &turns[..2], &url).await;
        publish_on_previous(&fresh, &id, &turns, 2).await;
        fresh.collect_garbage().await.expect("gc");
        assert_eq!(fresh.ledger_totals().await.expect("totals").roots, 3);
        // The old ledger is refused, though its id is the one it had.
        let stale = Store::open(&url, with_sqlite(&old_copy)).expect("stale");
        assert!(is_mismatch(&stale.collect_garbage().await), "{url}");
        assert!(
            is_mismatch(
                &stale
                    .execute(stale.clear_plan(None).await.expect("plan"))
                    .await
            ),
            "{url}"
        );
        assert_restores(&fresh, &id, &turns, &url).await;
        // Adopting again is a no-op for the binding.
        let again = fresh.adopt(Duration::ZERO).await.expect("adopt again");
        assert!(!again.changed);
        assert_eq!(again.binding.generation, 2);
    }
}

/// An old owner still running when the store is adopted stops deleting at
/// its next check: its collector, in the middle of a store it owned a
/// moment ago, refuses; and the new owner's account keeps every root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_old_owner_stops_deleting_once_the_store_is_adopted() {
    let Some(url) = s3_url() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let old = Store::open(
        &url,
        with_sqlite(&dir.path().join("old.sqlite3")).with_grace(Duration::ZERO),
    )
    .expect("old");
    let id = identity("running-old-owner");
    let (c, s) = (ctx(&id, 61, 4096), turn(61, 4096));
    publish_base(&old, &id, c, s.clone(), RootFormat::V2).await;
    old.collect_garbage().await.expect("the owner collects");
    let new = Store::open(&url, with_sqlite(&dir.path().join("new.sqlite3"))).expect("new");
    new.adopt(Duration::from_millis(50)).await.expect("adopt");
    // The old owner's handle is still open and its ledger still says it
    // bound the store at generation 1: refused all the same.
    assert!(is_mismatch(&old.collect_garbage().await));
    assert!(is_mismatch(
        &old.execute(old.evict_plan(0).await.expect("plan")).await
    ));
    assert!(is_mismatch(&publish(&old, &id, c, &s).await));
    assert_eq!(restore_bytes(&new, &id, c).await, s.encoded());
}

/// The binding is a real object in the store: created by the first
/// publication (generation 1, this ledger's id), never by a read; a binding
/// that does not decode is refused for changes (reads still work) until an
/// adoption replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binding_is_written_by_the_first_write_and_checked_strictly() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = dir.path().join("store");
    let url = format!("file://{}", root.display());
    let binding = root.join("ledger").join("binding.json");
    let s = Store::open(&url, config()).expect("store");
    let id = identity("binding-object");
    let (c, snap) = (ctx(&id, 71, 2048), turn(71, 2048));
    let _ = s
        .restore((&id, c), Default::default())
        .await
        .expect("restore");
    assert_eq!(s.ownership().await.expect("own"), Ownership::Unbound);
    assert!(!binding.exists(), "a read bound the store");
    publish_base(&s, &id, c, snap.clone(), RootFormat::V2).await;
    let text = std::fs::read_to_string(&binding).expect("binding written");
    let parsed = deltapack_format::LedgerBinding::decode(text.as_bytes()).expect("decodes");
    assert_eq!(parsed.generation, 1);
    assert_eq!(parsed.engine, "sqlite");
    let status = s.binding_status().await.expect("status");
    assert_eq!(status.this_ledger.ledger_id, parsed.ledger_id.hex());
    assert_eq!(status.ownership, Ownership::Owner);
    // Damaged binding: changes refused, reads fine.
    std::fs::write(&binding, b"{\"format\": \"garbage\"").expect("damage");
    let (c2, s2) = (ctx(&id, 72, 2048), turn(72, 2048));
    let refused = publish(&s, &id, c2, &s2).await;
    assert!(is_mismatch(&refused), "{refused:?}");
    assert!(refused
        .expect_err("refused")
        .to_string()
        .contains("unreadable"));
    assert_eq!(restore_bytes(&s, &id, c).await, snap.encoded());
    let report = s
        .adopt(Duration::ZERO)
        .await
        .expect("adopt over a damaged binding");
    assert!(report.changed);
    assert!(report.previous.is_none());
    publish_base(&s, &id, c2, s2, RootFormat::V2).await;
}

/// What the store holds at the binding's key.
async fn binding_bytes(s: &Store) -> bytes::Bytes {
    let key = object_store::path::Path::from("ledger/binding.json");
    let got = s.object_store().get(&key).await.expect("binding");
    got.bytes().await.expect("bytes")
}

/// `ledger adopt` replaces whatever the store holds at the binding's key —
/// an oversized object (5,002 bytes: it used to answer "concurrent
/// change" on every attempt, because the oversized object was never read
/// and the replacement was conditional on empty bytes), a truncated
/// binding, garbage — conditional on the exact bytes it read, and reports
/// what was there; publication works afterwards and nothing published
/// before is lost. One larger than an adoption reads (1 MiB) is refused
/// with a clear error and left in place. Local disk and the S3 server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_replaces_an_oversized_truncated_or_garbage_binding() {
    let dir = tempfile::tempdir().expect("tmp");
    for url in local_and_s3(&dir) {
        let ledger = dir.path().join(format!("l-{}.sqlite3", url.len()));
        let s = Store::open(&url, with_sqlite(&ledger)).expect("store");
        let id = identity("adopt-damaged-binding");
        let (c, snap) = (ctx(&id, 81, 2048), turn(81, 2048));
        publish_base(&s, &id, c, snap.clone(), RootFormat::V2).await;
        let key = object_store::path::Path::from("ledger/binding.json");
        let good = binding_bytes(&s).await;
        let mut oversized = good.to_vec();
        oversized.resize(5_002, b' ');
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("oversized", oversized),
            ("truncated", good[..good.len() / 2].to_vec()),
            ("garbage", b"\x00\xffnot json at all".to_vec()),
            ("empty", Vec::new()),
        ];
        for (k, (name, bytes)) in cases.into_iter().enumerate() {
            let size = bytes.len();
            s.object_store()
                .put(&key, bytes.into())
                .await
                .expect("damage the binding");
            let (ck, sk) = (ctx(&id, 90 + k as u64, 2048), turn(90 + k as u64, 2048));
            let refused = publish(&s, &id, ck, &sk).await;
            assert!(is_mismatch(&refused), "{url} {name}: {refused:?}");
            let report = s
                .adopt(Duration::ZERO)
                .await
                .unwrap_or_else(|e| panic!("{url}: adopt over a {name} binding: {e}"));
            assert!(report.changed, "{url} {name}");
            let what = report.replaced_unreadable.expect("reported");
            assert!(
                what.starts_with(&format!("{size} bytes")),
                "{url} {name}: {what}"
            );
            assert_eq!(s.ownership().await.expect("own"), Ownership::Owner);
            let r = publish(&s, &id, ck, &sk)
                .await
                .expect("publish after adopt");
            assert_eq!(r.outcome, PublishOutcome::Created, "{url} {name}");
            assert_eq!(
                restore_bytes(&s, &id, c).await,
                snap.encoded(),
                "{url} {name}"
            );
        }
        // Over 1 MiB: not read, so not replaced; a clear error.
        let huge = vec![b'x'; (1 << 20) + 1];
        s.object_store()
            .put(&key, huge.clone().into())
            .await
            .expect("huge binding");
        let e = s.adopt(Duration::ZERO).await.expect_err("too large");
        assert!(e.to_string().contains("remove it by hand"), "{url}: {e}");
        let still = binding_bytes(&s).await;
        assert_eq!(still.len(), huge.len(), "{url}: left in place");
    }
}

/// The sweep re-checks ownership while it reclaims orphans: a store
/// adopted in the middle of a long reclaim (deletes of 250 ms each) stops
/// the old owner's sweep within a second, so the adoption's fence covers
/// it and nothing the new owner publishes afterwards — reusing the very
/// objects the old sweep was deleting — is lost. Before, the sweep checked
/// once, before the reclaim, and went on deleting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adoption_stops_a_running_sweep_within_a_second() {
    let Some(url) = s3_url() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let raw = raw_backend(&url);
    let started = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let slow = deltapack_store::wrap::Wrapped::arc(crate::common::faults::SlowDeletes {
        inner: raw.store.clone(),
        delay: Duration::from_millis(250),
        started: started.clone(),
    });
    let old_cfg = with_sqlite(&dir.path().join("old.sqlite3")).with_grace(Duration::ZERO);
    let old = through(&raw, slow, old_cfg);
    let id = identity("sweep-fence");
    // Twelve roots, then their root objects removed behind the ledger's
    // back: their objects are orphans for the old owner's sweep.
    let turns: Vec<_> = (0..12u64)
        .map(|k| (ctx(&id, 200 + k, 1024), turn(200 + k, 1024)))
        .collect();
    for (c, s) in &turns {
        publish_base(&old, &id, *c, s.clone(), RootFormat::V2).await;
    }
    for (c, _) in &turns {
        let key = deltapack_store::keys::root_key(&id.namespace(), c);
        raw.store.delete(&key).await.expect("remove root");
    }
    let sweeping = {
        let old = old.clone();
        tokio::spawn(async move {
            // Default options: no grace for orphans.
            old.sweep(&SweepOptions::default()).await
        })
    };
    // Adopt once the reclaim is under way, with a fence a little longer
    // than the sweep's re-check period plus one delete.
    while started.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let new = Store::open(&url, with_sqlite(&dir.path().join("new.sqlite3"))).expect("new");
    new.adopt(Duration::from_millis(1600)).await.expect("adopt");
    // The new owner publishes every context again (reusing whatever
    // objects are still there).
    for (c, s) in &turns {
        publish_base(&new, &id, *c, s.clone(), RootFormat::V2).await;
    }
    let swept = sweeping.await.expect("sweep task");
    assert!(
        is_mismatch(&swept),
        "the old sweep was not stopped: {swept:?}"
    );
    assert!(
        started.load(std::sync::atomic::Ordering::SeqCst) < 12 * 3,
        "the old sweep deleted on"
    );
    for (c, s) in &turns {
        assert_eq!(restore_bytes(&new, &id, *c).await, s.encoded());
    }
}

//! The read path survives the ledger: with the metadata engine stopped,
//! hanging or unreadable, lookup answers from the store (roots are found by
//! name), restore hits, and publication fails closed with
//! `LedgerUnavailable`; when the ledger comes back the same handle uses it
//! again.
//!
//! Why: a placement layer asks `lookup` before it restores. With the fleet's
//! PostgreSQL stopped, `deltapack lookup` failed (`Connection refused`) while
//! every root and object was still in the bucket and restore itself worked:
//! the whole fleet's cache was unusable because of its accounting database.
//! Real components: moto, a PostgreSQL cluster this test stops and starts
//! (`pg_ctl`, the third cluster `.ci/run` starts), a PostgreSQL table lock
//! held by a second connection, a SQLite file overwritten with garbage.

use std::sync::Arc;
use std::time::Duration;

use deltapack_format::{CacheIdentity, ContextDigest, ContextHasher, Snapshot};
use deltapack_store::{
    Lookup, LookupSource, RestoreIntoOutcome, RootFormat, Store, StoreConfig, StoreError,
};

use crate::common::*;

/// The whole test under one bound: nothing here may hang.
const LIMIT: Duration = Duration::from_secs(180);

/// A conversation of three turns (2,048, 4,096 and 6,144 tokens).
struct Conversation {
    id: CacheIdentity,
    turns: Vec<(ContextDigest, Arc<Snapshot>)>,
    /// Every 256-token boundary of an 8,192-token request extending it.
    candidates: Vec<(u64, ContextDigest)>,
}

fn conversation(salt: &str) -> Conversation {
    let id = identity(salt);
    let turns = [2048u64, 4096, 6144]
        .iter()
        .map(|&n| (ctx(&id, 93, n as usize), turn(93, n)))
        .collect();
    let hasher = ContextHasher::new(id.namespace(), id.chunk_tokens).expect("hasher");
    let candidates = hasher.boundaries(&deltapack_format::synth::tokens(93, 8192));
    Conversation {
        id,
        turns,
        candidates,
    }
}

async fn publish_all(s: &Store, c: &Conversation) {
    publish_base(s, &c.id, c.turns[0].0, c.turns[0].1.clone(), RootFormat::V2).await;
    for i in 1..c.turns.len() {
        let (ctx, snap) = c.turns[i].clone();
        let (bctx, base) = c.turns[i - 1].clone();
        publish_delta(s, &c.id, ctx, snap, bctx, base, RootFormat::V2).await;
    }
}

/// Publishes `c` and looks it up while the ledger is up: the ledger
/// answers.
async fn publish_and_look_up(s: &Store, c: &Conversation) -> Lookup {
    publish_all(s, c).await;
    let before = s
        .lookup_detailed(&c.id, &c.candidates)
        .await
        .expect("lookup");
    assert_eq!(before.source, LookupSource::Ledger);
    before
}

/// Restore and `restore_into` of the last turn both hit.
async fn reads_hit(s: &Store, c: &Conversation) {
    let (ctx, snap) = c.turns.last().expect("turn").clone();
    assert_eq!(restore_bytes(s, &c.id, ctx).await, snap.encoded());
    let mut buf = vec![0u8; snap.encoded().len()];
    let out = s
        .restore_into((&c.id, ctx), &mut buf, Default::default())
        .await
        .expect("restore_into");
    assert!(matches!(out, RestoreIntoOutcome::Hit { .. }));
    assert_eq!(buf, snap.encoded());
}

/// A flat publication fails closed with `LedgerUnavailable`.
async fn publication_is_refused(
    s: &Store,
    id: &CacheIdentity,
    context: ContextDigest,
    snapshot: Arc<Snapshot>,
) {
    let refused = s
        .publish(deltapack_store::PublishRequest {
            identity: id.clone(),
            context,
            snapshot,
            base: None,
            format: RootFormat::V2,
        })
        .await;
    assert!(
        matches!(refused, Err(StoreError::LedgerUnavailable(_))),
        "{refused:?}"
    );
}

fn pg_ctl(action: &str) {
    let data = std::env::var("DELTAPACK_TEST_PG_RESTARTABLE_DATA")
        .expect("DELTAPACK_TEST_PG_RESTARTABLE_DATA is needed");
    crate::common::pg_ctl(&data, action, "fast", "down-log");
}

fn restartable() -> Option<String> {
    match std::env::var("DELTAPACK_TEST_POSTGRES_RESTARTABLE") {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            assert!(
                std::env::var("CI").is_err(),
                "CI must start the restartable PostgreSQL cluster (.ci/run)"
            );
            None
        }
    }
}

/// PostgreSQL stopped under a running store: lookup answers from the store
/// with the boundary the ledger gave before the stop, restore hits,
/// publication is `LedgerUnavailable`; PostgreSQL started again: the same
/// handle's next lookup answers from the ledger, and it publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_under_a_running_store() {
    let (Some(url), Some(pg)) = (s3_url(), restartable()) else {
        return;
    };
    // A schema of its own in the restartable cluster's database (a ledger
    // serves one store, and this database outlives the test).
    let schema = format!("t_{}", std::process::id());
    let pg = {
        let base = pg.clone();
        let name = schema.clone();
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&base, postgres::NoTls).expect("connect");
            c.batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"
            ))
            .expect("schema");
        })
        .join()
        .expect("schema");
        format!("{pg}?options=-c%20search_path%3D{schema}")
    };
    tokio::time::timeout(LIMIT, async {
        let s = Store::open(&url, config().with_ledger(Some(pg))).expect("store");
        let c = conversation("ledger-stopped");
        let before = publish_and_look_up(&s, &c).await;
        assert_eq!(before.found.map(|f| f.0), Some(6144));

        pg_ctl("stop");
        let down = s.lookup_detailed(&c.id, &c.candidates).await;
        let restarted_ok = {
            let down = down.expect("lookup with the ledger down");
            assert_eq!(down.source, LookupSource::Store);
            assert_eq!(
                down.found, before.found,
                "the store answers what the ledger did"
            );
            assert!(s.stats().ledger_fallbacks >= 1);
            reads_hit(&s, &c).await;
            let (nctx, nsnap) = (ctx(&c.id, 94, 2048), turn(94, 2048));
            publication_is_refused(&s, &c.id, nctx, nsnap.clone()).await;
            (nctx, nsnap)
        };
        pg_ctl("start");
        // A failed ledger is left alone for LEDGER_RETRY, then asked again.
        tokio::time::sleep(deltapack_store::LEDGER_RETRY).await;
        let back = s
            .lookup_detailed(&c.id, &c.candidates)
            .await
            .expect("lookup");
        assert_eq!(
            back.source,
            LookupSource::Ledger,
            "the ledger is used again"
        );
        assert_eq!(back.found, before.found);
        let (nctx, nsnap) = restarted_ok;
        publish_base(&s, &c.id, nctx, nsnap.clone(), RootFormat::V2).await;
        assert_eq!(restore_bytes(&s, &c.id, nctx).await, nsnap.encoded());
    })
    .await
    .expect("the test hung");
}

/// A ledger whose queries hang (another connection holds an exclusive lock
/// on the roots table): the lookup answers from the store after the
/// deadline, and nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_holds_its_lock_cannot_stall_a_lookup() {
    let (Some(url), Some(pg)) = (s3_url(), postgres_ledger_url()) else {
        return;
    };
    tokio::time::timeout(LIMIT, async {
        let cfg = config()
            .with_ledger(Some(pg.clone()))
            .with_ledger_deadline(Duration::from_millis(200));
        let s = Store::open(&url, cfg).expect("store");
        let c = conversation("ledger-locked");
        let before = publish_and_look_up(&s, &c).await;
        // Another session takes the roots table and keeps it.
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let mut client = postgres::Client::connect(&pg, postgres::NoTls).expect("connect");
            let mut tx = client.transaction().expect("begin");
            tx.batch_execute("LOCK TABLE roots IN ACCESS EXCLUSIVE MODE")
                .expect("lock");
            locked_tx.send(()).expect("signal");
            let _ = release_rx.recv_timeout(Duration::from_secs(120));
            tx.rollback().expect("release");
        });
        locked_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the lock was taken");
        let start = std::time::Instant::now();
        let during = s
            .lookup_detailed(&c.id, &c.candidates)
            .await
            .expect("lookup");
        let took = start.elapsed();
        assert_eq!(during.source, LookupSource::Store);
        assert_eq!(during.found, before.found);
        // Not a timing assertion of performance: a hang would be minutes
        // (the statement timeout); this bounds it far above any machine.
        assert!(took < Duration::from_secs(30), "the lookup waited {took:?}");
        reads_hit(&s, &c).await;
        release_tx.send(()).expect("release");
        holder.join().expect("holder");
    })
    .await
    .expect("the test hung");
}

/// A SQLite ledger that cannot be read (its file overwritten with garbage):
/// a fresh handle looks up from the store and restores; publication fails
/// closed as `LedgerUnavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_sqlite_ledger_leaves_reads_working() {
    let dir = tempfile::tempdir().expect("tmp");
    let url = format!("file://{}", dir.path().join("store").display());
    let ledger = dir.path().join("ledger.sqlite3");
    let cfg: StoreConfig = config().with_ledger(Some(format!("sqlite://{}", ledger.display())));
    let c = conversation("ledger-unreadable");
    {
        let s = Store::open(&url, cfg.clone()).expect("store");
        publish_all(&s, &c).await;
        s.close().await.expect("close");
    }
    // A new file of garbage in its place (renamed over it, so a connection
    // still open somewhere keeps the old inode), and no WAL or shared
    // memory file beside it.
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, vec![0x5a; 8192]).expect("garbage");
    std::fs::rename(&garbage, &ledger).expect("replace the ledger");
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", ledger.display()));
    }
    let s = Store::open(&url, cfg).expect("store");
    let answer = s
        .lookup_detailed(&c.id, &c.candidates)
        .await
        .expect("lookup");
    assert_eq!(answer.source, LookupSource::Store);
    assert_eq!(answer.found.map(|f| f.0), Some(6144));
    reads_hit(&s, &c).await;
    // The hits' accesses could not be written: dropped and counted, once
    // the background write gave up (close waits for it).
    let _ = s.close().await;
    assert!(s.stats().touches_dropped >= 1, "{:?}", s.stats());
    publication_is_refused(&s, &c.id, ctx(&c.id, 95, 2048), turn(95, 2048)).await;
}

/// The store's answer is the ledger's answer, also when the longest
/// candidates are absent and a shorter one is present, and when none is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_answers_what_the_ledger_would() {
    let t = local(config());
    let c = conversation("ledger-agrees");
    publish_all(&t.store, &c).await;
    let ledger = t
        .store
        .lookup_detailed(&c.id, &c.candidates)
        .await
        .expect("lookup");
    assert_eq!(ledger.source, LookupSource::Ledger);
    // A handle whose ledger cannot even be created (its directory would be
    // under a file): every answer comes from the store.
    let url = format!("file://{}", t._dir.as_ref().expect("dir").path().display());
    let impatient = Store::open(
        &url,
        config().with_ledger(Some("sqlite:///dev/null/ledger.sqlite3".into())),
    )
    .expect("s");
    let store = impatient
        .lookup_detailed(&c.id, &c.candidates)
        .await
        .expect("lookup");
    assert_eq!(store.source, LookupSource::Store);
    assert_eq!(store.found, ledger.found);
    // Only the first turn's boundary among the candidates.
    let up_to = |limit: u64| -> Vec<_> {
        c.candidates
            .iter()
            .filter(|x| x.0 <= limit)
            .copied()
            .collect()
    };
    let a = impatient.lookup_detailed(&c.id, &up_to(3072)).await;
    assert_eq!(a.expect("lookup").found.map(|f| f.0), Some(2048));
    let b = impatient.lookup_detailed(&c.id, &up_to(2047)).await;
    assert_eq!(b.expect("lookup").found, None);
}

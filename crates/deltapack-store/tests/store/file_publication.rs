//! Publishing from a file (`Store::publish_file`): the file is read with
//! `pread`, never mapped, and the root's digest comes from the bytes its
//! objects hold. Guards that it records what a publication from memory
//! records, that it decides on an existing root by that root's own digest
//! definition (a v1 root of the same bytes is `already-present`, not a
//! conflict: the CLI's kill -9 campaign found that one), and that a file
//! changed after it was opened — shorter, or rewritten in place — is
//! `InputChanged` with no root, on local disk and the S3 test server.
//! The same for a turn's tail read from a file
//! (`Store::publish_turn_file`).

use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;

use deltapack_store::{
    PublishOutcome, RestoreOutcome, RootFormat, SnapshotFile, StoreError, TailFile, TurnRequest,
};

use crate::common::*;

fn write_file(dir: &std::path::Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write");
    p
}

async fn absent(
    store: &deltapack_store::Store,
    id: &deltapack_format::CacheIdentity,
    c: deltapack_format::ContextDigest,
) {
    match store
        .restore((id, c), Default::default())
        .await
        .expect("restore")
    {
        RestoreOutcome::Miss(m) => assert_eq!(m.label(), "absent", "{m}"),
        RestoreOutcome::Hit(_) => panic!("a root was created"),
    }
}

async fn a_file_publishes_as_memory_does(kind: Scratch) {
    let Some(t) = kind.store(config()) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let id = identity(&format!("file-publication-{kind:?}"));
    let snap = turn(71, 4096);
    let path = write_file(dir.path(), "s.snap", snap.encoded());
    let (c_file, c_mem) = (ctx(&id, 71, 4096), ctx(&id, 72, 4096));

    let file = Arc::new(SnapshotFile::open(&path).expect("open"));
    assert_eq!(file.boundary(), 4096);
    let r = t
        .store
        .publish_file(&id, c_file, file.clone(), &|_, _| {})
        .await
        .expect("publish_file");
    assert_eq!(r.outcome, PublishOutcome::Created);
    assert_eq!(
        r.snapshot_digest,
        v2_digest(&snap),
        "the digest a memory publication records"
    );
    assert!(r.turn.is_some(), "a handle for the next turn");
    let m = publish_base(&t.store, &id, c_mem, snap.clone(), RootFormat::V2).await;
    assert_eq!(m.snapshot_digest, r.snapshot_digest);
    assert_eq!(m.objects_written, 0, "the same objects: {m:?}");
    assert_restores(
        &t.store,
        &id,
        &[(c_file, snap.clone())],
        &format!("{kind:?}"),
    )
    .await;
    // Again: already present.
    let again = t
        .store
        .publish_file(&id, c_file, file, &|_, _| {})
        .await
        .expect("again");
    assert_eq!(again.outcome, PublishOutcome::AlreadyPresent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_publishes_as_memory_does_local() {
    a_file_publishes_as_memory_does(Scratch::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_publishes_as_memory_does_s3() {
    a_file_publishes_as_memory_does(Scratch::S3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_root_of_the_other_digest_definition_is_the_same_snapshot() {
    let t = local(config());
    let dir = tempfile::tempdir().expect("tmp");
    let id = identity("file-publication-v1");
    let snap = turn(73, 2048);
    let c = ctx(&id, 73, 2048);
    // A v1 root records `blake3:` of the encoding.
    publish_base(&t.store, &id, c, snap.clone(), RootFormat::V1).await;
    let path = write_file(dir.path(), "s.snap", snap.encoded());
    let file = Arc::new(SnapshotFile::open(&path).expect("open"));
    let r = t
        .store
        .publish_file(&id, c, file, &|_, _| {})
        .await
        .expect("publish_file");
    assert_eq!(r.outcome, PublishOutcome::AlreadyPresent, "{r:?}");
    // Another snapshot at that context is a conflict.
    let other = turn(74, 2048);
    let path = write_file(dir.path(), "o.snap", other.encoded());
    let file = Arc::new(SnapshotFile::open(&path).expect("open"));
    let r = t
        .store
        .publish_file(&id, c, file, &|_, _| {})
        .await
        .expect("publish_file");
    assert_eq!(r.outcome, PublishOutcome::Conflict);
}

async fn a_changed_file_is_input_changed_with_no_root(kind: Scratch) {
    let Some(t) = kind.store(config()) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let id = identity(&format!("file-publication-changed-{kind:?}"));
    let snap = turn(75, 4096);
    let len = snap.encoded().len();

    // Shorter than when it was opened: a clean error, not SIGBUS.
    let path = write_file(dir.path(), "short.snap", snap.encoded());
    let file = Arc::new(SnapshotFile::open(&path).expect("open"));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(len as u64 / 2)
        .expect("truncate");
    let c = ctx(&id, 75, 4096);
    match t.store.publish_file(&id, c, file, &|_, _| {}).await {
        Err(StoreError::InputChanged(m)) => assert!(m.contains("shorter"), "{m}"),
        other => panic!("{kind:?}: want InputChanged, got {other:?}"),
    }
    absent(&t.store, &id, c).await;

    // Rewritten in place, same size: refused by the file's stamp.
    let path = write_file(dir.path(), "rewritten.snap", snap.encoded());
    let file = Arc::new(SnapshotFile::open(&path).expect("open"));
    // Make sure the change time moves even on a coarse clock.
    std::thread::sleep(std::time::Duration::from_millis(20));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.seek(SeekFrom::Start(len as u64 - 100)).expect("seek");
        f.write_all(&[0x5A; 100]).expect("rewrite");
        f.sync_all().expect("sync");
    }
    let c = ctx(&id, 76, 4096);
    match t.store.publish_file(&id, c, file, &|_, _| {}).await {
        Err(StoreError::InputChanged(m)) => assert!(m.contains("modified"), "{m}"),
        other => panic!("{kind:?}: want InputChanged, got {other:?}"),
    }
    absent(&t.store, &id, c).await;
    // Nothing it left behind is damaged.
    assert_no_damage(&sweep(&t.store).await, &format!("{kind:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_is_input_changed_with_no_root_local() {
    a_changed_file_is_input_changed_with_no_root(Scratch::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_is_input_changed_with_no_root_s3() {
    a_changed_file_is_input_changed_with_no_root(Scratch::S3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_not_a_snapshot_is_refused_at_open() {
    let dir = tempfile::tempdir().expect("tmp");
    let snap = turn(77, 1024);
    let mut longer = snap.encoded().to_vec();
    longer.push(0);
    for (name, bytes) in [
        ("empty", Vec::new()),
        ("garbage", vec![7u8; 4096]),
        ("longer", longer),
        (
            "shorter",
            snap.encoded()[..snap.encoded().len() - 1].to_vec(),
        ),
    ] {
        let path = write_file(dir.path(), name, &bytes);
        assert!(SnapshotFile::open(&path).is_err(), "{name} opened");
    }
    assert!(
        SnapshotFile::open(dir.path()).is_err(),
        "a directory opened"
    );
}

/// A turn's tail read from a file records what the same tail from memory
/// records (the same digest and objects, restoring the next snapshot); a
/// tail file shorter, or rewritten, after it was opened is `InputChanged`
/// with no root, and an intact one still publishes afterwards.
async fn a_tail_file_publishes_as_memory_does(kind: Scratch) {
    let Some(t) = kind.store(config()) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let id = identity(&format!("tail-file-{kind:?}"));
    let (base, next) = (turn(81, 4096), turn(81, 4608));
    let b = publish_base(&t.store, &id, ctx(&id, 81, 4096), base, RootFormat::V2).await;
    let prev = b.turn.expect("turn");
    let tail = prev.tail_of(&next).expect("tail");
    let (c_file, c_mem) = (ctx(&id, 81, 4608), ctx(&id, 82, 4608));

    // Shorter than when it was opened: a clean error, no root.
    let path = write_file(dir.path(), "short.tail", &tail);
    let file = Arc::new(TailFile::open(&path).expect("open"));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(tail.len() as u64 - 1)
        .expect("truncate");
    match t
        .store
        .publish_turn_file(&prev, id.clone(), c_file, 4608, file)
        .await
    {
        Err(StoreError::InputChanged(m)) => assert!(m.contains("shorter"), "{m}"),
        other => panic!("{kind:?}: want InputChanged, got {other:?}"),
    }
    absent(&t.store, &id, c_file).await;

    // Rewritten in place, same length: refused by the file's stamp.
    let path = write_file(dir.path(), "rewritten.tail", &tail);
    let file = Arc::new(TailFile::open(&path).expect("open"));
    std::thread::sleep(std::time::Duration::from_millis(20));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.write_all(&[0x5A; 64]).expect("rewrite");
        f.sync_all().expect("sync");
    }
    match t
        .store
        .publish_turn_file(&prev, id.clone(), c_file, 4608, file)
        .await
    {
        Err(StoreError::InputChanged(m)) => assert!(m.contains("modified"), "{m}"),
        other => panic!("{kind:?}: want InputChanged, got {other:?}"),
    }
    absent(&t.store, &id, c_file).await;

    // Intact: created, and the same as from memory.
    let path = write_file(dir.path(), "ok.tail", &tail);
    let file = Arc::new(TailFile::open(&path).expect("open"));
    assert_eq!(file.len(), tail.len() as u64);
    let r = t
        .store
        .publish_turn_file(&prev, id.clone(), c_file, 4608, file)
        .await
        .expect("publish_turn_file");
    assert_eq!(r.outcome, PublishOutcome::Created, "{r:?}");
    assert!(r.turn.is_some(), "a handle for the turn after");
    let m = t
        .store
        .publish_turn(
            &prev,
            TurnRequest {
                identity: id.clone(),
                context: c_mem,
                boundary: 4608,
                tail,
            },
        )
        .await
        .expect("publish_turn");
    assert_eq!(m.snapshot_digest, r.snapshot_digest);
    assert_eq!(m.objects_written, 0, "the same objects: {m:?}");
    assert_restores(&t.store, &id, &[(c_file, next)], &format!("{kind:?}")).await;
    assert_no_damage(&sweep(&t.store).await, &format!("{kind:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_file_publishes_as_memory_does_local() {
    a_tail_file_publishes_as_memory_does(Scratch::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_file_publishes_as_memory_does_s3() {
    a_tail_file_publishes_as_memory_does(Scratch::S3).await;
}

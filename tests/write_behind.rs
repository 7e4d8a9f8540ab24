//! Write-behind publication: read-your-writes while the queue is full. A
//! context published with `publish_async` restores exactly at every moment —
//! from the buffer before its root is durable, from the store after — the
//! bounded queue never drops work (a full queue publishes inline, counted),
//! and shutdown flushes everything to the store.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::faults::{FaultPlan, Faulty};
use common::*;
use deltapack::store::{Backend, PublishRequest, RestoreOutcome, RootFormat, WriteBehind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_your_writes_under_a_full_queue() {
    let dir = tempfile::tempdir().expect("tmp");
    let inner = raw_backend(&format!("file://{}", dir.path().display()));
    // 20 ms per storage operation: the single writer falls behind.
    let slow = Arc::new(Faulty::new(
        inner.store.clone(),
        FaultPlan {
            latency: Duration::from_millis(20),
            ..Default::default()
        },
    ));
    let store = wrapped(
        Backend {
            store: slow,
            kind: deltapack::store::BackendKind::Memory,
        },
        config(),
    );
    let wb = WriteBehind::new(store.clone(), 1, 1);
    let id = identity("write-behind");
    let n = 8u64;
    for i in 0..n {
        let snap = turn(90 + i, 2048);
        let c = ctx(&id, 90 + i, 2048);
        wb.publish_async(PublishRequest {
            identity: id.clone(),
            context: c,
            snapshot: snap.clone(),
            base: None,
            format: RootFormat::V2,
        })
        .await
        .expect("publish_async");
        // Immediately readable, whether buffered or already durable.
        match wb.restore(&id, c).await.expect("restore") {
            RestoreOutcome::Hit(h) => {
                assert_eq!(h.snapshot.encoded(), snap.encoded(), "context {i}")
            }
            RestoreOutcome::Miss(m) => {
                panic!("context {i} not readable right after publish_async: {m}")
            }
        }
    }
    let mid = wb.report();
    assert!(mid.inline > 0, "a full queue publishes inline: {mid:?}");
    assert!(
        mid.served_from_buffer > 0,
        "some restores were served from the buffer: {mid:?}"
    );
    let report = wb.shutdown().await.expect("shutdown flushes");
    assert_eq!(report.accepted, n);
    assert_eq!(report.written, n, "every publication completed: {report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    // Everything is durable in the store itself.
    let plain = wrapped(inner, config());
    for i in 0..n {
        assert_eq!(
            restore_bytes(&plain, &id, ctx(&id, 90 + i, 2048)).await,
            turn(90 + i, 2048).encoded()
        );
    }
}

//! A node's first restore through an empty tier costs about one download
//! of the root, not two: the objects the restore verified are written into
//! the tier as it goes, and the fill that follows downloads only what the
//! restore did not keep. Measured on the wire: the S3 test server behind a
//! TCP proxy that counts the bytes it carries to the client.
//!
//! Why: egress is what a fleet pays for, per node, per first restore.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use crate::tier_trust::bounded;
use crate::tiers::{open_tiered, tier_config, tier_stats, Site};
use deltapack_format::{CacheIdentity, ContextDigest, Snapshot};
use deltapack_store::{LayerOrder, RestoreOptions, RootFormat, Store, StoreConfig};
use deltapack_testkit::FaultProxy;

/// Extents large enough that HTTP headers are a small part of the bytes.
const EXTENT: u64 = 32 * 1024;

fn egress_config() -> StoreConfig {
    StoreConfig::default().with_max_extent_bytes(EXTENT)
}

/// The S3 test server's address, from its endpoint URL.
fn server_addr(endpoint: &str) -> SocketAddr {
    let hostport = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    hostport.parse().expect("the test endpoint is ip:port")
}

/// A 262,144-token snapshot published flat in `site`'s origin (by another
/// node): its context, the snapshot, and what the root costs to download
/// (its objects' stored bytes, and its own).
async fn published(
    site: &Site,
    id: &CacheIdentity,
    seed: u64,
) -> (ContextDigest, Arc<Snapshot>, u64, u64) {
    let (c, s) = (ctx(id, seed, 262144), turn(seed, 262144));
    let plain = Store::open(&site.origin, egress_config()).expect("origin");
    plain
        .publish(flat(id, c, &s, RootFormat::V2))
        .await
        .expect("publish");
    let roots = plain.inspect(Some(&id.namespace())).await.expect("inspect");
    assert_eq!(roots.len(), 1, "{roots:?}");
    (c, s, roots[0].stored_bytes, roots[0].root_bytes)
}

/// Fails unless `down` bytes on the wire are at most 1.05 × one download
/// of `objects` and `roots` stored bytes.
fn assert_about_one_download(down: u64, objects: u64, roots: u64, what: &str) {
    let ratio = down as f64 / (objects + roots) as f64;
    assert!(
        ratio <= 1.05,
        "{what}: downloaded {down} bytes for {objects} + {roots} stored: {ratio:.3}×"
    );
}

/// Scenario 5 of the tier's trust: a first restore (into the caller's
/// buffer, and as an owned snapshot) downloads at most 1.05 × the root's
/// stored bytes, fill included; every object reaches the tier once; the
/// second restore is the tier's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_restore_downloads_each_object_once() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    bounded(async {
        for into in [true, false] {
            let site = Site::new();
            let id = identity(&format!("egress-{into}"));
            let (c, s, objects, root) = published(&site, &id, 501).await;
            assert!(objects > 16 * EXTENT, "{objects} bytes: too few extents");

            let proxy = FaultProxy::start(server_addr(&endpoint)).expect("proxy");
            let through = site
                .origin
                .replace(&endpoint, &format!("http://127.0.0.1:{}", proxy.port()));
            let tc = tier_config(&site.tier_dir, Duration::from_secs(60));
            let node = Store::open(&through, egress_config().with_tier(Some(tc))).expect("node");
            if into {
                let mut buf = vec![0u8; s.encoded().len()];
                assert_restored_into(&node, (&id, c), &mut buf, s.encoded(), "the node").await;
            } else {
                assert!(restore_bytes(&node, &id, c).await == s.encoded());
            }
            node.tier_settle().await;
            let down = proxy.bytes_to_clients();
            let t = tier_stats(&node);
            assert_eq!(t.fills_failed, 0, "{t:?}");
            assert_eq!(
                t.fill_reused_bytes, objects,
                "every object from the restore: {t:?}"
            );
            assert_eq!(
                t.fill_bytes, root,
                "only the root downloaded by the fill: {t:?}"
            );
            assert_about_one_download(down, objects, root, "first restore and fill");
            // The second restore is the tier's: no object is downloaded
            // again (what reaches the origin is less than one extent: the
            // coherence check's root read, the ledger's bookkeeping).
            let tier = node.tier_store().expect("tier");
            assert!(restore_bytes(tier, &id, c).await == s.encoded());
            assert!(restore_bytes(&node, &id, c).await == s.encoded());
            assert_eq!(tier_stats(&node).hits, 1);
            let again = proxy.bytes_to_clients() - down;
            assert!(
                again < EXTENT,
                "the second restore downloaded {again} bytes"
            );
        }
    })
    .await;
}

/// With room for one copy at a time, the restore keeps what it can and
/// the fill downloads the rest: each object reaches the tier exactly once
/// either way, and the tier's copy is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_downloads_only_what_the_restore_did_not_keep() {
    bounded(async {
        let site = Site::new();
        let id = identity("egress-one-permit");
        let (c, s, objects, root) = published(&site, &id, 502).await;
        let mut tc = tier_config(&site.tier_dir, Duration::from_secs(60));
        tc.fill_objects_in_flight = 1;
        let node = Store::open(&site.origin, egress_config().with_tier(Some(tc))).expect("node");
        let mut buf = vec![0u8; s.encoded().len()];
        assert_restored_into(&node, (&id, c), &mut buf, s.encoded(), "the node").await;
        node.tier_settle().await;
        let t = tier_stats(&node);
        assert_eq!(t.fills, 1, "{t:?}");
        assert_eq!(
            t.fill_reused_bytes + t.fill_bytes,
            objects + root,
            "each object once: {t:?}"
        );
        let tier = node.tier_store().expect("tier");
        assert!(restore_bytes(tier, &id, c).await == s.encoded());
        let verdict = tier.verify_root((&id, c)).await.expect("verify");
        assert!(verdict.is_intact(), "{verdict:?}");
    })
    .await;
}

/// A chain's fill copies every link the tier lacks (their objects at
/// once, their roots bottom first): after one restore of the top, the
/// tier alone restores every turn, and each link's root is the origin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_restore_of_a_chain_fills_every_link() {
    bounded(async {
        let site = Site::new();
        let id = identity("egress-chain");
        let plain = Store::open(&site.origin, egress_config()).expect("origin");
        let turns = crate::tiers::chain_of_four(&plain, &id, 503).await;
        let tc = tier_config(&site.tier_dir, Duration::from_secs(60));
        let node = open_tiered(&site.origin, tc);
        let (top, snap) = turns.last().expect("four turns");
        assert!(restore_bytes(&node, &id, *top).await == snap.encoded());
        node.tier_settle().await;
        let t = tier_stats(&node);
        assert_eq!((t.fills, t.fills_failed), (1, 0), "{t:?}");
        let tier = node.tier_store().expect("tier");
        for (c, s) in &turns {
            assert!(restore_bytes(tier, &id, *c).await == s.encoded());
            let ns = id.namespace();
            assert_eq!(
                tier.peek_root(&ns, c).await.expect("tier root"),
                plain.peek_root(&ns, c).await.expect("origin root"),
            );
        }
    })
    .await;
}

/// A chain's first restore through an empty tier costs about one download
/// of the chain too. The restore reads the links' extents in parts, unchecked
/// by their names (the result digest checks every placed byte); the parts it
/// read are kept on the tier's disk, and the fill downloads only the rest of
/// each extent, then checks the whole against its name before the tier
/// holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_restore_of_a_chain_downloads_each_object_once() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    bounded(async {
        for how in ["restore", "restore_into", "layers"] {
            chain_first_restore(&endpoint, how).await;
        }
    })
    .await;
}

/// [`a_first_restore_of_a_chain_downloads_each_object_once`] through one
/// restore path (`how`).
async fn chain_first_restore(endpoint: &str, how: &str) {
    let site = Site::new();
    let id = identity(&format!("egress-chain-{how}"));
    // Larger extents than the flat case's: a chain's restore reads each
    // extent in a part or two and the fill the rest, so HTTP headers weigh
    // twice as much per extent.
    let config = || StoreConfig::default().with_max_extent_bytes(4 * EXTENT);
    let plain = Store::open(&site.origin, config()).expect("origin");
    let mut turns: Vec<(ContextDigest, Arc<Snapshot>)> = Vec::new();
    for i in 1..=4u64 {
        let (c, s) = (ctx(&id, 504, (i * 131072) as usize), turn(504, i * 131072));
        let req = match turns.last() {
            None => flat(&id, c, &s, RootFormat::V2),
            Some((bc, b)) => delta(&id, c, &s, *bc, b, RootFormat::V2),
        };
        plain.publish(req).await.expect("publish");
        turns.push((c, s));
    }
    let roots = plain.inspect(Some(&id.namespace())).await.expect("inspect");
    assert_eq!(roots.len(), 4, "{roots:?}");
    let objects: u64 = roots.iter().map(|r| r.stored_bytes).sum();
    let root_bytes: u64 = roots.iter().map(|r| r.root_bytes).sum();
    assert!(
        objects > 16 * 4 * EXTENT,
        "{objects} bytes: too few extents"
    );

    let proxy = FaultProxy::start(server_addr(endpoint)).expect("proxy");
    let through = site
        .origin
        .replace(endpoint, &format!("http://127.0.0.1:{}", proxy.port()));
    let tc = tier_config(&site.tier_dir, Duration::from_secs(60));
    let node = Store::open(&through, config().with_tier(Some(tc))).expect("node");
    let (top, snap) = turns.last().expect("four turns");
    let mut buf = vec![0u8; snap.encoded().len()];
    match how {
        "restore" => assert!(restore_bytes(&node, &id, *top).await == snap.encoded()),
        "restore_into" => {
            assert_restored_into(&node, (&id, *top), &mut buf, snap.encoded(), how).await
        }
        _ => {
            let outcome = node
                .restore_layers_with(
                    (&id, *top),
                    &mut buf,
                    RestoreOptions::default(),
                    &LayerOrder::default(),
                    |_, _| {},
                )
                .await
                .expect("layers");
            assert!(
                matches!(outcome, deltapack_store::RestoreIntoOutcome::Hit { .. }),
                "{outcome:?}"
            );
            assert!(buf == snap.encoded(), "the layer-wise restore's bytes");
        }
    }
    node.tier_settle().await;
    let down = proxy.bytes_to_clients();
    let t = tier_stats(&node);
    assert_eq!((t.fills, t.fills_failed), (1, 0), "{how}: {t:?}");
    assert!(
        t.fill_reused_bytes > objects / 2,
        "{how}: most of the chain's bytes from the restore: {t:?}"
    );
    assert_about_one_download(down, objects, root_bytes, how);
    // The tier's copy is whole and right: every turn restores from the
    // tier alone and verifies.
    let tier = node.tier_store().expect("tier");
    for (c, s) in &turns {
        assert!(restore_bytes(tier, &id, *c).await == s.encoded());
        let verdict = tier.verify_root((&id, *c)).await.expect("verify");
        assert!(verdict.is_intact(), "{how}: {verdict:?}");
    }
}

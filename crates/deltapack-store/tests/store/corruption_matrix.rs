//! Corruption matrix over the frozen fixture store (v1 and v2 roots, raw and
//! zstd extents, keyed roots): for every object and every root, flip a bit
//! at the start, middle and end, truncate, extend, zero it, swap two objects,
//! and move a root under another context. Every restore must return exactly
//! the recorded bytes or a miss with the right reason (`corrupt` for the
//! damaged root or a root that references the damaged object, `base-missing`
//! for deltas above it, `incompatible` when the envelope version/flags were
//! hit) — never wrong bytes, never a panic — and the sweep must quarantine
//! exactly the damaged objects.

use crate::common::copy_dir;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use deltapack_format::{ContextDigest, Digest, Namespace};
use deltapack_store::{
    keys, RestoreIntoOutcome, RestoreOutcome, RootStatus, Store, StoreConfig, SweepOptions,
};

const SET: &str = "2026-11-v1v2";

fn fixture_store() -> PathBuf {
    crate::common::repo_root()
        .join("fixtures")
        .join(SET)
        .join("store")
}

type RootId = (Namespace, ContextDigest);
/// (base root, object keys, expected snapshot digest, its length) of one
/// root.
type RootFacts = (Option<RootId>, BTreeSet<String>, Digest, u64);

struct World {
    roots: BTreeMap<RootId, RootFacts>,
}

async fn world() -> World {
    let tmp = tempfile::tempdir().expect("tmp");
    copy_dir(&fixture_store(), tmp.path());
    let s = Store::open(
        &format!("file://{}", tmp.path().display()),
        StoreConfig::default(),
    )
    .expect("open");
    let mut roots = BTreeMap::new();
    for (ns, ctx) in s.list_roots(None).await.expect("list") {
        let RootStatus::Found(r) = s.read_root(&ns, &ctx).await.expect("read") else {
            panic!("fixture root")
        };
        let sum = r.summary().expect("summary");
        let objs = sum
            .objects
            .iter()
            .map(|(d, _)| keys::object_key(d).to_string())
            .collect();
        roots.insert(
            (ns, ctx),
            (
                sum.base.map(|b| (b.namespace, b.context)),
                objs,
                sum.result_snapshot_digest,
                sum.result_snapshot_len,
            ),
        );
    }
    World { roots }
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    FlipStart,
    FlipMiddle,
    FlipEnd,
    Truncate,
    Extend,
    Zero,
}

const ALL: [Damage; 6] = [
    Damage::FlipStart,
    Damage::FlipMiddle,
    Damage::FlipEnd,
    Damage::Truncate,
    Damage::Extend,
    Damage::Zero,
];

fn damage(path: &Path, d: Damage) {
    let mut b = std::fs::read(path).expect("read");
    let n = b.len();
    match d {
        Damage::FlipStart => b[0] ^= 0x01,
        Damage::FlipMiddle => b[n / 2] ^= 0x10,
        Damage::FlipEnd => b[n - 1] ^= 0x80,
        Damage::Truncate => b.truncate(n - 1),
        Damage::Extend => b.push(0),
        Damage::Zero => b.iter_mut().for_each(|x| *x = 0),
    }
    std::fs::write(path, b).expect("write");
}

/// What is damaged: roots whose own bytes are damaged, and roots that
/// reference a damaged object.
#[derive(Default)]
struct Bad {
    roots: BTreeSet<(Namespace, ContextDigest)>,
    users: BTreeSet<(Namespace, ContextDigest)>,
}

/// Expected outcome of restoring `r`: the root is read first, then its base
/// is restored, then its own objects are fetched.
fn expected(w: &World, r: &(Namespace, ContextDigest), bad: &Bad) -> &'static str {
    if bad.roots.contains(r) {
        return "corrupt";
    }
    if let Some(b) = w.roots[r].0 {
        if expected(w, &b, bad) != "hit" {
            return "base-missing";
        }
    }
    if bad.users.contains(r) {
        "corrupt"
    } else {
        "hit"
    }
}

/// Two handles on one directory: keyed roots are read with the fixture key
/// (so damage to their MAC is caught), the others without.
struct Handles {
    plain: Store,
    keyed: Store,
    keyed_roots: BTreeSet<(Namespace, ContextDigest)>,
}

fn handles(dir: &Path, w: &World) -> Handles {
    let url = format!("file://{}", dir.display());
    let keyed_roots = w
        .roots
        .keys()
        .filter(|r| {
            let bytes = std::fs::read(fixture_store().join(keys::root_key(&r.0, &r.1).as_ref()))
                .expect("root");
            deltapack_format::root::has_mac(&bytes)
        })
        .copied()
        .collect();
    Handles {
        plain: Store::open(&url, StoreConfig::default()).expect("open"),
        keyed: Store::open(
            &url,
            StoreConfig::default()
                .with_mac_secret(Some(b"deltapack-fixture-secret-2026-11".to_vec())),
        )
        .expect("open"),
        keyed_roots,
    }
}

async fn check_restores(h: &Handles, w: &World, bad: &Bad, what: &str) {
    check_restores_unsettled(h, w, bad, what).await;
    // Moves to quarantine are queued off the read path: wait for them.
    h.plain.settle_quarantines().await;
    h.keyed.settle_quarantines().await;
}

/// [`check_restores`] without waiting for the quarantines it queues.
async fn check_restores_unsettled(h: &Handles, w: &World, bad: &Bad, what: &str) {
    for r in w.roots.keys() {
        let want = expected(w, r, bad);
        let s = if h.keyed_roots.contains(r) {
            &h.keyed
        } else {
            &h.plain
        };
        // First into a caller's buffer (v2 roots reconstruct in place), then
        // into a new one; both must agree with the expectation.
        let mut buf = vec![0u8; w.roots[r].3 as usize];
        let into = s
            .restore_into((r.0, r.1), &mut buf, Default::default())
            .await
            .expect("restore_into never errors on damage");
        match (&into, want) {
            (RestoreIntoOutcome::Hit { digest, .. }, "hit") => {
                assert_eq!(*digest, w.roots[r].2, "{what}");
                assert_eq!(
                    Digest::blake3(&buf),
                    w.roots[r].2,
                    "{what}: restore_into filled the buffer with other bytes"
                );
            }
            (RestoreIntoOutcome::Hit { .. }, _) => {
                panic!("{what}: {r:?} restored into a buffer although {want} was expected")
            }
            (RestoreIntoOutcome::Miss { reason }, want) => {
                assert!(
                    miss_as_expected(reason.label(), want, bad.roots.contains(r)),
                    "{what}: {r:?} expected {want} from restore_into, got {reason}"
                );
            }
        }
        let got = s
            .restore((r.0, r.1), Default::default())
            .await
            .expect("restore never errors on damage");
        match (&got, want) {
            (RestoreOutcome::Hit(x), "hit") => {
                assert_eq!(x.digest, w.roots[r].2, "{what}: wrong bytes")
            }
            (RestoreOutcome::Hit(_), _) => {
                panic!("{what}: {r:?} restored although {want} was expected")
            }
            (RestoreOutcome::Miss(m), want) => {
                assert!(
                    miss_as_expected(m.label(), want, bad.roots.contains(r)),
                    "{what}: {r:?} expected {want}, got {m}"
                );
            }
        }
    }
}

/// Whether a miss labelled `label` is the `want` expected, or — for a
/// damaged root — one of root damage's other faces: damage to a root's
/// envelope version/flags reads as an unknown format, damage to a keyed
/// root's MAC as forgery, and a damaged root already quarantined by an
/// earlier restore (of a delta above it) is simply gone.
fn miss_as_expected(label: &str, want: &str, root_damaged: bool) -> bool {
    label == want
        || (root_damaged && matches!(label, "incompatible" | "unauthenticated" | "absent"))
}

/// The label of the miss a restore of `key` from `s` is (`None` for a hit).
async fn miss_label(s: &Store, key: (Namespace, ContextDigest)) -> Option<&'static str> {
    let out = s.restore(key, Default::default()).await.expect("restore");
    out.miss().map(|m| m.label())
}

/// What a dry-run sweep of `s` finds (nothing changed).
async fn swept(s: &Store) -> deltapack_store::SweepReport {
    s.sweep(&SweepOptions::default().with_dry_run(true))
        .await
        .expect("sweep")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_object_every_damage() {
    let w = world().await;
    let objects: BTreeSet<String> = w.roots.values().flat_map(|v| v.1.iter().cloned()).collect();
    assert!(
        objects.len() >= 20,
        "the fixture has v1 chunks and v2 extents"
    );
    let mut cases = 0;
    for key in &objects {
        let users: BTreeSet<_> = w
            .roots
            .iter()
            .filter(|(_, v)| v.1.contains(key))
            .map(|(k, _)| *k)
            .collect();
        for d in ALL {
            let tmp = tempfile::tempdir().expect("tmp");
            copy_dir(&fixture_store(), tmp.path());
            damage(&tmp.path().join(key), d);
            let h = handles(tmp.path(), &w);
            // The sweep alone finds exactly this object (dry run: no change).
            let r = swept(&h.plain).await;
            assert_eq!(
                r.corrupt,
                vec![key.clone()],
                "{key} {d:?}: sweep finds exactly the damaged object"
            );
            // Restores see the damage and report the right reasons.
            let bad = Bad {
                users: users.clone(),
                ..Default::default()
            };
            check_restores(&h, &w, &bad, &format!("{key} {d:?}")).await;
            assert!(
                tmp.path().join("quarantine").join(key).exists(),
                "{key} {d:?}: quarantined"
            );
            cases += 1;
        }
    }
    eprintln!("corruption matrix: {cases} object cases");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapped_objects() {
    let w = world().await;
    let objects: Vec<String> = w
        .roots
        .values()
        .flat_map(|v| v.1.iter().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    for pair in objects.chunks(2).filter(|p| p.len() == 2) {
        let (a, b) = (&pair[0], &pair[1]);
        let tmp = tempfile::tempdir().expect("tmp");
        copy_dir(&fixture_store(), tmp.path());
        let (pa, pb) = (tmp.path().join(a), tmp.path().join(b));
        let (xa, xb) = (
            std::fs::read(&pa).expect("a"),
            std::fs::read(&pb).expect("b"),
        );
        std::fs::write(&pa, xb).expect("w");
        std::fs::write(&pb, xa).expect("w");
        let users: BTreeSet<_> = w
            .roots
            .iter()
            .filter(|(_, v)| v.1.contains(a) || v.1.contains(b))
            .map(|(k, _)| *k)
            .collect();
        let h = handles(tmp.path(), &w);
        let r = swept(&h.plain).await;
        let mut got = r.corrupt.clone();
        got.sort();
        assert_eq!(got, vec![a.clone(), b.clone()], "swap {a} <-> {b}");
        check_restores(
            &h,
            &w,
            &Bad {
                users,
                ..Default::default()
            },
            &format!("swap {a} {b}"),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_root_every_damage_and_moved_roots() {
    let w = world().await;
    for r in w.roots.keys() {
        let key = keys::root_key(&r.0, &r.1).to_string();
        let bad = Bad {
            roots: [*r].into_iter().collect(),
            ..Default::default()
        };
        for d in ALL {
            let tmp = tempfile::tempdir().expect("tmp");
            copy_dir(&fixture_store(), tmp.path());
            damage(&tmp.path().join(&key), d);
            check_restores(&handles(tmp.path(), &w), &w, &bad, &format!("{key} {d:?}")).await;
        }
        // Moved under another context: refused there, absent here.
        let tmp = tempfile::tempdir().expect("tmp");
        copy_dir(&fixture_store(), tmp.path());
        let other = ContextDigest([0xab; 32]);
        let dest = tmp.path().join(keys::root_key(&r.0, &other).as_ref());
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
        std::fs::rename(tmp.path().join(&key), &dest).expect("move");
        let s = Store::open(
            &format!("file://{}", tmp.path().display()),
            StoreConfig::default(),
        )
        .expect("open");
        assert_eq!(
            miss_label(&s, (r.0, other)).await,
            Some("corrupt"),
            "{key} moved"
        );
        assert_eq!(
            miss_label(&s, (r.0, r.1)).await,
            Some("absent"),
            "{key} moved away"
        );
    }
}

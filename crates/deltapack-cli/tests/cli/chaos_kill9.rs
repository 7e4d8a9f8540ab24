//! Kill -9 chaos on one `file://` store shared by many processes:
//! publishers (v1 and v2, flat roots and deltas, some under a byte budget
//! that evicts), restorers, sweeps (grace 0) and garbage collection
//! (`evict`, `prune`, `ledger rebuild`) run at the same time as real
//! `deltapack` processes, and random ones are killed with SIGKILL at random
//! moments. Guards the rules that let them share one store: durable before
//! visible, two-phase deletion with publication protections in the shared
//! SQLite ledger, sweeps that re-check before they destroy, and quarantine
//! only on proof.
//!
//! Why: `crash_kill9.rs` kills a lone publisher and `multi_process_ledger.rs`
//! runs processes side by side without killing them; in service a process
//! dies in the middle of a GC transaction, an eviction, a sweep's
//! quarantine or a ledger rebuild while others publish and read.
//!
//! Checked during the campaign: every restore that reports a hit wrote
//! exactly the published snapshot (0 wrong bytes); a miss is `absent`,
//! `base-missing` (the base was evicted), `deadline-exceeded` (only when a
//! deadline was given) or `corrupt` naming an object that went missing
//! under the restore (eviction and GC in another process); held roots
//! (named holds, set before the campaign) always restore exactly; no
//! process dies of anything but our SIGKILL; no process fails (exit 1)
//! except a publication whose base root is gone (it is then published flat)
//! or that does not fit its budget; a publication is never a conflict. Afterwards: the store's roots are all readable; the final
//! `sweep --grace 0s` finds nothing corrupt or missing and invalidates only
//! *stranded* deltas (whose base root is gone: a base evicted by one process
//! while another published a delta on it), and a second sweep finds
//! nothing at all; `quarantine/` holds no object and no flat root (only
//! intact deltas, taken as stranded ones: after the fact a delta cannot be
//! told from one republished while a sweep invalidated its stranded
//! predecessor — see bug 6 in docs/reliability.md — a flat root can);
//! every context restores exactly or is `absent`; the persisted ledger
//! equals a rebuilt one.
//!
//! `DELTAPACK_CHAOS_ITERS` sets the number of publications launched
//! (default 200; restorers, sweeps and GC run until the publishers are
//! done), `DELTAPACK_CHAOS_SEED` the random seed. The counts are printed
//! as one line (`--nocapture`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::common::{
    assert_none, command, deltapack, expect_code, files_below, local_store, wait_or_kill, words,
    Ended, Rng,
};

/// A process still running after this long is a hang: it is killed and the
/// test fails.
const HANG: Duration = Duration::from_secs(180);
/// Probability that a launched process is killed at a random moment.
const P_KILL: f64 = 0.3;
/// Conversations published during the campaign, and their turns.
const LANES: usize = 4;
const TURNS: usize = 6;
/// The held conversation (published and held before the campaign).
const HELD: usize = LANES;
/// Byte budget of the publishers that run with one.
const BUDGET: u64 = 160_000;

/// One turn of a conversation: its files and context.
struct TurnFiles {
    snap: String,
    tok: String,
    context: String,
    bytes: Vec<u8>,
}

/// What every worker shares.
struct Shared {
    dir: PathBuf,
    store: String,
    /// `turns[lane][t]`; lane `HELD` is the held conversation.
    turns: Vec<Vec<TurnFiles>>,
    /// Publications to launch; the other workers run until they are done.
    iters: u64,
    launched: AtomicU64,
    publishers_left: AtomicU64,
    /// Mean duration of a completed process, per kind (ms).
    typical: Mutex<BTreeMap<&'static str, f64>>,
    log: Mutex<Log>,
}

#[derive(Default)]
struct Log {
    counts: BTreeMap<String, u64>,
    failures: Vec<String>,
    /// (lane, turn) whose publication reported success.
    reported: BTreeSet<(usize, usize)>,
    /// Sums over the sweeps that completed during the campaign.
    sweep_quarantined: u64,
    sweep_invalidated: u64,
    sweep_corrupt: u64,
    sweep_missing: u64,
    /// Root keys the completed sweeps reported invalidating.
    sweep_invalidated_keys: BTreeMap<String, u64>,
    wrong_bytes: u64,
}

impl Shared {
    fn count(&self, what: impl Into<String>) {
        if let Ok(mut l) = self.log.lock() {
            *l.counts.entry(what.into()).or_default() += 1;
        }
    }
    fn fail(&self, what: String) {
        eprintln!("chaos_kill9: FAILURE: {what}");
        if let Ok(mut l) = self.log.lock() {
            l.failures.push(what);
        }
    }
    fn typical(&self, kind: &'static str) -> Duration {
        let ms = self
            .typical
            .lock()
            .ok()
            .and_then(|t| t.get(kind).copied())
            .unwrap_or(150.0);
        Duration::from_secs_f64(ms / 1000.0)
    }
    fn observed(&self, kind: &'static str, took: Duration) {
        if let Ok(mut t) = self.typical.lock() {
            let e = t.entry(kind).or_insert(150.0);
            *e = 0.8 * *e + 0.2 * took.as_secs_f64() * 1000.0;
        }
    }
}

/// How a launched process ended.
enum Ran {
    /// Exited on its own, with its exit code, stdout and stderr.
    Exited(Option<i32>, String, String),
    /// We killed it with SIGKILL.
    Killed,
}

/// Runs `deltapack args` in the shared directory; with probability
/// `P_KILL` kills it with SIGKILL at a random moment within 1.5× the
/// typical duration of its kind. Output goes to files (no pipe can fill
/// up and stall the child).
fn launch(sh: &Shared, kind: &'static str, args: &[String], rng: &mut Rng, slot: &str) -> Ran {
    let out_path = sh.dir.join("work").join(format!("{slot}.out"));
    let err_path = sh.dir.join("work").join(format!("{slot}.err"));
    let out = std::fs::File::create(&out_path).expect("stdout file");
    let err = std::fs::File::create(&err_path).expect("stderr file");
    let start = Instant::now();
    let kill_at = rng.chance(P_KILL).then(|| {
        let span = sh.typical(kind).mul_f64(1.5).as_micros().max(1) as u64;
        start + Duration::from_micros(rng.below(span))
    });
    let mut child = command()
        .args(args)
        .current_dir(&sh.dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn deltapack");
    let status = match wait_or_kill(&mut child, start, kill_at, HANG) {
        Ended::Exited(status) => Some(status),
        Ended::Killed => None,
        Ended::Hung => {
            sh.fail(format!("deltapack {args:?} hung for {HANG:?}"));
            None
        }
    };
    let Some(status) = status else {
        sh.count(format!("{kind}: killed"));
        return Ran::Killed;
    };
    sh.observed(kind, start.elapsed());
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    if status.code().is_none() {
        sh.fail(format!(
            "deltapack {args:?} died of a signal we did not send: {status:?}\n{stderr}"
        ));
    }
    Ran::Exited(status.code(), stdout, stderr)
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").chars().take(200).collect()
}

/// Takes the next publication slot; `false` once the campaign's
/// publications are all launched.
fn next_publication(sh: &Shared) -> bool {
    sh.launched.fetch_add(1, Ordering::SeqCst) < sh.iters
}

/// Whether publishers are still running (the other workers stop after).
fn campaign_running(sh: &Shared) -> bool {
    sh.publishers_left.load(Ordering::SeqCst) > 0
}

fn publisher(sh: &Shared, me: usize, seed: u64) {
    let mut rng = Rng(seed ^ ((me as u64) << 32) ^ 0x9b1);
    let mut n = 0;
    while next_publication(sh) {
        n += 1;
        let lane = rng.below(LANES as u64) as usize;
        let t = rng.below(TURNS as u64) as usize;
        // Lane 3 is mostly legacy v1, the others mostly v2: chains mix both.
        let v1 = rng.chance(if lane == 3 { 0.75 } else { 0.15 });
        let budget = rng.chance(0.4);
        let mut with_base = t > 0 && rng.chance(0.85);
        for attempt in 0..2 {
            let f = &sh.turns[lane][t];
            let mut args = strings(&[
                "publish",
                "--store",
                &sh.store,
                "--identity",
                "id.json",
                "--tokens",
                &f.tok,
                "--snapshot",
                &f.snap,
                "--format",
                if v1 { "v1" } else { "v2" },
                "--max-extent-bytes",
                "4096",
                "--json",
            ]);
            if budget {
                args.extend(strings(&["--budget", &BUDGET.to_string(), "--grace", "0s"]));
            }
            if with_base {
                let b = &sh.turns[lane][t - 1];
                args.extend(strings(&words(&format!(
                    "--base-snapshot {} --base-tokens {}",
                    b.snap, b.tok
                ))));
            }
            let ran = launch(
                sh,
                "publish",
                &args,
                &mut rng,
                &format!("p{me}-{n}-{attempt}"),
            );
            let Ran::Exited(code, stdout, stderr) = ran else {
                break;
            };
            match code {
                Some(0) => {
                    let receipt: serde_json::Value = match serde_json::from_str(&stdout) {
                        Ok(v) => v,
                        Err(e) => {
                            sh.fail(format!("publish printed no receipt ({e}): {stdout}"));
                            break;
                        }
                    };
                    let outcome = receipt["outcome"].as_str().unwrap_or("?").to_string();
                    if outcome != "created" && outcome != "already-present" {
                        sh.fail(format!("publish exited 0 with outcome {outcome}"));
                    }
                    sh.count(format!("publish: {outcome}"));
                    if let Ok(mut l) = sh.log.lock() {
                        l.reported.insert((lane, t));
                    }
                    break;
                }
                Some(1) if stderr.contains("conflict") => {
                    sh.fail(format!("publish conflict: {}", first_line(&stderr)));
                    break;
                }
                Some(1) if stderr.contains("no base root is published") && with_base => {
                    // The base was evicted (or never published): publish flat.
                    sh.count("publish: base gone, published flat instead");
                    with_base = false;
                }
                Some(1) if budget && stderr.contains("capacity") => {
                    sh.count(format!(
                        "publish: capacity error ({})",
                        if stderr.contains("condemned") {
                            "condemned bytes not yet collectable"
                        } else {
                            "nothing evictable"
                        }
                    ));
                    break;
                }
                other => {
                    sh.fail(format!("publish exited {other:?}: {}", first_line(&stderr)));
                    break;
                }
            }
        }
    }
    sh.publishers_left.fetch_sub(1, Ordering::SeqCst);
}

fn restorer(sh: &Shared, me: usize, seed: u64) {
    let mut rng = Rng(seed ^ ((me as u64) << 40) ^ 0x5e5);
    let mut n = 0;
    while campaign_running(sh) {
        n += 1;
        let lane = rng.below(LANES as u64 + 1) as usize;
        let t = rng.below(sh.turns[lane].len() as u64) as usize;
        let f = &sh.turns[lane][t];
        let deadline = rng.chance(0.1);
        let out = format!("work/r{me}-{n}.snap");
        let mut args = strings(&words(&format!(
            "restore --store {} --identity id.json --tokens {} --out {out} --json",
            sh.store, f.tok
        )));
        if deadline {
            args.extend(strings(&["--deadline", "15ms"]));
        }
        let ran = launch(sh, "restore", &args, &mut rng, &format!("r{me}-{n}"));
        let Ran::Exited(code, stdout, stderr) = ran else {
            let _ = std::fs::remove_file(sh.dir.join(&out));
            continue;
        };
        let what = format!("restore of lane {lane} turn {t}");
        match code {
            Some(0) => {
                let got = std::fs::read(sh.dir.join(&out)).unwrap_or_default();
                if got != f.bytes {
                    sh.fail(format!("{what}: a hit with WRONG BYTES"));
                    if let Ok(mut l) = sh.log.lock() {
                        l.wrong_bytes += 1;
                    }
                } else {
                    sh.count("restore: exact hit");
                }
            }
            Some(3) => {
                let miss: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_default();
                let reason = miss["reason"].as_str().unwrap_or("?");
                let detail = miss["what"].as_str().unwrap_or("");
                let allowed = match reason {
                    "absent" | "base-missing" => lane != HELD,
                    "deadline-exceeded" => deadline,
                    "corrupt" => lane != HELD && detail.contains("missing"),
                    _ => false,
                };
                if allowed {
                    sh.count(format!("restore: miss {reason}"));
                } else {
                    sh.fail(format!("{what}: miss not allowed here: {miss}"));
                }
            }
            other => sh.fail(format!("{what}: exited {other:?}: {}", first_line(&stderr))),
        }
        let _ = std::fs::remove_file(sh.dir.join(&out));
    }
}

/// Runs a background worker's rounds until the publishers are done, each
/// after a random pause of up to `pause_ms`; `round` gets the worker's
/// random stream and the round's number.
fn paced_rounds(sh: &Shared, mut rng: Rng, pause_ms: u64, mut round: impl FnMut(&mut Rng, u64)) {
    let mut n = 0;
    while campaign_running(sh) {
        n += 1;
        std::thread::sleep(Duration::from_millis(rng.below(pause_ms)));
        round(&mut rng, n);
    }
}

fn sweeper(sh: &Shared, me: usize, seed: u64) {
    let rng = Rng(seed ^ ((me as u64) << 48) ^ 0x5ee);
    paced_rounds(sh, rng, 100, |rng, n| {
        let grace = if rng.chance(0.8) { "0s" } else { "1h" };
        let args = strings(&["sweep", "--store", &sh.store, "--grace", grace, "--json"]);
        let Ran::Exited(code, stdout, stderr) =
            launch(sh, "sweep", &args, rng, &format!("s{me}-{n}"))
        else {
            return;
        };
        match code {
            // 4: the sweep found damage (which the counters record).
            Some(0) | Some(4) => {
                let r: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_default();
                let len = |k: &str| r[k].as_array().map(Vec::len).unwrap_or(0) as u64;
                if let Ok(mut l) = sh.log.lock() {
                    l.sweep_quarantined += r["quarantined"].as_u64().unwrap_or(0);
                    l.sweep_invalidated += len("invalidated_roots");
                    l.sweep_corrupt += len("corrupt");
                    l.sweep_missing += len("missing");
                    for k in r["invalidated_roots"].as_array().into_iter().flatten() {
                        let k = k.as_str().unwrap_or("").to_string();
                        *l.sweep_invalidated_keys.entry(k).or_default() += 1;
                    }
                }
                sh.count(format!("sweep: exit {}", code.unwrap_or(-1)));
            }
            other => sh.fail(format!("sweep exited {other:?}: {}", first_line(&stderr))),
        }
    });
}

fn collector(sh: &Shared, me: usize, seed: u64) {
    let rng = Rng(seed ^ ((me as u64) << 52) ^ 0x6c);
    paced_rounds(sh, rng, 200, |rng, n| {
        let (kind, args) = match rng.below(10) {
            0..=4 => {
                let to = (60_000 + rng.below(140_000)).to_string();
                (
                    "evict",
                    strings(&words(&format!(
                        "evict --store {} --to {to} --grace 0s --json",
                        sh.store
                    ))),
                )
            }
            5..=7 => (
                "prune",
                strings(&words(&format!(
                    "prune --store {} --idle 3s --grace 0s --json",
                    sh.store
                ))),
            ),
            _ => (
                "ledger-rebuild",
                strings(&words(&format!(
                    "ledger rebuild --store {} --grace 0s --json",
                    sh.store
                ))),
            ),
        };
        let Ran::Exited(code, _, stderr) = launch(sh, kind, &args, rng, &format!("g{me}-{n}"))
        else {
            return;
        };
        match code {
            Some(0) => sh.count(format!("{kind}: ok")),
            other => sh.fail(format!("{kind} exited {other:?}: {}", first_line(&stderr))),
        }
    });
}

fn context_hex(dir: &Path, tok: &str) -> String {
    let id = deltapack_format::CacheIdentity::from_json(
        &std::fs::read(dir.join("id.json")).expect("id.json"),
    )
    .expect("identity");
    let tokens = deltapack_format::context::tokens_from_le_bytes(
        &std::fs::read(dir.join(tok)).expect("tok"),
    )
    .expect("tokens");
    deltapack_format::ContextHasher::new(id.namespace(), id.chunk_tokens)
        .expect("hasher")
        .digest(&tokens)
        .hex()
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn publishers_restorers_sweeps_and_gc_killed_at_random_lose_nothing() {
    let started = Instant::now();
    let iters = env_u64("DELTAPACK_CHAOS_ITERS", 200);
    let seed = env_u64("DELTAPACK_CHAOS_SEED", 0xc4a05);
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().to_path_buf();
    std::fs::create_dir_all(dir.join("work")).expect("work dir");
    let store = local_store(&dir);
    std::fs::write(
        dir.join("id.json"),
        expect_code(&dir, &["identity", "--example"], 0),
    )
    .expect("id");

    // Conversations: lanes 0..LANES of TURNS turns (1,024 tokens more each),
    // and the held one (two turns).
    let mut turns: Vec<Vec<TurnFiles>> = Vec::new();
    for lane in 0..=LANES {
        let n = if lane == HELD { 2 } else { TURNS };
        let mut v = Vec::new();
        for t in 0..n {
            let (snap, tok) = (format!("l{lane}t{t}.snap"), format!("l{lane}t{t}.tok"));
            expect_code(
                &dir,
                &words(&format!(
                    "synth --preset tiny --tokens {} --seed {} --out {snap} --tokens-out {tok}",
                    1024 * (t + 1),
                    100 + lane
                )),
                0,
            );
            v.push(TurnFiles {
                context: context_hex(&dir, &tok),
                bytes: std::fs::read(dir.join(&snap)).expect("snapshot"),
                snap,
                tok,
            });
        }
        turns.push(v);
    }
    // The held conversation: a flat root and a delta, held by name (the
    // hold on the delta protects its base too).
    let held = &turns[HELD];
    expect_code(
        &dir,
        &words(&format!("publish --store {store} --identity id.json --tokens {} --snapshot {} --max-extent-bytes 4096", held[0].tok, held[0].snap)),
        0,
    );
    expect_code(
        &dir,
        &words(&format!("publish --store {store} --identity id.json --tokens {} --snapshot {} --base-snapshot {} --base-tokens {} --format v1 --max-extent-bytes 4096", held[1].tok, held[1].snap, held[0].snap, held[0].tok)),
        0,
    );
    expect_code(
        &dir,
        &words(&format!(
            "hold --store {store} --name chaos-sentinel --identity id.json --context {}",
            held[1].context
        )),
        0,
    );

    let sh = Shared {
        dir: dir.clone(),
        store: store.clone(),
        turns,
        iters,
        launched: AtomicU64::new(0),
        publishers_left: AtomicU64::new(2),
        typical: Mutex::new(BTreeMap::new()),
        log: Mutex::new(Log::default()),
    };
    std::thread::scope(|s| {
        let sh = &sh;
        for me in 0..2 {
            s.spawn(move || publisher(sh, me, seed));
            s.spawn(move || restorer(sh, me, seed));
        }
        s.spawn(move || sweeper(sh, 0, seed));
        s.spawn(move || collector(sh, 0, seed));
    });
    let campaign = started.elapsed();

    // ---- After the campaign: every process has ended.
    // Staging files of killed writers count as abandoned after 2 s.
    std::thread::sleep(Duration::from_millis(2100));
    let ns_of = |v: &serde_json::Value| v["namespace"].as_str().unwrap_or("").to_string();
    let inspect: serde_json::Value = serde_json::from_str(&expect_code(
        &dir,
        &["inspect", "--store", &store, "--json"],
        0,
    ))
    .expect("inspect json");
    let roots = inspect.as_array().cloned().unwrap_or_default();
    let mut present: BTreeMap<String, Option<String>> = BTreeMap::new();
    for r in &roots {
        let schema = r["schema"].as_str().unwrap_or("");
        if schema.starts_with("unusable") {
            sh.fail(format!("an unusable root after the campaign: {r}"));
        }
        present.insert(
            r["context"].as_str().unwrap_or("").to_string(),
            r["base_context"].as_str().map(str::to_string),
        );
    }
    let namespace = roots.first().map(ns_of).unwrap_or_default();
    // Stranded deltas: the base root is gone (transitively).
    let mut stranded: BTreeSet<String> = BTreeSet::new();
    loop {
        let before = stranded.len();
        for (c, base) in &present {
            if let Some(b) = base {
                if !present.contains_key(b) || stranded.contains(b) {
                    stranded.insert(c.clone());
                }
            }
        }
        if stranded.len() == before {
            break;
        }
    }

    // The final sweep: nothing corrupt or missing; it invalidates exactly
    // the stranded deltas.
    let out = deltapack(
        &dir,
        &["sweep", "--store", &store, "--grace", "0s", "--json"],
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("sweep json");
    assert_eq!(
        out.status.code(),
        Some(0),
        "the final sweep found damage: {report}"
    );
    assert_none(&report, &["corrupt", "missing", "unusable_roots"]);
    let invalidated: BTreeSet<String> = report["invalidated_roots"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|k| k.as_str().and_then(|k| k.rsplit('/').next()))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        invalidated, stranded,
        "the final sweep invalidates exactly the stranded deltas: {report}"
    );
    assert_eq!(report["quarantined"].as_u64(), Some(stranded.len() as u64));
    let again: serde_json::Value = serde_json::from_str(&expect_code(
        &dir,
        &["sweep", "--store", &store, "--grace", "0s", "--json"],
        0,
    ))
    .expect("json");
    for k in ["corrupt", "missing", "unusable_roots", "invalidated_roots"] {
        assert_eq!(again[k].as_array().map(Vec::len), Some(0), "{k}: {again}");
    }
    for k in ["quarantined", "orphans_deleted", "staging_removed"] {
        assert_eq!(again[k], 0, "a second sweep has nothing to do: {again}");
    }

    // Quarantine: no object was ever quarantined (none was damaged), and
    // every quarantined root is an intact delta (a stranded one).
    let qdir = dir.join("store").join("quarantine");
    let mut stranded_quarantined = 0;
    // The directory exists once something was quarantined.
    let quarantined = if qdir.exists() {
        files_below(&qdir)
    } else {
        Vec::new()
    };
    for f in quarantined {
        let rel = f.strip_prefix(&qdir).expect("under quarantine");
        let rel = rel.to_string_lossy();
        if !rel.starts_with("roots/") {
            sh.fail(format!("a healthy object was quarantined: {rel}"));
            continue;
        }
        let bytes = std::fs::read(&f).expect("quarantined root");
        match deltapack_format::root::decode(&bytes, None) {
            Ok(d) if d.summary().is_some_and(|s| s.base.is_some()) => stranded_quarantined += 1,
            Ok(_) => {
                let by_sweep = sh
                    .log
                    .lock()
                    .map(|l| l.sweep_invalidated_keys.get(rel.as_ref()).copied())
                    .unwrap_or_default();
                let ctx = rel.rsplit('/').next().unwrap_or("");
                let which = sh
                    .turns
                    .iter()
                    .enumerate()
                    .flat_map(|(l, v)| v.iter().enumerate().map(move |(t, f)| (l, t, f)))
                    .find(|(_, _, f)| f.context == ctx)
                    .map(|(l, t, _)| format!("lane {l} turn {t}"))
                    .unwrap_or_default();
                sh.fail(format!(
                    "a healthy flat root was quarantined: {rel} ({which}); completed sweeps \
                     reported invalidating this key {} time(s)",
                    by_sweep.unwrap_or(0)
                ))
            }
            Err(e) => sh.fail(format!("a quarantined root is damaged ({e}): {rel}")),
        }
    }

    // Every context restores exactly or is absent; held ones restore.
    let mut exact = 0;
    let mut absent = 0;
    for (lane, lane_turns) in sh.turns.iter().enumerate() {
        for (t, f) in lane_turns.iter().enumerate() {
            let out_file = format!("work/final-{lane}-{t}.snap");
            let out = deltapack(
                &dir,
                &words(&format!("restore --store {store} --identity id.json --tokens {} --out {out_file} --json", f.tok)),
            );
            match out.status.code() {
                Some(0) => {
                    let got = std::fs::read(dir.join(&out_file)).expect("restored");
                    assert!(
                        got == f.bytes,
                        "lane {lane} turn {t}: WRONG BYTES after the campaign"
                    );
                    exact += 1;
                }
                Some(3) => {
                    let miss: serde_json::Value =
                        serde_json::from_slice(&out.stdout).expect("miss json");
                    assert_eq!(miss["reason"], "absent", "lane {lane} turn {t}: {miss}");
                    assert!(lane != HELD, "a held root is gone: lane {lane} turn {t}");
                    absent += 1;
                }
                other => panic!(
                    "lane {lane} turn {t}: restore exited {other:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ),
            }
        }
    }
    let roots_now = serde_json::from_str::<serde_json::Value>(&expect_code(
        &dir,
        &["inspect", "--store", &store, "--json"],
        0,
    ))
    .expect("inspect")
    .as_array()
    .map(Vec::len)
    .unwrap_or(0);
    assert_eq!(
        roots_now, exact,
        "every root left is a context that restores"
    );

    // The persisted ledger equals one rebuilt from the store.
    let shown: serde_json::Value = serde_json::from_str(&expect_code(
        &dir,
        &["ledger", "show", "--store", &store, "--json"],
        0,
    ))
    .expect("json");
    let rebuilt: serde_json::Value = serde_json::from_str(&expect_code(
        &dir,
        &words(&format!("ledger rebuild --store {store} --json --grace 0s")),
        0,
    ))
    .expect("json");
    for field in ["roots", "objects", "object_bytes", "root_bytes"] {
        assert_eq!(
            shown[field], rebuilt[field],
            "{field}: persisted ledger vs rebuilt\n{shown}\n{rebuilt}"
        );
    }

    let log = sh.log.into_inner().expect("log");
    let killed: u64 = log
        .counts
        .iter()
        .filter(|(k, _)| k.ends_with(": killed"))
        .map(|(_, v)| v)
        .sum();
    // Every count is one process (those that failed are in `failures`).
    let launched: u64 = log.counts.values().sum::<u64>() + log.failures.len() as u64;
    let counts: Vec<String> = log
        .counts
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    eprintln!(
        "chaos_kill9: {iters} publications, {launched} processes ({killed} killed) in {:.1} s (campaign {:.1} s); \
         {} contexts reported published; wrong bytes {}; sweeps during the campaign: \
         quarantined {}, invalidated {}, reported corrupt {} / missing {}; after: {} stranded \
         deltas invalidated by the final sweep, {} stranded deltas in quarantine, 0 objects \
         quarantined, {exact} contexts exact, {absent} absent (namespace {namespace})\n  {}",
        started.elapsed().as_secs_f64(),
        campaign.as_secs_f64(),
        log.reported.len(),
        log.wrong_bytes,
        log.sweep_quarantined,
        log.sweep_invalidated,
        log.sweep_corrupt,
        log.sweep_missing,
        stranded.len(),
        stranded_quarantined,
        counts.join("\n  "),
    );
    assert!(
        log.failures.is_empty(),
        "{} failure(s):\n{}",
        log.failures.len(),
        log.failures.join("\n")
    );
    assert_eq!(log.wrong_bytes, 0);
}

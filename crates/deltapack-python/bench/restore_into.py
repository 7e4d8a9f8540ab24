"""restore_into from Python vs. from Rust, on the reference workload.

    cargo build --release -p deltapack-bench
    pip install ./crates/deltapack-python numpy        # a release build
    python crates/deltapack-python/bench/restore_into.py [--rounds 7] [--scale 1]

The workload is the macro benchmark's (crates/deltapack-bench, `deltapack-bench`):
the `default` synth preset, seed 1, a base at 4,096 tokens and a result at
262,144 tokens (scale 1), published as a flat base and a v2 page delta of
≈ 1.576 GB in 64 MiB extents, in a local store, under the bench's identity.
This script publishes it from Python (the same bytes: `deltapack.synth` is
the CLI's synthesizer), unless the store already holds it.

Each measurement is a fresh child process, as in `deltapack-bench`:

* **Rust**: `deltapack-bench bench-one` with the bench's own `restore` job
  (`into: true`, warm local store) -- exactly the "restore v2 into the
  caller's resident buffer" scenario of benches/results/: one untimed
  restore of the delta, then a timed `Store::restore_into` into a
  buffer allocated and touched before the clock starts.
* **Python**: the same steps through the `deltapack` package: one untimed
  `Store.restore`, then a timed `Store.restore_into` into a touched numpy
  array, given the context digest (as a connector has it from `lookup`).

Rust and Python children alternate (the order flips every round), so the
drift of a shared machine hits both alike; medians and their ratio are
reported, with every repetition, in the output directory (default
benches/results/python/). Not a CI step (minutes and ~3.5 GB of disk); the
CI runs the pytest suite instead.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
REFERENCE_RESULT_TOKENS = 262_144
BASE_TOKENS = 4096
SEED = 1
EXTENT = 64 << 20
#: A measurement is "quiet" when other processes kept fewer cores busy.
QUIET = 0.3


def identity():
    import deltapack

    ex = json.loads(deltapack.CacheIdentity.example().to_json())
    ex["attributes"] = {"deltapack.bench": "reference-workload"}
    return deltapack.CacheIdentity.from_json(json.dumps(ex))


def result_tokens(scale):
    raw = round(REFERENCE_RESULT_TOKENS * scale / 256) * 256
    return max(raw, BASE_TOKENS + 256)


def contexts(n):
    """Base and result contexts of the bench's conversation, and its tokens."""
    ident = identity()
    full = _tokens(n)
    return ident.context(full[:BASE_TOKENS]), ident.context(full), full


def _tokens(n):
    import deltapack

    # The token stream is independent of the preset; the tiny preset keeps
    # the synthesized snapshot small.
    _, ids = deltapack.synth(n, "tiny", SEED)
    return ids


def prepare(store_dir, n):
    """Publishes base and delta unless present; returns the result's size."""
    import deltapack

    ident = identity()
    bctx, rctx, full = contexts(n)
    store = deltapack.Store(f"file://{store_dir}", max_extent_bytes=EXTENT)
    size = store.snapshot_size(ident, rctx)
    if size is not None:
        return size, rctx
    print(f"publishing the workload into {store_dir} ...", flush=True)
    base, _ = deltapack.synth(BASE_TOKENS, "default", SEED)
    result, _ = deltapack.synth(n, "default", SEED)
    store.publish(ident, full[:BASE_TOKENS], base)
    receipt = store.publish(ident, full, result, base=(full[:BASE_TOKENS], base))
    print(
        f"  delta: {receipt['payload_len']:,} bytes in {receipt['objects_written']} extents, "
        f"result {result.nbytes:,} bytes",
        flush=True,
    )
    return result.nbytes, rctx


def child(store_dir, ctx, pages):
    """One Python measurement (run in a fresh process). `pages`: "huge" keeps
    numpy's default (large arrays are madvise'd for transparent huge pages),
    "4k" turns that off, as for the Rust bench's `Vec` buffer."""
    import numpy as np

    if pages == "4k":
        from numpy._core import multiarray

        multiarray._set_madvise_hugepage(False)

    import deltapack

    rss_start = proc_status("VmRSS")
    ident = identity()
    store = deltapack.Store(f"file://{store_dir}", max_extent_bytes=EXTENT)
    t = time.perf_counter()
    r = store.restore(ident, ctx)
    first_ms = (time.perf_counter() - t) * 1000
    if not r:
        raise SystemExit(f"first restore missed: {r}")
    digest = r.digest
    del r
    size = store.snapshot_size(ident, ctx)
    buf = np.ones(size, dtype=np.uint8)  # resident before the clock starts
    cpu = cpu_sample()
    t = time.perf_counter()
    h = store.restore_into(ident, ctx, buf)
    ms = (time.perf_counter() - t) * 1000
    info = cpu_record(cpu, ms / 1000)
    if not h or h.digest != digest:
        raise SystemExit(f"restore_into: {h}")
    if h.address != buf.ctypes.data:
        raise SystemExit("restore_into wrote somewhere else")
    info["first_restore_ms"] = first_ms
    print(json.dumps({"times_ms": [ms], "info": info,
                      "rss_start": rss_start, "peak": proc_status("VmHWM")}))


def machine_busy_jiffies():
    """Busy jiffies of all CPUs (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v[i] for i in (0, 1, 2, 5, 6, 7) if i < len(v))


def cpu_sample():
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, machine_busy_jiffies()


def cpu_record(start, wall):
    """`cpu_ms` of this process and `others_cores` (cores other processes
    kept busy) over a section, as `deltapack bench` records them."""
    own0, busy0 = start
    own1, busy1 = cpu_sample()
    own = own1 - own0
    busy = (busy1 - busy0) / 100.0  # USER_HZ
    cores = os.cpu_count() or 1
    others = min(max((busy - own) / wall, 0.0), cores) if wall > 0 else 0.0
    return {"cpu_ms": own * 1000, "others_cores": others}


def proc_status(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def busy_cores(window=1.0):
    """Cores kept busy by the whole machine over `window` seconds."""

    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + v[4]
        return sum(v) - idle, sum(v)

    b0, t0 = sample()
    time.sleep(window)
    b1, t1 = sample()
    cores = os.cpu_count() or 1
    return (b1 - b0) / max(t1 - t0, 1) * cores


def wait_idle(limit):
    """Waits up to `limit` seconds for the machine to be idle (< 0.3 busy cores)."""
    deadline = time.time() + limit
    load = busy_cores()
    while load > 0.3 and time.time() < deadline:
        load = busy_cores()
    return load


def run_rust(bench, store_dir, n):
    job = {
        "job": "restore",
        "w": {"base_tokens": BASE_TOKENS, "result_tokens": n, "extent_bytes": EXTENT},
        "format": "v2",
        "source": {"kind": "warm", "dir": str(store_dir)},
        "into": True,
    }
    p = subprocess.run([str(bench), "bench-one", "--job", json.dumps(job)],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"bench-one failed: {p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_python(store_dir, ctx, pages):
    p = subprocess.run([sys.executable, __file__, "--child", str(store_dir), ctx, pages],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"python child failed: {p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--work", type=Path, help="where the store lives (kept; default: a temp dir, removed)")
    ap.add_argument("--bench", type=Path, default=ROOT / "target" / "release" / "deltapack-bench",
                    help="the deltapack-bench binary (cargo build --release -p deltapack-bench)")
    ap.add_argument("--out", type=Path, default=ROOT / "benches" / "results" / "python")
    ap.add_argument("--wait-idle", type=float, default=30.0,
                    help="before each child, wait up to this many seconds for an idle machine")
    ap.add_argument("--child", nargs=3, metavar=("STORE", "CONTEXT", "PAGES"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(Path(a.child[0]), a.child[1], a.child[2])
    if not a.bench.exists():
        raise SystemExit(f"{a.bench} missing: cargo build --release -p deltapack-bench")

    import deltapack

    n = result_tokens(a.scale)
    tmp = None
    if a.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="deltapack-py-bench-")
        a.work = Path(tmp.name)
    store_dir = a.work / "store"
    size, ctx = prepare(store_dir, n)

    t = time.perf_counter()
    identity().context(_tokens(n))
    hash_ms = (time.perf_counter() - t) * 1000

    kinds = ["rust", "python", "python-hugepages"]
    runs = {k: [] for k in kinds}
    loads = []
    for i in range(a.rounds):
        order = kinds[i % 3:] + kinds[: i % 3]  # rotate who goes first
        for who in order:
            loads.append(wait_idle(a.wait_idle) if a.wait_idle > 0 else None)
            if who == "rust":
                out = run_rust(a.bench, store_dir, n)
            else:
                out = run_python(store_dir, ctx, "huge" if who == "python-hugepages" else "4k")
            runs[who].append(out)
            print(f"round {i + 1} {who:>16}: {out['times_ms'][0]:8.1f} ms "
                  f"(peak {(out['peak'] - out['rss_start']) / 2**20:,.0f} MiB over start)", flush=True)

    def quiet(r):
        return r.get("info", {}).get("others_cores", 9.0) < QUIET

    med_all = {k: statistics.median(r["times_ms"][0] for r in v) for k, v in runs.items()}
    quiet_runs = {k: [r for r in v if quiet(r)] for k, v in runs.items()}
    enough = all(len(v) >= 3 for v in quiet_runs.values())
    med = (
        {k: statistics.median(r["times_ms"][0] for r in v) for k, v in quiet_runs.items()}
        if enough
        else med_all
    )
    cpu = {k: statistics.median(r["info"]["cpu_ms"] for r in v) for k, v in runs.items()}
    ratio = med["python"] / med["rust"]
    ratio_huge = med["python-hugepages"] / med["rust"]
    ratio_all = med_all["python"] / med_all["rust"]
    report = {
        "what": "restore_into of the reference delta, warm local store, resident buffer; "
                "fresh process per measurement, Rust (deltapack-bench bench-one) and Python alternating",
        "result_tokens": n,
        "base_tokens": BASE_TOKENS,
        "result_bytes": size,
        "rounds": a.rounds,
        "median_ms": med,
        "median_ms_basis": f"measurements with others_cores < {QUIET}" if enough else "all measurements (too few quiet ones)",
        "quiet_measurements": {k: len(v) for k, v in quiet_runs.items()},
        "median_ms_all": med_all,
        "ratio_all_measurements": ratio_all,
        "median_cpu_ms": cpu,
        "ratio_python_over_rust": ratio,
        "ratio_python_hugepage_buffer_over_rust": ratio_huge,
        "note": "python: numpy buffer with numpy's huge-page madvise off (4 KiB pages, like the Rust "
                "bench's Vec); python-hugepages: numpy's default (transparent huge pages on this "
                "machine's 'madvise' setting)",
        "target": "<= 1.05",
        "met": ratio <= 1.05,
        "context_hash_ms_262k_tokens": hash_ms,
        "deltapack_version": deltapack.__version__,
        "python": platform.python_version(),
        "machine": {"cores": os.cpu_count(), "kernel": platform.release()},
        "busy_cores_before_children": loads,
        "runs": runs,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "restore_into.json").write_text(json.dumps(report, indent=2) + "\n")
    def cell(r):
        return f"{r['times_ms'][0]:.1f} ({r['info']['others_cores']:.2f})"

    rows = "\n".join(
        f"| {i + 1} | " + " | ".join(cell(runs[k][i]) for k in kinds) + " |"
        for i in range(a.rounds)
    )
    basis = (
        f"medians over the quiet measurements (other processes busy < {QUIET} cores during "
        f"the timed call; {', '.join(f'{k}: {len(v)}' for k, v in quiet_runs.items())} of {a.rounds})"
        if enough
        else "medians over all measurements (fewer than 3 quiet ones per kind)"
    )
    peak = statistics.median((r["peak"] - r["rss_start"]) / 2**20 for r in runs["python"])
    peak_rust = statistics.median((r["peak"] - r["rss_start"]) / 2**20 for r in runs["rust"])
    md = f"""# restore_into from Python vs. Rust — reference workload

`python crates/deltapack-python/bench/restore_into.py --rounds {a.rounds} --scale {a.scale}` on {report['date']}
(release wheel, Python {report['python']}, {report['machine']['cores']} cores).

Workload: the macro benchmark's reference delta (base {BASE_TOKENS:,} tokens, result {n:,} tokens,
{size:,}-byte result), warm local store. Each figure is one fresh process: an untimed
restore, then a timed `restore_into` into a resident buffer (Rust: `deltapack-bench bench-one`'s
restore job with `into: true`; Python: `Store.restore_into` into a touched numpy array).
The three kinds of child alternate (who goes first rotates each round).

The buffer's page size matters: numpy `madvise`s large arrays for transparent
huge pages, and this machine's THP setting is `madvise`, so a default numpy
array is backed by 2 MiB pages while the Rust bench's `Vec` gets 4 KiB pages.
The like-for-like comparison (the target's) turns numpy's madvise off.

The machine is shared: every measurement records how many cores other
processes kept busy during the timed call (in parentheses below). Figures are
{basis}; over all measurements Rust {med_all['rust']:.1f} ms, Python
{med_all['python']:.1f} ms ({ratio_all:.3f}×). CPU time of the call (all threads),
median: Rust {cpu['rust']:.0f} ms, Python {cpu['python']:.0f} ms, Python with huge pages
{cpu['python-hugepages']:.0f} ms.

| | median |
|---|---:|
| Rust `Store::restore_into` (`Vec` buffer, 4 KiB pages) | {med['rust']:.1f} ms |
| Python `deltapack.Store.restore_into` (numpy buffer, 4 KiB pages) | {med['python']:.1f} ms |
| **ratio Python / Rust, like for like** | **{ratio:.3f}** (target ≤ 1.05: {'met' if ratio <= 1.05 else 'NOT met'}) |
| Python, numpy's default buffer (huge pages) | {med['python-hugepages']:.1f} ms ({ratio_huge:.3f}× Rust) |

Peak RSS over the process start (buffer included), median: Python {peak:,.0f} MiB,
Rust {peak_rust:,.0f} MiB.
Context digest of the {n:,} token ids (not in the timed call; a connector has it from
`lookup`): {hash_ms:.1f} ms.

| round | Rust ms (others' cores) | Python ms, 4 KiB pages | Python ms, huge pages |
|---:|---:|---:|---:|
{rows}
"""
    (a.out / "restore_into.md").write_text(md)
    print(md)
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""publish_turn from Python vs. from Rust: one more turn of a long conversation.

    cargo build --release -p deltapack-bench
    pip install ./crates/deltapack-python numpy        # a release build
    python crates/deltapack-python/bench/publish_turn.py [--tokens 262144] [--turns 256,2048]

Both sides publish the same shape of work on a local store: a conversation
of ``--tokens`` tokens (``default`` synth preset) published flat, then one
more turn of each size in ``--turns``, ``--repeats`` times, each time new
page bytes and a new context, warm (from the previous turn's handle), with
only the new pages given:

* **Rust**: a ``deltapack-bench turn --modes tail`` child (its "warm
  tail-only" row: ``Store::publish_turn`` from the ``Turn`` the flat
  publication returned);
* **Python**: a child running this script's ``--child`` mode:
  ``Store.publish_turn(identity, tokens, turn, tail)`` with the tail a numpy
  array (no copy), timed around the call. The child also records the
  growth of its peak resident memory over each call (``VmHWM`` after
  resetting it), against the target of 2 x the turn's bytes + 32 MiB.

Rust and Python children alternate (``--pairs`` times, the order flipping
every pair), so the drift of a shared machine hits both alike; the median
over all samples of each side and their ratio are reported (target: Python
<= 1.1 x Rust), with every sample, in ``--out`` (default
benches/results/turn/python.json and python.md). Not a CI step (a
262,144-token conversation is 1.6 GB); the CI runs the pytest suite, whose
``test_turns.py`` checks the memory bound at a smaller scale.
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
MiB = 1 << 20


def proc_status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def child(args):
    """Publishes the conversation and its turns; prints one JSON line."""
    import numpy as np

    import deltapack

    ident = deltapack.CacheIdentity.example()
    store = deltapack.Store(f"file://{args.dir}")
    n = args.tokens
    base, ids = deltapack.synth(n, "default", 29)
    base_ids = np.asarray(ids[:n], dtype=np.uint32)
    turn = store.publish(ident, base_ids, base)["turn"]
    del base
    rng = np.random.default_rng(7)
    out = {}
    for t in args.turns:
        tail_len = turn.tail_len(n + t)
        times, growth = [], []
        # One untimed turn first: the writer's staging buffers are resident.
        for rep in range(args.repeats + 1):
            toks = np.concatenate([base_ids, rng.integers(0, 2**31, t, dtype=np.uint32)])
            tail = rng.integers(0, 256, tail_len, dtype=np.uint8)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            before = proc_status("VmRSS")
            started = time.perf_counter()
            r = store.publish_turn(ident, toks, turn, tail)
            took = time.perf_counter() - started
            peak = proc_status("VmHWM") - before
            if r["outcome"] != "created":
                raise SystemExit(f"publish_turn: outcome {r['outcome']}")
            if rep:
                times.append(took * 1e3)
                growth.append(peak)
        out[str(t)] = {"times_ms": times, "rss_growth": growth, "tail_bytes": tail_len}
    print(json.dumps(out))


def run_python(args, tmp):
    d = Path(tmp) / f"py-{time.monotonic_ns()}"
    cmd = [
        sys.executable, __file__, "--child", "--dir", str(d), "--tokens", str(args.tokens),
        "--turns", ",".join(map(str, args.turns)), "--repeats", str(args.repeats),
    ]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(text.strip().splitlines()[-1])


def run_rust(args, tmp):
    out = Path(tmp) / f"rs-{time.monotonic_ns()}"
    cmd = [
        str(args.bench), "turn", "--modes", "tail", "--tokens", str(args.tokens),
        "--turns", ",".join(map(str, args.turns)), "--repeats", str(args.repeats),
        "--dir", tmp, "--out", str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = json.loads((out / "results.json").read_text())["rows"]
    return {str(r["turn_tokens"]): r["median_ms"] for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=262_144)
    ap.add_argument("--turns", type=lambda s: [int(x) for x in s.split(",")], default=[256, 2048])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--bench", type=Path, default=ROOT / "target/release/deltapack-bench")
    ap.add_argument("--out", type=Path, default=ROOT / "benches/results/turn")
    ap.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not args.bench.is_file():
        raise SystemExit(f"{args.bench}: build it with `cargo build --release -p deltapack-bench`")
    rust = {str(t): [] for t in args.turns}
    py = {str(t): {"times_ms": [], "rss_growth": [], "tail_bytes": 0} for t in args.turns}
    with tempfile.TemporaryDirectory(prefix="deltapack-turn-py-") as tmp:
        for i in range(args.pairs):
            order = ("rust", "python") if i % 2 == 0 else ("python", "rust")
            for side in order:
                if side == "rust":
                    for t, v in run_rust(args, tmp).items():
                        rust[t].append(v)
                else:
                    for t, v in run_python(args, tmp).items():
                        py[t]["times_ms"] += v["times_ms"]
                        py[t]["rss_growth"] += v["rss_growth"]
                        py[t]["tail_bytes"] = v["tail_bytes"]
                print(f"pair {i + 1}/{args.pairs}: {side} done", file=sys.stderr)
    rows = []
    for t in map(str, args.turns):
        r = statistics.median(rust[t])
        p = statistics.median(py[t]["times_ms"])
        bound = 2 * py[t]["tail_bytes"] + 32 * MiB
        peak = max(py[t]["rss_growth"])
        rows.append({
            "conversation_tokens": args.tokens, "turn_tokens": int(t),
            "rust_median_ms": r, "python_median_ms": p, "ratio": p / r,
            "ratio_met": p <= 1.1 * r,
            "tail_bytes": py[t]["tail_bytes"], "python_peak_rss_growth": peak,
            "rss_bound": bound, "rss_met": peak <= bound,
            "rust_medians_ms": rust[t], "python_times_ms": py[t]["times_ms"],
        })
    result = {
        "machine": platform.platform(), "cpus": os.cpu_count(), "repeats": args.repeats,
        "pairs": args.pairs, "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "python.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        "# publish_turn: Python against Rust",
        "",
        f"Warm tail-only publication of one more turn, local disk, default preset; "
        f"{args.pairs} Rust and {args.pairs} Python child processes alternating, "
        f"{args.repeats} samples each; medians over all samples of a side.",
        "",
        "| conversation | turn | Rust | Python | Python / Rust | target | peak RSS growth | bound |",
        "|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        md.append(
            f"| {r['conversation_tokens']} | {r['turn_tokens']} | {r['rust_median_ms']:.1f} ms "
            f"| {r['python_median_ms']:.1f} ms | {r['ratio']:.2f}× "
            f"| <= 1.1× {'yes' if r['ratio_met'] else '**no**'} "
            f"| {r['python_peak_rss_growth'] / MiB:.1f} MiB "
            f"| {r['rss_bound'] / MiB:.1f} MiB {'yes' if r['rss_met'] else '**no**'} |"
        )
    (args.out / "python.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()

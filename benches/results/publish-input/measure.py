#!/usr/bin/env python3
"""Before/after of the CLI's publish from a file (issue 54): the reference
snapshot (262,144 tokens of the default preset, ~1.55 GB) published flat
with `--snapshot`, and one more turn (256 tokens) with `--tail` over it.

Usage: measure.py OLD_CLI NEW_CLI WORKDIR [ROUNDS]

Each round runs old then new (then new then old in the next round) into
fresh local stores on the same disk; the input files are in the page cache
for both (each is read once before the first round). The flat publication
is timed in those rounds; the turn is timed apart, 3 x ROUNDS times per
binary, each on a copy of a store holding the base (objects hard-linked,
the ledger copied), so no turn runs while the previous round's 1.55 GB is
still being written back. Prints and writes
`results.md` and `results.json` next to this script: medians of wall time
(the CLI process from start to exit) and of the receipt's `total_ms`.
Needs the `deltapack` Python package (to cut the turn's tail).
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TOKENS = 262_144
NEXT = TOKENS + 256


def run(cli, *args):
    t = time.perf_counter()
    p = subprocess.run([cli, *map(str, args)], capture_output=True, text=True)
    wall = (time.perf_counter() - t) * 1000
    if p.returncode != 0:
        raise SystemExit(f"{cli} {' '.join(map(str, args))}: exit {p.returncode}\n{p.stderr}")
    return wall, json.loads(p.stdout)


def main():
    old, new, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    work.mkdir(parents=True, exist_ok=True)
    ref, ref_tok = work / "ref.snap", work / "ref.tok"
    nxt_tok, tail = work / "next.tok", work / "next.tail"
    ident = work / "id.json"
    if not ident.exists():
        ident.write_text(subprocess.run([new, "identity", "--example"], capture_output=True, text=True, check=True).stdout)
    if not ref.exists():
        subprocess.run([new, "synth", "--preset", "default", "--tokens", str(TOKENS), "--seed", "1",
                        "--out", ref, "--tokens-out", ref_tok], check=True)
    if not tail.exists():
        import numpy as np

        import deltapack

        full, ids = deltapack.synth(NEXT, "default", 1)
        np.asarray(ids, dtype="<u4").tofile(nxt_tok)
        scratch = deltapack.Store(f"file://{work / 'scratch'}")
        snap, base_ids = deltapack.synth(TOKENS, "default", 1)
        turn = scratch.publish(deltapack.CacheIdentity.from_json(ident.read_text()), base_ids, snap)["turn"]
        tail.write_bytes(turn.tail_of(full))
        del full, snap, scratch
        shutil.rmtree(work / "scratch", ignore_errors=True)
    for f in (ref, ref_tok, tail, nxt_tok):
        f.read_bytes()  # into the page cache

    rows = {"old": {"flat_wall": [], "flat_total": [], "tail_wall": [], "tail_total": []},
            "new": {"flat_wall": [], "flat_total": [], "tail_wall": [], "tail_total": []}}
    for r in range(rounds):
        order = [("old", old), ("new", new)] if r % 2 == 0 else [("new", new), ("old", old)]
        for name, cli in order:
            store = work / f"store-{name}"
            shutil.rmtree(store, ignore_errors=True)
            wall, rec = run(cli, "publish", "--store", f"file://{store}", "--identity", ident,
                            "--tokens", ref_tok, "--snapshot", ref, "--json")
            rows[name]["flat_wall"].append(wall)
            rows[name]["flat_total"].append(rec["total_ms"])
            shutil.rmtree(store, ignore_errors=True)
    # The turn, on copies of a store that holds the base.
    bases = {}
    for name, cli in (("old", old), ("new", new)):
        bases[name] = work / f"base-{name}"
        shutil.rmtree(bases[name], ignore_errors=True)
        run(cli, "publish", "--store", f"file://{bases[name]}", "--identity", ident,
            "--tokens", ref_tok, "--snapshot", ref, "--json")
    subprocess.run(["sync"], check=True)
    for r in range(3 * rounds):
        order = [("old", old), ("new", new)] if r % 2 == 0 else [("new", new), ("old", old)]
        for name, cli in order:
            store = work / f"turn-{name}"
            shutil.rmtree(store, ignore_errors=True)
            subprocess.run(["cp", "-al", bases[name], store], check=True)
            shutil.rmtree(store / "ledger")
            shutil.copytree(bases[name] / "ledger", store / "ledger")
            wall, rec = run(cli, "publish", "--store", f"file://{store}", "--identity", ident,
                            "--tokens", nxt_tok, "--tail", tail, "--base-snapshot", ref,
                            "--base-tokens", ref_tok, "--json")
            rows[name]["tail_wall"].append(wall)
            rows[name]["tail_total"].append(rec["total_ms"])
            shutil.rmtree(store, ignore_errors=True)
    for b in bases.values():
        shutil.rmtree(b, ignore_errors=True)
    med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in rows.items()}
    lines = [
        "| CLI publish | before (median ms) | after (median ms) | after / before |",
        "|---|---|---|---|",
    ]
    for k, label in [("flat_wall", "`--snapshot` 1.55 GB, process wall"),
                     ("flat_total", "`--snapshot` 1.55 GB, receipt total"),
                     ("tail_wall", "`--tail` 256 tokens, process wall"),
                     ("tail_total", "`--tail` 256 tokens, receipt total")]:
        a, b = med["old"][k], med["new"][k]
        lines.append(f"| {label} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    text = "\n".join(lines)
    print(text)
    here = Path(__file__).resolve().parent
    (here / "results.md").write_text(text + "\n")
    (here / "results.json").write_text(json.dumps({"rounds": rounds, "runs": rows, "medians": med}, indent=2) + "\n")


if __name__ == "__main__":
    main()

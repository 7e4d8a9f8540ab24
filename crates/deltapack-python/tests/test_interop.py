"""The CLI and Python read each other's stores."""

import json

import numpy as np

import deltapack
from conftest import read_json, tokens_file


def test_cli_writes_python_reads(tmp_path, cli, ident, id_file):
    store = f"file://{tmp_path / 'cli-store'}"
    for n in (1024, 2048):
        cli("synth", "--preset", "tiny", "--tokens", n, "--seed", 5,
            "--out", tmp_path / f"t{n}.snap", "--tokens-out", tmp_path / f"t{n}.tok")
    cli("publish", "--store", store, "--identity", id_file, "--tokens", tmp_path / "t1024.tok",
        "--snapshot", tmp_path / "t1024.snap")
    cli("publish", "--store", store, "--identity", id_file, "--tokens", tmp_path / "t2048.tok",
        "--snapshot", tmp_path / "t2048.snap", "--base-snapshot", tmp_path / "t1024.snap",
        "--base-tokens", tmp_path / "t1024.tok")
    want = (tmp_path / "t2048.snap").read_bytes()
    ident2 = deltapack.CacheIdentity.from_json(id_file.read_text())
    assert ident2 == ident
    tokens = (tmp_path / "t2048.tok").read_bytes()  # a token file's bytes are token ids
    s = deltapack.Store(store)
    out = np.empty(s.snapshot_size(ident2, tokens), dtype=np.uint8)
    h = s.restore_into(ident2, tokens, out)
    assert h and out.tobytes() == want
    assert s.restore(ident2, np.fromfile(tmp_path / "t2048.tok", dtype="<u4")).tobytes() == want
    # The same synthetic data from Python.
    snap, ids = deltapack.synth(2048, "tiny", 5)
    assert snap.tobytes() == want and h.digest == snap.digest
    assert np.array_equal(np.fromfile(tmp_path / "t2048.tok", dtype="<u4"), ids)


def test_python_writes_cli_reads(store_url, cli, ident, id_file, tmp_path):
    t1, ids1 = deltapack.synth(1024, "tiny", 6)
    t2, ids2 = deltapack.synth(3072, "tiny", 6)
    s = deltapack.Store(store_url)
    s.publish(ident, ids1, t1)
    receipt = s.publish(ident, ids2, bytearray(t2.tobytes()), base=(ids1, t1))
    tok = tokens_file(tmp_path / "t.tok", ids2)
    out = tmp_path / "out.snap"
    _, text = cli("restore", "--store", store_url, "--identity", id_file, "--tokens", tok,
                  "--out", out, "--json")
    got = read_json(text)
    assert got["outcome"] == "hit" and got["digest"] == receipt["snapshot_digest"] == t2.digest
    assert out.read_bytes() == t2.tobytes()
    _, text = cli("inspect", "--store", store_url, "--json")
    roots = json.loads(text)
    roots = roots["roots"] if isinstance(roots, dict) else roots
    assert len(roots) == 2


def test_identity_matches_the_cli(cli, tmp_path):
    _, text = cli("identity", "--example")
    ident = deltapack.CacheIdentity.from_json(text)
    assert ident.namespace == deltapack.CacheIdentity.example().namespace
    assert deltapack.CacheIdentity.from_json(ident.to_json()) == ident
    kw = deltapack.CacheIdentity(
        json.loads(text)["model_checkpoint"], "bf16", "rope-theta-1e6",
    )
    assert kw == ident

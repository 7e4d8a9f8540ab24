"""Round trips through real stores (local disk and the moto S3 server):
numpy in, numpy/bytearray out, digests checked against the CLI's."""

import asyncio

import numpy as np

import deltapack
from conftest import read_json, tokens_file


def conversation(n_base=2048, n_result=4096):
    base, base_ids = deltapack.synth(n_base, "tiny", 3)
    result, ids = deltapack.synth(n_result, "tiny", 3)
    return base, base_ids, result, ids


def test_flat_and_delta_from_numpy(store_url, ident, id_file, tmp_path, cli):
    base, base_ids, result, ids = conversation()
    # The caller's snapshots live in numpy arrays (not deltapack memory).
    base_np = np.frombuffer(base.tobytes(), dtype=np.uint8).copy()
    result_np = np.frombuffer(result.tobytes(), dtype=np.uint8).copy()
    store = deltapack.Store(store_url, max_extent_bytes=4096)

    flat = store.publish(ident, np.asarray(base_ids, dtype=np.uint32), base_np)
    assert flat["outcome"] == "created" and flat["chain_depth"] == 0
    delta = store.publish(ident, ids, result_np, base=(base_ids, base_np))
    assert delta["outcome"] == "created"
    assert delta["chain_depth"] == 1 and not delta["rebased"]
    assert delta["payload_len"] < result.nbytes  # a delta, not the whole result
    assert delta["objects_written"] >= 2  # several extents
    # Publishing the same snapshot again is idempotent.
    assert store.publish(ident, ids, result_np, base=(base_ids, base_np))["outcome"] == "already-present"

    want = result.tobytes()
    digest = result.digest
    assert delta["snapshot_digest"] == digest

    r = store.restore(ident, ids)
    assert isinstance(r, deltapack.Restored) and r
    assert r.digest == digest and r.boundary == 4096 and bytes(r) == want
    assert np.asarray(r).tobytes() == want
    assert r.memoryview().tobytes() == want

    n = store.snapshot_size(ident, ids)
    assert n == len(want)
    arr = np.empty(n, dtype=np.uint8)
    h = store.restore_into(ident, ids, arr)
    assert isinstance(h, deltapack.Hit) and h.digest == digest and h.nbytes == n
    assert arr.tobytes() == want
    ba = bytearray(n)
    h2 = store.restore_into(ident, ids, ba)
    assert h2 == h and bytes(ba) == want
    # A wider dtype works too: the buffer is bytes to deltapack.
    f16 = np.empty(n // 2, dtype=np.float16) if n % 2 == 0 else None
    if f16 is not None:
        assert store.restore_into(ident, ids, f16)
        assert f16.tobytes() == want

    # The base restores too, and the CLI reads the same bytes and digest.
    assert store.restore(ident, base_ids).digest == base.digest
    tok = tokens_file(tmp_path / "t.tok", ids)
    out = tmp_path / "cli.snap"
    code, text = cli("restore", "--store", store_url, "--identity", id_file, "--tokens", tok, "--out", out, "--json")
    assert read_json(text)["digest"] == digest == h.digest
    assert out.read_bytes() == want


def test_lookup_and_async(store_url, ident):
    base, base_ids, result, ids = conversation()
    store = deltapack.Store(store_url)

    async def main():
        await store.publish_async(ident, base_ids, base)
        await store.publish_async(ident, ids, result, base=(base_ids, base))
        # A longer request finds the longest stored prefix.
        longer = list(ids) + [7] * 1000
        hit = await store.lookup_async(ident, longer)
        assert hit == deltapack.Lookup(4096, ident.context(ids), "ledger")
        assert store.lookup(ident, list(base_ids) + [1] * 10) == (2048, ident.context(base_ids), "ledger")
        assert await store.lookup_async(ident, [5] * 1024) is None
        n = await store.snapshot_size_async(ident, hit.context)
        out = np.zeros(n, dtype=np.uint8)
        r = await store.restore_into_async(ident, hit.context, out)
        assert r and out.tobytes() == result.tobytes()
        rr = await store.restore_async(ident, hit.context)
        assert rr.digest == result.digest
        assert await store.snapshot_size_async(ident, [1] * 256) is None

    asyncio.run(asyncio.wait_for(main(), 120))


def test_restored_is_a_zero_copy_base(store_url, ident):
    """A Restored snapshot serves as the next turn's base (no copy)."""
    t1, ids1 = deltapack.synth(1024, "tiny", 9)
    t2, ids2 = deltapack.synth(2048, "tiny", 9)
    t3, ids3 = deltapack.synth(3072, "tiny", 9)
    store = deltapack.Store(store_url)
    store.publish(ident, ids1, t1)
    store.publish(ident, ids2, t2, base=(ids1, t1))
    prev = store.restore(ident, ids2)
    receipt = store.publish(ident, ids3, t3, base=(ids2, prev))
    assert receipt["chain_depth"] == 2
    assert bytes(store.restore(ident, ids3)) == t3.tobytes()

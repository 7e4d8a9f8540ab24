"""Turn publication from Python: a conversation published turn by turn with
``publish_turn`` from numpy tails, hashing and holding only the new pages;
every turn restores bit-exactly, also through the CLI."""

import json
import sys

import numpy as np
import pytest

import deltapack
from conftest import proc_status, tokens_file

MiB = 1 << 20


def test_a_conversation_turn_by_turn_from_numpy_tails(tmp_path, ident, id_file, cli):
    url = f"file://{tmp_path / 's'}"
    store = deltapack.Store(url)
    first, ids = deltapack.synth(1024, "tiny", 7)
    receipt = store.publish(ident, ids[:1024], first)
    assert receipt["schema"] == "deltapack-page-delta-manifest/v2.2"
    turn = receipt["turn"]
    assert isinstance(turn, deltapack.Turn) and turn.boundary == 1024
    assert turn.digest == receipt["snapshot_digest"] == first.digest
    for tokens in (1536, 2048, 3072):
        full, all_ids = deltapack.synth(tokens, "tiny", 7)
        tail = np.frombuffer(turn.tail_of(full), dtype=np.uint8).copy()
        assert tail.nbytes == turn.tail_len(tokens) < full.nbytes
        r = store.publish_turn(ident, all_ids[:tokens], turn, tail)
        assert r["outcome"] == "created" and r["schema"] == "deltapack-page-delta-manifest/v2.2"
        assert r["snapshot_digest"] == full.digest
        turn = r["turn"]
        assert turn.boundary == tokens
        got = store.restore(ident, all_ids[:tokens])
        assert got and bytes(got) == full.tobytes() and got.digest == full.digest
    # The CLI restores what Python published (and agrees on the digest).
    tok = tokens_file(tmp_path / "tokens.u32", all_ids[:3072])
    out = tmp_path / "restored.snapshot"
    _, text = cli("restore", "--store", url, "--identity", id_file, "--tokens", tok, "--out", out, "--json")
    assert json.loads(text)["digest"] == full.digest
    assert out.read_bytes() == full.tobytes()
    # ... and Python restores what the CLI published on top of it.
    nxt, nxt_ids = deltapack.synth(3584, "tiny", 7)
    snap_file = tmp_path / "t5.snap"
    snap_file.write_bytes(nxt.tobytes())
    tok5 = tokens_file(tmp_path / "t5.u32", nxt_ids[:3584])
    cli(
        "publish", "--store", url, "--identity", id_file, "--tokens", tok5, "--snapshot", snap_file,
        "--base-snapshot", out, "--base-tokens", tok,
    )
    assert bytes(store.restore(ident, nxt_ids[:3584])) == nxt.tobytes()
    # A turn handle from a restore continues the conversation.
    again = store.restore(ident, all_ids[:3072])
    t2 = store.turn_from(ident, all_ids[:3072], again)
    assert t2.digest == turn.digest and t2.boundary == 3072
    # A fresh handle (as a new process would be) restores the turn and
    # continues it: the root's recorded turn state is proven with about a
    # page per layer, the turn itself is not hashed.
    fresh = deltapack.Store(url)
    restored = fresh.restore(ident, all_ids[:3072])
    before = fresh.stats()["process"]["snapshot_bytes_hashed"]
    t3 = fresh.turn_from(ident, all_ids[:3072], restored)
    hashed = fresh.stats()["process"]["snapshot_bytes_hashed"] - before
    assert t3.digest == turn.digest
    assert 0 < hashed < len(bytes(restored)) // 4, hashed
    nxt4, ids4 = deltapack.synth(3328, "tiny", 7)
    r = fresh.publish_turn(ident, ids4[:3328], t3, t3.tail_of(nxt4))
    assert r["snapshot_digest"] == nxt4.digest
    assert bytes(deltapack.Store(url).restore(ident, ids4[:3328])) == nxt4.tobytes()


def test_bad_tails_are_bad_input_and_write_nothing(tmp_path, ident):
    store = deltapack.Store(f"file://{tmp_path / 's'}")
    first, ids = deltapack.synth(1024, "tiny", 8)
    turn = store.publish(ident, ids[:1024], first)["turn"]
    full, all_ids = deltapack.synth(1536, "tiny", 8)
    tail = turn.tail_of(full)
    with pytest.raises(deltapack.BadInput):
        store.publish_turn(ident, all_ids[:1536], turn, tail[1:])
    with pytest.raises(deltapack.BadInput):
        store.publish_turn(ident, all_ids[:1024], turn, tail)
    import json as _json

    fields = _json.loads(ident.to_json())
    fields["salt"] = "another deployment"
    other = deltapack.CacheIdentity.from_json(_json.dumps(fields))
    assert other.namespace != ident.namespace
    with pytest.raises(deltapack.BadInput):
        store.publish_turn(other, all_ids[:1536], turn, tail)
    assert not store.restore(ident, all_ids[:1536])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_publish_turn_holds_only_the_turn(tmp_path, ident):
    """A 2,048-token turn on a 32,768-token conversation (~200 MB): the
    process's peak memory grows by at most twice the turn's bytes + 32 MiB
    (no copy of the conversation), and only the turn is hashed."""
    store = deltapack.Store(f"file://{tmp_path / 's'}")
    base, ids = deltapack.synth(32768, "default", 9)
    turn = store.publish(ident, ids[:32768], base)["turn"]
    full, all_ids = deltapack.synth(34816, "default", 9)
    tail = np.frombuffer(turn.tail_of(full), dtype=np.uint8).copy()
    want = full.digest
    del full, base
    # A warm-up turn of the same size elsewhere: the writer's staging
    # buffers are resident before the measurement.
    warm = store.publish(ident, ids[:32768], deltapack.synth(32768, "default", 9)[0])["turn"]
    assert warm.digest == turn.digest
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = proc_status("VmRSS")
    r = store.publish_turn(ident, all_ids[:34816], turn, tail)
    growth = proc_status("VmHWM") - before
    assert r["snapshot_digest"] == want
    assert growth <= 2 * tail.nbytes + 32 * MiB, (
        f"publish_turn grew RSS by {growth / MiB:.1f} MiB for a {tail.nbytes / MiB:.1f} MiB turn"
    )

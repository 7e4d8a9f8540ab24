"""Layer-wise restore: Store.restore_layers_into hands out each (group,
layer) as soon as its bytes are proven, then the restore_into outcome."""

import asyncio
import gc
import time
import weakref

import numpy as np
import pytest

import deltapack
from conftest import progress_while_waiting, tokens_file

EXTENT = 256 * 1024


def published(tmp_path, ident, tokens=1024, seed=31):
    """A 28-layer snapshot (default preset: 24 attention layers in group 0,
    4 recurrent ones in group 1, ~9 MiB) published flat in 256 KiB extents."""
    snap, ids = deltapack.synth(tokens, "default", seed)
    root = tmp_path / "store"
    store = deltapack.Store(f"file://{root}", max_extent_bytes=EXTENT)
    store.publish(ident, ids, snap)
    return store, root, snap, ids


def drain(it):
    """All items of a LayerIterator: (layers, final item); checks the end."""
    items = list(it)
    assert items, "no final item"
    *layers, final = items
    assert all(isinstance(x, deltapack.Layer) for x in layers), layers
    assert isinstance(final, (deltapack.Hit, deltapack.Miss)), final
    with pytest.raises(StopIteration):
        next(it)
    return layers, final


def names(layers):
    return [(x.group, x.layer) for x in layers]


def check_layers(layers, buf, snap):
    """Every layer is where the layout says and holds the published bytes."""
    enc = snap.tobytes()
    flat = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
    by_name = {(li.group, li.layer): li for li in snap.layout().layers}
    for x in layers:
        li = by_name[(x.group, x.layer)]
        assert (x.start, x.end) == (li.offset, li.offset + li.pages * li.page_bytes), x
        assert flat[x.start : x.end].tobytes() == enc[x.start : x.end], x
    assert len(set(names(layers))) == len(layers), "a layer was handed out twice"


def mean_position(order, which):
    pos = [i for i, n in enumerate(order) if n in which]
    return sum(pos) / len(pos)


def test_every_layer_is_the_published_bytes_then_a_hit(tmp_path, ident):
    store, _, snap, ids = published(tmp_path, ident)
    buf = np.full(snap.nbytes, 0xAB, dtype=np.uint8)
    it = store.restore_layers_into(ident, ids, buf)
    assert isinstance(it, deltapack.LayerIterator)
    assert iter(it) is it
    layers, final = drain(it)
    layout = snap.layout()
    assert sorted(names(layers)) == sorted((li.group, li.layer) for li in layout.layers)
    check_layers(layers, buf, snap)
    assert {x.proof for x in layers} == {"stream-digest"}
    assert [x.stream for x in layers] == [
        [(li.group, li.layer) for li in layout.layers].index(n) for n in names(layers)
    ]
    # The final item is what restore_into returns.
    assert isinstance(final, deltapack.Hit) and final
    assert final.digest == snap.digest and final.nbytes == snap.nbytes
    assert final.address == buf.ctypes.data
    assert buf.tobytes() == snap.tobytes()
    assert final == store.restore_into(ident, ids, np.empty_like(buf))
    r = repr(layers[0])
    assert r.startswith("Layer(group=") and "proof='stream-digest'" in r, r


def test_layer_major_group_major_and_a_custom_order(tmp_path, ident):
    store, _, snap, ids = published(tmp_path, ident)
    everything = sorted((li.group, li.layer) for li in snap.layout().layers)
    group1 = {n for n in everything if n[0] == 1}
    seen = {}
    for order in (None, "layer-major", "group-major"):
        buf = np.zeros(snap.nbytes, dtype=np.uint8)
        layers, final = drain(store.restore_layers_into(ident, ids, buf, order=order))
        assert final, final
        assert sorted(names(layers)) == everything  # each layer exactly once
        check_layers(layers, buf, snap)
        seen[order] = names(layers)
    # Several reader threads hand out layers ready at about the same time in
    # either order, so only where most of them come out is compared:
    # layer-major gives the recurrent group's layers 0-3 among the first
    # (each right after attention layer k), group-major at the very end.
    assert mean_position(seen["layer-major"], group1) < 12 < mean_position(seen["group-major"], group1)
    assert mean_position(seen[None], group1) < 12

    custom = [(1, 3), (0, 23), (1, 0), (0, 5)]
    buf = bytearray(snap.nbytes)
    layers, final = drain(store.restore_layers_into(ident, ids, buf, order=custom))
    assert final, final
    assert sorted(names(layers)) == everything
    check_layers(layers, buf, snap)
    rest = set(everything) - set(custom)
    assert mean_position(names(layers), set(custom)) < mean_position(names(layers), rest)
    assert bytes(buf) == snap.tobytes()
    # Tuples, lists and any iterable of pairs are orders.
    layers, final = drain(store.restore_layers_into(ident, ids, buf, order=iter([[0, 1]])))
    assert final and sorted(names(layers)) == everything


def test_a_legacy_root_hands_out_every_layer_after_the_whole_snapshot(tmp_path, cli, ident, id_file):
    """A root without per-layer digests (a legacy v1 root, published by the
    CLI) is verified whole first, then every layer is handed out in exactly
    the order asked (`whole-snapshot`)."""
    snap_file, tok_file = tmp_path / "t.snap", tmp_path / "t.tok"
    cli("synth", "--preset", "tiny", "--tokens", 2048, "--seed", 8,
        "--out", snap_file, "--tokens-out", tok_file)
    url = f"file://{tmp_path / 'store'}"
    cli("publish", "--store", url, "--identity", id_file, "--tokens", tok_file,
        "--snapshot", snap_file, "--format", "v1")
    want = snap_file.read_bytes()
    tokens = tok_file.read_bytes()
    store = deltapack.Store(url)
    snap, _ = deltapack.synth(2048, "tiny", 8)
    assert snap.tobytes() == want
    for order, expect in (
        (None, [(0, 0), (1, 0), (0, 1)]),
        ("group-major", [(0, 0), (0, 1), (1, 0)]),
        ([(1, 0)], [(1, 0), (0, 0), (0, 1)]),
    ):
        buf = bytearray(len(want))
        layers, final = drain(store.restore_layers_into(ident, tokens, buf, order=order))
        assert final and bytes(buf) == want, final
        assert names(layers) == expect, (order, layers)
        assert {x.proof for x in layers} == {"whole-snapshot"}
        check_layers(layers, buf, snap)


def test_the_async_iterator_gives_the_same(tmp_path, ident):
    store, _, snap, ids = published(tmp_path, ident)
    sync_buf = np.zeros(snap.nbytes, dtype=np.uint8)
    sync_layers, sync_final = drain(store.restore_layers_into(ident, ids, sync_buf))

    async def main():
        buf = np.zeros(snap.nbytes, dtype=np.uint8)
        ticks = [0]
        stop = asyncio.Event()

        async def ticker():
            while not stop.is_set():
                ticks[0] += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(ticker())
        items = []
        it = store.restore_layers_into(ident, ids, buf)
        assert it.__aiter__() is it
        async for x in it:
            items.append(x)
        with pytest.raises(StopAsyncIteration):
            await it.__anext__()
        stop.set()
        await t
        return buf, items, ticks[0]

    buf, items, ticks = asyncio.run(main())
    *layers, final = items
    assert all(isinstance(x, deltapack.Layer) for x in layers)
    assert isinstance(final, deltapack.Hit) and final == sync_final
    assert final.address == buf.ctypes.data
    key = lambda x: (x.group, x.layer, x.stream, x.start, x.end, x.proof)  # noqa: E731
    assert sorted(map(key, layers)) == sorted(map(key, sync_layers))
    check_layers(layers, buf, snap)
    assert buf.tobytes() == snap.tobytes()
    assert ticks > 0  # the event loop ran while the restore did


def test_a_damaged_layer_is_never_handed_out(tmp_path, ident):
    store, root, snap, ids = published(tmp_path, ident)
    enc = snap.tobytes()
    victim_layer = next(li for li in snap.layout().layers if (li.group, li.layer) == (0, 12))
    middle = victim_layer.offset + victim_layer.pages * victim_layer.page_bytes // 2
    # Object files hold raw extent bytes (no compression by default): the
    # one holding the layer's middle is extent middle // EXTENT.
    k = middle // EXTENT
    extent = enc[k * EXTENT : (k + 1) * EXTENT]
    objects = [p for p in (root / "objects").rglob("*") if p.is_file()]
    matches = [p for p in objects if p.read_bytes() == extent]
    assert len(matches) == 1, f"{len(matches)} objects hold extent {k}"
    victim = matches[0]
    data = bytearray(victim.read_bytes())
    data[middle - k * EXTENT] ^= 0x01
    victim.chmod(0o644)
    victim.write_bytes(bytes(data))

    buf = np.full(snap.nbytes, 0xAB, dtype=np.uint8)
    layers, final = drain(store.restore_layers_into(ident, ids, buf))
    assert isinstance(final, deltapack.Miss) and not final
    assert final.reason == "corrupt", final
    assert final.object == victim.relative_to(root).as_posix(), final
    assert (0, 12) not in names(layers)
    assert layers, "no layer was handed out before the damaged one"
    check_layers(layers, buf, snap)
    # The layers handed out keep their proven bytes; every other byte of the
    # buffer is zeroed.
    rest = np.ones(snap.nbytes, dtype=bool)
    for x in layers:
        rest[x.start : x.end] = False
    assert not buf[rest].any()


def test_the_gil_is_released_while_waiting_for_a_layer(big, ident):
    url, ids, snap = big
    store = deltapack.Store(url)
    buf = np.empty(snap.nbytes, dtype=np.uint8)

    def restore(now):
        marks = [now()]
        items = []
        for x in store.restore_layers_into(ident, ids, buf):
            items.append(x)
            marks.append(now())
        assert items[-1], items[-1]
        assert len(items) == len(snap.layout().layers) + 1
        return marks[-1] - marks[0]

    progressed = progress_while_waiting(restore)
    assert max(progressed) > 0, f"the counter did not move during any restore: {progressed}"
    assert buf.tobytes() == snap.tobytes()


def test_a_wrong_sized_buffer_raises_what_restore_into_raises(tmp_path, ident):
    store, _, snap, ids = published(tmp_path, ident)
    for n in (snap.nbytes - 1, snap.nbytes + 1, 0):
        out = bytearray(b"\xcd" * n)
        with pytest.raises(deltapack.BadInput, match="buffer is") as into:
            store.restore_into(ident, ids, out)
        it = store.restore_layers_into(ident, ids, out)
        with pytest.raises(deltapack.BadInput, match="buffer is") as layered:
            next(it)
        assert type(layered.value) is type(into.value)
        with pytest.raises(StopIteration):
            next(it)
        assert out == bytearray(b"\xcd" * n)
    # Read-only or non-contiguous memory is refused by the call itself.
    with pytest.raises(deltapack.BadInput):
        store.restore_layers_into(ident, ids, bytes(snap.nbytes))
    wide = np.zeros(snap.nbytes * 2, dtype=np.uint8)
    with pytest.raises(deltapack.BadInput):
        store.restore_layers_into(ident, ids, wide[::2])


def test_a_bad_order_is_refused(tmp_path, ident):
    store, _, snap, ids = published(tmp_path, ident)
    buf = np.full(snap.nbytes, 0xCD, dtype=np.uint8)
    # Refused by the call: not an order, or a layer named twice.
    for bad, match in (
        ("backwards", "order="),
        ([(0, 1), (1, 0), (0, 1)], "named twice"),
        ([(0, -1)], "pairs"),
        ([(0, 1, 2)], "pairs"),
        ([("a", "b")], "pairs"),
        (5, "pairs"),
    ):
        with pytest.raises(deltapack.BadInput, match=match):
            store.restore_layers_into(ident, ids, buf, order=bad)
    # Refused once the root's layout is known: a layer it does not have.
    for bad in ([(0, 24)], [(2, 0)], [(1, 0), (0, 99)]):
        it = store.restore_layers_into(ident, ids, buf, order=bad)
        with pytest.raises(deltapack.BadInput, match="layer order"):
            next(it)
        with pytest.raises(StopIteration):
            next(it)
    assert (buf == 0xCD).all()  # nothing was written
    assert store.restore_into(ident, ids, buf)  # and the buffer is free again


def test_misses_are_the_final_item(tmp_path, ident):
    store, _, snap, ids = published(tmp_path, ident)
    buf = np.full(snap.nbytes, 0xAB, dtype=np.uint8)
    layers, final = drain(store.restore_layers_into(ident, [9] * 256, buf))
    assert layers == [] and final == deltapack.Miss("absent", "")
    assert (buf == 0xAB).all()
    layers, final = drain(store.restore_layers_into(ident, ids, buf, timeout=0))
    assert layers == [] and final.reason == "deadline-exceeded"
    assert (buf == 0xAB).all()


def test_the_buffer_is_held_until_the_restore_ends(big, ident, tmp_path):
    """An iterator dropped after its first layer leaves the restore running:
    the buffer stays alive (even with no other reference to it) and borrowed
    until the restore ends, then is released; a bytearray is resizable
    again once the final item is out."""
    url, ids, snap = big
    store = deltapack.Store(url)
    buf = np.empty(snap.nbytes, dtype=np.uint8)
    ref = weakref.ref(buf)
    it = store.restore_layers_into(ident, ids, buf)
    first = next(it)
    assert isinstance(first, deltapack.Layer)
    del it, buf
    gc.collect()
    deadline = time.monotonic() + 120
    while ref() is not None:
        assert time.monotonic() < deadline, "the buffer was never released"
        time.sleep(0.01)

    small, sids = deltapack.synth(2048, "tiny", 6)
    st = deltapack.Store(f"file://{tmp_path / 'small'}")
    st.publish(ident, sids, small)
    out = bytearray(small.nbytes)
    layers, final = drain(st.restore_layers_into(ident, sids, out))
    assert final and bytes(out) == small.tobytes()
    out.append(0)  # BufferError if the export were still alive


def test_token_files_and_context_digests_name_the_snapshot(tmp_path, ident):
    """`tokens` is taken as by restore_into (here a token file's bytes and
    the context digest)."""
    store, _, snap, ids = published(tmp_path, ident, tokens=512, seed=4)
    tok = tokens_file(tmp_path / "t.tok", ids)
    for tokens in (tok.read_bytes(), ident.context(ids), np.asarray(ids, dtype=np.uint32)):
        buf = np.zeros(snap.nbytes, dtype=np.uint8)
        layers, final = drain(store.restore_layers_into(ident, tokens, buf))
        assert final and buf.tobytes() == snap.tobytes()


def test_local_and_s3_stores(store_url, ident):
    """The same through the object-store backend (the S3 server in CI)."""
    snap, ids = deltapack.synth(512, "default", 32)
    store = deltapack.Store(store_url, max_extent_bytes=EXTENT)
    store.publish(ident, ids, snap)
    buf = np.zeros(snap.nbytes, dtype=np.uint8)
    layers, final = drain(store.restore_layers_into(ident, ids, buf, order="group-major"))
    assert final and final.digest == snap.digest, final
    assert sorted(names(layers)) == sorted((li.group, li.layer) for li in snap.layout().layers)
    check_layers(layers, buf, snap)
    assert buf.tobytes() == snap.tobytes()

"""deltapack.fresh_buffer: a zero-filled, writable Buffer of exactly the
size asked, in deltapack's memory, that every restore taking an ``out``
writes in place (zero copy) and whose memory stays valid as long as any
numpy array or memoryview of it lives, and is freed after the last one;
bad sizes are errors, never a crash."""

import asyncio
import gc
import sys
import weakref

import numpy as np
import pytest

import deltapack
from conftest import proc_status

MiB = 1 << 20


def published(tmp_path, ident, tokens=1024, seed=41):
    """A 28-layer snapshot (~9 MiB, default preset) published flat in a
    local store, in 256 KiB extents (several objects, several layers)."""
    snap, ids = deltapack.synth(tokens, "default", seed)
    store = deltapack.Store(f"file://{tmp_path / 'store'}", max_extent_bytes=256 * 1024)
    store.publish(ident, ids, snap)
    return store, snap, ids


# 33 MiB + 3 is above the size the store advises for huge pages (32 MiB)
# and not a multiple of a page; 4097 straddles a page; 0 and 1 are edges.
@pytest.mark.parametrize("n", [0, 1, 4097, 33 * MiB + 3])
def test_zero_filled_exactly_nbytes_and_writable(n):
    buf = deltapack.fresh_buffer(n)
    assert isinstance(buf, deltapack.Buffer)
    assert len(buf) == buf.nbytes == n
    assert repr(buf) == f"Buffer(nbytes={n})"
    arr = buf.numpy()
    assert arr.dtype == np.uint8 and arr.shape == (n,)
    assert arr.flags.writeable and arr.flags["C_CONTIGUOUS"]
    assert not arr.any()
    mv = buf.memoryview()
    assert not mv.readonly and mv.nbytes == n and mv.format == "B"
    assert bytes(mv) == bytes(n)
    if n == 0:
        return
    assert arr.ctypes.data == buf.address  # a view, not a copy
    assert np.asarray(buf).ctypes.data == buf.address
    ai = buf.__array_interface__
    assert ai["data"] == (buf.address, False) and ai["shape"] == (n,)
    # Written through numpy, seen through the memoryview, and back.
    arr[-1] = 9
    assert mv[-1] == 9
    mv[n // 2] = 5
    assert arr[n // 2] == 5
    via_mv = np.frombuffer(mv, dtype=np.uint8)
    assert via_mv.flags.writeable and via_mv.ctypes.data == buf.address
    arr[:] = 0xA5
    assert (via_mv == 0xA5).all()
    if sys.version_info >= (3, 12):  # the buffer protocol itself (PEP 688)
        assert memoryview(buf)[0] == 0xA5 and not memoryview(buf).readonly


def test_restore_into_writes_the_published_bytes_in_place(big, ident):
    """A large (~259 MiB, advised) fresh buffer as restore_into's out."""
    url, ids, snap = big
    store = deltapack.Store(url)
    n = store.snapshot_size(ident, ids)
    assert n == snap.nbytes
    buf = deltapack.fresh_buffer(n)
    hit = store.restore_into(ident, ids, buf)
    assert isinstance(hit, deltapack.Hit) and hit, hit
    assert hit.address == buf.address and hit.nbytes == n
    assert hit.digest == snap.digest
    assert np.array_equal(buf.numpy(), np.asarray(snap))
    # The borrow ended with the call: the buffer is written again, and is
    # accepted again.
    buf.numpy()[:4096] = 0
    assert store.restore_into(ident, ids, buf)
    assert np.array_equal(buf.numpy()[:4096], np.asarray(snap)[:4096])


def test_restore_into_async_and_the_views_of_a_restored_buffer(tmp_path, ident):
    store, snap, ids = published(tmp_path, ident)

    async def main():
        buf = deltapack.fresh_buffer(await store.snapshot_size_async(ident, ids))
        return buf, await store.restore_into_async(ident, ids, buf)

    buf, hit = asyncio.run(asyncio.wait_for(main(), 120))
    assert hit and hit.address == buf.address and hit.digest == snap.digest
    assert buf.memoryview() == snap.memoryview()
    # Page views of the restored buffer are writable views of its memory.
    views = deltapack.snapshot_views(buf)
    layout = deltapack.snapshot_layout(buf)
    assert set(views) == {(li.group, li.layer) for li in layout.layers}
    for li in layout.layers:
        v = views[(li.group, li.layer)]
        assert v.flags.writeable and v.ctypes.data == buf.address + li.offset
    # A fresh buffer is read in place as well: publishing it to another
    # store stores the same snapshot.
    other = deltapack.Store(f"file://{tmp_path / 'other'}")
    assert other.publish(ident, ids, buf)["snapshot_digest"] == snap.digest


def test_restore_layers_into_a_fresh_buffer(tmp_path, ident):
    store, snap, ids = published(tmp_path, ident)
    buf = deltapack.fresh_buffer(snap.nbytes)
    items = list(store.restore_layers_into(ident, ids, buf))
    *layers, final = items
    assert isinstance(final, deltapack.Hit) and final, final
    assert final.address == buf.address and final.digest == snap.digest
    layout = snap.layout()
    assert sorted((x.group, x.layer) for x in layers) == sorted(
        (li.group, li.layer) for li in layout.layers
    )
    enc, flat = snap.tobytes(), buf.numpy()
    for x in layers:
        assert isinstance(x, deltapack.Layer)
        assert flat[x.start : x.end].tobytes() == enc[x.start : x.end], x
    assert flat.tobytes() == enc


def test_a_wrong_sized_fresh_buffer_is_refused_untouched(tmp_path, ident):
    store, snap, ids = published(tmp_path, ident)
    buf = deltapack.fresh_buffer(snap.nbytes + 1)
    with pytest.raises(deltapack.BadInput):
        store.restore_into(ident, ids, buf)
    assert not buf.numpy().any()
    it = store.restore_layers_into(ident, ids, buf)
    with pytest.raises(deltapack.BadInput):
        next(it)
    assert not buf.numpy().any()


@pytest.mark.parametrize("view", ["numpy", "memoryview", "numpy-of-memoryview", "page-views"])
def test_the_memory_outlives_the_buffer_while_a_view_lives(tmp_path, ident, view):
    """Deleting the Buffer while a view lives neither frees nor moves the
    memory: after a garbage collection the view still reads the restored
    bytes and can be written; the Buffer goes once the last view does."""
    store, snap, ids = published(tmp_path, ident)
    buf = deltapack.fresh_buffer(snap.nbytes)
    assert store.restore_into(ident, ids, buf)
    if view == "numpy":
        v = buf.numpy()
    elif view == "memoryview":
        v = buf.memoryview()
    elif view == "numpy-of-memoryview":
        v = np.frombuffer(buf.memoryview(), dtype=np.uint8)
    else:
        v = deltapack.snapshot_views(buf)
    alive = weakref.ref(buf)
    del buf
    for _ in range(3):
        gc.collect()
        np.zeros(1 << 16, dtype=np.uint8)  # churn the allocator a little
    assert alive() is not None, "the buffer went while a view of it lives"
    if view == "page-views":
        expected = deltapack.snapshot_views(snap)
        assert set(v) == set(expected)
        for k, pages in v.items():
            assert np.array_equal(pages, expected[k]), k
            pages[:] = 0x5A
            assert (pages == 0x5A).all()
        del pages  # the loop's last page view
    else:
        assert bytes(v) == snap.tobytes()
        v[:] = b"\x5a" * len(v) if isinstance(v, memoryview) else 0x5A
        assert bytes(v) == b"\x5a" * snap.nbytes
    del v
    gc.collect()
    assert alive() is None, "the buffer outlived its last view"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_no_page_is_touched_until_written_and_all_are_freed_with_the_last_view():
    n = 256 * MiB
    gc.collect()
    before = proc_status("VmRSS")
    buf = deltapack.fresh_buffer(n)
    made = proc_status("VmRSS")
    assert made - before < 16 * MiB, f"allocating touched {(made - before) / MiB:.1f} MiB"
    arr = buf.numpy()
    arr.fill(1)
    written = proc_status("VmRSS")
    assert written - made > 0.9 * n, f"writing {n / MiB:.0f} MiB added {(written - made) / MiB:.1f} MiB"
    del buf
    gc.collect()
    assert proc_status("VmRSS") - written > -16 * MiB  # the array keeps it
    assert arr[n - 1] == 1
    del arr
    gc.collect()
    freed = written - proc_status("VmRSS")
    assert freed > 0.9 * n, f"only {freed / MiB:.1f} MiB freed with the last view"


def test_bad_sizes():
    for bad in (-1, -(2**70), 1.5, 2.0, "16", b"16", None, True, False, [16]):
        with pytest.raises(deltapack.BadInput):
            deltapack.fresh_buffer(bad)
    # An integer-like size (numpy's) is a size.
    assert len(deltapack.fresh_buffer(np.int64(16))) == 16
    # Impossible sizes: a MemoryError, the process goes on.
    for huge in (2**62, sys.maxsize, 2**64, 2**100):
        with pytest.raises(MemoryError):
            deltapack.fresh_buffer(huge)
    assert not deltapack.fresh_buffer(4096).numpy().any()

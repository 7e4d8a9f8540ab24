"""Zero copy: restore_into writes the caller's memory in place and
allocates nothing of the result's size."""

import sys

import numpy as np
import pytest

import deltapack
from conftest import proc_status

MiB = 1 << 20


def test_output_pointer_is_the_callers(big, ident):
    url, ids, snap = big
    store = deltapack.Store(url)
    out = np.empty(snap.nbytes, dtype=np.uint8)
    addr = out.ctypes.data
    h = store.restore_into(ident, ids, out)
    assert h and h.address == addr == out.ctypes.data
    assert out.base is None and out.flags["OWNDATA"]  # still the caller's own array
    assert h.digest == snap.digest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_peak_memory_restoring_256_mib_into_a_preallocated_array(big, ident):
    url, ids, snap = big
    assert snap.nbytes >= 256 * MiB
    store = deltapack.Store(url)
    assert store.snapshot_size(ident, ids) == snap.nbytes  # root read, ledger opened
    out = np.ones(snap.nbytes, dtype=np.uint8)  # allocated and resident
    # Reset the peak (VmHWM) to the current RSS, then restore.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = proc_status("VmRSS")
    h = store.restore_into(ident, ids, out)
    peak = proc_status("VmHWM")
    assert h, h
    growth = peak - before
    assert growth < 32 * MiB, f"peak RSS grew by {growth / MiB:.1f} MiB beyond the preallocated array"
    assert np.array_equal(out, np.asarray(snap))


def warm_up_writer(store, ident):
    """One publication of the same size first: the local writer's direct-I/O
    staging buffers (up to 4 x 32 MiB, kept for reuse) are then already
    resident, so the measured publication's peak RSS shows only what it
    adds itself (a copy of the snapshot would add all of it)."""
    warm, ids = deltapack.synth(16384, "default", 99)
    store.publish(ident, ids, warm)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_publish_reads_deltapack_memory_in_place(tmp_path, ident):
    """A Snapshot passed to publish is not copied: peak RSS stays flat."""
    snap, ids = deltapack.synth(16384, "default", 2)  # ~100 MiB
    store = deltapack.Store(f"file://{tmp_path / 's'}")
    warm_up_writer(store, ident)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = proc_status("VmRSS")
    store.publish(ident, ids, snap)
    growth = proc_status("VmHWM") - before
    assert growth < 0.5 * snap.nbytes, f"publication grew RSS by {growth / MiB:.1f} MiB"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_publish_reads_a_numpy_array_in_place(tmp_path, ident):
    """A foreign buffer (numpy) is published without a copy: a copy would
    raise the peak RSS by the whole snapshot."""
    snap, ids = deltapack.synth(16384, "default", 3)  # ~100 MiB
    arr = np.frombuffer(snap.tobytes(), dtype=np.uint8).copy()  # the caller's memory
    digest = snap.digest
    del snap
    store = deltapack.Store(f"file://{tmp_path / 's'}")
    warm_up_writer(store, ident)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = proc_status("VmRSS")
    receipt = store.publish(ident, ids, arr)
    growth = proc_status("VmHWM") - before
    assert receipt["snapshot_digest"] == digest
    assert growth < 0.5 * arr.nbytes, f"publication grew RSS by {growth / MiB:.1f} MiB"
    out = np.empty_like(arr)
    assert store.restore_into(ident, ids, out)
    assert np.array_equal(out, arr)


@pytest.mark.parametrize("url", ["memory://", "file"])
def test_a_published_buffer_is_released_when_publish_returns(tmp_path, ident, url):
    """The store keeps no reference to the caller's memory after publish:
    a bytearray can be resized again (an export would refuse it) and
    changing it does not change what was stored (the memory backend copies
    what it keeps)."""
    if url == "file":
        url = f"file://{tmp_path / 's'}"
    snap, ids = deltapack.synth(2048, "tiny", 6)
    original = snap.tobytes()
    buf = bytearray(original)
    store = deltapack.Store(url)
    store.publish(ident, ids, buf)
    buf[:] = b"\xff" * len(buf)  # overwrite every byte the store was given
    buf.append(0)  # BufferError if an export were still alive
    r = store.restore(ident, ids)
    assert r, r
    assert r.tobytes() == original


class Described:
    """An object that only describes its memory (no buffer protocol)."""

    def __init__(self, arr):
        self.arr = arr
        self.__array_interface__ = arr.__array_interface__


def test_array_interface_buffers(tmp_path, ident):
    snap, ids = deltapack.synth(1024, "tiny", 4)
    store = deltapack.Store(f"file://{tmp_path / 's'}")
    store.publish(ident, ids, snap)
    backing = np.zeros(snap.nbytes, dtype=np.uint8)
    obj = Described(backing)
    with pytest.raises(TypeError):
        memoryview(obj)
    assert store.restore_into(ident, ids, obj)
    assert backing.tobytes() == snap.tobytes()
    # Read-only memory is refused before anything is read.
    ro = np.zeros(snap.nbytes, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(deltapack.BadInput):
        store.restore_into(ident, ids, Described(ro))
    with pytest.raises(deltapack.BadInput):
        store.restore_into(ident, ids, bytes(snap.nbytes))
    # Non-contiguous memory is refused.
    wide = np.zeros(snap.nbytes * 2, dtype=np.uint8)
    with pytest.raises(deltapack.BadInput):
        store.restore_into(ident, ids, wide[::2])


def test_snapshot_views_are_views(tmp_path, ident):
    snap, ids = deltapack.synth(1024, "tiny", 5)
    pool = np.zeros(snap.nbytes, dtype=np.uint8)
    store = deltapack.Store(f"file://{tmp_path / 's'}")
    store.publish(ident, ids, snap)
    assert store.restore_into(ident, ids, pool)
    views = deltapack.snapshot_views(pool)
    layout = deltapack.snapshot_layout(pool)
    assert set(views) == {(li.group, li.layer) for li in layout.layers}
    for li in layout.layers:
        v = views[(li.group, li.layer)]
        assert v.shape == (li.pages, li.page_bytes)
        assert np.shares_memory(v, pool)
        assert v.ctypes.data == pool.ctypes.data + li.offset
    # Views of a Snapshot are read-only, of the caller's array writable.
    ro = deltapack.snapshot_views(snap)
    assert not next(iter(ro.values())).flags.writeable
    assert next(iter(views.values())).flags.writeable
    # new_snapshot + views build an encoding equal to the original.
    built = deltapack.new_snapshot(layout.to_dict(), layout.boundary)
    assert len(built) == snap.nbytes
    for k, v in deltapack.snapshot_views(built).items():
        v[:] = views[k]
    assert bytes(built) == snap.tobytes()
    # ... also into a preallocated numpy buffer.
    pre = np.zeros(snap.nbytes, dtype=np.uint8)
    assert deltapack.new_snapshot(layout.to_dict(), layout.boundary, out=pre) is pre
    for k, v in deltapack.snapshot_views(pre).items():
        v[:] = views[k]
    assert pre.tobytes() == snap.tobytes()
    with pytest.raises(deltapack.BadInput):
        deltapack.new_snapshot(layout.to_dict(), layout.boundary, out=bytearray(10))

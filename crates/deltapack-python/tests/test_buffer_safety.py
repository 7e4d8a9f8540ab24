"""Memory crossing the Python boundary stays safe: a buffer is written by
at most one deltapack call at a time, whatever the order of refused calls;
the memory behind deltapack's own buffers lives as long as any native code
may touch it; and a snapshot deltapack shares is never exposed writable.

The held restore is real: an S3 store behind a local HTTP proxy that holds
every request while the test says so, so a restore stays in flight (its
claim on the buffer registered) for exactly as long as the test needs."""

import gc
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import deltapack
from conftest import HoldingProxy, s3_url


@pytest.fixture
def held_store():
    """(store behind the holding proxy, proxy): an empty S3 store."""
    url = s3_url()
    if url is None:
        pytest.skip("DELTAPACK_TEST_S3_ENDPOINT not set (bash .ci/run runs it)")
    proxy = HoldingProxy(os.environ["DELTAPACK_TEST_S3_ENDPOINT"])
    base, _, _ = url.partition("?endpoint=")
    store = deltapack.Store(f"{base}?endpoint=http://127.0.0.1:{proxy.port}")
    yield store, proxy
    proxy.close()


def test_a_refused_call_never_releases_the_claim_of_the_call_it_clashed_with(held_store, ident):
    """Restore #1 is in flight (held by the proxy); then thousands of other
    calls on the same buffer, from several threads, each refused. Before
    the fix the first refusal removed #1's claim, and the next call was let
    in to write the buffer #1 was writing."""
    store, proxy = held_store
    snap, ids = deltapack.synth(512, "tiny", 3)
    store.publish(ident, ids, snap)
    local = deltapack.Store(f"file://{os.environ.get('TMPDIR', '/tmp')}/dp-claims-{os.getpid()}")
    local.publish(ident, ids, snap)
    out = np.zeros(snap.nbytes, dtype=np.uint8)

    proxy.release.clear()
    first = {}
    t = threading.Thread(target=lambda: first.setdefault("r", store.restore_into(ident, ids, out)))
    t.start()
    assert proxy.waiting.acquire(timeout=30), "restore #1 never reached the store"

    def retry(worker):
        refused = 0
        for i in range(500):
            try:
                # Writers and readers both clash with #1's write claim.
                if i % 3 == 0:
                    local.publish(ident, ids, out)
                else:
                    local.restore_into(ident, ids, out)
            except deltapack.BadInput as e:
                assert "being used by another deltapack call" in str(e) or "being written" in str(e), e
                refused += 1
        return refused

    with ThreadPoolExecutor(4) as pool:
        refused = list(pool.map(retry, range(4)))
    assert t.is_alive(), "restore #1 finished while held"
    proxy.release.set()
    t.join(60)
    assert refused == [500] * 4, f"a call was let in while #1 was writing: {refused}"
    r = first["r"]
    assert r and r.digest == snap.digest and out.tobytes() == snap.tobytes()
    # Free again once #1 returned.
    assert local.restore_into(ident, ids, out)


def test_refused_retries_across_threads_never_write_at_once(tmp_path, ident):
    """Threads restore two different snapshots of one size into one buffer,
    retrying when refused, thousands of times: every accepted restore is a
    hit of its own snapshot (two writers at once would make a restore's
    verification fail: a false ``corrupt``, then a quarantine), and nothing
    is ever found corrupt or quarantined."""
    store = deltapack.Store(f"file://{tmp_path / 's'}", max_extent_bytes=4096)
    convs = []
    for seed in (11, 12):
        snap, ids = deltapack.synth(256, "tiny", seed)
        store.publish(ident, ids, snap)
        convs.append((ids, snap))
    assert convs[0][1].nbytes == convs[1][1].nbytes
    out = np.zeros(convs[0][1].nbytes, dtype=np.uint8)
    lock = threading.Lock()
    outcomes = {"hit": 0, "refused": 0, "bad": []}

    def work(w):
        ids, snap = convs[w % 2]
        for _ in range(400):
            try:
                r = store.restore_into(ident, ids, out)
            except deltapack.BadInput:
                with lock:
                    outcomes["refused"] += 1
                continue
            with lock:
                if not r or r.digest != snap.digest:
                    outcomes["bad"].append(repr(r))
                else:
                    outcomes["hit"] += 1

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))
    assert outcomes["bad"] == [], outcomes["bad"][:5]
    assert outcomes["hit"] > 0
    # Nothing was quarantined: both contexts still restore.
    for ids, snap in convs:
        o = np.zeros(snap.nbytes, dtype=np.uint8)
        assert store.restore_into(ident, ids, o) and o.tobytes() == snap.tobytes()
    report = store.sweep(grace=3600)
    assert report["corrupt"] == [], report


def test_reassigning_a_buffers_data_cannot_free_memory_a_restore_writes(tmp_path, ident):
    """Before the fix: ``buf._data = None`` during a layer-wise restore freed
    the memory the restore was writing (a segfault)."""
    store = deltapack.Store(f"file://{tmp_path / 's'}", max_extent_bytes=4096)
    snap, ids = deltapack.synth(1024, "tiny", 5)
    store.publish(ident, ids, snap)
    buf = deltapack.fresh_buffer(snap.nbytes)
    with pytest.raises(AttributeError):
        buf._data = None
    with pytest.raises(AttributeError):
        del buf._data
    it = store.restore_layers_into(ident, ids, buf)
    # Even bypassing the guard, the restore holds the native owner itself.
    object.__setattr__(buf, "_data", None)
    for _ in range(3):
        gc.collect()
        np.ones(1 << 20, dtype=np.uint8)  # churn the allocator
    *layers, final = list(it)
    assert final and final.digest == snap.digest, final
    assert layers


def test_a_restore_into_a_wrappers_memory_keeps_the_native_owner(tmp_path, ident):
    store = deltapack.Store(f"file://{tmp_path / 's'}", max_extent_bytes=4096)
    snap, ids = deltapack.synth(1024, "tiny", 6)
    store.publish(ident, ids, snap)
    buf = deltapack.fresh_buffer(snap.nbytes)
    view = buf.memoryview()
    object.__setattr__(buf, "_data", None)
    del buf
    gc.collect()
    # The view kept the native owner: still writable memory of the right size.
    assert store.restore_into(ident, ids, view)
    assert bytes(view) == snap.tobytes()


def test_snapshot_views_never_lead_to_writable_memory(tmp_path, ident):
    snap, _ = deltapack.synth(1024, "tiny", 7)
    mv = snap.memoryview()
    assert mv.readonly
    with pytest.raises(TypeError):
        mv[0] = 1
    # What the view is made from is read-only too, all the way down.
    obj = mv.obj
    assert isinstance(obj, np.ndarray) and not obj.flags.writeable
    with pytest.raises(ValueError):
        obj.flags.writeable = True
    arr = snap.numpy()
    assert not arr.flags.writeable
    with pytest.raises(ValueError):
        arr.flags.writeable = True
    # A restore refuses a Snapshot as its destination.
    store = deltapack.Store(f"file://{tmp_path / 's'}")
    with pytest.raises(deltapack.BadInput):
        store.restore_into(deltapack.CacheIdentity.example(), [1] * 256, snap)


def _flipping(arr, stop, lo):
    """Flips bytes of ``arr`` from offset ``lo`` on until ``stop`` is set
    (numpy releases the GIL for large operations; this thread also yields)."""
    view = arr[lo:]
    while not stop.is_set():
        np.bitwise_xor(view, 0xFF, out=view)


@pytest.mark.parametrize("kind", ["flat", "turn"])
def test_an_input_changed_during_publish_never_makes_a_root_that_does_not_restore(tmp_path, ident, kind):
    """Another thread rewrites the caller's buffer while it is published.
    The store cannot know which bytes the caller meant, but what it creates
    must be self-consistent: either an error, or a root that restores (to
    the bytes it staged) — never a root whose objects disagree with its
    digest (before: the digest came from one pass over the buffer and the
    objects from another, and the root restored ``corrupt``)."""
    for round in range(3):
        # A store per round: each publication creates its root.
        store = deltapack.Store(f"file://{tmp_path / f's{round}'}", max_extent_bytes=1 << 20)
        if kind == "flat":
            snap, ids = deltapack.synth(4096, "default", 31)
            arr = np.array(snap.numpy())  # the caller's own, writable copy
            lo = 64 << 10  # leave the header alone: only page bytes change
            call = lambda: store.publish(ident, ids, arr)
        else:
            first, ids = deltapack.synth(2048, "default", 31)
            turn = store.publish(ident, ids[:2048], first)["turn"]
            full, ids = deltapack.synth(4096, "default", 31)
            arr = np.frombuffer(turn.tail_of(full), dtype=np.uint8).copy()
            lo = 0
            call = lambda: store.publish_turn(ident, ids, turn, arr)
        stop = threading.Event()
        t = threading.Thread(target=_flipping, args=(arr, stop, lo))
        t.start()
        try:
            try:
                receipt = call()
            except deltapack.Error as e:
                receipt = e
        finally:
            stop.set()
            t.join(30)
        if isinstance(receipt, deltapack.Error):
            assert "changed" in str(receipt), receipt
            continue
        assert receipt["outcome"] == "created", receipt
        r = store.restore(ident, ids)
        assert r, f"round {round}: a root was created that does not restore: {r!r}"
        assert r.digest == receipt["snapshot_digest"]
        assert store.sweep(grace=3600)["corrupt"] == []

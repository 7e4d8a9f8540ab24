"""The GIL is released while the store works: other Python threads run,
and several threads restore at once."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

import deltapack
from conftest import progress_while_waiting


def test_a_python_thread_keeps_counting_during_a_large_restore(big, ident):
    url, ids, snap = big
    store = deltapack.Store(url)
    out = np.empty(snap.nbytes, dtype=np.uint8)

    def restore(now):
        before = now()
        h = store.restore_into(ident, ids, out)
        after = now()
        assert h
        return after - before

    progressed = progress_while_waiting(restore)
    assert max(progressed) > 0, f"the counter did not move during any restore: {progressed}"


def test_eight_threads_restore_the_same_and_different_contexts(tmp_path, ident):
    store = deltapack.Store(f"file://{tmp_path / 's'}", max_extent_bytes=8192)
    convs = []
    for seed in range(4):
        snap, ids = deltapack.synth(8192, "tiny", 100 + seed)
        store.publish(ident, ids, snap)
        convs.append((ids, snap.tobytes(), snap.digest))

    def work(i):
        # Threads 0-3: all the same context; 4-7: one context each.
        ids, want, digest = convs[0] if i < 4 else convs[i - 4]
        for _ in range(5):
            out = np.empty(len(want), dtype=np.uint8)
            h = store.restore_into(ident, ids, out)
            assert h and h.digest == digest and out.tobytes() == want
            r = store.restore(ident, ids)
            assert r and r.digest == digest and bytes(r) == want
        return i

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(work, i) for i in range(8)]
        assert sorted(f.result(timeout=120) for f in futures) == list(range(8))


def test_concurrent_writes_into_one_buffer_are_refused(big, ident):
    """Two calls never write overlapping memory: a second restore_into of a
    buffer that an unfinished call is writing is refused (BadInput) rather
    than racing; once the first returns, the buffer is free again."""
    url, ids, snap = big
    store = deltapack.Store(url)
    out = np.empty(snap.nbytes, dtype=np.uint8)
    import asyncio

    async def main():
        first = asyncio.ensure_future(store.restore_into_async(ident, ids, out))
        await asyncio.sleep(0)
        outcome = None
        try:
            store.restore_into(ident, ids, out)
            outcome = "ran"  # the first had already finished: no overlap
        except deltapack.BadInput as e:
            outcome = str(e)
        h = await asyncio.wait_for(first, 120)
        assert h
        return outcome

    outcome = asyncio.run(main())
    assert outcome == "ran" or "being used by another deltapack call" in outcome
    assert store.restore_into(ident, ids, out)

"""A KV connector's restore path: a preallocated host pool, deltapack
restoring straight into it, and per-layer page views scattered into the
slots of a paged KV cache.

    pip install ./crates/deltapack-python numpy
    python examples/python/page_pool.py [STORE_URL]

What a serving engine's connector (vLLM KV connector, SGLang HiCache
backend, LMCache backend, Mooncake get_into) does on a prefix hit:

1. ``lookup`` the longest stored prefix of the request (existence checks
   only, no payload read);
2. ``restore_into`` the verified snapshot into a host staging pool it
   allocated once (no allocation, no copy by deltapack: the pages land in
   the connector's own memory, and the GIL is released meanwhile);
3. view each (group, layer) of the pool as ``[pages, page_bytes]`` with
   ``snapshot_views`` and scatter the pages into the KV cache's block
   slots (here a numpy array standing in for the device cache; with torch
   it would be ``kv[layer][slot_ids].copy_(torch.from_numpy(pages))``).

The conversation is synthetic (``deltapack.synth``): turn 1 is published
flat, turn 2 as a page delta on it, as a snapshot service would after each
turn.
"""

import sys
import tempfile

import numpy as np

import deltapack


def publish_two_turns(store, ident):
    """The snapshot service's side: turn 1 flat, turn 2 as a delta."""
    t1, ids1 = deltapack.synth(2048, "tiny", seed=42)
    t2, ids2 = deltapack.synth(4096, "tiny", seed=42)
    store.publish(ident, ids1, t1)
    receipt = store.publish(ident, ids2, t2, base=(ids1, t1))
    print(
        f"published turn 2: {receipt['outcome']}, {receipt['schema']}, "
        f"payload {receipt['payload_len']} of {t2.nbytes} bytes (a delta)"
    )
    return ids2, t2


def main(url):
    ident = deltapack.CacheIdentity.example()
    store = deltapack.Store(url)
    ids, truth = publish_two_turns(store, ident)

    # The connector: one host staging pool, allocated once and reused for
    # every restore (resident memory: no page faults per restore).
    pool = np.empty(64 << 20, dtype=np.uint8)

    # A new request repeats the conversation and adds a question.
    request = list(ids) + [7, 8, 9] * 100
    hit = store.lookup(ident, request)
    if hit is None:
        print("no stored prefix: prefill everything")
        return 1
    print(f"stored prefix: {hit.boundary} of {len(request)} tokens")

    size = store.snapshot_size(ident, hit.context)
    if size is None or size > pool.nbytes:
        print("prefix not restorable into the pool: prefill everything")
        return 1
    staging = pool[:size]  # a view: restore_into writes the pool itself
    r = store.restore_into(ident, hit.context, staging)
    if not r:
        # A miss is a value (absent, corrupt, ...), never an exception;
        # the staging bytes hold nothing unverified.
        print(f"miss ({r.reason}): prefill everything")
        return 1
    assert r.address == pool.ctypes.data  # the pages are in our own pool
    print(f"restored {r.nbytes} bytes into the pool, digest {r.digest}")

    # The paged KV cache: per (group, layer), num_blocks slots of one page.
    layout = deltapack.snapshot_layout(staging)
    num_blocks = 64
    kv = {
        (li.group, li.layer): np.zeros((num_blocks, li.page_bytes), dtype=np.uint8)
        for li in layout.layers
    }
    # The block manager hands out free slots for the restored pages.
    rng = np.random.default_rng(0)
    views = deltapack.snapshot_views(staging)
    for li in layout.layers:
        pages = views[(li.group, li.layer)]  # zero-copy [pages, page_bytes]
        slots = rng.choice(num_blocks, size=li.pages, replace=False)
        kv[(li.group, li.layer)][slots] = pages  # the scatter (one copy, into the cache)
        # A bf16 layer can be reinterpreted without a copy for compute:
        if li.dtype == "bf16" and li.page_bytes % 2 == 0:
            _ = pages.view(np.uint16)  # bit patterns of bf16 values
        print(
            f"  group {li.group} ({li.kind}) layer {li.name}: {li.pages} page(s) of "
            f"{li.page_bytes} B -> slots {sorted(slots.tolist())}"
        )
        expect = np.asarray(truth)[li.offset : li.offset + li.pages * li.page_bytes]
        assert np.array_equal(kv[(li.group, li.layer)][slots].reshape(-1), expect)
    print("every page is in its slot, bit-exact")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(main(sys.argv[1]))
    with tempfile.TemporaryDirectory() as d:
        sys.exit(main(f"file://{d}/store"))

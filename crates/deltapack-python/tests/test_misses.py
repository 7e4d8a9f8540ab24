"""Misses are values with a reason; failures are exceptions of one
hierarchy; a miss leaves no unverified byte in the caller's buffer."""

import numpy as np
import pytest

import deltapack


def published(tmp_path, ident, tokens=4096, extent=4096, **kw):
    snap, ids = deltapack.synth(tokens, "tiny", 11)
    root = tmp_path / "store"
    store = deltapack.Store(f"file://{root}", max_extent_bytes=extent, **kw)
    store.publish(ident, ids, snap)
    return store, root, snap, ids


def test_absent_leaves_the_buffer_untouched(tmp_path, ident):
    store, _, snap, ids = published(tmp_path, ident)
    out = np.full(snap.nbytes, 0xAB, dtype=np.uint8)
    m = store.restore_into(ident, [9] * 256, out)
    assert isinstance(m, deltapack.Miss) and not m
    assert m.reason == "absent" and m.reason in deltapack.MISS_REASONS
    assert (out == 0xAB).all()
    assert store.restore(ident, [9] * 256) == deltapack.Miss("absent", "")
    assert store.restore(ident, [9] * 256).object is None
    assert store.snapshot_size(ident, [9] * 256) is None


def test_flipped_byte_in_an_extent_is_a_corrupt_miss_and_zeroes_the_buffer(tmp_path, ident):
    store, root, snap, ids = published(tmp_path, ident)
    extents = sorted((root / "objects" / "blake3").rglob("*"))
    extents = [p for p in extents if p.is_file()]
    assert len(extents) >= 2
    victim = extents[len(extents) // 2]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.chmod(0o644)
    victim.write_bytes(bytes(data))

    out = np.full(snap.nbytes, 0xAB, dtype=np.uint8)
    m = store.restore_into(ident, ids, out)
    assert not m and m.reason == "corrupt", m
    # The miss names the damaged object by its store key.
    assert m.object == victim.relative_to(root).as_posix(), m
    # Verified bytes of other extents had been placed: the buffer was
    # zeroed, so nothing from the restore (verified or not) is left.
    assert not out.any()
    # The damaged extent was quarantined once proven; a restore misses too.
    r = store.restore(ident, ids)
    assert not r and r.reason == "corrupt"
    # The move to quarantine is queued off the read path; flush waits for it.
    store.flush()
    assert (root / "quarantine").exists()
    assert store.stats()["process"]["quarantined"] >= 1


def test_wrong_size_buffer_is_bad_input_before_any_read(tmp_path, ident):
    store, _, snap, ids = published(tmp_path, ident)
    before = store.stats()["process"]
    for n in (snap.nbytes - 1, snap.nbytes + 1, 0):
        out = bytearray(b"\xcd" * n)
        with pytest.raises(deltapack.BadInput, match="buffer is"):
            store.restore_into(ident, ids, out)
        assert out == bytearray(b"\xcd" * n)
    after = store.stats()["process"]
    assert after["objects_read"] == before["objects_read"]
    assert after["bytes_read"] == before["bytes_read"]


def test_deadline_unauthenticated_and_base_missing(tmp_path, ident):
    store, root, snap, ids = published(tmp_path, ident, root_key=b"s3cret")
    out = bytearray(snap.nbytes)
    m = store.restore_into(ident, ids, out, timeout=0)
    assert m.reason == "deadline-exceeded"
    wrong = deltapack.Store(f"file://{root}", root_key="another secret")
    assert wrong.restore(ident, ids).reason == "unauthenticated"
    # A delta whose base root is gone.
    t2, ids2 = deltapack.synth(8192, "tiny", 11)
    store.publish(ident, ids2, t2, base=(ids, snap))
    base_root = root / "roots" / ident.namespace / ident.context(ids)
    assert base_root.exists()
    base_root.unlink()
    fresh = deltapack.Store(f"file://{root}", root_key=b"s3cret")
    r = fresh.restore(ident, ids2)
    assert not r and r.reason == "base-missing", r


def test_exceptions(tmp_path, ident):
    for cls in (deltapack.CapacityError, deltapack.ConflictError, deltapack.BadInput, deltapack.IoError):
        assert issubclass(cls, deltapack.Error) and issubclass(cls, Exception)
    store, root, snap, ids = published(tmp_path, ident)
    other, _ = deltapack.synth(4096, "tiny", 12)
    with pytest.raises(deltapack.ConflictError, match="already holds"):
        store.publish(ident, ids, other)
    with pytest.raises(deltapack.BadInput, match="tokens"):
        store.publish(ident, ids[:256], snap)
    with pytest.raises(deltapack.BadInput):
        store.publish(ident, ids, b"not a snapshot")
    with pytest.raises(deltapack.BadInput):
        store.publish(ident, ids, snap, base=(ids,))
    with pytest.raises(deltapack.BadInput):
        deltapack.CacheIdentity.from_json('{"model_checkpoint": "nope"}')
    with pytest.raises(deltapack.BadInput):
        deltapack.CacheIdentity("blake3:" + "0" * 64, "bf16", "rope", tp_rank=2, tp_degree=2)
    with pytest.raises(deltapack.BadInput):
        deltapack.Store(f"file://{tmp_path}/x", budget="lots")
    with pytest.raises(deltapack.BadInput):
        store.restore(ident, "not-hex")
    tiny = deltapack.Store(f"file://{tmp_path / 'small'}", budget=1000)
    with pytest.raises(deltapack.CapacityError):
        tiny.publish(ident, ids, snap)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(deltapack.IoError):
        deltapack.Store(f"file://{blocker}/store")

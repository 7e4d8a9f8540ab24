"""A tiered store round trip: an origin (local disk and the moto S3
server) with a node-local tier in front. Publications go to both; a second
node's first restore comes from the origin and fills its tier, its second
from the tier; a publication acknowledged in the tier is uploaded."""

import time

import numpy as np

import deltapack


def turns(seed):
    base, base_ids = deltapack.synth(2048, "tiny", seed)
    result, ids = deltapack.synth(4096, "tiny", seed)
    return base, base_ids, result, ids


def wait_for(predicate, seconds=30.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_tiered_round_trip(store_url, ident, tmp_path):
    base, base_ids, result, ids = turns(11)
    node = deltapack.Store(store_url, max_extent_bytes=4096, tier=str(tmp_path / "tier-a"), tier_budget="1GiB")
    assert node.publish(ident, base_ids, base)["outcome"] == "created"
    assert node.publish(ident, ids, result, base=(base_ids, base))["outcome"] == "created"
    # Served by the tier (written through), bit-exact.
    r = node.restore(ident, ids)
    assert r and bytes(r) == result.tobytes()
    tier = node.stats()["tier"]
    assert tier["process"]["hits"] == 1 and tier["ledger"]["roots"] == 2

    # Another node: first restore from the origin, which fills its tier.
    other = deltapack.Store(store_url, max_extent_bytes=4096, tier=str(tmp_path / "tier-b"))
    out = np.empty(result.nbytes, dtype=np.uint8)
    assert other.restore_into(ident, ids, out) and out.tobytes() == result.tobytes()
    assert wait_for(lambda: other.stats()["tier"]["process"]["fills"] >= 1)
    out[:] = 0
    assert other.restore_into(ident, ids, out) and out.tobytes() == result.tobytes()
    assert other.stats()["tier"]["process"]["hits"] == 1


def test_acknowledged_in_the_tier_then_uploaded(store_url, ident, tmp_path):
    base, base_ids, _, _ = turns(12)
    node = deltapack.Store(store_url, tier=str(tmp_path / "tier"), tier_ack="tier")
    assert node.publish(ident, base_ids, base)["outcome"] == "created"
    assert bytes(node.restore(ident, base_ids)) == base.tobytes()  # read-your-writes
    report = node.tier_upload()
    assert report["failed"] == 0 and report["remaining"] == 0
    plain = deltapack.Store(store_url)
    assert bytes(plain.restore(ident, base_ids)) == base.tobytes()


def test_tier_options_are_checked(tmp_path):
    import pytest

    with pytest.raises(deltapack.BadInput):
        deltapack.Store(str(tmp_path / "s"), tier_budget="1GiB")
    with pytest.raises(deltapack.BadInput):
        deltapack.Store(str(tmp_path / "s"), tier=str(tmp_path / "t"), tier_ack="later")

"""The package's surface: names, sizes, stubs, docs, operations."""

import inspect
import pathlib

import pytest

import deltapack
from conftest import read_json


def test_parse_size_and_duration():
    assert deltapack.parse_size("50GiB") == 50 << 30
    assert deltapack.parse_size("40 GB") == 40 * 10**9
    assert deltapack.parse_size(123) == 123
    assert deltapack.parse_duration("1h") == 3600.0
    assert deltapack.parse_duration("15m") == 900.0
    for bad in ("-1", "1 parsec", -5, True):
        with pytest.raises(deltapack.BadInput):
            deltapack.parse_size(bad)


def test_docs_and_stubs():
    pkg = pathlib.Path(deltapack.__file__).parent
    assert (pkg / "py.typed").exists()
    assert (pkg / "_native.pyi").exists()
    doc = inspect.getdoc(deltapack.Store)
    assert "snapshot_size" in inspect.getdoc(deltapack.Store.restore_into)
    assert "budget" in doc and "s3://" in doc
    for name in deltapack.__all__:
        obj = getattr(deltapack, name)
        if callable(obj) or inspect.isclass(obj):
            assert inspect.getdoc(obj), name
    for name, member in inspect.getmembers(deltapack.Store):
        if not name.startswith("_"):
            assert inspect.getdoc(member), name


def test_operations(tmp_path):
    ident = deltapack.CacheIdentity.example()
    snap, ids = deltapack.synth(2048, "tiny", 21)
    with deltapack.Store(f"file://{tmp_path / 's'}", budget="1GiB", grace=0) as store:
        store.publish(ident, ids, snap)
        store.hold(ident, ids, name="pinned-1")
        report = store.evict(to=0)
        assert report["roots"] == []  # held
        assert store.release(ident, ids, name="pinned-1")
        assert not store.release(ident, ids, name="pinned-1")
        with pytest.raises(deltapack.BadInput):
            store.hold(ident, ids, name="../bad")
        assert store.restore(ident, ids)
        st = store.stats()
        assert st["ledger"]["roots"] == 1 and st["process"]["hits"] >= 1
        assert st["budget_bytes"] == 1 << 30
        assert store.sweep(grace=0)["corrupt"] == []
        assert len(store.inspect(ident)) == 1
        report = store.evict(to="0B")
        assert len(report["roots"]) == 1
        assert store.restore(ident, ids).reason == "absent"


def test_ledger_url_outside_the_store(tmp_path, monkeypatch, cli):
    """`ledger_url` puts the capacity ledger where a fleet keeps it (here a
    SQLite file outside the store; `postgres://` takes the same path), the
    CLI finds the same account through `--ledger`, `DELTAPACK_LEDGER` is the
    default as for the CLI, and a bad URL is a clear error."""
    ident = deltapack.CacheIdentity.example()
    snap, ids = deltapack.synth(2048, "tiny", 23)
    url = f"file://{tmp_path / 's'}"
    ledger = f"sqlite://{tmp_path / 'fleet' / 'ledger.sqlite3'}"
    (tmp_path / "fleet").mkdir()
    with deltapack.Store(url, ledger_url=ledger) as store:
        store.publish(ident, ids, snap)
        assert store.stats()["ledger"]["roots"] == 1
    assert (tmp_path / "fleet" / "ledger.sqlite3").exists()
    assert not (tmp_path / "s" / "ledger" / "ledger.sqlite3").exists()
    code, out = cli("ledger", "show", "--store", url, "--ledger", ledger, "--json")
    shown = read_json(out)
    assert code == 0 and shown["engine"] == "sqlite" and shown["roots"] == 1, shown
    monkeypatch.setenv("DELTAPACK_LEDGER", ledger)
    with deltapack.Store(url) as store:
        assert store.stats()["ledger"]["roots"] == 1
        assert store.restore(ident, ids)
    monkeypatch.delenv("DELTAPACK_LEDGER")
    bad = deltapack.Store(url, ledger_url="ftp://nowhere/ledger")
    with pytest.raises(deltapack.BadInput) as e:
        bad.stats()
    assert "ledger URL" in str(e.value)


def test_a_foreign_ledger_reads_but_may_not_change_the_store(tmp_path, cli):
    """The store names the ledger that accounts for it (its first
    publisher's): a handle with another ledger restores and looks up, and
    its publication and eviction raise `LedgerMismatchError` (a
    `deltapack.Error`) with the fix in the message; after `ledger adopt`
    (CLI) the other ledger is the store's."""
    ident = deltapack.CacheIdentity.example()
    snap, ids = deltapack.synth(2048, "tiny", 23)
    snap2, ids2 = deltapack.synth(2048, "tiny", 24)
    url = f"file://{tmp_path / 's'}"
    with deltapack.Store(url) as owner:
        owner.publish(ident, ids, snap)
    other = f"sqlite://{tmp_path / 'other' / 'ledger.sqlite3'}"
    with deltapack.Store(url, ledger_url=other) as store:
        assert store.restore(ident, ids)
        assert store.lookup(ident, ids) is not None
        with pytest.raises(deltapack.LedgerMismatchError) as e:
            store.publish(ident, ids2, snap2)
        assert isinstance(e.value, deltapack.Error)
        assert "ledger adopt" in str(e.value)
        with pytest.raises(deltapack.LedgerMismatchError):
            store.evict(to=0)
    code, out = cli("ledger", "adopt", "--store", url, "--ledger", other,
                    "--old-owner-gone", "--json")
    assert code == 0 and read_json(out)["changed"], out
    with deltapack.Store(url, ledger_url=other) as store:
        store.publish(ident, ids2, snap2)
        assert store.restore(ident, ids2)
    with deltapack.Store(url) as old:
        with pytest.raises(deltapack.LedgerMismatchError):
            old.publish(ident, ids2, snap2)


def test_lookup_says_its_source_and_survives_an_unreadable_ledger(tmp_path):
    """`lookup` answers from the ledger, and from the store (roots probed by
    name, GIL released) when the ledger cannot be read; `restore` still
    hits and `publish` raises `IoError` (ledger unavailable)."""
    import concurrent.futures
    import os

    ident = deltapack.CacheIdentity.example()
    snap, ids = deltapack.synth(2048, "tiny", 25)
    url = f"file://{tmp_path / 's'}"
    path = tmp_path / "ledger.sqlite3"
    ledger = f"sqlite://{path}"
    request = list(ids) + [7] * 600
    with deltapack.Store(url, ledger_url=ledger) as store:
        store.publish(ident, ids, snap)
        hit = store.lookup(ident, request)
        assert hit is not None and hit.source == "ledger" and hit.boundary == 2048
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x5a" * 8192)
    os.replace(garbage, path)
    for suffix in ("-wal", "-shm"):
        try:
            os.remove(f"{path}{suffix}")
        except FileNotFoundError:
            pass
    with deltapack.Store(url, ledger_url=ledger) as store:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: store.lookup(ident, request), range(8)))
        for a in answers:
            assert a is not None and a.source == "store" and a.boundary == 2048, a
        assert store.restore(ident, ids)
        other, other_ids = deltapack.synth(2048, "tiny", 26)
        with pytest.raises(deltapack.IoError) as e:
            store.publish(ident, other_ids, other)
        assert "ledger unavailable" in str(e.value)

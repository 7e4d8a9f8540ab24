"""The package's surface: names, sizes, stubs, docs, operations."""

import inspect
import pathlib

import numpy as np
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

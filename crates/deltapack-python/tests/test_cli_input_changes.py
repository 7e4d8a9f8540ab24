"""`deltapack publish` of a snapshot file that someone truncates or rewrites
while it is being published: a clean `input-changed` error and no root,
never a SIGBUS, never a root whose objects disagree with their names, and a
later publication of the intact snapshot is unharmed.

Before the fix the CLI mapped the file: truncating it killed the publish
with SIGBUS (leaving staging files), rewriting it gave `created` for a root
whose extents did not match their names, and a correct publication of the
same snapshot afterwards reused those objects and restored `corrupt`.

Deterministic: the store is the S3 test server behind a proxy that holds
the publication's first object upload, so the file is changed while the
publication is provably in flight (extents already read, most not yet)."""

import json
import os
import subprocess
import uuid

import pytest

import deltapack

from conftest import HoldingProxy, _cli_path, tokens_file

SIGBUS = 7


@pytest.fixture
def setup(tmp_path, cli, id_file):
    ep = os.environ.get("DELTAPACK_TEST_S3_ENDPOINT")
    if not ep:
        pytest.skip("DELTAPACK_TEST_S3_ENDPOINT not set (bash .ci/run runs it)")
    proxy = HoldingProxy(ep, hold_if=lambda method, path: method == "PUT" and "/objects/" in path)
    bucket = os.environ.get("DELTAPACK_TEST_S3_BUCKET", "deltapack-test")
    prefix = f"cli-input-{uuid.uuid4().hex[:10]}"
    via_proxy = f"s3://{bucket}/{prefix}?endpoint=http://127.0.0.1:{proxy.port}"
    direct = f"s3://{bucket}/{prefix}?endpoint={ep}"
    snap, tok = tmp_path / "s.snap", tmp_path / "s.tok"
    # ~5.8 MiB in 64 KiB extents: 90-odd extents, of which a handful are
    # read before the first upload is held.
    cli("synth", "--preset", "default", "--tokens", 512, "--seed", 21, "--out", snap, "--tokens-out", tok)
    yield proxy, via_proxy, direct, snap, tok
    proxy.close()


def publish(store, id_file, tok, snap):
    return subprocess.Popen(
        [str(_cli_path()), "publish", "--store", store, "--identity", str(id_file),
         "--tokens", str(tok), "--snapshot", str(snap), "--max-extent-bytes", "64KiB", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def change_while_held(proxy, proc, change):
    proxy.release.clear()
    try:
        assert proxy.waiting.acquire(timeout=60), "the publication never uploaded an object"
        change()
    finally:
        proxy.release.set()
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def assert_input_changed(rc, err):
    assert rc != -SIGBUS, f"killed by SIGBUS:\n{err}"
    assert rc not in (0,), err
    last = [l for l in err.strip().splitlines() if l.startswith("{")]
    assert last, err
    e = json.loads(last[-1])["error"]
    assert e["kind"] == "input-changed", e


def assert_no_root_then_intact_publish(cli, store, id_file, tok, intact, tmp_path):
    rc, text = cli("restore", "--store", store, "--identity", id_file, "--tokens", tok,
                   "--out", tmp_path / "r.snap", "--json", check=False)
    assert json.loads(text)["outcome"] == "miss" and json.loads(text)["reason"] == "absent", text
    # The intact snapshot publishes and restores bit-exactly: no object the
    # failed publication left behind is reused unless it holds its name's bytes.
    clean = tmp_path / "intact.snap"
    clean.write_bytes(intact)
    cli("publish", "--store", store, "--identity", id_file, "--tokens", tok,
        "--snapshot", clean, "--max-extent-bytes", "64KiB")
    cli("restore", "--store", store, "--identity", id_file, "--tokens", tok, "--out", tmp_path / "r.snap")
    assert (tmp_path / "r.snap").read_bytes() == intact
    _, text = cli("sweep", "--store", store, "--grace", "1h", "--json")
    assert json.loads(text)["corrupt"] == [], text


def test_a_file_truncated_during_publish_is_a_clean_error(setup, cli, id_file, tmp_path):
    proxy, via_proxy, direct, snap, tok = setup
    intact = snap.read_bytes()
    proc = publish(via_proxy, id_file, tok, snap)
    rc, _, err = change_while_held(proxy, proc, lambda: os.truncate(snap, len(intact) // 2))
    assert_input_changed(rc, err)
    assert "shorter" in err, err
    assert_no_root_then_intact_publish(cli, direct, id_file, tok, intact, tmp_path)


def test_a_file_rewritten_during_publish_creates_no_root(setup, cli, id_file, tmp_path):
    proxy, via_proxy, direct, snap, tok = setup
    intact = snap.read_bytes()

    def rewrite():
        # Same size, other bytes, everywhere past the first extents.
        with open(snap, "r+b") as f:
            f.seek(len(intact) // 2)
            f.write(bytes(b ^ 0xFF for b in intact[len(intact) // 2:]))

    proc = publish(via_proxy, id_file, tok, snap)
    rc, _, err = change_while_held(proxy, proc, rewrite)
    assert_input_changed(rc, err)
    assert_no_root_then_intact_publish(cli, direct, id_file, tok, intact, tmp_path)


def test_a_tail_truncated_during_publish_is_a_clean_error(tmp_path, cli, ident, id_file):
    """`publish --tail`: the tail file is read once, straight into the
    buffer the turn is staged in, after the base's root is read. Truncated
    while that read of the root is held, the publication is a clean
    `input-changed` (the file is shorter than when it was opened), creates
    no root, and the intact tail publishes afterwards and restores."""
    ep = os.environ.get("DELTAPACK_TEST_S3_ENDPOINT")
    if not ep:
        pytest.skip("DELTAPACK_TEST_S3_ENDPOINT not set (bash .ci/run runs it)")
    proxy = HoldingProxy(ep, hold_if=lambda method, path: method == "GET" and "/roots/" in path)
    try:
        bucket = os.environ.get("DELTAPACK_TEST_S3_BUCKET", "deltapack-test")
        prefix = f"cli-tail-{uuid.uuid4().hex[:10]}"
        via_proxy = f"s3://{bucket}/{prefix}?endpoint=http://127.0.0.1:{proxy.port}"
        direct = f"s3://{bucket}/{prefix}?endpoint={ep}"
        base, base_ids = deltapack.synth(512, "default", 21)
        full, ids = deltapack.synth(768, "default", 21)
        snap, tok, nxt = tmp_path / "b.snap", tmp_path / "b.tok", tmp_path / "n.tok"
        snap.write_bytes(base.tobytes())
        tokens_file(tok, base_ids)
        tokens_file(nxt, ids)
        cli("publish", "--store", direct, "--identity", id_file, "--tokens", tok, "--snapshot", snap)
        scratch = deltapack.Store(f"file://{tmp_path / 'scratch'}")
        tail = scratch.publish(ident, base_ids, base)["turn"].tail_of(full)
        tail = bytes(tail)
        tail_file = tmp_path / "n.tail"
        tail_file.write_bytes(tail)

        def turn(store):
            return [str(_cli_path()), "publish", "--store", store, "--identity", str(id_file),
                    "--tokens", str(nxt), "--tail", str(tail_file), "--base-snapshot", str(snap),
                    "--base-tokens", str(tok), "--json"]

        proc = subprocess.Popen(turn(via_proxy), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rc, _, err = change_while_held(proxy, proc, lambda: os.truncate(tail_file, len(tail) // 2))
        assert_input_changed(rc, err)
        assert "shorter" in err, err
        rc, text = cli("restore", "--store", direct, "--identity", id_file, "--tokens", nxt,
                       "--out", tmp_path / "r.snap", "--json", check=False)
        assert json.loads(text)["outcome"] == "miss" and json.loads(text)["reason"] == "absent", text

        tail_file.write_bytes(tail)
        p = subprocess.run(turn(direct), capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["outcome"] == "created", p.stdout
        cli("restore", "--store", direct, "--identity", id_file, "--tokens", nxt, "--out", tmp_path / "r.snap")
        assert (tmp_path / "r.snap").read_bytes() == full.tobytes()
    finally:
        proxy.release.set()
        proxy.close()

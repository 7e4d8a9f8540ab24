"""Fixtures of the deltapack Python tests: real stores (a temporary
directory, the moto S3 server that .ci/run starts), the real CLI binary,
synthetic conversations."""

import http.client
import http.server
import json
import os
import socketserver
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

import numpy as np
import pytest

import deltapack

ROOT = Path(__file__).resolve().parents[3]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _cli_path():
    env = os.environ.get("DELTAPACK_CLI")
    if env:
        return Path(env)
    for profile in ("debug", "release"):
        p = ROOT / "target" / profile / "deltapack"
        if p.exists():
            return p
    return None


@pytest.fixture(scope="session")
def cli():
    """Runs the `deltapack` binary; returns (exit code, stdout)."""
    path = _cli_path()
    if path is None:
        if IN_CI:
            pytest.fail("the deltapack CLI is not built (cargo build -p deltapack-cli)")
        pytest.skip("the deltapack CLI is not built (set DELTAPACK_CLI or cargo build -p deltapack-cli)")

    def run(*args, check=True):
        p = subprocess.run(
            [str(path), *map(str, args)], capture_output=True, text=True, timeout=300
        )
        if check and p.returncode != 0:
            raise AssertionError(f"deltapack {' '.join(map(str, args))}: exit {p.returncode}\n{p.stderr}")
        return p.returncode, p.stdout

    return run


def s3_url():
    """A fresh prefix in the test bucket, or None when no server is set."""
    ep = os.environ.get("DELTAPACK_TEST_S3_ENDPOINT")
    if not ep:
        if IN_CI:
            pytest.fail("CI=true but DELTAPACK_TEST_S3_ENDPOINT is not set: the S3 tests must run in CI (see .ci/run)")
        return None
    bucket = os.environ.get("DELTAPACK_TEST_S3_BUCKET", "deltapack-test")
    return f"s3://{bucket}/py-{uuid.uuid4().hex[:12]}?endpoint={ep}"


@pytest.fixture(params=["file", "s3"])
def store_url(request, tmp_path):
    """A URL of an empty store on local disk, then on the S3 server."""
    if request.param == "file":
        return f"file://{tmp_path / 'store'}"
    url = s3_url()
    if url is None:
        pytest.skip("DELTAPACK_TEST_S3_ENDPOINT not set: skipping the S3 backend (bash .ci/run runs it)")
    return url


@pytest.fixture
def ident():
    return deltapack.CacheIdentity.example()


@pytest.fixture
def id_file(tmp_path, ident):
    p = tmp_path / "id.json"
    p.write_text(ident.to_json())
    return p


def tokens_file(path, ids):
    """Writes token ids as a token file (u32 little endian)."""
    np.asarray(ids, dtype="<u4").tofile(path)
    return path


@pytest.fixture(scope="session")
def big():
    """A ~259 MiB conversation snapshot (default preset, 44,032 tokens),
    published flat in a local store: (store url, tokens, snapshot)."""
    import tempfile

    d = tempfile.mkdtemp(prefix="deltapack-py-big-")
    snap, ids = deltapack.synth(44032, "default", 7)
    url = f"file://{d}/store"
    store = deltapack.Store(url)
    store.publish(deltapack.CacheIdentity.example(), ids, snap)
    del store
    yield url, ids, snap
    shutil.rmtree(d, ignore_errors=True)


def read_json(text):
    return json.loads(text)


def proc_status(field):
    """A byte count from /proc/self/status (`VmRSS`, `VmHWM`, ...)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def progress_while_waiting(measure, rounds=5):
    """How far a Python thread got while the main thread waited in deltapack.

    A background thread counts, sleeping (so releasing the GIL) after every
    step, and the switch interval is set so long that the interpreter never
    preempts the main thread: the counter can only advance while the main
    thread itself has released the GIL, i.e. inside a deltapack call that
    let go of it. ``measure(now)`` runs the calls (``now()`` reads the
    counter) and returns how far the counter moved during them. Up to
    ``rounds`` rounds, stopping at the first that moved; returns every
    round's figure."""
    count = [0]
    stop = threading.Event()
    started = threading.Event()

    def counter():
        started.set()
        while not stop.is_set():
            count[0] += 1
            time.sleep(0.0002)

    old = sys.getswitchinterval()
    t = threading.Thread(target=counter, daemon=True)
    t.start()
    assert started.wait(10)
    sys.setswitchinterval(100.0)
    progressed = []
    try:
        for _ in range(rounds):
            progressed.append(measure(lambda: count[0]))
            if progressed[-1] > 0:
                break
    finally:
        sys.setswitchinterval(old)
        stop.set()
        t.join(10)
    assert not t.is_alive()
    return progressed


class HoldingProxy:
    """An HTTP proxy in front of the S3 test server that forwards every
    request, except that while ``release`` is clear, the requests
    ``hold_if(method, path)`` picks wait for it (each one that starts
    waiting releases ``waiting`` once)."""

    def __init__(self, upstream, hold_if=lambda method, path: True):
        u = urllib.parse.urlparse(upstream)
        self.upstream = (u.hostname, u.port)
        self.release = threading.Event()
        self.release.set()
        self.waiting = threading.Semaphore(0)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                if not proxy.release.is_set() and hold_if(self.command, self.path):
                    proxy.waiting.release()
                    proxy.release.wait(60)
                c = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                c.request(self.command, self.path, body=body, headers=dict(self.headers))
                r = c.getresponse()
                data = r.read()
                self.send_response(r.status, r.reason)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                c.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = forward

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()

#!/usr/bin/env python3
"""Fault-injecting HTTP proxy for deltapack's S3 tests (Python stdlib only).

Sits on 127.0.0.1 in front of a real S3-compatible server (moto) and, per
request, with configurable probabilities:

  503            answer 503 SlowDown without forwarding (nothing happened)
  500            answer 500 InternalError without forwarding
  delay          sleep delay_ms (uniform 0..delay_ms), then forward
  reset          GET only: forward, send the headers and half of the body,
                 then reset the connection (RST) mid-body
  lost           PUT only: forward (the write lands on the server), then
                 lose the response: `lost_style` = close (FIN, no response),
                 reset (RST, no response), 503 (answer 503 instead of the real
                 response) or mixed (one of the three at random)

Control (answered by the proxy itself; no S3 bucket can be named `__fault`):

  GET /__fault/set?p503=0.1&p500=0.05&pdelay=0.1&delay_ms=200&preset=0.05&plost=0.05&lost_style=mixed
  GET /__fault/once?action=landed-close&method=PUT&match=/roots/
        queue a one-shot fault for the next matching request; actions:
        503, 500, reset, landed-close, landed-reset, landed-503, and
        flip (GET: forward, then flip one bit in the middle of the body
        and send it whole — corruption in transit, one-shot only)
  GET /__fault/off      all probabilities to 0, one-shot queue cleared
  GET /__fault/stats    JSON counters (requests, forwarded, faults by kind)

Usage: fault_proxy.py --upstream http://127.0.0.1:5077 [--port 0] [--seed 1]
Prints `LISTENING <port>` on stdout once ready; stats go to stderr on exit.
"""

import argparse
import http.client
import http.server
import json
import random
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}

FAULT_KINDS = [
    "flip",
    "503",
    "500",
    "delay",
    "reset",
    "landed-close",
    "landed-reset",
    "landed-503",
]


class State:
    def __init__(self, upstream, seed):
        u = urllib.parse.urlsplit(upstream)
        self.up_host = u.hostname or "127.0.0.1"
        self.up_port = u.port or 80
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.cfg = {
            "p503": 0.0,
            "p500": 0.0,
            "pdelay": 0.0,
            "delay_ms": 100.0,
            "preset": 0.0,
            "plost": 0.0,
            "lost_style": "mixed",
        }
        self.once = []  # [(action, method or None, substring)]
        self.stats = {"requests": 0, "forwarded": 0, "faults": 0}
        for k in FAULT_KINDS:
            self.stats[k] = 0
        self.by_method = {}

    def count(self, key, n=1):
        with self.lock:
            self.stats[key] = self.stats.get(key, 0) + n
            if key in FAULT_KINDS:
                self.stats["faults"] += n

    def choose(self, method, path):
        """The fault for this request: an action name or None."""
        with self.lock:
            self.stats["requests"] += 1
            self.by_method[method] = self.by_method.get(method, 0) + 1
            for i, (action, m, sub) in enumerate(self.once):
                if (m is None or m == method) and sub in path:
                    del self.once[i]
                    return action
            c = self.cfg
            r = self.rng.random()
            for name, p in (("503", c["p503"]), ("500", c["p500"]), ("delay", c["pdelay"])):
                if r < p:
                    return name
                r -= p
            if method == "GET":
                if r < c["preset"]:
                    return "reset"
                r -= c["preset"]
            if method == "PUT":
                if r < c["plost"]:
                    style = c["lost_style"]
                    if style == "mixed":
                        style = self.rng.choice(["close", "reset", "503"])
                    return "landed-" + style
            return None

    def delay(self):
        with self.lock:
            ms = self.rng.uniform(0, self.cfg["delay_ms"])
        time.sleep(ms / 1000.0)

    def snapshot(self):
        with self.lock:
            out = dict(self.stats)
            out["by_method"] = dict(self.by_method)
            out["config"] = dict(self.cfg)
            out["once_pending"] = len(self.once)
            return out


STATE = None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fault-proxy"

    def log_message(self, fmt, *args):  # quiet
        pass

    # ---------------------------------------------------------- helpers
    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                line = self.rfile.readline()
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def forward(self, body):
        conn = http.client.HTTPConnection(STATE.up_host, STATE.up_port, timeout=120)
        try:
            headers = {
                k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP
            }
            if self.command in ("PUT", "POST") or body:
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.reason, resp.getheaders(), data
        finally:
            conn.close()
            STATE.count("forwarded")

    def send_upstream(self, status, reason, headers, data, cut=None):
        self.send_response_only(status, reason)
        length = None
        for k, v in headers:
            lk = k.lower()
            if lk in HOP_BY_HOP:
                continue
            if lk == "content-length":
                length = v
                continue
            self.send_header(k, v)
        if self.command == "HEAD":
            self.send_header("Content-Length", length if length is not None else "0")
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data if cut is None else data[:cut])
            self.wfile.flush()

    def send_error_xml(self, status, code):
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>injected by fault_proxy</Message>"
            "<RequestId>fault-proxy</RequestId></Error>"
        ).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def hard_close(self, reset):
        try:
            if reset:
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
            else:
                self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.connection.close()
        except OSError:
            pass
        self.close_connection = True

    def send_json(self, obj):
        body = json.dumps(obj, sort_keys=True).encode()
        self.send_response_only(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    # ---------------------------------------------------------- control
    def control(self):
        u = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(u.query))
        cmd = u.path[len("/__fault/"):]
        with STATE.lock:
            if cmd == "set":
                for k, v in q.items():
                    if k not in STATE.cfg:
                        continue
                    STATE.cfg[k] = v if k == "lost_style" else float(v)
            elif cmd == "once":
                STATE.once.append((q.get("action", "503"), q.get("method"), q.get("match", "")))
            elif cmd == "off":
                for k in ("p503", "p500", "pdelay", "preset", "plost"):
                    STATE.cfg[k] = 0.0
                STATE.once.clear()
        self.send_json(STATE.snapshot())

    # ---------------------------------------------------------- requests
    def handle_any(self):
        if self.path.startswith("/__fault/"):
            self.read_body()
            return self.control()
        body = self.read_body()
        action = STATE.choose(self.command, self.path)
        if action:
            STATE.count(action)
        try:
            if action == "503":
                return self.send_error_xml(503, "SlowDown")
            if action == "500":
                return self.send_error_xml(500, "InternalError")
            if action == "delay":
                STATE.delay()
            status, reason, headers, data = self.forward(body)
            if action == "reset":
                if self.command == "HEAD" or len(data) < 2:
                    return self.hard_close(reset=True)
                self.send_upstream(status, reason, headers, data, cut=len(data) // 2)
                return self.hard_close(reset=True)
            if action == "landed-close":
                return self.hard_close(reset=False)
            if action == "landed-reset":
                return self.hard_close(reset=True)
            if action == "landed-503":
                return self.send_error_xml(503, "SlowDown")
            if action == "flip" and data:
                data = bytearray(data)
                data[len(data) // 2] ^= 0x10
                data = bytes(data)
            return self.send_upstream(status, reason, headers, data)
        except (ConnectionError, socket.timeout, OSError) as e:
            STATE.count("upstream_errors")
            try:
                msg = f"proxy: upstream failed: {e}".encode()
                self.send_response_only(502)
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
            except OSError:
                self.close_connection = True

    do_GET = handle_any
    do_PUT = handle_any
    do_POST = handle_any
    do_DELETE = handle_any
    do_HEAD = handle_any


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):  # resets are expected
        pass


def main():
    global STATE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    STATE = State(args.upstream, args.seed)
    srv = Server(("127.0.0.1", args.port), Handler)

    def stop(*_):
        sys.stderr.write("fault_proxy stats: " + json.dumps(STATE.snapshot(), sort_keys=True) + "\n")
        sys.stderr.flush()
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"LISTENING {srv.server_address[1]}", flush=True)
    srv.serve_forever(poll_interval=0.1)


if __name__ == "__main__":
    main()

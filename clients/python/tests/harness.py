# SPDX-License-Identifier: Apache-2.0
"""Real parts for the tests: an idemsvc binary built from this repository,
Redis servers on free loopback ports, and a proxy that loses answers. Every
process started here is killed by its own PID."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def eventually(what: str, check: Callable[[], bool], timeout: float = 15.0, output: Callable[[], str] = lambda: "") -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:
            pass
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout} s\n{output()}")
        time.sleep(0.02)


def build_idemsvc(tmp: Path) -> Path:
    """IDEMSVC_TEST_BIN, or idemsvc built from this repository into tmp."""
    given = os.environ.get("IDEMSVC_TEST_BIN")
    if given:
        return Path(given)
    out = tmp / "idemsvc"
    subprocess.run(["go", "build", "-o", str(out), "./cmd/idemsvc"], cwd=REPO, check=True)
    return out


class Proc:
    """A child process, killed by its PID when stopped."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        self.log = log
        self._f = open(log, "wb")
        self.p = subprocess.Popen(args, env=env, stdout=self._f, stderr=subprocess.STDOUT)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, 9)
            self.p.wait()
        self._f.close()


def start_redis(tmp: Path) -> tuple[str, Proc]:
    port = free_port()
    proc = Proc(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                {"PATH": os.environ["PATH"]}, tmp / f"redis-{port}.log")

    def ping() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")

    eventually("redis-server", ping, 10, proc.output)
    return f"redis://127.0.0.1:{port}", proc


@dataclass
class Svc:
    """An idemsvc of the tests' own."""

    base_url: str
    api_key: str
    proc: Proc
    redis: Proc | None = None
    extra: list[Proc] = field(default_factory=list)

    def stop(self) -> None:
        self.proc.stop()
        if self.redis is not None:
            self.redis.stop()


def sha256_hex(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


LIMITED_KEY = secrets.token_hex(16)


def start_idemsvc(binary: Path, tmp: Path, redis_url: str | None = None) -> tuple[str, str, Proc]:
    """idemsvc on a free loopback port, with a tenants file: tenant `py`, and
    tenant `limited` (LIMITED_KEY: one begin per second, burst 1)."""
    api_key = secrets.token_hex(16)
    d = Path(tempfile.mkdtemp(dir=tmp))
    tenants = d / "tenants.json"
    tenants.write_text(json.dumps({"tenants": [
        {"name": "py", "api_key_sha256": [sha256_hex(api_key)]},
        {"name": "limited", "api_key_sha256": [sha256_hex(LIMITED_KEY)], "limits": {"begins_per_s": 1, "burst": 1}},
    ]}))
    port = free_port()
    env = {"PATH": os.environ["PATH"], "IDEMSVC_LISTEN": f"127.0.0.1:{port}", "IDEMSVC_TENANTS_FILE": str(tenants),
           "IDEMSVC_LOG_LEVEL": "warn"}
    if redis_url:
        env["IDEMSVC_REDIS_URL"] = redis_url
    proc = Proc([str(binary)], env, d / "idemsvc.log")
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            c.request("GET", "/healthz")
            return c.getresponse().status == 200
        finally:
            c.close()

    eventually("idemsvc", healthy, 20, proc.output)
    return base, api_key, proc


def unique_key(prefix: str = "k") -> str:
    return f"{prefix}-{secrets.token_hex(8)}"


class LosingProxy:
    """An HTTP proxy in front of idemsvc that can lose answers: a request to a
    path in ``drop`` is sent on to idemsvc, which acts on it, and then the
    caller's connection is closed without the answer, as when a network
    breaks after the request arrived."""

    def __init__(self, upstream: str):
        self.upstream = upstream.removeprefix("http://")
        self.drop: dict[str, int] = {}
        self.refuse: dict[str, tuple[int, int, str]] = {}  # path -> (times, status, Retry-After)
        self.seen: list[str] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?")[0]
                with proxy.lock:
                    times, status, retry_after = proxy.refuse.get(path, (0, 0, ""))
                    if times > 0:
                        proxy.refuse[path] = (times - 1, status, retry_after)
                        proxy.seen.append(path)
                if times > 0:
                    # A gateway's answer, not idemsvc's: the request never reached it.
                    page = b"<html>busy</html>"
                    self.send_response(status)
                    self.send_header("Content-Type", "text/html")
                    if retry_after:
                        self.send_header("Retry-After", retry_after)
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                host, port = proxy.upstream.split(":")
                c = http.client.HTTPConnection(host, int(port), timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "content-length")}
                c.request(self.command, self.path, body=body, headers=headers)
                r = c.getresponse()
                data = r.read()
                c.close()
                path = self.path.split("?")[0]
                with proxy.lock:
                    proxy.seen.append(path)
                    lose = proxy.drop.get(path, 0) > 0
                    if lose:
                        proxy.drop[path] -= 1
                if lose:
                    self.close_connection = True
                    return
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_GET = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def refuse_next(self, path: str, n: int, status: int, retry_after: str = "") -> None:
        with self.lock:
            self.refuse[path] = (n, status, retry_after)

    def lose_next(self, path: str, n: int = 1) -> None:
        with self.lock:
            self.drop[path] = self.drop.get(path, 0) + n

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def which(name: str) -> bool:
    return shutil.which(name) is not None

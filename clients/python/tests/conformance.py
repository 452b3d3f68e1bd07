# SPDX-License-Identifier: Apache-2.0
"""The shared middleware conformance suite (conformance/cases.json, its
format in conformance/README.md), run against the WSGI and ASGI middleware
in front of the conformance app, with a real idemsvc behind them."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import struct
import threading
import time
from typing import Any, Callable

from harness import REPO

CASES: list[dict[str, Any]] = json.loads((REPO / "conformance" / "cases.json").read_text())["cases"]

LARGE_BYTES = 1572864


class Runs:
    """The app's runs: in all, and per key header (the run an answer names)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.total = 0
        self.by_key: dict[str, int] = {}

    def count(self, key: str) -> int:
        with self.lock:
            self.total += 1
            self.by_key[key] = self.by_key.get(key, 0) + 1
            return self.by_key[key]


def _answer(status: int, run: int) -> tuple[int, list[tuple[str, str]], bytes]:
    return status, [("Content-Type", "application/json"), ("Location", "/things/1"), ("X-Run", str(run))], \
        json.dumps({"run": run}, separators=(",", ":")).encode()


def route(path: str, run: int) -> tuple[int, list[tuple[str, str]], bytes] | float | None:
    """The app's answer by path; a float is a delay before /answer/201; None a crash."""
    parts = path.split("/")
    name, arg = parts[1], parts[2] if len(parts) > 2 else ""
    if name == "answer":
        return _answer(int(arg), run)
    if name == "slow":
        return int(arg) / 1000
    if name == "binary":
        return 200, [("Content-Type", "application/octet-stream")], bytes(range(256)) + struct.pack(">I", run)
    if name == "large":
        return 200, [("Content-Type", "text/plain")], b"a" * LARGE_BYTES
    if name == "crash":
        return None
    return 404, [("Content-Type", "text/plain")], b"no such route\n"


def wsgi_app(runs: Runs) -> Callable[..., Any]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        n = int(environ.get("CONTENT_LENGTH") or 0)
        if n:
            environ["wsgi.input"].read(n)
        run = runs.count(environ.get("HTTP_IDEMPOTENCY_KEY", ""))
        a = route(environ["PATH_INFO"], run)
        if isinstance(a, float):
            time.sleep(a)
            a = _answer(201, run)
        if a is None:
            raise RuntimeError("crash")
        status, headers, body = a
        start_response(f"{status} X", [*headers, ("Content-Length", str(len(body)))])
        return [body]

    return app


def asgi_app(runs: Runs) -> Callable[..., Any]:
    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        while True:
            m = await receive()
            if not m.get("more_body"):
                break
        key = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"idempotency-key"), "")
        run = runs.count(key)
        a = route(scope["path"], run)
        if isinstance(a, float):
            await asyncio.sleep(a)
            a = _answer(201, run)
        if a is None:
            raise RuntimeError("crash")
        status, headers, body = a
        await send({"type": "http.response.start", "status": status,
                    "headers": [(k.encode(), v.encode()) for k, v in headers]})
        await send({"type": "http.response.body", "body": body})

    return app


KEY_PATTERN = re.compile(r"\{key(?::(\d+))?\}")


def expand_key(value: str, key: str) -> str:
    return KEY_PATTERN.sub(lambda m: key + "k" * max(0, int(m.group(1) or 0) - len(key)), value)


def send(port: int, step: dict[str, Any], key: str) -> dict[str, Any]:
    """A step's request on a connection of its own, sent once."""
    headers = dict(step.get("headers") or {})
    if "key" in step:
        headers["Idempotency-Key"] = expand_key(step["key"], key)
    body = b"x" * step["body_bytes"] if "body_bytes" in step else step.get("body", "").encode()
    if body or step["method"] in ("POST", "PATCH", "PUT"):
        headers.setdefault("Content-Type", "application/octet-stream")
        headers["Content-Length"] = str(len(body))
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request(step["method"], step["path"], body=body or None, headers=headers)
        r = c.getresponse()
        data = r.read()
        return {"status": r.status, "headers": r.headers, "body": data}
    except (OSError, http.client.HTTPException) as e:
        return {"error": e}
    finally:
        c.close()


def run_case(case: dict[str, Any], port: int, key: str) -> list[dict[str, Any]]:
    answers: list[dict[str, Any]] = [{} for _ in case["steps"]]
    threads: list[threading.Thread] = []
    started = 0.0
    for i, step in enumerate(case["steps"]):
        if step.get("with_previous"):
            time.sleep(max(0.0, started + step.get("delay_ms", 0) / 1000 - time.monotonic()))
        else:
            for t in threads:
                t.join()
        started = time.monotonic()

        def go(i: int = i, step: dict[str, Any] = step) -> None:
            answers[i] = send(port, step, key)

        t = threading.Thread(target=go)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return answers


def check(i: int, step: dict[str, Any], got: dict[str, Any], answers: list[dict[str, Any]]) -> None:
    want = step["expect"]
    where = f"step {i} ({step['method']} {step['path']})"
    if want["status"] == "any":
        return
    assert "error" not in got, f"{where}: {got.get('error')!r}"
    assert got["status"] == want["status"], f"{where}: status {got['status']}, want {want['status']}; body {got['body'][:300]!r}"
    for name, value in (want.get("headers") or {}).items():
        values = got["headers"].get_all(name)
        if value is None:
            assert values is None, f"{where}: header {name}: {values}, want none"
        else:
            assert values is not None and ", ".join(values) == value, f"{where}: header {name}: {values}, want {value!r}"
    if "body" in want:
        assert got["body"].decode(errors="replace") == want["body"], f"{where}: body {got['body'][:300]!r}"
    if "body_of" in want:
        assert got["body"] == answers[want["body_of"]]["body"], f"{where}: body is not step {want['body_of']}'s"
    if "body_bytes" in want:
        assert len(got["body"]) == want["body_bytes"], f"{where}: body of {len(got['body'])} bytes"
    if "problem" in want:
        assert got["headers"].get("Content-Type") == "application/problem+json", f"{where}: content type"
        p = json.loads(got["body"])
        assert p["type"].endswith("/problems/" + want["problem"]), f"{where}: problem {p}"
        assert p.get("code") == want["problem"], f"{where}: problem code {p}"
        assert p["status"] == got["status"], f"{where}: problem status {p}"
    if "retry_after_max" in want:
        ra = got["headers"].get("Retry-After") or ""
        assert ra.isdigit() and int(ra) <= want["retry_after_max"], f"{where}: Retry-After {ra!r}"

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Python SDK's cost in the caller, beside raw http.client:

    /usr/bin/python3 benchmarks/python-client.py [runs] [calls]   (default 3 runs of 2000 calls)

Each run measures, one after another in an order that alternates from run
to run, a begin + complete of a new key (a cycle: two HTTP calls) made

  raw     by hand on one keep-alive http.client connection (json.dumps,
          json.loads, nothing else: no owner, no retries, no errors);
  client  with Client.begin and Client.complete;
  do      with Client.do (an owner, a heartbeat that is scheduled and
          cancelled, the response encoded);
  deco    through an @idempotent function (the key, JSON codec);
  batch   through process_batch, 100 records a batch (a begin batch and a
          finish batch for each 100: the cycle is one record's share);

on one thread, against an idemsvc of its own on the memory store (built
from this repository, or IDEMSVC_TEST_BIN), started with its defaults. It
prints, per load, cycles per second and the caller's CPU per call (half a
cycle: process CPU time / calls), their medians over the runs, and the
medians of each run's ratios to raw; and per record (a cycle), raw's and
deco's two calls beside batch's share of two calls per 100 records.
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "clients/python/src"), str(ROOT / "clients/python/tests")]

from harness import build_idemsvc, start_idemsvc, unique_key  # noqa: E402

from idemsvc import Client, Response, idempotent, process_batch  # noqa: E402


def raw_cycle(base: str, api_key: str) -> Callable[[str], None]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port))
    headers = {"Authorization": "Bearer " + api_key, "Content-Type": "application/json"}

    def cycle(key: str) -> None:
        conn.request("POST", "/v1/begin", json.dumps({"key": key}), headers)
        r = conn.getresponse()
        token = json.loads(r.read())["lease_token"]
        conn.request("POST", "/v1/complete", json.dumps({"key": key, "lease_token": token, "response": {"body": "ok"}}), headers)
        r = conn.getresponse()
        r.read()
        assert r.status == 200

    return cycle


def client_cycle(c: Client) -> Callable[[str], None]:
    def cycle(key: str) -> None:
        a = c.begin(key)
        c.complete(key, a.lease_token, Response(body=b"ok"))  # type: ignore[union-attr]

    return cycle


def do_cycle(c: Client) -> Callable[[str], None]:
    ok = Response(body=b"ok")
    return lambda key: c.do(key, lambda: ok) and None


def deco_cycle(c: Client) -> Callable[[str], None]:
    @idempotent(c, key=lambda k: k, prefix="")
    def op(k: str) -> str:
        return "ok"

    return lambda key: op(key) and None


BATCH = 100


class BatchLoad:
    """Records handed to process_batch 100 at a time: each cycle adds one."""

    def __init__(self, c: Client):
        self.c = c
        self.pending: list[str] = []

    def __call__(self, key: str) -> None:
        self.pending.append(key)
        if len(self.pending) == BATCH:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            out = process_batch(self.pending, lambda r: "ok", key=lambda r: r, client=self.c, prefix="")
            assert out[-1].status == "completed", out[-1]
            self.pending = []


def measure(cycle: Callable[[str], None], n: int, prefix: str) -> tuple[float, float]:
    keys = [f"{prefix}-{i}" for i in range(n)]
    for k in keys[:BATCH]:
        cycle(k + "-warm")
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for k in keys:
        cycle(k)
    if isinstance(cycle, BatchLoad):
        cycle.flush()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return n / wall, cpu / (2 * n) * 1e6  # cycles/s, µs of CPU per call (half a cycle)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    tmp = Path(tempfile.mkdtemp(prefix="idemsvc-pybench-"))
    base, api_key, proc = start_idemsvc(build_idemsvc(tmp), tmp)
    try:
        c = Client(base, api_key)
        loads = {"raw": raw_cycle(base, api_key), "client": client_cycle(c), "do": do_cycle(c), "deco": deco_cycle(c),
                 "batch": BatchLoad(c)}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in loads}
        for run in range(runs):
            order = list(loads) if run % 2 == 0 else list(reversed(loads))
            for name in order:
                rate, cpu = measure(loads[name], n, unique_key(name))
                results[name].append((rate, cpu))
                print(f"run {run + 1} {name:7s} {rate:8.0f} cycles/s  {cpu:6.1f} µs CPU per call", flush=True)
        print(f"\nmedians of {runs} runs of {n} cycles (begin + complete), one thread, idemsvc on its memory store:")
        print("  (the ratios are medians of each run's ratio to raw, steadier than the figures on a busy machine)")
        for name, rs in results.items():
            rate = statistics.median(r for r, _ in rs)
            cpu = statistics.median(c for _, c in rs)
            cpu_ratio = statistics.median(c / raw[1] for (_, c), raw in zip(rs, results["raw"]))
            rate_ratio = statistics.median(r / raw[0] for (r, _), raw in zip(rs, results["raw"]))
            print(f"  {name:7s} {rate:8.0f} cycles/s ({rate_ratio:.2f}x raw)  {cpu:6.1f} µs CPU per call ({cpu_ratio:.2f}x raw)"
                  f"  {2 * cpu:6.1f} µs CPU per record")
    finally:
        proc.stop()


if __name__ == "__main__":
    main()

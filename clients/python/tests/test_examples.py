# SPDX-License-Identifier: Apache-2.0
"""The examples in examples/python, run as a user runs them, against idemsvc."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO, Svc, eventually, free_port, unique_key

EXAMPLES = REPO / "examples" / "python"
SRC = Path(__file__).resolve().parents[1] / "src"


def env_of(svc: Svc, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), "IDEMSVC_URL": svc.base_url, "IDEMSVC_API_KEY": svc.api_key,
            **extra}


def post(port: int, key: str, body: dict[str, object]) -> tuple[int, http.client.HTTPMessage, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("POST", "/payments", body=json.dumps(body),
                  headers={"Idempotency-Key": f'"{key}"', "Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.headers, r.read()
    finally:
        c.close()


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
@pytest.mark.parametrize("example", ["flask_app.py", "django_app.py", "fastapi_app.py"])
def test_web_example_replays(svc: Svc, example: str, tmp_path: Path) -> None:
    port = free_port()
    log = open(tmp_path / "log", "wb")
    p = subprocess.Popen([sys.executable, str(EXAMPLES / example)], env=env_of(svc, PORT=str(port)),
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        def up() -> bool:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            try:
                c.request("GET", "/")
                return c.getresponse().status > 0
            finally:
                c.close()

        eventually(example, up, 30, lambda: (tmp_path / "log").read_text(errors="replace"))
        key = unique_key("pay")
        status, headers, body = post(port, key, {"amount": 100})
        assert status == 201, body
        assert "Idempotent-Replayed" not in headers
        status2, headers2, body2 = post(port, key, {"amount": 100})
        assert (status2, body2, headers2.get("Idempotent-Replayed")) == (201, body, "true")
        assert headers2["Location"] == headers["Location"]
        status3, _, _ = post(port, key, {"amount": 200})
        assert status3 == 422
    finally:
        os.kill(p.pid, 9)
        p.wait()
        log.close()


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
def test_consumer_example_applies_each_message_once(svc: Svc) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / "consumer.py")], env=env_of(svc), capture_output=True,
                         timeout=60, text=True)
    assert out.returncode == 0, out.stderr
    assert "applied 3 times for 3 messages delivered 9 times" in out.stdout


@pytest.mark.parametrize("svc", ["memory", "redis"], indirect=True)
def test_sqs_batch_example_reports_partial_failures_and_charges_once(svc: Svc) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / "sqs_batch.py")], env=env_of(svc), capture_output=True,
                         timeout=60, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    failures = [ln for ln in lines if "batchItemFailures" in ln]
    assert "0003'" in failures[0] and "0007'" in failures[0] and failures[0].count("'") == 4, failures
    assert failures[1].endswith("[]")
    assert "charged 9 orders here and 1 at the other consumer, each once, for 10 messages delivered 22 times" \
        in out.stdout
    assert sum(" replayed " in ln for ln in lines) == 11


@pytest.mark.parametrize("svc", ["memory", "redis"], indirect=True)
def test_kafka_batch_example_commits_past_what_is_done_and_ships_once(svc: Svc) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / "kafka_batch.py")], env=env_of(svc), capture_output=True,
                         timeout=60, text=True)
    assert out.returncode == 0, out.stderr
    assert "poll 1: 10 records, completed=9, error=1" in out.stdout
    assert "poll 2: 5 records, completed=1, replayed=4" in out.stdout
    assert "poll 3: 10 records, replayed=10" in out.stdout
    assert "shipped 10 orders once each for 10 records consumed 25 times" in out.stdout

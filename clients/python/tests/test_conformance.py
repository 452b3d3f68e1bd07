# SPDX-License-Identifier: Apache-2.0
"""conformance/cases.json against the WSGI and the ASGI middleware."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from conformance import CASES, Runs, asgi_app, check, run_case, wsgi_app
from harness import Svc, free_port, unique_key
from idemsvc import AsyncClient, Client
from idemsvc.asgi import IdempotencyMiddleware as ASGIMiddleware
from idemsvc.wsgi import IdempotencyMiddleware as WSGIMiddleware
from servers import ASGIServer, WSGIServer


def x_user(environ_or_scope: Any) -> str:
    """The scoped cases' end user: the request's X-User header."""
    if "headers" in environ_or_scope:
        return next((v.decode("latin-1") for k, v in environ_or_scope["headers"] if k == b"x-user"), "")
    return str(environ_or_scope.get("HTTP_X_USER", ""))


class Target:
    """The middleware in front of the app: with its defaults, with an idemsvc
    that cannot be reached, and with a scope (the scoped cases)."""

    def __init__(self, kind: str, svc: Svc):
        self.runs = Runs()
        self.down_runs = Runs()
        self.scoped_runs = Runs()
        down_url = f"http://127.0.0.1:{free_port()}"
        if kind == "wsgi":
            self.up = WSGIServer(WSGIMiddleware(wsgi_app(self.runs), Client(svc.base_url, svc.api_key)))
            self.down = WSGIServer(WSGIMiddleware(wsgi_app(self.down_runs), Client(down_url, svc.api_key)))
            self.scoped = WSGIServer(WSGIMiddleware(wsgi_app(self.scoped_runs), Client(svc.base_url, svc.api_key),
                                                    scope=x_user))
        else:
            self.up = ASGIServer(ASGIMiddleware(asgi_app(self.runs), AsyncClient(svc.base_url, svc.api_key)))
            self.down = ASGIServer(ASGIMiddleware(asgi_app(self.down_runs), AsyncClient(down_url, svc.api_key)))
            self.scoped = ASGIServer(ASGIMiddleware(asgi_app(self.scoped_runs), AsyncClient(svc.base_url, svc.api_key),
                                                    scope=x_user))

    def close(self) -> None:
        self.up.close()
        self.down.close()
        self.scoped.close()


@pytest.fixture(scope="module", params=["wsgi", "asgi"])
def target(request: pytest.FixtureRequest, svc: Svc) -> Iterator[Target]:
    t = Target(request.param, svc)
    yield t
    t.close()


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_conformance(target: Target, case: dict[str, Any]) -> None:
    server, runs = target.up, target.runs
    if case.get("idemsvc") == "down":
        server, runs = target.down, target.down_runs
    if case.get("scoped"):
        server, runs = target.scoped, target.scoped_runs
    before = runs.total
    answers = run_case(case, server.port, unique_key("conf"))
    for i, step in enumerate(case["steps"]):
        check(i, step, answers[i], answers)
    assert runs.total - before == case["calls"], f"the app ran {runs.total - before} times, want {case['calls']} ({case['rule']})"

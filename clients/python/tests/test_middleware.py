# SPDX-License-Identifier: Apache-2.0
"""The middleware's request identity (the fingerprint, the credentials'
digest, the scoped key), byte for byte the Go SDK's, and the end-user
scoping it gives, on WSGI and ASGI against a real idemsvc."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from pathlib import Path
from typing import Any, Iterator

import pytest

from conformance import Runs, asgi_app, wsgi_app
from harness import REPO, Svc, unique_key
from idemsvc import AsyncClient, Client
from idemsvc.canonical import canonicalize
from idemsvc._middleware import credential_digest, credential_key, fingerprint, legacy_fingerprint, scoped_key
from idemsvc.asgi import IdempotencyMiddleware as ASGIMiddleware
from idemsvc.wsgi import IdempotencyMiddleware as WSGIMiddleware
from servers import ASGIServer, WSGIServer

VECTORS = json.loads((Path(__file__).parent / "go_fingerprints.json").read_text())["vectors"]


@pytest.mark.parametrize("v", VECTORS, ids=[str(i) for i in range(len(VECTORS))])
def test_identity_is_the_go_sdks(v: dict[str, Any]) -> None:
    i, want = v["input"], v["go"]
    path, _, query = i["target"].partition("?")
    raw_path = urllib.parse.unquote_to_bytes(path)
    body = i["body"].encode("utf-8")
    cred = credential_digest(credential_key(i["api_key"].encode()), i["authorization"] or None, i["cookies"],
                             i["cookie_names"])
    assert fingerprint(i["method"], raw_path, query.encode(), i["content_type"] or None, body, cred) == want["fingerprint"]
    assert legacy_fingerprint(i["method"], raw_path, query.encode(), body) == want["legacy_fingerprint"]
    assert scoped_key(i["scope"], i["key"]) == want["scoped_key"]


def user_header(environ_or_scope: Any) -> str:
    """The subject: X-User, as an authentication in front would set it."""
    if "headers" in environ_or_scope:
        return next((v.decode() for k, v in environ_or_scope["headers"] if k == b"x-user"), "")
    return str(environ_or_scope.get("HTTP_X_USER", ""))


class Served:
    def __init__(self, kind: str, svc: Svc, **opts: Any):
        self.runs = Runs()
        self.mw: WSGIMiddleware | ASGIMiddleware
        if kind == "wsgi":
            self.mw = WSGIMiddleware(wsgi_app(self.runs), Client(svc.base_url, svc.api_key), **opts)
            self.server: WSGIServer | ASGIServer = WSGIServer(self.mw)
        else:
            self.mw = ASGIMiddleware(asgi_app(self.runs), AsyncClient(svc.base_url, svc.api_key), **opts)
            self.server = ASGIServer(self.mw)

    def post(self, key: str, body: bytes, headers: dict[str, str] | None = None,
             content_type: str = "application/json") -> tuple[int, http.client.HTTPMessage, bytes]:
        c = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=10)
        try:
            c.request("POST", "/answer/201", body=body,
                      headers={"Idempotency-Key": f'"{key}"', "Content-Type": content_type, **(headers or {})})
            r = c.getresponse()
            return r.status, r.headers, r.read()
        finally:
            c.close()

    def close(self) -> None:
        self.server.close()


@pytest.fixture(params=["wsgi", "asgi"])
def kind(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
def test_json_member_order_and_whitespace_do_not_matter(svc: Svc, kind: str) -> None:
    s = Served(kind, svc)
    try:
        key = unique_key()
        assert s.post(key, b'{"amount":100,"currency":"EUR"}')[0] == 201
        status, headers, _ = s.post(key, b'{ "currency": "EUR",\n  "amount": 100 }')
        assert status == 201 and headers["Idempotent-Replayed"] == "true"
        assert s.post(key, b'{"amount":101,"currency":"EUR"}')[0] == 422
        # Not JSON by its content type: the raw bytes count.
        k2 = unique_key()
        assert s.post(k2, b'{"a":1,"b":2}', content_type="text/plain")[0] == 201
        assert s.post(k2, b'{"b":2,"a":1}', content_type="text/plain")[0] == 422
        assert s.runs.total == 2
    finally:
        s.close()


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
def test_without_scope_another_callers_credentials_get_422(svc: Svc, kind: str) -> None:
    s = Served(kind, svc, credential_cookies=["sid"])
    try:
        key = unique_key()
        alice = {"Authorization": "Bearer alice"}
        assert s.post(key, b"{}", alice)[0] == 201
        assert s.post(key, b"{}", alice)[2] == b'{"run":1}'  # replayed to the same caller
        assert s.post(key, b"{}", {"Authorization": "Bearer mallory"})[0] == 422
        assert s.post(key, b"{}")[0] == 422  # no credentials at all
        k2 = unique_key()
        assert s.post(k2, b"{}", {"Cookie": "theme=dark; sid=a1"})[0] == 201
        assert s.post(k2, b"{}", {"Cookie": "sid=a1; theme=light"})[1]["Idempotent-Replayed"] == "true"
        assert s.post(k2, b"{}", {"Cookie": "sid=b2"})[0] == 422
        assert s.runs.total == 2
    finally:
        s.close()


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
def test_scope_gives_each_user_its_own_record(svc: Svc, kind: str) -> None:
    s = Served(kind, svc, scope=user_header)
    try:
        key = unique_key()
        status, headers, body = s.post(key, b"{}", {"X-User": "alice", "Authorization": "Bearer t1"})
        assert (status, body) == (201, b'{"run":1}')
        # A rotated token, the same subject: the same record.
        status, headers, body = s.post(key, b"{}", {"X-User": "alice", "Authorization": "Bearer t2"})
        assert headers["Idempotent-Replayed"] == "true"
        # Another user, the same key: a record of its own, neither replayed nor refused.
        status, headers, body = s.post(key, b'{"other":1}', {"X-User": "bob"})
        assert status == 201 and headers.get("Idempotent-Replayed") is None
        assert s.runs.total == 2
        # Stored under the scoped key, readable in idemctl's listings.
        st = Client(svc.base_url, svc.api_key).status(scoped_key("alice", key) or "")
        assert st["state"] == "completed" and st["key"].endswith("~" + key)
    finally:
        s.close()


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
def test_unscoped_shares_records_between_callers(svc: Svc, kind: str) -> None:
    s = Served(kind, svc, unscoped=True)
    try:
        key = unique_key()
        assert s.post(key, b"{}", {"Authorization": "Bearer alice"})[0] == 201
        assert s.post(key, b"{}", {"Authorization": "Bearer bob"})[1]["Idempotent-Replayed"] == "true"
        assert s.runs.total == 1
    finally:
        s.close()


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
def test_a_record_of_the_legacy_fingerprint_still_replays(svc: Svc, kind: str) -> None:
    c = Client(svc.base_url, svc.api_key)
    key = unique_key()
    body = b'{"b":1, "a":2}'
    a = c.begin(key, fingerprint=legacy_fingerprint("POST", b"/answer/201", b"", body))
    from idemsvc import Acquired, Response
    assert isinstance(a, Acquired)
    c.complete(key, a.lease_token, Response(201, {"Content-Type": "application/json"}, b'{"run":"old"}'))
    s = Served(kind, svc)
    try:
        status, headers, got = s.post(key, body)
        assert (status, got, headers["Idempotent-Replayed"]) == (201, b'{"run":"old"}', "true")
        assert s.runs.total == 0
    finally:
        s.close()


SHARED = REPO / "conformance" / "fingerprints.json"
shared = json.loads(SHARED.read_text()) if SHARED.exists() else {}
needs_shared = pytest.mark.skipif(not shared, reason="conformance/fingerprints.json is not in this tree")


@needs_shared
def test_shared_canonical_json_vectors() -> None:
    import base64
    for v in shared["canonical"]:
        got = canonicalize(v["json"].encode("utf-8"))
        assert (got.decode("utf-8") if got is not None else None) == v["canonical"], v["json"][:80]
    for v in shared.get("raw_canonical", []):
        got = canonicalize(base64.b64decode(v["base64"]))
        assert (got.decode("utf-8") if got is not None else None) == v["canonical"], v["base64"]


@needs_shared
def test_shared_request_vectors() -> None:
    for v in shared.get("requests", []):
        headers = {k.lower(): val for k, val in v["headers"].items()}
        path, _, query = v["target"].partition("?")
        raw_path = urllib.parse.unquote_to_bytes(path)
        body = v["body"].encode("utf-8")
        cookies = [headers["cookie"]] if "cookie" in headers else []
        cred = credential_digest(credential_key(v["secret"].encode("utf-8")), headers.get("authorization"), cookies,
                                 v["credential_cookies"])
        got = fingerprint(v["method"], raw_path, query.encode("latin-1"), headers.get("content-type"), body, cred)
        assert got == v["fingerprint"], v["name"]
        assert legacy_fingerprint(v["method"], raw_path, query.encode("latin-1"), body) == v["legacy_fingerprint"], v["name"]
    for v in shared.get("scoped_keys", []):
        assert scoped_key(v["scope"], v["key"]) == v["stored_key"], v


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
def test_a_duplicate_waits_when_configured(svc: Svc, kind: str) -> None:
    import threading

    s = Served(kind, svc, wait_ms=5000)
    try:
        key = unique_key()
        answers: list[tuple[int, http.client.HTTPMessage, bytes]] = []

        def first() -> None:
            c = http.client.HTTPConnection("127.0.0.1", s.server.port, timeout=10)
            c.request("POST", "/slow/700", body=b"{}",
                      headers={"Idempotency-Key": f'"{key}"', "Content-Type": "application/json"})
            r = c.getresponse()
            answers.append((r.status, r.headers, r.read()))
            c.close()

        t = threading.Thread(target=first)
        t.start()
        import time
        time.sleep(0.2)
        c = http.client.HTTPConnection("127.0.0.1", s.server.port, timeout=10)
        c.request("POST", "/slow/700", body=b"{}", headers={"Idempotency-Key": f'"{key}"', "Content-Type": "application/json"})
        r = c.getresponse()
        status, headers, body = r.status, r.headers, r.read()
        c.close()
        t.join()
        assert (status, headers["Idempotent-Replayed"], body) == (201, "true", answers[0][2])
        assert s.runs.total == 1
    finally:
        s.close()


def _legacy_record(c: Client, key: str, body: bytes) -> Any:
    """A record begun with the legacy fingerprint of a POST /answer/201 of body, as the SDKs' earlier versions stored it."""
    from idemsvc import Acquired
    a = c.begin(key, fingerprint=legacy_fingerprint("POST", b"/answer/201", b"", body))
    assert isinstance(a, Acquired)
    return a


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
def test_a_terminal_failure_of_the_legacy_fingerprint_replays(svc: Svc, kind: str) -> None:
    from idemsvc import Response
    c = Client(svc.base_url, svc.api_key)
    key = unique_key()
    a = _legacy_record(c, key, b"{}")
    c.fail(key, a.lease_token, retryable=False, error="declined",
           response=Response(402, {"Content-Type": "application/json"}, b'{"declined":true}'))
    s = Served(kind, svc)
    try:
        status, headers, got = s.post(key, b"{}")
        assert (status, got, headers["Idempotent-Replayed"]) == (402, b'{"declined":true}', "true")
        assert headers["Content-Type"] == "application/json"
        assert s.runs.total == 0
    finally:
        s.close()


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
def test_a_legacy_record_in_progress_gets_409_and_is_left_alone(svc: Svc, kind: str) -> None:
    c = Client(svc.base_url, svc.api_key)
    key = unique_key()
    _legacy_record(c, key, b"{}")
    s = Served(kind, svc)
    try:
        status, headers, got = s.post(key, b"{}")
        assert status == 409 and json.loads(got)["code"] == "in-progress"
        assert 1 <= int(headers["Retry-After"]) <= 30
        st = c.status(key)
        assert (st["state"], st["attempt"]) == ("in_progress", 1)
        assert s.runs.total == 0
    finally:
        s.close()


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
def test_the_legacy_lookup_never_acquires(svc: Svc, kind: str) -> None:
    """A retryable failure of the legacy fingerprint (which a begin would
    acquire), a record of another request, and a record deleted between the
    begin's 422 and the lookup: each gets 422, and no record is begun."""
    c = Client(svc.base_url, svc.api_key)
    s = Served(kind, svc)
    try:
        key = unique_key()
        a = _legacy_record(c, key, b"{}")
        c.fail(key, a.lease_token, retryable=True, error="try again")
        assert s.post(key, b"{}")[0] == 422
        st = c.status(key)
        assert (st["state"], st["attempt"]) == ("failed", 1)

        k2 = unique_key()
        _legacy_record(c, k2, b'{"other":1}')
        assert s.post(k2, b"{}")[0] == 422
        assert c.status(k2)["attempt"] == 1
        assert s.runs.total == 0
    finally:
        s.close()

    class Deleting:
        """The begin's 422 happens; the record is then deleted, as by its expiry, before the lookup."""

        def __init__(self, real: Any):
            self.real = real

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

        def status(self, key: str, *args: Any, **kw: Any) -> Any:
            c.delete(key)
            return self.real.status(key, *args, **kw)

    class AsyncDeleting(Deleting):
        async def status(self, key: str, *args: Any, **kw: Any) -> Any:  # type: ignore[override]
            c.delete(key)
            return await self.real.status(key, *args, **kw)

    s = Served(kind, svc)
    try:
        if isinstance(s.mw, WSGIMiddleware):
            s.mw.client = Deleting(s.mw.client)  # type: ignore[assignment]
        else:
            s.mw._aclient = AsyncDeleting(s.mw.client)  # type: ignore[assignment]
        key = unique_key()
        _legacy_record(c, key, b"{}")
        status, _, got = s.post(key, b"{}")
        assert status == 422 and json.loads(got)["code"] == "fingerprint-mismatch"
        from idemsvc import errors
        with pytest.raises(errors.NotFound):
            c.status(key)
        assert s.runs.total == 0
    finally:
        s.close()


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
def test_json_that_jcs_would_not_write_exactly_is_fingerprinted_raw(svc: Svc, kind: str) -> None:
    s = Served(kind, svc)
    try:
        key = unique_key()
        assert s.post(key, b'{"to_account":9007199254740993}')[0] == 201
        assert s.post(key, b'{"to_account":9007199254740992}')[0] == 422  # a double holds both as ...992
        assert s.post(key, b'{"to_account": 9007199254740993}')[0] == 422  # raw bytes: spacing counts
        assert s.post(key, b'{"to_account":9007199254740993}')[1]["Idempotent-Replayed"] == "true"
        k2 = unique_key()
        assert s.post(k2, b'{"a":1,"a":2}')[0] == 201
        assert s.post(k2, b'{"a":2}')[0] == 422  # a repeated name: not last-wins
        k3 = unique_key()
        assert s.post(k3, b'{"n":1e-400}')[0] == 201
        assert s.post(k3, b'{"n":0}')[0] == 422  # underflow: not 0
        assert s.runs.total == 3
    finally:
        s.close()


@pytest.mark.parametrize("svc", ["memory"], indirect=True)
def test_methods_are_taken_in_upper_case(svc: Svc, kind: str) -> None:
    s = Served(kind, svc, methods=["post"])
    try:
        key = unique_key()
        assert s.post(key, b"{}")[0] == 201
        assert s.post(key, b"{}")[1]["Idempotent-Replayed"] == "true"
        assert s.runs.total == 1
    finally:
        s.close()


def test_scope_with_unscoped_is_refused() -> None:
    with pytest.raises(ValueError, match="scope and unscoped"):
        WSGIMiddleware(wsgi_app(Runs()), Client("http://127.0.0.1:1", "k"), scope=user_header, unscoped=True)
    with pytest.raises(ValueError, match="scope and unscoped"):
        ASGIMiddleware(asgi_app(Runs()), AsyncClient("http://127.0.0.1:1", "k"), scope=user_header, unscoped=True)

"""Tokens and roles through the real app on a real Redis: 401 without a valid token, 403 for the
wrong role, tokens from settings (plain or sha256) and from the admin API, anonymous mode rules."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.app import create_app
from fxcc.service.settings import ServiceSettings, TokenEntry

CLIENT_TOKEN = "client-secret-1"
ADMIN_TOKEN = "admin-secret-2"

# One route per role and resource; the admin routes answer 403 to a client token.
CLIENT_ROUTES = [("GET", "/v1/jobs/" + "0" * 32, 404), ("GET", "/v1/jobs", 200), ("GET", "/v1/status", 200),
                 ("GET", "/v1/artifacts/" + "a" * 64, 404), ("GET", "/v1/pre-aot/" + "a" * 64, 404),
                 ("GET", "/v1/jobs/" + "0" * 32 + "/events", 404),
                 ("DELETE", "/v1/jobs/" + "0" * 32, 404)]
ADMIN_ROUTES = [("GET", "/v1/stats", 200), ("GET", "/v1/dead-letters", 200), ("GET", "/metrics", 200), ("GET", "/v1/cache", 200),
                ("DELETE", "/v1/cache/" + "a" * 64, 404), ("DELETE", "/v1/cache", 200),
                ("GET", "/v1/admin/tokens", 200), ("DELETE", "/v1/admin/tokens/nobody", 404)]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def settings(redis_settings: ServiceSettings) -> ServiceSettings:
    return redis_settings.model_copy(update={"anonymous": None, "tokens": [
        TokenEntry(name="ci", role="client", sha256=hashlib.sha256(CLIENT_TOKEN.encode()).hexdigest()),
        TokenEntry(name="ops", role="admin", token=SecretStr(ADMIN_TOKEN)),
    ]})


@pytest.fixture
def client(settings: ServiceSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.mark.parametrize(("method", "path", "ok"), CLIENT_ROUTES + ADMIN_ROUTES)
def test_no_or_wrong_token_is_401(client: TestClient, method: str, path: str, ok: int) -> None:
    for headers in ({}, bearer("wrong"), {"Authorization": f"Basic {CLIENT_TOKEN}"}, bearer("")):
        r = client.request(method, path, headers=headers)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", (headers, r.text)
        assert r.json()["error"] == "Unauthorized"
    assert client.request(method, path, headers=bearer(ADMIN_TOKEN)).status_code == ok


@pytest.mark.parametrize(("method", "path", "ok"), CLIENT_ROUTES)
def test_client_token_reads_and_compiles(client: TestClient, method: str, path: str, ok: int) -> None:
    assert client.request(method, path, headers=bearer(CLIENT_TOKEN)).status_code == ok


@pytest.mark.parametrize(("method", "path", "ok"), ADMIN_ROUTES)
def test_client_token_on_admin_route_is_403(client: TestClient, method: str, path: str, ok: int) -> None:
    r = client.request(method, path, headers=bearer(CLIENT_TOKEN))
    assert r.status_code == 403 and r.json()["error"] == "Forbidden" and "admin" in r.json()["message"]


def test_compile_needs_a_token(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    body = make_unary().model_dump_json()
    ctype = {"Content-Type": "application/json"}
    assert client.post("/v1/compile", content=body, headers=ctype).status_code == 401
    assert client.post("/v1/compile", content=body, headers={**ctype, **bearer(CLIENT_TOKEN)}).status_code == 202


def test_healthz_and_docs_stay_open(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/docs").status_code == 200 and "swagger" in client.get("/docs").text.lower()
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/compile", "/v1/jobs/{job_id}/events", "/v1/stats", "/metrics", "/v1/admin/tokens"} <= set(paths)


def test_admin_api_tokens(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    made = client.post("/v1/admin/tokens", json={"name": "laptop", "role": "client"}, headers=bearer(ADMIN_TOKEN))
    assert made.status_code == 201
    token = made.json()["token"]
    assert client.get("/v1/status", headers=bearer(token)).status_code == 200
    assert client.get("/v1/stats", headers=bearer(token)).status_code == 403
    assert client.post("/v1/admin/tokens", json={"name": "laptop"}, headers=bearer(ADMIN_TOKEN)).status_code == 409
    assert client.post("/v1/admin/tokens", json={"name": "ops"}, headers=bearer(ADMIN_TOKEN)).status_code == 409
    assert client.post("/v1/admin/tokens", json={"name": "x", "role": "root"},
                       headers=bearer(ADMIN_TOKEN)).status_code == 422

    listed = client.get("/v1/admin/tokens", headers=bearer(ADMIN_TOKEN)).json()
    assert {(t["name"], t["role"], t["source"]) for t in listed} == {
        ("ci", "client", "settings"), ("ops", "admin", "settings"), ("laptop", "client", "api")}
    # Stored hashed: neither the listing nor Redis holds the token itself.
    store = client.app.state.store
    assert token not in json.dumps(listed)
    assert all(token.encode() not in v for v in store.r.hvals(store.k.tokens))

    assert client.delete("/v1/admin/tokens/laptop", headers=bearer(ADMIN_TOKEN)).status_code == 204
    assert client.get("/v1/status", headers=bearer(token)).status_code == 401
    assert client.delete("/v1/admin/tokens/ops", headers=bearer(ADMIN_TOKEN)).status_code == 409
    assert all(s not in caplog.text for s in (token, ADMIN_TOKEN, CLIENT_TOKEN))


def test_a_token_made_on_one_replica_works_on_another(settings: ServiceSettings) -> None:
    with TestClient(create_app(settings)) as a, TestClient(create_app(settings)) as b:
        token = a.post("/v1/admin/tokens", json={"name": "shared", "role": "admin"},
                       headers=bearer(ADMIN_TOKEN)).json()["token"]
        assert b.get("/v1/stats", headers=bearer(token)).status_code == 200


def test_legacy_fxcc_token_is_admin(redis_settings: ServiceSettings) -> None:
    settings = redis_settings.model_copy(update={"anonymous": None, "token": SecretStr("s3cret")})
    with TestClient(create_app(settings)) as c:
        assert c.get("/v1/stats").status_code == 401
        assert c.get("/v1/stats", headers=bearer("s3cret")).status_code == 200


def test_anonymous_rules(redis_settings: ServiceSettings, embedded_settings: ServiceSettings,
                         caplog: pytest.LogCaptureFixture) -> None:
    # Redis without tokens and without FXCC_ANONYMOUS: nobody gets in, and the log says so.
    closed = redis_settings.model_copy(update={"anonymous": None})
    assert not closed.anonymous_allowed
    with caplog.at_level(logging.WARNING, logger="fxcc.service"), TestClient(create_app(closed)) as c:
        assert c.get("/v1/status").status_code == 401
    assert "no API token is configured" in caplog.text
    # Explicit anonymous mode: anonymous_role (client by default), so admin routes are 403.
    open_ = redis_settings.model_copy(update={"anonymous": True, "anonymous_role": "client"})
    with TestClient(create_app(open_)) as c:
        assert c.get("/v1/status").status_code == 200
        assert c.get("/v1/stats").status_code == 403
        assert c.get("/v1/status", headers=bearer("unknown")).status_code == 401  # a bad token is still bad
    # The embedded default on loopback: one local user, admin.
    assert embedded_settings.anonymous_allowed and embedded_settings.effective_anonymous_role == "admin"
    for host in ("0.0.0.0", "10.1.2.3"):
        assert not embedded_settings.model_copy(update={"host": host}).anonymous_allowed
    assert not embedded_settings.model_copy(update={"token": SecretStr("t")}).anonymous_allowed


def test_tokens_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    digest = hashlib.sha256(b"abc").hexdigest()
    monkeypatch.setenv("FXCC_TOKENS", json.dumps([{"name": "a", "role": "admin", "sha256": digest},
                                                  {"name": "b", "token": "plain"}]))
    monkeypatch.setenv("FXCC_ANONYMOUS", "1")
    s = ServiceSettings()
    assert [(t.name, t.role, t.sha256) for t in s.tokens] == [("a", "admin", digest), ("b", "client", None)]
    assert s.anonymous_allowed and s.effective_anonymous_role == "client"
    monkeypatch.setenv("FXCC_TOKENS", json.dumps([{"name": "c", "role": "admin"}]))
    with pytest.raises(ValueError, match="exactly one of sha256 and token"):
        ServiceSettings()

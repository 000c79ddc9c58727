"""The embedded default (anonymous access on loopback): only loopback Host names, no cross-origin
browser writes, no anonymous token minting; and its queue, capped and kept on disk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from fxcc.service.app import create_app
from fxcc.service.embedded_store import EmbeddedStore
from fxcc.service.settings import ServiceSettings
from fxcc.service.store import JobStage, QueueFull


@pytest.fixture
def default_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ServiceSettings:
    """`fxcc serve` as a user starts it: no Redis, no token, loopback; no in-process worker runs."""
    from fxcc.service import app as app_module

    monkeypatch.setattr(app_module, "start_embedded_workers", lambda store, settings, stop: [])
    settings = ServiceSettings(redis_url=None, data_dir=tmp_path / "data", compile_process_warm=False)
    assert settings.anonymous_allowed and settings.loopback_guard
    return settings


JSON = {"Content-Type": "application/json"}


def client_at(settings: ServiceSettings, base_url: str) -> TestClient:
    return TestClient(create_app(settings), base_url=base_url)


@pytest.fixture
def local(default_settings: ServiceSettings) -> Iterator[TestClient]:
    with client_at(default_settings, "http://localhost:8470") as c:
        yield c


@pytest.mark.parametrize("base_url", ["http://localhost:8470", "http://127.0.0.1", "http://[::1]:9",
                                      "http://LOCALHOST:1"])
def test_loopback_host_names_are_served(default_settings: ServiceSettings, base_url: str) -> None:
    with client_at(default_settings, base_url) as c:
        assert c.get("/v1/status").status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8470", "127.0.0.1.evil.example",
                                  "localhost.evil.example:8470", "10.0.0.1:8470", "testserver", ""])
def test_other_host_names_get_421(default_settings: ServiceSettings, make_unary, host: str) -> None:
    with client_at(default_settings, "http://localhost:8470") as c:
        for method, path, body in (("GET", "/v1/status", None), ("GET", "/healthz", None),
                                   ("POST", "/v1/compile", make_unary().model_dump_json()),
                                   ("POST", "/v1/admin/tokens", '{"name": "pwned", "role": "admin"}')):
            r = c.request(method, path, content=body, headers={"Host": host, "Content-Type": "application/json"})
            assert r.status_code == 421 and r.json()["error"] == "MisdirectedRequest", (method, path)
            assert "Host" in r.json()["message"]
    assert not (default_settings.data_dir / "tokens.json").exists()


def test_anonymous_never_mints_a_token(local: TestClient, default_settings: ServiceSettings) -> None:
    assert local.get("/v1/stats").status_code == 200  # still one user's admin for everything else
    for method, path in (("POST", "/v1/admin/tokens"), ("GET", "/v1/admin/tokens"),
                         ("DELETE", "/v1/admin/tokens/x")):
        r = local.request(method, path, json={"name": "pwned", "role": "admin"})
        assert r.status_code == 403 and "admin token" in r.json()["message"], (method, path)
    assert not (default_settings.data_dir / "tokens.json").exists()


def test_an_admin_token_still_makes_tokens(default_settings: ServiceSettings) -> None:
    settings = default_settings.model_copy(update={"token": SecretStr("root")})
    assert not settings.loopback_guard  # a token configured: anonymous access is off, no guard
    with client_at(settings, "http://fxcc.internal:8470") as c:
        r = c.post("/v1/admin/tokens", json={"name": "ci"}, headers={"Authorization": "Bearer root"})
        assert r.status_code == 201 and r.json()["token"]


def test_cross_origin_writes_are_403(local: TestClient, make_unary) -> None:
    body = make_unary().model_dump_json()
    json_ = {"Content-Type": "application/json"}
    for headers in ({"Origin": "http://evil.example"}, {"Origin": "http://localhost:9999"},
                    {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
        r = local.post("/v1/compile", content=body, headers={**json_, **headers})
        assert r.status_code == 403 and r.json()["error"] == "Forbidden", headers
        assert local.delete("/v1/cache", headers=headers).status_code == 403
    assert local.get("/v1/jobs", headers={"Origin": "http://evil.example"}).status_code == 200  # reads: no CORS
    same = local.post("/v1/compile", content=body, headers={**json_, "Origin": "http://localhost:8470",
                                                             "Sec-Fetch-Site": "same-origin"})
    assert same.status_code == 202
    assert local.post("/v1/compile", content=body, headers=json_).status_code == 202  # not a browser


def test_allowed_hosts_extend_the_loopback_names(default_settings: ServiceSettings) -> None:
    settings = default_settings.model_copy(update={"allowed_hosts": ["fxcc.lan"]})
    with client_at(settings, "http://fxcc.lan:8470") as c:
        assert c.get("/v1/status").status_code == 200
        assert c.get("/v1/status", headers={"Host": "evil.example"}).status_code == 421


def test_the_embedded_queue_is_capped(default_settings: ServiceSettings, make_unary) -> None:
    with client_at(default_settings.model_copy(update={"stream_max_len": 2}), "http://localhost") as c:
        for op in ("aten.sin.default", "aten.cos.default"):
            assert c.post("/v1/compile", content=make_unary(op).model_dump_json(), headers=JSON).status_code == 202
        r = c.post("/v1/compile", content=make_unary("aten.exp.default").model_dump_json(), headers=JSON)
        assert r.status_code == 503 and r.headers["Retry-After"] and "FXCC_STREAM_MAX_LEN" in r.json()["message"]
    store = EmbeddedStore(default_settings.data_dir / "other", stream_max_len=1)
    store.submit("a" * 64, "{}", "interactive")
    with pytest.raises(QueueFull):
        store.submit("b" * 64, "{}", "interactive")


def test_queued_and_running_jobs_survive_a_restart(tmp_path: Path, make_unary) -> None:
    first = EmbeddedStore(tmp_path / "data")
    reqs = {op: make_unary(op).model_dump_json() for op in ("aten.sin.default", "aten.cos.default",
                                                           "aten.exp.default")}
    ids = {op: first.submit(op[5:8] * 21 + "a", body, "interactive", principal="alice").job_id
           for op, body in reqs.items()}
    [claim] = first.claim("w", block_ms=10)
    running = claim.job_id
    first.mark_started(running, "w")
    first.mark_stage(running, JobStage.BUILDING)
    assert first.cancel(ids["aten.exp.default"]) == "cancelled"
    # The process dies here: nothing more is written.
    second = EmbeddedStore(tmp_path / "data")
    waiting = second.queue_depths()["interactive"]["waiting"]
    assert waiting == 2  # the cancelled job is not brought back
    for op in ("aten.sin.default", "aten.cos.default"):
        job = second.get_job(ids[op])
        assert job.stage is JobStage.QUEUED and job.principals == ["alice"]
        assert second.get_request(job.id) == reqs[op]
        assert job.attempt == (1 if job.id == running else 0)  # the crashed attempt counts
    assert second.get_job(ids["aten.exp.default"]) is None
    claimed = [c.job_id for c in (second.claim("w2", block_ms=10) + second.claim("w2", block_ms=10))]
    assert sorted(claimed) == sorted([ids["aten.sin.default"], ids["aten.cos.default"]])
    # Single flight holds across the restart: the same request joins the restored job.
    assert second.submit("sin" * 21 + "a", reqs["aten.sin.default"], "interactive", "bob").job_id \
        == ids["aten.sin.default"]

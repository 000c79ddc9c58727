"""Principals kept apart (jobs listed, read, cancelled only by those attached to them), per-principal
quotas, an admin's abort of a running job, and the request body kept out of the job record; each
against both stores through the HTTP API."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.app import create_app
from fxcc.service.settings import ServiceSettings, TokenEntry
from fxcc.service.store import JobError, JobStage

TOKENS = {"alice": "alice-token", "bob": "bob-token", "root": "root-token"}


def as_(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


def with_tokens(settings: ServiceSettings, **update: object) -> ServiceSettings:
    tokens = [TokenEntry(name=n, role="admin" if n == "root" else "client", token=SecretStr(t))
              for n, t in TOKENS.items()]
    return settings.model_copy(update={"anonymous": False, "tokens": tokens, **update})


@pytest.fixture(params=["redis", "embedded"])
def base_settings(request: pytest.FixtureRequest) -> ServiceSettings:
    return request.getfixturevalue(f"{request.param}_settings").model_copy(update={"embedded_workers": 1})


@pytest.fixture
def make_client(base_settings: ServiceSettings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., TestClient]]:
    """A TestClient of an app with tokens alice, bob (clients) and root (admin); no worker runs jobs
    (the embedded store's in-process workers are not started), so jobs stay where the test puts them."""
    from fxcc.service import app as app_module

    monkeypatch.setattr(app_module, "start_embedded_workers", lambda store, settings, stop: [])
    opened: list[TestClient] = []

    def make(**update: object) -> TestClient:
        c = TestClient(create_app(with_tokens(base_settings, **update)))
        c.__enter__()
        opened.append(c)
        return c

    yield make
    for c in opened:
        c.__exit__(None, None, None)


def post(client: TestClient, req: CompileRequest, who: str):
    return client.post("/v1/compile", content=req.model_dump_json(),
                       headers={"Content-Type": "application/json", **as_(who)})


def test_a_client_sees_and_cancels_only_its_own_jobs(make_client, make_unary) -> None:
    client = make_client()
    a = post(client, make_unary("aten.sin.default"), "alice").json()
    b = post(client, make_unary("aten.cos.default"), "bob").json()
    assert a["job_id"] != b["job_id"]

    def listed(who: str) -> list[str]:
        return [j["id"] for j in client.get("/v1/jobs", headers=as_(who)).json()]

    assert listed("alice") == [a["job_id"]] and listed("bob") == [b["job_id"]]
    assert set(listed("root")) == {a["job_id"], b["job_id"]}
    bobs_view = client.get("/v1/jobs", headers=as_("bob")).json()
    assert a["key"] not in {j["key"] for j in bobs_view}  # never another principal's key

    for path in (f"/v1/jobs/{a['job_id']}", f"/v1/jobs/{a['job_id']}/events"):
        r = client.get(path, headers=as_("bob"))
        assert r.status_code == 404 and r.json()["error"] == "NotFound"
    assert client.delete(f"/v1/jobs/{a['job_id']}", headers=as_("bob")).status_code == 404
    assert client.get(f"/v1/jobs/{a['job_id']}", headers=as_("alice")).json()["state"] == "queued"
    mine = client.get(f"/v1/jobs/{a['job_id']}", headers=as_("alice")).json()
    assert mine["principals"] == ["alice"]


def test_a_shared_job_is_detached_then_cancelled_by_its_last_principal(make_client, make_unary) -> None:
    client = make_client()
    req = make_unary("aten.sin.default")
    job_id = post(client, req, "alice").json()["job_id"]
    assert post(client, req, "bob").json()["job_id"] == job_id  # single flight: one job, two principals
    assert client.get(f"/v1/jobs/{job_id}", headers=as_("root")).json()["principals"] == ["alice", "bob"]
    assert client.get(f"/v1/jobs/{job_id}", headers=as_("bob")).json()["principals"] == ["bob"]

    r = client.delete(f"/v1/jobs/{job_id}", headers=as_("alice"))
    assert r.status_code == 200 and r.json()["state"] == "queued"  # bob still waits on it
    assert client.get(f"/v1/jobs/{job_id}", headers=as_("alice")).status_code == 404
    assert client.get("/v1/jobs", headers=as_("alice")).json() == []
    assert client.get(f"/v1/jobs/{job_id}", headers=as_("bob")).json()["state"] == "queued"
    assert client.app.state.store.get_job(job_id).principals == ["bob"]

    r = client.delete(f"/v1/jobs/{job_id}", headers=as_("bob"))
    assert r.status_code == 200 and r.json()["state"] == "cancelled"


def test_quotas_refuse_one_principal_with_429_and_not_the_others(make_client, make_unary) -> None:
    client = make_client(quota_queued_jobs=2, quota_retry_after_s=7)
    ops = ("aten.sin.default", "aten.cos.default", "aten.exp.default")
    ids = [post(client, make_unary(op), "alice").json()["job_id"] for op in ops[:2]]
    r = post(client, make_unary(ops[2]), "alice")
    assert r.status_code == 429 and r.headers["Retry-After"] == "7"
    assert r.headers["X-Fxcc-Quota"] == "FXCC_QUOTA_QUEUED_JOBS"
    assert r.json()["error"] == "QuotaExceeded" and "FXCC_QUOTA_QUEUED_JOBS" in r.json()["message"]
    assert "'alice'" in r.json()["message"]
    assert post(client, make_unary(ops[2]), "bob").status_code == 202  # bob keeps working
    # Joining a job that exists costs nothing: alice, at her quota, may still wait on bob's.
    assert post(client, make_unary(ops[2]), "alice").status_code == 202
    client.delete(f"/v1/jobs/{ids[0]}", headers=as_("alice"))
    client.delete(f"/v1/jobs/{ids[1]}", headers=as_("alice"))
    client.delete("/v1/jobs/" + post(client, make_unary(ops[2]), "alice").json()["job_id"], headers=as_("alice"))
    assert post(client, make_unary("aten.neg.default"), "alice").status_code == 202  # the quota came back


def test_the_byte_quota_counts_request_bodies(make_client, make_unary) -> None:
    one = len(make_unary("aten.sin.default").model_dump_json().encode())
    client = make_client(quota_queued_bytes=one + one // 2)
    assert post(client, make_unary("aten.sin.default"), "alice").status_code == 202
    r = post(client, make_unary("aten.cos.default"), "alice")
    assert r.status_code == 429 and "FXCC_QUOTA_QUEUED_BYTES" in r.json()["message"]
    assert r.headers["X-Fxcc-Quota"] == "FXCC_QUOTA_QUEUED_BYTES"
    assert post(client, make_unary("aten.cos.default"), "bob").status_code == 202


def test_an_admin_aborts_a_running_job_and_the_worker_cannot_revive_it(make_client, make_unary) -> None:
    client = make_client(quota_queued_jobs=1)
    job_id = post(client, make_unary(), "alice").json()["job_id"]
    store = client.app.state.store
    [claim] = store.claim("w", block_ms=100)
    assert store.mark_started(job_id, "w") is not None
    r = client.delete(f"/v1/jobs/{job_id}", headers=as_("alice"))
    assert r.status_code == 409 and "lowering" in r.json()["message"]

    r = client.delete(f"/v1/jobs/{job_id}", headers=as_("root"))
    assert r.status_code == 200 and r.json()["stage"] == "cancelled"
    assert r.json()["error"]["message"] == "aborted by root"
    # What the worker compiling it sees when it polls, and what its late reports do: nothing.
    assert store.get_job(job_id).stage is JobStage.CANCELLED
    store.mark_stage(job_id, JobStage.STORING)
    store.mark_done(job_id, {"kernels": 1})
    store.mark_failed(job_id, JobError(error="X", message="late"), dead_letter=True)
    store.retry(claim, JobError(error="X", message="late"))
    job = store.get_job(job_id)
    assert job.stage is JobStage.CANCELLED and job.error.message == "aborted by root" and job.stats is None
    assert store.get_request(job_id) is None and store.dead_letters(10) == []
    assert client.delete(f"/v1/jobs/{job_id}", headers=as_("root")).status_code == 409
    # The abort gave alice's quota back.
    assert post(client, make_unary("aten.cos.default"), "alice").status_code == 202


def test_the_request_body_lives_apart_and_goes_when_the_job_ends(redis_settings: ServiceSettings, make_unary) -> None:
    big = make_unary(sizes=(4, 8))
    with TestClient(create_app(with_tokens(redis_settings))) as client:
        store = client.app.state.store
        job_id = post(client, big, "alice").json()["job_id"]
        fields = store.r.hgetall(store.k.job(job_id))
        assert b"request" not in fields and int(fields[b"bytes"]) == len(big.model_dump_json().encode())
        assert store.r.get(store.k.request(job_id)) == big.model_dump_json().encode()
        assert CompileRequest.model_validate_json(store.get_request(job_id)) == big
        assert client.delete(f"/v1/jobs/{job_id}", headers=as_("alice")).json()["state"] == "cancelled"
        assert store.r.exists(store.k.request(job_id)) == 0 and store.get_request(job_id) is None
        assert store.r.exists(store.k.quota("alice")) == 0  # nothing left charged

        for end in ("done", "failed"):
            job_id = post(client, make_unary("aten.cos.default" if end == "done" else "aten.exp.default"),
                          "alice").json()["job_id"]
            [claim] = store.claim("w", block_ms=100)
            store.mark_started(claim.job_id, "w")
            if end == "done":
                store.mark_done(job_id, {})
            else:
                store.mark_failed(job_id, JobError(error="X", message="no"))
            store.ack(claim)
            assert store.r.exists(store.k.request(job_id)) == 0
            assert store.get_job(job_id).state.value == end
        assert store.r.exists(store.k.quota("alice")) == 0


def test_a_client_is_not_shown_the_jobs_workers_hold(redis_settings: ServiceSettings) -> None:
    with TestClient(create_app(with_tokens(redis_settings))) as client:
        client.app.state.store.heartbeat("w1", {"id": "w1", "device": "cpu", "jobs": ["0" * 32]}, [])
        [worker] = client.get("/v1/status", headers=as_("alice")).json()["workers"]
        assert worker["id"] == "w1" and "jobs" not in worker
        [worker] = client.get("/v1/status", headers=as_("root")).json()["workers"]
        assert worker["jobs"] == ["0" * 32]

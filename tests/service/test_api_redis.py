"""The HTTP API on a real Redis: single flight, a job's life through process_job, failures, counters."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.app import create_app
from fxcc.service.redis_store import RedisStore
from fxcc.service.settings import ServiceSettings
from fxcc.worker.process import process_claim


@pytest.fixture
def client(redis_settings: ServiceSettings) -> Iterator[TestClient]:
    with TestClient(create_app(redis_settings)) as c:
        yield c


def store_of(client: TestClient) -> RedisStore:
    return client.app.state.store


def post(client: TestClient, req: CompileRequest):
    return client.post("/v1/compile", content=req.model_dump_json(), headers={"Content-Type": "application/json"})


def run_queued_jobs(store: RedisStore) -> list[str]:
    """What one worker would do right now: claim, process and ack every queued job."""
    done = []
    while claims := store.claim("test-worker", block_ms=10):
        for c in claims:
            process_claim(store, c, worker="test-worker")
            done.append(c.job_id)
    return done


def test_two_identical_posts_share_one_job(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    a = post(client, make_unary())
    b = post(client, make_unary())
    assert a.status_code == b.status_code == 202
    assert a.json()["job_id"] == b.json()["job_id"]
    assert a.json() == {"status": "queued", "key": compile_key(make_unary()), "job_id": a.json()["job_id"]}


def test_sixteen_concurrent_posts_make_one_job(client: TestClient,
                                               make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary("aten.cos.default", sizes=(3, 5))
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: post(client, req), range(16)))
    assert {r.status_code for r in answers} == {202}
    assert len({r.json()["job_id"] for r in answers}) == 1
    store = store_of(client)
    assert store.r.xlen(store.k.interactive) == 1


def test_job_lifecycle(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary()
    queued = post(client, req).json()
    job = client.get(f"/v1/jobs/{queued['job_id']}").json()
    assert job["state"] == job["stage"] == "queued" and job["attempt"] == 0 and job["started_at"] is None
    assert list(job["stages"]) == ["queued"]
    assert client.get(f"/v1/jobs/{queued['job_id']}", params={"wait": 0.2}).json()["state"] == "queued"

    assert run_queued_jobs(store_of(client)) == [queued["job_id"]]

    job = client.get(f"/v1/jobs/{queued['job_id']}", params={"wait": 5}).json()
    assert set(job) == {"id", "key", "kind", "arch", "state", "stage", "stages", "priority", "created_at",
                        "started_at", "finished_at", "worker", "attempt", "error", "stats", "principals",
                        "request_bytes", "name", "parent", "tasks"}
    assert (job["kind"], job["arch"], job["tasks"]) == ("compile", None, [])
    assert job["state"] == job["stage"] == "done" and job["worker"] == "test-worker" and job["attempt"] == 1
    assert list(job["stages"]) == ["queued", "lowering", "storing", "done"]
    assert job["key"] == queued["key"] and job["priority"] == "interactive" and job["error"] is None
    assert job["created_at"] <= job["started_at"] <= job["finished_at"]
    assert job["stats"]["nodes"] == 1 and "kernels" in job["stats"]

    art = client.get(f"/v1/artifacts/{queued['key']}").json()
    assert art["manifest"]["key"] == queued["key"] and isinstance(art["blobs"], dict)
    assert art["signature"] is None
    assert client.get(f"/v1/artifacts/{queued['key']}", params={"blobs": 0}).json() == {
        "manifest": art["manifest"], "signature": None}

    again = post(client, req)
    assert again.status_code == 200
    assert again.json() == {"status": "done", "key": queued["key"], "manifest": art["manifest"]}
    # Every look-up counts: the POST's miss, the two GETs' hits and this POST's hit.
    counters = store_of(client).counters()
    assert (counters["misses"], counters["hits"], counters["puts"]) == (1, 3, 1) and counters["bytes"] > 0


def test_failed_compile_is_recorded(client: TestClient, make_sum: Callable[[int], CompileRequest]) -> None:
    # The service rejects this spec; queue it behind the service's back to check that the worker
    # re-validates and records the failure rather than trusting what reached the queue.
    store = store_of(client)
    bad = make_sum(7)
    key = compile_key(bad)
    job_id = store.submit(key, bad.model_dump_json(), "interactive").job_id
    run_queued_jobs(store)
    job = client.get(f"/v1/jobs/{job_id}", params={"wait": 5}).json()
    assert job["state"] == "failed" and job["stats"] is None and job["finished_at"] is not None
    assert job["error"]["error"] == "InvalidGraph"
    assert job["error"]["node"] == "total" and job["error"]["op"] == "aten.sum.dim_IntList"
    # The single-flight entry is gone, so a retry gets a fresh job.
    retry = store.submit(key, bad.model_dump_json(), "interactive")
    assert retry.created and retry.job_id != job_id


def test_dead_letters_route(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    store = store_of(client)
    queued = post(client, make_unary()).json()
    [claim] = store.claim("w", block_ms=10)
    for worker in ("dead-1", "dead-2", "dead-3"):  # three workers started it and died
        store.mark_started(queued["job_id"], worker, takeover=True)
    process_claim(store, claim, worker="w")
    [dead] = client.get("/v1/dead-letters").json()
    assert dead["job_id"] == queued["job_id"] and dead["key"] == queued["key"] and dead["attempts"] == 3
    assert dead["error"]["error"] == "TooManyAttempts"
    assert client.get(f"/v1/jobs/{queued['job_id']}").json()["state"] == "failed"


def test_corrupt_request_in_queue_fails_cleanly(client: TestClient,
                                               make_unary: Callable[..., CompileRequest]) -> None:
    store = store_of(client)
    req = make_unary()
    payload = json.loads(req.model_dump_json())
    payload["graph"]["nodes"][0]["target"] = {"__reduce__": "os.system"}
    job_id = store.submit(compile_key(req), json.dumps(payload), "interactive").job_id
    run_queued_jobs(store)
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "failed" and "invalid request" in job["error"]["message"]


def test_precompile_priority_is_recorded(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    queued = post(client, make_unary(priority="precompile")).json()
    assert client.get(f"/v1/jobs/{queued['job_id']}").json()["priority"] == "precompile"
    store = store_of(client)
    assert store.r.xlen(store.k.precompile) == 1


def test_healthz_redis(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"ok": True, "store": "redis"}


def test_status_shows_queue_workers_and_cache(client: TestClient,
                                              make_unary: Callable[..., CompileRequest]) -> None:
    store = store_of(client)
    post(client, make_unary())
    post(client, make_unary("aten.cos.default", priority="precompile"))
    store.heartbeat("w-1", {"id": "w-1", "device": "cpu"}, [])
    status = client.get("/v1/status").json()
    assert status["store"] == "redis"
    assert status["queue"] == {"interactive": {"waiting": 1, "running": 0},
                               "precompile": {"waiting": 1, "running": 0},
                               "tune": {"waiting": 0, "running": 0},
                               "builds": {"waiting": 0, "running": 0},
                               "dead_letter": {"waiting": 0, "running": 0}}
    [worker] = status["workers"]
    assert worker["id"] == "w-1" and worker["device"] == "cpu" and worker["beat_at"] > 0
    [claim] = store.claim("w-1", block_ms=10)
    assert client.get("/v1/status").json()["queue"]["interactive"] == {"waiting": 0, "running": 1}
    process_claim(store, claim, worker="w-1")
    status = client.get("/v1/status").json()
    assert status["queue"]["interactive"] == {"waiting": 0, "running": 0}
    assert status["cache"]["misses"] == 2 and status["cache"]["puts"] == 1


def test_a_manifest_whose_blob_was_evicted_is_compiled_again(client: TestClient,
                                                             make_unary: Callable[..., CompileRequest]) -> None:
    # A cache Redis under allkeys-lru may drop a blob and keep its manifest: that is a miss, not a hit
    # that the client could never load.
    req = make_unary()
    queued = post(client, req).json()
    store = store_of(client)
    run_queued_jobs(store)
    manifest = store.get_manifest(queued["key"])
    assert manifest.kernels, "the test needs an artifact with a blob"
    store.c.delete(store.k.blob(manifest.kernels[0].source.digest))
    assert client.get(f"/v1/artifacts/{queued['key']}").status_code == 404
    assert client.get(f"/v1/artifacts/{queued['key']}", params={"blobs": 0}).status_code == 404
    again = post(client, req)
    assert again.status_code == 202 and again.json()["job_id"] != queued["job_id"]
    run_queued_jobs(store)
    assert client.get(f"/v1/jobs/{again.json()['job_id']}").json()["state"] == "done"
    assert client.get(f"/v1/artifacts/{queued['key']}").status_code == 200

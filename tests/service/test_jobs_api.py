"""The jobs resource on a real Redis: stages over SSE, cancel, recent-jobs listing, queue limits."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.app import create_app
from fxcc.service.redis_store import RedisStore
from fxcc.service.settings import ServiceSettings
from fxcc.worker.process import process_claim


@pytest.fixture
def client(redis_settings: ServiceSettings) -> Iterator[TestClient]:
    with TestClient(create_app(redis_settings)) as c:
        yield c


def post(client: TestClient, req: CompileRequest):
    return client.post("/v1/compile", content=req.model_dump_json(), headers={"Content-Type": "application/json"})


def read_events(client: TestClient, job_id: str, first: threading.Event | None = None) -> list[tuple[str, dict]]:
    events = []
    with client.stream("GET", f"/v1/jobs/{job_id}/events") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
                if first is not None:
                    first.set()
    return events


def test_events_stream_follows_the_job_to_done(client: TestClient,
                                               make_unary: Callable[..., CompileRequest]) -> None:
    job_id = post(client, make_unary()).json()["job_id"]
    store: RedisStore = client.app.state.store
    got: list[tuple[str, dict]] = []
    connected = threading.Event()
    reader = threading.Thread(target=lambda: got.extend(read_events(client, job_id, connected)))
    reader.start()
    assert connected.wait(30)
    [claim] = store.claim("w", block_ms=100)
    process_claim(store, claim, worker="w")
    reader.join(timeout=30)
    assert not reader.is_alive()
    stages = [data["stage"] for _, data in got]
    assert {name for name, _ in got} == {"stage"}
    assert stages[0] == "queued" and stages[-1] == "done"
    order = ["queued", "lowering", "storing", "done"]
    assert stages == sorted(set(stages), key=order.index)  # in order, none twice
    assert got[-1][1]["worker"] == "w" and got[-1][1]["stats"]["nodes"] == 1
    # A finished job's stream is its final record, then the end.
    assert [d["stage"] for _, d in read_events(client, job_id)] == ["done"]


def test_cancel_a_queued_job(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary()
    job_id = post(client, req).json()["job_id"]
    r = client.delete(f"/v1/jobs/{job_id}")
    assert r.status_code == 200 and r.json()["state"] == "cancelled" and r.json()["finished_at"]
    assert list(r.json()["stages"]) == ["queued", "cancelled"]
    store: RedisStore = client.app.state.store
    assert store.claim("w", block_ms=10) == []  # its stream entry is gone
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 409
    # The key is free again: the same request makes a new job.
    again = post(client, req).json()["job_id"]
    assert again != job_id
    assert client.get(f"/v1/jobs/{job_id}/events").status_code == 200


def test_cancel_a_running_or_finished_job_is_409(redis_settings: ServiceSettings,
                                                 make_unary: Callable[..., CompileRequest]) -> None:
    # A client's DELETE (an admin's aborts a running job: tests/service/test_principals.py).
    with TestClient(create_app(redis_settings.model_copy(update={"anonymous_role": "client"}))) as client:
        cancel_running_and_finished(client, make_unary)


def cancel_running_and_finished(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    job_id = post(client, make_unary()).json()["job_id"]
    store: RedisStore = client.app.state.store
    [claim] = store.claim("w", block_ms=100)
    store.mark_started(job_id, "w")
    r = client.delete(f"/v1/jobs/{job_id}")
    assert r.status_code == 409 and r.json()["error"] == "Conflict" and "lowering" in r.json()["message"]
    process_claim(store, replace(claim, reclaimed=True), worker="w")
    assert client.get(f"/v1/jobs/{job_id}").json()["state"] == "done"
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 409
    assert client.delete("/v1/jobs/" + "0" * 32).status_code == 404


def test_list_recent_jobs(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    ids = [post(client, make_unary(op)).json()["job_id"] for op in ("aten.sin.default", "aten.cos.default",
                                                                    "aten.exp.default")]
    client.delete(f"/v1/jobs/{ids[1]}")
    listed = client.get("/v1/jobs").json()
    assert [j["id"] for j in listed] == ids[::-1]
    assert [j["id"] for j in client.get("/v1/jobs", params={"state": "queued"}).json()] == [ids[2], ids[0]]
    assert [j["id"] for j in client.get("/v1/jobs", params={"state": "cancelled"}).json()] == [ids[1]]
    assert [j["id"] for j in client.get("/v1/jobs", params={"limit": 1}).json()] == [ids[2]]
    assert client.get("/v1/jobs", params={"state": "compiling"}).status_code == 422
    assert client.get("/v1/jobs", params={"limit": 0}).status_code == 422


def test_full_queue_is_503_with_retry_after(redis_settings: ServiceSettings,
                                            make_unary: Callable[..., CompileRequest]) -> None:
    with TestClient(create_app(redis_settings.model_copy(update={"stream_max_len": 2}))) as client:
        for op in ("aten.sin.default", "aten.cos.default"):
            assert post(client, make_unary(op)).status_code == 202
        r = post(client, make_unary("aten.exp.default"))
        assert r.status_code == 503 and r.headers["Retry-After"] and r.json()["error"] == "QueueFull"
        assert post(client, make_unary("aten.sin.default")).status_code == 202  # joining is still fine


def test_heartbeat_renews_the_single_flight_entry(client: TestClient,
                                                  make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary()
    queued = post(client, req).json()
    store: RedisStore = client.app.state.store
    [claim] = store.claim("w", block_ms=100)
    store.mark_started(claim.job_id, "w")
    store.r.pexpire(store.k.inflight(queued["key"]), 5_000)  # as if most of inflight_ttl_s had passed
    store.heartbeat("w", {"id": "w"}, [claim])
    assert store.r.pttl(store.k.inflight(queued["key"])) > 5_000
    assert post(client, req).json()["job_id"] == queued["job_id"]

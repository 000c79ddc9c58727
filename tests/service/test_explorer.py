"""The compile explorer (GET /v1/jobs/{id}/explorer) and the per-minute counters behind the
dashboard's charts (GET /v1/stats/history), on a real Redis and the embedded store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from fastapi.testclient import TestClient
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.app import create_app
from fxcc.service.settings import ServiceSettings
from fxcc.worker.process import process_claim
from tests.service.conftest import principal_auth, unary_request


def _softmax_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1) @ w


def softmax_mm_request() -> CompileRequest:
    """A softmax fused into kernels, then a matmul that stays an extern call."""
    x, w = torch.randn(4, 16), torch.randn(16, 8)
    with torch.no_grad():
        gm = make_fx(_softmax_mm, decomposition_table=core_aten_decompositions())(x, w)
    return CompileRequest(graph=capture_graph(gm, [x, w]).spec)


@pytest.fixture
def client(redis_settings: ServiceSettings) -> Iterator[TestClient]:
    with TestClient(create_app(redis_settings)) as c:
        yield c


def test_explorer_shows_what_the_compile_did(client: TestClient) -> None:
    job_id = client.post("/v1/compile", content=softmax_mm_request().model_dump_json(),
                         headers={"Content-Type": "application/json"}).json()["job_id"]
    queued = client.get(f"/v1/jobs/{job_id}/explorer").json()
    assert queued["artifact"] is False and queued["job"]["stage"] == "queued" and queued["kernels"] == []
    store = client.app.state.store
    [claim] = store.claim("w", block_ms=100)
    process_claim(store, claim, worker="w")

    x = client.get(f"/v1/jobs/{job_id}/explorer").json()
    assert x["artifact"] is True and x["job"]["state"] == "done" and x["target"] == "interpret"
    assert {"queued", "lowering", "done"} <= set(x["job"]["stages"])
    manifest = client.get(f"/v1/artifacts/{x['job']['key']}", params={"blobs": 0}).json()["manifest"]
    assert [k["name"] for k in x["kernels"]] == [k["name"] for k in manifest["kernels"]]
    assert x["stats"]["kernels"] == len(x["kernels"]) >= 1
    for k in x["kernels"]:
        assert "@triton.jit" in k["source"] and f"def {k['name']}(" in k["source"] and k["launches"] >= 1
    assert [e["op"] for e in x["externs"]] == ["aten.mm.default"]
    stages = {e["stage"]: e["text"] for e in x["stages"]}
    assert set(stages) == {"graph", "schedule", "plan", "guards"}
    assert "aten.mm.default(_softmax, w_1)" in stages["graph"] and "aten._softmax.default" in stages["graph"]
    assert "kernel (" in stages["schedule"] and "extern aten.mm.default" in stages["schedule"]
    assert "static sizes" in stages["guards"]
    # the stage log is one of the artifact's blobs, named by its signed manifest
    full = client.get(f"/v1/artifacts/{x['job']['key']}").json()
    assert manifest["stage_log"]["digest"] in full["blobs"]


def test_another_principals_job_is_not_found(two_principals: TestClient) -> None:
    job_id = two_principals.post("/v1/compile", content=unary_request().model_dump_json(),
                                 headers={"Content-Type": "application/json", **principal_auth("ci-a")}).json()["job_id"]
    own = two_principals.get(f"/v1/jobs/{job_id}/explorer", headers=principal_auth("ci-a"))
    assert own.status_code == 200 and own.json()["job"]["id"] == job_id
    other = two_principals.get(f"/v1/jobs/{job_id}/explorer", headers=principal_auth("ci-b"))
    assert other.status_code == 404
    assert two_principals.get(f"/v1/jobs/{job_id}/explorer").status_code == 401  # no token at all


def test_minutes_keep_the_first_sample_and_history_serves_the_last_hour(store, embedded_settings) -> None:
    import time

    from fxcc.service.stats import record_minute

    now = time.time()
    minute = int(now // 60)
    store.record_minute(minute - 90, {"hits": 1, "misses": 1})  # older than the hour served
    store.record_minute(minute - 2, {"hits": 5, "misses": 5, "puts": 0, "rejected": 0})
    store.record_minute(minute - 2, {"hits": 99, "misses": 99})  # another process, the same minute: kept first
    store.count("hits", 3)
    assert record_minute(store, now) == minute
    got = store.minutes(minute - 60, minute)
    assert [m["minute"] for m in got] == [minute - 2, minute]
    assert got[0]["hits"] == 5 and got[1]["hits"] == store.counters()["hits"]
    assert store.minutes(minute - 100, minute)[0]["minute"] == minute - 90


def test_history_route_is_for_admins(two_principals: TestClient) -> None:
    assert two_principals.get("/v1/stats/history", headers=principal_auth("ci-a")).status_code == 403

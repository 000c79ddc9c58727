"""Embedded mode end to end (no Redis): POST → 202 → in-process worker → done → artifact → cached 200."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

from fastapi.testclient import TestClient

from fxcc.compiler_core.artifact import Artifact, manifest_from_json
from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.app import create_app
from fxcc.service.settings import ServiceSettings


def post(client: TestClient, req: CompileRequest):
    return client.post("/v1/compile", content=req.model_dump_json(), headers={"Content-Type": "application/json"})


def test_embedded_end_to_end(embedded_settings: ServiceSettings,
                             make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary()
    with TestClient(create_app(embedded_settings)) as client:
        assert client.get("/healthz").json() == {"ok": True, "store": "embedded"}
        queued = post(client, req)
        assert queued.status_code == 202 and queued.json()["status"] == "queued"
        job_id, key = queued.json()["job_id"], queued.json()["key"]

        job = client.get(f"/v1/jobs/{job_id}", params={"wait": 30}).json()
        assert job["state"] == "done", job
        assert job["worker"] == "embedded-0" and job["attempt"] == 1 and job["stats"]["nodes"] == 1

        body = client.get(f"/v1/artifacts/{key}").json()
        art = Artifact(manifest_from_json(json.dumps(body["manifest"])),
                       {d: base64.b64decode(b) for d, b in body["blobs"].items()})
        art.verify()
        assert art.manifest.key == key

        again = post(client, req)
        assert again.status_code == 200
        assert again.json() == {"status": "done", "key": key, "manifest": body["manifest"]}
        status = client.get("/v1/status").json()
        assert (status["cache"]["misses"], status["cache"]["hits"], status["cache"]["puts"]) == (1, 2, 1)
        assert status["queue"]["interactive"] == {"waiting": 0, "running": 0}
        stats = client.get("/v1/stats").json()
        assert [w["jobs_done"] for w in stats["workers"]] == [1]  # the embedded worker's one job

    # The artifact outlives the process: a new service on the same data dir answers from disk.
    with TestClient(create_app(embedded_settings)) as client:
        assert post(client, req).status_code == 200


def test_embedded_failure_is_recorded(embedded_settings: ServiceSettings,
                                      make_sum: Callable[[int], CompileRequest]) -> None:
    with TestClient(create_app(embedded_settings)) as client:
        store = client.app.state.store
        bad = make_sum(5)
        job_id = store.submit("f" * 64, bad.model_dump_json(), "interactive").job_id
        job = client.get(f"/v1/jobs/{job_id}", params={"wait": 30}).json()
        assert job["state"] == "failed" and job["error"]["error"] == "InvalidGraph"
        assert job["error"]["node"] == "total"


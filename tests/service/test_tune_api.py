"""Tune jobs over HTTP, on a real Redis and in embedded mode: counts in /v1/status, /v1/stats and /metrics,
job records in /v1/jobs, cancelling; the embedded service's in-process worker takes tune jobs only
on a GPU of the job's arch (faked here: torch sees no GPU on this machine), also those a restarted
service finds left from before."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from fxcc.compiler_core.wire import CompileRequest, Target
from fxcc.service.app import create_app
from fxcc.service.settings import ServiceSettings
from fxcc.service.store import JobStage
from fxcc.worker import process, tune
from fxcc.worker.process import JobPolicy, process_claim


def post(client: TestClient, req: CompileRequest):
    return client.post("/v1/compile", content=req.model_dump_json(), headers={"Content-Type": "application/json"})


def sm90(req: CompileRequest) -> CompileRequest:
    return req.model_copy(update={"options": req.options.model_copy(update={"target": Target(kind="cuda", arch=90)})})


@pytest.fixture(params=["redis", "embedded"])
def client(request: pytest.FixtureRequest) -> Iterator[TestClient]:
    settings: ServiceSettings = request.getfixturevalue(f"{request.param}_settings")
    with TestClient(create_app(settings.model_copy(update={"embedded_device": "cpu"}))) as c:
        yield c


def compile_on_cpu(client: TestClient, req: CompileRequest) -> dict:
    """POST `req` and let a CPU worker compile it: the embedded one, or one run here against Redis."""
    queued = post(client, req).json()
    store = client.app.state.store
    if store.mode == "redis":
        [claim] = store.claim("cpu-worker", block_ms=100)
        process_claim(store, claim, worker="cpu-worker", policy=JobPolicy())
    job = client.get(f"/v1/jobs/{queued['job_id']}", params={"wait": 60}).json()
    assert job["state"] == "done", job
    return job


def test_tune_jobs_are_counted_listed_and_cancellable(client: TestClient,
                                                      make_unary: Callable[..., CompileRequest]) -> None:
    key = compile_on_cpu(client, sm90(make_unary()))["key"]
    compile_on_cpu(client, make_unary("aten.cos.default"))  # the CPU worker claimed again after queueing it
    waiting = {"waiting": 1, "running": 0}
    stats = client.get("/v1/stats").json()
    assert stats["queue"]["tune"] == waiting and stats["tune"] == {"sm_90": waiting}
    status = client.get("/v1/status").json()
    assert status["queue"]["tune"] == waiting and status["tune"] == {"sm_90": waiting}
    assert 'fxcc_tune_waiting_jobs{arch="sm_90"} 1' in client.get("/metrics").text.splitlines()

    [job] = client.get("/v1/jobs", params={"state": "queued"}).json()
    assert (job["kind"], job["arch"], job["key"], job["stage"]) == ("tune", 90, key, "queued")
    assert client.get(f"/v1/jobs/{job['id']}").json()["kind"] == "tune"
    assert stats["jobs"]["queued"] == 1 and stats["jobs"]["done"] == 2

    store = client.app.state.store
    [claim] = store.claim("gpu", block_ms=10, tune_arch=90)
    store.mark_started(claim.job_id, "gpu", stage=JobStage.AUTOTUNING)
    assert client.get("/v1/status").json()["tune"] == {"sm_90": {"waiting": 0, "running": 1}}
    r = client.delete(f"/v1/jobs/{job['id']}")  # the (anonymous) admin aborts it while a GPU worker holds it
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert r.json()["error"]["message"] == "aborted by anonymous"
    store.requeue(claim)  # its worker lets go: the job stays cancelled, and is not queued again
    assert client.get(f"/v1/jobs/{job['id']}").json()["state"] == "cancelled"
    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 409
    assert client.get("/v1/stats").json()["tune"] == {"sm_90": {"waiting": 0, "running": 0}}


@pytest.fixture
def fake_sm90(monkeypatch: pytest.MonkeyPatch) -> None:
    """An sm_90 GPU at cuda:0 for the embedded worker's set-up and for tune jobs, which record a
    made-up tuning in the worker's compile process (FXCC_TEST_ONLY_FAKE_TUNE: "Fake GPU at cuda:0").
    Compiles do not tune (process.tuning_device stays real: no GPU), so artifacts are stored untuned first."""
    monkeypatch.setattr(process, "device_arch", lambda device: 90 if device == "cuda:0" else None)
    monkeypatch.setattr(tune, "tuning_device", lambda arch, device: device if arch == 90 else None)


def test_embedded_service_on_a_gpu_tunes_the_untuned_artifacts_of_its_arch(
        embedded_settings: ServiceSettings, make_unary: Callable[..., CompileRequest], fake_sm90: None) -> None:
    settings = embedded_settings.model_copy(update={"embedded_device": "cuda:0", "test_only_fake_tune": True})
    with TestClient(create_app(settings)) as client:
        compiled = client.get(f"/v1/jobs/{post(client, sm90(make_unary())).json()['job_id']}",
                              params={"wait": 60}).json()
        assert compiled["state"] == "done" and compiled["kind"] == "compile"
        [job] = [j for j in client.get("/v1/jobs").json() if j["kind"] == "tune"]
        job = client.get(f"/v1/jobs/{job['id']}", params={"wait": 60}).json()
        assert job["state"] == "done" and job["worker"] == "embedded-0" and job["key"] == compiled["key"], job
        manifest = client.get(f"/v1/artifacts/{compiled['key']}").json()["manifest"]
        assert manifest["tuned"] and all(k["tuning"]["device"] == "Fake GPU at cuda:0" for k in manifest["kernels"])
        [worker] = client.get("/v1/stats").json()["workers"]
        assert (worker["device"], worker["tune_arch"]) == ("cuda:0", 90)


def test_a_restarted_embedded_service_tunes_what_it_stored_untuned_before(
        embedded_settings: ServiceSettings, make_unary: Callable[..., CompileRequest], fake_sm90: None) -> None:
    """The embedded tune queue outlives `fxcc serve`: a restart (here on a CPU) still shows the tune
    job waiting, and a later start on an sm_90 GPU tunes it."""
    cpu = embedded_settings.model_copy(update={"embedded_device": "cpu", "test_only_fake_tune": True})
    waiting = {"waiting": 1, "running": 0}
    with TestClient(create_app(cpu)) as client:
        key = compile_on_cpu(client, sm90(make_unary()))["key"]
        [queued] = [j for j in client.get("/v1/jobs").json() if j["kind"] == "tune"]
    with TestClient(create_app(cpu)) as client:
        status = client.get("/v1/status").json()
        assert status["tune"] == {"sm_90": waiting} and status["queue"]["tune"] == waiting
        [job] = client.get("/v1/jobs", params={"state": "queued"}).json()
        assert (job["id"], job["kind"], job["key"], job["arch"]) == (queued["id"], "tune", key, 90)
        assert not client.get(f"/v1/artifacts/{key}").json()["manifest"]["tuned"]
    with TestClient(create_app(cpu.model_copy(update={"embedded_device": "cuda:0"}))) as client:
        job = client.get(f"/v1/jobs/{queued['id']}", params={"wait": 60}).json()
        assert (job["state"], job["worker"], job["key"]) == ("done", "embedded-0", key), job
        manifest = client.get(f"/v1/artifacts/{key}").json()["manifest"]
        assert manifest["tuned"] and {k["tuning"]["device"] for k in manifest["kernels"]} == {"Fake GPU at cuda:0"}
        assert client.get("/v1/status").json()["tune"] == {"sm_90": {"waiting": 0, "running": 0}}
    with TestClient(create_app(cpu)) as client:  # nothing is queued twice
        assert client.get("/v1/status").json()["tune"] == {}


def test_embedded_device_is_validated(embedded_settings: ServiceSettings) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        ServiceSettings(redis_url=None, embedded_device="tpu")
    assert ServiceSettings(redis_url=None, embedded_device="cuda:1").embedded_device == "cuda:1"

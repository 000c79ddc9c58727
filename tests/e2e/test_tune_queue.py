"""End to end, real processes: redis-server, `fxcc serve` and two CPU `fxcc worker`s. Many clients ask for
one sm_90 graph at once: one compile, its untuned artifact (cross-compiled cubins) stored, and exactly
one tune job queued on the sm_90 tune stream, which no CPU worker ever reads while they go on
compiling. (A GPU worker tuning it: tests/gpu/test_tune_queue_gpu.py.) An embedded `fxcc serve` killed
and started again on its data dir still has its tune job waiting."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis

from fxcc.client.demo import free_port, wait_healthy
from fxcc.compiler_core.wire import CompileRequest, GraphSpec, Node, NodeRef, Placeholder, Target, TensorSpec
from fxcc.service.keys import TUNE_GROUP, RedisKeys

pytestmark = pytest.mark.e2e
TOKEN = "e2e-tune-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def request(op: str, arch: int | None) -> CompileRequest:
    graph = GraphSpec(placeholders=[Placeholder(name="x", spec=TensorSpec(dtype="float32", sizes=[64, 32],
                                                                          strides=[32, 1]))],
                      nodes=[Node(name="y", target=op, args=[NodeRef(name="x")])], outputs=[NodeRef(name="y")])
    req = CompileRequest(graph=graph)
    if arch is None:
        return req
    return req.model_copy(update={"options": req.options.model_copy(update={"target": Target(kind="cuda", arch=arch)})})


@pytest.fixture
def cpu_cluster(redis_url: str, redis_prefix: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(TRITON_INTERPRET="1", FXCC_REDIS_URL=redis_url, FXCC_REDIS_PREFIX=redis_prefix,
               FXCC_DATA_DIR=str(tmp_path / "data"), FXCC_CLAIM_BLOCK_MS="100", FXCC_HEARTBEAT_S="0.2",
               FXCC_TOKEN=TOKEN)
    logs = {name: tmp_path / f"{name}.log" for name in ("serve", "worker-a", "worker-b")}
    cli = [sys.executable, "-m", "fxcc.client.cli"]
    procs = [subprocess.Popen(cli + ["serve", "--port", str(port)], env=env, stdout=logs["serve"].open("w"),
                              stderr=subprocess.STDOUT)]
    procs += [subprocess.Popen(cli + ["worker", "--device", "cpu"], env=env, stdout=logs[w].open("w"),
                               stderr=subprocess.STDOUT) for w in ("worker-a", "worker-b")]
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, procs[0])
        yield url
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        for name, path in logs.items():
            sys.stderr.write(f"---- {name}\n{path.read_text()[-3000:]}\n")


def compile_and_wait(url: str, req: CompileRequest) -> dict:
    queued = httpx.post(f"{url}/v1/compile", content=req.model_dump_json(), timeout=60,
                        headers={**AUTH, "Content-Type": "application/json"})
    assert queued.status_code in (200, 202), queued.text
    if queued.status_code == 200:
        return queued.json()
    job = httpx.get(f"{url}/v1/jobs/{queued.json()['job_id']}", params={"wait": 120}, headers=AUTH,
                    timeout=150).json()
    assert job["state"] == "done", job
    return job


def test_cpu_cluster_queues_one_tune_job_that_no_cpu_worker_claims(cpu_cluster: str, redis_url: str,
                                                                  redis_prefix: str) -> None:
    url = cpu_cluster
    req = request("aten.sin.default", arch=90)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: compile_and_wait(url, req), range(8)))
    [key] = {a["key"] for a in answers}
    jobs = httpx.get(f"{url}/v1/jobs", params={"limit": 100}, headers=AUTH, timeout=30).json()
    assert [j["kind"] for j in jobs if j["key"] == key].count("compile") == 1

    # The artifact is served untuned, with its sm_90 cubins; exactly one tune job waits for a GPU.
    manifest = httpx.get(f"{url}/v1/artifacts/{key}", params={"blobs": "false"}, headers=AUTH,
                         timeout=30).json()["manifest"]
    assert not manifest["tuned"] and all("sm_90" in k["binaries"] for k in manifest["kernels"])
    [tune] = [j for j in jobs if j["kind"] == "tune"]
    assert (tune["key"], tune["arch"], tune["state"], tune["attempt"]) == (key, 90, "queued", 0)

    # The CPU workers go on taking compile jobs after it was queued, and never read the tune stream.
    for op in ("aten.cos.default", "aten.exp.default", "aten.neg.default"):
        compile_and_wait(url, request(op, arch=None))
    stats = httpx.get(f"{url}/v1/stats", headers=AUTH, timeout=30).json()
    assert stats["tune"] == {"sm_90": {"waiting": 1, "running": 0}}
    assert stats["queue"]["tune"] == {"waiting": 1, "running": 0}
    assert [(w["device"], w["tune_arch"]) for w in stats["workers"]] == [("cpu", None)] * 2
    status = httpx.get(f"{url}/v1/status", headers=AUTH, timeout=30).json()
    assert status["tune"] == stats["tune"] and all(w["tune_arch"] is None for w in status["workers"])
    again = httpx.get(f"{url}/v1/jobs/{tune['id']}", headers=AUTH, timeout=30).json()
    assert (again["state"], again["attempt"], again["worker"]) == ("queued", 0, None)
    r = redis.Redis.from_url(redis_url)
    try:
        [group] = r.xinfo_groups(RedisKeys(redis_prefix).tune_stream(90))
        assert group["name"].decode() == TUNE_GROUP
        assert (group["consumers"], group["pending"]) == (0, 0)  # no worker ever read from it
    finally:
        r.close()

    # Asking for the graph again is a cache hit; it queues no second tune job.
    assert compile_and_wait(url, req)["status"] == "done"
    jobs = httpx.get(f"{url}/v1/jobs", params={"limit": 100}, headers=AUTH, timeout=30).json()
    assert [j["id"] for j in jobs if j["kind"] == "tune"] == [tune["id"]]


def test_a_killed_embedded_serve_finds_its_tune_job_when_started_again(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(TRITON_INTERPRET="1", FXCC_DATA_DIR=str(tmp_path / "data"), FXCC_EMBEDDED_DEVICE="cpu",
               FXCC_TOKEN=TOKEN)
    cmd = [sys.executable, "-m", "fxcc.client.cli", "serve", "--port", str(port)]
    logs = [tmp_path / "serve-1.log", tmp_path / "serve-2.log"]
    first = subprocess.Popen(cmd, env=env, stdout=logs[0].open("w"), stderr=subprocess.STDOUT)
    second = None
    try:
        wait_healthy(url, first)
        key = compile_and_wait(url, request("aten.sin.default", arch=90))["key"]
        [tune] = [j for j in httpx.get(f"{url}/v1/jobs", headers=AUTH, timeout=30).json()
                  if j["kind"] == "tune"]
        first.kill()  # no clean shutdown: the queue must already be on disk
        first.wait(20)

        second = subprocess.Popen(cmd, env=env, stdout=logs[1].open("w"), stderr=subprocess.STDOUT)
        wait_healthy(url, second)
        status = httpx.get(f"{url}/v1/status", headers=AUTH, timeout=30).json()
        assert status["tune"] == {"sm_90": {"waiting": 1, "running": 0}} and status["queue"]["tune"]["waiting"] == 1
        again = httpx.get(f"{url}/v1/jobs/{tune['id']}", headers=AUTH, timeout=30).json()
        assert (again["kind"], again["key"], again["arch"], again["state"]) == ("tune", key, 90, "queued")
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        for path in logs:
            if path.exists():
                sys.stderr.write(f"---- {path.name}\n{path.read_text()[-3000:]}\n")

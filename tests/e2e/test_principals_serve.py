"""Real `fxcc serve` processes: the embedded default's Host rule and token routes, its queue run
after a crash (SIGKILL) by the next `fxcc serve`; principals kept apart on a Redis cluster; and a
service answering 503 then 200 across a restart of its own Redis (no worker alive)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fxcc.client.demo import free_port, wait_healthy
from fxcc.compiler_core.wire import CompileRequest, GraphSpec, Node, NodeRef, Placeholder, TensorSpec
from tests.service.redis_server import RedisServer

pytestmark = pytest.mark.e2e

JSON = {"Content-Type": "application/json"}
HTTP = httpx.Client(timeout=120)  # a first compile request imports torch and propagates shapes: slow on a busy machine


def unary_request(target: str = "aten.sin.default", sizes: tuple[int, int] = (4, 8)) -> CompileRequest:
    spec = TensorSpec(dtype="float32", sizes=list(sizes), strides=[sizes[1], 1])
    return CompileRequest(graph=GraphSpec(placeholders=[Placeholder(name="x", spec=spec)],
                                          nodes=[Node(name="y", target=target, args=[NodeRef(name="x")])],
                                          outputs=[NodeRef(name="y")]))


def serve(env: dict[str, str], port: int, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fxcc.client.cli", "serve", "--port", str(port)],
                            env=env, stdout=log.open("a"), stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update(TRITON_INTERPRET="1", **extra)
    return env


def wait_for(url: str, job_id: str, want: str, timeout_s: float = 120, **kw) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = HTTP.get(f"{url}/v1/jobs/{job_id}", params={"wait": 5}, timeout=30, **kw).json()
        if job["state"] == want or time.monotonic() > deadline:
            return job
        time.sleep(0.1)


def test_embedded_serve_guards_and_runs_its_queue_after_a_crash(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = tmp_path / "data"
    log = tmp_path / "serve.log"
    # The in-process worker sleeps before each compile, so that the first job is running at the crash.
    first = serve(base_env(FXCC_DATA_DIR=str(data), FXCC_TEST_ONLY_COMPILE_DELAY_S="600"), port, log)
    second = None
    try:
        wait_healthy(url, first)
        assert HTTP.get(f"{url}/v1/status", headers={"Host": "evil.example"}).status_code == 421
        r = HTTP.post(f"{url}/v1/admin/tokens", json={"name": "pwned", "role": "admin"},
                       headers={"Host": "evil.example"})
        assert r.status_code == 421
        r = HTTP.post(f"{url}/v1/admin/tokens", json={"name": "pwned", "role": "admin"})
        assert r.status_code == 403
        r = HTTP.post(f"{url}/v1/compile", content=unary_request().model_dump_json(),
                       headers={**JSON, "Origin": "http://evil.example"})
        assert r.status_code == 403
        assert not (data / "tokens.json").exists()

        ids = [HTTP.post(f"{url}/v1/compile", content=unary_request(op).model_dump_json(),
                          headers=JSON).json()["job_id"] for op in ("aten.sin.default", "aten.cos.default")]
        assert wait_for(url, ids[0], "running", timeout_s=60)["state"] == "running"
        first.send_signal(signal.SIGKILL)
        first.wait(20)

        second = serve(base_env(FXCC_DATA_DIR=str(data)), port, log)
        wait_healthy(url, second)
        done = [wait_for(url, job_id, "done") for job_id in ids]
        assert [j["state"] for j in done] == ["done", "done"], log.read_text()[-3000:]
        assert done[0]["attempt"] == 2 and done[1]["attempt"] == 1  # the crashed attempt counted
        assert not list((data / "queue").glob("*.json"))  # nothing left in flight
    finally:
        stop(first)
        if second is not None:
            stop(second)
        sys.stderr.write(f"---- serve.log\n{log.read_text()[-3000:]}\n")


def test_principals_are_kept_apart_on_a_redis_cluster(cluster: tuple[str, dict[str, str]]) -> None:
    url, env = cluster
    admin = {"Authorization": f"Bearer {env['FXCC_TOKEN']}"}
    tokens = {}
    for name in ("alice", "bob"):
        r = HTTP.post(f"{url}/v1/admin/tokens", json={"name": name}, headers=admin)
        assert r.status_code == 201
        tokens[name] = {"Authorization": f"Bearer {r.json()['token']}", **JSON}
    a = HTTP.post(f"{url}/v1/compile", content=unary_request("aten.sin.default", sizes=(3, 5)).model_dump_json(),
                   headers=tokens["alice"]).json()
    job = wait_for(url, a["job_id"], "done", headers=tokens["alice"])
    assert job["state"] == "done" and job["principals"] == ["alice"]
    assert HTTP.get(f"{url}/v1/jobs/{a['job_id']}", headers=tokens["bob"]).status_code == 404
    assert HTTP.get(f"{url}/v1/jobs", headers=tokens["bob"]).json() == []
    assert [j["id"] for j in HTTP.get(f"{url}/v1/jobs", headers=tokens["alice"]).json()] == [a["job_id"]]
    assert a["job_id"] in [j["id"] for j in HTTP.get(f"{url}/v1/jobs", headers=admin).json()]
    # Artifacts are shared by key (compile once for the cluster): bob, who knows the key, may read it.
    assert HTTP.get(f"{url}/v1/artifacts/{a['key']}", headers=tokens["bob"]).status_code == 200


def test_a_service_rides_out_a_restart_of_its_redis(tmp_path: Path) -> None:
    redis_server = RedisServer(tmp_path)
    redis_server.start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    proc = serve(base_env(FXCC_REDIS_URL=redis_server.url, FXCC_DATA_DIR=str(tmp_path / "data"),
                          FXCC_TOKEN="root"), port, log)
    admin = {"Authorization": "Bearer root"}
    paths = ("/v1/status", "/v1/stats", "/metrics")
    try:
        wait_healthy(url, proc)
        assert HTTP.post(f"{url}/v1/compile", content=unary_request().model_dump_json(),
                          headers={**admin, **JSON}).status_code == 202
        assert [HTTP.get(url + p, headers=admin).status_code for p in paths] == [200, 200, 200]
        redis_server.stop()
        for p in paths:
            r = HTTP.get(url + p, headers=admin, timeout=30)
            assert r.status_code == 503 and r.headers["Retry-After"], (p, r.text)
        redis_server.start()
        codes: list[int] = []
        for _ in range(10):
            codes = [HTTP.get(url + p, headers=admin, timeout=30).status_code for p in paths]
            assert set(codes) <= {200, 503}, codes
            if codes == [200, 200, 200]:
                break
            time.sleep(0.5)
        assert codes == [200, 200, 200]
        assert proc.poll() is None
    finally:
        stop(proc)
        redis_server.stop()
        sys.stderr.write(f"---- serve.log\n{log.read_text()[-3000:]}\n")

"""Fault tests with real processes: `fxcc serve` replicas, `python -m fxcc.worker` processes and redis-server.

64 concurrent identical requests give one compile; a worker killed with SIGKILL mid-job loses
nothing; SIGTERM finishes or requeues the job in hand; Redis going away gives 503 + Retry-After
and the service recovers by itself. The test-only hook FXCC_TEST_ONLY_COMPILE_DELAY_S keeps a job
in a worker's hands long enough to hit it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis

from fxcc.compiler_core.wire import CompileRequest

REPO = Path(__file__).resolve().parents[2]
TOKEN = "fault-test-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except (httpx.TransportError, redis.ConnectionError):
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Cluster:
    """Processes sharing one Redis and prefix; everything started is stopped at the end."""

    def __init__(self, redis_url: str, prefix: str, tmp: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
        self.env.update(TRITON_INTERPRET="1", FXCC_REDIS_URL=redis_url, FXCC_REDIS_PREFIX=prefix, FXCC_TOKEN=TOKEN,
                        FXCC_DATA_DIR=str(tmp / "data"), FXCC_CLAIM_BLOCK_MS="100", FXCC_HEARTBEAT_S="0.2")
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def spawn(self, name: str, args: list[str], **fxcc: str) -> subprocess.Popen:
        env = dict(self.env, **{f"FXCC_{k.upper()}": v for k, v in fxcc.items()})
        log = (self.tmp / f"{name}.log").open("wb")
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def server(self, name: str = "api", *, ready: bool = True, **fxcc: str) -> str:
        """Start `fxcc serve`; with ready=False do not wait for it (start several side by side)."""
        port = free_port()
        self.spawn(name, ["-c", f"from fxcc.service.server import serve_main; serve_main('127.0.0.1', {port})"], **fxcc)
        url = f"http://127.0.0.1:{port}"
        if ready:
            wait_ready(url)
        return url

    def worker(self, name: str, **fxcc: str) -> subprocess.Popen:
        return self.spawn(name, ["-m", "fxcc.worker", "--device", "cpu"], **fxcc)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


@pytest.fixture
def cluster(redis_url: str, redis_prefix: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(redis_url, redis_prefix, tmp_path)
    try:
        yield c
    finally:
        c.stop()


def wait_ready(url: str) -> None:
    wait_until(lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200, 60, f"{url} to start")


def submit(url: str, req: CompileRequest) -> httpx.Response:
    return httpx.post(f"{url}/v1/compile", content=req.model_dump_json(), timeout=60,
                      headers={**AUTH, "Content-Type": "application/json"})


def job(url: str, job_id: str, wait_s: float = 0) -> dict:
    r = httpx.get(f"{url}/v1/jobs/{job_id}", params={"wait": wait_s}, headers=AUTH, timeout=wait_s + 30)
    assert r.status_code == 200, r.text
    return r.json()


def test_64_concurrent_identical_requests_make_one_compile(cluster: Cluster,
                                                            make_unary: Callable[..., CompileRequest]) -> None:
    # Two API replicas, so that single flight has to hold across processes, not just threads.
    urls = [cluster.server("api-a", ready=False), cluster.server("api-b", ready=False)]
    cluster.worker("worker", test_only_compile_delay_s="2")
    for url in urls:
        wait_ready(url)
    req = make_unary("aten.tanh.default", sizes=(16, 16))
    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(lambda i: submit(urls[i % 2], req), range(64)))
    assert {r.status_code for r in answers} <= {200, 202}, [r.text for r in answers if r.status_code >= 300]
    job_ids = {r.json()["job_id"] for r in answers if r.status_code == 202}
    assert len(job_ids) == 1 and len({r.json()["key"] for r in answers}) == 1
    (job_id,) = job_ids
    done = job(urls[0], job_id, wait_s=60)
    assert done["state"] == "done" and done["attempt"] == 1, done
    stats = httpx.get(f"{urls[1]}/v1/stats", headers=AUTH).json()
    assert stats["cache"]["puts"] == 1 and stats["cache"]["entries"] == 1
    assert sum(stats["jobs"].values()) == 1  # one job ever existed
    assert cluster.log("worker").count("compiling key") == 1


def test_killed_worker_loses_no_job(cluster: Cluster, make_unary: Callable[..., CompileRequest]) -> None:
    url = cluster.server(ready=False)
    doomed = cluster.worker("doomed", test_only_compile_delay_s="120", claim_idle_ms="1500", worker_ttl_s="2")
    wait_ready(url)
    first = submit(url, make_unary("aten.sin.default")).json()
    wait_until(lambda: job(url, first["job_id"])["stage"] == "lowering", 60, "the doomed worker to start the job")
    second = submit(url, make_unary("aten.cos.default")).json()  # queued behind it
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=10)

    cluster.worker("rescuer", claim_idle_ms="1500")
    for queued in (first, second):
        done = job(url, queued["job_id"], wait_s=60)
        assert done["state"] == "done", done
        assert httpx.get(f"{url}/v1/artifacts/{queued['key']}", headers=AUTH).status_code == 200
    rescued = job(url, first["job_id"])
    assert rescued["attempt"] == 2 and rescued["worker"].endswith(f"-{cluster.procs[-1].pid}")
    stats = httpx.get(f"{url}/v1/stats", headers=AUTH).json()
    assert stats["queue"]["interactive"] == {"waiting": 0, "running": 0}
    assert stats["queue"]["dead_letter"]["waiting"] == 0
    wait_until(lambda: len(httpx.get(f"{url}/v1/stats", headers=AUTH).json()["workers"]) == 1, 30,
               "the killed worker's heartbeat to expire")


def test_sigterm_requeues_a_job_it_cannot_finish(cluster: Cluster, make_unary: Callable[..., CompileRequest]) -> None:
    url = cluster.server(ready=False)
    stopping = cluster.worker("stopping", test_only_compile_delay_s="120", shutdown_grace_s="0.5")
    wait_ready(url)
    queued = submit(url, make_unary()).json()
    wait_until(lambda: job(url, queued["job_id"])["stage"] == "lowering", 60, "the worker to start the job")
    stopping.send_signal(signal.SIGTERM)
    assert stopping.wait(timeout=30) == 0, cluster.log("stopping")
    back = job(url, queued["job_id"])
    assert back["state"] == "queued" and back["attempt"] == 0 and "requeued" in cluster.log("stopping")

    cluster.worker("next")
    done = job(url, queued["job_id"], wait_s=60)
    assert done["state"] == "done" and done["attempt"] == 1


def test_sigterm_finishes_the_job_in_hand(cluster: Cluster, make_unary: Callable[..., CompileRequest]) -> None:
    url = cluster.server(ready=False)
    worker = cluster.worker("finishing", test_only_compile_delay_s="1.5", shutdown_grace_s="60")
    wait_ready(url)
    queued = submit(url, make_unary()).json()
    wait_until(lambda: job(url, queued["job_id"])["stage"] == "lowering", 60, "the worker to start the job")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, cluster.log("finishing")
    done = job(url, queued["job_id"])
    assert done["state"] == "done" and done["attempt"] == 1


@contextmanager
def own_redis(port: int, workdir: Path) -> Iterator[subprocess.Popen]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("needs redis-server on PATH")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: redis.Redis(port=port).ping(), 10, "redis-server to start")
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_redis_outage_is_503_then_recovers(tmp_path: Path, make_unary: Callable[..., CompileRequest]) -> None:
    port = free_port()
    cluster = Cluster(f"redis://127.0.0.1:{port}/0", "fxcc:", tmp_path)
    try:
        with own_redis(port, tmp_path):
            url = cluster.server(ready=False)
            cluster.worker("worker")
            wait_ready(url)
            before = submit(url, make_unary()).json()
            assert job(url, before["job_id"], wait_s=60)["state"] == "done"
        # Redis is gone: every store-backed answer is a 503 with Retry-After, never a hang or a 500.
        for method, path in (("GET", f"/v1/artifacts/{before['key']}"), ("GET", f"/v1/jobs/{before['job_id']}"),
                             ("GET", "/v1/stats"), ("GET", "/healthz")):
            r = httpx.request(method, f"{url}{path}", headers=AUTH, timeout=30)
            assert r.status_code == 503 and r.headers["Retry-After"], (path, r.status_code, r.text)
        r = submit(url, make_unary("aten.cos.default"))
        assert r.status_code == 503 and r.json()["error"] == "StoreUnavailable"

        with own_redis(port, tmp_path):  # back, empty: nothing restarted on our side
            wait_until(lambda: httpx.get(f"{url}/healthz").status_code == 200, 30, "the service to recover")
            after = submit(url, make_unary("aten.cos.default"))
            assert after.status_code == 202, after.text
            assert job(url, after.json()["job_id"], wait_s=60)["state"] == "done"  # the worker recovered too
            r = httpx.get(f"{url}/v1/artifacts/{after.json()['key']}", headers=AUTH, timeout=30)
            assert r.status_code == 200 and r.json()["manifest"]["key"] == after.json()["key"]
    finally:
        cluster.stop()

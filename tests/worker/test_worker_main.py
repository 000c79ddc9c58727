"""The worker as a process: `python -m fxcc.worker` against a real Redis, its loop, signals and exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.app import create_app
from fxcc.service.redis_store import RedisStore
from fxcc.service.settings import ServiceSettings
from fxcc.service.store import JobState
from fxcc.worker.loop import Consumer

REPO = Path(__file__).resolve().parents[2]


def worker_env(**fxcc: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    env.update({f"FXCC_{k.upper()}": v for k, v in fxcc.items()})
    return env


def test_without_redis_url_exits_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "fxcc.worker"], check=False, cwd=REPO, env=worker_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "FXCC_REDIS_URL" in proc.stderr


def test_bad_configuration_exits_2(redis_url: str) -> None:
    with_password = redis_url.replace("redis://", "redis://:wrong@")  # the test Redis has none
    for env in (worker_env(redis_url=with_password), worker_env(redis_url=redis_url, heartbeat_s="-1")):
        proc = subprocess.run([sys.executable, "-m", "fxcc.worker"], check=False, cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "wrong" not in proc.stderr  # the password never reaches the log


def test_worker_process_compiles_jobs_posted_over_http(redis_settings: ServiceSettings, tmp_path: Path,
                                                       make_unary: Callable[..., CompileRequest]) -> None:
    env = worker_env(redis_url=redis_settings.redis_url, redis_prefix=redis_settings.redis_prefix,
                     heartbeat_s="0.2", claim_block_ms="200")
    log = tmp_path / "worker.log"
    with log.open("wb") as out, TestClient(create_app(redis_settings)) as client:
        proc = subprocess.Popen([sys.executable, "-m", "fxcc.worker", "--device", "cpu"], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            queued = client.post("/v1/compile", content=make_unary().model_dump_json(),
                                 headers={"Content-Type": "application/json"}).json()
            job = client.get(f"/v1/jobs/{queued['job_id']}", params={"wait": 45}).json()
            assert job["state"] == "done", (job, log.read_text())
            assert job["worker"].endswith(f"-{proc.pid}")
            assert client.get(f"/v1/artifacts/{queued['key']}").status_code == 200

            store: RedisStore = client.app.state.store
            beats = [k for k in store.r.scan_iter(match=store.k.worker("*"))]
            assert len(beats) == 1
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
        assert rc == 0, log.read_text()
        assert not list(store.r.scan_iter(match=store.k.worker("*")))  # unregistered on the way out


def test_consumer_takes_over_a_dead_workers_job(redis_settings: ServiceSettings,
                                               make_unary: Callable[..., CompileRequest]) -> None:
    store = RedisStore(redis_settings.model_copy(update={"claim_idle_ms": 100}))
    req = make_unary()
    job_id = store.submit(compile_key(req), req.model_dump_json(), "interactive").job_id
    store.claim("crashed", block_ms=10)  # claimed, never acknowledged
    store.mark_started(job_id, "crashed")
    stop = threading.Event()
    consumer = Consumer(store, "rescuer", stop, block_ms=50)
    consumer.thread.start()
    try:
        deadline = time.monotonic() + 120  # the consumer's compile process starts first
        while (job := store.get_job(job_id)).state is not JobState.DONE and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        consumer.thread.join(timeout=10)
    assert job.state is JobState.DONE and job.worker == "rescuer" and job.attempt == 2
    assert store.r.xpending(store.k.interactive, "workers")["pending"] == 0


def test_device_option_accepts_gpu_indices_and_rejects_others():
    from fxcc.worker.main import _DEVICE_RE, resolve_device

    assert [resolve_device(d) for d in ("0", "3", "cuda:1", "cpu")] == ["cuda:0", "cuda:3", "cuda:1", "cpu"]
    assert not any(_DEVICE_RE.fullmatch(d) for d in ("gpu", "cuda:", "0;rm -rf", "-1"))

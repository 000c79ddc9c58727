"""Compile limits with real processes: `python -m fxcc.worker` on a real Redis, and the embedded
service's in-process worker. A compile past FXCC_JOB_TIMEOUT_S (the issue's wide graph) or over
FXCC_JOB_MEMORY_MB (the test-only allocation hook) fails for good and the worker goes on; a running
job whose record turns cancelled has its compile process killed within seconds and stores nothing.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.wire import (
    CompileRequest,
    FloatArg,
    GraphSpec,
    Node,
    NodeRef,
    Placeholder,
    TensorSpec,
)
from fxcc.service.app import create_app
from fxcc.service.redis_store import RedisStore
from fxcc.service.settings import ServiceSettings
from fxcc.service.store import JobRecord, JobStage, Store, now_s
from tests.service import conftest as _fixtures

REPO = Path(__file__).resolve().parents[2]

# The service tests' fixtures (settings for both stores, tiny requests).
redis_settings = _fixtures.redis_settings
embedded_settings = _fixtures.embedded_settings
make_unary = _fixtures.make_unary


def wide_request(n: int) -> CompileRequest:
    """The issue's graph: `n` nodes that each read the input, all kept as outputs (its compile grew
    as n^1.9: hours at the 20000-node limit)."""
    x = Placeholder(name="x", spec=TensorSpec(dtype="float32", sizes=[8], strides=[1]))
    nodes = [Node(name=f"y{i}", target="aten.add.Tensor", args=[NodeRef(name="x"), FloatArg(value=float(i))])
             for i in range(n)]
    return CompileRequest(graph=GraphSpec(placeholders=[x], nodes=nodes, outputs=[NodeRef(name=f"y{i}") for i in range(n)]))


class Worker:
    """A real `python -m fxcc.worker --device cpu` on the test's Redis prefix, and a store to feed it."""

    def __init__(self, settings: ServiceSettings, tmp: Path, **fxcc: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
        env.update(TRITON_INTERPRET="1", FXCC_REDIS_URL=str(settings.redis_url), FXCC_REDIS_PREFIX=settings.redis_prefix,
                   FXCC_CLAIM_BLOCK_MS="100", FXCC_HEARTBEAT_S="0.2")
        env.update({f"FXCC_{k.upper()}": v for k, v in fxcc.items()})
        self.log_path = tmp / "worker.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "fxcc.worker", "--device", "cpu"], cwd=REPO, env=env,
                                     stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT)
        self.store = RedisStore(settings)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def submit(self, req: CompileRequest) -> str:
        job_id = self.store.submit(compile_key(req), req.model_dump_json(), req.priority).job_id
        assert job_id is not None
        return job_id

    def wait(self, job_id: str, until: Callable[[JobRecord], bool], timeout_s: float = 120) -> JobRecord:
        deadline = time.monotonic() + timeout_s
        while not until(job := self.store.get_job(job_id)):
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, (job, self.log()[-3000:])
            time.sleep(0.1)
        return job

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.store.close()


@pytest.fixture
def start_worker(redis_settings: ServiceSettings, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(**fxcc: str) -> Worker:
        started.append(Worker(redis_settings, tmp_path, **fxcc))
        return started[-1]

    yield start
    for w in started:
        w.stop()


def finished(job: JobRecord | None) -> bool:
    return job is not None and job.finished


def compile_processes(pid: int) -> set[int]:
    """The live `fxcc.worker.child` processes process `pid` started."""
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        children |= {int(c) for c in (task / "children").read_text().split()}
    found = set()
    for child in children:
        try:
            if b"fxcc.worker.child" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.add(child)
        except FileNotFoundError:
            pass
    return found


def cancel_running(store: Store, job_id: str) -> None:
    """What the service's DELETE of a running job does to its record (that route lands elsewhere)."""
    if isinstance(store, RedisStore):
        store.r.hset(store.k.job(job_id), mapping={"stage": "cancelled", "finished_at": repr(now_s())})
    else:  # the embedded store has no public way to it yet
        store._move(job_id, JobStage.CANCELLED, finished_at=now_s())


def test_a_compile_past_the_time_limit_fails_for_good_and_the_worker_compiles_the_next(
        start_worker: Callable[..., Worker], make_unary: Callable[..., CompileRequest]) -> None:
    worker = start_worker(job_timeout_s="2")
    slow = worker.wait(worker.submit(wide_request(20_000)), finished)
    assert slow.stage is JobStage.FAILED and slow.attempt == 1, slow
    assert slow.error.error == "CompileTimeout" and "FXCC_JOB_TIMEOUT_S" in slow.error.message
    assert worker.store.dead_letters(10) == [] and worker.store.get_manifest(slow.key) is None

    normal = worker.wait(worker.submit(make_unary()), finished)
    assert normal.stage is JobStage.DONE and normal.worker == slow.worker, normal
    assert worker.store.get_manifest(normal.key) is not None
    assert worker.store.queue_depths()["interactive"] == {"waiting": 0, "running": 0}
    assert worker.proc.poll() is None


def test_a_compile_over_the_memory_limit_fails_for_good(start_worker: Callable[..., Worker],
                                                        make_unary: Callable[..., CompileRequest]) -> None:
    worker = start_worker(job_memory_mb="1024", test_only_compile_alloc_mb="2048", test_only_compile_delay_s="60")
    for op in ("aten.sin.default", "aten.cos.default"):  # the second one finds a fresh compile process
        job = worker.wait(worker.submit(make_unary(op)), finished)
        assert job.stage is JobStage.FAILED and job.attempt == 1, job
        assert job.error.error == "CompileMemoryLimit" and "1024 MB (FXCC_JOB_MEMORY_MB)" in job.error.message
    assert worker.store.dead_letters(10) == []
    assert worker.proc.poll() is None


def test_a_cancelled_running_job_stops_its_compile_process_and_stores_nothing(
        start_worker: Callable[..., Worker], make_unary: Callable[..., CompileRequest]) -> None:
    worker = start_worker(test_only_compile_delay_s="300")
    job_id = worker.submit(make_unary())
    worker.wait(job_id, lambda j: j.stage is JobStage.LOWERING)
    deadline = time.monotonic() + 120
    while "compile process" not in worker.log():  # started, warmed up: it holds the job now
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.1)
    [compiling] = compile_processes(worker.proc.pid)
    cancel_running(worker.store, job_id)
    t0 = time.monotonic()
    while compiling in compile_processes(worker.proc.pid):  # stopped, long before its 300 s compile ends
        assert time.monotonic() - t0 < 120, worker.log()
        time.sleep(0.1)
    deadline = time.monotonic() + 10
    while "cancelled while it compiled" not in worker.log():
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.1)
    job = worker.store.get_job(job_id)
    assert job.stage is JobStage.CANCELLED and job.error is None and job.stats is None
    assert worker.store.get_manifest(job.key) is None
    assert worker.store.queue_depths()["interactive"] == {"waiting": 0, "running": 0}  # acked

    nxt = worker.submit(make_unary("aten.cos.default"))  # the worker takes the next job
    assert worker.wait(nxt, lambda j: j.stage is JobStage.LOWERING).attempt == 1
    assert worker.proc.poll() is None


def test_the_embedded_worker_stops_a_cancelled_compile(embedded_settings: ServiceSettings, caplog: pytest.LogCaptureFixture,
                                                       make_unary: Callable[..., CompileRequest]) -> None:
    settings = embedded_settings.model_copy(update={"test_only_compile_delay_s": 60.0})
    caplog.set_level(logging.INFO, logger="fxcc.worker")
    with TestClient(create_app(settings)) as client:
        queued = client.post("/v1/compile", content=make_unary().model_dump_json(),
                             headers={"Content-Type": "application/json"}).json()
        deadline = time.monotonic() + 120
        while (client.get(f"/v1/jobs/{queued['job_id']}").json()["stage"] != "lowering"
               or "compile process" not in caplog.text):  # it holds the job now
            assert time.monotonic() < deadline
            time.sleep(0.1)
        [compiling] = compile_processes(os.getpid())
        cancel_running(client.app.state.store, queued["job_id"])
        t0 = time.monotonic()
        while compiling in compile_processes(os.getpid()):
            assert time.monotonic() - t0 < 10
            time.sleep(0.1)
        job = client.get(f"/v1/jobs/{queued['job_id']}").json()
        assert job["state"] == "cancelled" and job["error"] is None
        assert client.get(f"/v1/artifacts/{queued['key']}").status_code == 404

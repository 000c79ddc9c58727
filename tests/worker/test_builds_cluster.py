"""Build tasks across real worker processes (`python -m fxcc.worker`) and a real Redis: one job's kernels
are built by several workers, and a worker killed mid-task costs only that task's retry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fxcc.compiler_core.build import cuda_build_unavailable
from fxcc.compiler_core.keys import compile_key
from fxcc.service.redis_store import RedisStore
from fxcc.service.settings import ServiceSettings
from fxcc.service.store import JobRecord, JobStage, JobState
from tests.worker.test_builds import OPS, many_kernels
from tests.worker.test_worker_main import REPO, worker_env

pytestmark = pytest.mark.skipif(cuda_build_unavailable() is not None, reason=str(cuda_build_unavailable()))


@pytest.fixture
def workers(redis_settings: ServiceSettings, tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Three worker processes with one build process each; a build takes 2 s more than it needs
    (so that one can be killed mid-task), and a silent worker's claims are taken over after 1.5 s."""
    env = worker_env(redis_url=redis_settings.redis_url, redis_prefix=redis_settings.redis_prefix,
                     heartbeat_s="0.2", claim_block_ms="100", claim_idle_ms="1500", build_processes="1",
                     test_only_build_delay_s="2", compile_process_warm="0")
    procs = []
    for i in range(3):
        log = (tmp_path / f"worker{i}.log").open("wb")
        procs.append(subprocess.Popen([sys.executable, "-m", "fxcc.worker", "--device", "cpu"], cwd=REPO, env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
    yield procs
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def pid_of(worker: str | None) -> int:
    """The process id in a consumer's name (`<host>-<pid>` or `<host>-<pid>-b<i>`)."""
    parts = (worker or "").split("-")
    return int(parts[-2] if parts[-1].startswith("b") else parts[-1])


def wait_for(what: str, check, timeout_s: float = 180.0, logs: Path | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    text = "\n".join(p.read_text()[-3000:] for p in sorted(logs.glob("*.log"))) if logs else ""
    raise AssertionError(f"timed out waiting for {what}\n{text}")


def test_a_killed_worker_costs_only_its_tasks_retry(redis_settings: ServiceSettings, tmp_path: Path,
                                                   workers: list[subprocess.Popen[bytes]]) -> None:
    store = RedisStore(redis_settings)
    wait_for("three workers", lambda: len(store.workers()) == 3, logs=tmp_path)
    req = many_kernels(OPS[:4])
    job_id = store.submit(compile_key(req), req.model_dump_json(), "interactive").job_id
    parent = wait_for("the build tasks", lambda: (j := store.get_job(job_id)).tasks and j, logs=tmp_path)

    def running_elsewhere() -> JobRecord | None:
        tasks = store.get_jobs(parent.tasks)
        return next((t for t in tasks if t and t.stage is JobStage.BUILDING and pid_of(t.worker) != pid_of(parent.worker)),
                    None)

    victim_task = wait_for("a task on another worker", running_elsewhere, logs=tmp_path)
    victim = next(p for p in workers if p.pid == pid_of(victim_task.worker))
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)

    job = wait_for("the job", lambda: (j := store.get_job(job_id)).finished and j, logs=tmp_path)
    assert job.state is JobState.DONE and job.attempt == 1 and job.worker == parent.worker
    art = store.get_artifact(job.key)
    assert art is not None and all("sm_90" in k.binaries for k in art.manifest.kernels)
    tasks = {t.id: t for t in store.get_jobs(job.tasks)}
    assert len(tasks) == 4 and all(t.state is JobState.DONE for t in tasks.values())
    retried = tasks[victim_task.id]
    assert retried.attempt == 2 and pid_of(retried.worker) != victim.pid  # taken over by a live worker
    assert all(t.attempt == 1 for t in tasks.values() if t.id != victim_task.id)  # nothing else ran again
    assert len({pid_of(t.worker) for t in tasks.values()} | {victim.pid}) >= 2  # spread over processes
    store.close()

"""Build tasks (worker/builds.py) on both stores: a compile job's kernels built by build consumers in
their build processes, listed on the job with who ran each, kept by content key so that another job
that shares kernels builds only its new ones; the job page lists the tasks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fxcc.compiler_core.build import apply_builds, build_artifact, build_tasks, cuda_build_unavailable
from fxcc.compiler_core.build_tasks import BuiltKernel
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import (
    CompileOptions,
    CompileRequest,
    GraphSpec,
    Node,
    NodeRef,
    Placeholder,
    Target,
)
from fxcc.service.settings import ServiceSettings
from fxcc.service.store import JobRecord, JobStage, JobState, Store
from fxcc.worker.builds import BuildConsumer, start_build_consumers
from fxcc.worker.limits import JobLimits
from fxcc.worker.loop import Consumer
from fxcc.worker.process import JobPolicy
from tests.service.conftest import contiguous

pytestmark = pytest.mark.skipif(cuda_build_unavailable() is not None, reason=str(cuda_build_unavailable()))

OPS = ("sin", "cos", "exp", "tanh", "sigmoid")


def many_kernels(ops: tuple[str, ...], arch: int = 90) -> CompileRequest:
    """`op_i(x_i)` for inputs of different widths: one pointwise kernel per op, none fused. The same
    op at the same position gives the same kernel in every such graph."""
    inputs = [Placeholder(name=f"x{i}", spec=contiguous((4, 8 + i))) for i in range(len(ops))]
    nodes = [Node(name=f"y{i}", target=f"aten.{op}.default", args=[NodeRef(name=f"x{i}")]) for i, op in enumerate(ops)]
    graph = GraphSpec(placeholders=inputs, nodes=nodes, outputs=[NodeRef(name=n.name) for n in nodes])
    return CompileRequest(graph=graph, options=CompileOptions(target=Target(kind="cuda", arch=arch)))


def test_task_key_is_a_hash_of_what_the_cubin_depends_on() -> None:
    req = many_kernels(OPS[:2])
    tasks = build_tasks(compile_request(req), req, 90)
    assert len(tasks) == 2 and len({t.key for t in tasks}) == 2
    again = build_tasks(compile_request(req), req, 90)
    assert [t.key for t in again] == [t.key for t in tasks]  # another compile of the same graph
    t = tasks[0]
    for change in ({"arch": 80}, {"num_warps": t.num_warps * 2}, {"source": t.source + "\n"},
                   {"triton": "0.0.0"}, {"types": ("*fp16", *t.types[1:])}):
        assert t.model_copy(update=change).key != t.key, change
    built = BuiltKernel(metadata={"name": "k", "shared": 0}, cubin=b"\x7fELF\0\1binary")
    assert BuiltKernel.decode(built.encode()) == built
    with pytest.raises(ValueError):
        BuiltKernel.decode(b"no separator")


def test_a_failed_build_leaves_the_kernel_to_run_from_source() -> None:
    req = many_kernels(OPS[:2])
    art = compile_request(req)
    [first, second] = build_tasks(art, req, 90)
    done = apply_builds(art, 90, {first.name: BuiltKernel(error="BuildError: boom")})
    by_name = {k.name: k for k in done.manifest.kernels}
    assert not by_name[first.name].binaries and by_name[first.name].metadata["sm_90.error"] == "BuildError: boom"
    assert "consistent signature" in str(by_name[second.name].metadata["sm_90.error"])  # no build at all


@contextmanager
def running(store: Store, builders: int = 2, limits: JobLimits | None = None,
            delay_s: float = 0.0) -> Iterator[list[BuildConsumer]]:
    """A compile consumer that leaves builds to tasks, and `builders` build consumers, on `store`."""
    stop = threading.Event()
    consumer = Consumer(store, "compiler", stop, block_ms=50, policy=JobPolicy(build_tasks=True))
    started = start_build_consumers(store, "w", builders, stop, limits=limits or JobLimits(timeout_s=120),
                                    max_attempts=3, block_ms=50, delay_s=delay_s)
    consumer.thread.start()
    try:
        yield started
    finally:
        stop.set()
        for c in (consumer, *started):
            c.thread.join(timeout=30)


@pytest.fixture
def pool(store: Store) -> Iterator[tuple[Store, list[BuildConsumer]]]:
    with running(store) as builders:
        yield store, builders


def wait_until(check: Callable[[], Any], timeout_s: float = 180) -> Any:
    deadline = time.monotonic() + timeout_s  # the processes import torch and triton first
    while not (got := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got, "timed out"
    return got


def compiled(store: Store, req: CompileRequest) -> JobRecord:
    job_id = store.submit(compile_key(req), req.model_dump_json(), "interactive").job_id
    job = wait_until(lambda: (j := store.get_job(job_id)).finished and j)
    assert job.state is JobState.DONE, job
    return job


def test_a_jobs_kernels_are_built_by_tasks_and_shared_kernels_are_built_once(
        pool: tuple[Store, list[BuildConsumer]]) -> None:
    store, builders = pool
    req = many_kernels(OPS[:4])
    job = compiled(store, req)
    assert list(job.stages) == ["queued", "lowering", "building", "storing", "done"]
    art = store.get_artifact(job.key)
    kernels = art.manifest.kernels
    assert len(kernels) == 4 and all("sm_90" in k.binaries for k in kernels)
    tasks = store.get_jobs(job.tasks)
    assert len(tasks) == 4
    assert sorted(t.name for t in tasks) == sorted(k.name for k in kernels)
    assert all(t.kind == "build" and t.state is JobState.DONE and t.parent == job.id and t.attempt == 1
               and t.arch == 90 and t.worker in {b.name for b in builders} for t in tasks)
    assert all(t.stats["built"] and t.stats["kernel"] == t.name for t in tasks)
    # The same binaries as building them one after another here.
    serial = build_artifact(compile_request(req), req, 90)
    assert {k.name: k.binaries["sm_90"].digest for k in serial.manifest.kernels} == \
        {k.name: k.binaries["sm_90"].digest for k in kernels}
    listed = store.list_jobs(None, 50)  # the compile job and the tune job it queued; tasks are not listed
    assert job.id in {j.id for j in listed} and not any(j.kind == "build" for j in listed)

    # A second graph with one kernel more: only that one is built; the others are the first's.
    bigger = compiled(store, many_kernels(OPS))
    [new] = store.get_jobs(bigger.tasks)
    assert new.parent == bigger.id and new.name not in {k.name for k in kernels}
    shared = {k.name: k.binaries["sm_90"] for k in kernels}
    again = {k.name: k.binaries["sm_90"] for k in store.get_artifact(bigger.key).manifest.kernels}
    assert len(again) == 5 and all(again[name] == ref for name, ref in shared.items())
    assert store.queue_depths()["builds"] == {"waiting": 0, "running": 0}


def test_the_job_page_lists_its_tasks_and_who_ran_them(embedded_settings: ServiceSettings) -> None:
    from fxcc.service.app import create_app

    settings = embedded_settings.model_copy(update={"build_processes": 2, "anonymous": True,
                                                    "anonymous_role": "admin"})
    with TestClient(create_app(settings)) as client:
        req = many_kernels(OPS[:3])
        queued = client.post("/v1/compile", content=req.model_dump_json(),
                             headers={"Content-Type": "application/json"}).json()
        job = client.get(f"/v1/jobs/{queued['job_id']}", params={"wait": 60}).json()
        for _ in range(3):  # wait is capped at job_wait_max_s
            if job["state"] == "done":
                break
            job = client.get(f"/v1/jobs/{queued['job_id']}", params={"wait": 60}).json()
        assert job["state"] == "done", job
        tasks = client.get(f"/v1/jobs/{job['id']}/tasks").json()
        assert len(tasks) == 3 == len(job["tasks"])
        assert all(t["stage"] == JobStage.DONE.value and t["worker"].startswith("embedded-b") for t in tasks)
        assert client.get("/v1/jobs/nosuchjob/tasks").status_code == 404


def test_a_task_with_a_bad_request_fails_and_its_kernel_keeps_no_binary(store: Store) -> None:
    from fxcc.service.store import BuildEntry

    req = many_kernels(OPS[:1])
    [task] = build_tasks(compile_request(req), req, 90)
    parent = store.submit(compile_key(req), req.model_dump_json(), "interactive").job_id
    forged = task.model_copy(update={"num_warps": 8})  # queued under another task's key
    [task_id] = store.submit_builds(parent, [BuildEntry(key=task.key, task_json=forged.model_dump_json(),
                                                        name=task.name, arch=90)])
    assert store.get_job(parent).tasks == [task_id]
    stop = threading.Event()
    [builder] = start_build_consumers(store, "w", 1, stop, limits=JobLimits(warm_start=False), max_attempts=3,
                                      block_ms=50)
    try:
        deadline = time.monotonic() + 30
        while not (done := store.get_job(task_id)).finished and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        builder.thread.join(timeout=30)
    assert done.state is JobState.FAILED and done.error.error == "InvalidTask"
    assert store.get_kernel_builds([task.key]) == {}
    assert builder.process.started == 0  # refused before any build process was needed


def test_a_build_over_its_time_limit_fails_its_task_and_the_kernel_runs_from_source(store: Store) -> None:
    with running(store, builders=1, limits=JobLimits(timeout_s=1.0), delay_s=30) as [builder]:
        job = compiled(store, many_kernels(OPS[:1]))
    [task] = store.get_jobs(job.tasks)
    assert task.state is JobState.FAILED and "FXCC_BUILD_TIMEOUT_S" in task.error.message and task.attempt == 1
    [kernel] = store.get_artifact(job.key).manifest.kernels
    assert not kernel.binaries and "FXCC_BUILD_TIMEOUT_S" in str(kernel.metadata["sm_90.error"])
    assert builder.process.started == 2  # killed and replaced


def test_an_aborted_job_stops_waiting_for_its_tasks_which_finish(store: Store) -> None:
    req = many_kernels(OPS[:2])
    with running(store, builders=1, delay_s=2) as _:
        job_id = store.submit(compile_key(req), req.model_dump_json(), "interactive").job_id
        waiting = wait_until(lambda: (j := store.get_job(job_id)).stage is JobStage.BUILDING and j.tasks and j)
        assert store.abort(job_id, "root") == "cancelled"
        wait_until(lambda: all(t.finished for t in store.get_jobs(waiting.tasks)))
    assert store.get_job(job_id).stage is JobStage.CANCELLED and store.get_artifact(waiting.key) is None
    assert all(t.state is JobState.DONE for t in store.get_jobs(waiting.tasks))
    assert len(store.get_kernel_builds([t.key for t in store.get_jobs(waiting.tasks)])) == 2  # kept for the next

"""Build tasks: a compile job's kernel builds spread over every worker of the cluster.

The compile job's worker lowers the graph and renders its kernels, then queues one build task per
kernel whose binary is not kept already (build_by_tasks); every worker's build consumers
(BuildConsumer, build_processes of them, each with a warm build process) take tasks from the one
build queue, build them under the build limits and keep the result under the task's content key.
The compile job's worker assembles the artifact when its last task lands, then signs and stores it.

Note: a task is a job of the queue like the others: claimed from a stream, renewed by heartbeats,
reclaimed from a worker that died (only that task runs again), retried up to job_max_attempts,
listed on its compile job (`tasks`) with the worker that ran it. Tasks are single-flight by content
key, so two jobs that share a kernel wait on one build; a compile job retried after its worker died
finds the kernels built meanwhile and queues only the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pydantic import ValidationError

from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.build import apply_builds
from fxcc.compiler_core.build_tasks import BuildTask, BuiltKernel
from fxcc.service.store import BuildEntry, Claim, JobError, JobRecord, JobStage, Store
from fxcc.service.subproc import HelperCrashed, OverMemory, OverTime
from fxcc.worker.builder import BuildProcess
from fxcc.worker.claims import ClaimingThread
from fxcc.worker.limits import CompileTimeout, JobCancelled, JobLimits

log = logging.getLogger("fxcc.worker")

_POLL_FIRST_S = 0.01
_POLL_MAX_S = 0.1
FAILED_TASK = (JobStage.FAILED, JobStage.CANCELLED)


# ---------------------------------------------------------------- the compile job's side


def build_by_tasks(store: Store, job: JobRecord, artifact: Artifact, tasks: list[BuildTask], *,
                   timeout_s: float, cancelled: Callable[[], bool]) -> Artifact:
    """`artifact` with its kernels built by build tasks: those kept already are reused, the rest
    queued (single flight) and waited for, up to `timeout_s`. A task that failed leaves its kernel
    without a binary (it runs from source), as a kernel that does not build. Raises CompileTimeout,
    or JobCancelled when `cancelled()` says so (the tasks go on: other jobs may share them)."""
    built = _kept(store, [t.key for t in tasks])
    missing = [t for t in tasks if t.key not in built]
    entries = [BuildEntry(key=t.key, task_json=t.model_dump_json(), name=t.name, arch=t.arch) for t in missing]
    pending = dict(zip(store.submit_builds(job.id, entries), missing, strict=True)) if entries else {}
    log.info("job %s: %d kernels, %d kept already, %d build tasks queued", job.id, len(tasks),
             len(tasks) - len(missing), len(pending))
    deadline = time.monotonic() + timeout_s
    pause, next_check = _POLL_FIRST_S, time.monotonic() + 1.0
    while pending:
        landed = []
        for task_id, record in zip(list(pending), store.get_jobs(list(pending)), strict=True):
            if record is None or record.stage in FAILED_TASK:
                why = "is gone" if record is None else f"{record.stage.value}: {record.error.message if record.error else ''}"
                built[pending[task_id].key] = BuiltKernel(error=f"build task {task_id} {why}"[:400])
                del pending[task_id]
            elif record.stage is JobStage.DONE:
                landed.append(task_id)
        if landed:
            found = _kept(store, [pending[i].key for i in landed])
            for task_id in landed:
                key = pending.pop(task_id).key
                built[key] = found.get(key) or BuiltKernel(error=f"build task {task_id} is done but its kernel is gone")
        if not pending:
            break
        now = time.monotonic()
        if now >= deadline:
            raise CompileTimeout(f"{len(pending)} build tasks were not done within {timeout_s:g} s (FXCC_JOB_TIMEOUT_S)")
        if now >= next_check:
            next_check = now + 1.0
            if cancelled():
                raise JobCancelled(job.id)
        time.sleep(pause)
        pause = min(pause * 1.5, _POLL_MAX_S)
    return apply_builds(artifact, artifact.manifest.target.arch, {t.name: built[t.key] for t in tasks})


def _kept(store: Store, keys: list[str]) -> dict[str, BuiltKernel]:
    """The built kernels kept under `keys`; one that does not decode counts as not kept."""
    out = {}
    for key, data in store.get_kernel_builds(keys).items():
        try:
            out[key] = BuiltKernel.decode(data)
        except ValueError:
            log.warning("kept kernel build %s does not decode; building it again", key[:12])
    return out


# ---------------------------------------------------------------- the build consumers


class BuildConsumer(ClaimingThread):
    """One thread that takes build tasks and runs them in its warm build process until `stop`."""

    kind = "build task"

    def __init__(self, store: Store, name: str, stop: threading.Event, *, limits: JobLimits,
                 max_attempts: int = 3, block_ms: int = 1000, delay_s: float = 0.0) -> None:
        super().__init__(store, name, stop, BuildProcess(name), block_ms=block_ms, warm_start=limits.warm_start)
        self.limits = limits
        self.max_attempts = max_attempts
        self.delay_s = delay_s  # FXCC_TEST_ONLY_BUILD_DELAY_S

    def claim(self) -> list[Claim]:
        return self.store.claim_builds(self.name, self.block_ms)

    def handle(self, claim: Claim) -> None:
        run_build_claim(self.store, claim, self)


def run_build_claim(store: Store, claim: Claim, consumer: BuildConsumer) -> None:
    """Run one claimed build task, record its outcome and acknowledge the claim. A build process
    that crashed is retried up to max_attempts; one over a build limit fails the task (its kernel
    runs from source); a store error propagates (the claim stays pending and is reclaimed)."""
    job = store.get_job(claim.job_id)
    if job is None or job.finished or job.kind != "build":
        store.ack(claim)
        return
    if job.attempt >= consumer.max_attempts:
        store.mark_failed(job.id, JobError(error="TooManyAttempts", message=(
            f"build task was started {job.attempt} times without finishing; its workers died")), dead_letter=True)
        store.ack(claim)
        return
    started = store.mark_started(job.id, consumer.name, takeover=claim.reclaimed, stage=JobStage.BUILDING)
    if started is None:
        store.ack(claim)
        return
    try:
        task = BuildTask.model_validate_json(store.get_request(job.id) or "")
        if task.key != job.key:
            raise ValueError(f"task's content key {task.key[:12]} is not the job's {job.key[:12]}")
    except (ValidationError, ValueError) as e:
        store.mark_failed(job.id, JobError(error="InvalidTask", message=str(e)[:2000]))
        store.ack(claim)
        return
    try:
        built = _kept(store, [task.key]).get(task.key)
        if built is None:
            built = consumer.process.build(task, timeout_s=consumer.limits.timeout_s,
                                           memory_mb=consumer.limits.memory_mb, delay_s=consumer.delay_s)
            store.put_kernel_build(task.key, built.encode())
        store.mark_done(job.id, {"kernel": task.name, "built": built.error is None,
                                 "build_ms": built.metadata.get("build_ms"), "error": built.error})
    except (OverTime, OverMemory) as e:
        log.warning("build task %s (%s) over a limit: %s", job.id, task.name, e)
        store.mark_failed(job.id, JobError.of(e))
    except HelperCrashed as e:
        if started.attempt >= consumer.max_attempts:
            store.mark_failed(job.id, JobError.of(e), dead_letter=True)
        else:
            log.warning("build task %s (%s) crashed on attempt %d, retrying: %s", job.id, task.name,
                        started.attempt, e)
            store.retry(claim, JobError.of(e))  # acknowledges the claim
            return
    store.ack(claim)


def start_build_consumers(store: Store, worker: str, count: int, stop: threading.Event, *, limits: JobLimits,
                          max_attempts: int, block_ms: int, delay_s: float = 0.0) -> list[BuildConsumer]:
    """`count` build consumers named `<worker>-b<i>`, started."""
    consumers = [BuildConsumer(store, f"{worker}-b{i}", stop, limits=limits, max_attempts=max_attempts,
                               block_ms=block_ms, delay_s=delay_s) for i in range(count)]
    for c in consumers:
        c.thread.start()
    return consumers

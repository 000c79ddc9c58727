"""The worker's compile process (worker/child.py) and process_claim through it, on both stores: a
compile over its time or memory limit is killed and fails for good, the process is replaced and
compiles the next job; a cancelled job's compile is killed and nothing is stored; a process that
dies is a crash (retried); a compiler error comes back as the child recorded it."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.wire import CompileRequest, Target
from fxcc.service.redis_store import RedisStore
from fxcc.service.store import Claim, JobStage, JobState, Store, now_s
from fxcc.worker.child import CompileProcess
from fxcc.worker.limits import CompileCrashed, CompileFailed, CompileMemoryLimit, CompileTimeout, JobLimits
from fxcc.worker.process import JobPolicy, process_claim
from fxcc.worker.steps import CompileWork


@pytest.fixture(scope="module")
def child() -> Iterator[CompileProcess]:
    """One compile process for the module (each start imports torch): tests set its limits."""
    proc = CompileProcess(JobLimits(), "test")
    proc.start()
    yield proc
    proc.close()


def compile_in(child: CompileProcess, req: CompileRequest, **hooks: float) -> tuple[object, list[JobStage]]:
    stages: list[JobStage] = []
    work = CompileWork(req.model_dump_json(), **hooks)
    return child.compile(work, job_id="none", store=NoJobs(), on_stage=stages.append), stages


class NoJobs:
    """A store that knows no job (so no compile is ever cancelled)."""

    def get_job(self, job_id: str) -> None:
        return None


def test_the_process_freezes_its_warm_heap_before_the_first_job(
        child: CompileProcess, make_unary: Callable[..., CompileRequest]) -> None:
    child.limits = JobLimits()
    artifact, _ = compile_in(child, make_unary("aten.sin.default"))
    assert artifact.manifest.kernels
    # torch, the compiler and the warm-up's caches: far more than a bare interpreter's objects
    assert child.frozen_objects is not None and child.frozen_objects > 10_000


def test_over_the_time_limit_is_killed_and_the_replacement_compiles_the_next(
        child: CompileProcess, make_unary: Callable[..., CompileRequest]) -> None:
    child.limits = JobLimits(timeout_s=1.0)
    before, pid = child.started, child.pid
    t0 = time.monotonic()
    with pytest.raises(CompileTimeout, match="FXCC_JOB_TIMEOUT_S") as e:
        compile_in(child, make_unary(), delay_s=120)
    assert "1 s" in e.value.message and time.monotonic() - t0 < 60  # killed, not waited for
    assert child.started == before + 1 and child.pid != pid
    assert _zombie_or_gone(pid)

    req = make_unary("aten.cos.default")
    artifact, _ = compile_in(child, req)
    assert artifact.manifest.key == compile_key(req) and artifact.manifest.kernels


def test_over_the_memory_limit_is_killed(child: CompileProcess, make_unary: Callable[..., CompileRequest]) -> None:
    child.limits = JobLimits(memory_mb=1024)
    pid = child.pid
    with pytest.raises(CompileMemoryLimit, match="FXCC_JOB_MEMORY_MB") as e:
        compile_in(child, make_unary(), alloc_mb=2048, delay_s=120)
    assert "1024 MB" in e.value.message and child.pid != pid
    artifact, _ = compile_in(child, make_unary("aten.exp.default"))  # under the limit: compiles
    assert artifact.manifest.kernels


def test_a_compiler_error_comes_back_as_recorded_and_a_dead_process_is_a_crash(
        child: CompileProcess, make_sum: Callable[[int], CompileRequest],
        make_unary: Callable[..., CompileRequest]) -> None:
    child.limits = JobLimits()
    with pytest.raises(CompileFailed) as failed:
        compile_in(child, make_sum(9))
    assert failed.value.final and failed.value.error.error == "InvalidGraph" and failed.value.error.node == "total"

    doomed = child.pid
    threading.Timer(2.0, os.kill, (doomed, signal.SIGKILL)).start()
    with pytest.raises(CompileCrashed, match="signal 9"):
        compile_in(child, make_unary(), delay_s=120)
    assert child.pid != doomed


def claim_one(store: Store, req: CompileRequest) -> Claim:
    store.submit(compile_key(req), req.model_dump_json(), req.priority)
    [claim] = store.claim("w", block_ms=10)
    return claim


def test_a_job_over_its_time_limit_fails_for_good_without_retry(
        store: Store, child: CompileProcess, make_unary: Callable[..., CompileRequest]) -> None:
    child.limits = JobLimits(timeout_s=1.0)
    policy = JobPolicy(compile_delay_s=120)
    job = process_claim(store, claim_one(store, make_unary()), worker="w", policy=policy, child=child)
    assert job.state is JobState.FAILED and job.attempt == 1
    assert job.error.error == "CompileTimeout" and "FXCC_JOB_TIMEOUT_S" in job.error.message
    assert store.get_manifest(job.key) is None and store.dead_letters(10) == []
    assert store.claim("w", block_ms=10) == []  # not queued again
    assert store.queue_depths()["interactive"] == {"waiting": 0, "running": 0}

    job = process_claim(store, claim_one(store, make_unary("aten.cos.default")), worker="w", child=child)
    assert job.state is JobState.DONE and store.get_manifest(job.key) is not None


def cancel_running(store: Store, job_id: str) -> None:
    """What the service's DELETE of a running job does to its record (that route lands elsewhere)."""
    if isinstance(store, RedisStore):
        store.r.hset(store.k.job(job_id), mapping={"stage": "cancelled", "finished_at": repr(now_s())})
    else:
        store._move(job_id, JobStage.CANCELLED, finished_at=now_s())


def test_a_job_cancelled_while_it_compiles_is_stopped_and_stores_nothing(
        store: Store, child: CompileProcess, make_unary: Callable[..., CompileRequest]) -> None:
    child.limits = JobLimits()
    compile_in(child, make_unary("aten.exp.default"))  # a warm process: the job's compile is running
    claim = claim_one(store, make_unary())
    pid = child.pid
    threading.Timer(2.0, cancel_running, (store, claim.job_id)).start()
    t0 = time.monotonic()
    job = process_claim(store, claim, worker="w", policy=JobPolicy(compile_delay_s=120), child=child)
    assert time.monotonic() - t0 < 30  # stopped within about a second of the cancellation
    assert job.stage is JobStage.CANCELLED and job.error is None
    assert child.pid != pid and _zombie_or_gone(pid)
    assert store.get_manifest(job.key) is None and store.dead_letters(10) == []
    assert store.queue_depths()["interactive"] == {"waiting": 0, "running": 0}  # the claim is acked


def _zombie_or_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_job_cancelled_while_its_compile_process_starts_is_dropped_at_once(
        redis_store: Store, child: CompileProcess, make_unary: Callable[..., CompileRequest]) -> None:
    child.close()  # the next job starts a process, and waits for its imports
    claim = claim_one(redis_store, make_unary())
    threading.Timer(1.0, cancel_running, (redis_store, claim.job_id)).start()
    job = process_claim(redis_store, claim, worker="w", child=child)
    assert job.stage is JobStage.CANCELLED and redis_store.get_manifest(job.key) is None
    assert redis_store.queue_depths()["interactive"] == {"waiting": 0, "running": 0}
    artifact, _ = compile_in(child, make_unary("aten.tanh.default"))  # the process warmed up meanwhile
    assert artifact.manifest.kernels


def test_a_process_left_mid_job_is_never_reused(child: CompileProcess,
                                                make_unary: Callable[..., CompileRequest]) -> None:
    """An error in the parent while the child compiles (here the store failing as a stage is
    recorded) replaces the process: its late answer must not become the next job's."""
    child.limits = JobLimits()
    req = make_unary()
    req = req.model_copy(update={"options": req.options.model_copy(update={"target": Target(kind="cuda", arch=90)})})
    pid = child.pid

    def store_down(stage: JobStage) -> None:
        raise ConnectionError(f"store unavailable while recording {stage.value}")

    work = CompileWork(req.model_dump_json())
    with pytest.raises(ConnectionError, match="building"):
        child.compile(work, job_id="none", store=NoJobs(), on_stage=store_down)
    assert child.pid != pid
    nxt = make_unary("aten.neg.default")
    artifact, _ = compile_in(child, nxt)
    assert artifact.manifest.key == compile_key(nxt)


@pytest.mark.parametrize("warm", [True, False])
def test_a_consumer_starts_its_compile_process_warm_or_at_its_first_job(
        tmp_path, make_unary: Callable[..., CompileRequest], warm: bool) -> None:
    from fxcc.service.embedded_store import EmbeddedStore
    from fxcc.worker.loop import Consumer

    store = EmbeddedStore(tmp_path / "data")
    stop = threading.Event()
    consumer = Consumer(store, "c", stop, block_ms=50, policy=JobPolicy(limits=JobLimits(warm_start=warm)))
    consumer.thread.start()
    try:
        time.sleep(1.0)
        assert (consumer.child.pid is not None) is warm  # no job yet: a lazy consumer has no process
        req = make_unary()
        store.submit(compile_key(req), req.model_dump_json(), req.priority)
        deadline = time.monotonic() + 300
        while consumer.jobs_done < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert consumer.jobs_done == 1 and consumer.child.started == 1 and consumer.child.pid is not None
        assert store.get_artifact(compile_key(req)) is not None
    finally:
        stop.set()
        consumer.thread.join(60)


def untuned_sm90(store: Store, make_unary: Callable[..., CompileRequest]) -> tuple[CompileRequest, Claim]:
    """An untuned sm_90 artifact stored by a CPU worker, and the claim of the tune job it queued."""
    req = make_unary("aten.sigmoid.default")
    req = req.model_copy(update={"options": req.options.model_copy(update={"target": Target(kind="cuda", arch=90)})})
    job = process_claim(store, claim_one(store, req), worker="cpu")
    assert job.state is JobState.DONE and not store.get_manifest(job.key).tuned
    [claim] = store.claim("gpu", block_ms=10, tune_arch=90)
    return req, claim


def test_a_tune_job_runs_in_the_compile_process_under_the_job_limits(
        store: Store, child: CompileProcess, make_unary: Callable[..., CompileRequest],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner runs in the child (the fake tuning names the device the child was given; nothing
    in this process is patched but the GPU's presence), stopped at the time limit like a compile."""
    from fxcc.worker import tune

    monkeypatch.setattr(tune, "tuning_device", lambda arch, device: device if arch == 90 else None)
    gpu = JobPolicy(tune_device="cuda:0", tune_arch=90, fake_tune=True)
    child.limits = JobLimits(timeout_s=1.0)
    req, claim = untuned_sm90(store, make_unary)
    pid = child.pid
    slow = dataclasses.replace(gpu, compile_delay_s=120)
    job = process_claim(store, claim, worker="gpu", policy=slow, child=child)
    assert job.kind == "tune" and job.state is JobState.FAILED and job.error.error == "CompileTimeout"
    assert child.pid != pid and not store.get_manifest(job.key).tuned  # stopped; the untuned one stays

    child.limits = JobLimits()
    again = store.submit_tune(job.key, 90, req.model_dump_json())
    [claim] = store.claim("gpu", block_ms=10, tune_arch=90)
    assert claim.job_id == again.job_id
    job = process_claim(store, claim, worker="gpu", policy=gpu, child=child)
    assert job.state is JobState.DONE, job.error
    manifest = store.get_manifest(job.key)
    assert manifest.tuned and {k.tuning.device for k in manifest.kernels} == {"Fake GPU at cuda:0"}

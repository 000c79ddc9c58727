"""process_claim on both stores: success, stages, failure, retries, dead letters, duplicates, signatures."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import pytest

from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.signing import Signer, TrustedKeys, generate
from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.store import Claim, JobStage, JobState, Store
from fxcc.worker.process import JobPolicy, process_claim


def queue(store: Store, req: CompileRequest, request_json: str | None = None) -> Claim:
    """Submit `req` and claim it, as a worker would."""
    job_id = store.submit(compile_key(req), request_json or req.model_dump_json(), req.priority).job_id
    [claim] = store.claim("w", block_ms=10)
    assert claim.job_id == job_id
    return claim


def test_success_stores_artifact_stats_and_stages(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary()
    job = process_claim(store, queue(store, req), worker="w")
    assert job is not None and job.state is JobState.DONE and job.stage is JobStage.DONE
    assert job.worker == "w" and job.attempt == 1
    assert list(job.stages) == ["queued", "lowering", "storing", "done"]
    assert sorted(job.stages.values()) == list(job.stages.values())
    art = store.get_artifact(job.key)
    assert art is not None and art.manifest.key == job.key == compile_key(req)
    assert job.stats == art.manifest.stats.model_dump() and "kernels" in job.stats
    assert store.get_signature(job.key) is None
    assert store.queue_depths()["interactive"] == {"waiting": 0, "running": 0}


def test_signed_manifest(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    signer, other = Signer(generate()[0]), Signer(generate()[0])
    job = process_claim(store, queue(store, make_unary()), policy=JobPolicy(signer=signer))
    sig = store.get_signature(job.key)
    manifest = store.get_manifest(job.key).model_dump(mode="json")
    assert sig.startswith(f"ed25519:{signer.public.id}:")
    assert TrustedKeys([signer.public]).verify(manifest, sig)
    assert TrustedKeys([other.public, signer.public]).verify(manifest, sig)  # rotation: either key
    assert "not trusted" in TrustedKeys([other.public]).check(manifest, sig)
    assert "does not match" in TrustedKeys([signer.public]).check({**manifest, "tuned": True}, sig)


def test_compile_error_fails_at_once_with_op_and_node(store: Store,
                                                      make_sum: Callable[[int], CompileRequest]) -> None:
    job = process_claim(store, queue(store, make_sum(9)))
    assert job is not None and job.state is JobState.FAILED and job.error is not None and job.attempt == 1
    assert (job.error.error, job.error.node, job.error.op) == ("InvalidGraph", "total", "aten.sum.dim_IntList")
    assert store.get_artifact(job.key) is None
    assert store.dead_letters(10) == []  # the client's mistake, not a poison job


def test_unparseable_request_fails_without_raising(store: Store,
                                                   make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary()
    bad = json.loads(req.model_dump_json())
    bad["schema_version"] = 2
    job = process_claim(store, queue(store, req, json.dumps(bad)))
    assert job is not None and job.state is JobState.FAILED and job.error.error == "InvalidGraph"
    assert "invalid request" in job.error.message


def test_crashing_compile_is_retried_then_dead_lettered(store: Store, monkeypatch: pytest.MonkeyPatch,
                                                        make_unary: Callable[..., CompileRequest]) -> None:
    def crash(*args: object) -> None:
        raise MemoryError("out of memory while building")

    monkeypatch.setattr("fxcc.compiler_core.pipeline.rebuild_graph", crash)
    claim = queue(store, make_unary())
    policy = JobPolicy(max_attempts=2)
    job = process_claim(store, claim, policy=policy)
    assert job.state is JobState.QUEUED and job.attempt == 1 and job.error.error == "MemoryError"
    assert store.dead_letters(10) == []
    [again] = store.claim("w", block_ms=10)  # a fresh stream entry
    assert again.job_id == claim.job_id
    job = process_claim(store, again, policy=policy)
    assert job.state is JobState.FAILED and job.attempt == 2 and job.error.message == "out of memory while building"
    [dead] = store.dead_letters(10)
    assert dead["job_id"] == job.id and dead["key"] == job.key and "MemoryError" in dead["error"]
    assert store.claim("w", block_ms=10) == []
    assert store.queue_depths()["interactive"] == {"waiting": 0, "running": 0}


def test_finished_job_is_not_rerun(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    claim = queue(store, make_unary())
    first = process_claim(store, claim, worker="a")
    second = process_claim(store, replace(claim, consumer="b"), worker="b")
    assert first == second and second.worker == "a" and second.attempt == 1


def test_existing_artifact_is_reused(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary()
    claim = queue(store, req)
    store.put_artifact(compile_request(req))  # another job finished it meanwhile
    job = process_claim(store, claim)
    assert job is not None and job.state is JobState.DONE and store.counters()["puts"] == 1


def test_attempts_are_capped(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    claim = queue(store, make_unary())
    store.mark_started(claim.job_id, "dead-1")  # two workers started it and died mid-compile
    store.mark_started(claim.job_id, "dead-2", takeover=True)
    job = process_claim(store, replace(claim, reclaimed=True), policy=JobPolicy(max_attempts=2))
    assert job is not None and job.state is JobState.FAILED and job.error.error == "TooManyAttempts"
    assert [d["job_id"] for d in store.dead_letters(10)] == [claim.job_id]


def test_a_running_job_is_left_alone_unless_taken_over(store: Store,
                                                       make_unary: Callable[..., CompileRequest]) -> None:
    claim = queue(store, make_unary())
    store.mark_started(claim.job_id, "busy")
    job = process_claim(store, claim, worker="second")  # a second delivery, not a takeover
    assert job is not None and job.state is JobState.RUNNING and job.worker == "busy" and job.attempt == 1
    job = process_claim(store, replace(claim, reclaimed=True), worker="rescuer")
    assert job is not None and job.state is JobState.DONE and job.worker == "rescuer" and job.attempt == 2


def test_requeue_gives_the_job_back_uncounted(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    claim = queue(store, make_unary())
    store.mark_started(claim.job_id, "stopping")
    store.requeue(claim)  # what a worker does when SIGTERM's grace period runs out
    job = store.get_job(claim.job_id)
    assert job.state is JobState.QUEUED and job.attempt == 0
    [again] = store.claim("w2", block_ms=10)
    job = process_claim(store, again, worker="w2")
    assert job.state is JobState.DONE and job.attempt == 1


def test_unknown_job(store: Store) -> None:
    assert process_claim(store, Claim(job_id="0" * 32, stream="interactive", consumer="w")) is None


def test_cuda_target_is_built_with_a_building_stage(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    from fxcc.compiler_core.build import arch_key, cuda_build_unavailable
    from fxcc.compiler_core.wire import CompileOptions, Target

    if cuda_build_unavailable() is not None:
        pytest.skip(cuda_build_unavailable())
    req = make_unary().model_copy(update={"options": CompileOptions(target=Target(kind="cuda", arch=90))})
    job = process_claim(store, queue(store, req))
    assert job.state is JobState.DONE, job.error
    assert list(job.stages) == ["queued", "lowering", "building", "storing", "done"]
    art = store.get_artifact(job.key)
    assert art.manifest.kernels and all(arch_key(90) in k.binaries for k in art.manifest.kernels)

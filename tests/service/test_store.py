"""Both stores: artifact round trip, single flight, job states and queue priority."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from fxcc.compiler_core.artifact import Artifact, KernelInfo, add_blob
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.store import JobError, JobStage, JobState, Store, TokenRecord


def artifact_with_blobs(req: CompileRequest) -> Artifact:
    """A real compiled artifact, plus two kernel blobs so that blob handling is exercised."""
    art = compile_request(req)
    blobs: dict[str, bytes] = {}
    kernels = [KernelInfo(name=f"k{i}", source=add_blob(blobs, f"kernel {i}\n".encode() * 100))
               for i in range(2)]
    return Artifact(art.manifest.model_copy(update={"kernels": kernels, "stage_log": None}), blobs)


def test_artifact_round_trip(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    art = artifact_with_blobs(make_unary())
    key = art.manifest.key
    assert store.get_artifact(key) is None and store.get_manifest(key) is None
    store.put_artifact(art)
    got = store.get_artifact(key)
    assert got is not None
    assert got.manifest == art.manifest and got.blobs == art.blobs
    assert store.get_manifest(key) == art.manifest
    assert store.counters().get("puts") == 1


def test_untuned_never_replaces_tuned(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    art = artifact_with_blobs(make_unary())
    tuned = Artifact(art.manifest.model_copy(update={"tuned": True}), art.blobs)
    store.put_artifact(tuned)
    store.put_artifact(art)
    got = store.get_manifest(art.manifest.key)
    assert got is not None and got.tuned


def test_single_flight(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary()
    key = compile_key(req)
    first = store.submit(key, req.model_dump_json(), "interactive")
    second = store.submit(key, req.model_dump_json(), "interactive")
    assert first.created and not second.created
    assert first.job_id == second.job_id and first.manifest is None
    job = store.get_job(first.job_id)
    assert job is not None and job.state is JobState.QUEUED and job.key == key and job.attempt == 0
    assert store.get_request(first.job_id) == req.model_dump_json()

    # A failed job frees the key: the next identical request gets a new job.
    store.mark_failed(first.job_id, JobError(error="BuildError", message="boom", op="aten.sin.default"))
    third = store.submit(key, req.model_dump_json(), "interactive")
    assert third.created and third.job_id != first.job_id

    # Once the artifact exists, submitting answers with its manifest and queues nothing.
    store.put_artifact(compile_request(req))
    cached = store.submit(key, req.model_dump_json(), "interactive")
    assert cached.manifest is not None and cached.manifest.key == key and cached.job_id is None


def test_a_job_done_while_a_submit_looks_for_its_artifact_is_not_queued_again(
        store: Store, make_unary: Callable[..., CompileRequest], monkeypatch: pytest.MonkeyPatch) -> None:
    # A rank's submit finds no artifact; the worker then stores it and ends the job, before the
    # submit asks for a job in flight (a torchrun test saw one graph compiled twice so).
    req = make_unary()
    key = compile_key(req)
    first = store.submit(key, req.model_dump_json(), "interactive")
    assert first.job_id is not None and store.mark_started(first.job_id, "w1") is not None
    looked_up = store.fetch_artifact

    def look_up_then_the_worker_finishes(k: str, **kw: bool):
        found = looked_up(k, **kw)
        monkeypatch.setattr(store, "fetch_artifact", looked_up)
        store.put_artifact(compile_request(req))
        store.mark_done(first.job_id, {})
        return found

    monkeypatch.setattr(store, "fetch_artifact", look_up_then_the_worker_finishes)
    second = store.submit(key, req.model_dump_json(), "interactive")
    assert not second.created and second.job_id in (None, first.job_id)
    assert [j.id for j in store.list_jobs(None, 10) if j.key == key] == [first.job_id]

    # Its artifact gone, the done job no longer answers for the key: a new job compiles it.
    assert store.delete_artifact(key)
    third = store.submit(key, req.model_dump_json(), "interactive")
    assert third.created and third.job_id != first.job_id


def test_job_lifecycle_records(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary()
    job_id = store.submit(compile_key(req), req.model_dump_json(), "precompile").job_id
    assert job_id is not None
    job = store.mark_started(job_id, "w1")
    assert job is not None
    assert (job.state, job.worker, job.attempt, job.priority) == (JobState.RUNNING, "w1", 1, "precompile")
    assert job.started_at is not None and job.started_at >= job.created_at
    store.mark_done(job_id, {"kernels": 0, "nodes": 1})
    job = store.get_job(job_id)
    assert job is not None and job.state is JobState.DONE and job.stats == {"kernels": 0, "nodes": 1}
    assert job.finished_at is not None and job.error is None
    assert store.get_job("0" * 32) is None
    assert store.mark_started("0" * 32, "w1") is None


def test_interactive_is_claimed_first(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    pre = make_unary("aten.cos.default", priority="precompile")
    inter = make_unary("aten.sin.default", priority="interactive")
    pre_id = store.submit(compile_key(pre), pre.model_dump_json(), "precompile").job_id
    inter_id = store.submit(compile_key(inter), inter.model_dump_json(), "interactive").job_id
    first = store.claim("c1", block_ms=100)
    second = store.claim("c1", block_ms=100)
    assert [c.job_id for c in first] == [inter_id]
    assert [c.job_id for c in second] == [pre_id]
    for c in first + second:
        store.ack(c)
    assert store.claim("c1", block_ms=50) == []


def test_interactive_request_promotes_a_queued_precompile_job(store: Store,
                                                             make_unary: Callable[..., CompileRequest]) -> None:
    backlog = make_unary("aten.cos.default", priority="precompile")
    store.submit(compile_key(backlog), backlog.model_dump_json(), "precompile")
    req = make_unary(priority="precompile")
    key = compile_key(req)
    job_id = store.submit(key, req.model_dump_json(), "precompile").job_id
    assert store.submit(key, req.model_dump_json(), "interactive").job_id == job_id
    assert store.get_job(job_id).priority == "interactive"
    [first] = store.claim("c", block_ms=10)
    assert first.job_id == job_id  # ahead of the older precompile job
    assert store.mark_started(job_id, "c") is not None
    assert store.mark_started(job_id, "other") is None  # a second delivery may not start it again


def test_cancel_list_and_count_jobs(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    reqs = [make_unary(op) for op in ("aten.sin.default", "aten.cos.default", "aten.exp.default")]
    ids = [store.submit(compile_key(r), r.model_dump_json(), "interactive").job_id for r in reqs]
    assert store.cancel(ids[0]) == "cancelled" and store.cancel(ids[0]) == "conflict"
    assert store.cancel("0" * 32) == "missing"
    [claim] = store.claim("w", block_ms=50)
    assert claim.job_id == ids[1]  # the cancelled job is not handed out
    store.mark_started(ids[1], "w")
    assert store.cancel(ids[1]) == "conflict"
    assert [j.id for j in store.list_jobs(None, 10)] == ids[::-1]
    assert [j.id for j in store.list_jobs(JobState.RUNNING, 10)] == [ids[1]]
    assert store.job_counts() == {"queued": 1, "running": 1, "done": 0, "failed": 0, "cancelled": 1}
    cancelled = store.get_job(ids[0])
    assert cancelled.stage is JobStage.CANCELLED and cancelled.finished and list(cancelled.stages) == [
        "queued", "cancelled"]


def test_signature_purge_and_delete(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    arts = [artifact_with_blobs(make_unary(op)) for op in ("aten.sin.default", "aten.cos.default")]
    store.put_artifact(arts[0], signature="ab" * 32)
    store.put_artifact(arts[1])
    found = store.fetch_artifact(arts[0].manifest.key)
    assert found.signature == "ab" * 32 and found.blobs == arts[0].blobs
    assert json.loads(found.manifest_json) == arts[0].manifest.model_dump(mode="json")
    assert store.fetch_artifact(arts[1].manifest.key, blobs=False).blobs is None
    assert store.cache_entries() == 2 and sorted(store.list_artifacts(10)) == sorted(a.manifest.key for a in arts)
    assert store.delete_artifact(arts[0].manifest.key) and not store.delete_artifact(arts[0].manifest.key)
    assert store.get_signature(arts[0].manifest.key) is None and store.cache_entries() == 1
    assert store.purge_cache() == 1 and store.cache_entries() == 0
    assert store.get_artifact(arts[1].manifest.key) is None


def test_api_tokens_are_kept_hashed(store: Store) -> None:
    record = TokenRecord(name="ci", role="client", sha256="c" * 64, created_at=1.0)
    assert store.add_token(record) and not store.add_token(record.model_copy(update={"sha256": "d" * 64}))
    assert store.find_token("c" * 64) == record and store.find_token("e" * 64) is None
    assert store.api_tokens() == [record]
    assert store.delete_token("ci") and not store.delete_token("ci") and store.api_tokens() == []


def test_tuned_replaces_untuned_with_its_signature(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    art = artifact_with_blobs(make_unary())
    store.put_artifact(art, "untuned-signature")
    tuned = Artifact(art.manifest.model_copy(update={"tuned": True}), art.blobs)
    store.put_artifact(tuned, "tuned-signature")
    got = store.get_manifest(art.manifest.key)
    assert got is not None and got.tuned
    assert store.get_signature(art.manifest.key) == "tuned-signature"
    store.put_artifact(art, "untuned-signature")  # refused: the tuned one and its signature stay
    assert store.get_manifest(art.manifest.key).tuned
    assert store.get_signature(art.manifest.key) == "tuned-signature"
    assert store.get_artifact(art.manifest.key) is not None


def test_untuned_put_racing_a_tuned_one_never_lands_last(redis_store: Store, monkeypatch: pytest.MonkeyPatch,
                                                         make_unary: Callable[..., CompileRequest]) -> None:
    """A tuned put lands between an untuned put's check and its write: the WATCH sees it, the
    check runs again, and the tuned manifest stays."""
    from fxcc.service import redis_cache

    art = artifact_with_blobs(make_unary())
    tuned = Artifact(art.manifest.model_copy(update={"tuned": True}), art.blobs)
    real = redis_cache.supersedes
    checks: list[bool] = []

    def racing(new, old):  # type: ignore[no-untyped-def]
        if len(checks) == 1:  # the untuned put's check inside WATCH: the GPU worker writes now
            monkeypatch.setattr(redis_cache, "supersedes", real)
            redis_store.put_artifact(tuned)
            monkeypatch.setattr(redis_cache, "supersedes", racing)
        checks.append(real(new, old))
        return checks[-1]

    monkeypatch.setattr(redis_cache, "supersedes", racing)
    redis_store.put_artifact(art)
    assert checks == [True, True, False]  # first check, the raced one, the retry after WatchError
    got = redis_store.get_manifest(art.manifest.key)
    assert got is not None and got.tuned

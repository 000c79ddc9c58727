"""process_job on both stores: success, failure, duplicates, attempts, artifacts that already exist."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from compiler_core.compile import compile_request
from compiler_core.keys import compile_key
from compiler_core.wire import CompileRequest
from service.embedded_store import EmbeddedStore
from service.settings import ServiceSettings
from service.store import JobState, Store
from worker.process import process_job


@pytest.fixture(params=["redis", "embedded"])
def store(request: pytest.FixtureRequest, embedded_settings: ServiceSettings) -> Iterator[Store]:
    if request.param == "redis":
        yield request.getfixturevalue("redis_store")
    else:
        yield EmbeddedStore(embedded_settings.data_dir)


def queue(store: Store, req: CompileRequest, request_json: str | None = None) -> str:
    job_id = store.submit(compile_key(req), request_json or req.model_dump_json(), req.priority).job_id
    assert job_id is not None
    return job_id


def test_success_stores_artifact_and_stats(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary()
    job = process_job(store, queue(store, req), worker="w")
    assert job is not None and job.state is JobState.DONE and job.worker == "w" and job.attempt == 1
    art = store.get_artifact(job.key)
    assert art is not None and art.manifest.key == job.key == compile_key(req)
    assert job.stats == art.manifest.stats.model_dump()


def test_compile_error_is_recorded_with_op_and_node(store: Store,
                                                    make_sum: Callable[[int], CompileRequest]) -> None:
    job = process_job(store, queue(store, make_sum(9)))
    assert job is not None and job.state is JobState.FAILED and job.error is not None
    assert (job.error.error, job.error.node, job.error.op) == ("InvalidGraph", "total", "aten.sum.dim_IntList")
    assert store.get_artifact(job.key) is None


def test_unparseable_request_fails_without_raising(store: Store,
                                                   make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary()
    bad = json.loads(req.model_dump_json())
    bad["schema_version"] = 2
    job = process_job(store, queue(store, req, json.dumps(bad)))
    assert job is not None and job.state is JobState.FAILED and job.error.error == "RuntimeError"


def test_finished_job_is_not_rerun(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    job_id = queue(store, make_unary())
    first = process_job(store, job_id, worker="a")
    second = process_job(store, job_id, worker="b")
    assert first == second and second.worker == "a" and second.attempt == 1


def test_existing_artifact_is_reused(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    req = make_unary()
    job_id = queue(store, req)
    store.put_artifact(compile_request(req))  # another job finished it meanwhile
    job = process_job(store, job_id)
    assert job is not None and job.state is JobState.DONE and store.counters()["puts"] == 1


def test_attempts_are_capped(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    job_id = queue(store, make_unary())
    store.mark_compiling(job_id, "dead-1")  # two workers claimed it and died mid-compile
    store.mark_compiling(job_id, "dead-2", takeover=True)
    job = process_job(store, job_id, max_attempts=2, takeover=True)
    assert job is not None and job.state is JobState.FAILED and job.error.error == "TooManyAttempts"


def test_a_running_job_is_left_alone_unless_taken_over(store: Store,
                                                       make_unary: Callable[..., CompileRequest]) -> None:
    job_id = queue(store, make_unary())
    store.mark_compiling(job_id, "busy")
    job = process_job(store, job_id, worker="second")  # a second delivery, not a takeover
    assert job is not None and job.state is JobState.COMPILING and job.worker == "busy" and job.attempt == 1
    job = process_job(store, job_id, worker="rescuer", takeover=True)
    assert job is not None and job.state is JobState.DONE and job.worker == "rescuer" and job.attempt == 2


def test_unknown_job(store: Store) -> None:
    assert process_job(store, "0" * 32) is None

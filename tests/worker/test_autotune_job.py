"""A GPU worker's jobs on both stores: a precompile job is tuned before it is built, replaces an
untuned artifact by a tuned one, and leaves tuned ones alone; an interactive default-mode job is
stored untuned first and tuned through the tune queue; a CPU worker stores untuned artifacts. The GPU is faked
(this runs on CPU): `tuning_device` says yes and the tuner marks the artifact tuned."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fxcc.compiler_core import pipeline
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest, Target
from fxcc.service.store import Claim, JobState, Store
from fxcc.worker import process
from fxcc.worker.process import JobPolicy, process_claim

GPU = JobPolicy(tune_device="cuda:0")




@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every request looks tunable here; the 'tuner' records the kernels it saw and marks tuned."""
    tuned: list[str] = []

    def tune(artifact: Artifact, request: CompileRequest, device: str | None, scheduled: Any = None) -> Artifact:
        assert device == "cuda:0"
        tuned.extend(k.name for k in artifact.manifest.kernels)
        return Artifact(artifact.manifest.model_copy(update={"tuned": True}), artifact.blobs)

    monkeypatch.setattr(process, "tuning_device", lambda arch, device: device)
    monkeypatch.setattr(pipeline, "autotune_for_target", tune)  # what the pipeline's tune stage calls
    return tuned


def cuda_request(make_unary: Callable[..., CompileRequest], priority: str = "precompile") -> CompileRequest:
    req = make_unary()
    return req.model_copy(update={"priority": priority,
                                  "options": req.options.model_copy(update={"target": Target(kind="cuda", arch=90)})})


def queue(store: Store, req: CompileRequest) -> Claim:
    store.submit(compile_key(req), req.model_dump_json(), req.priority)
    [claim] = store.claim("w", block_ms=10)
    return claim


def test_gpu_worker_tunes_before_building(store: Store, fake_gpu: list[str],
                                          make_unary: Callable[..., CompileRequest]) -> None:
    job = process_claim(store, queue(store, cuda_request(make_unary)), policy=GPU)
    assert job is not None and job.state is JobState.DONE
    stages = list(job.stages)
    assert "autotuning" in stages and stages.index("autotuning") < stages.index("storing")
    if "building" in stages:
        assert stages.index("autotuning") < stages.index("building")
    art = store.get_artifact(job.key)
    assert art is not None and art.manifest.tuned and fake_gpu


def test_gpu_worker_replaces_an_untuned_artifact(store: Store, fake_gpu: list[str],
                                                 make_unary: Callable[..., CompileRequest]) -> None:
    req = cuda_request(make_unary)
    claim = queue(store, req)
    store.put_artifact(compile_request(req))  # a CPU worker (or the embedded path) got there first
    job = process_claim(store, claim, policy=GPU)
    assert job is not None and job.state is JobState.DONE and fake_gpu
    got = store.get_manifest(job.key)
    assert got is not None and got.tuned


def test_gpu_worker_leaves_a_tuned_artifact_alone(store: Store, fake_gpu: list[str],
                                                  make_unary: Callable[..., CompileRequest]) -> None:
    req = cuda_request(make_unary)
    claim = queue(store, req)
    art = compile_request(req)
    store.put_artifact(Artifact(art.manifest.model_copy(update={"tuned": True}), art.blobs))
    job = process_claim(store, claim, policy=GPU)
    assert job is not None and job.state is JobState.DONE
    assert fake_gpu == []  # nothing compiled, nothing tuned
    assert "autotuning" not in job.stages


def test_cpu_worker_stores_untuned(store: Store, fake_gpu: list[str],
                                   make_unary: Callable[..., CompileRequest]) -> None:
    job = process_claim(store, queue(store, cuda_request(make_unary)), policy=JobPolicy())
    assert job is not None and job.state is JobState.DONE and "autotuning" not in job.stages
    art = store.get_artifact(job.key)
    assert art is not None and not art.manifest.tuned
    assert all(k.tuning is None for k in art.manifest.kernels) and fake_gpu == []


def test_gpu_worker_stores_an_interactive_compile_untuned_and_queues_its_tuning(
        store: Store, fake_gpu: list[str], make_unary: Callable[..., CompileRequest]) -> None:
    # A first call waits for this job: it gets the heuristic configs, the tuning comes after.
    job = process_claim(store, queue(store, cuda_request(make_unary, "interactive")), policy=GPU)
    assert job is not None and job.state is JobState.DONE and "autotuning" not in job.stages
    art = store.get_artifact(job.key)
    assert art is not None and not art.manifest.tuned and fake_gpu == []
    [tune] = store.claim("gpu", block_ms=10, tune_arch=90)
    tune_job = store.get_job(tune.job_id)
    assert tune_job is not None and tune_job.kind == "tune" and tune_job.key == job.key


def test_max_autotune_is_tuned_before_storing_even_when_interactive(
        store: Store, fake_gpu: list[str], make_unary: Callable[..., CompileRequest]) -> None:
    req = cuda_request(make_unary, "interactive")
    req = req.model_copy(update={"options": req.options.model_copy(update={"mode": "max-autotune"})})
    job = process_claim(store, queue(store, req), policy=GPU)
    assert job is not None and "autotuning" in job.stages
    art = store.get_artifact(job.key)
    assert art is not None and art.manifest.tuned

"""Tune jobs on both stores: a CPU worker's untuned sm_90 artifact queues exactly one tune job, which
no CPU worker (nor a GPU of another arch) claims; a GPU worker of sm_90 tunes the stored artifact,
rebuilds the cubins of the kernels whose config changed and stores it over the untuned one; crashes
are retried, then dead-lettered. Everything here is real (stores, Redis, cubin cross-compiles) but
the GPU: `tuning_device` says yes and the tuner is faked (tests/gpu/test_tune_queue_gpu.py runs the
real one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from fxcc.compiler_core import pipeline
from fxcc.compiler_core.artifact import Artifact, TuningRecord
from fxcc.compiler_core.build import arch_key
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.signing import Signer, TrustedKeys, generate
from fxcc.compiler_core.wire import CompileRequest, Target
from fxcc.service.settings import ServiceSettings
from fxcc.service.store import Claim, JobRecord, JobStage, JobState, Store
from fxcc.worker import tune
from fxcc.worker.process import JobPolicy, process_claim

CPU = JobPolicy()
GPU = JobPolicy(tune_device="cuda:0", tune_arch=90)


def cuda_request(make_unary: Callable[..., CompileRequest], arch: int = 90, **kw: object) -> CompileRequest:
    req = make_unary(**kw)
    return req.model_copy(update={"options": req.options.model_copy(update={"target": Target(kind="cuda", arch=arch)})})


def compile_on(store: Store, req: CompileRequest, policy: JobPolicy = CPU) -> JobRecord:
    """Submit `req` and run its compile job with `policy` (a CPU worker by default)."""
    store.submit(compile_key(req), req.model_dump_json(), req.priority)
    [claim] = store.claim("compiler", block_ms=10)
    job = process_claim(store, claim, worker="compiler", policy=policy)
    assert job is not None and job.state is JobState.DONE, job
    return job


def tune_jobs(store: Store) -> list[JobRecord]:
    return [j for j in store.list_jobs(None, 100) if j.kind == "tune"]


class FakeTuner:
    """Stands in for compiler_core.autotune on a GPU: checks what it is given, then returns the
    artifact with every kernel's XBLOCK halved (so its cubin must be rebuilt) and a TuningRecord."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.fail = fail

    def __call__(self, artifact: Artifact, request: CompileRequest, device: str | None, scheduled: Any = None) -> Artifact:
        artifact.verify()  # the stored blobs, checked against their digests
        assert not artifact.manifest.tuned and artifact.manifest.key == compile_key(request)
        self.calls.append((artifact.manifest.key, request.options.mode, str(device)))
        if self.fail:
            raise RuntimeError("the GPU fell off the bus")
        kernels = []
        for k in artifact.manifest.kernels:
            old = k.constexprs["XBLOCK"]
            new = max(old // 2, 1)
            rec = TuningRecord(device="Fake GPU", heuristic=f"x{old}", winner=f"x{new}",
                               timings_ms={f"x{old}": 2.0, f"x{new}": 1.0}, sizes=[32])
            kernels.append(k.model_copy(update={"constexprs": {**k.constexprs, "XBLOCK": new}, "tuning": rec,
                                                "binaries": {}, "metadata": {}}))
        manifest = artifact.manifest.model_copy(update={"kernels": kernels, "tuned": True})
        return Artifact(manifest, artifact.blobs)


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> FakeTuner:
    tuner = FakeTuner()
    monkeypatch.setattr(tune, "tuning_device", lambda arch, device: device if arch == 90 else None)
    monkeypatch.setattr(pipeline, "autotune_for_target", tuner)  # what the pipeline's tune stage calls
    return tuner


# ---------------------------------------------------------------- queueing


def test_cpu_worker_queues_exactly_one_tune_job(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    req = cuda_request(make_unary)
    compiled = compile_on(store, req)
    stored = store.get_artifact(compiled.key)
    assert stored is not None and not stored.manifest.tuned
    assert all(arch_key(90) in k.binaries for k in stored.manifest.kernels)  # cross-compiled on CPU
    [job] = tune_jobs(store)
    assert (job.key, job.arch, job.state, job.attempt) == (compiled.key, 90, JobState.QUEUED, 0)
    assert store.queue_depths()["tune"] == {"waiting": 1, "running": 0}
    assert store.tune_depths() == {"sm_90": {"waiting": 1, "running": 0}}
    assert CompileRequest.model_validate_json(store.get_request(job.id) or "") == req

    # Duplicates collapse: the same key again (another worker's retry, a second submit) joins it.
    again = store.submit_tune(compiled.key, 90, req.model_dump_json())
    assert (again.job_id, again.created) == (job.id, False)
    assert [j.id for j in tune_jobs(store)] == [job.id]
    assert store.tune_depths() == {"sm_90": {"waiting": 1, "running": 0}}


def test_an_existing_untuned_artifact_queues_its_tuning_once(store: Store,
                                                              make_unary: Callable[..., CompileRequest]) -> None:
    """A compile job that finds the untuned artifact stored (its first attempt died after the put)
    queues the tuning that attempt may never have queued, and only once."""
    req = cuda_request(make_unary)
    store.submit(compile_key(req), req.model_dump_json(), req.priority)
    [claim] = store.claim("w", block_ms=10)
    store.put_artifact(compile_request(req))
    process_claim(store, claim, policy=CPU)
    assert len(tune_jobs(store)) == 1
    compile_on(store, cuda_request(make_unary, sizes=(8, 8)))
    assert sorted(j.key for j in tune_jobs(store)) == sorted([compile_key(req), compile_key(cuda_request(
        make_unary, sizes=(8, 8)))])


def test_nothing_to_tune_queues_nothing(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    compile_on(store, make_unary())  # the interpreter: no GPU to tune for
    art = compile_request(cuda_request(make_unary, sizes=(2, 2)))
    tuned = Artifact(art.manifest.model_copy(update={"tuned": True}), art.blobs)
    assert tune.queue_tuning(store, tuned.manifest, cuda_request(make_unary, sizes=(2, 2))) is None
    assert tune_jobs(store) == [] and store.tune_depths() == {}
    assert store.queue_depths()["tune"] == {"waiting": 0, "running": 0}


def test_cpu_workers_and_other_gpus_never_claim_a_tune_job(store: Store,
                                                           make_unary: Callable[..., CompileRequest]) -> None:
    compile_on(store, cuda_request(make_unary))
    assert store.claim("cpu", block_ms=10) == []
    assert store.claim("an-sm80", block_ms=10, tune_arch=80) == []
    [claim] = store.claim("an-sm90", block_ms=10, tune_arch=90)
    assert claim.job_id == tune_jobs(store)[0].id


def test_compile_jobs_come_before_tune_jobs(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    compile_on(store, cuda_request(make_unary))
    other = make_unary(sizes=(3, 3))
    store.submit(compile_key(other), other.model_dump_json(), "precompile")
    first = store.claim("gpu", block_ms=10, tune_arch=90)
    second = store.claim("gpu", block_ms=10, tune_arch=90)
    assert [store.get_job(c.job_id).kind for c in first + second] == ["compile", "tune"]  # type: ignore[union-attr]


# ---------------------------------------------------------------- tuning


def run_tune_job(store: Store, policy: JobPolicy = GPU, consumer: str = "gpu") -> JobRecord:
    [claim] = store.claim(consumer, block_ms=10, tune_arch=90)
    job = process_claim(store, claim, worker=consumer, policy=policy)
    assert job is not None and job.kind == "tune"
    return job


def test_gpu_worker_tunes_the_stored_artifact_and_it_supersedes_the_untuned_one(
        store: Store, fake_gpu: FakeTuner, make_unary: Callable[..., CompileRequest]) -> None:
    req = cuda_request(make_unary)
    req = req.model_copy(update={"options": req.options.model_copy(update={"mode": "max-autotune"})})
    key = compile_on(store, req).key
    untuned = store.get_artifact(key)
    assert untuned is not None
    job = run_tune_job(store)
    assert job.state is JobState.DONE, job.error
    assert list(job.stages) == ["queued", "autotuning", "building", "storing", "done"]
    assert job.worker == "gpu" and job.stats is not None
    assert fake_gpu.calls == [(key, "max-autotune", "cuda:0")]  # the mode the request recorded

    tuned = store.get_artifact(key)
    assert tuned is not None and tuned.manifest.tuned
    for old, new in zip(untuned.manifest.kernels, tuned.manifest.kernels):
        assert new.tuning is not None and new.constexprs["XBLOCK"] == old.constexprs["XBLOCK"] // 2
        # The cubin is rebuilt for the winning config (the build step really ran, for sm_90).
        assert new.binaries[arch_key(90)] != old.binaries[arch_key(90)]
        assert new.metadata[f"{arch_key(90)}.num_warps"] == new.num_warps
    assert store.tune_depths() == {"sm_90": {"waiting": 0, "running": 0}}

    # An untuned put after it (a slow CPU worker) never replaces it, and queues nothing new.
    store.put_artifact(untuned)
    assert store.get_manifest(key).tuned  # type: ignore[union-attr]
    assert store.claim("gpu", block_ms=10, tune_arch=90) == []


def test_a_tune_job_for_an_artifact_tuned_meanwhile_does_nothing(
        store: Store, fake_gpu: FakeTuner, make_unary: Callable[..., CompileRequest]) -> None:
    req = cuda_request(make_unary)
    key = compile_on(store, req).key
    art = store.get_artifact(key)
    assert art is not None
    store.put_artifact(Artifact(art.manifest.model_copy(update={"tuned": True}), art.blobs))
    job = run_tune_job(store)
    assert job.state is JobState.DONE and fake_gpu.calls == []


def test_a_tune_job_whose_artifact_is_gone_fails_without_retrying(
        store: Store, fake_gpu: FakeTuner, make_unary: Callable[..., CompileRequest]) -> None:
    key = compile_on(store, cuda_request(make_unary)).key
    assert store.delete_artifact(key)
    job = run_tune_job(store)
    assert job.state is JobState.FAILED and job.error is not None and job.error.error == "NothingToTune"
    assert fake_gpu.calls == [] and store.dead_letters(10) == []
    assert store.claim("gpu", block_ms=10, tune_arch=90) == []


def test_signed_artifacts_are_verified_before_tuning_and_re_signed(
        store: Store, fake_gpu: FakeTuner, make_unary: Callable[..., CompileRequest]) -> None:
    import json

    cpu_key, gpu_key = Signer(generate()[0]), Signer(generate()[0])
    trusted = TrustedKeys([cpu_key.public, gpu_key.public])  # both workers' keys: a rotation in progress
    key = compile_on(store, cuda_request(make_unary), replace(CPU, signer=cpu_key, trusted=trusted)).key
    gpu = replace(GPU, signer=gpu_key, trusted=trusted)
    job = run_tune_job(store, gpu)
    assert job.state is JobState.DONE
    found = store.fetch_artifact(key)
    assert found is not None and found.manifest.tuned
    assert found.signature.startswith(f"ed25519:{gpu_key.public.id}:")  # re-signed by the tuner
    assert TrustedKeys([gpu_key.public]).verify(json.loads(found.manifest_json), found.signature)

    # A forged (unsigned, or signed by an untrusted key) untuned artifact is not tuned: a tuned copy
    # would carry a valid signature, and tuning runs its kernels.
    for forger in (None, Signer(generate()[0])):
        other = cuda_request(make_unary, sizes=(8, 8) if forger is None else (4, 4))
        compile_on(store, other, replace(CPU, signer=forger))
        job = run_tune_job(store, gpu)
        assert job.state is JobState.FAILED and job.error is not None and job.error.error == "NothingToTune"
        assert not store.get_manifest(compile_key(other)).tuned  # type: ignore[union-attr]


def test_a_crashing_tune_job_is_retried_then_dead_lettered(
        store: Store, make_unary: Callable[..., CompileRequest], monkeypatch: pytest.MonkeyPatch) -> None:
    tuner = FakeTuner(fail=True)
    monkeypatch.setattr(tune, "tuning_device", lambda arch, device: device)
    monkeypatch.setattr(pipeline, "autotune_for_target", tuner)  # what the pipeline's tune stage calls
    key = compile_on(store, cuda_request(make_unary)).key
    policy = replace(GPU, max_attempts=2)
    first = run_tune_job(store, policy)
    assert first.state is JobState.QUEUED and first.attempt == 1 and first.error is not None
    assert store.tune_depths() == {"sm_90": {"waiting": 1, "running": 0}}  # back on its tune queue
    assert store.claim("cpu", block_ms=10) == []  # still never a CPU worker's
    second = run_tune_job(store, policy)
    assert second.state is JobState.FAILED and second.attempt == 2
    [dead] = store.dead_letters(10)
    assert (dead["job_id"], dead["key"], dead["kind"]) == (second.id, key, "tune")
    assert len(tuner.calls) == 2 and not store.get_manifest(key).tuned  # type: ignore[union-attr]
    # The key may be queued for tuning again later: the single-flight entry went with the job.
    again = store.submit_tune(key, 90, cuda_request(make_unary).model_dump_json())
    assert again.created and again.job_id != second.id


def test_a_queued_tune_job_can_be_cancelled(store: Store, make_unary: Callable[..., CompileRequest]) -> None:
    key = compile_on(store, cuda_request(make_unary)).key
    [job] = tune_jobs(store)
    assert store.cancel(job.id) == "cancelled"
    assert store.tune_depths() == {"sm_90": {"waiting": 0, "running": 0}}
    assert store.claim("gpu", block_ms=10, tune_arch=90) == []
    assert store.submit_tune(key, 90, "{}").created


def test_a_dead_gpu_workers_tune_job_is_taken_over_by_another_gpu(
        redis_settings: ServiceSettings, fake_gpu: FakeTuner, make_unary: Callable[..., CompileRequest]) -> None:
    from fxcc.service.redis_store import RedisStore

    store = RedisStore(redis_settings.model_copy(update={"claim_idle_ms": 100}))
    try:
        key = compile_on(store, cuda_request(make_unary)).key
        [dead] = store.claim("dead-gpu", block_ms=10, tune_arch=90)  # claimed, never acknowledged
        assert store.mark_started(dead.job_id, "dead-gpu", stage=JobStage.AUTOTUNING) is not None
        assert store.claim("cpu", block_ms=300) == []  # a CPU worker never takes it over
        claims: list[Claim] = []
        for _ in range(100):  # until the entry has been idle for claim_idle_ms
            claims = store.claim("live-gpu", block_ms=20, tune_arch=90)
            if claims:
                break
        [claim] = claims
        assert claim.reclaimed and claim.job_id == dead.job_id
        job = process_claim(store, claim, worker="live-gpu", policy=GPU)
        assert job is not None and job.state is JobState.DONE and job.attempt == 2 and job.worker == "live-gpu"
        assert store.get_manifest(key).tuned  # type: ignore[union-attr]
        assert store.tune_depths() == {"sm_90": {"waiting": 0, "running": 0}}
    finally:
        store.close()


# ---------------------------------------------------------------- the embedded tune queue across restarts


def embedded(settings: ServiceSettings) -> Store:
    """An EmbeddedStore on the test's data dir: a new one is what a restarted `fxcc serve` opens."""
    from fxcc.service.embedded_store import EmbeddedStore

    return EmbeddedStore(settings.data_dir)


def test_a_restarted_embedded_store_queues_the_tune_jobs_left_in_flight(
        embedded_settings: ServiceSettings, fake_gpu: FakeTuner, make_unary: Callable[..., CompileRequest]) -> None:
    first = embedded(embedded_settings)
    a = compile_on(first, cuda_request(make_unary)).key
    b = compile_on(first, cuda_request(make_unary, sizes=(8, 8))).key
    [claim] = first.claim("gpu", block_ms=10, tune_arch=90)
    assert first.mark_started(claim.job_id, "gpu", stage=JobStage.AUTOTUNING) is not None  # then the process dies
    before = {j.key: j for j in tune_jobs(first)}
    assert before[a].id == claim.job_id

    second = embedded(embedded_settings)
    assert second.tune_depths() == {"sm_90": {"waiting": 2, "running": 0}}
    jobs = {j.key: j for j in tune_jobs(second)}
    assert {k: (j.id, j.arch, j.state, j.worker, j.attempt) for k, j in jobs.items()} == {
        a: (before[a].id, 90, JobState.QUEUED, None, 1),  # its attempt counts: it died with its process
        b: (before[b].id, 90, JobState.QUEUED, None, 0)}
    for key in (a, b):
        assert second.get_request(jobs[key].id) == first.get_request(before[key].id)
    assert second.claim("cpu", block_ms=10) == []  # still only for a GPU of sm_90
    again = second.submit_tune(a, 90, cuda_request(make_unary).model_dump_json())
    assert (again.job_id, again.created) == (jobs[a].id, False)  # one tune job per key, as before

    done = [run_tune_job(second), run_tune_job(second)]
    assert [(j.key, j.state, j.attempt) for j in done] == [(a, JobState.DONE, 2), (b, JobState.DONE, 1)]
    assert sorted(call[0] for call in fake_gpu.calls) == sorted([a, b])  # each tuned once
    assert second.claim("gpu", block_ms=10, tune_arch=90) == []
    third = embedded(embedded_settings)  # finished tune jobs are not queued again
    assert tune_jobs(third) == [] and third.tune_depths() == {}


def test_a_tune_job_that_keeps_dying_with_its_process_is_dead_lettered(
        embedded_settings: ServiceSettings, fake_gpu: FakeTuner, make_unary: Callable[..., CompileRequest]) -> None:
    """A tune that kills the service (a driver crash) must not kill every restart after it."""
    store = embedded(embedded_settings)
    key = compile_on(store, cuda_request(make_unary)).key
    for _ in range(2):
        [claim] = store.claim("gpu", block_ms=10, tune_arch=90)
        assert store.mark_started(claim.job_id, "gpu", stage=JobStage.AUTOTUNING) is not None
        store = embedded(embedded_settings)  # the process died mid-tune
    job = run_tune_job(store, replace(GPU, max_attempts=2))
    assert (job.key, job.state, job.error.error if job.error else None) == (key, JobState.FAILED, "TooManyAttempts")
    assert [d["job_id"] for d in store.dead_letters(10)] == [job.id] and fake_gpu.calls == []
    assert tune_jobs(embedded(embedded_settings)) == []


def test_a_restart_skips_what_is_no_tune_job_in_flight(
        embedded_settings: ServiceSettings, make_unary: Callable[..., CompileRequest],
        caplog: pytest.LogCaptureFixture) -> None:
    first = embedded(embedded_settings)
    kept, tuned, gone = (compile_on(first, cuda_request(make_unary, sizes=s)).key for s in ((4, 8), (8, 8), (2, 8)))
    art = first.get_artifact(tuned)
    assert art is not None
    first.put_artifact(Artifact(art.manifest.model_copy(update={"tuned": True}), art.blobs))  # by a compile
    assert first.delete_artifact(gone)
    queue = embedded_settings.data_dir / "tune"
    bad = {"garbage.json": b"{not json", f"{'f' * 64}.json": b'{"job": 1, "request": ""}',
           f"{'e' * 64}.json": (queue / f"{kept}.json").read_bytes(),  # another key's job
           f"{'d' * 64}.json": b"\xff\xfe\x00"}
    for name, data in bad.items():
        (queue / name).write_bytes(data)
    (queue / "a-directory.json").mkdir()

    with caplog.at_level("INFO", logger="fxcc.service.embedded"):
        second = embedded(embedded_settings)
    assert [j.key for j in tune_jobs(second)] == [kept]
    assert second.tune_depths() == {"sm_90": {"waiting": 1, "running": 0}}
    for name in [*bad, "a-directory.json"]:
        assert any(name in r.getMessage() and r.levelname == "WARNING" for r in caplog.records), name
    assert all((queue / name).exists() for name in bad)  # left for whoever looks into it
    # The jobs of artifacts tuned or deleted meanwhile are dropped, with their files.
    assert not (queue / f"{tuned}.json").exists() and not (queue / f"{gone}.json").exists()

"""One job, start to finish: a compile (lowering → autotuning on a GPU → building → storing) or a tune
job (worker/tune.py), then done, or retry / fail."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING

from pydantic import ValidationError

from fxcc.compiler_core.autotune import device_arch, tuning_device
from fxcc.compiler_core.build_tasks import BuildTask
from fxcc.compiler_core.errors import InvalidGraph
from fxcc.compiler_core.signing import Signer, SigningKeyError, TrustedKeys, load_or_create, read_public_keys
from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.settings import ServiceSettings
from fxcc.service.store import Claim, JobError, JobRecord, JobStage, Store
from fxcc.worker.builds import build_by_tasks
from fxcc.worker.limits import JobCancelled, JobLimits, is_final, job_error
from fxcc.worker.steps import CompileWork, compile_steps
from fxcc.worker.tune import queue_tuning, tune_and_store

if TYPE_CHECKING:
    from fxcc.worker.child import CompileProcess

log = logging.getLogger("fxcc.worker")


@dataclass(frozen=True)
class JobPolicy:
    """How a worker runs jobs: the retry limit, manifest signing, the limits of a compile, the GPU
    it tunes on and the test-only hooks."""

    max_attempts: int = 3
    signer: Signer | None = None  # None: manifests are stored unsigned (clients refuse them by default)
    trusted: TrustedKeys = field(default_factory=TrustedKeys)  # whose artifacts a tune job may re-sign
    limits: JobLimits = field(default_factory=JobLimits)
    compile_delay_s: float = 0.0  # test hook (FXCC_TEST_ONLY_COMPILE_DELAY_S); 0 in production
    compile_alloc_mb: int = 0  # test hook (FXCC_TEST_ONLY_COMPILE_ALLOC_MB); 0 in production
    fake_tune: bool = False  # test hook (FXCC_TEST_ONLY_FAKE_TUNE): tune jobs record a made-up tuning
    tune_device: str | None = None  # "cuda:0": autotune CUDA targets of this GPU's arch there
    tune_arch: int | None = None  # that GPU's SM arch: the worker also takes its tune queue's jobs
    # Kernels are built by build tasks (worker/builds.py) that the worker's (and every other worker's)
    # build consumers take; False: a compile builds its own kernels in its compile process.
    build_tasks: bool = False
    build_limits: JobLimits = field(default_factory=lambda: JobLimits(timeout_s=300.0, memory_mb=4096))
    build_delay_s: float = 0.0  # test hook (FXCC_TEST_ONLY_BUILD_DELAY_S); 0 in production

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> JobPolicy:
        signer = signer_for(settings)
        trusted = [signer.public] if signer else []
        for entry in (e for e in settings.trusted_keys.split(",") if e.strip()):
            trusted += read_public_keys(entry)
        limits = JobLimits(timeout_s=settings.job_timeout_s, memory_mb=settings.job_memory_mb,
                           warm_start=settings.compile_process_warm)
        build_limits = JobLimits(timeout_s=settings.build_timeout_s, memory_mb=settings.build_memory_mb,
                                 warm_start=settings.compile_process_warm)
        return cls(max_attempts=settings.job_max_attempts, signer=signer, trusted=TrustedKeys(trusted),
                   limits=limits, compile_delay_s=settings.test_only_compile_delay_s,
                   compile_alloc_mb=settings.test_only_compile_alloc_mb, fake_tune=settings.test_only_fake_tune,
                   build_tasks=settings.build_tasks, build_limits=build_limits,
                   build_delay_s=settings.test_only_build_delay_s)


def signer_for(settings: ServiceSettings) -> Signer | None:
    """The workers' signing key: FXCC_SIGNING_KEY, else FXCC_SIGNING_KEY_FILE, else (embedded mode
    only) the service's own pair under data_dir/keys, made on first use. None: a Redis worker
    without a key, whose manifests go unsigned."""
    if settings.signing_key is not None:
        return Signer(settings.signing_key.get_secret_value())
    if settings.signing_key_file is not None:
        try:
            return Signer(settings.signing_key_file.expanduser().read_text())
        except OSError as e:
            raise SigningKeyError(f"FXCC_SIGNING_KEY_FILE {settings.signing_key_file}: {e.strerror or e}") from None
    if settings.redis_url is None:
        keys = settings.data_dir / "keys"
        return load_or_create(keys / "signing.key", keys / "signing.pub")
    return None


DEFAULT_POLICY = JobPolicy()


def on_device(policy: JobPolicy, device: str) -> JobPolicy:
    """`policy` for a worker on `device`: a CUDA GPU tunes the compiles of its arch and takes the
    tune jobs of its arch; anything else (a CPU) stores heuristic configs and tunes nothing."""
    arch = device_arch(device)
    if arch is None:
        return replace(policy, tune_device=None, tune_arch=None)
    return replace(policy, tune_device=device, tune_arch=arch)


def process_claim(store: Store, claim: Claim, *, worker: str = "embedded",
                  policy: JobPolicy = DEFAULT_POLICY, child: CompileProcess | None = None) -> JobRecord | None:
    """Run the claimed job, record its outcome and acknowledge the claim. Never raises for a
    failed compile; a store error propagates (the claim stays pending and is reclaimed later).

    A compile runs in `child` (worker/child.py: under policy.limits, killed when its job is
    cancelled); without one, in this thread, unbounded (tests, library callers). A crashed attempt
    goes back to the queue until job_max_attempts, then fails and is copied to the dead-letter
    stream; a compile over a limit fails at once; a cancelled one leaves the record as it is.
    Returns the job record as it stands afterwards (None if unknown).
    """
    job = store.get_job(claim.job_id)
    if job is None:
        log.warning("job %s is unknown (expired?); dropping it", claim.job_id)
        store.ack(claim)
        return None
    if job.finished:  # delivered twice (a promoted job, or a reclaim that raced a slow worker)
        store.ack(claim)
        return job
    if job.attempt >= policy.max_attempts:
        # Note: attempt counts starts; reaching the limit here means earlier workers died mid-compile.
        store.mark_failed(job.id, JobError(error="TooManyAttempts", message=(
            f"job was started {job.attempt} times without finishing; its workers died")), dead_letter=True)
        store.ack(claim)
        return store.get_job(job.id)
    first = JobStage.AUTOTUNING if job.kind == "tune" else JobStage.LOWERING
    started = store.mark_started(job.id, worker, takeover=claim.reclaimed, stage=first)
    if started is None:  # another worker holds it, or it was cancelled
        store.ack(claim)
        return store.get_job(job.id)
    log.info("job %s: %s key %s (attempt %d)", job.id, "tuning" if job.kind == "tune" else "compiling",
             job.key[:12], started.attempt)
    try:
        if started.kind == "tune":
            tune_and_store(store, started, load_request(store, started), policy, child)
        else:
            compile_and_store(store, started, policy, child)
    except JobCancelled:
        log.info("job %s: cancelled while it compiled; its compile process was stopped, nothing stored", job.id)
        store.ack(claim)
        return store.get_job(job.id)
    except Exception as e:  # any crash of the compiler is the job's outcome
        error = job_error(e)
        if is_final(e):
            log.info("job %s failed: %s", job.id, e)
            store.mark_failed(job.id, error)
        elif started.attempt >= policy.max_attempts:
            log.warning("job %s failed on attempt %d: %s", job.id, started.attempt, e, exc_info=True)
            store.mark_failed(job.id, error, dead_letter=True)
        else:
            log.warning("job %s failed on attempt %d, retrying: %s", job.id, started.attempt, e)
            store.retry(claim, error)  # acknowledges the claim
            return store.get_job(job.id)
    store.ack(claim)
    return store.get_job(job.id)


def compile_and_store(store: Store, job: JobRecord, policy: JobPolicy, child: CompileProcess | None = None) -> None:
    """Compile the job's request (unless its artifact already exists, tuned or not tunable
    here), in `child` when given; store it, queue a tune job if it is untuned and a GPU could
    tune it, mark it done."""
    existing = store.fetch_artifact(job.key, blobs=False, count=False)  # whole, blobs and all
    if existing is not None and existing.manifest.tuned:
        store.mark_done(job.id, existing.manifest.stats.model_dump())
        return
    request = load_request(store, job)
    tune_now = _tunes(policy, request) and tunes_before_storing(job, request)
    if existing is not None and not tune_now:
        # Again, in case the attempt that stored it died before queueing its tuning (one tune job
        # per key at a time: a second submit joins the first).
        queue_tuning(store, existing.manifest, request)
        store.mark_done(job.id, existing.manifest.stats.model_dump())
        return  # else a GPU worker replaces an untuned artifact by a tuned one
    work = CompileWork(request.model_dump_json(), tune_device=policy.tune_device if tune_now else None,
                       delay_s=policy.compile_delay_s, alloc_mb=policy.compile_alloc_mb)
    on_stage = partial(store.mark_stage, job.id)
    tasks: list[BuildTask] | None = None
    if child is not None:
        if policy.build_tasks:
            artifact, tasks = child.lower(work, job_id=job.id, store=store, on_stage=on_stage)
        else:
            artifact = child.compile(work, job_id=job.id, store=store, on_stage=on_stage)
        if _cancelled(store, job.id):
            raise JobCancelled(job.id)  # between the compile's last poll and its end
    else:
        artifact = compile_steps(work, on_stage)
    if tasks is not None and artifact.manifest.target.kind == "cuda" and artifact.manifest.kernels:
        store.mark_stage(job.id, JobStage.BUILDING)
        artifact = build_by_tasks(store, job, artifact, tasks, timeout_s=policy.limits.timeout_s,
                                  cancelled=lambda: _cancelled(store, job.id))
    if artifact.manifest.key != job.key:
        raise RuntimeError(f"compiler produced key {artifact.manifest.key[:12]} for job key {job.key[:12]}: "
                           "service and worker run different compiler_core, torch or triton versions")
    store.mark_stage(job.id, JobStage.STORING)
    signature = policy.signer.sign(artifact.manifest) if policy.signer else None
    store.put_artifact(artifact, signature)  # blobs, then manifest
    if not tune_now:  # a worker that tuned has tried (tuning failures are logged)
        queue_tuning(store, artifact.manifest, request)
    stats = artifact.manifest.stats.model_dump()
    store.mark_done(job.id, stats)
    log.info("job %s: done, %d kernels, %d extern ops, %.3f s", job.id, stats["kernels"],
             stats["nodes_extern"], stats["compile_s"])


def _cancelled(store: Store, job_id: str) -> bool:
    return (now := store.get_job(job_id)) is not None and now.stage is JobStage.CANCELLED


def tunes_before_storing(job: JobRecord, request: CompileRequest) -> bool:
    """Whether a GPU worker tunes a compile before storing it, rather than through its tune queue.

    Note: an interactive compile in the default mode is a first call waiting: it gets the
    heuristic configs as soon as they are built, and the tuned artifact supersedes them a few
    seconds later (the same GPU takes the tune job next; clients refresh their copy). Precompile
    jobs (nobody waits) and max-autotune (the user asked to pay for tuning) tune first.
    """
    return job.priority == "precompile" or request.options.mode == "max-autotune"


def _tunes(policy: JobPolicy, request: CompileRequest) -> bool:
    """Whether this worker can tune the request: a CUDA target of its GPU's arch."""
    target = request.options.target
    return (policy.tune_device is not None and target.kind == "cuda"
            and tuning_device(target.arch, policy.tune_device) is not None)


def load_request(store: Store, job: JobRecord) -> CompileRequest:
    """The job's request, re-validated: the worker trusts nothing it did not check itself."""
    data = store.get_request(job.id)
    if data is None:
        raise InvalidGraph(f"job {job.id} has no request")
    try:
        return CompileRequest.model_validate_json(data)
    except ValidationError as e:
        raise InvalidGraph(f"job {job.id} holds an invalid request: {e.errors()[0]['msg']}") from None

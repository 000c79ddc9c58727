"""Tune jobs: an untuned CUDA artifact in the store, tuned later on a GPU of its arch and stored over it.

A CPU worker (or a GPU of another arch) stores the heuristic configs, marked untuned, and queues
a tune job on the tune stream of the target's arch (`queue_tuning`); only workers with a GPU of
that arch read that stream. The tune job loads the stored artifact (blobs verified against their
digests, the signature too where manifests are signed), tunes its kernels with the compile path's
own step (compiler_core.autotune, in the request's mode), rebuilds the cubins of the kernels
whose config changed, and stores the result, which supersedes the untuned artifact. The tuning and
the rebuild run in the consumer's compile process, under the job limits of a compile (a tune job
runs its artifact's kernels: a hostile or broken one can hang or crash only that process).
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import TYPE_CHECKING

from fxcc.compiler_core.artifact import Artifact, ArtifactManifest
from fxcc.compiler_core.autotune import tuning_device
from fxcc.compiler_core.errors import FxccError, InvalidGraph
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.store import JobRecord, JobStage, QueueFull, Store
from fxcc.worker.limits import JobCancelled
from fxcc.worker.steps import tune_steps

if TYPE_CHECKING:
    from fxcc.worker.child import CompileProcess
    from fxcc.worker.process import JobPolicy

log = logging.getLogger("fxcc.worker")


class NothingToTune(FxccError):
    """The tune job's artifact is gone (deleted, evicted) or refused (a bad signature): a retry
    cannot help, so the job fails at once."""

    kind = "conflict"


class NoGpuForTuning(FxccError):
    """This worker has no GPU of the job's arch (a retry puts it back for another worker)."""


def tunable(manifest: ArtifactManifest) -> bool:
    """Whether a GPU could tune this artifact: an untuned CUDA artifact with kernels and fixed sizes
    (a plan with size symbols keeps its heuristic configs, see autotune_for_target)."""
    return (not manifest.tuned and manifest.target.kind == "cuda" and bool(manifest.kernels)
            and not manifest.plan.symbols)


def queue_tuning(store: Store, manifest: ArtifactManifest, request: CompileRequest) -> str | None:
    """Queue a tune job for the stored artifact `manifest` if a GPU could tune it; the job's id
    (an existing one when a tune job for the key is already in flight), or None."""
    if not tunable(manifest):
        return None
    try:
        submitted = store.submit_tune(manifest.key, manifest.target.arch, request.model_dump_json())
    except QueueFull as e:  # the artifact is correct untuned; tuning is an optimisation
        log.warning("key %s stays untuned: %s", manifest.key[:12], e)
        return None
    if submitted.created:
        log.info("key %s: tune job %s queued for sm_%d", manifest.key[:12], submitted.job_id,
                 manifest.target.arch)
    return submitted.job_id


def tune_and_store(store: Store, job: JobRecord, request: CompileRequest, policy: JobPolicy,
                   child: CompileProcess | None = None) -> None:
    """Tune the stored untuned artifact of the job's key on this worker's GPU, rebuild the cubins
    of the kernels whose config changed (in `child`, the consumer's compile process, when given;
    else in this thread, unbounded), store the tuned artifact, mark the job done."""
    target = request.options.target
    if compile_key(request) != job.key or target.kind != "cuda" or target.arch != job.arch:
        raise InvalidGraph(f"tune job {job.id} holds a request for another key or target than "
                           f"{job.key[:12]} on sm_{job.arch}")
    device = tuning_device(target.arch, policy.tune_device) if policy.tune_device else None
    if device is None:
        raise NoGpuForTuning(f"worker has no GPU of sm_{target.arch} (device {policy.tune_device})")
    found = store.fetch_artifact(job.key, count=False)  # blobs verified against their digests
    if found is None or found.blobs is None:
        raise NothingToTune(f"no artifact is stored under key {job.key[:12]} (deleted or evicted)")
    if found.manifest.tuned:  # tuned meanwhile (a GPU worker compiled it, or a duplicate tune job)
        store.mark_done(job.id, found.manifest.stats.model_dump())
        return
    why = policy.trusted.check(json.loads(found.manifest_json), found.signature) if policy.signer else None
    if why is not None:
        # Note: a tuned artifact gets this worker's signature, so tuning a forged one would launder it
        # (and tuning runs its kernels here).
        raise NothingToTune(f"the stored artifact {job.key[:12]} is not tuned: {why}")
    stored = Artifact(found.manifest, found.blobs)
    on_stage = partial(store.mark_stage, job.id)
    if child is not None:  # under the job's limits, stopped when the job is cancelled
        tuned = child.tune(request.model_dump_json(), stored, device, job_id=job.id, store=store, on_stage=on_stage,
                           fake=policy.fake_tune, delay_s=policy.compile_delay_s)
        if (now := store.get_job(job.id)) is not None and now.stage is JobStage.CANCELLED:
            raise JobCancelled(job.id)  # between the tune's last poll and its end
    else:
        tuned = tune_steps(request.model_dump_json(), stored, device, on_stage, fake=policy.fake_tune,
                           delay_s=policy.compile_delay_s)
    store.mark_stage(job.id, JobStage.STORING)
    signature = policy.signer.sign(tuned.manifest) if policy.signer else None
    store.put_artifact(tuned, signature)  # supersedes the untuned one
    stats = tuned.manifest.stats.model_dump()
    store.mark_done(job.id, stats)
    log.info("tune job %s: key %s tuned on %s in %.3f s", job.id, job.key[:12], device, stats["tune_s"])

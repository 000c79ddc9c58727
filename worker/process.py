"""One compile job, start to finish: claim state → compile → store artifact → done | failed."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from compiler_core.compile import compile_request
from compiler_core.errors import FxccError
from compiler_core.wire import CompileRequest
from service.store import JobError, JobRecord, Store

log = logging.getLogger("fxcc.worker")


def process_job(store: Store, job_id: str, *, worker: str = "embedded", max_attempts: int = 3,
                takeover: bool = False) -> JobRecord | None:
    """Run job `job_id` and record its outcome in `store`. Never raises for a failed compile.

    `takeover` says the job was reclaimed from a worker that stopped answering, so a job left
    "compiling" may be restarted. Returns the job record as it stands afterwards, or None for a
    job the store does not know (expired).
    """
    job = store.get_job(job_id)
    if job is None:
        log.warning("job %s is unknown (expired?); dropping it", job_id)
        return None
    if job.finished:
        return job  # delivered twice (a reclaim raced a slow worker): the outcome stands
    if job.attempt >= max_attempts:
        # Note: attempt counts claims; reaching the limit means earlier workers died mid-compile.
        store.mark_failed(job_id, JobError(error="TooManyAttempts", message=(
            f"job was claimed {job.attempt} times without finishing; its workers died")))
        return store.get_job(job_id)
    job = store.mark_compiling(job_id, worker, takeover=takeover)
    if job is None:
        return store.get_job(job_id)  # another worker holds it (a promoted job's second entry)
    log.info("job %s: compiling key %s (attempt %d)", job_id, job.key[:12], job.attempt)
    try:
        compile_and_store(store, job)
    except FxccError as e:
        log.info("job %s failed: %s", job_id, e)
        store.mark_failed(job_id, JobError(**e.to_dict()))
    except Exception as e:  # any crash of the compiler is the job's outcome
        log.exception("job %s crashed", job_id)
        store.mark_failed(job_id, JobError(error=type(e).__name__, message=str(e)[:2000]))
    return store.get_job(job_id)


def compile_and_store(store: Store, job: JobRecord) -> None:
    """Compile the job's request (unless its artifact already exists), store it, mark it done."""
    existing = store.get_manifest(job.key)
    if existing is not None:
        store.mark_done(job.id, existing.stats.model_dump())
        return
    request = load_request(store, job)
    artifact = compile_request(request)
    if artifact.manifest.key != job.key:
        raise RuntimeError(f"compiler produced key {artifact.manifest.key[:12]} for job key {job.key[:12]}: "
                           "service and worker run different compiler_core, torch or triton versions")
    store.put_artifact(artifact)  # blobs, then manifest
    stats = artifact.manifest.stats.model_dump()
    store.mark_done(job.id, stats)
    log.info("job %s: done, %d kernels, %d extern ops, %.3f s", job.id, stats["kernels"],
             stats["nodes_extern"], stats["compile_s"])


def load_request(store: Store, job: JobRecord) -> CompileRequest:
    """The job's request, re-validated: the worker trusts nothing it did not check itself."""
    data = store.get_request(job.id)
    if data is None:
        raise RuntimeError(f"job {job.id} has no request")
    try:
        return CompileRequest.model_validate_json(data)
    except ValidationError as e:
        raise RuntimeError(f"job {job.id} holds an invalid request: {e.errors()[0]['msg']}") from None

"""Jobs: GET one (long-poll with ?wait=), its build tasks, its stages as Server-Sent Events, cancel it, list
recent ones.

Note: a client sees and touches only the jobs it is attached to (it submitted them, or joined them
through single flight): another principal's job is a 404, as if it did not exist, and a job's
`principals` shows a client only its own name. Admins see every job and may abort a running one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from fxcc.service.auth import Principal
from fxcc.service.deps import ClientDep, SettingsDep, StoreDep
from fxcc.service.store import JobRecord, JobState, Store

router = APIRouter(prefix="/v1", tags=["jobs"])

_POLL_FIRST_S = 0.02
_POLL_MAX_S = 0.25
_KEEPALIVE_S = 15.0

JobIdPath = Annotated[str, Path(pattern=r"^[0-9A-Za-z_-]{1,64}$")]


def visible(job: JobRecord | None, principal: Principal) -> JobRecord | None:
    """The job as `principal` may see it: all of it for an admin; for a client only a job it is
    attached to, naming no other principal."""
    if job is None or principal.may("admin"):
        return job
    if principal.name not in job.principals:
        return None
    return job.model_copy(update={"principals": [principal.name]})


async def fetch(store: Store, job_id: str, principal: Principal) -> JobRecord:
    job = visible(await run_in_threadpool(store.get_job, job_id), principal)
    if job is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id}")
    return job


@router.get("/jobs", response_model=list[JobRecord])
def list_jobs(
    store: StoreDep,
    principal: ClientDep,
    state: Annotated[JobState | None, Query(description="only jobs in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[JobRecord]:
    """The most recent jobs first (for `fxcc jobs`): a client's own, or every job for an admin."""
    if principal.may("admin"):
        return store.list_jobs(state, limit)
    return [v for v in (visible(j, principal) for j in store.list_jobs(state, limit, principal.name)) if v]


@router.get("/jobs/{job_id}", response_model=JobRecord, responses={404: {}})
async def get_job(
    job_id: JobIdPath,
    store: StoreDep,
    settings: SettingsDep,
    principal: ClientDep,
    wait: Annotated[float, Query(ge=0, le=86_400, description="seconds to wait for the job to finish")] = 0,
) -> JobRecord:
    # Note: polling with an async sleep holds no threadpool thread while a client waits, so
    # many long-polls cannot starve the compile route of threads.
    deadline = time.monotonic() + min(wait, settings.job_wait_max_s)
    pause = _POLL_FIRST_S
    while True:
        job = await fetch(store, job_id, principal)
        left = deadline - time.monotonic()
        if job.finished or left <= 0:
            return job
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 1.5, _POLL_MAX_S)


@router.get("/jobs/{job_id}/tasks", response_model=list[JobRecord], responses={404: {}})
async def job_tasks(job_id: JobIdPath, store: StoreDep, principal: ClientDep) -> list[JobRecord]:
    """The build tasks of a compile job (worker/builds.py), in its kernels' order: each kernel's
    stage, the worker that ran it (a build consumer, `<worker>-b<i>`), its attempts and build time.
    A task shared with another job (the same kernel) names that job as `parent` to admins only."""
    job = await fetch(store, job_id, principal)
    tasks = [t for t in await run_in_threadpool(store.get_jobs, job.tasks) if t is not None]
    if principal.may("admin"):
        return tasks
    return [t if t.parent == job.id else t.model_copy(update={"parent": None}) for t in tasks]


@router.get("/jobs/{job_id}/events", responses={200: {"content": {"text/event-stream": {}}}, 404: {}})
async def job_events(job_id: JobIdPath, store: StoreDep, settings: SettingsDep,
                     principal: ClientDep) -> StreamingResponse:
    """An `event: stage` with the job record each time its stage changes; the stream ends when
    the job finishes (or after job_events_max_s; reconnect to go on)."""
    first = await fetch(store, job_id, principal)
    return StreamingResponse(stage_events(store, first, settings.job_events_max_s, principal),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def stage_events(store: Store, job: JobRecord, max_s: float, principal: Principal) -> AsyncIterator[str]:
    deadline = time.monotonic() + max_s
    last_beat = time.monotonic()
    seen: tuple[str, int] | None = None
    pause = _POLL_FIRST_S
    while True:
        if (job.stage.value, job.attempt) != seen:
            seen = (job.stage.value, job.attempt)
            yield f"event: stage\nid: {job.stage.value}-{job.attempt}\ndata: {job.model_dump_json()}\n\n"
            pause = _POLL_FIRST_S
        if job.finished or time.monotonic() > deadline:
            return
        if time.monotonic() - last_beat > _KEEPALIVE_S:
            last_beat = time.monotonic()
            yield ": keep-alive\n\n"
        await asyncio.sleep(pause)
        pause = min(pause * 1.5, _POLL_MAX_S)
        fresh = visible(await run_in_threadpool(store.get_job, job.id), principal)
        if fresh is None:  # expired, or the client detached from it meanwhile
            yield f"event: gone\ndata: {json.dumps({'id': job.id})}\n\n"
            return
        job = fresh


@router.delete("/jobs/{job_id}", response_model=JobRecord, responses={404: {}, 409: {}})
def cancel_job(job_id: JobIdPath, store: StoreDep, principal: ClientDep) -> JobRecord:
    """A client: cancel its queued job, or only detach from one that other principals also wait on
    (then the job goes on for them, and this client no longer sees it); 409 once a worker has
    started a job only it waits on, or the job has finished. An admin: cancel a queued job or abort
    a running one (stage cancelled, error "aborted by <admin>"; its worker stops); 409 once finished."""
    if principal.may("admin"):
        outcome = store.abort(job_id, principal.name)
    else:
        outcome = store.cancel(job_id, principal.name)
    job = store.get_job(job_id)
    if outcome == "missing" or (outcome != "detached" and visible(job, principal) is None):
        raise HTTPException(status_code=404, detail=f"no job {job_id}")
    if outcome == "conflict":
        stage = job.stage.value if job else "gone"
        raise HTTPException(status_code=409, detail=f"job {job_id} is {stage}; only a queued job can be cancelled"
                            + ("" if principal.may("admin") else " (an admin may abort a running one)"))
    assert job is not None
    if outcome == "detached":  # what the client left: the job without it
        return job.model_copy(update={"principals": []})
    return visible(job, principal) or job

"""GET /v1/jobs/{id}: a job's state, long-polled until it finishes when ?wait=S is given."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query
from starlette.concurrency import run_in_threadpool

from service.deps import SettingsDep, StoreDep
from service.store import JobRecord

router = APIRouter(prefix="/v1", tags=["jobs"])

_POLL_FIRST_S = 0.02
_POLL_MAX_S = 0.25


@router.get("/jobs/{job_id}", response_model=JobRecord)
async def get_job(
    job_id: Annotated[str, Path(pattern=r"^[0-9A-Za-z_-]{1,64}$")],
    store: StoreDep,
    settings: SettingsDep,
    wait: Annotated[float, Query(ge=0, description="seconds to wait for done/failed")] = 0,
) -> JobRecord:
    # Note: polling with an async sleep holds no threadpool thread while a client waits, so
    # many long-polls cannot starve the compile route of threads.
    deadline = time.monotonic() + min(wait, settings.job_wait_max_s)
    pause = _POLL_FIRST_S
    while True:
        job = await run_in_threadpool(store.get_job, job_id)
        if job is None:
            raise HTTPException(status_code=404, detail=f"no job {job_id}")
        left = deadline - time.monotonic()
        if job.finished or left <= 0:
            return job
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 1.5, _POLL_MAX_S)

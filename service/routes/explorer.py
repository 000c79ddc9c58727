"""The compile explorer: GET /v1/jobs/{id}/explorer — what one job's compile did, for the dashboard.

The job's stages with their times, and from the artifact it stored (when it has): the stats, each
kernel with its Triton source, launch config and autotune table, the extern calls, and the stage log
the compile kept (the aten graph, the schedule's fusion decisions, the plan, the guards;
compiler_core/stage_logs.py). Everything shown is data read from the stored artifact (its manifest
parsed as the pydantic model it is, its blobs verified against their digests and decoded as text),
never run. A client sees only the jobs it is attached to (another's is a 404); admins see every job.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from fxcc.compiler_core.artifact import CompileStats, ExternStep, KernelStep, TuningRecord
from fxcc.service.deps import ClientDep, StoreDep
from fxcc.service.routes.jobs import JobIdPath, fetch
from fxcc.service.store import JobRecord, Store

router = APIRouter(prefix="/v1", tags=["jobs"])

SOURCE_MAX_CHARS = 65_536  # a kernel's source as shown (the artifact holds all of it)


class ExplorerKernel(BaseModel):
    name: str
    launches: int  # plan steps that launch it
    num_warps: int
    num_stages: int
    constexprs: dict[str, int]
    source: str
    source_bytes: int
    archs: list[str]  # the archs it has a binary for ("sm_90")
    build_errors: dict[str, str]
    tuning: TuningRecord | None


class ExplorerExtern(BaseModel):
    op: str
    out: str


class ExplorerStage(BaseModel):
    stage: str  # graph, schedule, plan, guards
    title: str
    text: str


class Explorer(BaseModel):
    job: JobRecord
    artifact: bool  # whether the job's artifact is stored (not before it is done, nor for a build task)
    target: str | None = None
    tuned: bool = False
    stats: CompileStats | None = None
    steps: int = 0
    kernels: list[ExplorerKernel] = []
    externs: list[ExplorerExtern] = []
    stages: list[ExplorerStage] = []


@router.get("/jobs/{job_id}/explorer", response_model=Explorer, responses={404: {}})
async def explore(job_id: JobIdPath, store: StoreDep, principal: ClientDep) -> Explorer:
    """One job's compile, stage by stage (the dashboard's job page)."""
    job = await fetch(store, job_id, principal)
    return await run_in_threadpool(_explorer, store, job)


def _explorer(store: Store, job: JobRecord) -> Explorer:
    if job.kind == "build":
        return Explorer(job=job, artifact=False)
    found = store.fetch_artifact(job.key, blobs=True, count=False)
    if found is None or found.blobs is None:
        return Explorer(job=job, artifact=False)
    m, blobs = found.manifest, found.blobs
    launches: dict[str, int] = {}
    externs = []
    for step in m.plan.steps:
        if isinstance(step, KernelStep):
            launches[step.kernel] = launches.get(step.kernel, 0) + 1
        elif isinstance(step, ExternStep):
            externs.append(ExplorerExtern(op=step.op, out=step.out))
    kernels = []
    for k in m.kernels:
        source = _text(blobs.get(k.source.digest, b""))
        kernels.append(ExplorerKernel(
            name=k.name, launches=launches.get(k.name, 0), num_warps=k.num_warps, num_stages=k.num_stages,
            constexprs=k.constexprs, source=source[:SOURCE_MAX_CHARS], source_bytes=k.source.size,
            archs=sorted(k.binaries), tuning=k.tuning,
            build_errors={key.removesuffix(".error"): str(v) for key, v in k.metadata.items() if key.endswith(".error")}))
    return Explorer(job=job, artifact=True, target=f"{m.target.kind}" + (f" sm_{m.target.arch}" if m.target.arch else ""),
                    tuned=m.tuned, stats=m.stats, steps=len(m.plan.steps), kernels=kernels, externs=externs,
                    stages=_stages(blobs.get(m.stage_log.digest) if m.stage_log else None))


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _stages(data: bytes | None) -> list[ExplorerStage]:
    """The stage log's entries; nothing for an artifact without one (or one this service cannot read)."""
    if not data:
        return []
    try:
        entries: Any = json.loads(data)
        return [ExplorerStage.model_validate(e) for e in entries.get("stages", [])][:256]
    except (ValueError, AttributeError, TypeError):
        return []

"""POST /v1/compile: check a request, answer from the cache or queue a (single-flight) job.

The checks (parsing, the op allow-list, the key, shape propagation) run in the API's checker
processes (service/checker.py), never in the API process: this route only moves bytes and asks
the store.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from fxcc.compiler_core.artifact import ArtifactManifest
from fxcc.service.checker import Checked, CheckLimits, pool_for
from fxcc.service.deps import ClientDep, SettingsDep, StoreDep, require
from fxcc.service.settings import ServiceSettings, api_processes
from fxcc.service.store import Store

router = APIRouter(prefix="/v1", tags=["compile"], dependencies=[Depends(require("client"))])

# The body is read raw (the checkers parse it), so the OpenAPI document names its schema here;
# app.py adds CompileRequest's schema to the document's components.
REQUEST_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/CompileRequest"}}}}}


class CompileDone(BaseModel):
    status: Literal["done"] = "done"
    key: str
    manifest: dict[str, Any]


class CompileQueued(BaseModel):
    status: Literal["queued"] = "queued"
    key: str
    job_id: str


@router.post("/compile", status_code=202, response_model=CompileQueued, openapi_extra=REQUEST_BODY,
             responses={200: {"model": CompileDone}, 413: {}, 422: {}, 429: {}, 503: {}})
async def post_compile(request: Request, store: StoreDep, settings: SettingsDep,
                       principal: ClientDep) -> JSONResponse:
    body = await request.body()
    # The service computes the key itself (in a checker): a client's key is never trusted.
    checked = await run_in_threadpool(checker_pool(settings).check, body, principal.name)
    return await run_in_threadpool(answer, checked, body, store, principal.name)


def checker_pool(settings: ServiceSettings) -> Any:
    return pool_for(check_limits(settings))


def check_limits(settings: ServiceSettings) -> CheckLimits:
    """The checkers' limits; FXCC_CHECK_PROCESSES=0 (default) means 2 in a lone API process and 1
    in each of several (each checker holds torch: about 0.5 GB at rest)."""
    processes = settings.check_processes or (2 if api_processes(settings) == 1 else 1)
    return CheckLimits(processes=processes, timeout_s=settings.check_timeout_s,
                       memory_mb=settings.check_memory_mb, per_principal=settings.check_per_principal,
                       max_nodes=settings.max_nodes)


def answer(checked: Checked, body: bytes, store: Store, principal: str) -> JSONResponse:
    manifest = store.lookup_manifest(checked.key)
    if manifest is not None:
        return done(checked.key, manifest)
    # A body known from an earlier check is queued as sent: it parses to the same request.
    request_json = (checked.request_json or body).decode()
    submitted = store.submit(checked.key, request_json, checked.priority, principal)
    if submitted.manifest is not None:  # a worker finished it between our look-up and submit
        return done(checked.key, submitted.manifest)
    assert submitted.job_id is not None
    return JSONResponse(status_code=202, content=CompileQueued(key=checked.key, job_id=submitted.job_id).model_dump())


def done(key: str, manifest: ArtifactManifest) -> JSONResponse:
    body = CompileDone(key=key, manifest=manifest.model_dump(mode="json"))
    return JSONResponse(status_code=200, content=body.model_dump(mode="json"))

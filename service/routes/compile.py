"""POST /v1/compile: validate a request, answer from the cache or queue a (single-flight) job."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from compiler_core.artifact import ArtifactManifest
from compiler_core.graph import rebuild_graph
from compiler_core.keys import compile_key
from compiler_core.wire import CompileRequest, resolve_target
from service.deps import StoreDep

router = APIRouter(prefix="/v1", tags=["compile"])


class CompileDone(BaseModel):
    status: Literal["done"] = "done"
    key: str
    manifest: dict[str, Any]


class CompileQueued(BaseModel):
    status: Literal["queued"] = "queued"
    key: str
    job_id: str


# Note: a plain `def` runs in FastAPI's threadpool, which is where the FakeTensor shape
# propagation of rebuild_graph (CPU work, milliseconds to seconds) belongs.
@router.post("/compile", status_code=202, response_model=CompileQueued,
             responses={200: {"model": CompileDone}, 413: {}, 422: {}})
def post_compile(request: CompileRequest, store: StoreDep) -> JSONResponse:
    for node in request.graph.nodes:
        resolve_target(node.target, node=node.name)  # InvalidGraph → 422 naming node and op
    # The service computes the key itself: a client's key is never trusted.
    key = compile_key(request)
    manifest = store.get_manifest(key)
    if manifest is not None:
        store.count("hits")
        return done(key, manifest)
    store.count("misses")
    rebuild_graph(request.graph)  # shapes must fit together before a worker spends time on it
    submitted = store.submit(key, request.model_dump_json(), request.priority)
    if submitted.manifest is not None:  # a worker finished it between our look-up and submit
        return done(key, submitted.manifest)
    assert submitted.job_id is not None
    return JSONResponse(status_code=202, content=CompileQueued(key=key, job_id=submitted.job_id).model_dump())


def done(key: str, manifest: ArtifactManifest) -> JSONResponse:
    body = CompileDone(key=key, manifest=manifest.model_dump(mode="json"))
    return JSONResponse(status_code=200, content=body.model_dump(mode="json"))

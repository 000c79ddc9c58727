"""POST /v1/compile: validate a request, answer from the cache or queue a (single-flight) job."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from fxcc.compiler_core.artifact import ArtifactManifest
from fxcc.compiler_core.errors import FxccError, InvalidGraph
from fxcc.compiler_core.graph import rebuild_graph
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.wire import CompileRequest, GraphSpec, resolve_target
from fxcc.service.deps import ClientDep, SettingsDep, StoreDep, require

router = APIRouter(prefix="/v1", tags=["compile"], dependencies=[Depends(require("client"))])


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
             responses={200: {"model": CompileDone}, 413: {}, 422: {}, 429: {}, 503: {}})
def post_compile(request: CompileRequest, store: StoreDep, settings: SettingsDep,
                 principal: ClientDep) -> JSONResponse:
    check_graph(request.graph, settings.max_nodes)
    # The service computes the key itself: a client's key is never trusted.
    key = compile_key(request)
    manifest = store.lookup_manifest(key)
    if manifest is not None:
        return done(key, manifest)
    propagate_shapes(request.graph)  # shapes must fit together before a worker spends time on it
    submitted = store.submit(key, request.model_dump_json(), request.priority, principal.name)
    if submitted.manifest is not None:  # a worker finished it between our look-up and submit
        return done(key, submitted.manifest)
    assert submitted.job_id is not None
    return JSONResponse(status_code=202, content=CompileQueued(key=key, job_id=submitted.job_id).model_dump())


def check_graph(graph: GraphSpec, max_nodes: int) -> None:
    """Cheap checks first: the node limit, then that every target names an aten/prims op."""
    if len(graph.nodes) > max_nodes:
        raise InvalidGraph(f"graph has {len(graph.nodes)} nodes, over the limit of {max_nodes} (FXCC_MAX_NODES)")
    for node in graph.nodes:
        resolve_target(node.target, node=node.name)  # InvalidGraph → 422 naming node and op


def propagate_shapes(graph: GraphSpec) -> None:
    """rebuild_graph, with whatever torch raises on nonsense arguments reported as InvalidGraph."""
    try:
        rebuild_graph(graph)
    except FxccError:
        raise
    except Exception as e:  # noqa: BLE001 - torch's errors for bad args are many; all mean "bad graph"
        raise InvalidGraph(f"shape propagation failed: {type(e).__name__}: {str(e)[:500]}") from None


def done(key: str, manifest: ArtifactManifest) -> JSONResponse:
    body = CompileDone(key=key, manifest=manifest.model_dump(mode="json"))
    return JSONResponse(status_code=200, content=body.model_dump(mode="json"))

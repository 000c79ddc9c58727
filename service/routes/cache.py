"""The cache, for admins (`fxcc cache ls|rm|purge`): list entries, remove one, purge all."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query

from fxcc.service.deps import StoreDep, require
from fxcc.service.routes.artifacts import KeyPath

router = APIRouter(prefix="/v1", tags=["cache"], dependencies=[Depends(require("admin"))])


@router.get("/cache")
def list_cache(store: StoreDep, limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> dict[str, Any]:
    entries = []
    for key in store.list_artifacts(limit):
        m = store.get_manifest(key)
        if m is None:
            continue  # removed or evicted since it was listed
        entries.append({"key": key, "tuned": m.tuned, "target": m.target.model_dump(), "kernels": m.stats.kernels,
                        "nodes": m.stats.nodes, "bytes": sum(r.size for r in m.blob_refs()),
                        "signed": store.get_signature(key) is not None})
    return {"entries": entries, "total": store.cache_entries()}


@router.delete("/cache/{key}", responses={404: {}})
def remove_entry(key: KeyPath, store: StoreDep) -> dict[str, Any]:
    if not store.delete_artifact(key):
        raise HTTPException(status_code=404, detail=f"no artifact {key}")
    return {"removed": key}


@router.delete("/cache")
def purge(store: StoreDep) -> dict[str, Any]:
    return {"purged": store.purge_cache()}

"""GET /v1/artifacts/{key}: a stored artifact's manifest and (base64) blobs."""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.responses import JSONResponse

from service.deps import StoreDep

router = APIRouter(prefix="/v1", tags=["artifacts"])

KEY_PATTERN = r"^[0-9a-f]{64}$"


@router.get("/artifacts/{key}")
def get_artifact(
    key: Annotated[str, Path(pattern=KEY_PATTERN)],
    store: StoreDep,
    blobs: Annotated[bool, Query(description="include the blobs (base64); blobs=0 for the manifest only")] = True,
) -> JSONResponse:
    body: dict[str, Any]
    if blobs:
        art = store.get_artifact(key)
        if art is None:
            raise HTTPException(status_code=404, detail=f"no artifact {key}")
        body = {"manifest": art.manifest.model_dump(mode="json"),
                "blobs": {d: base64.b64encode(b).decode() for d, b in art.blobs.items()}}
    else:
        manifest = store.get_manifest(key)
        if manifest is None:
            raise HTTPException(status_code=404, detail=f"no artifact {key}")
        body = {"manifest": manifest.model_dump(mode="json")}
    return JSONResponse(body)

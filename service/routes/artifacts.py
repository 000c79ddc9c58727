"""GET /v1/artifacts/{key}: a stored artifact's manifest, (base64) blobs and signature."""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from fastapi.responses import JSONResponse

from service.deps import StoreDep, require

router = APIRouter(prefix="/v1", tags=["artifacts"], dependencies=[Depends(require("client"))])

KEY_PATTERN = r"^[0-9a-f]{64}$"
KeyPath = Annotated[str, Path(pattern=KEY_PATTERN, description="compile key (sha256 hex)")]


@router.get("/artifacts/{key}", responses={404: {}})
def get_artifact(
    key: KeyPath,
    store: StoreDep,
    blobs: Annotated[bool, Query(description="include the blobs (base64); blobs=0 for the manifest only")] = True,
) -> JSONResponse:
    """`signature` is hex HMAC-SHA256 over the manifest's canonical JSON (sorted keys, no spaces)
    under FXCC_SIGNING_KEY, or null when the worker that stored it signs nothing."""
    body: dict[str, Any]
    if blobs:
        art = store.get_artifact(key)
        if art is None:
            raise HTTPException(status_code=404, detail=f"no artifact {key}")
        body = {"manifest": art.manifest.model_dump(mode="json"),
                "blobs": {d: base64.b64encode(b).decode() for d, b in art.blobs.items()}}
    else:
        manifest = store.lookup_manifest(key)
        if manifest is None:
            raise HTTPException(status_code=404, detail=f"no artifact {key}")
        body = {"manifest": manifest.model_dump(mode="json")}
    body["signature"] = store.get_signature(key)
    return JSONResponse(body)

"""GET /v1/artifacts/{key}: a stored artifact's manifest, (base64) blobs and signature."""

from __future__ import annotations

import base64
import json
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from fastapi.responses import Response

from fxcc.service.deps import StoreDep, require

router = APIRouter(prefix="/v1", tags=["artifacts"], dependencies=[Depends(require("client"))])

KEY_PATTERN = r"^[0-9a-f]{64}$"
KeyPath = Annotated[str, Path(pattern=KEY_PATTERN, description="compile key (sha256 hex)")]


@router.get("/artifacts/{key}", responses={200: {"content": {"application/json": {}}}, 404: {}})
async def get_artifact(
    key: KeyPath,
    store: StoreDep,
    blobs: Annotated[bool, Query(description="include the blobs (base64); blobs=0 for the manifest only")] = True,
) -> Response:
    """`{"manifest": ..., "blobs": {digest: base64}, "signature": str | null}`. The signature is
    `ed25519:<key id>:<base64>`, the storing worker's Ed25519 signature over the manifest's canonical
    JSON (sorted keys, no spaces), or null when that worker signs nothing (clients refuse it then)."""
    found = await store.fetch_artifact_async(key, blobs=blobs)
    if found is None:
        raise HTTPException(status_code=404, detail=f"no artifact {key}")
    # Note: a cache hit is the hot path; the manifest's stored JSON goes out as it is, unparsed.
    parts = [b'{"manifest":', found.manifest_json]
    if found.blobs is not None:
        encoded = {d: base64.b64encode(b).decode() for d, b in found.blobs.items()}
        parts += [b',"blobs":', json.dumps(encoded).encode()]
    parts += [b',"signature":', json.dumps(found.signature).encode(), b"}"]
    return Response(b"".join(parts), media_type="application/json")

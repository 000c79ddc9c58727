"""PUT/GET /v1/packages/{key}: Dynamo packages (client/dynamo_cache.py), opaque bytes per principal.

Note: a package holds client-side code (Dynamo's bytecode, pickled guards), signed by the
principal's own clients with a key the service never holds. The service never opens one: it
checks the key's form and the size, and stores and returns the bytes as they came. Each principal
(the token's name, or `anonymous`) sees only its own packages: another principal's package for the
same key is a 404. A purge of the cache (`DELETE /v1/cache`) removes every package.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response

from fxcc.service.deps import ClientDep, StoreDep, require
from fxcc.service.routes.artifacts import KeyPath

router = APIRouter(prefix="/v1", tags=["packages"], dependencies=[Depends(require("client"))])

# A GPT-2's package is about 2 MB; the bound keeps one under the service's request limit (32 MiB).
MAX_PACKAGE_BYTES = 30 * 1024 * 1024


async def package_body(request: Request) -> bytes:
    """The request's body, read up to MAX_PACKAGE_BYTES (413 beyond; 422 when empty)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_PACKAGE_BYTES:
        raise HTTPException(status_code=413, detail=f"a package has at most {MAX_PACKAGE_BYTES} bytes")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_PACKAGE_BYTES:
            raise HTTPException(status_code=413, detail=f"a package has at most {MAX_PACKAGE_BYTES} bytes")
    if not data:
        raise HTTPException(status_code=422, detail="a package has at least one byte")
    return bytes(data)


@router.put("/packages/{key}", status_code=204, responses={413: {}, 422: {}})
def put_package(key: KeyPath, data: Annotated[bytes, Depends(package_body)], store: StoreDep,
                principal: ClientDep) -> Response:
    """Store this principal's package for `key` (replacing any), as opaque bytes."""
    store.put_package(principal.name, key, data)
    store.count("package_puts")
    return Response(status_code=204)


@router.get("/packages/{key}", responses={200: {"content": {"application/octet-stream": {}}}, 404: {}})
def get_package(key: KeyPath, store: StoreDep, principal: ClientDep) -> Response:
    """This principal's package for `key`, as stored; 404 when it has none (whatever others have)."""
    data = store.get_package(principal.name, key)
    if data is None:
        store.count("package_misses")
        raise HTTPException(status_code=404, detail=f"no package {key}")
    store.count("package_hits")
    return Response(content=data, media_type="application/octet-stream")

"""GET /healthz: is the store reachable."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from fxcc.service.deps import StoreDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(store: StoreDep) -> JSONResponse:
    try:
        store.ping()
    except Exception as e:  # noqa: BLE001 - whatever the cause, the answer is "not healthy"
        return JSONResponse(status_code=503, headers={"Retry-After": "5"},
                            content={"ok": False, "store": store.mode, "error": f"{type(e).__name__}: {e}"})
    return JSONResponse({"ok": True, "store": store.mode})

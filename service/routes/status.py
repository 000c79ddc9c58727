"""GET /v1/status: the queue, the workers and the cache counters, for people and dashboards."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.deps import StoreDep

router = APIRouter(prefix="/v1", tags=["status"])


@router.get("/status")
def get_status(store: StoreDep) -> dict[str, Any]:
    return {"store": store.mode, "queue": store.queue_depths(), "workers": store.workers(),
            "cache": store.counters()}

"""GET /v1/status (clients: queue, workers, cache counters) and GET /v1/stats (admins: the full picture)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from fxcc.service.deps import ClientDep, StoreDep, require
from fxcc.service.stats import gather_stats

router = APIRouter(prefix="/v1", tags=["status"])


@router.get("/status")
def get_status(store: StoreDep, principal: ClientDep) -> dict[str, Any]:
    """Queues, workers and cache counters; a client is not shown the ids of the jobs workers hold
    (they may be other principals')."""
    workers = store.workers()
    if not principal.may("admin"):
        workers = [{k: v for k, v in w.items() if k != "jobs"} for w in workers]
    return {"store": store.mode, "queue": store.queue_depths(), "tune": store.tune_depths(),
            "workers": workers, "cache": store.counters()}


@router.get("/stats", dependencies=[Depends(require("admin"))])
def get_stats(store: StoreDep) -> dict[str, Any]:
    """Queue depth per priority (with all tune jobs and the dead-letter stream), tune jobs per GPU
    arch (`tune`), live workers with heartbeat age and device, the last 1000 jobs per state,
    cache entries, bytes, counters and hit rate."""
    return gather_stats(store)

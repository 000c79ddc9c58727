"""GET /v1/status (clients: queue, workers, cache counters), GET /v1/stats (admins: the full picture) and
GET /v1/stats/history (admins: the cache counters a minute, the last hour)."""

from __future__ import annotations

import time
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


@router.get("/stats/history", dependencies=[Depends(require("admin"))])
def get_history(store: StoreDep) -> list[dict[str, Any]]:
    """The cache counters at the start of each of the last 60 minutes the service kept (`t` in Unix
    seconds; hits, misses, puts, rejected): the dashboard charts the hit rate a minute from them."""
    now = int(time.time() // 60)
    return [dict(m, t=m["minute"] * 60) for m in store.minutes(now - 60, now)]


@router.get("/stats", dependencies=[Depends(require("admin"))])
def get_stats(store: StoreDep) -> dict[str, Any]:
    """Queue depth per priority (with all tune jobs and the dead-letter stream), tune jobs per GPU
    arch (`tune`), live workers with heartbeat age and device, the last 1000 jobs per state,
    cache entries, bytes, counters and hit rate."""
    return gather_stats(store)

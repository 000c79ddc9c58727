"""What GET /v1/stats and GET /metrics report, gathered once from the store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from fxcc.service.store import Store

log = logging.getLogger("fxcc.service")


def gather_stats(store: Store) -> dict[str, Any]:
    """Queue depth per priority (and tune jobs), tune jobs per GPU arch, live workers with heartbeat
    age, jobs per state, cache figures."""
    now = time.time()
    workers = []
    for w in store.workers():
        beat = w.get("beat_at")
        workers.append({"id": w.get("id"), "device": w.get("device"), "tune_arch": w.get("tune_arch"),
                        "concurrency": w.get("concurrency"),
                        "jobs": w.get("jobs", []), "jobs_done": w.get("jobs_done", 0),
                        "heartbeat_age_s": None if beat is None else round(max(now - beat, 0.0), 3)})
    counters = store.counters()
    hits, misses = counters.get("hits", 0), counters.get("misses", 0)
    cache = {"entries": store.cache_entries(), "bytes": counters.get("bytes", 0), "hits": hits,
             "misses": misses, "puts": counters.get("puts", 0), "rejected": counters.get("rejected", 0),
             "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None}
    # pre-AOT entries (routes/pre_aot.py): GETs answered (hits) or 404 (misses), PUTs stored or refused (409)
    pre_aot = {name: counters.get(f"pre_aot_{name}", 0) for name in ("hits", "misses", "puts", "refused")}
    return {"store": store.mode, "queue": store.queue_depths(), "tune": store.tune_depths(),
            "workers": workers, "jobs": store.job_counts(), "cache": cache, "pre_aot": pre_aot}


MINUTE_COUNTERS = ("hits", "misses", "puts", "rejected")
SAMPLE_EVERY_S = 15.0


def record_minute(store: Store, now: float | None = None) -> int:
    """Keep the cache counters as they are now as the current minute's, unless it is kept; the minute."""
    minute = int((time.time() if now is None else now) // 60)
    counters = store.counters()
    store.record_minute(minute, {k: int(counters.get(k, 0)) for k in MINUTE_COUNTERS})
    return minute


async def sample_minutes(store: Store, stop: asyncio.Event) -> None:
    """Each minute's counters, for the dashboard's hit-rate chart (an API process's lifespan runs
    it; with several processes the first to sample a minute keeps it)."""
    last = None
    while not stop.is_set():
        minute = int(time.time() // 60)
        if minute != last:
            try:
                await asyncio.to_thread(record_minute, store)
                last = minute
            except Exception as e:  # noqa: BLE001 - only the charts' history
                log.warning("could not sample the cache counters: %s", e)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)


def render_metrics(stats: dict[str, Any]) -> str:
    """The stats in Prometheus' text exposition format (version 0.0.4)."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{label_text}}} {value}" if label_text else f"{name} {value}")

    queue = stats["queue"]
    metric("fxcc_queue_waiting_jobs", "gauge", "Jobs waiting for a worker.",
           [({"priority": p}, q["waiting"]) for p, q in queue.items()])
    metric("fxcc_queue_running_jobs", "gauge", "Jobs a worker holds.",
           [({"priority": p}, q["running"]) for p, q in queue.items()])
    metric("fxcc_tune_waiting_jobs", "gauge", "Tune jobs waiting for a GPU of their arch.",
           [({"arch": a}, q["waiting"]) for a, q in stats["tune"].items()])
    metric("fxcc_tune_running_jobs", "gauge", "Tune jobs a GPU worker holds.",
           [({"arch": a}, q["running"]) for a, q in stats["tune"].items()])
    metric("fxcc_workers", "gauge", "Workers with a current heartbeat.", [({}, len(stats["workers"]))])
    metric("fxcc_worker_heartbeat_age_seconds", "gauge", "Seconds since each worker's last heartbeat.",
           [({"worker": str(w["id"]), "device": str(w["device"])}, w["heartbeat_age_s"])
            for w in stats["workers"] if w["heartbeat_age_s"] is not None])
    metric("fxcc_jobs", "gauge", "The last 1000 jobs per state.", [({"state": s}, n) for s, n in stats["jobs"].items()])
    cache = stats["cache"]
    metric("fxcc_cache_entries", "gauge", "Artifacts in the cache.", [({}, cache["entries"])])
    metric("fxcc_cache_bytes", "gauge", "Bytes stored by puts (blobs and manifests).", [({}, cache["bytes"])])
    for name in ("hits", "misses", "puts", "rejected"):
        metric(f"fxcc_cache_{name}_total", "counter", f"Cache {name}.", [({}, cache[name])])
    for name, value in stats["pre_aot"].items():
        metric(f"fxcc_pre_aot_{name}_total", "counter", f"Pre-AOT entry {name} (GET /v1/pre-aot hits and misses, "
               "PUTs stored and refused).", [({}, value)])
    return "\n".join(lines) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

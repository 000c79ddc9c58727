"""GET /metrics: the stats in Prometheus text format (admin role: scrape with a bearer token)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse

from fxcc.service.deps import StoreDep, require
from fxcc.service.stats import gather_stats, render_metrics

router = APIRouter(tags=["metrics"], dependencies=[Depends(require("admin"))])


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(store: StoreDep) -> PlainTextResponse:
    return PlainTextResponse(render_metrics(gather_stats(store)), media_type="text/plain; version=0.0.4")

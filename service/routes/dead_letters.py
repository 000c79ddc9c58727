"""GET /v1/dead-letters: jobs that failed job_max_attempts times, newest first, with their error (admins)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from fxcc.service.deps import StoreDep, require

router = APIRouter(prefix="/v1", tags=["dead-letters"], dependencies=[Depends(require("admin"))])


@router.get("/dead-letters")
def list_dead_letters(store: StoreDep, limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> list[dict[str, Any]]:
    return [{"job_id": d["job_id"], "key": d["key"], "attempts": int(d["attempts"]), "at": float(d["at"]),
             "error": json.loads(d["error"])} for d in store.dead_letters(limit)]

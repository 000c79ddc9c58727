"""GET /: the status dashboard, one static page that polls the JSON API (no front-end build)."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(tags=["dashboard"])


@cache
def _page() -> str:
    return resources.files("fxcc.service").joinpath("static/dashboard.html").read_text(encoding="utf-8")


# The page itself holds no data: the API calls it makes carry the user's token.
@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def dashboard() -> HTMLResponse:
    return HTMLResponse(_page())

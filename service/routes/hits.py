"""The cache-hit fast path: `GET /v1/artifacts/{key}` and `GET /v1/bundles/{key}` answered by an ASGI
middleware ahead of FastAPI's router (issue 24).

Note: FastAPI's routing and dependency resolution cost about 60% of a single hit (bench/README.md).
Both GETs without a query string are answered here exactly as their FastAPI routes answer them
(routes/artifacts.py, routes/bundles.py): same authentication, role check, headers and errors, the
errors through the app's own exception handlers. Anything else goes on to the app.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from fxcc.service.deps import check_role, principal_of
from fxcc.service.routes.artifacts import hit_answer
from fxcc.service.routes.bundles import MEDIA_TYPE, bundle_answer

_HIT_PATH = re.compile(r"/v1/(artifacts|bundles)/[0-9a-f]{64}")
_MEDIA_TYPES = {"artifacts": b"application/json", "bundles": MEDIA_TYPE.encode()}


class FastHits:
    """ASGI middleware: the two cache-hit GETs, without FastAPI; anything else goes on to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope["query_string"]:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        match = _HIT_PATH.fullmatch(path)
        if match is None:
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        authorization = if_none_match = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"if-none-match":
                if_none_match = value.decode("latin-1")
        kind = match.group(1)
        try:
            check_role(await principal_of(state.auth, authorization), "client")
            if kind == "artifacts":
                status, headers, body = await hit_answer(state.store, path[-64:], True, if_none_match)
            else:
                status, headers, body = await bundle_answer(state.store, path[-64:], if_none_match)
        except Exception as exc:  # noqa: BLE001 - answered by the app's own exception handlers
            response = await _handled(scope, exc)
            await response(scope, receive, send)
            return
        raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        if body:
            raw += [(b"content-type", _MEDIA_TYPES[kind]), (b"content-length", str(len(body)).encode())]
        else:
            raw.append((b"content-length", b"0"))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})


async def _handled(scope: Scope, exc: Exception) -> Any:
    """The response the app's exception handlers (service/handlers.py) give `exc`; re-raised when
    none handles it (ServerErrorMiddleware then answers 500 and logs it, as for any route)."""
    from starlette.requests import Request as StarletteRequest

    handlers = scope["app"].exception_handlers
    for cls in type(exc).__mro__:
        if cls in handlers:
            return await handlers[cls](StarletteRequest(scope), exc)
    raise exc

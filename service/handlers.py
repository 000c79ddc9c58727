"""Exception → HTTP mapping in one place: bad input is a 4xx naming what is wrong, never a 500."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fxcc.compiler_core.errors import FxccError

log = logging.getLogger("fxcc.service")

RETRY_AFTER_S = 5


def error_body(error: str, message: str, **extra: Any) -> dict[str, Any]:
    """The error shape every 4xx/5xx uses, the same as FxccError.to_dict()."""
    return {"error": error, "message": message, "op": None, "node": None, **extra}


# Replies of a Redis that restarted, is loading, or failed over (a replica now, or no master yet):
# the store will answer again, so these are a 503 with Retry-After, never a 500.
_TRANSIENT_REPLIES = ("NOGROUP", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")


def install_handlers(app: FastAPI, quota_retry_after_s: int = 10) -> None:
    app.state.quota_retry_after_s = quota_retry_after_s
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(FxccError, _fxcc_error)
    app.add_exception_handler(redis.ConnectionError, _store_unavailable)
    app.add_exception_handler(redis.TimeoutError, _store_unavailable)
    app.add_exception_handler(redis.BusyLoadingError, _store_unavailable)
    app.add_exception_handler(redis.ResponseError, _store_reply)


_STATUS_NAMES = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
                 405: "MethodNotAllowed", 409: "Conflict", 413: "RequestTooLarge", 415: "UnsupportedMediaType",
                 421: "MisdirectedRequest", 429: "QuotaExceeded"}


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    name = _STATUS_NAMES.get(exc.status_code, "HTTPError")
    return JSONResponse(status_code=exc.status_code, headers=exc.headers,
                        content=error_body(name, str(exc.detail), detail=exc.detail))


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(status_code=422, content=validation_body(exc.errors()))


def validation_body(errors: Sequence[Any]) -> dict[str, Any]:
    """The 422 body of a validation error: the first error's place and message, then up to 20.
    Only loc and msg travel back: pydantic's `input` would echo (possibly huge) client data."""
    details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in errors[:20]]
    first = details[0] if details else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"]) or "request"
    return error_body("ValidationError", f"{where}: {first['msg']}", detail=details)


# The HTTP status of each kind of error (compiler_core/errors.py): errors carry kinds, the service
# alone speaks HTTP. An error that knows its status (a checker's answer) says so as `http_status`.
STATUS_OF_KIND = {"invalid": 422, "quota": 429, "unavailable": 503, "conflict": 409, "failed": 500}


def http_status(exc: FxccError) -> int:
    status = getattr(exc, "http_status", None)
    return status if isinstance(status, int) else STATUS_OF_KIND.get(exc.kind, 500)


async def _fxcc_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FxccError)
    headers = None
    status = http_status(exc)
    if status == 503:
        headers = {"Retry-After": str(RETRY_AFTER_S)}
    elif status == 429:
        headers = {"Retry-After": str(request.app.state.quota_retry_after_s)}
        if getattr(exc, "quota", None):
            headers["X-Fxcc-Quota"] = exc.quota
    elif status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc)
    return JSONResponse(status_code=status, content=exc.to_dict(), headers=headers)


async def _store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("store unavailable during %s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)},
                        content=error_body("StoreUnavailable", f"Redis is unreachable: {type(exc).__name__}"))


async def _store_reply(request: Request, exc: Exception) -> JSONResponse:
    code = str(exc).split(" ", 1)[0]
    if code not in _TRANSIENT_REPLIES:
        log.error("%s %s failed: Redis answered %s", request.method, request.url.path, exc)
        return JSONResponse(status_code=500, content=error_body("StoreError", f"Redis answered {code}"))
    store = getattr(request.app.state, "store", None)
    if code == "NOGROUP" and hasattr(store, "forget_groups"):
        store.forget_groups()  # made again on next use
    log.warning("store not ready during %s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)},
                        content=error_body("StoreUnavailable", f"Redis is not ready ({code}); retry later"))


def _host_name(host: str) -> str:
    """The name of a Host header without its port: `[::1]:8470` -> `[::1]`, `localhost:1` -> `localhost`."""
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class LoopbackGuard:
    """ASGI middleware for a service where reaching the port is the only credential (anonymous
    access, bound to loopback): a Host that is no loopback name (nor in allowed_hosts) gets 421, and
    a browser's cross-origin write (an Origin other than the request's own loopback origin, or
    Sec-Fetch-Site cross-site or same-site) gets 403.

    Note: the Host check defeats DNS rebinding (a page at evil.example whose name now resolves to
    127.0.0.1 sends Host: evil.example) and same-host proxies for other names; the Origin check
    defeats a page on another origin POSTing a form or a fetch without preflight.
    """

    def __init__(self, app: ASGIApp, allowed_hosts: list[str] | None = None) -> None:
        self.app = app
        self.allowed = {*LOOPBACK_NAMES, *(h.lower() for h in allowed_hosts or ())}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "").strip().lower()
        if _host_name(host) not in self.allowed:
            await self._refuse(scope, receive, send, 421, "MisdirectedRequest",
                               f"Host {host[:100]!r} is not served here: with anonymous access on, only "
                               f"{', '.join(LOOPBACK_NAMES)} (any port) and FXCC_ALLOWED_HOSTS are")
            return
        if scope.get("method", "GET") not in _SAFE_METHODS:
            origin = headers.get("origin")
            scheme = scope.get("scheme", "http")
            if origin is not None and origin.lower() != f"{scheme}://{host}":
                await self._refuse(scope, receive, send, 403, "Forbidden",
                                   f"cross-origin write refused: Origin {origin[:100]!r} is not {scheme}://{host}")
                return
            if headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
                await self._refuse(scope, receive, send, 403, "Forbidden",
                                   "cross-site write refused (Sec-Fetch-Site)")
                return
        await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, name: str, message: str) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await JSONResponse(status_code=status, content=error_body(name, message))(scope, receive, send)


class BodySizeLimit:
    """ASGI middleware: 413 for a request body over `max_bytes`, declared or streamed.

    Note: the body is buffered (up to the limit) and replayed, so a chunked upload without
    Content-Length cannot slip past the check.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse(status_code=413, content=error_body(
            "RequestTooLarge", f"request body exceeds {self.max_bytes} bytes"))
        await response(scope, receive, send)

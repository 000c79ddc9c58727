"""FastAPI dependencies: the store, settings and authenticator the lifespan handler put on
app.state, and the role checks every /v1 router declares."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from fxcc.service.auth import Authenticator, Principal
from fxcc.service.settings import Role, ServiceSettings
from fxcc.service.store import Store


# Note: dependencies that do no I/O are `async def`: FastAPI runs a sync dependency in its
# threadpool, and a hop per dependency per request is most of the cost of a cache hit.
async def get_store(request: Request) -> Store:
    return request.app.state.store


async def get_settings(request: Request) -> ServiceSettings:
    return request.app.state.settings


async def get_auth(request: Request) -> Authenticator:
    return request.app.state.auth


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]
AuthDep = Annotated[Authenticator, Depends(get_auth)]


# Declared as a security scheme, so /docs offers "Authorize" and the OpenAPI document says how to call.
_bearer = HTTPBearer(auto_error=False, description="an fxcc API token (role client or admin)")


async def authenticate(auth: AuthDep, request: Request,
                       credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
    """401 unless the request carries a known bearer token (or none at all, with anonymous access on)."""
    del credentials  # declared for the OpenAPI document; principal_of reads the header as _bearer does
    return await principal_of(auth, request.headers.get("authorization"))


async def principal_of(auth: Authenticator, authorization: str | None) -> Principal:
    """The principal of an Authorization header (the cache-hit route calls this without FastAPI)."""
    scheme, _, credentials = (authorization or "").partition(" ")
    if authorization and scheme.lower() == "bearer" and credentials:
        token = credentials.strip()
        known, principal = auth.known(token) if token else (True, None)
        if not known:  # a token made over the API, not looked up lately: ask the store
            principal = await run_in_threadpool(auth.principal, token)
    else:
        # No header: anonymous, if allowed. Another scheme (Basic ...) is a wrong credential, not none.
        principal = None if authorization else auth.principal(None)
    if principal is None:
        raise HTTPException(status_code=401, detail="missing or unknown bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    return principal


def check_role(principal: Principal, role: Role) -> Principal:
    """403 unless `principal` has `role` or above."""
    if not principal.may(role):
        raise HTTPException(status_code=403, detail=f"this needs the {role} role; "
                            f"token {principal.name!r} has {principal.role}")
    return principal


def require(role: Role):
    """A dependency that admits principals with `role` or above: 401 without a token, 403 below it."""

    async def check(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        return check_role(principal, role)

    return check


async def require_token_admin(principal: Annotated[Principal, Depends(require("admin"))]) -> Principal:
    """An admin that presented a token: anonymous access (even as admin) never mints or revokes tokens,
    so that whoever reaches a loopback port cannot leave a lasting credential behind."""
    if principal.anonymous:
        raise HTTPException(status_code=403, detail="the token routes need an admin token; anonymous "
                            "access never makes or revokes tokens (set FXCC_TOKEN to make the first)")
    return principal


ClientDep = Annotated[Principal, Depends(require("client"))]
AdminDep = Annotated[Principal, Depends(require("admin"))]

"""FastAPI dependencies: the store, settings and authenticator the lifespan handler put on
app.state, and the role checks every /v1 router declares."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request

from service.auth import Authenticator, Principal
from service.settings import Role, ServiceSettings
from service.store import Store


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_settings(request: Request) -> ServiceSettings:
    return request.app.state.settings


def get_auth(request: Request) -> Authenticator:
    return request.app.state.auth


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]
AuthDep = Annotated[Authenticator, Depends(get_auth)]


def authenticate(auth: AuthDep, authorization: Annotated[str | None, Header()] = None) -> Principal:
    """401 unless the request carries a known bearer token (or anonymous access is on)."""
    scheme, _, given = (authorization or "").partition(" ")
    token = given.strip() if scheme.lower() == "bearer" else None
    principal = auth.principal(token) if (token or not authorization) else None
    if principal is None:
        raise HTTPException(status_code=401, detail="missing or unknown bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    return principal


def require(role: Role):
    """A dependency that admits principals with `role` or above: 401 without a token, 403 below it."""

    def check(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        if not principal.may(role):
            raise HTTPException(status_code=403, detail=f"this needs the {role} role; "
                                f"token {principal.name!r} has {principal.role}")
        return principal

    return check


ClientDep = Annotated[Principal, Depends(require("client"))]
AdminDep = Annotated[Principal, Depends(require("admin"))]

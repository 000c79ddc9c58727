"""FastAPI dependencies: the store and settings the lifespan handler put on app.state, and auth."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request

from service.settings import ServiceSettings
from service.store import Store


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_settings(request: Request) -> ServiceSettings:
    return request.app.state.settings


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]


def require_token(settings: SettingsDep, authorization: Annotated[str | None, Header()] = None) -> None:
    """401 unless the request carries the configured bearer token (no-op when none is configured)."""
    if settings.token is None:
        return
    scheme, _, given = (authorization or "").partition(" ")
    expected = settings.token.get_secret_value().encode()
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), expected):
        raise HTTPException(status_code=401, detail="missing or wrong bearer token",
                            headers={"WWW-Authenticate": "Bearer"})

"""FastAPI dependencies: the store and settings the lifespan handler put on app.state."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.settings import ServiceSettings
from service.store import Store


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_settings(request: Request) -> ServiceSettings:
    return request.app.state.settings


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]

"""API tokens, for admins: list them, make one (its secret is shown once), revoke one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path
from pydantic import BaseModel, Field

from fxcc.service.auth import hash_token, new_token, settings_tokens
from fxcc.service.deps import AuthDep, SettingsDep, StoreDep, require_token_admin
from fxcc.service.settings import Role
from fxcc.service.store import TokenRecord, now_s

router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Depends(require_token_admin)])

TokenName = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")]


class TokenCreate(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    role: Role = "client"


class TokenInfo(BaseModel):
    name: str
    role: Role
    source: str
    created_at: float | None = None


class TokenCreated(TokenInfo):
    token: str = Field(description="the bearer token; shown only in this answer")


@router.get("/tokens", response_model=list[TokenInfo])
def list_tokens(store: StoreDep, settings: SettingsDep) -> list[TokenInfo]:
    return [TokenInfo(**t.model_dump()) for t in [*settings_tokens(settings), *store.api_tokens()]]


@router.post("/tokens", status_code=201, response_model=TokenCreated, responses={409: {}})
def create_token(body: TokenCreate, store: StoreDep, settings: SettingsDep, auth: AuthDep) -> TokenCreated:
    if any(t.name == body.name for t in settings_tokens(settings)):
        raise HTTPException(status_code=409, detail=f"token {body.name!r} exists (configured by settings)")
    token = new_token()
    record = TokenRecord(name=body.name, role=body.role, sha256=hash_token(token), created_at=now_s())
    if not store.add_token(record):
        raise HTTPException(status_code=409, detail=f"token {body.name!r} exists")
    auth.forget()
    return TokenCreated(name=record.name, role=record.role, source="api", created_at=record.created_at,
                        token=token)


@router.delete("/tokens/{name}", status_code=204, responses={404: {}, 409: {}})
def delete_token(name: TokenName, store: StoreDep, settings: SettingsDep, auth: AuthDep) -> None:
    if any(t.name == name for t in settings_tokens(settings)):
        raise HTTPException(status_code=409, detail=f"token {name!r} is configured by settings; change them")
    if not store.delete_token(name):
        raise HTTPException(status_code=404, detail=f"no token {name!r}")
    auth.forget()

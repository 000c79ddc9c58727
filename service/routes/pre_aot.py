"""PUT/GET /v1/pre-aot/{key}: pre-AOT entries (a Dynamo graph's key -> the artifact it compiled to),
kept per principal, so that a client on another machine skips AOTAutograd (client/pre_aot.py).

Note: an entry is data: five validated fields, stored as the service's own JSON and never run.
Each principal (the token's name, or `anonymous`) sees only its own entries: another principal's
entry for the same key is a 404. A PUT is accepted only while the artifact it names is stored
(409 otherwise). A purge of the cache (`DELETE /v1/cache`) removes every entry. When the artifact
goes otherwise (evicted, removed), GET still returns the entry: the client's artifact GET then
answers 404, which it treats as a miss, runs AOTAutograd, and its PUT after the compile rewrites
the entry.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fxcc.service.deps import ClientDep, StoreDep, require
from fxcc.service.routes.artifacts import KEY_PATTERN, KeyPath

log = logging.getLogger("fxcc.service")

router = APIRouter(prefix="/v1", tags=["pre-aot"], dependencies=[Depends(require("client"))])

MAX_ENTRY_BYTES = 4096  # an entry is about 150 bytes of JSON
MAX_COUNT = 1_000_000  # inputs, outputs and graph nodes of one graph


class PreAotEntry(BaseModel):
    """A pre-AOT entry as PUT: what client/pre_aot.py's Entry holds, and its schema version."""

    model_config = ConfigDict(extra="forbid", strict=True)

    schema_version: int = Field(alias="schema", ge=1, le=1000, description="the client's entry schema")
    artifact_key: str = Field(pattern=KEY_PATTERN, description="the compile key of the stored artifact")
    inputs: int = Field(ge=0, le=MAX_COUNT)
    outputs: int = Field(ge=0, le=MAX_COUNT)
    graph_nodes: int = Field(ge=0, le=MAX_COUNT)


class PreAotEntryOut(PreAotEntry):
    """An entry as GET (and PUT) answer it: the entry and its key."""

    key: str


async def small_body(request: Request) -> None:
    """413 for a body over MAX_ENTRY_BYTES (the app's own limit is for compile requests)."""
    if len(await request.body()) > MAX_ENTRY_BYTES:
        raise HTTPException(status_code=413, detail=f"a pre-AOT entry has at most {MAX_ENTRY_BYTES} bytes")


@router.put("/pre-aot/{key}", response_model=PreAotEntryOut, dependencies=[Depends(small_body)],
            responses={409: {}, 413: {}, 422: {}})
def put_entry(key: KeyPath, entry: PreAotEntry, store: StoreDep, principal: ClientDep) -> PreAotEntryOut:
    """Store this principal's entry for `key` (replacing any): 409 unless the artifact it names is stored."""
    data = entry.model_dump_json(by_alias=True).encode()
    if not store.put_pre_aot(principal.name, key, entry.artifact_key, data):
        store.count("pre_aot_refused")
        raise HTTPException(status_code=409, detail=f"artifact {entry.artifact_key} is not stored: "
                            "an entry must name a stored artifact")
    store.count("pre_aot_puts")
    return PreAotEntryOut(key=key, **entry.model_dump(by_alias=True))


@router.get("/pre-aot/{key}", response_model=PreAotEntryOut, responses={404: {}})
def get_entry(key: KeyPath, store: StoreDep, principal: ClientDep) -> PreAotEntryOut:
    """This principal's entry for `key`; 404 when it has none (whatever other principals have)."""
    data = store.get_pre_aot(principal.name, key)
    if data is None:
        store.count("pre_aot_misses")
        raise HTTPException(status_code=404, detail=f"no pre-AOT entry {key}")
    try:
        entry = PreAotEntry.model_validate_json(data)
    except ValidationError:
        log.warning("pre-AOT entry %s of %s is malformed; treating it as absent", key[:12], principal.name)
        store.count("pre_aot_misses")
        raise HTTPException(status_code=404, detail=f"no pre-AOT entry {key}") from None
    store.count("pre_aot_hits")
    return PreAotEntryOut(key=key, **entry.model_dump(by_alias=True))

"""A model's artifacts in one request: bundles (issue 24). `GET /v1/bundles/{key}` and `POST /v1/bundles`.

A bundle frames several artifacts as one body (compiler_core/bundle.py: a fixed prefix with its ETag,
a small JSON header, then the stored manifests and blobs as raw bytes; no base64, no JSON around
them). Its key is `bundle_key(keys)`, a hash of the sorted artifact keys, so that every rank of a
job computes it for the same model. `GET /v1/bundles/{key}` answers a stored bundle with one Redis
GET, nothing parsed (ETag and Cache-Control read off its prefix), so an HTTP cache can keep it too;
a 404 when none is stored. `POST /v1/bundles` with the keys answers the bundle, assembling it once
(per process, however many ask at once) from the artifacts and storing it when none is missing.

Note (consistency): a bundle is stored only while each member's manifest is the one framed, and is
deleted when a member is replaced (its tuned copy) or deleted (redis_scripts.STORE_BUNDLE). Its
Cache-Control is the single artifacts' rule over all members: `immutable` only when every one is.
Any principal with the client role reads it, as it reads the artifacts it holds (shared by the
cluster); the client checks each artifact's signature and digests, as for single hits.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from fxcc.compiler_core.bundle import BundledArtifact, Prefix, bundle_key, encode_bundle, stored_prefix
from fxcc.service.deps import SettingsDep, StoreDep, require
from fxcc.service.routes.artifacts import (
    IMMUTABLE,
    KEY_PATTERN,
    SUPERSEDABLE,
    Key,
    cache_control,
    etag_matches,
)
from fxcc.service.settings import ServiceSettings
from fxcc.service.store import Store

log = logging.getLogger("fxcc.service")

router = APIRouter(prefix="/v1", tags=["artifacts"], dependencies=[Depends(require("client"))])

MEDIA_TYPE = "application/x-fxcc-bundle"
_CHUNK = 16  # keys per Redis round trip while a bundle is assembled


class BundleRequest(BaseModel):
    """The keys of a model's graphs (or of a Dynamo package's artifacts)."""

    model_config = ConfigDict(extra="forbid")

    keys: list[Key] = Field(min_length=1, description="compile keys; at most FXCC_BATCH_MAX_KEYS")


@router.get("/bundles/{key}", responses={200: {"content": {MEDIA_TYPE: {}}}, 304: {}, 404: {}})
async def get_bundle(key: Annotated[str, Path(pattern=KEY_PATTERN)], store: StoreDep, request: Request) -> Response:
    """The stored bundle `key` (`bundle_key` of its artifact keys), as stored; 404 when there is none
    (POST /v1/bundles assembles it). With ETag and Cache-Control; a 304 for its ETag."""
    return _response(*await bundle_answer(store, key, request.headers.get("if-none-match")))


@router.post("/bundles", responses={200: {"content": {MEDIA_TYPE: {}}}, 413: {}})
async def post_bundle(body: BundleRequest, store: StoreDep, settings: SettingsDep, request: Request) -> Response:
    """The bundle of `keys`: stored, or assembled now (and stored when none of them is missing).
    Keys the cache lacks are listed as `missing`; those past FXCC_BUNDLE_MAX_BYTES as `rest`, for
    the bundle of their own. Over FXCC_BATCH_MAX_KEYS keys: 413."""
    keys = sorted(set(body.keys))
    if len(keys) > settings.batch_max_keys:
        raise HTTPException(status_code=413, detail=f"{len(keys)} keys in one bundle, over the limit of "
                            f"{settings.batch_max_keys} (FXCC_BATCH_MAX_KEYS); split the request")
    key = bundle_key(keys)
    data, complete = await store.get_bundle_async(key), True
    prefix = None if data is None else stored_prefix(data)
    if data is None or prefix is None:  # its look-ups count the hits and misses
        data, complete = await _assembled(request.app.state, store, key, keys, settings)
        prefix = stored_prefix(data)
    else:
        store.count_hits_async(prefix.artifacts)
    status, headers, answer = _answer(data, prefix, request.headers.get("if-none-match"))  # type: ignore[arg-type]
    if not complete:  # what is missing now may be compiled in a minute
        headers["Cache-Control"] = "no-store"
    return _response(status, headers, answer)


async def bundle_answer(store: Store, key: str, if_none_match: str | None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of `GET /v1/bundles/{key}`; HTTPException 404 when it is not stored."""
    data = await store.get_bundle_async(key)
    prefix = None if data is None else stored_prefix(data)
    if data is None or prefix is None:
        raise HTTPException(status_code=404, detail=f"no bundle {key}; POST /v1/bundles with its keys makes it")
    store.count_hits_async(prefix.artifacts)
    return _answer(data, prefix, if_none_match)


def _answer(data: bytes, prefix: Prefix, if_none_match: str | None) -> tuple[int, dict[str, str], bytes]:
    tag = f'"{prefix.etag}"'
    headers = {"ETag": tag, "Cache-Control": IMMUTABLE if prefix.immutable else SUPERSEDABLE}
    if if_none_match is not None and etag_matches(if_none_match, tag):
        return 304, headers, b""
    return 200, headers, data


def _response(status: int, headers: dict[str, str], body: bytes) -> Response:
    return Response(body, status_code=status, headers=headers, media_type=MEDIA_TYPE if body else None)


async def _assembled(state: object, store: Store, key: str, keys: list[str],
                     settings: ServiceSettings) -> tuple[bytes, bool]:
    """The bundle of `keys`, assembled once however many requests of this process ask meanwhile."""
    builds: dict[str, asyncio.Future] | None = getattr(state, "bundle_builds", None)
    if builds is None:
        builds = state.bundle_builds = {}  # type: ignore[attr-defined]
    build = builds.get(key)
    if build is None:
        build = builds[key] = asyncio.ensure_future(assemble(store, key, keys, settings))
        build.add_done_callback(lambda f: builds.pop(key, None) if builds.get(key) is f else None)
    return await asyncio.shield(build)


async def assemble(store: Store, key: str, keys: list[str], settings: ServiceSettings) -> tuple[bytes, bool]:
    """Frame the stored artifacts of `keys` (sorted) up to FXCC_BUNDLE_MAX_BYTES, and store the bundle
    unless one is missing (a bundle that says "missing" would outlive the compile that fills it).
    Returns the bundle and whether none was missing.

    Note: read in chunks, and no further once the bound is reached: what one request holds is
    bounded by bundle_max_bytes (plus one chunk)."""
    parts: list[BundledArtifact] = []
    missing: list[str] = []
    rest: list[str] = []
    seen: set[str] = set()
    size, immutable = 0, True
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start:start + _CHUNK]
        for i, (k, hit) in enumerate(zip(chunk, await store.fetch_hits_async(chunk))):
            if hit is None:
                missing.append(k)
                continue
            blobs = hit.blobs or []
            more = len(hit.manifest_json) + sum(len(b) for d, b in blobs if d not in seen)
            if parts and size + more > settings.bundle_max_bytes:
                rest = chunk[i:] + keys[start + _CHUNK:]
                break
            parts.append(BundledArtifact(k, hit.manifest_json, hit.signature, blobs))
            seen.update(d for d, _ in blobs)
            size += more
            immutable = immutable and cache_control(hit) == IMMUTABLE
        if rest:
            break
    data = encode_bundle(key, parts, missing, rest, immutable and not missing)
    if parts and not missing:
        try:
            stored = await store.put_bundle_async(key, data, [(p.key, p.manifest_json) for p in parts],
                                                  settings.bundle_ttl_s)
        except Exception as e:  # noqa: BLE001 - answered all the same; the next ask assembles it again
            log.warning("bundle %s not stored: %s: %s", key[:12], type(e).__name__, e)
        else:
            if not stored:
                log.info("bundle %s not stored: a member changed while it was assembled", key[:12])
    return data, not missing

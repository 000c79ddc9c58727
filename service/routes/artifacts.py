"""Cache hits: GET /v1/artifacts/{key} (one artifact) and POST /v1/artifacts/batch (a model's).

A hit answers the stored manifest JSON, its blobs (base64) and its signature as they are: the
service never parses or verifies them (the client checks the signature, then every digest). With
a strong `ETag` (a hash of manifest and signature) and `Cache-Control`, so that an ordinary HTTP
cache in front of the service can keep them (deploy/README.md): an artifact that nothing can
replace (tuned, or for the CPU interpreter) is `immutable`; an untuned CUDA one may still be
superseded by its tuned copy under the same key, so a cache keeps it a minute, then revalidates it
(a 304 while unchanged). `GET /v1/artifacts/access` (204) lets such a cache check a token.

Note: `GET /v1/artifacts/{key}` without a query string is served by `FastHits` (routes/hits.py),
an ASGI middleware ahead of FastAPI's router, with the same authentication and answers. Every other
form (`?blobs=0`, a malformed key) reaches the FastAPI route below, which builds the same answer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from fxcc.service.deps import SettingsDep, StoreDep, require
from fxcc.service.store import Hit, Store

log = logging.getLogger("fxcc.service")

router = APIRouter(prefix="/v1", tags=["artifacts"], dependencies=[Depends(require("client"))])

KEY_PATTERN = r"^[0-9a-f]{64}$"
KeyPath = Annotated[str, Path(pattern=KEY_PATTERN, description="compile key (sha256 hex)")]
Key = Annotated[str, Field(pattern=KEY_PATTERN)]

IMMUTABLE = "public, max-age=31536000, immutable"
# An untuned CUDA artifact: its tuned copy may replace it, so a cache keeps it a minute, then
# revalidates it (If-None-Match: a 304 while it is unchanged).
SUPERSEDABLE = "public, max-age=60"
_BATCH_CHUNK = 16  # keys per Redis round trip while a batch streams: bounds what one request holds


@router.get("/artifacts/access", status_code=204, response_class=Response)
async def artifacts_access() -> Response:
    """204 when the bearer token may read artifacts (401 or 403 otherwise): what an HTTP cache in
    front of the service asks before it serves a cached artifact (deploy/nginx-cache.conf)."""
    return Response(status_code=204)


@router.get("/artifacts/{key}", responses={200: {"content": {"application/json": {}}}, 304: {}, 404: {}})
async def get_artifact(
    key: KeyPath,
    store: StoreDep,
    request: Request,
    blobs: Annotated[bool, Query(description="include the blobs (base64); blobs=0 for the manifest only")] = True,
) -> Response:
    """`{"manifest": ..., "blobs": {digest: base64}, "signature": str | null}`. The signature is
    `ed25519:<key id>:<base64>`, the storing worker's Ed25519 signature over the manifest's canonical
    JSON (sorted keys, no spaces), or null when that worker signs nothing (clients refuse it then).
    With `ETag` and `Cache-Control`; `If-None-Match` with the current ETag is a 304."""
    status, headers, body = await hit_answer(store, key, blobs, request.headers.get("if-none-match"))
    return Response(body, status_code=status, headers=headers, media_type="application/json" if body else None)


class BatchRequest(BaseModel):
    """The keys of a model's graphs (or of a pre-AOT / Dynamo package's artifacts)."""

    model_config = ConfigDict(extra="forbid")

    keys: list[Key] = Field(min_length=1, description="compile keys; at most FXCC_BATCH_MAX_KEYS")
    blobs: bool = True


@router.post("/artifacts/batch", responses={200: {"content": {"application/x-ndjson": {}}}, 413: {}})
async def get_artifacts(body: BatchRequest, store: StoreDep, settings: SettingsDep) -> StreamingResponse:
    """Several artifacts in one request, streamed as JSON lines in the order asked (a key asked twice
    is answered once): `{"key": k, "manifest": ..., "blobs": ..., "signature": ...}` for a hit (the
    single GET's answer with its key), `{"key": k, "missing": true}` for a miss, and a last line
    `{"done": true, "hits": n, "missing": m, "not_sent": [keys]}`. `not_sent` lists the keys left
    once FXCC_BATCH_MAX_BYTES of artifacts were streamed (ask again for them); a stream without its
    `done` line was cut short (the store failed meanwhile). Over FXCC_BATCH_MAX_KEYS keys: 413."""
    if len(body.keys) > settings.batch_max_keys:
        raise HTTPException(status_code=413, detail=f"{len(body.keys)} keys in one batch, over the limit of "
                            f"{settings.batch_max_keys} (FXCC_BATCH_MAX_KEYS); split the request")
    return await stream_artifacts(store, list(dict.fromkeys(body.keys)), body.blobs, settings.batch_max_bytes)


async def stream_artifacts(store: Store, keys: list[str], blobs: bool, max_bytes: int) -> StreamingResponse:
    """The batch answer for `keys` (checked and bounded by the caller). The first chunk is read
    before the answer starts, so that a store that is down is a 503, not a stream cut short.

    Note: the hook for other key sources. A route that knows a pre-AOT or Dynamo package's
    artifact keys (after checking the package is the caller's) answers with this, so that a
    warm start fetches a whole package in one request."""
    first = await store.fetch_hits_async(keys[:_BATCH_CHUNK], blobs=blobs)
    return StreamingResponse(_lines(store, keys, first, blobs, max_bytes), media_type="application/x-ndjson")


async def _lines(store: Store, keys: list[str], first: list[Hit | None], blobs: bool,
                 max_bytes: int) -> AsyncIterator[bytes]:
    """The lines of each chunk of keys, one write per chunk (a write per artifact cost more than
    the artifact)."""
    sent = hits = missing = 0
    for start in range(0, len(keys), _BATCH_CHUNK):
        chunk = keys[start:start + _BATCH_CHUNK]
        try:
            found = first if start == 0 else await store.fetch_hits_async(chunk, blobs=blobs)
        except Exception as e:  # noqa: BLE001 - the answer has started: end it without its done line
            log.warning("batch of %d artifacts cut short after %d: %s: %s", len(keys), start, type(e).__name__, e)
            return
        out = []
        for i, (key, hit) in enumerate(zip(chunk, found)):
            if hit is not None and b"\n" in hit.manifest_json:  # never written so; it would split its line
                log.warning("manifest %s in the store holds a newline; answered as missing", key[:12])
                hit = None
            if hit is None:
                missing += 1
                out.append(b'{"key":"%s","missing":true}\n' % key.encode())
                continue
            line = hit_json(hit, key) + b"\n"
            if sent + len(line) > max_bytes:
                yield b"".join(out) + _done_line(hits, missing, keys[start + i:])
                return
            sent += len(line)
            hits += 1
            out.append(line)
        yield b"".join(out)
    yield _done_line(hits, missing, [])


def _done_line(hits: int, missing: int, not_sent: list[str]) -> bytes:
    return json.dumps({"done": True, "hits": hits, "missing": missing, "not_sent": not_sent},
                      separators=(",", ":")).encode() + b"\n"


async def hit_answer(store: Store, key: str, blobs: bool, if_none_match: str | None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of a single GET: 200 with the hit, 304 when `if_none_match` names
    its ETag; HTTPException 404 for a miss."""
    [hit] = await store.fetch_hits_async([key], blobs=blobs)
    if hit is None:
        raise HTTPException(status_code=404, detail=f"no artifact {key}")
    tag = etag(hit, blobs)
    headers = {"ETag": tag, "Cache-Control": cache_control(hit)}
    if if_none_match is not None and etag_matches(if_none_match, tag):
        return 304, headers, b""
    return 200, headers, hit_json(hit)


def hit_json(hit: Hit, key: str | None = None) -> bytes:
    """The answer's JSON, built around the stored manifest bytes (never parsed here). Digests came
    out of the manifest as hex by the lookup script's pattern; base64 needs no escaping."""
    parts = [b'{"key":"%s",' % key.encode() if key is not None else b"{", b'"manifest":', hit.manifest_json]
    if hit.blobs is not None:
        parts.append(b',"blobs":{')
        parts.append(b",".join(b'"%s":"%s"' % (d.encode(), base64.b64encode(b)) for d, b in hit.blobs))
        parts.append(b"}")
    parts += [b',"signature":', json.dumps(hit.signature).encode(), b"}"]
    return b"".join(parts)


def etag(hit: Hit, blobs: bool) -> str:
    """A strong ETag: the manifest names every blob by digest, so manifest and signature pin the answer."""
    h = hashlib.blake2b(hit.manifest_json, digest_size=16)
    h.update(b"\0" + (hit.signature or "").encode())
    return f'"{h.hexdigest()}{"" if blobs else "-m"}"'


def etag_matches(if_none_match: str, tag: str) -> bool:
    if if_none_match.strip() == "*":
        return True
    return any(t.strip().removeprefix("W/") == tag for t in if_none_match.split(","))


def cache_control(hit: Hit) -> str:
    """`immutable` unless a tuned copy may still replace this artifact (an untuned CUDA one).

    Note: read off the manifest's bytes, not its parsed form: pydantic writes `"tuned":` once, at
    the top level, and the target first as `{"kind":...`. Anything else (a manifest written
    otherwise) gets the safe answer, the short one."""
    m = hit.manifest_json
    final = b'"tuned":true' in m or b'"target":{"kind":"interpret"' in m
    return IMMUTABLE if final else SUPERSEDABLE

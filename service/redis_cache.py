"""RedisCache: artifacts as content-addressed blobs plus a manifest written last, with counters."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import time
from dataclasses import replace
from typing import Any

import redis
import redis.asyncio as aioredis

from fxcc.compiler_core.artifact import Artifact, ArtifactManifest, manifest_from_json, supersedes
from fxcc.compiler_core.errors import ArtifactError
from fxcc.service import redis_scripts as lua
from fxcc.service.keys import RedisKeys
from fxcc.service.redis_pipelined import CONNECT_TIMEOUT_S, RESPONSE_TIMEOUT_S, PipelinedRedis, supports
from fxcc.service.store import MINUTES_KEPT, ArtifactTooLarge, Hit, StoredArtifact

log = logging.getLogger("fxcc.service.redis")

_PURGE_BATCH = 500
COUNT_EVERY_S = 0.1  # bundle hits are added to the counter this often
_ASYNC_POOL = 256  # connections of one API process to a cache Redis that PipelinedRedis cannot reach


class RedisCache:
    """The artifact half of RedisStore, on the cache's Redis (`self.c`), which may be the queue's."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, max_artifact_bytes: int, url: str,
                 pre_aot_ttl_s: int = 30 * 86_400, bundle_cache: BundleCache | None = None) -> None:
        self.c = client
        self.k = keys
        self.url = url
        self.max_artifact_bytes = max_artifact_bytes
        self.pre_aot_ttl_s = pre_aot_ttl_s
        self._lookup = self.c.register_script(lua.LOOKUP)
        self._put_pre_aot = self.c.register_script(lua.PUT_PRE_AOT)
        # The cache-hit route's own asyncio connection pool, made in the event loop that uses it.
        self._async: PipelinedRedis | aioredis.Redis | None = None
        self._alookup: Any = None
        self._astore_bundle: Any = None
        self._store_bundle_sha = self.c.register_script(lua.STORE_BUNDLE).sha
        self._bundle_reads: dict[str, asyncio.Future] = {}
        self._bundles = bundle_cache or BundleCache(0, 0)
        self._uncounted = 0  # hits served from bundles, not yet added to the counter

    def get_manifest(self, key: str) -> ArtifactManifest | None:
        return _parse(key, self.c.get(self.k.manifest(key)))

    def lookup_manifest(self, key: str) -> ArtifactManifest | None:
        found = self.fetch_artifact(key, blobs=False)
        return None if found is None else found.manifest

    def get_artifact(self, key: str) -> Artifact | None:
        found = self.fetch_artifact(key)
        return None if found is None or found.blobs is None else Artifact(found.manifest, found.blobs)

    def fetch_artifact(self, key: str, *, blobs: bool = True, count: bool = True) -> StoredArtifact | None:
        # Note: one round trip for a hit; the script finds blob digests by pattern, so what it
        # returns is checked against the parsed manifest, and anything it missed is fetched here.
        reply = self._lookup(keys=self._lookup_keys(key), args=self._lookup_args(blobs, count))
        found, missing = self._unpack(key, reply, blobs)
        if found is None or found.blobs is None:
            return found
        extra = dict(zip(missing, self.c.mget([self.k.blob(d) for d in missing]))) if missing else {}
        return _verified(key, found, extra)

    async def fetch_hits_async(self, keys: list[str], *, blobs: bool = True) -> list[Hit | None]:
        """Each key's LOOKUP, all in one round trip, pipelined with the process's other hits.

        Note: nothing is parsed here (the client verifies the signature and every digest). The
        script finds blob digests in the manifest's text; a manifest naming a blob that is gone is
        a miss there."""
        args = self._lookup_args(blobs, True)
        calls = [(self._lookup_keys(key), args) for key in keys]
        client = self._async_client()
        if isinstance(client, PipelinedRedis):
            replies = await client.evalsha_many(self._lookup.sha, lua.LOOKUP, calls)
        else:  # TLS, unix sockets: redis-py
            if self._alookup is None:
                self._alookup = client.register_script(lua.LOOKUP)
            pipe = client.pipeline(transaction=False)
            for call_keys, call_args in calls:
                await self._alookup(keys=call_keys, args=call_args, client=pipe)
            replies = await pipe.execute()
        return [_hit(reply, blobs) for reply in replies]

    def _async_client(self) -> PipelinedRedis | aioredis.Redis:
        if self._async is None:
            self._async = (PipelinedRedis(self.url) if supports(self.url) else
                           aioredis.Redis.from_url(self.url, protocol=2, max_connections=_ASYNC_POOL,
                                                   socket_timeout=RESPONSE_TIMEOUT_S,
                                                   socket_connect_timeout=CONNECT_TIMEOUT_S))
        return self._async

    async def get_bundle_async(self, key: str) -> bytes | None:
        """The stored bundle `key` (compiler_core/bundle.py), unparsed; None when there is none.

        Note: the asks of one process for one bundle while a read of it is under way share that
        read, and what was read is kept FXCC_BUNDLE_CACHE_S (BundleCache): a thousand ranks asking
        for a model at once cost Redis a read a second, and this process one copy of the bundle,
        however many connections it is answered on."""
        held = self._bundles.get(key)
        if held is not None:
            return held
        reading = self._bundle_reads.get(key)
        if reading is None:
            reading = self._bundle_reads[key] = asyncio.ensure_future(self._read_bundle(key))
            reading.add_done_callback(lambda f: self._bundle_reads.pop(key, None)
                                      if self._bundle_reads.get(key) is f else None)
        return await asyncio.shield(reading)

    async def _read_bundle(self, key: str) -> bytes | None:
        client = self._async_client()
        if isinstance(client, PipelinedRedis):
            data = (await client.execute(("GET", self.k.bundle(key))))[0]
        else:
            data = await client.get(self.k.bundle(key))
        if data is not None:
            self._bundles.put(key, data)
        return data

    def count_hits_async(self, n: int) -> None:
        """Add `n` to the hit counter within COUNT_EVERY_S, without waiting (a bundle's artifacts,
        once served): one HINCRBY for all the hits of that while (one per hit cost 10% of it)."""
        self._uncounted += n
        if self._uncounted == n:
            asyncio.get_running_loop().call_later(COUNT_EVERY_S, self._count_hits)

    def _count_hits(self) -> None:
        n, self._uncounted = self._uncounted, 0
        client = self._async_client()
        if isinstance(client, PipelinedRedis):
            client.send_only("HINCRBY", self.k.cache_counters, "hits", n)
        else:
            task = asyncio.ensure_future(client.hincrby(self.k.cache_counters, "hits", n))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def put_bundle_async(self, key: str, data: bytes, members: list[tuple[str, bytes]],
                               ttl_s: int) -> bool:
        """Store bundle `key` for `ttl_s` if each (artifact key, manifest JSON) in `members` is still
        what the cache holds (redis_scripts.STORE_BUNDLE); whether it was stored."""
        keys = [self.k.bundle(key), *(self.k.manifest(k) for k, _ in members),
                *(self.k.bundles_of(k) for k, _ in members)]
        args = [data, ttl_s, *(hashlib.sha1(m).hexdigest() for _, m in members)]
        client = self._async_client()
        if isinstance(client, PipelinedRedis):
            [stored] = await client.evalsha_many(self._store_bundle_sha, lua.STORE_BUNDLE, [(keys, args)])
        else:
            if self._astore_bundle is None:
                self._astore_bundle = client.register_script(lua.STORE_BUNDLE)
            stored = await self._astore_bundle(keys=keys, args=args)
        return bool(stored)

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None

    def _lookup_keys(self, key: str) -> list[str]:
        return [self.k.manifest(key), self.k.signature(key), self.k.cache_counters]

    def _lookup_args(self, blobs: bool, count: bool) -> list[str]:
        return [self.k.blob(""), "1" if blobs else "0", "1" if count else "0"]

    @staticmethod
    def _unpack(key: str, reply: list[bytes], blobs: bool) -> tuple[StoredArtifact | None, list[str]]:
        """The LOOKUP script's answer as a StoredArtifact (blobs as found, not yet verified) and
        the digests its manifest names that the script did not return."""
        if not reply:
            return None, []
        manifest = _parse(key, reply[0])
        if manifest is None:
            return None, []
        signature = reply[1].decode() or None
        if not blobs:
            return StoredArtifact(manifest, reply[0], None, signature), []
        got = {reply[i].decode(): reply[i + 1] for i in range(2, len(reply), 2)}
        missing = sorted({ref.digest for ref in manifest.blob_refs()} - got.keys())
        return StoredArtifact(manifest, reply[0], got, signature), missing

    def get_signature(self, key: str) -> str | None:
        sig = self.c.get(self.k.signature(key))
        return None if sig is None else sig.decode()

    def put_artifact(self, artifact: Artifact, signature: str | None = None) -> None:
        artifact.verify()
        m = artifact.manifest
        manifest_json = artifact.manifest_json()
        size = len(manifest_json) + sum(len(b) for b in artifact.blobs.values())
        if size > self.max_artifact_bytes:
            self.count("rejected")
            raise ArtifactTooLarge(f"artifact {m.key[:12]} has {size} bytes, over the limit of "
                                   f"{self.max_artifact_bytes} (FXCC_MAX_ARTIFACT_BYTES)")
        if not supersedes(m, _parse(m.key, self.c.get(self.k.manifest(m.key)))):
            return  # a tuned artifact supersedes an untuned one, never the other way round
        pipe = self.c.pipeline(transaction=False)
        blobs = list(artifact.blobs.items())
        for d, data in blobs:
            pipe.set(self.k.blob(d), data, nx=True)
        added = sum(len(data) for (_, data), new in zip(blobs, pipe.execute()) if new)
        self._put_manifest(m, manifest_json, signature, added)

    def _put_manifest(self, m: ArtifactManifest, manifest_json: bytes, signature: str | None,
                      added: int) -> None:
        """Write the manifest (and its signature) unless the stored one supersedes it.

        Note: the manifest goes in only after every blob is acknowledged: no torn entries. Its
        signature goes in the same MULTI, so a reader never pairs a manifest with another's
        signature. The supersede check WATCHes the manifest key: an untuned put that raced a
        tuned one retries its check, and so can never land last.
        """
        mkey, holding = self.k.manifest(m.key), self.k.bundles_of(m.key)
        with self.c.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(mkey, holding)
                    old = pipe.get(mkey)
                    if not supersedes(m, _parse(m.key, old)):
                        pipe.unwatch()
                        return
                    bundles = pipe.smembers(holding)
                    pipe.multi()
                    pipe.delete(holding, *bundles)  # bundles framing the manifest replaced here
                    if signature is None:
                        pipe.delete(self.k.signature(m.key))
                        pipe.set(mkey, manifest_json)
                    else:
                        pipe.mset({mkey: manifest_json, self.k.signature(m.key): signature})
                    pipe.sadd(self.k.manifest_index, m.key)
                    pipe.hincrby(self.k.cache_counters, "puts", 1)
                    pipe.hincrby(self.k.cache_counters, "bytes", added + len(manifest_json) - len(old or b""))
                    pipe.execute()
                    return
                except redis.WatchError:
                    continue  # another put changed the manifest meanwhile: check again

    def list_artifacts(self, limit: int) -> list[str]:
        keys: list[str] = []
        for member in self.c.sscan_iter(self.k.manifest_index, count=1000):
            keys.append(member.decode())
            if len(keys) >= limit:
                break
        return sorted(keys)

    def delete_artifact(self, key: str) -> bool:
        """Drop the manifest, and the bundles holding it (its blobs may be shared by other
        artifacts; purge drops those)."""
        holding = self.k.bundles_of(key)
        with self.c.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(holding)  # a bundle stored meanwhile names it there: check again
                    manifest = pipe.get(self.k.manifest(key))
                    bundles = pipe.smembers(holding)
                    pipe.multi()
                    pipe.delete(self.k.manifest(key), self.k.signature(key))
                    pipe.delete(holding, *bundles)
                    pipe.srem(self.k.manifest_index, key)
                    if manifest is not None:
                        pipe.hincrby(self.k.cache_counters, "bytes", -len(manifest))
                    return bool(pipe.execute()[0])
                except redis.WatchError:
                    continue

    def purge_cache(self) -> int:
        removed = 0
        # pre-AOT entries go too: every artifact they could name is gone
        for pattern in (self.k.manifest("*"), self.k.signature("*"), self.k.blob("*"), self.k.pre_aot("*", "*"),
                        self.k.package("*", "*"), self.k.bundle("*"), self.k.bundles_of("*")):
            batch: list[bytes] = []
            for name in self.c.scan_iter(match=pattern, count=1000):
                batch.append(name)
                if len(batch) >= _PURGE_BATCH:
                    n = self.c.delete(*batch)
                    removed += n if pattern == self.k.manifest("*") else 0
                    batch = []
            if batch:
                n = self.c.delete(*batch)
                removed += n if pattern == self.k.manifest("*") else 0
        pipe = self.c.pipeline(transaction=True)
        pipe.delete(self.k.manifest_index)
        pipe.hset(self.k.cache_counters, "bytes", 0)
        pipe.execute()
        return removed

    # Note: pre-AOT entries live next to the artifacts they name (the cache's Redis), so that the
    # check "is the artifact there?" and the write are one atomic script; each expires
    # pre_aot_ttl_s after it was last written or read, and an allkeys-lru cache may evict it sooner.
    def put_pre_aot(self, principal: str, key: str, artifact_key: str, entry_json: bytes) -> bool:
        keys = [self.k.manifest(artifact_key), self.k.pre_aot(principal, key)]
        return bool(self._put_pre_aot(keys=keys, args=[entry_json, self.pre_aot_ttl_s]))

    def get_pre_aot(self, principal: str, key: str) -> bytes | None:
        return self.c.getex(self.k.pre_aot(principal, key), ex=self.pre_aot_ttl_s)

    # Dynamo packages: opaque bytes per principal, expiring as pre-AOT entries do.
    def put_package(self, principal: str, key: str, data: bytes) -> None:
        self.c.set(self.k.package(principal, key), data, ex=self.pre_aot_ttl_s)

    def get_package(self, principal: str, key: str) -> bytes | None:
        return self.c.getex(self.k.package(principal, key), ex=self.pre_aot_ttl_s)

    def count(self, counter: str, n: int = 1) -> None:
        self.c.hincrby(self.k.cache_counters, counter, n)

    def counters(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.c.hgetall(self.k.cache_counters).items()}

    def cache_entries(self) -> int:
        return int(self.c.scard(self.k.manifest_index))

    def record_minute(self, minute: int, counters: dict[str, int]) -> None:
        self.c.set(self.k.stats_minute(minute), json.dumps(counters), nx=True, ex=MINUTES_KEPT * 60)

    def minutes(self, first: int, last: int) -> list[dict[str, int]]:
        wanted = list(range(max(first, last - MINUTES_KEPT), last + 1))
        found = self.c.mget([self.k.stats_minute(m) for m in wanted]) if wanted else []
        return [dict(json.loads(v), minute=m) for m, v in zip(wanted, found) if v is not None]


class BundleCache:
    """The bundles an API process served lately: each kept `ttl_s`, at most `max_bytes` in all (the
    oldest go first; none larger than a quarter of it). A miss is never kept."""

    def __init__(self, ttl_s: float, max_bytes: int) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.held: collections.OrderedDict[str, tuple[float, bytes]] = collections.OrderedDict()
        self.size = 0

    def get(self, key: str) -> bytes | None:
        held = self.held.get(key)
        if held is None:
            return None
        if held[0] < time.monotonic():
            self._drop(key)
            return None
        return held[1]

    def put(self, key: str, data: bytes) -> None:
        if self.ttl_s <= 0 or len(data) * 4 > self.max_bytes:
            return
        self._drop(key)
        self.held[key] = (time.monotonic() + self.ttl_s, data)
        self.size += len(data)
        while self.size > self.max_bytes:
            self._drop(next(iter(self.held)))

    def _drop(self, key: str) -> None:
        held = self.held.pop(key, None)
        if held is not None:
            self.size -= len(held[1])


def _hit(reply: list[bytes], blobs: bool) -> Hit | None:
    if not reply:
        return None
    signature = reply[1].decode(errors="replace") or None  # garbage there: the client refuses it
    if not blobs:
        return Hit(reply[0], signature, None)
    return Hit(reply[0], signature, [(reply[i].decode(), reply[i + 1]) for i in range(2, len(reply), 2)])


def _verified(key: str, found: StoredArtifact, extra: dict[str, bytes | None]) -> StoredArtifact | None:
    """`found` with exactly the blobs its manifest names, each checked against its digest."""
    blobs = {**(found.blobs or {}), **{d: v for d, v in extra.items() if v is not None}}
    digests = {ref.digest for ref in found.manifest.blob_refs()}
    art = Artifact(found.manifest, {d: blobs[d] for d in digests if d in blobs})
    try:
        art.verify()
    except ArtifactError as e:
        log.warning("artifact %s is broken in Redis: %s", key[:12], e.message)
        return None
    return replace(found, blobs=art.blobs)


def _parse(key: str, data: bytes | None) -> ArtifactManifest | None:
    if data is None:
        return None
    try:
        return manifest_from_json(data)
    except ArtifactError:
        log.warning("manifest %s in Redis is malformed; treating it as absent", key[:12])
        return None

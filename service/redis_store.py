"""RedisStore: artifacts as blobs + manifest, jobs as hashes, the queue as two streams with one group."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import replace
from typing import Any

import redis

from compiler_core.artifact import Artifact, ArtifactManifest, manifest_from_json
from compiler_core.errors import ArtifactError
from service.keys import GROUP, STREAM_FIELD, RedisKeys
from service.settings import ServiceSettings
from service.store import Claim, JobError, JobRecord, JobState, Priority, Submitted, now_s

log = logging.getLogger("fxcc.service.redis")

# Note: submit is one script so that "cached?", "a live job for this key?" and "queue a new
# job" happen atomically; two identical requests can never both create a job.
_SUBMIT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {'cached', ''} end
local existing = redis.call('GET', KEYS[2])
if existing then
  local job = ARGV[2] .. existing
  local state = redis.call('HGET', job, 'state')
  if state == 'queued' and ARGV[5] == 'interactive' and redis.call('HGET', job, 'priority') == 'precompile' then
    -- A user now waits on a background job: queue it again where workers look first.
    redis.call('XADD', KEYS[5], '*', 'job_id', existing)
    redis.call('HSET', job, 'priority', 'interactive')
    return {'promoted', existing}
  end
  if state == 'queued' or state == 'compiling' then return {'joined', existing} end
end
redis.call('HSET', KEYS[3], unpack(ARGV, 6))
local entry = redis.call('XADD', KEYS[4], '*', 'job_id', ARGV[1])
redis.call('HSET', KEYS[3], 'stream', KEYS[4], 'entry_id', entry)
redis.call('EXPIRE', KEYS[3], ARGV[4])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
return {'created', ARGV[1]}
"""

# A fresh delivery starts only a queued job (a promoted job has two entries; the second one
# finds it compiling or finished); a takeover of a dead worker's entry also starts a compiling one.
_START = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' and not (ARGV[3] == '1' and state == 'compiling') then return 0 end
redis.call('HSET', KEYS[1], 'state', 'compiling', 'started_at', ARGV[1], 'worker', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'attempt', 1)
return 1
"""

# Finishing also drops the single-flight entry, but only if it still points at this job.
_FINISH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[1], ARGV[2])
local inflight = ARGV[3] .. redis.call('HGET', KEYS[1], 'key')
if redis.call('GET', inflight) == ARGV[1] then redis.call('DEL', inflight) end
return 1
"""


class RedisStore:
    """The cluster store. One instance per process; redis-py's pool makes it thread-safe."""

    mode = "redis"

    def __init__(self, settings: ServiceSettings, client: redis.Redis | None = None) -> None:
        if client is None:
            if not settings.redis_url:
                raise ValueError("RedisStore needs FXCC_REDIS_URL")
            client = redis.Redis.from_url(settings.redis_url, protocol=2, health_check_interval=30)
        self.r = client
        self.settings = settings
        self.k = RedisKeys(settings.redis_prefix)
        self._submit = self.r.register_script(_SUBMIT)
        self._start = self.r.register_script(_START)
        self._finish = self.r.register_script(_FINISH)
        self._groups_ready = False

    def ping(self) -> None:
        self.r.ping()

    def close(self) -> None:
        self.r.close()

    # ------------------------------------------------------------ artifacts

    def get_manifest(self, key: str) -> ArtifactManifest | None:
        data = self.r.get(self.k.manifest(key))
        if data is None:
            return None
        try:
            return manifest_from_json(data)
        except ArtifactError:
            log.warning("manifest %s in Redis is malformed; treating it as absent", key[:12])
            return None

    def get_artifact(self, key: str) -> Artifact | None:
        manifest = self.get_manifest(key)
        if manifest is None:
            return None
        digests = sorted({ref.digest for ref in manifest.blob_refs()})
        values = self.r.mget([self.k.blob(d) for d in digests]) if digests else []
        blobs = {d: v for d, v in zip(digests, values) if v is not None}
        art = Artifact(manifest, blobs)
        try:
            art.verify()
        except ArtifactError as e:
            log.warning("artifact %s is broken in Redis: %s", key[:12], e.message)
            return None
        return art

    def put_artifact(self, artifact: Artifact) -> None:
        artifact.verify()
        m = artifact.manifest
        old = self.get_manifest(m.key)
        if old is not None and old.tuned and not m.tuned:
            return  # a tuned artifact supersedes an untuned one, never the other way round
        pipe = self.r.pipeline(transaction=False)
        for d, data in artifact.blobs.items():
            pipe.set(self.k.blob(d), data, nx=True)
        pipe.execute()
        # Note: the manifest goes in only after every blob is acknowledged: no torn entries.
        self.r.set(self.k.manifest(m.key), artifact.manifest_json())
        self.count("puts")

    def count(self, counter: str) -> None:
        self.r.hincrby(self.k.cache_counters, counter, 1)

    def counters(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.r.hgetall(self.k.cache_counters).items()}

    # ------------------------------------------------------------ jobs

    def submit(self, key: str, request_json: str, priority: Priority) -> Submitted:
        job_id = uuid.uuid4().hex
        fields = {
            "id": job_id, "key": key, "state": JobState.QUEUED.value, "priority": priority,
            "created_at": repr(now_s()), "attempt": "0", "request": request_json,
        }
        flat = [x for kv in fields.items() for x in kv]
        keys = [self.k.manifest(key), self.k.inflight(key), self.k.job(job_id), self.k.stream(priority),
                self.k.interactive]
        args = [job_id, self.k.job(""), self.settings.inflight_ttl_s * 1000, self.settings.job_ttl_s, priority]
        self._ensure_groups()
        outcome, got = self._submit(keys=keys, args=args + flat)
        if outcome == b"cached":
            manifest = self.get_manifest(key)
            if manifest is not None:
                return Submitted(manifest=manifest)
            return self.submit(key, request_json, priority)  # removed meanwhile: queue after all
        return Submitted(job_id=got.decode(), created=outcome == b"created")

    def get_job(self, job_id: str) -> JobRecord | None:
        h = self.r.hgetall(self.k.job(job_id))
        if not h or b"state" not in h:
            return None
        return _record(h)

    def get_request(self, job_id: str) -> str | None:
        data = self.r.hget(self.k.job(job_id), "request")
        return None if data is None else data.decode()

    def mark_compiling(self, job_id: str, worker: str, *, takeover: bool = False) -> JobRecord | None:
        if not self._start(keys=[self.k.job(job_id)], args=[repr(now_s()), worker, "1" if takeover else "0"]):
            return None
        return self.get_job(job_id)

    def mark_done(self, job_id: str, stats: dict[str, Any]) -> None:
        self._finished(job_id, state=JobState.DONE.value, stats=json.dumps(stats), error="")

    def mark_failed(self, job_id: str, error: JobError) -> None:
        self._finished(job_id, state=JobState.FAILED.value, error=error.model_dump_json(), stats="")

    def _finished(self, job_id: str, **fields: str) -> None:
        fields["finished_at"] = repr(now_s())
        flat = [x for kv in fields.items() for x in kv]
        args = [job_id, self.settings.job_ttl_s, self.k.inflight("")]
        self._finish(keys=[self.k.job(job_id)], args=args + flat)

    # ------------------------------------------------------------ queue

    def _ensure_groups(self) -> None:
        if self._groups_ready:
            return
        for stream in self.k.streams():
            try:
                # From id 0, so that jobs queued before any worker existed are delivered too.
                self.r.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except redis.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise
        self._groups_ready = True

    def claim(self, consumer: str, block_ms: int) -> list[Claim]:
        try:
            return self._claim(consumer, block_ms)
        except redis.ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            # The streams were deleted under us (FLUSHDB, an operator): make them again.
            self._groups_ready = False
            return self._claim(consumer, block_ms)

    def _claim(self, consumer: str, block_ms: int) -> list[Claim]:
        self._ensure_groups()
        claims = self._reclaim_stuck(consumer)
        if claims:
            return claims
        for stream in self.k.streams():
            claims = self._read(consumer, {stream: ">"}, block_ms=None)
            if claims:
                return claims
        # Nothing waiting: block on both streams; if both deliver, interactive comes first.
        return self._read(consumer, {s: ">" for s in self.k.streams()}, block_ms=block_ms)

    def _read(self, consumer: str, streams: dict[str, str], block_ms: int | None) -> list[Claim]:
        reply = self.r.xreadgroup(GROUP, consumer, streams, count=1, block=block_ms)
        found: dict[str, list[Claim]] = {}
        for stream, entries in reply or []:
            name = stream.decode()
            found[name] = [c for c in (self._entry(name, consumer, e) for e in entries) if c]
        return [c for s in self.k.streams() for c in found.get(s, [])]

    def _reclaim_stuck(self, consumer: str) -> list[Claim]:
        for stream in self.k.streams():
            reply = self.r.xautoclaim(stream, GROUP, consumer, self.settings.claim_idle_ms,
                                      start_id="0-0", count=1)
            claims = [replace(c, reclaimed=True) for c in (self._entry(stream, consumer, e) for e in reply[1]) if c]
            if claims:
                log.warning("reclaimed job %s from a worker idle for over %d ms",
                            claims[0].job_id, self.settings.claim_idle_ms)
                return claims
        return []

    def _entry(self, stream: str, consumer: str, entry: Any) -> Claim | None:
        entry_id, fields = entry
        entry_id = entry_id.decode()
        job_id = (fields or {}).get(STREAM_FIELD.encode())
        if job_id is None:
            self.r.xack(stream, GROUP, entry_id)  # not one of ours (or trimmed): drop it
            return None
        return Claim(job_id=job_id.decode(), stream=stream, entry_id=entry_id, consumer=consumer)

    def ack(self, claim: Claim) -> None:
        # One group reads the streams, so an acknowledged entry is dead weight: delete it, and
        # a stream's length stays the number of jobs waiting or running.
        pipe = self.r.pipeline(transaction=False)
        pipe.xack(claim.stream, GROUP, claim.entry_id)
        pipe.xdel(claim.stream, claim.entry_id)
        pipe.execute()

    def queue_depths(self) -> dict[str, dict[str, int]]:
        self._ensure_groups()
        out = {}
        for priority in ("interactive", "precompile"):
            stream = self.k.stream(priority)
            running = self.r.xpending(stream, GROUP)["pending"]
            out[priority] = {"waiting": max(self.r.xlen(stream) - running, 0), "running": running}
        return out

    def workers(self) -> list[dict[str, Any]]:
        names = sorted(self.r.scan_iter(match=self.k.worker("*"), count=1000))
        values = self.r.mget(names) if names else []
        return [json.loads(v) for v in values if v is not None]

    def forget_worker(self, worker: str) -> None:
        self.r.delete(self.k.worker(worker))

    def heartbeat(self, worker: str, info: dict[str, Any], claims: list[Claim]) -> None:
        """Renew the worker's TTL key and reset the idle time of the entries it is working on."""
        pipe = self.r.pipeline(transaction=False)
        pipe.set(self.k.worker(worker), json.dumps(info), ex=self.settings.worker_ttl_s)
        for c in claims:
            pipe.xclaim(c.stream, GROUP, c.consumer, 0, [c.entry_id], justid=True)
        pipe.execute()


def _record(h: dict[bytes, bytes]) -> JobRecord:
    s = {k.decode(): v.decode() for k, v in h.items()}

    def opt_float(name: str) -> float | None:
        return float(s[name]) if s.get(name) else None

    return JobRecord(
        id=s["id"], key=s["key"], state=JobState(s["state"]), priority=s["priority"],
        created_at=float(s["created_at"]), started_at=opt_float("started_at"),
        finished_at=opt_float("finished_at"), worker=s.get("worker") or None,
        attempt=int(s.get("attempt", "0")),
        error=JobError.model_validate_json(s["error"]) if s.get("error") else None,
        stats=json.loads(s["stats"]) if s.get("stats") else None,
    )

"""RedisStore: jobs as hashes, the queue as two compile streams and one tune stream per GPU arch, API
tokens; artifacts via RedisCache."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import redis

from fxcc.service import redis_scripts as lua
from fxcc.service.keys import STREAM_FIELD, RedisKeys
from fxcc.service.redis_cache import BundleCache, RedisCache
from fxcc.service.settings import ServiceSettings
from fxcc.service.store import (
    ANONYMOUS,
    PRIORITIES,
    BuildEntry,
    CancelOutcome,
    Claim,
    JobError,
    JobRecord,
    JobStage,
    JobState,
    Priority,
    QueueFull,
    QuotaExceeded,
    Submitted,
    TokenRecord,
    aborted_by,
    now_s,
    state_of,
)

log = logging.getLogger("fxcc.service.redis")

# At most this many recent jobs are read to answer a filtered GET /v1/jobs, and counted per state
# for /v1/stats and /metrics (which dashboards poll every second).
RECENT_WINDOW = 1000
# A principal over a quota has its charges recounted from its jobs at most this often (RECOUNT).
RECOUNT_EVERY_S = 30


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, protocol=2, health_check_interval=30)


class RedisStore(RedisCache):
    """The cluster store. One instance per process; redis-py's pools make it thread-safe.

    `self.r` is the queue's Redis (jobs, streams, heartbeats, tokens); `self.c` the cache's.
    """

    mode = "redis"

    def __init__(self, settings: ServiceSettings, client: redis.Redis | None = None,
                 cache_client: redis.Redis | None = None) -> None:
        if client is None:
            if not settings.redis_url:
                raise ValueError("RedisStore needs FXCC_REDIS_URL")
            client = connect(settings.redis_url)
        if cache_client is None:
            separate = settings.cache_redis_url and settings.cache_redis_url != settings.redis_url
            cache_client = connect(settings.cache_redis_url) if separate else client
        keys = RedisKeys(settings.redis_prefix)
        super().__init__(cache_client, keys, settings.max_artifact_bytes, settings.cache_url or "",
                         pre_aot_ttl_s=settings.pre_aot_ttl_s,
                         bundle_cache=BundleCache(settings.bundle_cache_s, settings.bundle_cache_bytes))
        self.r = client
        self.settings = settings
        self._submit = self.r.register_script(lua.SUBMIT)
        self._submit_tune = self.r.register_script(lua.SUBMIT_TUNE)
        self._start = self.r.register_script(lua.START)
        self._stage = self.r.register_script(lua.STAGE)
        self._finish = self.r.register_script(lua.FINISH)
        self._retry = self.r.register_script(lua.RETRY)
        self._cancel = self.r.register_script(lua.CANCEL)
        self._renew = self.r.register_script(lua.RENEW)
        self._recount = self.r.register_script(lua.RECOUNT)
        self._groups_ready: set[str] = set()

    def ping(self) -> None:
        self.r.ping()
        if self.c is not self.r:
            self.c.ping()

    def close(self) -> None:
        self.r.close()
        if self.c is not self.r:
            self.c.close()

    # ------------------------------------------------------------ jobs

    def submit(self, key: str, request_json: str, priority: Priority, principal: str = ANONYMOUS) -> Submitted:
        found = self.fetch_artifact(key, blobs=False, count=False)
        if found is not None:
            return Submitted(manifest=found.manifest)
        job_id = uuid.uuid4().hex
        created = now_s()
        size = len(request_json.encode())
        fields = {"id": job_id, "key": key, "stage": JobStage.QUEUED.value, "priority": priority,
                  "created_at": repr(created), "t:queued": repr(created), "attempt": "0",
                  "principals": principal, "bytes": str(size)}
        s = self.settings
        keys = [self.k.inflight(key), self.k.job(job_id), self.k.stream(priority), self.k.interactive,
                self.k.recent_jobs, self.k.request(job_id), self.k.quota(principal),
                self.k.principal_jobs(principal)]
        args = [job_id, self.k.job(""), s.inflight_ttl_s * 1000, s.job_ttl_s, priority, s.stream_max_len,
                s.recent_jobs_max, repr(created), principal, size, s.quota_queued_jobs, s.quota_queued_bytes,
                request_json]
        self._ensure_groups(self.k.streams())
        flat = [x for kv in fields.items() for x in kv]
        passed_over = ""  # a done job whose artifact is gone
        outcome, got = self._submit(keys=keys, args=args + [passed_over] + flat)
        if outcome == b"finished":  # its job stored the artifact after our look-up above
            found = self.fetch_artifact(key, blobs=False, count=False)
            if found is not None:
                return Submitted(manifest=found.manifest)
            passed_over = got.decode()
            outcome, got = self._submit(keys=keys, args=args + [passed_over] + flat)
        if outcome in (b"quota_jobs", b"quota_bytes") and self.recount_quota(principal):
            outcome, got = self._submit(keys=keys, args=args + [passed_over] + flat)
        if outcome == b"full":
            raise QueueFull(f"the {priority} queue holds {s.stream_max_len} jobs (FXCC_STREAM_MAX_LEN); "
                            "retry later")
        if outcome == b"quota_jobs":
            raise QuotaExceeded(principal, "jobs", int(got) + 1, s.quota_queued_jobs,
                                "FXCC_QUOTA_QUEUED_JOBS")
        if outcome == b"quota_bytes":
            raise QuotaExceeded(principal, "request bytes", int(got) + size, s.quota_queued_bytes,
                                "FXCC_QUOTA_QUEUED_BYTES")
        return Submitted(job_id=got.decode(), created=outcome == b"created")

    def recount_quota(self, principal: str) -> bool:
        """Count `principal`'s quota charges again from its jobs (redis_scripts.RECOUNT), unless
        that was done in the last RECOUNT_EVERY_S; whether it was done."""
        if not self.r.set(self.k.quota(principal) + ":recounted", "1", nx=True, ex=RECOUNT_EVERY_S):
            return False
        jobs, size = self._recount(keys=[self.k.quota(principal), self.k.principal_jobs(principal)],
                                   args=[principal, self.k.job(""), self.settings.job_ttl_s])
        log.info("quota of %s recounted: %d jobs, %d request bytes", principal, jobs, size)
        return True

    def submit_tune(self, key: str, arch: int, request_json: str) -> Submitted:
        job_id = uuid.uuid4().hex
        created = now_s()
        fields = {"id": job_id, "key": key, "kind": "tune", "arch": str(arch), "stage": JobStage.QUEUED.value,
                  "priority": "precompile", "created_at": repr(created), "t:queued": repr(created),
                  "attempt": "0", "bytes": str(len(request_json.encode()))}
        s = self.settings
        stream = self.k.tune_stream(arch)
        keys = [self.k.tune_inflight(key), self.k.job(job_id), stream, self.k.recent_jobs, self.k.tune_archs,
                self.k.request(job_id)]
        # Note: a queued tune job may wait long for a GPU of its arch, so its single-flight entry
        # lives as long as its record; once a worker runs it, heartbeats renew it as for compiles.
        args = [job_id, self.k.job(""), s.job_ttl_s * 1000, s.job_ttl_s, s.stream_max_len, s.recent_jobs_max,
                repr(created), arch, request_json]
        self._ensure_groups([stream])
        outcome, got = self._submit_tune(keys=keys, args=args + [x for kv in fields.items() for x in kv])
        if outcome == b"full":
            raise QueueFull(f"the sm_{arch} tune queue holds {s.stream_max_len} jobs (FXCC_STREAM_MAX_LEN)")
        return Submitted(job_id=got.decode(), created=outcome == b"created")

    def get_job(self, job_id: str) -> JobRecord | None:
        return _record(self.r.hgetall(self.k.job(job_id)))

    def get_request(self, job_id: str) -> str | None:
        data = self.r.get(self.k.request(job_id))
        if data is None:  # a job queued by an fxcc that kept the request in the job's hash
            data = self.r.hget(self.k.job(job_id), "request")
        return None if data is None else data.decode()

    def list_jobs(self, state: JobState | None, limit: int, principal: str | None = None) -> list[JobRecord]:
        index = self.k.recent_jobs if principal is None else self.k.principal_jobs(principal)
        ids = self.r.zrevrange(index, 0, (limit if state is None else RECENT_WINDOW) - 1)
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.k.job(job_id.decode()))
        jobs = [j for j in map(_record, pipe.execute()) if j is not None]
        return [j for j in jobs if (state is None or j.state is state)
                and (principal is None or principal in j.principals)][:limit]

    def job_counts(self) -> dict[str, int]:
        ids = self.r.zrevrange(self.k.recent_jobs, 0, RECENT_WINDOW - 1)
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(self.k.job(job_id.decode()), "stage")
        counts = {s.value: 0 for s in JobState}
        for stage in pipe.execute():
            if stage is not None:
                counts[state_of(JobStage(stage.decode())).value] += 1
        return counts

    def mark_started(self, job_id: str, worker: str, *, takeover: bool = False,
                     stage: JobStage = JobStage.LOWERING) -> JobRecord | None:
        args = [repr(now_s()), worker, "1" if takeover else "0", stage.value]
        if not self._start(keys=[self.k.job(job_id)], args=args):
            return None
        return self.get_job(job_id)

    def mark_stage(self, job_id: str, stage: JobStage) -> None:
        self._stage(keys=[self.k.job(job_id)], args=[stage.value, repr(now_s())])

    def mark_done(self, job_id: str, stats: dict[str, Any]) -> None:
        self._finished(job_id, JobStage.DONE, stats=json.dumps(stats), error="")

    def mark_failed(self, job_id: str, error: JobError, *, dead_letter: bool = False) -> None:
        if self._finished(job_id, JobStage.FAILED, error=error.model_dump_json(), stats="") and dead_letter:
            job = self.get_job(job_id)
            entry = {"job_id": job_id, "key": job.key if job else "", "kind": job.kind if job else "",
                     "attempts": job.attempt if job else 0,
                     "error": error.model_dump_json(), "at": repr(now_s())}
            self.r.xadd(self.k.dead_letter, entry, maxlen=self.settings.dead_letter_max_len, approximate=True)
            log.error("job %s failed %d times; moved to the dead-letter stream: %s: %s", job_id,
                      entry["attempts"], error.error, error.message)

    def _finished(self, job_id: str, stage: JobStage, **fields: str) -> bool:
        """False when the job is gone or finished already (an admin aborted it): it stays as it is."""
        args = [job_id, self.settings.job_ttl_s, self.k.inflight(""), stage.value, repr(now_s()), self.k.quota("")]
        return bool(self._finish(keys=[self.k.job(job_id), self.k.request(job_id)],
                                 args=args + [x for kv in fields.items() for x in kv]))

    def retry(self, claim: Claim, error: JobError) -> None:
        self._requeue(claim, error.model_dump_json(), "0")

    def requeue(self, claim: Claim) -> None:
        self._requeue(claim, "", "-1")

    def _requeue(self, claim: Claim, error_json: str, attempt_change: str) -> None:
        keys = [self.k.job(claim.job_id), self.k.interactive, self.k.precompile]
        self._retry(keys=keys, args=[repr(now_s()), error_json, attempt_change, self.settings.stream_max_len])
        self.ack(claim)

    def cancel(self, job_id: str, principal: str | None = None) -> CancelOutcome:
        return self._cancel_as(job_id, principal or "", "")

    def abort(self, job_id: str, admin: str) -> CancelOutcome:
        return self._cancel_as(job_id, "", aborted_by(admin).model_dump_json())

    def _cancel_as(self, job_id: str, principal: str, abort_json: str) -> CancelOutcome:
        args = [job_id, self.settings.job_ttl_s, self.k.inflight(""), repr(now_s()), self.k.quota(""),
                principal, abort_json, self.k.principal_jobs("")]
        return self._cancel(keys=[self.k.job(job_id), self.k.request(job_id)], args=args).decode()

    def dead_letters(self, limit: int) -> list[dict[str, str]]:
        entries = self.r.xrevrange(self.k.dead_letter, count=limit)
        return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]

    # ------------------------------------------------------------ build tasks

    def submit_builds(self, parent_id: str, tasks: list[BuildEntry]) -> list[str]:
        s = self.settings
        stream = self.k.build_stream
        self._ensure_groups([stream])
        pipe = self.r.pipeline(transaction=False)
        for t in tasks:
            job_id = uuid.uuid4().hex
            created = now_s()
            fields = {"id": job_id, "key": t.key, "kind": "build", "arch": str(t.arch), "name": t.name,
                      "parent": parent_id, "stage": JobStage.QUEUED.value, "priority": "precompile",
                      "created_at": repr(created), "t:queued": repr(created), "attempt": "0",
                      "bytes": str(len(t.task_json))}
            keys = [self.k.build_inflight(t.key), self.k.job(job_id), stream, self.k.builds_recent,
                    self.k.build_archs, self.k.request(job_id)]
            args = [job_id, self.k.job(""), s.inflight_ttl_s * 1000, s.job_ttl_s, s.stream_max_len,
                    s.recent_jobs_max, repr(created), t.arch, t.task_json]
            self._submit_tune(keys=keys, args=args + [x for kv in fields.items() for x in kv], client=pipe)
        ids = []
        for outcome, got in pipe.execute() if tasks else []:
            if outcome == b"full":
                raise QueueFull(f"the build queue holds {s.stream_max_len} tasks (FXCC_STREAM_MAX_LEN)")
            ids.append(got.decode())
        self.r.hset(self.k.job(parent_id), "tasks", ",".join(ids))
        return ids

    def get_jobs(self, job_ids: list[str]) -> list[JobRecord | None]:
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(self.k.job(job_id))
        return [_record(h) for h in pipe.execute()] if job_ids else []

    def get_kernel_builds(self, keys: list[str]) -> dict[str, bytes]:
        values = self.c.mget([self.k.kernel_build(k) for k in keys]) if keys else []
        return {k: v for k, v in zip(keys, values, strict=True) if v is not None}

    def put_kernel_build(self, key: str, data: bytes) -> None:
        self.c.set(self.k.kernel_build(key), data, ex=self.settings.kernel_build_ttl_s)

    def claim_builds(self, consumer: str, block_ms: int) -> list[Claim]:
        stream = self.k.build_stream
        for _ in range(2):
            try:
                self._ensure_groups([stream])
                return (self._reclaim_stuck(consumer, [stream])
                        or self._read(consumer, {stream: ">"}, block_ms=block_ms))
            except redis.ResponseError as e:
                if "NOGROUP" not in str(e):
                    raise
                self._groups_ready.clear()  # the stream went (FLUSHDB, a restart): make it again
        return []

    # ------------------------------------------------------------ queue

    def _ensure_groups(self, streams: Sequence[str]) -> None:
        for stream in streams:
            if stream in self._groups_ready:
                continue
            try:
                # From id 0, so that jobs queued before any worker existed are delivered too.
                self.r.xgroup_create(stream, self.k.group(stream), id="0", mkstream=True)
            except redis.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise
            self._groups_ready.add(stream)

    def claim(self, consumer: str, block_ms: int, tune_arch: int | None = None) -> list[Claim]:
        try:
            return self._claim(consumer, block_ms, tune_arch)
        except redis.ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            # The streams were deleted under us (FLUSHDB, a Redis restart): make them again.
            self._groups_ready.clear()
            return self._claim(consumer, block_ms, tune_arch)

    def _claim(self, consumer: str, block_ms: int, tune_arch: int | None) -> list[Claim]:
        # Note: only a consumer with a GPU of the arch reads (or reclaims from) a tune stream, so a
        # CPU worker never holds a tune job.
        compile_streams = self.k.streams()
        streams = compile_streams + ((self.k.tune_stream(tune_arch),) if tune_arch is not None else ())
        self._ensure_groups(streams)
        claims = self._reclaim_stuck(consumer, streams)
        if claims:
            return claims
        for stream in streams:
            claims = self._read(consumer, {stream: ">"}, block_ms=None)
            if claims:
                return claims
        # Nothing waiting: block on the compile streams (one XREADGROUP reads through one group
        # name, and tune streams have their own group: a tune job queued meanwhile waits for the
        # next round, at most block_ms); if both deliver, interactive comes first.
        return self._read(consumer, {s: ">" for s in compile_streams}, block_ms=block_ms)

    def _read(self, consumer: str, streams: dict[str, str], block_ms: int | None) -> list[Claim]:
        group = self.k.group(next(iter(streams)))
        reply = self.r.xreadgroup(group, consumer, streams, count=1, block=block_ms)
        found: dict[str, list[Claim]] = {}
        for stream, entries in reply or []:
            name = stream.decode()
            found[name] = [c for c in (self._entry(name, consumer, e) for e in entries) if c]
        return [c for s in streams for c in found.get(s, [])]

    def _reclaim_stuck(self, consumer: str, streams: Sequence[str]) -> list[Claim]:
        for stream in streams:
            reply = self.r.xautoclaim(stream, self.k.group(stream), consumer, self.settings.claim_idle_ms,
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
            self.r.xack(stream, self.k.group(stream), entry_id)  # not one of ours (or trimmed): drop it
            return None
        return Claim(job_id=job_id.decode(), stream=stream, entry_id=entry_id, consumer=consumer)

    def ack(self, claim: Claim) -> None:
        # One group reads each stream, so an acknowledged entry is dead weight: delete it, and
        # a stream's length stays the number of jobs waiting or running.
        pipe = self.r.pipeline(transaction=False)
        pipe.xack(claim.stream, self.k.group(claim.stream), claim.entry_id)
        pipe.xdel(claim.stream, claim.entry_id)
        pipe.execute()

    def forget_groups(self) -> None:
        """Make the consumer groups again on next use: Redis lost them (a restart, a failover)."""
        self._groups_ready.clear()

    def _depth(self, stream: str) -> dict[str, int]:
        try:
            self._ensure_groups([stream])
            running = self.r.xpending(stream, self.k.group(stream))["pending"]
        except redis.ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            # A Redis restarted (or failed over) since this process made its groups: make them again.
            log.warning("consumer group of %s is gone (Redis restarted?); making it again", stream)
            self.forget_groups()
            self._ensure_groups([stream])
            running = self.r.xpending(stream, self.k.group(stream))["pending"]
        return {"waiting": max(self.r.xlen(stream) - running, 0), "running": running}

    def queue_depths(self) -> dict[str, dict[str, int]]:
        out = {priority: self._depth(self.k.stream(priority)) for priority in PRIORITIES}
        tune = list(self.tune_depths().values())
        out["tune"] = {"waiting": sum(t["waiting"] for t in tune), "running": sum(t["running"] for t in tune)}
        out["builds"] = self._depth(self.k.build_stream)
        out["dead_letter"] = {"waiting": self.r.xlen(self.k.dead_letter), "running": 0}
        return out

    def tune_depths(self) -> dict[str, dict[str, int]]:
        archs = sorted(int(a) for a in self.r.smembers(self.k.tune_archs))
        return {f"sm_{arch}": self._depth(self.k.tune_stream(arch)) for arch in archs}

    def workers(self) -> list[dict[str, Any]]:
        ids = self.r.zrangebyscore(self.k.live_workers, time.time() - self.settings.worker_ttl_s, "+inf")
        values = self.r.mget([self.k.worker(w.decode()) for w in ids]) if ids else []
        return [json.loads(v) for v in values if v is not None]

    def forget_worker(self, worker: str) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.delete(self.k.worker(worker))
        pipe.zrem(self.k.live_workers, worker)
        pipe.execute()

    def heartbeat(self, worker: str, info: dict[str, Any], claims: list[Claim]) -> None:
        """Renew the worker's TTL key, reset the idle time of its entries, renew their single flight."""
        now = time.time()
        pipe = self.r.pipeline(transaction=False)
        pipe.set(self.k.worker(worker), json.dumps({**info, "beat_at": now}), ex=self.settings.worker_ttl_s)
        pipe.zadd(self.k.live_workers, {worker: now})
        pipe.zremrangebyscore(self.k.live_workers, "-inf", now - self.settings.worker_ttl_s)
        for c in claims:
            pipe.xclaim(c.stream, self.k.group(c.stream), c.consumer, 0, [c.entry_id], justid=True)
            self._renew(keys=[self.k.job(c.job_id)], client=pipe,
                        args=[self.k.inflight(""), c.job_id, self.settings.inflight_ttl_s * 1000])
        pipe.execute()

    # ------------------------------------------------------------ tokens

    def api_tokens(self) -> list[TokenRecord]:
        return sorted((TokenRecord.model_validate_json(v) for v in self.r.hvals(self.k.tokens)),
                      key=lambda t: t.name)

    def find_token(self, sha256: str) -> TokenRecord | None:
        data = self.r.hget(self.k.tokens, sha256)
        return None if data is None else TokenRecord.model_validate_json(data)

    def add_token(self, token: TokenRecord) -> bool:
        if any(t.name == token.name for t in self.api_tokens()):
            return False
        return bool(self.r.hsetnx(self.k.tokens, token.sha256, token.model_dump_json()))

    def delete_token(self, name: str) -> bool:
        gone = [t.sha256 for t in self.api_tokens() if t.name == name]
        return bool(gone) and bool(self.r.hdel(self.k.tokens, *gone))


def _record(h: dict[bytes, bytes]) -> JobRecord | None:
    if not h:
        return None
    s = {k.decode(): v.decode() for k, v in h.items()}
    if "stage" not in s:
        return None

    def opt_float(name: str) -> float | None:
        return float(s[name]) if s.get(name) else None

    stage = JobStage(s["stage"])
    return JobRecord(
        id=s["id"], key=s["key"], kind=s.get("kind", "compile"), arch=int(s["arch"]) if s.get("arch") else None,
        state=state_of(stage), stage=stage,
        stages=dict(sorted(((k[2:], float(v)) for k, v in s.items() if k.startswith("t:")), key=lambda kv: kv[1])),
        priority=s["priority"], created_at=float(s["created_at"]), started_at=opt_float("started_at"),
        finished_at=opt_float("finished_at"), worker=s.get("worker") or None,
        attempt=int(s.get("attempt", "0")),
        principals=[p for p in s.get("principals", "").split(",") if p], request_bytes=int(s.get("bytes") or 0),
        name=s.get("name") or None, parent=s.get("parent") or None, tasks=[t for t in s.get("tasks", "").split(",") if t],
        error=JobError.model_validate_json(s["error"]) if s.get("error") else None,
        stats=json.loads(s["stats"]) if s.get("stats") else None,
    )

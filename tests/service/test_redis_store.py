"""RedisStore specifics: manifest written last, broken entries, stuck-job reclaim, heartbeats."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis

from fxcc.compiler_core.artifact import Artifact, KernelInfo, add_blob
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.keys import GROUP
from fxcc.service.redis_store import RedisStore
from fxcc.service.settings import ServiceSettings


def artifact_with_blobs(req: CompileRequest, n: int = 3) -> Artifact:
    art = compile_request(req)
    blobs: dict[str, bytes] = {}
    kernels = [KernelInfo(name=f"k{i}", source=add_blob(blobs, f"src {i}".encode() * 50)) for i in range(n)]
    return Artifact(art.manifest.model_copy(update={"kernels": kernels, "stage_log": None}), blobs)


def test_manifest_is_written_after_every_blob(redis_store: RedisStore, redis_url: str,
                                              make_unary: Callable[..., CompileRequest]) -> None:
    art = artifact_with_blobs(make_unary())
    prefix = redis_store.k.prefix
    seen: list[str] = []
    monitor_ready = threading.Event()

    def watch() -> None:
        client = redis.Redis.from_url(redis_url)
        with client.monitor() as m:
            monitor_ready.set()
            for event in m.listen():
                cmd = event["command"]
                if cmd.startswith("SET ") and prefix in cmd:
                    seen.append(cmd.split()[1])
                    if ":manifest:" in cmd.split()[1]:
                        return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    assert monitor_ready.wait(5)
    time.sleep(0.05)  # MONITOR is registered once the server has answered OK
    redis_store.put_artifact(art)
    t.join(timeout=5)
    kinds = [":manifest:" in k for k in seen]
    assert kinds.count(True) == 1 and kinds[-1], seen
    assert sum(":blob:" in k for k in seen) == len(art.blobs)


class _DiesAfterBlobs(RedisStore):
    """A store whose process dies between writing the blobs and the manifest."""

    def count(self, counter: str) -> None:
        raise AssertionError("unreachable")

    def put_artifact(self, artifact: Artifact) -> None:
        pipe = self.r.pipeline(transaction=False)
        for d, data in artifact.blobs.items():
            pipe.set(self.k.blob(d), data, nx=True)
        pipe.execute()
        raise KeyboardInterrupt  # stands in for the crash


def test_crash_before_manifest_leaves_no_entry(redis_settings: ServiceSettings,
                                               make_unary: Callable[..., CompileRequest]) -> None:
    art = artifact_with_blobs(make_unary())
    store = _DiesAfterBlobs(redis_settings)
    with pytest.raises(KeyboardInterrupt):
        store.put_artifact(art)
    assert store.get_artifact(art.manifest.key) is None
    assert store.get_manifest(art.manifest.key) is None


def test_broken_blob_reads_as_absent(redis_store: RedisStore, make_unary: Callable[..., CompileRequest]) -> None:
    art = artifact_with_blobs(make_unary())
    redis_store.put_artifact(art)
    victim = next(iter(art.blobs))
    redis_store.r.set(redis_store.k.blob(victim), b"tampered")
    assert redis_store.get_artifact(art.manifest.key) is None
    redis_store.r.set(redis_store.k.manifest(art.manifest.key), b"{not json")
    assert redis_store.get_manifest(art.manifest.key) is None


def test_stuck_job_is_reclaimed_after_claim_idle_ms(redis_settings: ServiceSettings,
                                                    make_unary: Callable[..., CompileRequest]) -> None:
    store = RedisStore(redis_settings.model_copy(update={"claim_idle_ms": 100}))
    req = make_unary()
    job_id = store.submit(compile_key(req), req.model_dump_json(), "interactive").job_id
    [dead] = store.claim("dead-worker", block_ms=50)
    store.mark_started(job_id, "dead-worker")
    assert store.claim("live-worker", block_ms=10) == []  # not idle long enough yet
    time.sleep(0.15)
    [again] = store.claim("live-worker", block_ms=10)
    assert again.job_id == job_id and again.entry_id == dead.entry_id and again.consumer == "live-worker"
    store.ack(again)
    assert store.r.xpending(store.k.interactive, GROUP)["pending"] == 0


def test_heartbeat_renews_ttl_and_keeps_claims(redis_settings: ServiceSettings,
                                               make_unary: Callable[..., CompileRequest]) -> None:
    store = RedisStore(redis_settings.model_copy(update={"claim_idle_ms": 150}))
    req = make_unary()
    store.submit(compile_key(req), req.model_dump_json(), "interactive")
    claims = store.claim("busy", block_ms=50)
    for _ in range(4):
        time.sleep(0.06)
        store.heartbeat("w-1", {"device": "cpu"}, claims)
    # 240 ms after the claim, but the heartbeats kept the entry fresh: nobody may take it.
    assert store.claim("thief", block_ms=10) == []
    ttl = store.r.ttl(store.k.worker("w-1"))
    assert 0 < ttl <= redis_settings.worker_ttl_s
    store.forget_worker("w-1")
    assert not store.r.exists(store.k.worker("w-1"))


def test_counters(redis_store: RedisStore) -> None:
    redis_store.count("hits")
    redis_store.count("hits")
    redis_store.count("misses")
    assert redis_store.counters() == {"hits": 2, "misses": 1}


def test_claim_survives_deleted_streams(redis_store: RedisStore, make_unary: Callable[..., CompileRequest]) -> None:
    assert redis_store.claim("c", block_ms=10) == []
    redis_store.r.delete(*redis_store.k.streams())  # as FLUSHDB or an operator would
    assert redis_store.claim("c", block_ms=10) == []
    req = make_unary()
    job_id = redis_store.submit(compile_key(req), req.model_dump_json(), "interactive").job_id
    assert [c.job_id for c in redis_store.claim("c", block_ms=10)] == [job_id]


def test_a_quota_counter_left_by_an_expired_job_is_recounted_before_it_refuses(
        redis_settings: ServiceSettings, make_unary: Callable[..., CompileRequest]) -> None:
    """A job record that goes without a script ending it (expired, lost) leaves its principal
    charged: the next submit over the quota recounts from the principal's jobs and goes through."""
    from fxcc.service.store import QuotaExceeded

    store = RedisStore(redis_settings.model_copy(update={"quota_queued_jobs": 2}))
    try:
        reqs = [make_unary(t) for t in ("aten.sin.default", "aten.cos.default", "aten.exp.default")]
        first, second = (store.submit(compile_key(r), r.model_dump_json(), r.priority, "alice") for r in reqs[:2])
        store.r.delete(store.k.job(first.job_id))  # as if it expired while queued: nothing released
        third = store.submit(compile_key(reqs[2]), reqs[2].model_dump_json(), reqs[2].priority, "alice")
        assert third.created and store.r.hget(store.k.quota("alice"), "jobs") == b"2"
        # A real excess is still refused (the recount, done once in 30 s, is not repeated).
        fourth = make_unary("aten.tan.default")
        with pytest.raises(QuotaExceeded, match="FXCC_QUOTA_QUEUED_JOBS"):
            store.submit(compile_key(fourth), fourth.model_dump_json(), fourth.priority, "alice")
        assert second.job_id and store.r.hget(store.k.quota("alice"), "jobs") == b"2"
    finally:
        store.close()

"""Stats, Prometheus metrics and the cache admin routes on a real Redis; signatures, a separate cache
Redis, and the artifact size limit."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from fxcc.compiler_core.artifact import canonical_json
from fxcc.compiler_core.signing import PublicKey, Signer, TrustedKeys, generate
from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.app import create_app
from fxcc.service.redis_store import RedisStore
from fxcc.service.settings import ServiceSettings
from fxcc.worker.process import JobPolicy, process_claim


@pytest.fixture
def client(redis_settings: ServiceSettings) -> Iterator[TestClient]:
    with TestClient(create_app(redis_settings)) as c:
        yield c


def post(client: TestClient, req: CompileRequest):
    return client.post("/v1/compile", content=req.model_dump_json(), headers={"Content-Type": "application/json"})


def compile_one(client: TestClient, req: CompileRequest, policy: JobPolicy | None = None) -> dict:
    queued = post(client, req).json()
    store: RedisStore = client.app.state.store
    [claim] = store.claim("w", block_ms=100)
    process_claim(store, claim, worker="w", policy=policy or JobPolicy())
    return client.get(f"/v1/jobs/{queued['job_id']}").json()


def test_stats(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    done = compile_one(client, make_unary())
    post(client, make_unary("aten.cos.default", priority="precompile"))
    client.get(f"/v1/artifacts/{done['key']}")
    store: RedisStore = client.app.state.store
    store.heartbeat("gpu-7", {"id": "gpu-7", "device": "cuda", "concurrency": 1}, [])
    stats = client.get("/v1/stats").json()
    assert stats["queue"] == {"interactive": {"waiting": 0, "running": 0},
                              "precompile": {"waiting": 1, "running": 0},
                              "tune": {"waiting": 0, "running": 0},
                              "builds": {"waiting": 0, "running": 0},
                              "dead_letter": {"waiting": 0, "running": 0}}
    [worker] = stats["workers"]
    assert worker["id"] == "gpu-7" and worker["device"] == "cuda" and 0 <= worker["heartbeat_age_s"] < 60
    assert stats["jobs"] == {"queued": 1, "running": 0, "done": 1, "failed": 0, "cancelled": 0}
    cache = stats["cache"]
    assert cache["entries"] == 1 and cache["bytes"] > 0 and cache["puts"] == 1
    assert (cache["hits"], cache["misses"]) == (1, 2) and cache["hit_rate"] == pytest.approx(1 / 3, abs=1e-3)


def test_metrics_exposition(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    compile_one(client, make_unary())
    post(client, make_unary("aten.cos.default"))
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    sample = re.compile(r'^[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?[0-9.e+-]+$')
    lines = r.text.strip().splitlines()
    assert all(line.startswith(("# HELP ", "# TYPE ")) or sample.match(line) for line in lines), r.text
    assert 'fxcc_queue_waiting_jobs{priority="interactive"} 1' in lines
    assert "fxcc_cache_entries 1" in lines and "fxcc_cache_puts_total 1" in lines
    assert 'fxcc_jobs{state="done"} 1' in lines
    assert "# TYPE fxcc_cache_hits_total counter" in lines


def test_cache_admin(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    keys = [compile_one(client, make_unary(op))["key"] for op in ("aten.sin.default", "aten.cos.default")]
    listed = client.get("/v1/cache").json()
    assert listed["total"] == 2 and sorted(e["key"] for e in listed["entries"]) == sorted(keys)
    assert all(e["nodes"] == 1 and not e["signed"] for e in listed["entries"])

    assert client.delete(f"/v1/cache/{keys[0]}").json() == {"removed": keys[0]}
    assert client.get(f"/v1/artifacts/{keys[0]}").status_code == 404
    assert client.delete(f"/v1/cache/{keys[0]}").status_code == 404
    assert client.get(f"/v1/artifacts/{keys[1]}").status_code == 200

    assert client.delete("/v1/cache").json() == {"purged": 1}
    store: RedisStore = client.app.state.store
    assert not list(store.c.scan_iter(match=store.k.blob("*"))) and not list(store.c.scan_iter(match=store.k.manifest("*")))
    assert client.get("/v1/stats").json()["cache"]["entries"] == 0
    assert client.get("/v1/cache").json() == {"entries": [], "total": 0}


def test_signature_travels_with_the_artifact(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    private, public = generate()
    done = compile_one(client, make_unary(), JobPolicy(signer=Signer(private)))
    body = client.get(f"/v1/artifacts/{done['key']}").json()
    assert TrustedKeys([PublicKey(public)]).verify(body["manifest"], body["signature"])
    assert client.get(f"/v1/artifacts/{done['key']}", params={"blobs": 0}).json()["signature"] == body["signature"]
    # What a client does without our code: Ed25519 over the canonical JSON of what it received.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    _, _, sig = body["signature"].split(":")
    Ed25519PublicKey.from_public_bytes(base64.b64decode(public.split(":", 1)[1])).verify(
        base64.b64decode(sig), canonical_json(body["manifest"]))  # raises if it does not match
    assert all(base64.b64decode(b) for b in body["blobs"].values())
    assert client.get("/v1/cache").json()["entries"][0]["signed"]


def test_separate_cache_redis(redis_settings: ServiceSettings, make_unary: Callable[..., CompileRequest]) -> None:
    cache_url = redis_settings.redis_url.rsplit("/", 1)[0] + "/1"
    settings = redis_settings.model_copy(update={"cache_redis_url": cache_url})
    cache_db = redis.Redis.from_url(cache_url)
    try:
        with TestClient(create_app(settings)) as client:
            done = compile_one(client, make_unary())
            store: RedisStore = client.app.state.store
            assert store.c is not store.r
            assert cache_db.exists(store.k.manifest(done["key"])) and not store.r.exists(store.k.manifest(done["key"]))
            assert store.r.exists(store.k.job(done["id"])) and not cache_db.exists(store.k.job(done["id"]))
            assert post(client, make_unary()).status_code == 200
    finally:
        keys = list(cache_db.scan_iter(match=redis_settings.redis_prefix + "*"))
        if keys:
            cache_db.delete(*keys)
        cache_db.close()


def test_artifact_over_the_size_limit_fails_the_job(redis_settings: ServiceSettings,
                                                    make_unary: Callable[..., CompileRequest]) -> None:
    with TestClient(create_app(redis_settings.model_copy(update={"max_artifact_bytes": 100}))) as client:
        job = compile_one(client, make_unary())
        assert job["state"] == "failed" and job["error"]["error"] == "ArtifactTooLarge" and job["attempt"] == 1
        assert "FXCC_MAX_ARTIFACT_BYTES" in job["error"]["message"]
        stats = client.get("/v1/stats").json()
        assert stats["cache"]["rejected"] == 1 and stats["cache"]["entries"] == 0
        assert stats["queue"]["dead_letter"]["waiting"] == 0

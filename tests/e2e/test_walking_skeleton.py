"""End to end, real processes: redis-server, `fxcc serve`, `fxcc worker`, and client processes
compiling the seed examples with torch.compile(backend="fxcc")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis

from client.demo import free_port, wait_healthy

pytestmark = pytest.mark.e2e
TOKEN = "e2e-test-token"
SIGNING_KEY = "e2e-signing-key"


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "client.cli", *args], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def _client_pass(env: dict[str, str], out: Path) -> list[dict]:
    subprocess.run([sys.executable, "-m", "client.demo", "--client-pass", str(out)], env=env,
                   check=True, timeout=600)
    return json.loads(out.read_text())


def _job_count(r: redis.Redis, prefix: str) -> int:
    return sum(1 for _ in r.scan_iter(match=f"{prefix}job:*", count=1000))


@pytest.fixture
def cluster(redis_url: str, redis_prefix: str, tmp_path: Path):
    """A real service and a real worker process on the test's Redis prefix."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    # A cluster service: Redis, and a token its clients must present.
    env.update(TRITON_INTERPRET="1", FXCC_REDIS_URL=redis_url, FXCC_REDIS_PREFIX=redis_prefix,
               FXCC_DATA_DIR=str(tmp_path / "data"), FXCC_CLAIM_BLOCK_MS="200", FXCC_TOKEN=TOKEN,
               FXCC_SIGNING_KEY=SIGNING_KEY)
    server = _spawn(["serve", "--port", str(port)], env, tmp_path / "serve.log")
    worker = _spawn(["worker"], env, tmp_path / "worker.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server)
        yield url, env
    finally:
        for p in (worker, server):
            p.terminate()
        for p in (worker, server):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
    for name in ("serve.log", "worker.log"):
        sys.stderr.write(f"---- {name}\n{(tmp_path / name).read_text()[-3000:]}\n")


def test_seed_examples_compile_remotely_then_hit_shared_cache(cluster, redis_url, redis_prefix, tmp_path):
    url, env = cluster
    r = redis.Redis.from_url(redis_url)
    client_env = {k: v for k, v in env.items() if k not in ("FXCC_REDIS_URL", "FXCC_REDIS_PREFIX")}
    client_env["FXCC_URL"] = url

    first = _client_pass(dict(client_env, FXCC_CACHE_DIR=str(tmp_path / "client-a")), tmp_path / "a.json")
    assert {row["workload"] for row in first} == {"cos(sin(x))", "bias+GELU+LayerNorm", "TransformerBlock"}
    assert all(row["source"] in ("remote-compiled", "remote-hit") for row in first), first
    assert any(row["source"] == "remote-compiled" for row in first)
    assert all(row["max_abs_err"] < 1e-4 for row in first), first
    jobs_after_first = _job_count(r, redis_prefix)
    assert jobs_after_first >= 1

    second = _client_pass(dict(client_env, FXCC_CACHE_DIR=str(tmp_path / "client-b")), tmp_path / "b.json")
    assert [row["source"] for row in second] == ["remote-hit"] * len(first), second
    assert [row["key"] for row in second] == [row["key"] for row in first]
    assert all(row["max_abs_err"] < 1e-4 for row in second), second
    assert _job_count(r, redis_prefix) == jobs_after_first, "the second client caused a new compile job"

    # A client holding another signing key refuses every artifact and runs eagerly, correctly.
    forged = _client_pass(dict(client_env, FXCC_CACHE_DIR=str(tmp_path / "client-c"), FXCC_SIGNING_KEY="other"),
                          tmp_path / "c.json")
    assert all(row["source"] == "fallback" and "signature" in row["error"] for row in forged), forged
    assert all(row["max_abs_err"] == 0 for row in forged)

    # The job records say what happened, through the HTTP API.
    key = next(k for k in r.scan_iter(match=f"{redis_prefix}job:*"))
    job_id = key.decode().rsplit(":", 1)[1]
    assert httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).status_code == 401
    job = httpx.get(f"{url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()
    assert job["state"] == "done" and job["worker"]

"""End to end, real processes: redis-server, `fxcc serve`, `fxcc worker`, and client processes
compiling the seed examples with torch.compile(backend="fxcc"). The `cluster` fixture is in conftest.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis

from fxcc.compiler_core.signing import write_key_pair

pytestmark = pytest.mark.e2e


def _client_pass(env: dict[str, str], out: Path) -> list[dict]:
    subprocess.run([sys.executable, "-m", "fxcc.client.demo", "--client-pass", str(out)], env=env,
                   check=True, timeout=600)
    return json.loads(out.read_text())


def _job_count(r: redis.Redis, prefix: str) -> int:
    return sum(1 for _ in r.scan_iter(match=f"{prefix}job:*", count=1000))


def test_seed_examples_compile_remotely_then_hit_shared_cache(cluster, client_env, redis_url, redis_prefix,
                                                              tmp_path):
    url, env = cluster
    r = redis.Redis.from_url(redis_url)

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

    # A client trusting another key refuses every artifact and runs eagerly, correctly.
    other = tmp_path / "other.key"
    write_key_pair(other, tmp_path / "other.key.pub")
    forged = _client_pass(dict(client_env, FXCC_CACHE_DIR=str(tmp_path / "client-c"),
                               FXCC_TRUSTED_KEYS=str(tmp_path / "other.key.pub")), tmp_path / "c.json")
    assert all(row["source"] == "fallback" and "not trusted" in row["error"] for row in forged), forged
    assert all(row["max_abs_err"] == 0 for row in forged)

    # The job records say what happened, through the HTTP API.
    key = next(k for k in r.scan_iter(match=f"{redis_prefix}job:*"))
    job_id = key.decode().rsplit(":", 1)[1]
    assert httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).status_code == 401
    job = httpx.get(f"{url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {env['FXCC_TOKEN']}"}, timeout=10).json()
    assert job["state"] == "done" and job["worker"]


DYNAMIC_CLIENT = """
import json, sys, torch
from torch import nn
from fxcc.client.backend import events
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8)).eval()
compiled = torch.compile(model, backend="fxcc")
err = 0.0
with torch.no_grad():
    for batch in (2, 3, 5, 9, 17):
        x = torch.randn(batch, 16)
        err = max(err, (compiled(x) - model(x)).abs().max().item())
rows = [{"source": e.source, "key": e.key, "kernels": e.stats.kernels if e.stats else 0,
         "error": e.error} for e in events()]
print(json.dumps({"events": rows, "max_abs_err": err}))
"""


def _dynamic_pass(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", DYNAMIC_CLIENT], env=env, check=True, timeout=600,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_dynamic_shapes_compile_once_on_the_cluster_then_hit(cluster, client_env, redis_url, redis_prefix,
                                                              tmp_path):
    """A graph with a symbolic batch travels to a real worker (size symbols, guards and size
    expressions in JSON), runs for every batch size, and a second machine gets it from the cache."""
    r = redis.Redis.from_url(redis_url)

    first = _dynamic_pass(dict(client_env, FXCC_CACHE_DIR=str(tmp_path / "dyn-a")))
    assert first["max_abs_err"] < 1e-4, first
    assert [e["source"] for e in first["events"]] == ["remote-compiled", "remote-compiled"], first
    assert first["events"][1]["kernels"] >= 1 and not any(e["error"] for e in first["events"])
    jobs = _job_count(r, redis_prefix)

    second = _dynamic_pass(dict(client_env, FXCC_CACHE_DIR=str(tmp_path / "dyn-b")))
    assert second["max_abs_err"] < 1e-4, second
    assert [e["source"] for e in second["events"]] == ["remote-hit", "remote-hit"], second
    assert [e["key"] for e in second["events"]] == [e["key"] for e in first["events"]]
    assert _job_count(r, redis_prefix) == jobs, "the second machine caused a new compile job"

"""The attack of issue 17: whoever can write the cache Redis edits a Triton source blob and writes a
manifest listing its digest. A client with default settings must refuse it before running any of it.

Real processes: redis-server, `fxcc serve` and `fxcc worker` on Redis (the `cluster` fixture, whose
worker signs with a key pair made for the test), and client processes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

pytestmark = pytest.mark.e2e

CLIENT = """
import json, sys, torch
from fxcc.client.backend import events
def f(x):
    return torch.sin(x) * 2 + 1
x = torch.randn(1000)
out = torch.compile(f, backend="fxcc")(x)
ev = events()[-1]
print(json.dumps({"source": ev.source, "key": ev.key, "error": ev.error,
                  "max_abs_err": (out - f(x)).abs().max().item()}))
"""


def _client(env: dict[str, str], cache: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", CLIENT], env=dict(env, FXCC_CACHE_DIR=str(cache)),
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_forged_manifest_with_an_edited_source_never_runs(cluster, client_env, redis_url: str,
                                                            redis_prefix: str, tmp_path: Path) -> None:
    first = _client(client_env, tmp_path / "a")
    assert first["source"] == "remote-compiled" and first["max_abs_err"] < 1e-5, first
    key = first["key"]

    # The attacker, with write access to the cache Redis only (no worker key).
    r = redis.Redis.from_url(redis_url)
    mkey = f"{redis_prefix}manifest:{key}"
    manifest = json.loads(r.get(mkey))
    ref = manifest["kernels"][0]["source"]
    sentinel = tmp_path / "pwned"
    source = r.get(f"{redis_prefix}blob:{ref['digest']}").decode()
    evil = f"import pathlib; pathlib.Path({str(sentinel)!r}).write_text('ran')\n" + source
    digest = hashlib.sha256(evil.encode()).hexdigest()
    r.set(f"{redis_prefix}blob:{digest}", evil)
    ref.update(digest=digest, size=len(evil.encode()))
    r.set(mkey, json.dumps(manifest))  # the old signature stays: it no longer matches
    forged = _client(client_env, tmp_path / "b")
    assert forged["source"] == "fallback" and "does not match" in forged["error"], forged
    r.delete(f"{redis_prefix}sig:{key}")  # and without any signature
    unsigned = _client(client_env, tmp_path / "c")
    assert unsigned["source"] == "fallback" and "not signed" in unsigned["error"], unsigned
    assert unsigned["max_abs_err"] == 0  # it ran eagerly, correctly
    assert not sentinel.exists(), "the forged kernel source ran in a client"

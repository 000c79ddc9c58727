"""E2E fixtures: a cluster of real processes (`fxcc serve` on Redis, with a token and a signing key,
and one `fxcc worker`) under the test's own Redis prefix."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fxcc.client.demo import free_port, wait_healthy

TOKEN = "e2e-test-token"
SIGNING_KEY = "e2e-signing-key"


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fxcc.client.cli", *args], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


@pytest.fixture
def cluster(redis_url: str, redis_prefix: str, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A real service and a real worker process on the test's Redis prefix: (url, their environment).
    Clients authenticate with env["FXCC_TOKEN"] (the principal `FXCC_TOKEN`) and verify signatures
    with env["FXCC_SIGNING_KEY"]."""
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


@pytest.fixture
def client_env(cluster: tuple[str, dict[str, str]]) -> dict[str, str]:
    """The environment of a client process of `cluster` (FXCC_URL, token and signing key; no Redis)."""
    url, env = cluster
    out = {k: v for k, v in env.items() if k not in ("FXCC_REDIS_URL", "FXCC_REDIS_PREFIX")}
    out["FXCC_URL"] = url
    return out

"""A cluster of real processes for end-to-end tests: `fxcc serve` on Redis, with a token and a
signing key, and one `fxcc worker`, under a Redis key prefix of the caller's."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fxcc.client.demo import free_port, wait_healthy
from fxcc.compiler_core.signing import write_key_pair

TOKEN = "e2e-test-token"


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fxcc.client.cli", *args], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


@contextmanager
def running_cluster(redis_url: str, redis_prefix: str, workdir: Path,
                    settings: dict[str, str] | None = None) -> Iterator[tuple[str, dict[str, str]]]:
    """A real service and a real worker process on `redis_prefix`: (url, their environment).
    Clients authenticate with env["FXCC_TOKEN"] (the principal `FXCC_TOKEN`); the worker signs with a
    key pair made here, whose public key clients trust (client_env_of). `settings`: more environment
    for both."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXCC_")}
    signing = workdir / "keys" / "worker.key"
    write_key_pair(signing, signing.with_name("worker.key.pub"))
    # A cluster service: Redis, and a token its clients must present.
    env.update(TRITON_INTERPRET="1", FXCC_REDIS_URL=redis_url, FXCC_REDIS_PREFIX=redis_prefix,
               FXCC_DATA_DIR=str(workdir / "data"), FXCC_CLAIM_BLOCK_MS="200", FXCC_TOKEN=TOKEN,
               FXCC_SIGNING_KEY_FILE=str(signing))
    env.update(settings or {})
    server = _spawn(["serve", "--port", str(port)], env, workdir / "serve.log")
    worker = _spawn(["worker"], env, workdir / "worker.log")
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
        sys.stderr.write(f"---- {name}\n{(workdir / name).read_text()[-3000:]}\n")


def client_env_of(url: str, env: dict[str, str]) -> dict[str, str]:
    """The environment of a client process of a cluster: FXCC_URL, the token, and the workers'
    public key as FXCC_TRUSTED_KEYS; no Redis, no private key."""
    out = {k: v for k, v in env.items()
           if k not in ("FXCC_REDIS_URL", "FXCC_REDIS_PREFIX", "FXCC_SIGNING_KEY_FILE")}
    out["FXCC_URL"] = url
    out["FXCC_TRUSTED_KEYS"] = env["FXCC_SIGNING_KEY_FILE"] + ".pub"
    return out

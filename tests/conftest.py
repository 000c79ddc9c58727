"""Fixtures every test folder shares: a real Redis (FXCC_TEST_REDIS_URL, or a redis-server started
on a free port from PATH) and a key prefix per test, of which only its own keys are deleted."""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# The Dynamo-skip cache (client/dynamo_cache.py) is on by default for users; here it is off unless a
# test turns it on (tests/client/test_dynamo_skip*.py, tests/e2e/test_dynamo_skip*.py): other tests
# compile the same functions twice and expect Dynamo to trace both times. Read when fxcc's backend
# is first imported, and inherited by the tests' child processes.
os.environ.setdefault("FXCC_DYNAMO_CACHE", "0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Redis: FXCC_TEST_REDIS_URL if set, else a private redis-server on a free port."""

    url = os.environ.get("FXCC_TEST_REDIS_URL")
    if url:
        yield url
        return
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("these tests need a real Redis: set FXCC_TEST_REDIS_URL or put redis-server on PATH "
                    "(Debian: apt-get install redis-server)", pytrace=False)
    from tests.service.redis_server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server.url
    server.stop()


@contextmanager
def _own_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix; afterwards every key under it (and only those) is deleted."""
    import redis

    prefix = f"fxcc-test:{uuid.uuid4().hex}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; afterwards every key under it (and only those) is deleted."""
    with _own_prefix(redis_url) as prefix:
        yield prefix


@pytest.fixture(scope="module")
def module_redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix shared by the tests of one module (a cluster they share), deleted after them."""
    with _own_prefix(redis_url) as prefix:
        yield prefix


@pytest.fixture
def fresh_compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh local cache, no service, the client's default settings, and no compiled graphs or
    compile events from before (a test sets what it needs after this)."""
    import torch

    from fxcc.client import backend

    for k in ("FXCC_URL", "FXCC_TOKEN", "FXCC_MODE", "FXCC_FALLBACK", "FXCC_BLOCKING", "FXCC_PRECOMPILE",
              "FXCC_CUDA_GRAPHS", "FXCC_PRE_AOT_CACHE", "FXCC_TRUSTED_KEYS", "FXCC_ALLOW_UNSIGNED", "FXCC_DATA_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("FXCC_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    backend.reset()
    yield
    torch._dynamo.reset()

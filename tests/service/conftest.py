"""Shared fixtures: a real Redis (FXCC_TEST_REDIS_URL or a redis-server we start), per-test key prefixes,
settings for both store modes, and tiny compile requests built with the wire models."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from compiler_core.wire import (
    CompileRequest,
    GraphSpec,
    IntArg,
    ListArg,
    Node,
    NodeRef,
    Placeholder,
    TensorSpec,
)
from service.settings import ServiceSettings


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
    port = _free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server on port {port} did not start", pytrace=False)
            time.sleep(0.02)
    client.close()
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; afterwards every key under it (and only those) is deleted."""
    prefix = f"fxcc-test:{uuid.uuid4().hex}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def redis_settings(redis_url: str, redis_prefix: str, tmp_path: Path) -> ServiceSettings:
    return ServiceSettings(redis_url=redis_url, redis_prefix=redis_prefix, data_dir=tmp_path / "data",
                           claim_block_ms=100, heartbeat_s=0.2)


@pytest.fixture
def embedded_settings(tmp_path: Path) -> ServiceSettings:
    return ServiceSettings(redis_url=None, data_dir=tmp_path / "data", claim_block_ms=100)


@pytest.fixture
def redis_store(redis_settings: ServiceSettings) -> Iterator:
    from service.redis_store import RedisStore

    store = RedisStore(redis_settings)
    yield store
    store.close()


def contiguous(sizes: tuple[int, ...], dtype: str = "float32") -> TensorSpec:
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.insert(0, acc)
        acc *= s
    return TensorSpec(dtype=dtype, sizes=list(sizes), strides=strides)


def unary_request(target: str = "aten.sin.default", sizes: tuple[int, ...] = (4, 8),
                  priority: str = "interactive") -> CompileRequest:
    """`target` applied to one float32 input: the smallest graph that compiles."""
    graph = GraphSpec(placeholders=[Placeholder(name="x", spec=contiguous(sizes))],
                      nodes=[Node(name="y", target=target, args=[NodeRef(name="x")])],
                      outputs=[NodeRef(name="y")])
    return CompileRequest(graph=graph, priority=priority)


def sum_request(dim: int) -> CompileRequest:
    """sum over `dim` of a 4×8 tensor: a well-formed spec whose args only shape propagation rejects."""
    graph = GraphSpec(placeholders=[Placeholder(name="x", spec=contiguous((4, 8)))],
                      nodes=[Node(name="total", target="aten.sum.dim_IntList",
                                  args=[NodeRef(name="x"), ListArg(items=[IntArg(value=dim)])])],
                      outputs=[NodeRef(name="total")])
    return CompileRequest(graph=graph)


@pytest.fixture
def make_unary() -> Callable[..., CompileRequest]:
    return unary_request


@pytest.fixture
def make_sum() -> Callable[[int], CompileRequest]:
    return sum_request

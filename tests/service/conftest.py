"""Service/worker fixtures: settings for both store modes, a RedisStore under the test's own prefix, and
tiny compile requests built with the wire models. `redis_url` and `redis_prefix` come from tests/conftest.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fxcc.compiler_core.wire import (
    CompileRequest,
    GraphSpec,
    IntArg,
    ListArg,
    Node,
    NodeRef,
    Placeholder,
    TensorSpec,
)
from fxcc.service.settings import ServiceSettings

TESTCLIENT_HOST = "testserver"  # the Host header of starlette's TestClient


@pytest.fixture
def redis_settings(redis_url: str, redis_prefix: str, tmp_path: Path) -> ServiceSettings:
    # Anonymous (as admin) so that tests about other things need no tokens; tests/service/test_auth.py
    # covers what anonymous access is off. TestClient's requests name the host `testserver`, which
    # anonymous access on loopback serves only when allowed (tests/service/test_principals.py).
    return ServiceSettings(redis_url=redis_url, redis_prefix=redis_prefix, data_dir=tmp_path / "data",
                           claim_block_ms=100, heartbeat_s=0.2, anonymous=True, anonymous_role="admin",
                           allowed_hosts=[TESTCLIENT_HOST])


@pytest.fixture
def embedded_settings(tmp_path: Path) -> ServiceSettings:
    # Its compile process starts at the first job: most tests of the HTTP answers never compile.
    return ServiceSettings(redis_url=None, data_dir=tmp_path / "data", claim_block_ms=100,
                           allowed_hosts=[TESTCLIENT_HOST], compile_process_warm=False)


@pytest.fixture
def redis_store(redis_settings: ServiceSettings) -> Iterator:
    from fxcc.service.redis_store import RedisStore

    store = RedisStore(redis_settings)
    yield store
    store.close()


@pytest.fixture(params=["redis", "embedded"])
def store(request: pytest.FixtureRequest, embedded_settings: ServiceSettings) -> Iterator:
    """The same test against both stores: a RedisStore under the test's prefix, an EmbeddedStore."""
    if request.param == "redis":
        yield request.getfixturevalue("redis_store")
    else:
        from fxcc.service.embedded_store import EmbeddedStore

        yield EmbeddedStore(embedded_settings.data_dir)


# Two client principals of one app, for the per-principal routes (pre-AOT entries, Dynamo packages).
PRINCIPAL_TOKENS = {"ci-a": "secret-a", "ci-b": "secret-b"}


def principal_auth(principal: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {PRINCIPAL_TOKENS[principal]}"}


@pytest.fixture(params=["redis", "embedded"])
def two_principals(request: pytest.FixtureRequest, embedded_settings: ServiceSettings) -> Iterator:
    """The real app on both stores with the client tokens of PRINCIPAL_TOKENS (no anonymous access)."""
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from fxcc.service.app import create_app
    from fxcc.service.settings import TokenEntry

    base = request.getfixturevalue("redis_settings") if request.param == "redis" else embedded_settings
    settings = base.model_copy(update={"anonymous": None, "tokens": [
        TokenEntry(name=name, role="client", token=SecretStr(token)) for name, token in PRINCIPAL_TOKENS.items()]})
    with TestClient(create_app(settings)) as c:
        yield c


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

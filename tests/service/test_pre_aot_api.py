"""PUT/GET /v1/pre-aot/{key} through the real app, on both stores: entries per principal, 409 for an
entry naming no stored artifact, 422 for bad keys and bodies, 413 for big ones, nothing else touched."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest
from tests.service.conftest import principal_auth

KEY = "0123456789abcdef" * 4


auth = principal_auth


@pytest.fixture
def client(two_principals: TestClient) -> TestClient:
    return two_principals


@pytest.fixture
def artifact_key(client: TestClient, make_unary: Callable[..., CompileRequest]) -> str:
    """The key of an artifact stored in the service's cache."""
    art = compile_request(make_unary())
    client.app.state.store.put_artifact(art)
    return art.manifest.key


def entry(artifact_key: str, **changes: Any) -> dict[str, Any]:
    return {"schema": 1, "artifact_key": artifact_key, "inputs": 1, "outputs": 1, "graph_nodes": 3, **changes}


def put(client: TestClient, key: str, body: Any, principal: str = "ci-a"):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.put(f"/v1/pre-aot/{key}", content=data,
                      headers={**auth(principal), "Content-Type": "application/json"})


def get(client: TestClient, key: str, principal: str = "ci-a"):
    return client.get(f"/v1/pre-aot/{key}", headers=auth(principal))


def stored_entries(client: TestClient) -> list[str]:
    """Where the entries live: Redis keys under the test's prefix, or files under the data dir."""
    store = client.app.state.store
    if store.mode == "redis":
        prefix = store.k.prefix
        return sorted(k.decode().removeprefix(prefix) for k in store.c.scan_iter(match=prefix + "preaot:*"))
    root = store.root
    return sorted(str(p.relative_to(root)) for p in (root / "pre_aot").rglob("*.json"))


def test_put_then_get_round_trip(client: TestClient, artifact_key: str) -> None:
    assert get(client, KEY).status_code == 404
    r = put(client, KEY, entry(artifact_key))
    assert r.status_code == 200, r.text
    assert r.json() == {"key": KEY, **entry(artifact_key)}
    assert get(client, KEY).json() == {"key": KEY, **entry(artifact_key)}

    # A PUT replaces the entry; stored under the principal's own name (Redis) or folder (files).
    assert put(client, KEY, entry(artifact_key, graph_nodes=7)).status_code == 200
    assert get(client, KEY).json()["graph_nodes"] == 7
    if client.app.state.store.mode == "redis":
        assert stored_entries(client) == [f"preaot:ci-a:{KEY}"]
        store = client.app.state.store
        assert 0 < store.c.ttl(store.k.pre_aot("ci-a", KEY)) <= client.app.state.settings.pre_aot_ttl_s
    else:
        assert stored_entries(client) == [f"pre_aot/{hashlib.sha256(b'ci-a').hexdigest()[:32]}/{KEY}.json"]

    # The artifact removed afterwards: the entry is still answered (the client's artifact GET misses).
    admin = client.app.state.store
    assert admin.delete_artifact(artifact_key)
    assert get(client, KEY).json()["artifact_key"] == artifact_key
    assert put(client, KEY, entry(artifact_key)).status_code == 409


def test_an_entry_naming_no_stored_artifact_is_409(client: TestClient, artifact_key: str) -> None:
    r = put(client, KEY, entry("f" * 64))
    assert r.status_code == 409 and r.json()["error"] == "Conflict"
    assert "f" * 64 in r.json()["message"]
    assert get(client, KEY).status_code == 404 and stored_entries(client) == []


def test_principals_see_only_their_own_entries(client: TestClient, artifact_key: str) -> None:
    assert put(client, KEY, entry(artifact_key, graph_nodes=1), principal="ci-a").status_code == 200
    assert get(client, KEY, principal="ci-b").status_code == 404
    assert put(client, KEY, entry(artifact_key, graph_nodes=2), principal="ci-b").status_code == 200
    assert get(client, KEY, principal="ci-a").json()["graph_nodes"] == 1
    assert get(client, KEY, principal="ci-b").json()["graph_nodes"] == 2
    assert len(stored_entries(client)) == 2
    # Nothing else is lost: the artifact and the cache's counts are as they were.
    assert client.get(f"/v1/artifacts/{artifact_key}", headers=auth("ci-a")).status_code == 200
    store = client.app.state.store
    assert store.cache_entries() == 1 and store.list_artifacts(10) == [artifact_key]


def test_no_token_is_401(client: TestClient) -> None:
    assert client.get(f"/v1/pre-aot/{KEY}").status_code == 401
    r = client.put(f"/v1/pre-aot/{KEY}", content=json.dumps(entry("a" * 64)),
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 401 and stored_entries(client) == []


BAD_BODIES = {
    "extra-field": lambda k: entry(k, code="import os"),
    "missing-field": lambda k: {x: v for x, v in entry(k).items() if x != "outputs"},
    "field-by-python-name": lambda k: {**{x: v for x, v in entry(k).items() if x != "schema"}, "schema_version": 1},
    "negative": lambda k: entry(k, inputs=-1),
    "too-many": lambda k: entry(k, graph_nodes=10**9),
    "bool": lambda k: entry(k, outputs=True),
    "string-int": lambda k: entry(k, inputs="1"),
    "float": lambda k: entry(k, inputs=1.0),
    "schema-0": lambda k: entry(k, schema=0),
    "upper-hex": lambda k: entry(k.upper()),
    "short-key": lambda k: entry(k[:63]),
    "path-key": lambda k: entry("../" + k[3:]),
    "list": lambda k: [entry(k)],
    "not-json": lambda k: '{"schema": 1, "artifact_key": ',
}


@pytest.mark.parametrize("make", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bad_bodies_are_422(client: TestClient, artifact_key: str, make: Callable[[str], Any]) -> None:
    r = put(client, KEY, make(artifact_key))
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "ValidationError"
    assert stored_entries(client) == []


@pytest.mark.parametrize("key", ["A" * 64, "a" * 63, "a" * 65, "g" * 64, ".." + "a" * 62])
def test_bad_keys_are_422(client: TestClient, artifact_key: str, key: str) -> None:
    assert put(client, key, entry(artifact_key)).status_code == 422
    assert get(client, key).status_code == 422
    assert stored_entries(client) == []


def test_a_big_body_is_413(client: TestClient, artifact_key: str) -> None:
    body = json.dumps(entry(artifact_key)) + " " * 5000  # valid JSON, padded
    r = put(client, KEY, body)
    assert r.status_code == 413 and r.json()["error"] == "RequestTooLarge"
    assert put(client, KEY, b"\x80 not even text").status_code == 400  # FastAPI's answer to undecodable bytes
    assert stored_entries(client) == []


def test_stats_count_hits_misses_puts_and_refusals(client: TestClient, artifact_key: str) -> None:
    from fxcc.service.stats import gather_stats, render_metrics

    store = client.app.state.store
    assert gather_stats(store)["pre_aot"] == {"hits": 0, "misses": 0, "puts": 0, "refused": 0}
    assert get(client, KEY).status_code == 404
    assert put(client, KEY, entry("f" * 64)).status_code == 409
    assert put(client, KEY, entry(artifact_key)).status_code == 200
    assert get(client, KEY).status_code == 200
    assert get(client, KEY, principal="ci-b").status_code == 404
    assert put(client, KEY, {"schema": 1}).status_code == 422  # not counted: never reached the store
    stats = gather_stats(store)
    assert stats["pre_aot"] == {"hits": 1, "misses": 2, "puts": 1, "refused": 1}
    assert stats["cache"]["hits"] == 0  # artifact fetches are counted apart
    text = render_metrics(stats)
    assert "fxcc_pre_aot_hits_total 1" in text and "fxcc_pre_aot_misses_total 2" in text


def test_a_purge_of_the_cache_removes_every_entry(client: TestClient, artifact_key: str) -> None:
    assert put(client, KEY, entry(artifact_key)).status_code == 200
    assert put(client, KEY, entry(artifact_key), principal="ci-b").status_code == 200
    assert len(stored_entries(client)) == 2
    assert client.app.state.store.purge_cache() == 1
    assert stored_entries(client) == []
    assert get(client, KEY).status_code == 404 and get(client, KEY, principal="ci-b").status_code == 404

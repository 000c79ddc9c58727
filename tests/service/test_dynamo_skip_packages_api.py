"""PUT/GET /v1/packages/{key} through the real app, on both stores: opaque bytes kept per principal
and returned as they came, 422 for bad keys and empty bodies, 413 over the bound, gone on a purge."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from fxcc.service.routes.packages import MAX_PACKAGE_BYTES
from tests.service.conftest import principal_auth

KEY = "0123456789abcdef" * 4
# Not a package the service could open: it never tries (pickle opcodes, NUL bytes, invalid UTF-8).
BYTES = b"FXCCPKG1\n\x80\x04\x95cos\nsystem\n\x00\xff" * 100


auth = principal_auth


@pytest.fixture
def client(two_principals: TestClient) -> TestClient:
    return two_principals


def put(client: TestClient, key: str, data: bytes, principal: str = "ci-a"):
    return client.put(f"/v1/packages/{key}", content=data,
                      headers={**auth(principal), "Content-Type": "application/octet-stream"})


def get(client: TestClient, key: str, principal: str = "ci-a"):
    return client.get(f"/v1/packages/{key}", headers=auth(principal))


def test_bytes_round_trip_per_principal(client: TestClient) -> None:
    assert get(client, KEY).status_code == 404
    assert put(client, KEY, BYTES).status_code == 204
    r = get(client, KEY)
    assert r.status_code == 200 and r.content == BYTES
    assert r.headers["content-type"] == "application/octet-stream"
    assert get(client, KEY, principal="ci-b").status_code == 404  # another principal's key space
    assert put(client, KEY, b"b's own", principal="ci-b").status_code == 204
    assert get(client, KEY).content == BYTES and get(client, KEY, principal="ci-b").content == b"b's own"
    assert put(client, KEY, b"replaced").status_code == 204 and get(client, KEY).content == b"replaced"
    counters = client.app.state.store.counters()
    assert (counters["package_puts"], counters["package_hits"], counters["package_misses"]) == (3, 4, 2)


def test_no_token_is_401(client: TestClient) -> None:
    assert client.get(f"/v1/packages/{KEY}").status_code == 401
    assert client.put(f"/v1/packages/{KEY}", content=BYTES).status_code == 401
    assert get(client, KEY).status_code == 404


@pytest.mark.parametrize("key", ["A" * 64, "a" * 63, "a" * 65, "g" * 64, ".." + "a" * 62])
def test_bad_keys_are_422(client: TestClient, key: str) -> None:
    assert put(client, key, BYTES).status_code == 422
    assert get(client, key).status_code == 422


def test_empty_and_oversized_bodies_are_refused(client: TestClient) -> None:
    assert put(client, KEY, b"").status_code == 422
    assert put(client, KEY, b"x" * (MAX_PACKAGE_BYTES + 1)).status_code == 413
    assert get(client, KEY).status_code == 404


def test_a_purge_of_the_cache_removes_every_package(client: TestClient) -> None:
    assert put(client, KEY, BYTES).status_code == 204
    assert put(client, KEY, BYTES, principal="ci-b").status_code == 204
    client.app.state.store.purge_cache()
    assert get(client, KEY).status_code == 404 and get(client, KEY, principal="ci-b").status_code == 404

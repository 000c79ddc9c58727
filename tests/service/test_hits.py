"""Cache hits (issue 24) through the real app on a real Redis: the fast GET answers exactly as the
FastAPI route does, HTTP-cache headers and 304s, the batch endpoint's lines and bounds, the client's
batch fetch (signatures still checked), revocation within the token cache's TTL, and the pipelined
Redis client (a Redis that goes away and comes back, a flushed script cache, a password and a
database number)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import SecretStr

from fxcc.client.cache import LocalCache
from fxcc.client.remote import RemoteService
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.errors import ArtifactError
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.signing import PublicKey, Signer, TrustedKeys, generate
from fxcc.compiler_core.wire import Target
from fxcc.service.app import create_app
from fxcc.service.redis_pipelined import Incomplete, pack, parse_reply
from fxcc.service.routes.artifacts import IMMUTABLE, SUPERSEDABLE
from fxcc.service.settings import ServiceSettings, TokenEntry
from fxcc.service.store import TokenRecord
from tests.service.conftest import unary_request
from tests.service.redis_server import RedisServer

TOKEN = "hits-client-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SIGNER = Signer(generate()[0])


@pytest.fixture(scope="module")
def base_artifact() -> Artifact:
    """One compiled artifact (for the CPU interpreter); variants below differ by key and target."""
    return compile_request(unary_request())


def variant(art: Artifact, n: int, **changes: Any) -> Artifact:
    """`art` under another key (the n-th), with `changes` to its manifest."""
    return Artifact(art.manifest.model_copy(update={"key": f"{n:064x}", **changes}), art.blobs)


def cuda(art: Artifact, n: int, tuned: bool) -> Artifact:
    return variant(art, n, target=Target(kind="cuda", arch=90), tuned=tuned)


def put(client: TestClient, art: Artifact) -> str:
    client.app.state.store.put_artifact(art, SIGNER.sign(art.manifest))
    return art.manifest.key


@pytest.fixture
def settings(redis_settings: ServiceSettings) -> ServiceSettings:
    # no process cache of bundles (test_bundles.py): what Redis holds is what is served
    return redis_settings.model_copy(update={"anonymous": None, "token_cache_s": 0.5, "bundle_cache_s": 0, "tokens": [
        TokenEntry(name="ci", role="client", token=SecretStr(TOKEN))]})


@pytest.fixture
def client(settings: ServiceSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def remote(client: TestClient, trusted: TrustedKeys | None) -> RemoteService:
    """A RemoteService whose HTTP client is the app's TestClient (an in-process transport)."""
    service = RemoteService("http://testserver", TOKEN, trusted=trusted)
    service.http.close()
    service.http = client
    client.headers.update(AUTH)
    return service


def test_fast_get_answers_as_the_fastapi_route(client: TestClient, base_artifact: Artifact) -> None:
    key = put(client, base_artifact)
    fast = client.get(f"/v1/artifacts/{key}", headers=AUTH)  # no query string: the ASGI fast path
    routed = client.get(f"/v1/artifacts/{key}?blobs=true", headers=AUTH)  # FastAPI's route
    assert fast.status_code == routed.status_code == 200
    assert fast.content == routed.content
    assert fast.headers["etag"] == routed.headers["etag"] and fast.headers["content-type"] == "application/json"
    body = fast.json()
    assert body["signature"] == SIGNER.sign(base_artifact.manifest)
    assert body["manifest"] == base_artifact.manifest.model_dump(mode="json")
    assert set(body["blobs"]) == {r.digest for r in base_artifact.manifest.blob_refs()}
    manifest_only = client.get(f"/v1/artifacts/{key}?blobs=0", headers=AUTH)
    assert "blobs" not in manifest_only.json() and manifest_only.headers["etag"] != fast.headers["etag"]
    assert client.get(f"/v1/artifacts/{'e' * 64}", headers=AUTH).json()["error"] == "NotFound"
    assert client.get(f"/v1/artifacts/{'E' * 64}", headers=AUTH).status_code == 422  # not a sha256: FastAPI's 422


def test_fast_get_authenticates_as_every_route(client: TestClient, base_artifact: Artifact) -> None:
    key = put(client, base_artifact)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": "Bearer "}):
        r = client.get(f"/v1/artifacts/{key}", headers=headers)
        assert r.status_code == 401, headers
        assert r.headers["www-authenticate"] == "Bearer" and r.json()["error"] == "Unauthorized"
    assert client.get(f"/v1/artifacts/{key}", headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200


def test_revoked_token_is_refused_within_the_cache_ttl(client: TestClient, base_artifact: Artifact) -> None:
    """A token made over the API is revoked through another replica (straight in the store, so
    this process's cache is not told): within token_cache_s (0.5 s here) every route refuses it."""
    key = put(client, base_artifact)
    store = client.app.state.store
    token = "made-over-the-api"
    assert store.add_token(TokenRecord(name="temp", role="client", sha256=_sha256(token)))
    headers = {"Authorization": f"Bearer {token}"}
    assert client.get(f"/v1/artifacts/{key}", headers=headers).status_code == 200  # now cached
    assert store.delete_token("temp")
    revoked_at = time.monotonic()
    while client.get(f"/v1/artifacts/{key}", headers=headers).status_code == 200:
        assert time.monotonic() - revoked_at < 0.5 + 1.0, "a revoked token was still served past the TTL"
        time.sleep(0.05)
    for path in (f"/v1/artifacts/{key}", f"/v1/artifacts/{key}?blobs=0", "/v1/jobs"):
        assert client.get(path, headers=headers).status_code == 401


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(("make", "cache_control"), [
    (lambda a: variant(a, 1), IMMUTABLE),  # the CPU interpreter's: never tuned
    (lambda a: cuda(a, 2, tuned=True), IMMUTABLE),
    (lambda a: cuda(a, 3, tuned=False), SUPERSEDABLE),  # its tuned copy may replace it
])
def test_http_cache_headers(client: TestClient, base_artifact: Artifact, make: Any, cache_control: str) -> None:
    key = put(client, make(base_artifact))
    for query in ("", "?blobs=1"):  # the fast path and FastAPI's route
        first = client.get(f"/v1/artifacts/{key}{query}", headers=AUTH)
        assert first.headers["cache-control"] == cache_control
        tag = first.headers["etag"]
        assert tag.startswith('"') and tag.endswith('"')
        again = client.get(f"/v1/artifacts/{key}{query}", headers={**AUTH, "If-None-Match": tag})
        assert again.status_code == 304 and again.content == b""
        assert again.headers["etag"] == tag and again.headers["cache-control"] == cache_control
        for match in (f'"x", W/{tag}', "*"):
            assert client.get(f"/v1/artifacts/{key}{query}", headers={**AUTH, "If-None-Match": match}).status_code == 304
        other = client.get(f"/v1/artifacts/{key}{query}", headers={**AUTH, "If-None-Match": '"stale"'})
        assert other.status_code == 200 and other.content == first.content
        # no 304 without a valid token: the validator is no way around authentication
        assert client.get(f"/v1/artifacts/{key}{query}", headers={"If-None-Match": tag}).status_code == 401


def test_access_check_for_an_http_cache(client: TestClient) -> None:
    assert client.get("/v1/artifacts/access", headers=AUTH).status_code == 204
    assert client.get("/v1/artifacts/access").status_code == 401
    assert client.get("/v1/artifacts/access", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_a_tuned_copy_changes_the_etag(client: TestClient, base_artifact: Artifact) -> None:
    untuned = cuda(base_artifact, 4, tuned=False)
    key = put(client, untuned)
    tag = client.get(f"/v1/artifacts/{key}", headers=AUTH).headers["etag"]
    put(client, cuda(base_artifact, 4, tuned=True))
    r = client.get(f"/v1/artifacts/{key}", headers={**AUTH, "If-None-Match": tag})
    assert r.status_code == 200 and r.json()["manifest"]["tuned"] is True
    assert r.headers["etag"] != tag and r.headers["cache-control"] == IMMUTABLE


def lines(r: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in r.content.splitlines()]


def test_batch_streams_hits_and_misses_in_order(client: TestClient, base_artifact: Artifact) -> None:
    keys = [put(client, variant(base_artifact, n)) for n in range(10, 14)]
    missing = "f" * 64
    asked = [keys[2], missing, keys[0], keys[2], keys[1], keys[3]]
    r = client.post("/v1/artifacts/batch", json={"keys": asked}, headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    got = lines(r)
    assert [g.get("key") for g in got[:-1]] == [keys[2], missing, keys[0], keys[1], keys[3]]  # each once
    assert got[1] == {"key": missing, "missing": True}
    assert got[-1] == {"done": True, "hits": 4, "missing": 1, "not_sent": []}
    single = client.get(f"/v1/artifacts/{keys[0]}", headers=AUTH).json()
    assert got[2] == {"key": keys[0], **single}
    manifests_only = lines(client.post("/v1/artifacts/batch", json={"keys": keys[:2], "blobs": False}, headers=AUTH))
    assert all("blobs" not in g for g in manifests_only[:-1]) and manifests_only[0]["manifest"]["key"] == keys[0]


def test_batch_never_lets_a_stored_manifest_split_its_line(client: TestClient, base_artifact: Artifact) -> None:
    """Whoever can write the cache's Redis may store any bytes; a manifest with a newline would
    make two lines of one (the client would still refuse what they say, but lose the batch)."""
    keys = [put(client, variant(base_artifact, n)) for n in (50, 51)]
    store = client.app.state.store
    raw = store.c.get(store.k.manifest(keys[0]))
    store.c.set(store.k.manifest(keys[0]), raw.replace(b',"plan":', b',\n"plan":', 1))
    got = lines(client.post("/v1/artifacts/batch", json={"keys": keys}, headers=AUTH))
    assert got[0] == {"key": keys[0], "missing": True} and got[1]["key"] == keys[1]
    assert got[-1]["hits"] == 1 and got[-1]["missing"] == 1


@pytest.mark.parametrize(("body", "status"), [
    ({"keys": []}, 422), ({"keys": ["A" * 64]}, 422), ({"keys": ["a" * 63]}, 422), ({}, 422),
    ({"keys": ["a" * 64], "more": 1}, 422), ({"keys": "a" * 64}, 422), ({"keys": ["a" * 64] * 9}, 413),
])
def test_batch_bad_input_is_4xx(settings: ServiceSettings, body: Any, status: int) -> None:
    with TestClient(create_app(settings.model_copy(update={"batch_max_keys": 8}))) as c:
        r = c.post("/v1/artifacts/batch", json=body, headers=AUTH)
        assert r.status_code == status and r.json()["message"]
        assert c.post("/v1/artifacts/batch", json={"keys": ["a" * 64]}).status_code == 401


def test_batch_bytes_bound_and_the_client_asks_again(settings: ServiceSettings, base_artifact: Artifact) -> None:
    one = len(json.dumps(base_artifact.manifest.model_dump(mode="json"))) + 2 * sum(
        len(b) for b in base_artifact.blobs.values())
    with TestClient(create_app(settings.model_copy(update={"batch_max_bytes": int(one * 2.5)}))) as c:
        keys = [put(c, variant(base_artifact, n)) for n in range(20, 25)]
        got = lines(c.post("/v1/artifacts/batch", json={"keys": keys}, headers=AUTH))
        sent = [g["key"] for g in got[:-1]]
        assert sent == keys[:len(sent)] and 1 <= len(sent) < len(keys)
        assert got[-1]["not_sent"] == keys[len(sent):]
        service = remote(c, TrustedKeys([SIGNER.public]))
        found = service.get_artifacts(keys + ["9" * 64])
        assert sorted(found) == sorted(keys)
        assert all(found[k].manifest.key == k for k in keys)


def test_client_batch_checks_signatures(client: TestClient, base_artifact: Artifact, tmp_path: Path) -> None:
    keys = [put(client, variant(base_artifact, n)) for n in range(30, 33)]
    cache = LocalCache(tmp_path / "cache")
    assert remote(client, TrustedKeys([SIGNER.public])).prefetch(keys + ["8" * 64], cache) == 3
    assert all(cache.get(k) is not None for k in keys)
    other = TrustedKeys([PublicKey(generate()[1])])
    with pytest.raises(ArtifactError, match="not trusted"):
        remote(client, other).get_artifacts(keys)
    cold = LocalCache(tmp_path / "cold")
    assert remote(client, other).prefetch(keys, cold) == 0  # refused, and prefetch never raises
    assert all(cold.get(k) is None for k in keys)
    # forged: the stored blob no longer matches its manifest's digest
    forged = variant(base_artifact, 34)
    key = put(client, forged)
    digest = forged.manifest.blob_refs()[0].digest
    store = client.app.state.store
    store.c.set(store.k.blob(digest), b"print('pwned')")
    with pytest.raises(ArtifactError):
        remote(client, TrustedKeys([SIGNER.public])).get_artifacts([key])


def test_embedded_store_serves_the_same_answers(embedded_settings: ServiceSettings, base_artifact: Artifact) -> None:
    with TestClient(create_app(embedded_settings)) as c:
        key = put(c, base_artifact)
        single = c.get(f"/v1/artifacts/{key}")
        assert single.status_code == 200 and single.headers["cache-control"] == IMMUTABLE
        assert c.get(f"/v1/artifacts/{key}", headers={"If-None-Match": single.headers["etag"]}).status_code == 304
        got = lines(c.post("/v1/artifacts/batch", json={"keys": [key, "7" * 64]}))
        assert got[0] == {"key": key, **single.json()} and got[1]["missing"] and got[2]["hits"] == 1
        # the fast path sits inside the loopback guard: a DNS-rebound Host gets nothing
        rebound = c.get(f"/v1/artifacts/{key}", headers={"Host": "evil.example"})
        assert rebound.status_code == 421 and b"manifest" not in rebound.content


def test_pipelined_client_survives_redis_going_and_coming_back(tmp_path: Path, base_artifact: Artifact) -> None:
    """A Redis of this test's own: stopped (503, never a 500), started again empty (a miss, then a
    hit once stored: the script cache was lost with it), flushed scripts, a password and database."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        settings = ServiceSettings(redis_url=server.url, data_dir=tmp_path / "data", anonymous=True,
                                   allowed_hosts=["testserver"])
        with TestClient(create_app(settings)) as c:
            key = put(c, base_artifact)
            assert c.get(f"/v1/artifacts/{key}").status_code == 200
            server.stop()
            down = c.get(f"/v1/artifacts/{key}")
            assert down.status_code == 503 and down.headers["retry-after"] and down.json()["error"] == "StoreUnavailable"
            assert c.post("/v1/artifacts/batch", json={"keys": [key]}).status_code == 503
            for r in (c.get(f"/v1/bundles/{'b' * 64}"), c.post("/v1/bundles", json={"keys": [key]})):
                assert r.status_code == 503 and r.json()["error"] == "StoreUnavailable"
            server.start()
            assert c.get(f"/v1/artifacts/{key}").status_code == 404
            put(c, base_artifact)
            assert c.get(f"/v1/artifacts/{key}").status_code == 200
            redis.Redis.from_url(server.url).script_flush()
            assert c.get(f"/v1/artifacts/{key}").status_code == 200
        admin = redis.Redis.from_url(server.url)
        admin.config_set("requirepass", "s3cret")
        url = f"redis://:s3cret@127.0.0.1:{server.port}/3"
        with TestClient(create_app(settings.model_copy(update={"redis_url": url}))) as c:
            assert c.get(f"/v1/artifacts/{key}").status_code == 404  # database 3 is not 0
            put(c, base_artifact)
            assert c.get(f"/v1/artifacts/{key}").json()["manifest"]["key"] == key
        with TestClient(create_app(settings.model_copy(update={"redis_url": url.replace("s3cret", "wrong")}))) as c:
            assert c.get(f"/v1/artifacts/{key}").status_code == 503
    finally:
        server.stop()


def test_redis_py_fallback_answers_alike(client: TestClient, base_artifact: Artifact) -> None:
    """For URLs the pipelined client does not take (rediss://, unix://) the hit path uses redis-py."""
    import redis.asyncio as aioredis

    key = put(client, base_artifact)
    fast = client.get(f"/v1/artifacts/{key}", headers=AUTH)
    store = client.app.state.store
    client.portal.call(store.aclose)
    store._async = aioredis.Redis.from_url(store.url, protocol=2)
    slow = client.get(f"/v1/artifacts/{key}", headers=AUTH)
    assert slow.status_code == 200 and slow.content == fast.content and slow.headers["etag"] == fast.headers["etag"]
    got = lines(client.post("/v1/artifacts/batch", json={"keys": [key, "6" * 64]}, headers=AUTH))
    assert got[0]["key"] == key and got[1]["missing"] and got[2]["hits"] == 1


@pytest.mark.parametrize("reply", [
    [b"manifest", b"", b"ab", b"x" * 300], [], None, b"", 42, b"OK", [[b"a"], None, [b"b", b"c"]],
])
def test_resp_replies_parse_whole_and_in_pieces(reply: Any) -> None:
    data = _encode(reply)
    assert parse_reply(data, 0) == (reply, len(data))
    for cut in range(len(data)):
        with pytest.raises(Incomplete):
            parse_reply(data[:cut], 0)
    err, end = parse_reply(b"-NOSCRIPT No matching script\r\n", 0)
    assert isinstance(err, redis.exceptions.NoScriptError) and end == 30
    assert pack("GET", b"k", 3) == b"*3\r\n$3\r\nGET\r\n$1\r\nk\r\n$1\r\n3\r\n"


def _encode(value: Any) -> bytes:
    if value is None:
        return b"$-1\r\n"
    if isinstance(value, int):
        return b":%d\r\n" % value
    if value == b"OK":
        return b"+OK\r\n"
    if isinstance(value, bytes):
        return b"$%d\r\n%s\r\n" % (len(value), value)
    return b"*%d\r\n" % len(value) + b"".join(_encode(v) for v in value)

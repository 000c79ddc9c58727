"""Bundles (issue 24) through the real app on a real Redis: a GET miss, the POST that assembles and
stores, the stored bundle served byte for byte with its HTTP-cache headers, what is never stored
(a bundle with a missing member, one whose member changed meanwhile), the bundles a tuned copy or a
delete drops, the byte bound and its `rest`, bad input, and the client: signatures and digests still
checked, a tampered bundle refused, one request per model on a warm start."""

# ruff: noqa: F811 - the fixtures of test_hits.py, imported, are its tests' parameters here too
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from fxcc.client.cache import LocalCache
from fxcc.client.remote import NoBundles, RemoteService
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.bundle import BundleError, bundle_key, decode_bundle, encode_bundle
from fxcc.compiler_core.errors import ArtifactError
from fxcc.compiler_core.signing import PublicKey, TrustedKeys, generate
from fxcc.service.app import create_app
from fxcc.service.routes.artifacts import IMMUTABLE, SUPERSEDABLE
from fxcc.service.routes.bundles import MEDIA_TYPE
from fxcc.service.settings import ServiceSettings
from tests.service.test_hits import (  # noqa: F401 - fixtures
    AUTH,
    SIGNER,
    base_artifact,
    client,
    cuda,
    put,
    remote,
    settings,
    variant,
)

TRUSTED = TrustedKeys([SIGNER.public])


def stored(client: TestClient, art: Artifact) -> bytes:
    store = client.app.state.store
    return store.c.get(store.k.manifest(art.manifest.key))


def test_get_misses_post_assembles_then_get_serves_it(client: TestClient, base_artifact: Artifact) -> None:
    arts = [variant(base_artifact, n) for n in range(100, 105)]
    keys = [put(client, a) for a in arts]
    key = bundle_key(keys)
    assert client.get(f"/v1/bundles/{key}", headers=AUTH).status_code == 404
    made = client.post("/v1/bundles", json={"keys": list(reversed(keys)) + keys[:1]}, headers=AUTH)
    assert made.status_code == 200 and made.headers["content-type"] == MEDIA_TYPE
    bundle = decode_bundle(made.content, keys)
    assert [k for k, _, _ in bundle.artifacts] == sorted(keys) and bundle.missing == bundle.rest == []
    by_key = {a.manifest.key: a for a in arts}
    for k, manifest_json, signature in bundle.artifacts:  # the stored bytes, as the worker signed them
        assert manifest_json == stored(client, by_key[k]) and signature == SIGNER.sign(by_key[k].manifest)
    assert bundle.blobs == base_artifact.blobs  # shared by all five: framed once
    served = client.get(f"/v1/bundles/{key}", headers=AUTH)  # the fast path: the stored bundle
    routed = client.get(f"/v1/bundles/{key}?via=router", headers=AUTH)  # FastAPI's route
    for r in (served, routed):
        assert r.status_code == 200 and r.content == made.content
        assert r.headers["etag"] == made.headers["etag"] and r.headers["cache-control"] == IMMUTABLE
        assert r.headers["content-type"] == MEDIA_TYPE
    tag = served.headers["etag"]
    for query in ("", "?via=router"):
        again = client.get(f"/v1/bundles/{key}{query}", headers={**AUTH, "If-None-Match": tag})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == tag
        assert client.get(f"/v1/bundles/{key}{query}", headers={"If-None-Match": tag}).status_code == 401
    client.portal.call(asyncio.sleep, 0.3)  # the hits of a tenth of a second go out as one HINCRBY
    counters = client.app.state.store.counters()
    client.get(f"/v1/bundles/{key}", headers=AUTH)
    client.get(f"/v1/bundles/{key}", headers=AUTH)
    client.portal.call(asyncio.sleep, 0.3)
    assert client.app.state.store.counters()["hits"] == counters["hits"] + 2 * len(keys)


def test_a_missing_member_is_answered_never_stored(client: TestClient, base_artifact: Artifact) -> None:
    keys = [put(client, variant(base_artifact, 110)), "d" * 64]
    r = client.post("/v1/bundles", json={"keys": keys}, headers=AUTH)
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    assert decode_bundle(r.content, keys).missing == ["d" * 64]
    assert client.get(f"/v1/bundles/{bundle_key(keys)}", headers=AUTH).status_code == 404


def test_a_tuned_copy_or_a_delete_drops_the_bundles_holding_it(client: TestClient, base_artifact: Artifact) -> None:
    untuned = cuda(base_artifact, 120, tuned=False)
    keys = [put(client, untuned), put(client, variant(base_artifact, 121))]
    key = bundle_key(keys)
    first = client.post("/v1/bundles", json={"keys": keys}, headers=AUTH)
    assert first.headers["cache-control"] == SUPERSEDABLE  # one member may still be replaced
    assert client.get(f"/v1/bundles/{key}", headers=AUTH).status_code == 200
    put(client, cuda(base_artifact, 120, tuned=True))
    assert client.get(f"/v1/bundles/{key}", headers=AUTH).status_code == 404
    again = client.post("/v1/bundles", json={"keys": keys}, headers=AUTH)
    assert again.headers["cache-control"] == IMMUTABLE and again.headers["etag"] != first.headers["etag"]
    tuned = [m for k, m, _ in decode_bundle(again.content, keys).artifacts if k == keys[0]]
    assert b'"tuned":true' in tuned[0]
    assert client.get(f"/v1/bundles/{key}", headers=AUTH).status_code == 200
    client.app.state.store.delete_artifact(keys[1])
    assert client.get(f"/v1/bundles/{key}", headers=AUTH).status_code == 404
    assert decode_bundle(client.post("/v1/bundles", json={"keys": keys}, headers=AUTH).content, keys).missing == [keys[1]]


def test_a_member_changed_while_assembling_is_not_stored(client: TestClient, base_artifact: Artifact) -> None:
    art = variant(base_artifact, 125)
    key = put(client, art)
    store = client.app.state.store
    data = encode_bundle(bundle_key([key]), [], [], [], True)
    assert not client.portal.call(store.put_bundle_async, bundle_key([key]), data, [(key, b"{}")], 60)
    assert store.c.get(store.k.bundle(bundle_key([key]))) is None
    assert client.portal.call(store.put_bundle_async, bundle_key([key]), data, [(key, stored(client, art))], 60)
    assert store.c.ttl(store.k.bundle(bundle_key([key]))) > 0


def test_concurrent_asks_share_one_read(client: TestClient, base_artifact: Artifact) -> None:
    keys = [put(client, variant(base_artifact, 130))]
    key = bundle_key(keys)
    client.post("/v1/bundles", json={"keys": keys}, headers=AUTH)
    store = client.app.state.store
    reads = []
    real = store._read_bundle

    async def counted(k: str) -> Any:
        reads.append(k)
        return await real(k)

    store._read_bundle = counted

    async def many() -> list[Any]:
        return await asyncio.gather(*(store.get_bundle_async(key) for _ in range(50)))

    got = client.portal.call(many)
    assert len(reads) == 1 and len(set(got)) == 1 and got[0].startswith(b"FXCCBDL1")
    assert client.portal.call(store.get_bundle_async, key) == got[0] and len(reads) == 2  # none in flight: read again


def test_a_process_serves_what_it_read_for_the_cache_ttl_only(settings: ServiceSettings,
                                                              base_artifact: Artifact) -> None:
    """FXCC_BUNDLE_CACHE_S: a bundle dropped in Redis (its member tuned) is still served by a process
    that read it, within the TTL (0.5 s here), then no more."""
    with TestClient(create_app(settings.model_copy(update={"bundle_cache_s": 0.5}))) as c:
        keys = [put(c, cuda(base_artifact, 135, tuned=False))]
        key = bundle_key(keys)
        c.post("/v1/bundles", json={"keys": keys}, headers=AUTH)
        assert c.get(f"/v1/bundles/{key}", headers=AUTH).status_code == 200  # read, and kept
        put(c, cuda(base_artifact, 135, tuned=True))  # drops the bundle in Redis
        dropped_at = time.monotonic()
        while c.get(f"/v1/bundles/{key}", headers=AUTH).status_code == 200:
            assert time.monotonic() - dropped_at < 0.5 + 1.0, "a dropped bundle was served past the TTL"
            time.sleep(0.05)
        assert c.get(f"/v1/bundles/{key}", headers=AUTH).status_code == 404


def test_byte_bound_splits_into_stored_bundles_the_client_follows(settings: ServiceSettings,
                                                                  base_artifact: Artifact) -> None:
    one = len(base_artifact.manifest_json()) + sum(len(b) for b in base_artifact.blobs.values())
    with TestClient(create_app(settings.model_copy(update={"bundle_max_bytes": int(one * 2.5)}))) as c:
        keys = sorted(put(c, variant(base_artifact, n)) for n in range(140, 146))
        got = decode_bundle(c.post("/v1/bundles", json={"keys": keys}, headers=AUTH).content, keys)
        assert 1 < len(got.artifacts) < len(keys) and got.rest == keys[len(got.artifacts):]
        found = remote(c, TRUSTED).get_bundled(keys)
        assert sorted(found) == keys and all(found[k].manifest.key == k for k in keys)
        for part in (keys, got.rest):  # each part was stored: the next rank's GETs are Redis reads
            assert c.get(f"/v1/bundles/{bundle_key(part)}", headers=AUTH).status_code == 200
        assert sorted(remote(c, TRUSTED).get_bundled(keys + ["c" * 64])) == keys


@pytest.mark.parametrize(("body", "status"), [
    ({"keys": []}, 422), ({"keys": ["A" * 64]}, 422), ({"keys": ["a" * 63]}, 422), ({}, 422),
    ({"keys": ["a" * 64], "blobs": False}, 422), ({"keys": [f"{n:064x}" for n in range(9)]}, 413),
])
def test_bad_input_is_4xx(settings: ServiceSettings, body: Any, status: int) -> None:
    with TestClient(create_app(settings.model_copy(update={"batch_max_keys": 8}))) as c:
        r = c.post("/v1/bundles", json=body, headers=AUTH)
        assert r.status_code == status and r.json()["message"]
        assert c.post("/v1/bundles", json={"keys": ["a" * 64]}).status_code == 401
        assert c.get(f"/v1/bundles/{'A' * 64}", headers=AUTH).status_code == 422


def test_garbage_in_redis_is_a_miss(client: TestClient, base_artifact: Artifact) -> None:
    keys = [put(client, variant(base_artifact, 150))]
    store = client.app.state.store
    store.c.set(store.k.bundle(bundle_key(keys)), b"FXCCBDL1 not a bundle")
    assert client.get(f"/v1/bundles/{bundle_key(keys)}", headers=AUTH).status_code == 404
    r = client.post("/v1/bundles", json={"keys": keys}, headers=AUTH)  # assembled again over it
    assert r.status_code == 200 and [k for k, _, _ in decode_bundle(r.content, keys).artifacts] == keys


def test_client_checks_every_artifact_of_a_bundle(client: TestClient, base_artifact: Artifact, tmp_path: Path) -> None:
    keys = [put(client, variant(base_artifact, n)) for n in range(160, 163)]
    with pytest.raises(ArtifactError, match="not trusted"):
        remote(client, TrustedKeys([PublicKey(generate()[1])])).get_bundled(keys)
    store = client.app.state.store
    good = client.post("/v1/bundles", json={"keys": keys}, headers=AUTH).content
    blob = next(iter(base_artifact.blobs.values()))
    store.c.set(store.k.bundle(bundle_key(keys)), good.replace(blob, bytes(len(blob)), 1))  # same length
    with pytest.raises(ArtifactError, match="digest"):
        remote(client, TRUSTED).get_bundled(keys)
    cache = LocalCache(tmp_path / "cache")
    assert remote(client, TRUSTED).prefetch(keys, cache) == 0 and cache.get(keys[0]) is None  # never raises


def test_prefetch_is_one_request_per_model(client: TestClient, base_artifact: Artifact, tmp_path: Path) -> None:
    keys = [put(client, variant(base_artifact, n)) for n in range(170, 180)]
    asked: list[str] = []
    service = remote(client, TRUSTED)
    client.event_hooks["request"] = [lambda request: asked.append(f"{request.method} {request.url.path}")]
    try:
        assert service.prefetch(keys, LocalCache(tmp_path / "rank0")) == 10  # assembles it
        assert asked == [f"GET /v1/bundles/{bundle_key(keys)}", "POST /v1/bundles"]
        asked.clear()
        cache = LocalCache(tmp_path / "rank1")
        assert service.prefetch(keys, cache) == 10 and asked == [f"GET /v1/bundles/{bundle_key(keys)}"]
        assert all(cache.get(k) is not None for k in keys)
        asked.clear()
        assert service.prefetch(keys, cache) == 0 and asked == []  # all local already
    finally:
        client.event_hooks["request"] = []


def test_embedded_store_assembles_every_time(embedded_settings: ServiceSettings, base_artifact: Artifact) -> None:
    with TestClient(create_app(embedded_settings)) as c:
        keys = [put(c, variant(base_artifact, n)) for n in (190, 191)]
        assert c.get(f"/v1/bundles/{bundle_key(keys)}").status_code == 404
        r = c.post("/v1/bundles", json={"keys": keys})
        assert r.status_code == 200 and [k for k, _, _ in decode_bundle(r.content, keys).artifacts] == sorted(keys)
        found = RemoteService.get_bundled(_embedded_remote(c), keys)
        assert sorted(found) == sorted(keys)


def _embedded_remote(c: TestClient) -> RemoteService:
    service = RemoteService("http://testserver", None, trusted=TRUSTED)
    service.http.close()
    service.http = c
    return service


def test_a_service_without_bundles_falls_back_to_the_batch(settings: ServiceSettings, base_artifact: Artifact,
                                                           tmp_path: Path) -> None:
    app = create_app(settings)

    async def before_bundles(scope: Any, receive: Any, send: Any) -> None:
        """The app as an fxcc before bundles answers them: FastAPI's 404 for an unknown path."""
        if scope["type"] == "http" and scope["path"].startswith("/v1/bundles"):
            await JSONResponse({"detail": "Not Found"}, status_code=404)(scope, receive, send)
            return
        await app(scope, receive, send)

    with TestClient(before_bundles) as c:
        art = variant(base_artifact, 195)
        app.state.store.put_artifact(art, SIGNER.sign(art.manifest))
        service = remote(c, TRUSTED)
        with pytest.raises(NoBundles):
            service.get_bundled([art.manifest.key])
        assert service.prefetch([art.manifest.key], LocalCache(tmp_path / "cache")) == 1  # the batch endpoint


@pytest.mark.parametrize("damage", ["prefix", "keys", "lengths", "header"])
def test_decode_refuses_what_does_not_add_up(base_artifact: Artifact, damage: str) -> None:
    from fxcc.compiler_core.bundle import BundledArtifact

    key = base_artifact.manifest.key
    data = encode_bundle(bundle_key([key]), [BundledArtifact(key, base_artifact.manifest_json(), None,
                                                             list(base_artifact.blobs.items()))], [], [], True)
    assert decode_bundle(data, [key]).artifacts[0][1] == base_artifact.manifest_json()
    asked = [key]
    if damage == "prefix":
        data = b"X" + data[1:]
    elif damage == "keys":
        asked = [key, "e" * 64]
    elif damage == "lengths":
        data = data + b"extra"
    else:
        data = data.replace(b'"bundle":', b'"bundle" ', 1)
    with pytest.raises(BundleError):
        decode_bundle(data, asked)


def test_process_cache_is_bounded_and_keeps_the_newest() -> None:
    from fxcc.service.redis_cache import BundleCache

    cache = BundleCache(60, 1000)
    cache.put("big", b"x" * 251)  # over a quarter of the bound: never kept
    for name in ("a", "b", "c", "d", "e"):
        cache.put(name, name.encode() * 250)
    assert cache.get("big") is None and cache.get("a") is None  # the oldest went
    assert [cache.get(n) for n in "bcde"] == [n.encode() * 250 for n in "bcde"] and cache.size == 1000
    off = BundleCache(0, 1000)
    off.put("a", b"a")
    assert off.get("a") is None


def test_a_packages_artifacts_fetched_at_once_are_those_fetched_one_by_one(
        client: TestClient, base_artifact: Artifact, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dynamo_cache.fetch_artifacts (a loaded package's artifacts, on its side thread): the local
    cache's, the rest in one bundle, each verified as get_artifact verifies it; a refused one raises."""
    from types import SimpleNamespace

    from fxcc.client import dynamo_cache, dynamo_state

    arts = [variant(base_artifact, n) for n in range(196, 200)]
    keys = [put(client, a) for a in arts]
    LocalCache(tmp_path / "cache").put(arts[0])
    settings = SimpleNamespace(url="http://testserver", cache_dir=tmp_path / "cache")
    service = remote(client, TRUSTED)
    monkeypatch.setattr(dynamo_state, "_remote", lambda s: service)
    asked: list[str] = []
    client.event_hooks["request"] = [lambda request: asked.append(f"{request.method} {request.url.path}")]
    try:
        found = dynamo_cache.fetch_artifacts(settings, [*keys, "9" * 64])
    finally:
        client.event_hooks["request"] = []
    # one bundle of what the local cache lacks; the key it did not hold asked for once more by itself
    assert asked == [f"GET /v1/bundles/{bundle_key([*keys[1:], '9' * 64])}", "POST /v1/bundles",
                     f"GET /v1/artifacts/{'9' * 64}"]
    assert sorted(found) == sorted(keys)  # the unknown key absent
    assert {k: source for k, (_, source) in found.items()} == {keys[0]: "local-hit", **dict.fromkeys(keys[1:], "remote-hit")}
    for key, (art, _) in found.items():
        one = service.get_artifact(key)
        assert art.manifest == one.manifest and art.blobs == one.blobs
        assert LocalCache(tmp_path / "cache").get(key) is not None  # kept for the next process
    # store=False (a package load, before its first call): nothing written until store_fetched
    deferred = dynamo_cache.fetch_artifacts(SimpleNamespace(url="http://testserver", cache_dir=tmp_path / "new"),
                                            keys, store=False)
    assert sorted(deferred) == sorted(keys) and all(LocalCache(tmp_path / "new").get(k) is None for k in keys)
    assert dynamo_cache.store_fetched(SimpleNamespace(cache_dir=tmp_path / "new"), deferred) == len(keys)
    assert all(LocalCache(tmp_path / "new").get(k) is not None for k in keys)
    untrusted = remote(client, TrustedKeys([PublicKey(generate()[1])]))
    monkeypatch.setattr(dynamo_state, "_remote", lambda s: untrusted)
    for wanted in (keys[1:2], keys[1:]):  # one GET, or a bundle then each one's own GET
        with pytest.raises(ArtifactError, match="not trusted"):
            dynamo_cache.fetch_artifacts(SimpleNamespace(url="http://testserver", cache_dir=tmp_path / "other"), wanted)

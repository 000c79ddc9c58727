"""HTTP validation through the real FastAPI app: every bad input is a 4xx that names what is wrong."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from fxcc.compiler_core.wire import CompileRequest
from fxcc.service.app import create_app
from fxcc.service.settings import ServiceSettings


@pytest.fixture
def client(embedded_settings: ServiceSettings) -> Iterator[TestClient]:
    settings = embedded_settings.model_copy(update={"max_request_bytes": 64 * 1024})
    with TestClient(create_app(settings)) as c:
        yield c


def post(client: TestClient, body: object) -> object:
    data = body.model_dump_json() if isinstance(body, CompileRequest) else json.dumps(body)
    return client.post("/v1/compile", content=data, headers={"Content-Type": "application/json"})


def test_unknown_op_names_node_and_op(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    r = post(client, make_unary("aten.no_such_op.default"))
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "InvalidGraph"
    assert body["node"] == "y" and body["op"] == "aten.no_such_op.default"


@pytest.mark.parametrize("target", ["builtins.eval", "os.system", "aten.__class__.default"])
def test_targets_outside_aten_are_rejected(client: TestClient, make_unary: Callable[..., CompileRequest],
                                           target: str) -> None:
    r = post(client, make_unary(target))
    assert r.status_code == 422 and r.json()["node"] == "y"


def test_malformed_args_fail_shape_propagation(client: TestClient,
                                               make_sum: Callable[[int], CompileRequest]) -> None:
    r = post(client, make_sum(7))
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "InvalidGraph" and body["node"] == "total" and body["op"] == "aten.sum.dim_IntList"
    assert post(client, make_sum(1)).status_code == 202


def test_bad_schema_version_names_the_field(client: TestClient,
                                            make_unary: Callable[..., CompileRequest]) -> None:
    body = json.loads(make_unary().model_dump_json())
    body["schema_version"] = 99
    r = post(client, body)
    assert r.status_code == 422
    assert r.json()["error"] == "ValidationError" and "schema_version" in r.json()["message"]


@pytest.mark.parametrize("mutate", [
    lambda b: b["graph"]["placeholders"][0]["spec"].update(dtype="float99"),
    lambda b: b["graph"]["nodes"][0]["args"].append({"kind": "pickle", "value": "gASV"}),
    lambda b: b.update(priority="urgent"),
    lambda b: b.update(key="f" * 64),  # the client's key is not part of the request at all
])
def test_schema_violations_are_422(client: TestClient, make_unary: Callable[..., CompileRequest],
                                   mutate: Callable[[dict], None]) -> None:
    body = json.loads(make_unary().model_dump_json())
    mutate(body)
    r = post(client, body)
    assert r.status_code == 422 and r.json()["detail"]


def test_not_json_is_4xx(client: TestClient) -> None:
    r = client.post("/v1/compile", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "ValidationError"
    # Bytes that are not even UTF-8 (a pickle's header, say): the checker's parser refuses them too.
    r = client.post("/v1/compile", content=b"\x80\x04\x95", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "ValidationError" and "JSON" in r.json()["message"]


def test_oversized_body_is_413(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    big = make_unary().model_dump_json().encode() + b" " * (64 * 1024)
    r = client.post("/v1/compile", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "RequestTooLarge"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        yield big[:1000]
        yield big[1000:]

    r = client.post("/v1/compile", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413


def test_unknown_job_is_404(client: TestClient) -> None:
    r = client.get("/v1/jobs/" + "0" * 32)
    assert r.status_code == 404 and r.json()["error"] == "NotFound"
    assert client.get("/v1/jobs/..%2F..%2Fetc").status_code in (404, 422)


def test_unknown_artifact_is_404(client: TestClient) -> None:
    assert client.get("/v1/artifacts/" + "a" * 64).status_code == 404
    assert client.get("/v1/artifacts/" + "a" * 64, params={"blobs": 0}).status_code == 404


@pytest.mark.parametrize("key", ["abc", "A" * 64, "g" * 64, "a" * 65, "a" * 63 + "."])
def test_malformed_key_is_422(client: TestClient, key: str) -> None:
    r = client.get(f"/v1/artifacts/{key}")
    assert r.status_code == 422 and "key" in r.json()["message"]


def test_healthz_embedded(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"ok": True, "store": "embedded"}


def test_redis_down_is_503(tmp_path, make_unary: Callable[..., CompileRequest]) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = ServiceSettings(redis_url=f"redis://127.0.0.1:{port}/0", data_dir=tmp_path, anonymous=True)
    with TestClient(create_app(settings), base_url="http://localhost:8470") as c:
        r = c.get("/healthz")
        assert r.status_code == 503 and r.json()["ok"] is False and r.json()["store"] == "redis"
        r = post(c, make_unary())
        assert r.status_code == 503 and r.headers["Retry-After"]
        assert c.get("/v1/jobs/" + "0" * 32).status_code == 503


def test_bearer_token_when_configured(embedded_settings: ServiceSettings,
                                      make_unary: Callable[..., CompileRequest]) -> None:
    settings = embedded_settings.model_copy(update={"token": SecretStr("s3cret")})
    with TestClient(create_app(settings)) as c:
        assert c.get("/healthz").status_code == 200  # open for load balancers
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            r = c.get("/v1/jobs/" + "0" * 32, headers=headers)
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
            assert "s3cret" not in r.text
        ok = {"Authorization": "Bearer s3cret"}
        assert c.get("/v1/jobs/" + "0" * 32, headers=ok).status_code == 404
        r = c.post("/v1/compile", content=make_unary().model_dump_json(),
                   headers={**ok, "Content-Type": "application/json"})
        assert r.status_code == 202


def test_node_limit_names_the_setting(embedded_settings: ServiceSettings,
                                      make_unary: Callable[..., CompileRequest]) -> None:
    body = json.loads(make_unary().model_dump_json())
    nodes = body["graph"]["nodes"]
    for i in range(3):
        nodes.append({"name": f"z{i}", "target": "aten.cos.default", "args": [{"kind": "node", "name": "x"}]})
    with TestClient(create_app(embedded_settings.model_copy(update={"max_nodes": 3}))) as c:
        r = post(c, body)
        assert r.status_code == 422 and r.json()["error"] == "InvalidGraph"
        assert "4 nodes" in r.json()["message"] and "FXCC_MAX_NODES" in r.json()["message"]
        body["graph"]["nodes"] = nodes[:3]
        assert post(c, body).status_code == 202


@pytest.mark.parametrize(("sizes", "strides", "says"), [
    ([1 << 41], [1], "sizes must lie"),
    ([1 << 20, 1 << 21], [1 << 21, 1], "exceeds the limit"),
    ([-3, 4], [4, 1], "sizes must lie"),
    ([4, 8], [8], "2 sizes but 1 strides"),
    ([1] * 13, [1] * 13, "at most 12"),
])
def test_absurd_shapes_are_422(client: TestClient, make_unary: Callable[..., CompileRequest],
                               sizes: list[int], strides: list[int], says: str) -> None:
    body = json.loads(make_unary().model_dump_json())
    body["graph"]["placeholders"][0]["spec"].update(sizes=sizes, strides=strides)
    r = post(client, body)
    assert r.status_code == 422 and says in r.json()["message"], r.json()


def test_shapes_torch_rejects_are_422_not_500(client: TestClient, make_unary: Callable[..., CompileRequest]) -> None:
    body = json.loads(make_unary().model_dump_json())
    body["graph"]["nodes"][0].update(target="aten.view.default",
                                     args=[{"kind": "node", "name": "x"},
                                           {"kind": "list", "items": [{"kind": "int", "value": 5}]}])
    r = post(client, body)
    assert r.status_code == 422 and r.json()["node"] == "y" and r.json()["op"] == "aten.view.default"

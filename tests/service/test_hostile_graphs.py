"""Hostile graphs through the real FastAPI app: size expressions that would freeze the process and ops
that do I/O are a quick 422 naming the expression or the op, and the service stays healthy."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fxcc.service.app import create_app
from fxcc.service.settings import ServiceSettings

# A behaviour bound, not a speed number: each of these froze the API process (holding the GIL,
# ignoring SIGTERM) for minutes to forever before sizes were bounded.
QUICK_S = 5.0


@pytest.fixture
def client(embedded_settings: ServiceSettings) -> Iterator[TestClient]:
    with TestClient(create_app(embedded_settings)) as c:
        yield c


def post(client: TestClient, body: dict[str, Any]) -> tuple[Any, float]:
    t0 = time.monotonic()
    r = client.post("/v1/compile", content=json.dumps(body), headers={"Content-Type": "application/json"})
    return r, time.monotonic() - t0


def strided_request(stride: str) -> dict[str, Any]:
    """sin of an (s0, 4) float32 input whose row stride is `stride`."""
    x = {"name": "x", "spec": {"dtype": "float32", "sizes": ["s0", 4], "strides": [stride, 1]}}
    return {"graph": {"symbols": [{"name": "s0"}], "placeholders": [x],
                      "nodes": [{"name": "y", "target": "aten.sin.default", "args": [{"kind": "node", "name": "x"}]}],
                      "outputs": [{"kind": "node", "name": "y"}]}}


def view_request(size: str) -> dict[str, Any]:
    """view of an (s0, 4) input as (`size`,): the expression travels as a node argument."""
    x = {"name": "x", "spec": {"dtype": "float32", "sizes": ["s0", 4], "strides": [4, 1]}}
    args = [{"kind": "node", "name": "x"}, {"kind": "list", "items": [{"kind": "sym", "expr": size}]}]
    return {"graph": {"symbols": [{"name": "s0"}], "placeholders": [x],
                      "nodes": [{"name": "y", "target": "aten.view.default", "args": args}],
                      "outputs": [{"kind": "node", "name": "y"}]}}


@pytest.mark.parametrize("make", [strided_request, view_request])
@pytest.mark.parametrize("expr, problem", [
    ("pow(s0, 9223372036854775807)", "pow exponent 9223372036854775807 over the limit of 64"),
    ("pow(3, 100000000)", "pow exponent 100000000 over the limit of 64"),
    ("pow(pow(pow(pow(3, 64), 64), 64), 64)", "out of range"),
    ("pow(pow(pow(pow(s0 + 1, 64), 64), 64), 64)", "degree 16777216 over the limit of 64"),
])
def test_over_large_size_expressions_are_a_quick_422_naming_them(client: TestClient, make: Any,
                                                                  expr: str, problem: str) -> None:
    r, elapsed = post(client, make(expr))
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "ValidationError"
    assert expr in body["message"] and problem in body["message"]
    assert elapsed < QUICK_S
    assert client.get("/healthz").status_code == 200


def test_largest_allowed_power_still_compiles(client: TestClient) -> None:
    """The bound refuses what cannot be a size, not powers as such: pow(s0, 2) is a fine stride."""
    r, _ = post(client, strided_request("pow(s0, 2)"))
    assert r.status_code == 202, r.text


@pytest.mark.parametrize("target, args, reason", [
    ("aten.from_file.default", [{"kind": "str", "value": "etc-passwd"}, {"kind": "bool", "value": False},
                                {"kind": "int", "value": 16}], "it reads a file"),
    ("aten._local_scalar_dense.default", [{"kind": "node", "name": "x"}], "to the host"),
    ("aten.set_.source_Tensor", [{"kind": "node", "name": "x"}, {"kind": "node", "name": "x"}], "swaps a tensor's storage"),
    ("aten._fused_dropout.default", [{"kind": "node", "name": "x"}, {"kind": "float", "value": 0.5}], "RNG state"),
])
def test_ops_outside_the_allow_list_are_a_422_naming_them(client: TestClient, target: str,
                                                          args: list[dict[str, Any]], reason: str) -> None:
    x = {"name": "x", "spec": {"dtype": "float32", "sizes": [4, 4], "strides": [4, 1]}}
    body = {"graph": {"placeholders": [x], "nodes": [{"name": "evil", "target": target, "args": args}],
                      "outputs": [{"kind": "node", "name": "evil"}]}}
    r, elapsed = post(client, body)
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["error"] == "InvalidGraph" and err["op"] == target and err["node"] == "evil"
    assert target in err["message"] and reason in err["message"]
    assert elapsed < QUICK_S
    assert client.get("/healthz").status_code == 200


def opaque_request(target: str, schema: str, functional: bool = False, outputs: Any = None) -> dict[str, Any]:
    """x → an op only the client has (compiler_core.opaque) → its output."""
    x = {"name": "x", "spec": {"dtype": "float32", "sizes": [4, 4], "strides": [4, 1]}}
    opaque = {"op_schema": schema, "functional": functional, "outputs": outputs or [x["spec"]]}
    node = {"name": "c", "target": target, "args": [{"kind": "node", "name": "x"}], "opaque": opaque}
    return {"graph": {"placeholders": [x], "nodes": [node], "outputs": [{"kind": "node", "name": "c"}]}}


def test_an_op_the_service_has_never_heard_of_is_accepted_as_data(client: TestClient) -> None:
    r, _ = post(client, opaque_request("nowhere.op.default", "nowhere::op(Tensor x) -> Tensor"))
    assert r.status_code == 202, r.text


@pytest.mark.parametrize("target, schema, problem", [
    ("os.system.default", "os::system(Tensor x) -> Tensor; rm -rf /", "no valid name"),
    ("nowhere.op.default", "nowhere::op(Tensor x) -> Tens$or", "outside the grammar"),
    ("nowhere.op.default", "nowhere::op(Tensor x=__import__('os')) -> Tensor", "default outside the grammar"),
    ("nowhere.op.default", "nowhere::other(Tensor x) -> Tensor", "is not node target"),
    ("aten.sin.default", "aten::sin(Tensor self) -> Tensor", "not opaque"),
    ("nowhere.op.default", "nowhere::op(Tensor(a!) x) -> Tensor", "not functionalized"),
    ("nowhere.op.default", "nowhere::op(" + "Tensor x, " * 500 + "Tensor y) -> Tensor", "4096"),
])
def test_bad_opaque_ops_are_a_quick_422_naming_the_problem(client: TestClient, target: str, schema: str,
                                                          problem: str) -> None:
    r, elapsed = post(client, opaque_request(target, schema))
    assert r.status_code == 422, r.text
    assert problem in r.json()["message"]
    assert elapsed < QUICK_S

"""Fuzzing the HTTP API with a bounded budget: no input may earn a 5xx. Hypothesis drives the wire
models (random graphs of real aten ops with nonsense arguments, and random edits of a valid request);
schemathesis drives every operation of the app's OpenAPI document."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fxcc.service.app import create_app
from fxcc.service.settings import ServiceSettings

FUZZ = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

OPS = ["aten.add.Tensor", "aten.mul.Tensor", "aten.sum.dim_IntList", "aten.view.default", "aten.permute.default",
       "aten.cat.default", "aten.mm.default", "aten.expand.default", "aten.sin.default", "aten.amax.default",
       "aten._softmax.default", "aten.convolution.default", "aten.index_select.default", "aten.slice.Tensor",
       "aten.where.self", "aten.native_layer_norm.default", "getitem", "aten.full.default", "aten.to.dtype"]
# Mostly sensible values, so that most graphs pass the schema and reach shape propagation.
DTYPES = ["float32"] * 6 + ["float16", "bfloat16", "int64", "bool", "complex64", "float99"]
SIZES = [1, 2, 3, 4, 8] * 4 + [0, 1 << 20, 1 << 41, -1]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@st.composite
def graphs(draw: st.DrawFn) -> dict[str, Any]:
    """A request whose graph is well-formed JSON but whose shapes and arguments are anything."""
    names: list[str] = []
    placeholders = []
    for i in range(draw(st.integers(1, 3))):
        rank = draw(st.integers(0, 4))
        sizes = draw(st.lists(st.sampled_from(SIZES), min_size=rank, max_size=rank))
        strides = [*draw(st.lists(st.sampled_from([1, 2, 4, 8, 0, -1, 1 << 21]), min_size=rank, max_size=rank)),
                   *([1] if draw(st.integers(0, 9)) == 0 else [])]
        placeholders.append({"name": f"x{i}", "spec": {"dtype": draw(st.sampled_from(DTYPES)), "sizes": sizes,
                                                      "strides": strides}})
        names.append(f"x{i}")

    def arg() -> st.SearchStrategy[dict[str, Any]]:
        scalar = st.one_of(
            st.sampled_from(names).map(lambda n: {"kind": "node", "name": n}),
            st.sampled_from([-1, 0, 1, 2, 3, 4, 8, 1 << 33]).map(lambda v: {"kind": "int", "value": v}),
            st.sampled_from([0.5, -1.0, "inf", "nan"]).map(lambda v: {"kind": "float", "value": v}),
            st.booleans().map(lambda v: {"kind": "bool", "value": v}),
            st.just({"kind": "none"}),
            st.sampled_from(["float32", "int64"]).map(lambda v: {"kind": "dtype", "value": v}))
        return scalar | st.lists(scalar, max_size=4).map(lambda items: {"kind": "list", "items": items})

    nodes = []
    for i in range(draw(st.integers(1, 4))):
        nodes.append({"name": f"n{i}", "target": draw(st.sampled_from(OPS)),
                      "args": draw(st.lists(arg(), max_size=5))})
        names.append(f"n{i}")
    outputs = [{"kind": "node", "name": draw(st.sampled_from(names))}]
    return {"graph": {"placeholders": placeholders, "nodes": nodes, "outputs": outputs},
            "priority": draw(st.sampled_from(["interactive", "precompile"]))}


VALID = {"schema_version": 1, "graph": {
    "placeholders": [{"name": "x", "spec": {"dtype": "float32", "sizes": [4, 8], "strides": [8, 1]}}],
    "nodes": [{"name": "y", "target": "aten.sum.dim_IntList",
               "args": [{"kind": "node", "name": "x"}, {"kind": "list", "items": [{"kind": "int", "value": 1}]}]}],
    "outputs": [{"kind": "node", "name": "y"}]}}


def paths(obj: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from paths(v, (*prefix, i))


@st.composite
def edited_requests(draw: st.DrawFn) -> Any:
    """The valid request with one value somewhere replaced by arbitrary JSON (or removed)."""
    body = json.loads(json.dumps(VALID))
    path = draw(st.sampled_from([p for p in paths(body) if p]))
    parent = body
    for part in path[:-1]:
        parent = parent[part]
    if draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(json_values)
    return body


@pytest.fixture
def client(redis_settings: ServiceSettings) -> Iterator[TestClient]:
    # Redis and no worker: accepted jobs only queue up, nothing compiles.
    with TestClient(create_app(redis_settings.model_copy(update={"max_request_bytes": 256 * 1024}))) as c:
        yield c


def post_json(client: TestClient, body: Any) -> Any:
    return client.post("/v1/compile", content=json.dumps(body), headers={"Content-Type": "application/json"})


def assert_4xx_or_ok(r: Any) -> None:
    assert r.status_code < 500, r.text[:500]
    if r.status_code >= 400:
        body = r.json()
        assert body["error"] and body["message"], body  # names the problem


def test_random_graphs_never_5xx(client: TestClient) -> None:
    @FUZZ
    @given(body=graphs())
    def run(body: dict[str, Any]) -> None:
        assert_4xx_or_ok(post_json(client, body))

    run()


def test_edited_requests_never_5xx(client: TestClient) -> None:
    @FUZZ
    @given(body=edited_requests())
    def run(body: Any) -> None:
        assert_4xx_or_ok(post_json(client, body))

    run()


def test_openapi_operations_never_5xx(redis_settings: ServiceSettings) -> None:
    schemathesis = pytest.importorskip("schemathesis")
    from schemathesis.generation import GenerationMode

    app = create_app(redis_settings)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    cases = st.one_of([op.as_strategy(generation_mode=mode) for op in operations
                       for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)])

    @settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def run(case: Any) -> None:
        r = case.call()
        assert r.status_code < 500, (case.method, case.formatted_path, r.status_code, r.text[:300])

    run()

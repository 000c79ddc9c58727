"""Wire format: round trips, target resolution, and rejection of malformed specs."""

import pytest
from pydantic import ValidationError

from fxcc.compiler_core.errors import InvalidGraph
from fxcc.compiler_core.graph import rebuild_graph
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.wire import (
    CompileRequest,
    FloatArg,
    GraphSpec,
    IntArg,
    ListArg,
    Node,
    NodeRef,
    Placeholder,
    TensorSpec,
    resolve_target,
)


def spec(sizes=(4, 8), dtype="float32"):
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.insert(0, acc)
        acc *= s
    return TensorSpec(dtype=dtype, sizes=list(sizes), strides=strides)


def sin_graph(name="y"):
    return GraphSpec(
        placeholders=[Placeholder(name="x", spec=spec())],
        nodes=[Node(name=name, target="aten.sin.default", args=[NodeRef(name="x")]),
               Node(name="z", target="aten.mul.Scalar",
                    args=[NodeRef(name=name), FloatArg(value="inf")])],
        outputs=[NodeRef(name="z")],
    )


def test_round_trip_json():
    req = CompileRequest(graph=sin_graph())
    again = CompileRequest.model_validate_json(req.model_dump_json())
    assert again == req
    assert again.graph.nodes[1].args[1].to_python() == float("inf")


def test_key_ignores_node_names_but_not_ops():
    a = compile_key(CompileRequest(graph=sin_graph("y")))
    b = compile_key(CompileRequest(graph=sin_graph("renamed")))
    assert a == b
    g = sin_graph()
    cos = g.model_copy(update={"nodes": [g.nodes[0].model_copy(update={"target": "aten.cos.default"}),
                                         g.nodes[1]]})
    assert compile_key(CompileRequest(graph=cos)) != a


# What of a graph its key leaves out, and why. A field added to the wire format is keyed or listed
# here: keys.canonical_graph builds the keyed form field by field, so a new field it does not know of
# (flex_attention's mods once were) would let two different graphs share one artifact.
NOT_KEYED = {
    Node: {"name": "the tracer's choice: positions replace names"},
    Placeholder: {"name": "the tracer's choice: positions replace names"},
    GraphSpec: {"schema_version": "one value (Literal[1]); the request's schema_version is keyed"},
}


@pytest.mark.parametrize("model", list(NOT_KEYED), ids=lambda m: m.__name__)
def test_every_field_of_a_graph_is_keyed_or_said_not_to_be(model):
    from fxcc.compiler_core.keys import canonical_graph

    g = sin_graph()
    canonical = canonical_graph(g)
    keyed = {Node: set(canonical["nodes"][0]) | {"opaque", "triton", "control", "flex"},
             Placeholder: set(canonical["placeholders"][0]),
             GraphSpec: set(canonical) | {"free_layout_outputs"}}[model]
    assert set(model.model_fields) == keyed | set(NOT_KEYED[model]), \
        f"{model.__name__}: a field neither keyed by keys.canonical_graph nor listed in NOT_KEYED"
    # the optional parts are keyed when set
    for field, value in (("kwargs", {"alpha": IntArg(value=2)}),):
        changed = g.model_copy(update={"nodes": [g.nodes[0].model_copy(update={field: value}), g.nodes[1]]})
        assert compile_key(CompileRequest(graph=changed)) != compile_key(CompileRequest(graph=g))
    wide = g.model_copy(update={"free_layout_outputs": [0]})
    assert compile_key(CompileRequest(graph=wide)) != compile_key(CompileRequest(graph=g))


@pytest.mark.parametrize("target", [
    "builtins.eval", "os.system", "aten.__class__.default", "aten.sin", "aten.no_such_op.default",
    "aten.sin.no_such_overload", "prims.sin.default; import os", "torch.ops.aten.sin.default",
])
def test_resolve_rejects(target):
    with pytest.raises(InvalidGraph):
        resolve_target(target, node="n")


def test_resolve_accepts_aten_and_prims():
    import torch
    assert resolve_target("aten.add.Tensor") is torch.ops.aten.add.Tensor
    assert resolve_target("prims.convert_element_type.default") is torch.ops.prims.convert_element_type.default


@pytest.mark.parametrize("bad", [
    {"placeholders": [], "nodes": [{"name": "a", "target": "aten.sin.default",
                                    "args": [{"kind": "node", "name": "missing"}]}], "outputs": []},
    {"placeholders": [{"name": "x", "spec": {"dtype": "float99", "sizes": [1], "strides": [1]}}],
     "nodes": [], "outputs": []},
    {"placeholders": [{"name": "x", "spec": {"dtype": "float32", "sizes": [1, 2], "strides": [1]}}],
     "nodes": [], "outputs": []},
    {"placeholders": [{"name": "x", "spec": {"dtype": "float32", "sizes": [-1], "strides": [1]}}],
     "nodes": [], "outputs": []},
    {"placeholders": [], "nodes": [], "outputs": [{"kind": "pickle", "value": "gASV"}]},
    {"placeholders": [], "nodes": [], "outputs": [], "schema_version": 99},
])
def test_malformed_specs_fail_validation(bad):
    with pytest.raises(ValidationError):
        GraphSpec.model_validate(bad)


def test_rebuild_rederives_shapes_and_rejects_mismatch():
    gm = rebuild_graph(sin_graph())
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "call_function"]
    assert [tuple(v.shape) for v in vals] == [(4, 8), (4, 8)]
    bad = GraphSpec(
        placeholders=[Placeholder(name="a", spec=spec((4, 8))), Placeholder(name="b", spec=spec((3, 8)))],
        nodes=[Node(name="s", target="aten.add.Tensor", args=[NodeRef(name="a"), NodeRef(name="b")])],
        outputs=[NodeRef(name="s")],
    )
    with pytest.raises(InvalidGraph) as e:
        rebuild_graph(bad)
    assert e.value.node == "s" and e.value.op == "aten.add.Tensor"
    wrong_arg = GraphSpec(
        placeholders=[Placeholder(name="a", spec=spec())],
        nodes=[Node(name="s", target="aten.sum.dim_IntList",
                    args=[NodeRef(name="a"), ListArg(items=[IntArg(value=7)])])],
        outputs=[NodeRef(name="s")],
    )
    with pytest.raises(InvalidGraph):
        rebuild_graph(wrong_arg)


def test_key_covers_the_compiler_sources(monkeypatch):
    from fxcc.compiler_core import keys

    req = CompileRequest(graph=sin_graph())
    before = compile_key(req)
    assert keys.compiler_fingerprint().startswith("0.")
    monkeypatch.setattr(keys, "compiler_fingerprint", lambda: "0.1.0+another-compiler")
    assert compile_key(req) != before

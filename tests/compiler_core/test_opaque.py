"""Opaque ops in the worker: the schema grammar, the checks of an opaque node, and compiling around
one that this process has never heard of (the worker never looks it up)."""

import pytest
import torch
from pydantic import ValidationError

from fxcc.compiler_core.artifact import ExternStep, KernelStep
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.opaque import parse_schema
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import (
    CompileRequest,
    GraphSpec,
    IntArg,
    Node,
    NodeRef,
    OpaqueOp,
    Placeholder,
    StrArg,
    SymbolSpec,
    TensorSpec,
    UserKernel,
)

SCHEMAS = [
    "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
    ("aten::conv2d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=[1, 1], SymInt[2] "
     "padding=[0, 0], SymInt[2] dilation=[1, 1], SymInt groups=1) -> Tensor"),
    ("aten::topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) -> (Tensor values, "
     "Tensor indices)"),
    "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
    "aten::split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]",
    "_c10d_functional::all_reduce(Tensor input, str reduce_op, Any group_name) -> Tensor",
    "_c10d_functional::all_gather_into_tensor_coalesced(Tensor[] inputs, int group_size, Any group_name) -> Tensor[]",
    "aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor",
    "aten::gelu(Tensor self, *, str approximate=\"none\") -> Tensor",
    "mylib::noop(Tensor(a!) x) -> ()",
]


@pytest.mark.parametrize("text", SCHEMAS)
def test_torch_schemas_parse_as_torch_reads_them(text):
    ours, theirs = parse_schema(text), torch._C.parse_schema(text)
    assert f"{ours.namespace}::{ours.name}" == theirs.name
    assert ours.overload == (theirs.overload_name or "default")
    assert [a.name for a in ours.args] == [a.name for a in theirs.arguments]
    assert [a.written for a in ours.args] == [bool(a.alias_info and a.alias_info.is_write) for a in theirs.arguments]
    assert [a.kwarg_only for a in ours.args] == [a.kwarg_only for a in theirs.arguments]
    assert len(ours.returns) == len(theirs.returns)


def test_schema_fields():
    s = parse_schema(SCHEMAS[3])
    assert (s.namespace, s.name, s.overload) == ("aten", "add_", "Tensor")
    assert [a.name for a in s.written] == ["self"]
    assert [a.kwarg_only for a in s.args] == [False, False, True]
    assert s.returns[0].alias == "a"
    lst = parse_schema(SCHEMAS[6])
    assert lst.returns[0].is_list and lst.args[0].is_list and lst.args[2].type == "Any"
    assert parse_schema(SCHEMAS[9]).returns == ()


@pytest.mark.parametrize("text", [
    "probe::op(Tensor x) -> Tensor; import os",
    "probe::op(Tensor x) Tensor",
    "probe op(Tensor x) -> Tensor",
    "probe::op(Tensor x, Tensor x) -> Tensor",
    "probe::op(Tensor x=__import__('os')) -> Tensor",
    "probe::op(Tens0r$ x) -> Tensor",
    "probe::op(" + ", ".join(f"Tensor a{i}" for i in range(80)) + ") -> Tensor",
    "probe::op(Tensor x) -> (Tensor",
    "probe::op(Tensor x) -> Tensor[",
    "probe::op(Tensor x) -> " + "x" * 5000,
])
def test_schema_outside_the_grammar_is_refused(text):
    with pytest.raises(ValueError):
        parse_schema(text)


def _t(*sizes, dtype="float32"):
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.insert(0, acc)
        acc = acc * s if isinstance(s, int) else acc
    return TensorSpec(dtype=dtype, sizes=list(sizes), strides=strides)


def _graph(opaque: OpaqueOp, target="nowhere.scale.default", args=None) -> GraphSpec:
    """x → sin → (opaque op) → cos → *2: an op that no process here has registered."""
    return GraphSpec(
        placeholders=[Placeholder(name="x", spec=_t(8, 4))],
        nodes=[Node(name="a", target="aten.sin.default", args=[NodeRef(name="x")]),
               Node(name="b", target="aten.mul.Tensor", args=[NodeRef(name="a"), NodeRef(name="x")]),
               Node(name="c", target=target, opaque=opaque,
                    args=args or [NodeRef(name="b"), IntArg(value=3), StrArg(value="group0")]),
               Node(name="d", target="aten.cos.default", args=[NodeRef(name="c")]),
               Node(name="e", target="aten.add.Tensor", args=[NodeRef(name="d"), NodeRef(name="x")])],
        outputs=[NodeRef(name="e")],
    )


SCALE = "nowhere::scale(Tensor x, int k, str group) -> Tensor"


def test_worker_compiles_around_an_op_it_does_not_know():
    assert not hasattr(torch.ops.nowhere, "scale")
    art = compile_request(CompileRequest(graph=_graph(OpaqueOp(op_schema=SCALE, outputs=[_t(8, 4)]))))
    steps = art.manifest.plan.steps
    kernels = [s for s in steps if isinstance(s, KernelStep)]
    (opaque,) = [s for s in steps if isinstance(s, ExternStep) and s.opaque is not None]
    assert len(kernels) == 2, steps  # sin*x fused before it, cos+x fused after it
    assert opaque.op == "nowhere.scale.default" and opaque.opaque.op_schema == SCALE
    assert opaque.args[1:] == [IntArg(value=3), StrArg(value="group0")]  # data, bound by the client
    assert art.manifest.stats.extern_ops == ["nowhere.scale.default"]
    # The plan's later kernel reads the opaque result with the strides the client's fake kernel gave.
    assert kernels[1].args[0] == NodeRef(name="c") or NodeRef(name="c") in kernels[1].args


def test_output_specs_size_and_place_the_buffers():
    odd = TensorSpec(dtype="float64", sizes=[8, 4], strides=[1, 8])  # a transposed float64 result
    graph = GraphSpec(
        placeholders=[Placeholder(name="x", spec=_t(8, 4))],
        nodes=[Node(name="c", target="nowhere.widen.default", args=[NodeRef(name="x")],
                    opaque=OpaqueOp(op_schema="nowhere::widen(Tensor x) -> Tensor", outputs=[odd])),
               Node(name="d", target="aten.sin.default", args=[NodeRef(name="c")])],
        outputs=[NodeRef(name="d")],
    )
    from fxcc.compiler_core.graph import rebuild_graph

    gm = rebuild_graph(graph)
    val = next(n for n in gm.graph.nodes if n.name == "c").meta["val"]
    assert val.dtype == torch.float64 and val.stride() == (1, 8)
    assert next(n for n in gm.graph.nodes if n.name == "d").meta["val"].dtype == torch.float64


def test_symbolic_output_specs():
    graph = GraphSpec(
        symbols=[SymbolSpec(name="s0", lo=2)],
        placeholders=[Placeholder(name="x", spec=TensorSpec(dtype="float32", sizes=["s0", 4], strides=[4, 1]))],
        nodes=[Node(name="c", target="nowhere.dup.default", args=[NodeRef(name="x")],
                    opaque=OpaqueOp(op_schema="nowhere::dup(Tensor x) -> Tensor",
                                    outputs=[TensorSpec(dtype="float32", sizes=["2*s0", 4], strides=[4, 1])])),
               Node(name="d", target="aten.sin.default", args=[NodeRef(name="c")])],
        outputs=[NodeRef(name="d")],
    )
    art = compile_request(CompileRequest(graph=graph, hints={"s0": 5}))
    assert [s.spec.sizes for s in art.manifest.plan.steps if s.kind == "alloc"] == [["2*s0", 4]]
    bad = graph.model_dump()
    bad["nodes"][0]["opaque"]["outputs"][0]["sizes"] = ["s1", 4]
    with pytest.raises(ValidationError, match="undeclared"):
        GraphSpec.model_validate(bad)


@pytest.mark.parametrize("target,opaque,match", [
    ("nowhere.scale.default", OpaqueOp(op_schema="nowhere::other(Tensor x, int k, str group) -> Tensor",
                                       outputs=[_t(8, 4)]), "is not node target"),
    ("aten.sin.default", OpaqueOp(op_schema="aten::sin(Tensor x) -> Tensor", outputs=[_t(8, 4)]), "not opaque"),
    ("nowhere.scale.default", OpaqueOp(op_schema=SCALE, outputs=[_t(8, 4), _t(8, 4)]), "output specs"),
    ("nowhere.scale.default", OpaqueOp(op_schema=SCALE, outputs=[None]), "missing"),
    ("nowhere.inc.default", OpaqueOp(op_schema="nowhere::inc(Tensor(a!) x, int k, str group) -> Tensor",
                                     outputs=[_t(8, 4)]), "not functionalized"),
    ("nowhere.inc.default", OpaqueOp(op_schema="nowhere::inc(Tensor x, int k, str group) -> Tensor",
                                     functional=True, outputs=[_t(8, 4)]), "writes no argument"),
    ("nowhere.size.default", OpaqueOp(op_schema="nowhere::size(Tensor x, int k, str group) -> int",
                                      outputs=[None]), "non-tensor"),
    ("nowhere.__init__.default", OpaqueOp(op_schema="nowhere::__init__(Tensor x) -> Tensor",
                                          outputs=[_t(8, 4)]), "private"),
])
def test_bad_opaque_nodes_are_refused(target, opaque, match):
    with pytest.raises(ValidationError, match=match):
        _graph(opaque, target=target)


def test_functional_form_returns_results_then_written_arguments():
    schema = "nowhere::acc(Tensor x, Tensor(a!) out) -> ()"
    graph = GraphSpec(
        placeholders=[Placeholder(name="x", spec=_t(8)), Placeholder(name="y", spec=_t(8))],
        nodes=[Node(name="o", target="aten.cos.default", args=[NodeRef(name="y")]),
               Node(name="f", target="nowhere.acc.default", kwargs={"x": NodeRef(name="x"), "out": NodeRef(name="o")},
                    opaque=OpaqueOp(op_schema=schema, functional=True, outputs=[None, _t(8)])),
               Node(name="g", target="getitem", args=[NodeRef(name="f"), IntArg(value=1)]),
               Node(name="h", target="aten.sin.default", args=[NodeRef(name="g")])],
        outputs=[NodeRef(name="h")],
    )
    art = compile_request(CompileRequest(graph=graph))
    assert art.manifest.stats.kernels == 2 and art.manifest.stats.extern_ops == ["nowhere.acc.default"]


def test_schema_and_output_specs_are_in_the_key():
    base = CompileRequest(graph=_graph(OpaqueOp(op_schema=SCALE, outputs=[_t(8, 4)])))
    other_schema = CompileRequest(graph=_graph(
        OpaqueOp(op_schema="nowhere::scale(Tensor x, int k, str group, int extra=0) -> Tensor", outputs=[_t(8, 4)])))
    other_out = CompileRequest(graph=_graph(OpaqueOp(op_schema=SCALE, outputs=[_t(8, 4, dtype="float16")])))
    keys = {compile_key(r) for r in (base, other_schema, other_out)}
    assert len(keys) == 3
    assert compile_key(base) == compile_key(CompileRequest(graph=_graph(OpaqueOp(op_schema=SCALE, outputs=[_t(8, 4)]))))


def _kernel_graph(**overrides) -> GraphSpec:
    """x → sin, cos → a user Triton kernel writing `out` → exp: a kernel no process here has."""
    kernel = {"module": "users.kernels", "qualname": "add_kernel", "source_sha256": "ab" * 32, "grid": [4],
              "cloned": ["out_ptr"], "outputs": [_t(64)]} | overrides
    return GraphSpec(
        placeholders=[Placeholder(name="x", spec=_t(64))],
        nodes=[Node(name="a", target="aten.sin.default", args=[NodeRef(name="x")]),
               Node(name="b", target="aten.cos.default", args=[NodeRef(name="x")]),
               Node(name="o", target="aten.empty_like.default", args=[NodeRef(name="a")]),
               Node(name="k", target="triton_kernel.add_kernel", triton=UserKernel(**kernel),
                    kwargs={"x_ptr": NodeRef(name="a"), "y_ptr": NodeRef(name="b"), "out_ptr": NodeRef(name="o"),
                            "n": IntArg(value=64), "BLOCK": IntArg(value=16)}),
               Node(name="r", target="getitem", args=[NodeRef(name="k"), IntArg(value=0)]),
               Node(name="e", target="aten.exp.default", args=[NodeRef(name="r")])],
        outputs=[NodeRef(name="e")],
    )


def test_worker_compiles_around_a_user_kernel_it_never_sees():
    art = compile_request(CompileRequest(graph=_kernel_graph()))
    (step,) = [s for s in art.manifest.plan.steps if isinstance(s, ExternStep) and s.triton is not None]
    assert step.triton.qualname == "add_kernel" and step.triton.grid == [4]
    assert art.manifest.stats.kernels == 2  # sin and cos in one kernel, exp in the other


@pytest.mark.parametrize("overrides, match", [
    ({"cloned": ["nothing"]}, "not distinct arguments"),
    ({"outputs": []}, "output specs"),
    ({"module": "os; rm"}, "pattern"),
    ({"source_sha256": "print(1)"}, "pattern"),
])
def test_bad_user_kernel_nodes_are_refused(overrides, match):
    with pytest.raises(ValidationError, match=match):
        _kernel_graph(**overrides)

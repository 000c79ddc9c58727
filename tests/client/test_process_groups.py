"""Process-group binding (client/process_groups.py, compiler_core/collectives.py): a graph's
collectives name their groups by bindings, so two groups of the same shape and different names
give one key, and the plan runs on the group its caller binds; inputs only handed on stay out."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.client.process_groups import Bindings, hand_on
from fxcc.compiler_core.collectives import binding_index
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, StrArg, Target

c10d = torch.ops._c10d_functional


def _traced(group_a: str, group_b: str) -> torch.fx.GraphModule:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = c10d.wait_tensor(c10d.all_reduce(torch.relu(x) * 2, "sum", group_a))
        z = c10d.wait_tensor(c10d.all_gather_into_tensor(y + 1, 2, group_b))
        return torch.tanh(y), c10d.wait_tensor(c10d.all_reduce(z, "max", group_a))
    return make_fx(f, tracing_mode="fake")(torch.randn(4, 8))


def _key(gm: torch.fx.GraphModule) -> str:
    capture = capture_graph(gm, [torch.randn(4, 8)])
    return compile_key(CompileRequest(graph=capture.spec, options=CompileOptions(target=Target(kind="interpret"))))


def test_groups_of_other_names_give_one_key_and_are_bound_in_order_of_first_use():
    first, second = _traced("0", "1"), _traced("tp-rows", "7")
    assert _key(first) == _key(second)
    a, b = capture_graph(first, [torch.randn(4, 8)]), capture_graph(second, [torch.randn(4, 8)])
    assert a.bindings.groups == ("0", "1") and b.bindings.groups == ("tp-rows", "7")
    groups = [arg.value for n in a.spec.nodes for arg in n.args
              if isinstance(arg, StrArg) and binding_index(arg.value) is not None]
    assert groups == ["group0", "group1", "group0"]
    assert a.spec == b.spec


def test_one_group_used_twice_is_not_two_groups_and_differs_from_two_groups():
    assert capture_graph(_traced("5", "5"), [torch.randn(4, 8)]).bindings.groups == ("5",)
    assert _key(_traced("5", "5")) != _key(_traced("5", "6"))


def test_an_input_only_handed_on_stays_out_of_the_spec_and_comes_back_in_its_output():
    graph = torch.fx.Graph()
    x, mesh = graph.placeholder("x"), graph.placeholder("mesh")
    y = graph.call_function(torch.ops.aten.relu.default, (x,))
    graph.output((y, mesh))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    capture = capture_graph(gm, [torch.randn(3), object()])
    assert [p.name for p in capture.spec.placeholders] == ["x"]
    assert len(capture.spec.outputs) == 1
    assert capture.bindings == Bindings(groups=(), handed_on=(1,), outputs=((1, 1),))

    token = object()
    run = hand_on(lambda args: (args[0] + 1,), capture.bindings)
    out = run([torch.zeros(2), token, torch.ones(2)])  # graph inputs, then the plan's constants
    assert out[1] is token and torch.equal(out[0], torch.ones(2))


def test_a_plan_whose_group_is_not_bound_refuses_to_load():
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.errors import ArtifactError
    from fxcc.compiler_core.pipeline import compile_and_build

    capture = capture_graph(_traced("0", "1"), [torch.randn(4, 8)])
    art = compile_and_build(CompileRequest(graph=capture.spec, options=CompileOptions(target=Target(kind="interpret"))))
    with pytest.raises(ArtifactError, match="process group"):
        load_plan(art, ("0",))  # group1 unbound


def test_a_coalesced_collective_binds_its_group_too():
    def f(a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
        return [c10d.wait_tensor(t) for t in c10d.all_reduce_coalesced([a, b], "avg", "12")]
    gm = make_fx(f, tracing_mode="fake")(torch.randn(3), torch.randn(5))
    capture = capture_graph(gm, [torch.randn(3), torch.randn(5)])
    assert capture.bindings.groups == ("12",)
    (node,) = [n for n in capture.spec.nodes if n.target == "_c10d_functional.all_reduce_coalesced.default"]
    assert node.args[2] == StrArg(value="group0") and node.opaque is not None

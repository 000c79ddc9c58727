"""Collectives in a compiled graph (compiler_core/collectives.py): opaque extern steps in graph order
with kernels fused up to them and after their wait, their results never taken for fresh storage,
and a group named by anything but a binding refused as a bad graph."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.compiler_core.artifact import AllocStep, ExternStep, KernelStep
from fxcc.compiler_core.errors import InvalidGraph
from fxcc.compiler_core.graph import rebuild_graph
from fxcc.compiler_core.pipeline import compile_and_build
from fxcc.compiler_core.plan import _may_alias
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, StrArg, Target

c10d = torch.ops._c10d_functional
ALL_REDUCE, WAIT = "_c10d_functional.all_reduce.default", "_c10d_functional.wait_tensor.default"


def _spec():
    def f(x: torch.Tensor) -> torch.Tensor:
        y = c10d.wait_tensor(c10d.all_reduce(torch.relu(x) * 2 + 1, "sum", "0"))
        return torch.tanh(y) * y
    return capture_graph(make_fx(f, tracing_mode="fake")(torch.randn(4, 8)), [torch.randn(4, 8)]).spec


def _reads(step) -> set[str]:
    return {a.name for a in step.args if getattr(a, "kind", None) == "node"}


def test_kernels_fuse_around_a_collective_that_runs_in_graph_order():
    art = compile_and_build(CompileRequest(graph=_spec(), options=CompileOptions(target=Target(kind="interpret"))))
    steps = art.manifest.plan.steps
    kinds = [s.op if isinstance(s, ExternStep) else "kernel" for s in steps if isinstance(s, (ExternStep, KernelStep))]
    # relu, mul and add fuse into the one kernel before; tanh and mul into the one after the wait
    assert kinds == ["kernel", ALL_REDUCE, WAIT, "kernel"], kinds
    i_reduce = next(i for i, s in enumerate(steps) if isinstance(s, ExternStep) and s.op == ALL_REDUCE)
    i_wait = next(i for i, s in enumerate(steps) if isinstance(s, ExternStep) and s.op == WAIT)
    reduced, waited = steps[i_reduce].out, steps[i_wait].out
    assert _reads(steps[i_wait]) == {reduced}
    # nothing reads the all-reduce's result but its wait, and no buffer takes its storage
    assert all(reduced not in _reads(s) for i, s in enumerate(steps) if i != i_wait and hasattr(s, "args"))
    assert not any(isinstance(s, AllocStep) and s.reuse in (reduced, waited) for s in steps)
    assert art.manifest.stats.kernels == 2


def test_a_collective_travels_opaque_and_its_results_count_as_sharing_storage():
    (node,) = [n for n in _spec().nodes if n.target == ALL_REDUCE]
    assert node.opaque is not None and node.opaque.op_schema.startswith("_c10d_functional::all_reduce(")
    assert _may_alias(WAIT) and _may_alias(ALL_REDUCE)  # opaque: the planner never trusts them fresh


def test_a_group_named_by_its_name_or_an_unknown_reduction_is_a_bad_graph():
    spec = _spec()
    (node,) = [n for n in spec.nodes if n.target == ALL_REDUCE]
    rebuild_graph(spec)
    for slot, value, words in ((2, "0", "binding"), (2, "group99x", "binding"), (1, "median", "reductions")):
        bad = node.model_copy(update={"args": [StrArg(value=value) if i == slot else a for i, a in enumerate(node.args)]})
        graph = spec.model_copy(update={"nodes": [bad if n is node else n for n in spec.nodes]})
        with pytest.raises(InvalidGraph, match=words):
            rebuild_graph(graph)


def test_the_worker_never_resolves_a_collective_by_name():
    from fxcc.compiler_core.wire import resolve_target

    for target in (ALL_REDUCE, WAIT):
        with pytest.raises(InvalidGraph):
            resolve_target(target)

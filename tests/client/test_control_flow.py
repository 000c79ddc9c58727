"""torch.cond and while_loop in compiled graphs (in-process): each subgraph compiles as a graph of its
own (fused), the plan picks the branch or loops at run time, and results match eager."""

import pytest
import torch
from pydantic import ValidationError
from torch._higher_order_ops.while_loop import while_loop

from fxcc.client import backend
from fxcc.compiler_core.artifact import ExternStep, KernelStep
from fxcc.compiler_core.wire import ControlFlow, GraphSpec, IntArg, Node, NodeRef, Placeholder, TensorSpec


@pytest.fixture(autouse=True)
def _isolated(fresh_compiles, monkeypatch):
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    yield


def branchy(x):
    y = x.sigmoid() * 2
    (r,) = torch.cond(y.sum() > 8, lambda a: (a.sin() * a + 1,), lambda a: (a.cos() * 2 - a,), (y,))
    return r.relu() + x


def loop(x):
    def body(i, a):
        return i + 1, (a * 1.5 + a.sin()).abs() + 1

    i, a = while_loop(lambda i, a: a.sum() < 100, body, (torch.tensor(0), x.abs() * 3))
    return a + i


def _artifact(event):
    from fxcc.client.cache import LocalCache
    from fxcc.client.settings import ClientSettings

    return LocalCache(ClientSettings.from_env().cache_dir).get(event.key)


def _control(art):
    (step,) = [s for s in art.manifest.plan.steps if isinstance(s, ExternStep) and s.control is not None]
    return step.control


def test_cond_picks_its_branch_at_run_time_and_each_branch_fuses():
    fn = torch.compile(branchy, backend="fxcc")
    with torch.no_grad():
        small, large = torch.randn(16) - 4, torch.randn(16) + 4
        assert branchy(small).shape == small.shape
        for x in (small, large, small):
            torch.testing.assert_close(fn(x), branchy(x), rtol=1e-5, atol=1e-4)
    (event,) = [e for e in backend.events() if e.source != "fallback"]
    assert event.stats.extern_ops == ["control.cond"]
    plans = _control(_artifact(event)).plans
    assert [sum(isinstance(s, KernelStep) for s in p.steps) for p in plans] == [1, 1]  # a·sin(a)+1, 2cos(a)-a


def test_while_loop_loops_its_body_plan():
    fn = torch.compile(loop, backend="fxcc")
    with torch.no_grad():
        for x in (torch.randn(8), torch.randn(8) * 10):
            torch.testing.assert_close(fn(x), loop(x))
    (event,) = [e for e in backend.events() if e.source != "fallback"]
    flow = _control(_artifact(event))
    assert flow.kind == "while_loop" and flow.carried == 2
    assert sum(isinstance(s, KernelStep) for s in flow.plans[0].steps) == 1  # the sum < 100 test
    # the body: i + 1 and |1.5a + sin(a)| + 1, each one kernel
    assert sum(isinstance(s, KernelStep) for s in flow.plans[1].steps) == 2


def test_cond_with_symbolic_sizes():
    fn = torch.compile(branchy, backend="fxcc", dynamic=True)
    with torch.no_grad():
        for n in (5, 9, 33):
            for shift in (-4, 4):
                x = torch.randn(n) + shift
                torch.testing.assert_close(fn(x), branchy(x), rtol=1e-5, atol=1e-4)
    events = [e for e in backend.events() if e.source != "fallback"]
    assert len(events) == 1 and events[0].stats.extern_ops == ["control.cond"]


def _spec(*sizes):
    return TensorSpec(dtype="float32", sizes=list(sizes), strides=[1] if len(sizes) == 1 else [sizes[1], 1])


def _branch(depth=1):
    """(x, p) → sin(x), or at depth > 1 a cond on p over x and p of branches one level shallower."""
    if depth == 1:
        nodes = [Node(name="z", target="aten.sin.default", args=[NodeRef(name="x")])]
    else:
        nodes = [Node(name="y", target="control.cond", args=[NodeRef(name="p"), NodeRef(name="x"), NodeRef(name="p")],
                      control=ControlFlow(kind="cond", graphs=[_branch(depth - 1), _branch(depth - 1)],
                                          outputs=[_spec(4)])),
                 Node(name="z", target="getitem", args=[NodeRef(name="y"), IntArg(value=0)])]
    places = [Placeholder(name="x", spec=_spec(4)),
              Placeholder(name="p", spec=TensorSpec(dtype="bool", sizes=[], strides=[]))]
    return GraphSpec(placeholders=places, nodes=nodes, outputs=[NodeRef(name="z")])


def test_control_flow_nodes_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="branches take other inputs"):
        ControlFlow(kind="cond", graphs=[_branch(), _branch()], outputs=[_spec(4)]).check("control.cond", 2)
    with pytest.raises(ValidationError, match="is not control.cond"):
        Node(name="c", target="control.while_loop", args=[NodeRef(name="p"), NodeRef(name="x")],
             control=ControlFlow(kind="cond", graphs=[_branch(), _branch()], outputs=[_spec(4)]))
    assert _branch(depth=4).nodes[0].control is not None  # as deep as allowed
    with pytest.raises(ValidationError, match="nested deeper"):
        _branch(depth=5)


def test_nested_control_flow_compiles_each_level_and_runs():
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileRequest

    art = compile_request(CompileRequest(graph=_branch(depth=3)))
    assert art.manifest.stats.kernels == 4  # the four leaves' sin, one kernel each
    assert len(art.manifest.kernels) == 1  # one source: the same kernel for every leaf
    runner = load_plan(art)
    x = torch.randn(4)
    for p in (True, False):
        torch.testing.assert_close(runner([x, torch.tensor(p)])[0], x.sin())

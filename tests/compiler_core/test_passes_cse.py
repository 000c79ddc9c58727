"""The CSE pass: equal pure nodes merged, and nothing that could differ (random numbers, graph
outputs, values written in place)."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.compiler_core.passes.cse import merge_common
from tests.compiler_core.helpers import check, run_pass

aten = torch.ops.aten


def _spec(fn, *inputs):
    return capture_graph(make_fx(fn)(*inputs), list(inputs)).spec


def _count(gm: torch.fx.GraphModule, target: object) -> int:
    return sum(n.op == "call_function" and n.target is target for n in gm.graph.nodes)


def _masks(x, m):
    # as torch's math SDPA does in every layer: the boolean mask made 0 / -inf again
    a = torch.where(m, 0.0, float("-inf")) + x
    b = torch.where(m, 0.0, float("-inf")) * x
    return a.sum(), b.sum()


def test_equal_nodes_are_merged_and_the_values_stay():
    x, m = torch.randn(4, 5), torch.rand(4, 5) > 0.5
    spec = _spec(_masks, x, m)
    gm, _ = run_pass(merge_common, spec)
    assert _count(gm, aten.where.self) == 1
    assert _count(gm, aten.scalar_tensor.default) in (0, 2)  # (0, -inf): once each, where traced at all
    check(_masks, x, m)


def test_numbers_of_other_types_are_not_equal():
    def fn(x):
        return aten.add.Scalar(x, 1), aten.add.Scalar(x, 1.0), aten.add.Scalar(x, True)

    x = torch.arange(4)
    spec = _spec(lambda x: tuple(t * 2 for t in fn(x)), x)
    assert not merge_common(rebuild(spec))


def test_random_numbers_are_never_merged():
    def fn(x):
        return (torch.rand_like(x) + x).sum(), (torch.rand_like(x) + x).sum()

    spec = _spec(fn, torch.randn(8))
    gm = rebuild(spec)
    merge_common(gm)
    assert _count(gm, aten.rand_like.default) == 2


def test_graph_outputs_stay_distinct_tensors():
    def fn(x):
        return x + 1, x + 1

    spec = _spec(fn, torch.randn(3))
    gm = rebuild(spec)
    assert not merge_common(gm)
    assert _count(gm, aten.add.Tensor) == 2


def test_a_graph_that_writes_an_intermediate_is_left_alone():
    def fn(x):
        a = x * 2
        b = x * 2
        a.add_(1)
        return a + b

    x = torch.randn(3)
    gm = rebuild(_spec(fn, x))
    assert not merge_common(gm)
    assert _count(gm, aten.mul.Tensor) == 2


def rebuild(spec):
    from fxcc.compiler_core.graph import rebuild_graph

    return rebuild_graph(spec, None)


def test_zero_and_negative_zero_are_not_equal():
    def fn(x):
        return 1 / (x * 0.0) - 1 / (x * -0.0)

    x = torch.rand(4) + 1
    art = check(fn, x)  # inf - (-inf): inf, where merged multiplications would give nan
    from tests.compiler_core.helpers import run

    assert torch.isinf(run(art, x)[0]).all()


def test_bases_of_output_views_stay_apart():
    """Equal nodes that are not outputs themselves but whose views are: merged, the two outputs
    would share memory (an in-place edit of one would show in the other)."""
    def fn(x):
        a = x + 1
        b = x + 1
        return a.view(2, 2), b.t()

    x = torch.randn(2, 2)
    gm = rebuild(_spec(fn, x))
    assert not merge_common(gm)
    art = check(fn, x)
    from tests.compiler_core.helpers import run

    one, two = run(art, x)
    assert one.untyped_storage().data_ptr() != two.untyped_storage().data_ptr()


def test_a_graph_that_writes_an_input_before_reading_it_again_is_left_alone():
    def fn(x, y):
        a = x * 2
        x.copy_(y)
        return a + x * 2

    gm = rebuild(_spec(fn, torch.randn(3), torch.randn(3)))
    assert not merge_common(gm)
    assert _count(gm, aten.mul.Tensor) == 2


def test_custom_ops_are_never_merged():
    calls = []

    @torch.library.custom_op("fxcc_test_cse::tick", mutates_args=())
    def tick(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)  # a side effect its schema does not tell
        return x + 1

    @tick.register_fake
    def _(x):
        return torch.empty_like(x)

    def fn(x):
        return (tick(x) * tick(x)).sum()

    gm = make_fx(fn)(torch.randn(3))
    assert _count(gm, torch.ops.fxcc_test_cse.tick.default) == 2
    assert not merge_common(gm)
    assert _count(gm, torch.ops.fxcc_test_cse.tick.default) == 2

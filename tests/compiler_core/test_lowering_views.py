"""View lowerings vs eager: permute, transpose, expand, slice, select, squeeze/unsqueeze, reshape, as_strided."""

from __future__ import annotations

import pytest
import torch

from tests.compiler_core.helpers import alloc_steps, check, kernel_steps

torch.manual_seed(0)
X = torch.randn(4, 6, 5)

VIEWS = {
    "permute": lambda x: x.permute(2, 0, 1).sin(),
    "transpose": lambda x: x.transpose(0, 2) + 1,
    "t": lambda x: x[0].t().cos(),
    "expand": lambda x: x[:, :1, :].expand(4, 6, 5).exp(),
    "slice_step": lambda x: x[1:4:2, ::3, 1:].sin(),
    "slice_negative": lambda x: x[-3:, :, -2:] * 2,
    "select": lambda x: x[:, 2, :] + x[1, :4],
    "squeeze": lambda x: x[:, :1, :].squeeze(1).sin(),
    "unsqueeze": lambda x: x.sum(1).unsqueeze(1) * x,
    "view": lambda x: x.sin().view(24, 5).cos(),
    "reshape_transposed": lambda x: x.transpose(0, 1).reshape(6, 20).sin(),
    "flatten": lambda x: x.permute(1, 0, 2).flatten().cos(),
    "view_of_slice": lambda x: x[:, 1:3].reshape(8, 5).exp(),
    "as_strided_extern": lambda x: torch.as_strided(x, (3, 3), (7, 2), 5).sin(),
    "chain": lambda x: x.permute(1, 2, 0)[1:, :, ::2].transpose(0, 1).reshape(5, -1).sin(),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view(name: str) -> None:
    check(VIEWS[name], X)


@pytest.mark.parametrize("name", ["permute", "transpose", "slice_step", "reshape_transposed", "flatten"])
def test_view_on_noncontiguous_input(name: str) -> None:
    check(VIEWS[name], X.transpose(0, 2).contiguous().transpose(0, 2))


def test_views_are_not_copies():
    art = check(lambda x: x.t()[1:, ::2].sin(), torch.randn(8, 9))
    assert len(kernel_steps(art)) == 1
    assert len(alloc_steps(art)) == 1


def test_output_that_is_a_view_of_an_input_keeps_eager_layout():
    check(lambda x: (x.t(), x[1:].sin()), torch.randn(5, 3))


def test_input_with_storage_offset():
    base = torch.randn(10, 8)
    check(lambda x: x.sin() + 1, base[2:5, 1:7])


def test_split_chunk_unbind_are_views():
    x = torch.randn(6, 4)
    art = check(lambda a: [t.sin() for t in a.split(2, -1)] + [t.cos() for t in a.chunk(3, 0)], x)
    assert art.manifest.stats.nodes_extern == 0
    check(lambda a: [t + 1 for t in a.unbind(1)], x)


def test_split_pieces_reach_externs_as_views():
    x = torch.randn(6, 4)
    art = check(lambda a: [torch.mm(t, t.t()) for t in a.split(3, 0)], x)
    assert all(s.op != "aten.as_strided.default" for s in art.manifest.plan.steps if s.kind == "extern")


def test_arange():
    x = torch.randn(5)
    check(lambda a: a + torch.arange(5), x)
    check(lambda a: a * torch.arange(3, 13, 2, dtype=torch.float32), x)


def test_output_that_is_a_view_of_an_intermediate_has_eager_strides():
    x = torch.randn(4, 2, 3)
    check(lambda a: torch.relu(a)[:, :, ::2], x)
    check(lambda a: a.sin().unsqueeze(2).select(1, 0), x)
    check(lambda a: (a.permute(2, 0, 1) + 1)[1:], x)


def test_view_chains_from_an_alias_of_an_input():
    x = torch.randn(4, 3)
    check(lambda a: a.t().unsqueeze(1).select(2, 1), x)
    check(lambda a: a.unsqueeze(2).select(0, 1).t(), x)


def test_output_that_is_a_view_of_a_tuple_item():
    x, w = torch.randn(3, 2, 4), torch.randn(4)
    check(lambda a, b: torch.nn.functional.layer_norm(a, (4,), b, b)[:, 1], x, w)


def _externs(art) -> list[str]:
    return [s.op for s in art.manifest.plan.steps if s.kind == "extern"]


def test_a_dense_view_returned_of_an_unwritten_value_is_a_buffer_of_its_own():
    """Batch norm's saved statistics, [C] unsqueezed thrice to [1, C, 1, 1]: written as a
    [1, C, 1, 1] buffer by the kernel that computes them, with no view step; a view of a value that
    is itself returned keeps being a view of it (eager's aliasing)."""
    x = torch.randn(4, 6, 5, 3)

    def stats(t):
        mean = t.mean(dim=(0, 2, 3))
        return t - mean.view(1, 6, 1, 1), (mean * 2).unsqueeze(0).unsqueeze(2).unsqueeze(3)
    art = check(stats, x)
    assert _externs(art) == []
    assert [1, 6, 1, 1] in [s.spec.sizes for s in alloc_steps(art)]
    art = check(lambda t: (t.mean(dim=0), t.mean(dim=0).unsqueeze(0).unsqueeze(2)), X)
    assert art.manifest.plan.outputs[0].name != art.manifest.plan.outputs[1].name


def test_a_chain_of_reshaping_views_is_one_view_step():
    """An input unsqueezed and squeezed on its way to an extern call: one aten.view, not one step a
    view; a chain that permutes stays the graph's own view ops."""
    w = torch.randn(5, 3)
    art = check(lambda v, m: torch.mm(v.unsqueeze(0).unsqueeze(2).squeeze(2), m), torch.randn(5), w)
    assert _externs(art) == ["aten.view.default", "aten.mm.default"]
    art = check(lambda v, m: torch.mm(v.unsqueeze(2).permute(1, 0, 2).squeeze(2), m), torch.randn(2, 5), w[:2])
    assert "aten.view.default" not in _externs(art) and _externs(art)[-1] == "aten.mm.default"


def test_aligned_rows_is_written_by_its_producers_kernel_and_read_where_it_lies():
    # fxcc.aligned_rows, as passes/pad_mm.py puts it in (on CUDA targets): the same values, rows 4
    # elements apart or a multiple of that, computed by the kernel of the value's producer
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.capture import capture_graph
    from fxcc.compiler_core.graph import rebuild_graph, wire_graph
    from fxcc.compiler_core.passes.edit import GraphEdit
    from fxcc.compiler_core.passes.pad_mm import restride
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target
    from tests.compiler_core.helpers import run

    def fn(a, w):
        grad = a.exp() - 1
        return grad @ w, grad.t() @ a[:, :3], grad.sum(0)

    a, w = torch.randn(6, 7), torch.randn(7, 5)
    spec = capture_graph(make_fx(fn)(a, w), [a, w]).spec
    gm = rebuild_graph(spec)
    edit = GraphEdit(gm)
    restride(edit, next(n for n in gm.graph.nodes if n.target == torch.ops.aten.sub.Tensor), {})
    edit.finish()
    art = compile_request(CompileRequest(graph=wire_graph(gm, spec), options=CompileOptions(target=Target(kind="interpret"))))
    steps = art.manifest.plan.steps
    aligned = [s for s in steps if s.kind == "alloc" and s.spec.strides == [8, 1]]
    assert len(aligned) == 1 and aligned[0].spec.sizes == [6, 7]
    assert not any(s.kind == "extern" and "aligned_rows" in s.op for s in steps)
    for got, want in zip(run(art, a, w), fn(a, w)):
        torch.testing.assert_close(got, want)

"""The index_add pass: accumulating first-dim index_puts (an embedding's backward) run as index_add on
CUDA targets, with the same sums."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.backend import decomposition_table
from fxcc.client.capture import capture_graph
from fxcc.compiler_core.passes.index_add import index_puts_as_index_add
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target
from tests.compiler_core.helpers import run_pass

aten = torch.ops.aten


def _spec(fn, *inputs, decompose: bool = False):
    gm = make_fx(fn, decomposition_table=decomposition_table() if decompose else None)(*inputs)
    return capture_graph(gm, list(inputs)).spec


def _targets(gm: torch.fx.GraphModule) -> list[object]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _embedding_backward(grad: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return aten.embedding_dense_backward(grad, idx, 50, 3, False)


def test_an_embedding_backward_runs_as_index_add_with_the_same_sums():
    torch.manual_seed(0)
    grad = torch.randn(4, 6, 8)
    idx = torch.randint(0, 50, (4, 6))
    idx[0, :3] = 7  # repeated rows accumulate
    idx[1, 0] = 3   # the padding index gets no gradient
    spec = _spec(_embedding_backward, grad, idx, decompose=True)
    new_gm, _ = run_pass(index_puts_as_index_add, spec, "cuda")
    targets = _targets(new_gm)
    assert aten.index_add.default in targets and aten.index_put.default not in targets
    (got,) = new_gm(grad, idx)
    torch.testing.assert_close(got, _embedding_backward(grad, idx))


def test_negative_indices_wrap_and_broadcast_values_expand():
    def fn(base, idx, values):
        return aten.index_put(base, [idx], values, True)

    base, values = torch.randn(10, 3), torch.randn(1, 3)  # broadcast over the 5 indices
    idx = torch.tensor([0, -1, 9, -10, 0])
    new_gm, _ = run_pass(index_puts_as_index_add, _spec(fn, base, idx, values), "cuda")
    assert aten.index_add.default in _targets(new_gm)
    (got,) = new_gm(base, idx, values)
    torch.testing.assert_close(got, fn(base, idx, values))


def test_left_alone_when_not_accumulating_on_one_first_dim_index_or_not_cuda():
    base, v = torch.randn(6, 4), torch.randn(3, 4)
    i, j = torch.tensor([0, 2, 2]), torch.tensor([1, 1, 3])
    mask = torch.tensor([True, False, True, False, True, False])
    cases = [
        (lambda b, x, y: aten.index_put(b, [x], y, False), (base, i, v), "cuda"),              # overwrite
        (lambda b, x, y: aten.index_put(b, [x, y], torch.ones(3), True), (base, i, j), "cuda"),  # two dims
        (lambda b, m: aten.index_put(b, [m], torch.ones(3, 4), True), (base, mask), "cuda"),    # boolean mask
        (lambda b, x, y: aten.index_put(b, [x], y, True), (base, i, v), "interpret"),
    ]
    for fn, inputs, target in cases:
        spec = _spec(fn, *inputs)
        assert run_pass(index_puts_as_index_add, spec, target)[1] is spec


def test_a_compiled_cuda_plan_runs_index_add_instead_of_the_sorting_index_put():
    grad, idx = torch.randn(4, 6, 8), torch.randint(0, 50, (4, 6))
    spec = _spec(_embedding_backward, grad, idx, decompose=True)
    art = compile_request(CompileRequest(graph=spec, options=CompileOptions(target=Target(kind="cuda", arch=90))))
    ops = [s.op for s in art.manifest.plan.steps if s.kind == "extern"]
    assert "aten.index_add.default" in ops and "aten.index_put.default" not in ops

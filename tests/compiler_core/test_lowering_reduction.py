"""Reduction lowerings vs eager, and fusion of prologue/epilogue: softmax and bias+GELU+LayerNorm are one kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions, get_decompositions

from tests.compiler_core.helpers import alloc_steps, check, compile_fn, kernel_steps, run

aten = torch.ops.aten
torch.manual_seed(0)
X = torch.randn(6, 7, 5)

REDUCTIONS = {
    "sum_last": lambda x: x.sum(-1),
    "sum_all": lambda x: x.sum(),
    "sum_first_keepdim": lambda x: x.sum(0, keepdim=True),
    "sum_middle": lambda x: x.sum(1),
    "mean": lambda x: x.mean((0, 2)),
    "mean_keepdim": lambda x: x.mean(-1, keepdim=True) - x,
    "amax": lambda x: x.amax(1),
    "amin_keepdim": lambda x: x.amin(-1, keepdim=True) + x,
    "prod": lambda x: x.prod(-1),
    "var": lambda x: x.var(-1),
    "var_unbiased_all": lambda x: x.var(),
    "var_mean": lambda x: torch.var_mean(x, 1, correction=0),
    "std": lambda x: x.std(-1),
    "softmax_last": lambda x: F.softmax(x, -1),
    "softmax_middle": lambda x: F.softmax(x, 1),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "sum_of_size1_dim": lambda x: x[:, :1].sum(1),
    "transposed_input": lambda x: x.transpose(0, 2).sum(-1),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def tol(dtype: torch.dtype) -> dict[str, float]:
    if dtype in (torch.float16, torch.bfloat16):
        return {"atol": 3e-2, "rtol": 3e-2}
    return {"atol": 1e-5, "rtol": 1e-5}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction(name: str, dtype: torch.dtype) -> None:
    check(REDUCTIONS[name], X.to(dtype), **tol(dtype))


def test_integer_and_bool_sums():
    xi = torch.randint(-9, 9, (5, 9), dtype=torch.int32)
    check(lambda a: a.sum(-1), xi)
    check(lambda a: a.amax(0), xi)
    check(lambda a: (a > 0).sum(-1), xi)


def test_nan_propagates_through_amax():
    x = X.clone()
    x[1, 2, 3] = float("nan")
    check(lambda a: a.amax(-1), x)
    check(lambda a: F.softmax(a, -1), x)


def test_softmax_is_one_kernel():
    x = torch.randn(16, 100)
    art = check(lambda a: F.softmax(a, -1), x)
    assert len(kernel_steps(art)) == 1
    assert len(alloc_steps(art)) == 1


def bias_gelu_layernorm(x, b, w, bb):
    return F.layer_norm(F.gelu(x + b), (x.shape[-1],), w, bb)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_gelu_layernorm_is_one_kernel(dtype: torch.dtype) -> None:
    n = 96
    args = [t.to(dtype) for t in (torch.randn(12, n), torch.randn(n), torch.randn(n), torch.randn(n))]
    art = check(bias_gelu_layernorm, *args, **tol(dtype))
    assert len(kernel_steps(art)) == 1
    assert len(alloc_steps(art)) == 1
    assert art.manifest.stats.nodes_extern == 0


def test_decomposed_layernorm_and_softmax_fuse_too():
    table = core_aten_decompositions()
    table.update(get_decompositions([aten.native_layer_norm, aten._softmax]))
    x, w = torch.randn(8, 32), torch.randn(32)
    import tests.compiler_core.helpers as h

    def ln(a, b):
        return F.layer_norm(a, (32,), b, b)
    for fn, ins in ((ln, (x, w)), (lambda a: F.softmax(a, -1), (x,))):
        from torch.fx.experimental.proxy_tensor import make_fx

        from fxcc.client.capture import capture_graph
        from fxcc.compiler_core.pipeline import compile_request
        from fxcc.compiler_core.wire import CompileRequest
        with torch.no_grad():
            gm = make_fx(fn, decomposition_table=table)(*ins)
        art = compile_request(CompileRequest(graph=capture_graph(gm, list(ins)).spec))
        torch.testing.assert_close(h.run(art, *ins)[0], fn(*ins), atol=1e-5, rtol=1e-5)
        assert art.manifest.stats.nodes_extern == 0
        assert len(kernel_steps(art)) == 1


def test_long_rows_use_a_looped_reduction():
    x = torch.randn(3, 5000)
    art = check(lambda a: a.sum(-1) * 2, x, atol=1e-4, rtol=1e-5)
    assert len(kernel_steps(art)) == 1
    (src,) = [art.blobs[k.source.digest].decode() for k in art.manifest.kernels]
    assert "for roffset in range(0, rnumel, RBLOCK):" in src
    check(lambda a: F.softmax(a, -1), x)
    check(lambda a: a.amax(-1), x)


def test_layernorm_stats_outputs():
    x, w = torch.randn(4, 10), torch.randn(10)
    art = compile_fn(lambda a, b: aten.native_layer_norm(a, [10], b, b, 1e-5), x, w, decompose=False)
    got = run(art, x, w)
    want = aten.native_layer_norm(x, [10], w, w, 1e-5)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_reductions_over_a_single_element():
    x = torch.randn(3, 1)
    check(lambda a: torch.softmax(a, 1), x)
    check(lambda a: torch.var_mean(a, 1, correction=0), x)
    check(lambda a: torch.nn.functional.layer_norm(a, (1,)), x)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_softmax_over_any_dim_is_one_kernel(dim: int) -> None:
    art = check(lambda a: F.softmax(a, dim), X)
    assert len(kernel_steps(art)) == 1


def test_few_outputs_over_long_rows_reduce_in_two_stages():
    x = torch.randn(1 << 17)
    art = check(lambda a: a.sum(), x, atol=1e-3, rtol=1e-4)
    assert len(kernel_steps(art)) == 2
    check(lambda a: a.amax(), x)
    check(lambda a: a.view(2, 4, -1).var((0, 2)), x, atol=1e-4, rtol=1e-4)

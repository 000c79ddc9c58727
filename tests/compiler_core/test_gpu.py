"""On a CUDA GPU: kernels generated for the cuda target compile with Triton's JIT and match eager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def compile_cuda(fn: Callable[..., Any], *inputs: torch.Tensor) -> Any:
    from fxcc.client.capture import capture_graph
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target

    major, minor = torch.cuda.get_device_capability()
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=core_aten_decompositions())(*inputs)
    req = CompileRequest(graph=capture_graph(gm, list(inputs)).spec,
                         options=CompileOptions(target=Target(kind="cuda", arch=major * 10 + minor)))
    return compile_request(req)


def check_cuda(fn: Callable[..., Any], *inputs: torch.Tensor, tol: float = 1e-5) -> Any:
    from fxcc.client.runtime import load_plan

    art = compile_cuda(fn, *inputs)
    got = load_plan(art)(list(inputs))
    with torch.no_grad():
        want = fn(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=tol, rtol=tol, equal_nan=True)
        assert g.stride() == w.stride()
    return art


def bias_gelu_layernorm(x, b, w, bb):
    return F.layer_norm(F.gelu(x + b), (x.shape[-1],), w, bb)


CASES = {
    "cos_sin": (lambda x: torch.cos(torch.sin(x)), [(1 << 20,)]),
    "unary_mix": (lambda x: x.tanh() + x.erf() + x.sigmoid() + x.abs().sqrt().log1p() + x.exp2(), [(4096, 33)]),
    "pow": (lambda x: x.abs() ** 1.7 + x ** 2, [(999,)]),
    "rounding": (lambda x: torch.trunc(x) + torch.round(x) + x.floor() + x.ceil(), [(999,)]),
    "broadcast_t": (lambda x, b: (x.t() * b).relu(), [(64, 48), (64,)]),
    "softmax": (lambda x: F.softmax(x, -1), [(512, 1000)]),
    "softmax_long": (lambda x: F.softmax(x, -1), [(64, 10000)]),
    "log_softmax_mid": (lambda x: F.log_softmax(x, 1), [(16, 100, 8)]),
    "bias_gelu_ln": (bias_gelu_layernorm, [(1024, 768), (768,), (768,), (768,)]),
    "var_mean": (lambda x: torch.var_mean(x, -1), [(300, 3000)]),
    "sum_dim0": (lambda x: x.sum(0), [(3000, 77)]),
    "sum_all_split": (lambda x: x.sum() / x.numel() + x.amax(), [(1 << 22,)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_matches_eager(name: str, dtype: torch.dtype) -> None:
    fn, shapes = CASES[name]
    torch.manual_seed(0)
    inputs = [torch.randn(s, device="cuda", dtype=dtype) for s in shapes]
    check_cuda(fn, *inputs, tol=1e-4 if dtype == torch.float32 else 3e-2)


def test_fusion_counts_on_cuda():
    x = torch.randn(1024, 768, device="cuda")
    v = torch.randn(768, device="cuda")
    assert check_cuda(bias_gelu_layernorm, x, v, v, v).manifest.stats.kernels == 1
    assert check_cuda(lambda a: F.softmax(a, -1), x).manifest.stats.kernels == 1
    assert check_cuda(lambda a: a.sin().cos(), x).manifest.stats.kernels == 1


def test_transformer_block_training_on_cuda():
    from tests.compiler_core.test_compile import TransformerBlock, fxcc_backend

    torch.manual_seed(0)
    model = TransformerBlock(64, 4).cuda().train()
    x = torch.randn(4, 16, 64, device="cuda", requires_grad=True)
    arts: list[Any] = []
    torch.compile(model, backend=fxcc_backend(arts))(x).square().sum().backward()
    got = x.grad.clone()
    x.grad = None
    model(x).square().sum().backward()
    torch.testing.assert_close(got, x.grad, atol=1e-3, rtol=1e-3)


NEW_LOWERINGS = {
    "cat_pad_index": (lambda x, i: torch.cat([F.pad(x, (1, 2)), x[:, :3].sin()], 1)[i] + x[:, i[:4] % 48].sum(),
                      [(64, 48)]),
    "gather_embedding": (lambda x, i: torch.gather(x, 1, i[:, None].expand(-1, 5) % 48)
                         + F.embedding(i[:5] % 64, x).sum(0)[:5], [(64, 48)]),
    "pointwise": (lambda x, i: torch.remainder(x, 1.5) + torch.div(x, 0.7, rounding_mode="floor") + x.sign()
                  + x.isnan() + torch.fmax(x, x.flip(0)) + x.abs() ** x + torch.round(x * 4), [(64, 48)]),
    "reductions": (lambda x, i: (x.argmax(1), *x.max(0), (x > 0).any(1), x.cumsum(1),
                                torch.linalg.vector_norm(x, 3, dim=1)), [(64, 48)]),
}


@pytest.mark.parametrize("name", sorted(NEW_LOWERINGS))
def test_masked_indirect_and_newer_lowerings_on_cuda(name: str) -> None:
    fn, shapes = NEW_LOWERINGS[name]
    torch.manual_seed(0)
    x = torch.randn(shapes[0], device="cuda")
    i = torch.randint(-64, 64, (64,), device="cuda")  # negative indices wrap
    art = check_cuda(fn, x, i)
    assert art.manifest.stats.nodes_extern == 0


def _mlp_in_place(x, w1, b1, w2):
    return F.gelu(F.linear(x, w1, b1)) @ w2


def _norm_in_place(x, w, lw, lb, w2):
    return F.layer_norm(x @ w + x, (x.shape[-1],), lw, lb) @ w2


def _conv_bn_relu_in_place(x, cw, scale, shift, cw2):
    y = F.conv2d(x, cw, padding=1)
    return F.conv2d(torch.relu(y * scale[:, None, None] + shift[:, None, None]), cw2, padding=1)


IN_PLACE = {
    "mlp": (_mlp_in_place, [(4096, 256), (1024, 256), (1024,), (1024, 64)]),
    "layer_norm": (_norm_in_place, [(4096, 768), (768, 768), (768,), (768,), (768, 64)]),
    "conv_bn_relu": (_conv_bn_relu_in_place, [(8, 16, 32, 32), (32, 16, 3, 3), (32,), (32,), (8, 32, 3, 3)]),
}


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_kernels_written_over_their_extern_inputs_match_eager(name: str) -> None:
    """Many programs each write over torch's matmul/conv result where they read it (plan.write_in_place)."""
    fn, shapes = IN_PLACE[name]
    torch.manual_seed(0)
    inputs = [torch.randn(s, device="cuda") / 8 for s in shapes]
    steps = check_cuda(fn, *inputs, tol=1e-3).manifest.plan.steps
    externs = {s.out for s in steps if s.kind == "extern"}
    assert any(s.kind == "alloc" and s.reuse in externs for s in steps)

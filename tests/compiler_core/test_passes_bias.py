"""The bias pass: conv biases and fp32 addmm biases (read only pointwise) peeled into an add that
fuses into a Triton kernel on CUDA targets, with the same values."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.compiler_core.passes.bias import peel_biases
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target
from tests.compiler_core.helpers import run_pass

aten = torch.ops.aten


def _spec(fn, *inputs):
    return capture_graph(make_fx(fn)(*inputs), list(inputs)).spec


def _calls(gm: torch.fx.GraphModule, target: object) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


def _conv_relu(x, w, b):
    return torch.relu(aten.convolution(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))


def _linear_gelu(x, w, b):
    return F.gelu(aten.addmm(b, x, w).view(2, 3, -1))


def test_a_conv_bias_becomes_an_add_after_the_conv_with_the_same_values():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(5, 3, 3, 3), torch.randn(5)
    gm, _ = run_pass(peel_biases, _spec(_conv_relu, x, w, b), "cuda")
    (conv,) = _calls(gm, aten.convolution.default)
    assert conv.args[2] is None
    (add,) = _calls(gm, aten.add.Tensor)
    assert add.args[0] is conv
    (got,) = gm(x, w, b)
    torch.testing.assert_close(got, _conv_relu(x, w, b))


def test_an_fp32_addmm_read_pointwise_becomes_mm_then_add():
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 4), torch.randn(4, 10), torch.randn(10)
    gm, _ = run_pass(peel_biases, _spec(_linear_gelu, x, w, b), "cuda")
    assert not _calls(gm, aten.addmm.default)
    (mm,) = _calls(gm, aten.mm.default)
    assert [u.target for u in mm.users] == [aten.add.Tensor]
    (got,) = gm(x, w, b)
    torch.testing.assert_close(got, _linear_gelu(x, w, b))


def _without_bias(fn):
    return lambda x, w: fn(x, w, None)


def test_left_alone_off_cuda_for_half_addmms_scaled_ones_and_non_pointwise_readers():
    x, w, b = torch.randn(6, 4), torch.randn(4, 10), torch.randn(10)
    h = [t.to(torch.bfloat16) for t in (x, w, b)]
    cases = [
        (_linear_gelu, (x, w, b), "interpret"),
        (_linear_gelu, tuple(h), "cuda"),                                                  # bf16: epilogue kept
        (lambda x, w, b: F.gelu(aten.addmm(b, x, w, beta=0.5)), (x, w, b), "cuda"),         # scaled bias
        (lambda x, w, b: aten.addmm(b, x, w).sum(0), (x, w, b), "cuda"),                   # a reduction reads it
        (lambda x, w, b: aten.addmm(b, x, w) @ w.t(), (x, w, b), "cuda"),                  # a matmul reads it
        (lambda x, w, b: aten.convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
         (torch.randn(1, 3, 4, 4), torch.randn(2, 3, 1, 1), None), "cuda"),                # no bias
    ]
    for fn, inputs, target in cases:
        args = [t for t in inputs if t is not None]
        spec = _spec(fn, *inputs) if None not in inputs else _spec(_without_bias(fn), *args)
        assert run_pass(peel_biases, spec, target)[1] is spec


def test_a_cuda_plan_runs_the_conv_without_its_bias_and_adds_it_in_a_kernel():
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(5, 3, 3, 3), torch.randn(5)
    art = compile_request(CompileRequest(graph=_spec(_conv_relu, x, w, b),
                                         options=CompileOptions(target=Target(kind="cuda", arch=90))))
    (conv,) = [s for s in art.manifest.plan.steps if s.kind == "extern" and s.op == "aten.convolution.default"]
    assert conv.args[2].kind == "none"
    assert not [s for s in art.manifest.plan.steps if s.kind == "extern" and s.op == "aten.add.Tensor"]
    assert art.manifest.stats.kernels == 1  # bias and relu in one Triton kernel

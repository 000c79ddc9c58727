"""The matmul padding pass: unaligned big matmuls on CUDA targets get aligned rows, same values."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.compiler_core.passes.pad_mm import MIN_ELEMENTS, pad_matmuls
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target
from tests.compiler_core.helpers import run_pass


def _spec(fn, *inputs):
    gm = make_fx(fn)(*inputs)
    return capture_graph(gm, list(inputs)).spec


def _run(gm, inputs):
    (out,) = gm(*inputs)
    return out


def test_unaligned_mm_is_padded_and_computes_the_same():
    a, w = torch.randn(1024, 64), torch.randn(4099, 64)  # N = 4099: rows not 16-byte aligned
    assert 1024 * 4099 >= MIN_ELEMENTS
    spec = _spec(lambda x, y: torch.mm(x, y.t()), a, w)
    new_gm, new_spec = run_pass(pad_matmuls, spec, "cuda")
    targets = [n.target for n in new_spec.nodes]
    assert "aten.constant_pad_nd.default" in targets and targets[-1] == "aten.slice.Tensor"
    wide = next(n for n in new_gm.graph.nodes if n.name.endswith("_fxwide"))
    assert wide.meta["val"].shape[1] % 4 == 0
    torch.testing.assert_close(_run(new_gm, [a, w]), a @ w.t())


def test_addmm_pads_its_bias_too():
    a, w, b = torch.randn(2048, 32), torch.randn(2051, 32), torch.randn(2051)
    spec = _spec(lambda x, y, z: torch.addmm(z, x, y.t()), a, w, b)
    new_gm, new_spec = run_pass(pad_matmuls, spec, "cuda")
    assert sum(n.target == "aten.constant_pad_nd.default" for n in new_spec.nodes) == 2
    torch.testing.assert_close(_run(new_gm, [a, w, b]), torch.addmm(b, a, w.t()))


def test_left_alone_when_aligned_small_or_not_cuda():
    cases = [(torch.randn(1024, 64), torch.randn(4096, 64), "cuda"),   # aligned
             (torch.randn(16, 64), torch.randn(4099, 64), "cuda"),     # small
             (torch.randn(1024, 64), torch.randn(4099, 64), "interpret")]
    for a, w, target in cases:
        spec = _spec(lambda x, y: torch.mm(x, y.t()), a, w)
        assert run_pass(pad_matmuls, spec, target)[1] is spec


def test_compiled_cuda_plan_uses_the_padded_matmul():
    a, w = torch.randn(1024, 64), torch.randn(4099, 64)
    spec = _spec(lambda x, y: torch.mm(x, y.t()), a, w)
    art = compile_request(CompileRequest(graph=spec, options=CompileOptions(target=Target(kind="cuda", arch=90))))
    ops = [s.op for s in art.manifest.plan.steps if s.kind == "extern"]
    assert "aten.mm.default" in ops
    mm = next(s for s in art.manifest.plan.steps if s.kind == "extern" and s.op == "aten.mm.default")
    assert mm.expect_strides == [4100, 1]


def test_a_transposed_weight_is_padded_in_its_own_memory_order():
    # mm(x, W.t()) (a Linear): W's rows are padded (a contiguous copy) and the matmul gets the
    # transposed padded copy, so cuBLAS still sees a transposed operand, as without the pass.
    a, w = torch.randn(1024, 64), torch.randn(4099, 64)
    spec = _spec(lambda x, y: torch.mm(x, y.t()), a, w)
    new_gm, _new_spec = run_pass(pad_matmuls, spec, "cuda")
    pad = next(n for n in new_gm.graph.nodes if n.target == torch.ops.aten.constant_pad_nd.default)
    assert tuple(pad.meta["val"].shape) == (4100, 64) and pad.meta["val"].is_contiguous()
    wide = next(n for n in new_gm.graph.nodes if n.name.endswith("_fxwide"))
    assert tuple(wide.args[1].meta["val"].stride()) == (1, 64)
    torch.testing.assert_close(_run(new_gm, [a, w]), a @ w.t())


def test_an_untransposed_operand_is_padded_along_its_columns():
    a, b = torch.randn(1024, 64), torch.randn(64, 4099)
    spec = _spec(lambda x, y: torch.mm(x, y), a, b)
    new_gm, _new_spec = run_pass(pad_matmuls, spec, "cuda")
    pad = next(n for n in new_gm.graph.nodes if n.target == torch.ops.aten.constant_pad_nd.default)
    assert tuple(pad.meta["val"].shape) == (64, 4100)
    torch.testing.assert_close(_run(new_gm, [a, b]), a @ b)

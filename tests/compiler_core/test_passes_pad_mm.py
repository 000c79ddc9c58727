"""The matmul padding pass: unaligned big matmuls on CUDA targets get aligned rows, same values."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.compiler_core.passes import pad_mm
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


def _aligned_of(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target == torch.ops.fxcc.aligned_rows.default]


def _mm_operands(gm: torch.fx.GraphModule) -> list[tuple[torch.Tensor, ...]]:
    return [tuple(a.meta["val"] for a in n.args) for n in gm.graph.nodes if n.target == torch.ops.aten.mm.default]


def test_an_operand_with_unaligned_rows_is_read_from_an_aligned_copy(monkeypatch):
    # The head's backward for its input: mm(grad_logits, W), each row of grad K = 1001 floats.
    monkeypatch.setattr(pad_mm, "MIN_FLOPS", 1)
    g, w = torch.randn(64, 1001), torch.randn(1001, 32)
    new_gm, _ = run_pass(pad_matmuls, _spec(torch.mm, g, w), "cuda")
    (a, b), = _mm_operands(new_gm)
    assert a.shape == (64, 1001) and a.stride() == (1004, 1) and b.stride() == (32, 1)  # W as it was
    torch.testing.assert_close(_run(new_gm, [g, w]), g @ w)


def test_a_column_major_operand_reads_its_sources_aligned_copy(monkeypatch):
    # The head's backward for its weight: mm(grad_logits.t(), x), M = 1001 (t(grad)'s leading dim).
    monkeypatch.setattr(pad_mm, "MIN_FLOPS", 1)
    g, x = torch.randn(64, 1001), torch.randn(64, 32)
    new_gm, _ = run_pass(pad_matmuls, _spec(lambda a, b: torch.mm(a.t(), b), g, x), "cuda")
    (copy,) = _aligned_of(new_gm)
    assert copy.args[0].op == "placeholder"  # the gradient itself, not its transpose
    (a, _), = _mm_operands(new_gm)
    assert a.shape == (1001, 64) and a.stride() == (1, 1004)
    out = _run(new_gm, [g, x])
    torch.testing.assert_close(out, g.t() @ x)
    assert out.is_contiguous()


def test_the_head_backwards_two_matmuls_and_other_readers_share_one_aligned_gradient(monkeypatch):
    monkeypatch.setattr(pad_mm, "MIN_FLOPS", 1)
    g, w, x = torch.randn(64, 1001), torch.randn(1001, 32), torch.randn(64, 32)

    def head_backward(a, b, c):
        return torch.mm(a, b), torch.mm(a.t(), c), a.sum(0), a.view(-1)[:5]

    new_gm, _ = run_pass(pad_matmuls, _spec(head_backward, g, w, x), "cuda")
    (copy,) = _aligned_of(new_gm)
    readers = {n.target for n in copy.users}
    assert torch.ops.aten.mm.default in readers and torch.ops.aten.sum.dim_IntList in readers
    assert torch.ops.aten.view.default not in readers  # a view that needs the gradient's own strides
    for got, want in zip(new_gm(g, w, x), head_backward(g, w, x)):
        torch.testing.assert_close(got, want)


def test_operands_left_alone_below_the_size_worth_a_copy():
    g, w = torch.randn(64, 1001), torch.randn(1001, 32)
    assert 64 * 1001 * 32 < pad_mm.MIN_FLOPS
    for spec in (_spec(torch.mm, g, w), _spec(lambda a: torch.mm(a.t(), a[:, :32]), g)):
        assert run_pass(pad_matmuls, spec, "cuda")[1] is spec


def test_a_compiled_cuda_plan_writes_the_aligned_gradient_with_its_kernel(monkeypatch):
    # the gradient is computed in the graph: its kernel stores it with aligned rows, once
    monkeypatch.setattr(pad_mm, "MIN_FLOPS", 1)
    g, w, x = torch.randn(64, 1001), torch.randn(1001, 32), torch.randn(64, 32)
    def head_backward(a, b, c):
        grad = a.exp() - 1
        return torch.mm(grad, b), torch.mm(grad.t(), c)

    spec = _spec(head_backward, g, w, x)
    art = compile_request(CompileRequest(graph=spec, options=CompileOptions(target=Target(kind="cuda", arch=90))))
    steps = art.manifest.plan.steps
    assert not any(s.kind == "extern" and "aligned_rows" in s.op for s in steps)
    allocs = [s for s in steps if s.kind == "alloc" and s.spec.strides == [1004, 1]]
    assert len(allocs) == 1
    assert sum(s.kind == "extern" and s.op == "aten.mm.default" for s in steps) == 2

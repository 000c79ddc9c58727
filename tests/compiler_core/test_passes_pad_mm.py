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


def _pads_of(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target == torch.ops.aten.constant_pad_nd.default]


def test_an_unaligned_inner_dim_is_padded_on_both_operands(monkeypatch):
    # The head's backward for its input: mm(grad_logits, W), K = the vocabulary, each row of grad
    # (and each column of W's transpose) unaligned.
    monkeypatch.setattr(pad_mm, "MIN_FLOPS", 1)
    g, w = torch.randn(64, 1001), torch.randn(1001, 32)
    new_gm, _ = run_pass(pad_matmuls, _spec(torch.mm, g, w), "cuda")
    wide = next(n for n in new_gm.graph.nodes if n.target == torch.ops.aten.mm.default)
    assert [tuple(a.meta["val"].shape) for a in wide.args] == [(64, 1004), (1004, 32)]
    torch.testing.assert_close(_run(new_gm, [g, w]), g @ w)


def test_a_column_major_operands_rows_are_padded_and_the_result_sliced(monkeypatch):
    # The head's backward for its weight: mm(grad_logits.t(), x), M = the vocabulary.
    monkeypatch.setattr(pad_mm, "MIN_FLOPS", 1)
    g, x = torch.randn(64, 1001), torch.randn(64, 32)
    new_gm, _ = run_pass(pad_matmuls, _spec(lambda a, b: torch.mm(a.t(), b), g, x), "cuda")
    (pad,) = _pads_of(new_gm)
    assert tuple(pad.meta["val"].shape) == (64, 1004)  # the gradient's columns, in its own order
    out = _run(new_gm, [g, x])
    torch.testing.assert_close(out, g.t() @ x)
    assert out.is_contiguous()


def test_the_head_backwards_two_matmuls_share_one_padded_gradient(monkeypatch):
    monkeypatch.setattr(pad_mm, "MIN_FLOPS", 1)
    g, w, x = torch.randn(64, 1001), torch.randn(1001, 32), torch.randn(64, 32)
    spec = _spec(lambda a, b, c: (torch.mm(a, b), torch.mm(a.t(), c)), g, w, x)
    new_gm, _ = run_pass(pad_matmuls, spec, "cuda")
    pads = _pads_of(new_gm)
    assert sum(p.args[0].name == "a_1" for p in pads) == 1 and len(pads) == 2  # grad once, W once
    got = new_gm(g, w, x)
    torch.testing.assert_close(got[0], g @ w)
    torch.testing.assert_close(got[1], g.t() @ x)


def test_inner_and_row_dims_left_alone_below_the_size_worth_a_copy():
    g, w = torch.randn(64, 1001), torch.randn(1001, 32)
    assert 64 * 1001 * 32 < pad_mm.MIN_FLOPS
    for fn in (torch.mm, lambda a, b: torch.mm(a.t(), torch.randn(64, 32))):
        spec = _spec(fn, g, w) if fn is torch.mm else _spec(lambda a: torch.mm(a.t(), a[:, :32]), g)
        assert run_pass(pad_matmuls, spec, "cuda")[1] is spec


def test_no_pad_whose_copy_would_leave_its_own_leading_dim_unaligned(monkeypatch):
    # a column-major a that is no t() of a tensor: its padded copy is row-major, with rows of
    # K = 33 elements, unaligned too; the matmul is left as it is
    monkeypatch.setattr(pad_mm, "MIN_FLOPS", 1)
    x, b = torch.randn(33 * 1001), torch.randn(33, 32)
    spec = _spec(lambda p, q: torch.mm(torch.as_strided(p, (1001, 33), (1, 1001)), q), x, b)
    assert run_pass(pad_matmuls, spec, "cuda")[1] is spec
    # with K aligned the same copy has aligned rows, and the rows of a are padded
    x, b = torch.randn(32 * 1001), torch.randn(32, 32)
    spec = _spec(lambda p, q: torch.mm(torch.as_strided(p, (1001, 32), (1, 1001)), q), x, b)
    new_gm, _ = run_pass(pad_matmuls, spec, "cuda")
    torch.testing.assert_close(_run(new_gm, [x, b]), torch.as_strided(x, (1001, 32), (1, 1001)) @ b)

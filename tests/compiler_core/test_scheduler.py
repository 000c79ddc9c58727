"""Fusion: pointwise chains become one kernel with no intermediate buffers; stores only where needed."""

from __future__ import annotations

import torch

from tests.compiler_core.helpers import alloc_steps, check, kernel_steps

torch.manual_seed(0)
X = torch.randn(33, 17)


def test_cos_sin_is_one_kernel_without_intermediates():
    art = check(lambda x: torch.cos(torch.sin(x)), X)
    assert len(kernel_steps(art)) == 1
    assert [s.out for s in alloc_steps(art)] == [art.manifest.plan.outputs[0].name]
    stats = art.manifest.stats
    assert stats.kernels == 1 and stats.nodes_extern == 0
    assert stats.ops_fused == 1
    assert stats.intermediate_bytes_avoided == X.numel() * 4


def test_long_chain_with_broadcast_is_one_kernel():
    bias = torch.randn(17)
    art = check(lambda x, b: torch.relu((x + b) * 2).exp().sub(1).tanh(), X, bias)
    assert len(kernel_steps(art)) == 1
    assert len(alloc_steps(art)) == 1


def test_two_outputs_share_one_kernel():
    art = check(lambda x: (x.sin(), x.sin().cos() + 1), X)
    assert len(kernel_steps(art)) == 1
    assert len(alloc_steps(art)) == 2


def test_intermediate_read_by_extern_is_stored():
    art = check(lambda x: torch.atan2(x.sin(), x.cos()) + x.sin(), X)
    assert "aten.atan2.default" in art.manifest.stats.extern_ops


def test_extern_in_the_middle_of_a_chain():
    art = check(lambda x: torch.nn.functional.softplus(x.sin()).cos(), X)
    assert art.manifest.stats.kernels <= 2


def test_shared_heavy_value_is_materialised_once():
    def f(x):
        y = x
        for _ in range(14):
            y = (y.sin() * 1.01 + 0.1).cos()
        return y + 1, y * 2
    art = check(f, X)
    assert len(kernel_steps(art)) == 1


def test_plan_frees_intermediates():
    art = check(lambda x: torch.atan2(x.sin(), x) + 1, X)
    freed = {n for s in art.manifest.plan.steps if s.kind == "free" for n in s.names}
    outputs = {o.name for o in art.manifest.plan.outputs}
    assert freed and not freed & outputs


def test_graph_with_mutation_runs_as_externs():
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.capture import capture_graph
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileRequest
    from tests.compiler_core.helpers import run

    def f(x):
        y = x.sin()
        x.add_(1)
        return y + x

    x = torch.randn(4, 4)
    gm = make_fx(f)(x.clone())
    art = compile_request(CompileRequest(graph=capture_graph(gm, [x]).spec))
    assert art.manifest.stats.kernels == 0
    want = f(x.clone())
    (got,) = run(art, x.clone())
    torch.testing.assert_close(got, want)


def test_column_reductions_loop_over_rows_with_wide_tiles():
    from fxcc.compiler_core.scheduler import PERSISTENT_RNUMEL_MAX

    x = torch.randn(300, 40)
    art = check(lambda a: a.sum(0), x, atol=1e-4, rtol=1e-5)
    (src,) = [art.blobs[k.source.digest].decode() for k in art.manifest.kernels]
    assert "for roffset in range(0, rnumel, RBLOCK):" in src
    assert 300 < PERSISTENT_RNUMEL_MAX
    (info,) = art.manifest.kernels
    assert info.constexprs["XBLOCK"] > 1
    check(lambda a: (a * 2).sum(0) + 1, x, atol=1e-4, rtol=1e-5)
    check(lambda a: a.amax(0), x)


def _transformer_block_graph():
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph
    from fxcc.client.examples import TransformerBlock

    torch.manual_seed(0)
    m = TransformerBlock(64, 4).eval()
    x = torch.randn(2, 32, 64)
    params = dict(m.named_parameters())

    def f(x, *ps):
        return torch.func.functional_call(m, dict(zip(params, ps)), (x,))

    inputs = [x, *params.values()]
    with torch.no_grad():
        gm = make_fx(f, decomposition_table=decomposition_table())(*inputs)
        want = m(x)
    return capture_graph(gm, inputs).spec, inputs, want


def test_transformer_block_needs_no_more_kernels_than_inductor():
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileRequest
    from tests.compiler_core.helpers import run

    spec, inputs, want = _transformer_block_graph()
    art = compile_request(CompileRequest(graph=spec))
    assert art.manifest.stats.kernels <= 7  # Inductor's count for this block
    (got,) = run(art, *inputs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    again = compile_request(CompileRequest(graph=spec))
    assert again.blobs == art.blobs and again.manifest.plan == art.manifest.plan


def test_independent_chain_after_an_extern_joins_the_earlier_kernel():
    # atan2 is an extern call that reads the first chain, so in-order fusion closes that kernel;
    # the second chain reads only inputs and moves up into it as a second output.
    y = torch.randn(33, 17)
    art = check(lambda a, b: (torch.atan2(a.sin() * 2, b), (b.cos() + 1).exp()), X, y)
    assert len(kernel_steps(art)) == 1
    steps = [s.kind for s in art.manifest.plan.steps if s.kind in ("kernel", "extern")]
    assert steps == ["kernel", "extern"]


def test_chain_reading_a_later_extern_result_is_not_hoisted():
    y = torch.randn(33, 17)
    art = check(lambda a, b: torch.atan2(a.sin() * 2, b).cos() + b, X, y)
    kinds = [s.kind for s in art.manifest.plan.steps if s.kind in ("kernel", "extern")]
    assert kinds == ["kernel", "extern", "kernel"]


def _heavy(x):
    # Over REALIZE_OPS_SHARED with two readers: written to a buffer that later kernels load.
    for _ in range(14):
        x = (x.sin() * 1.01 + 0.1).cos()
    return x


def test_hoisted_chain_reads_the_target_value_from_registers_at_the_same_index():
    sq = torch.randn(16, 16)
    art = check(lambda a, b: (torch.atan2(h := _heavy(a), b), h * 3), sq, sq.clone(), atol=1e-5, rtol=1e-5)
    assert [s.kind for s in art.manifest.plan.steps if s.kind in ("kernel", "extern")] == ["kernel", "extern"]


def test_chain_reading_the_target_at_another_index_is_not_hoisted():
    # Inside one kernel, h.t() (written contiguously) would read an element another program
    # writes: that chain stays a kernel of its own.
    sq = torch.randn(16, 16)
    art = check(lambda a, b: (torch.atan2(h := _heavy(a), b), h.t().contiguous() * 3), sq, sq.clone(), atol=1e-5, rtol=1e-5)
    kinds = [s.kind for s in art.manifest.plan.steps if s.kind in ("kernel", "extern")]
    assert kinds == ["kernel", "extern", "kernel"]


def test_row_tiles_hold_the_same_bytes_in_narrow_dtypes():
    """A persistent row kernel's tile is about 8 KB of what it stores: twice the rows in bf16."""
    def norm(a):
        return torch.nn.functional.layer_norm(a, (256,))

    configs = {}
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        x = torch.randn(64, 256, dtype=dtype)
        art = check(norm, x, atol=tol, rtol=tol)
        (info,) = art.manifest.kernels
        configs[dtype] = (info.constexprs["XBLOCK"], info.constexprs["RBLOCK"], info.num_warps)
    assert configs[torch.float32] == (8, 256, 4)
    assert configs[torch.bfloat16] == (16, 256, 4)


def _sources(art):
    return [art.blobs[k.source.digest].decode() for k in art.manifest.kernels]


def test_sibling_looped_reductions_share_one_loop_and_its_loads():
    """Reductions of one long-row space that read nothing of each other: one kernel, one r-loop
    with an accumulator each, x loaded once an iteration (rows of 9001 loop, see PERSISTENT_RNUMEL_MAX)."""
    x = torch.randn(3, 9001)
    art = check(lambda a: (a.sum(-1), (a * a).amax(-1), a.abs().sum(-1) + 1), x, atol=1e-3, rtol=1e-4)
    (src,) = _sources(art)
    assert src.count("for roffset in range(0, rnumel, RBLOCK):") == 1
    assert src.count("tl.load(") == 1 and src.count("tl.store(") == 3


def test_sibling_column_reductions_share_one_loop():
    x = torch.randn(300, 40)
    art = check(lambda a: (a.sum(0), (a * a).sum(0), a.amin(0)), x, atol=1e-4, rtol=1e-5)
    (src,) = _sources(art)
    assert src.count("for roffset in range(0, rnumel, RBLOCK):") == 1 and src.count("tl.load(") == 1


def test_a_looped_reduction_reading_another_stays_a_kernel_of_its_own():
    # The second reads the first's result, which exists only after the first's loop.
    x = torch.randn(3, 9001)
    art = check(lambda a: (a - a.amax(-1, keepdim=True)).abs().sum(-1), x, atol=1e-2, rtol=1e-4)
    assert len(kernel_steps(art)) == 2


def test_a_sibling_reduction_after_an_extern_joins_the_earlier_kernel():
    # The extern call reads the first kernel's sum, which closes it; the second reduction reads
    # only the input and moves up into it, sharing its loop.
    x, y = torch.randn(3, 9001), torch.randn(3)
    art = check(lambda a, b: (torch.atan2(a.sum(-1), b), (a * 3).amax(-1)), x, y, atol=1e-2, rtol=1e-4)
    kinds = [s.kind for s in art.manifest.plan.steps if s.kind in ("kernel", "extern")]
    assert kinds == ["kernel", "extern"]
    (src,) = _sources(art)
    assert src.count("for roffset") == 1

"""flex_attention in compiled graphs (in-process, Triton's interpreter): the forward and the backward
run fxcc's templates with score_mod and mask_mod inlined (no extern step), the rest of each graph
fused around them, and outputs and grads of q, k and v match eager; a mod the template cannot
render makes flex_attention an extern step that still matches.

Note: torch's public flex_attention refuses inputs that require grad on the CPU (a device check,
`_validate_device`); its dense backward, which eager runs, works on any device. The tests lift that
check to compare grads on this CPU-only machine.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.attention.flex_attention as flex_module
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

from fxcc.client import backend
from fxcc.compiler_core.artifact import ExternStep, KernelStep
from fxcc.compiler_core.codegen.flex_attention import KERNEL_PREFIX
from tests.client.flex_cases import assert_as_close_as_eager


@pytest.fixture(autouse=True)
def _isolated(fresh_compiles, monkeypatch):
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    monkeypatch.setattr(flex_module, "_validate_device", lambda *a: None)
    yield


def causal(b, h, q, kv):
    return q >= kv


def sliding(b, h, q, kv):
    return (q >= kv) & (q - kv <= 20)


def sink_and_window(b, h, q, kv):
    return (kv < 16) | ((q >= kv) & (q - kv < 160))  # block lists with gaps: block 0, then the window


def late_rows(b, h, q, kv):
    return (q >= 8) & (kv <= q)  # rows 0..7 keep no key at all


SLOPES = torch.rand(4) + 0.1
TABLE = torch.randn(256) * 0.5


def alibi(score, b, h, m, n):
    return score + SLOPES[h] * (n - m)


def relative(score, b, h, m, n):
    return score + TABLE[m - n + 128]


def lgamma_mod(score, b, h, m, n):
    return score + 0.1 * torch.lgamma(score.abs() + 1)  # lgamma: no fxcc lowering


def _artifact(event):
    from fxcc.client.cache import LocalCache
    from fxcc.client.settings import ClientSettings

    return LocalCache(ClientSettings.from_env().cache_dir).get(event.key)


def _flex_launches(event) -> int:
    steps = _artifact(event).manifest.plan.steps
    return sum(isinstance(s, KernelStep) and s.kernel.startswith(KERNEL_PREFIX) for s in steps)


def _inputs(b, h, hkv, s, d, dtype=torch.float32, grad=True):
    torch.manual_seed(0)
    return [torch.randn(b, n, s, d, dtype=dtype, requires_grad=grad) for n in (h, hkv, hkv)]


def _run(fn, inputs, grad=True):
    """(compiled outputs and grads, eager's), the same upstream gradient for both."""
    got = torch.compile(fn, backend="fxcc")(*inputs)
    want = fn(*inputs)
    if not grad:
        return [got], [want]
    g = torch.randn_like(want)
    return [got, *torch.autograd.grad(got, inputs, g)], [want, *torch.autograd.grad(want, inputs, g)]


def _events():
    return [e for e in backend.events() if e.source != "fallback"]


def test_causal_block_mask_forward_and_backward_run_the_templates():
    mask = create_block_mask(causal, 2, 4, 64, 64, device="cpu", BLOCK_SIZE=32)

    def fn(q, k, v):
        return flex_attention(q.sin(), k, v, block_mask=mask).cos() * 2

    got, want = _run(fn, _inputs(2, 4, 4, 64, 16))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    forward, backward = _events()
    assert forward.stats.extern_ops == [] and backward.stats.extern_ops == []  # no extern flex step
    assert _flex_launches(forward) == 1 and _flex_launches(backward) == 1
    # forward: sin, the template, cos*2; backward: the incoming grad with delta's rowsum, the
    # template, and dq's chain rule through sin
    assert forward.stats.kernels == 3 and backward.stats.kernels == 3


def test_sliding_window_with_a_captured_alibi_tensor_in_bf16():
    mask = create_block_mask(sliding, 1, 4, 64, 64, device="cpu", BLOCK_SIZE=32)

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=alibi, block_mask=mask)

    inputs = _inputs(1, 4, 4, 64, 32, torch.bfloat16)
    got, want = _run(fn, inputs)
    # bf16: fxcc and eager each within a few bf16 ulps of the fp32 result
    exact = _run(fn, [x.detach().float().requires_grad_() for x in inputs])[1]
    for a, b, ref in zip(got, want, exact):
        assert a.dtype == torch.bfloat16
        bound = 2 * (b.float() - ref).abs().max().item() + 0.02
        assert (a.float() - ref).abs().max().item() <= bound
    assert all(e.stats.extern_ops == [] for e in _events())


def test_no_block_mask_a_relative_bias_table_and_gqa():
    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=relative, enable_gqa=True)

    got, want = _run(fn, _inputs(1, 4, 2, 48, 16))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    events = _events()
    assert all("higher_order.flex_attention" not in e.stats.extern_ops for e in events)
    assert all("higher_order.flex_attention_backward" not in e.stats.extern_ops for e in events)
    assert [_flex_launches(e) for e in events] == [1, 1]


def test_rows_with_no_key_and_a_used_logsumexp():
    """A row that keeps no key gives out 0 and logsumexp -inf (as eager); the lse's own gradient
    reaches q and k through the backward template."""
    mask = create_block_mask(late_rows, 1, 2, 64, 64, device="cpu", BLOCK_SIZE=32)

    def fn(q, k, v):
        out, aux = flex_attention(q, k, v, block_mask=mask, return_aux=AuxRequest(lse=True))
        lse = torch.where(aux.lse.isinf(), 0.0, aux.lse)
        return out + lse.unsqueeze(-1) * 0.5

    got, want = _run(fn, _inputs(1, 2, 2, 64, 16))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert (got[0][:, :, :8] == 0).all()
    assert all(e.stats.extern_ops == [] for e in _events())


def test_lengths_that_are_no_multiple_of_the_tiles_inference():
    mask = create_block_mask(sliding, 1, 2, 80, 80, device="cpu", BLOCK_SIZE=32)

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=mask, score_mod=alibi) + 1

    with torch.no_grad():
        got, want = _run(fn, _inputs(1, 2, 2, 80, 16, grad=False), grad=False)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
    (event,) = _events()
    assert event.stats.extern_ops == [] and event.stats.kernels == 2  # the template, then + 1


def test_a_mod_the_template_cannot_render_runs_flex_attention_eagerly():
    mask = create_block_mask(causal, 1, 2, 64, 64, device="cpu", BLOCK_SIZE=32)

    def fn(q, k, v):
        return flex_attention(q.sin(), k, v, score_mod=lgamma_mod, block_mask=mask).cos()

    got, want = _run(fn, _inputs(1, 2, 2, 64, 16))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    forward, backward = _events()
    assert forward.stats.extern_ops == ["higher_order.flex_attention"]
    assert backward.stats.extern_ops == ["higher_order.flex_attention_backward"]
    assert _flex_launches(forward) == 0
    flex_steps = [s for s in _artifact(forward).manifest.plan.steps if isinstance(s, ExternStep) and s.flex]
    assert len(flex_steps) == 1 and flex_steps[0].flex.kind == "forward"
    assert forward.stats.kernels == 2  # sin and cos still fused kernels around it


def test_block_lists_with_gaps_and_two_tiles_per_block():
    """The block walk jumps between listed blocks that are not neighbours (an attention sink and a
    window) and steps through each listed block in two tiles (sparse blocks of 64, tiles of 32), in
    the forward's kv lists and the backward's kv and q lists, partial and full."""
    mask = create_block_mask(sink_and_window, 1, 2, 512, 512, device="cpu", BLOCK_SIZE=64)
    listed = mask.kv_num_blocks[0, 0, -1] + mask.full_kv_num_blocks[0, 0, -1]
    assert listed == 5 and mask.full_kv_num_blocks.sum() > 0  # the last row lists blocks 0 and 4 to 7

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=mask, score_mod=alibi)

    got, want = _run(fn, _inputs(1, 2, 2, 512, 16))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert [_flex_launches(e) for e in _events()] == [1, 1]


def test_lengths_that_are_no_multiple_of_the_tiles_backward():
    mask = create_block_mask(sliding, 1, 2, 80, 80, device="cpu", BLOCK_SIZE=32)

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=mask)

    got, want = _run(fn, _inputs(1, 2, 2, 80, 16))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert [_flex_launches(e) for e in _events()] == [1, 1]


def test_the_gpus_tiles_in_the_interpreter(monkeypatch):
    """The configs the templates take on CUDA (head dim 128: 64x64 forward tiles, 32/64/64/32 backward ones,
    several tiles per sparse block), run by the interpreter: fp16, head dim 128, a length no tile
    divides. Each result is as close to an fp32 run of eager as eager's fp16 one is."""
    from fxcc.compiler_core.codegen import flex_attention as template

    heuristic = template.heuristic_config
    monkeypatch.setattr(template, "heuristic_config", lambda params, q, kv, target: heuristic(params, q, kv, "cuda"))
    mask = create_block_mask(sliding, 1, 2, 300, 300, device="cpu")

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=alibi, block_mask=mask)

    # fp32 inputs, the exact run at fp32 too: the GPU test's case (tests/gpu/test_flex_gpu.py)
    base = _inputs(1, 2, 2, 300, 128, grad=False)
    g = torch.randn(1, 2, 300, 128)
    assert_as_close_as_eager(fn, torch.compile(fn, backend="fxcc"), base, g, torch.float16, torch.float32,
                             factor=1.5, floor=1e-3)
    sources = [k for e in _events() for k in _artifact(e).manifest.kernels if k.name.startswith(KERNEL_PREFIX)]
    assert [k.constexprs for k in sources] == [{"BLOCK_M": 64, "BLOCK_N": 64},
                                               {"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32}]


def _attend(mask):
    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=mask)
    return fn


def test_two_block_masks_of_one_shape_are_two_artifacts():
    """A causal mask and a sliding window of the same sizes, through one function's code (as the
    benchmark runs them): their graphs differ only in mask_mod, and the second must not run the
    first's kernels. Forward and backward."""
    masks = [create_block_mask(fn, 1, 2, 128, 128, device="cpu", BLOCK_SIZE=32) for fn in (causal, sliding)]
    for mask in masks:
        got, want = _run(_attend(mask), _inputs(1, 2, 2, 128, 16))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    events = _events()
    assert [e.source for e in events] == ["compiled-in-process"] * 4
    assert len({e.key for e in events}) == 4


def test_kernel_options_set_the_tiles_and_a_bad_one_runs_eagerly():
    """Inductor's tile options in kernel_options (a `bwd_` name for the backward only, winning over
    the plain name) set the templates' launch configs; a block that is no power of two makes the
    call an extern step. Both still match eager."""
    mask = create_block_mask(sliding, 1, 2, 128, 128, device="cpu", BLOCK_SIZE=64)
    options = {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 2, "bwd_num_warps": 8, "BLOCK_M1": 16, "BLOCK_N2": 16}

    def fn(q, k, v):
        return flex_attention(q, k, v, block_mask=mask, kernel_options=options)

    got, want = _run(fn, _inputs(1, 2, 2, 128, 16))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    kernels = [k for e in _events() for k in _artifact(e).manifest.kernels if k.name.startswith(KERNEL_PREFIX)]
    assert [(k.constexprs, k.num_warps) for k in kernels] == [
        ({"BLOCK_M": 16, "BLOCK_N": 64}, 2),
        ({"BLOCK_M1": 16, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 16}, 8)]

    def odd(q, k, v):
        return flex_attention(q, k, v, block_mask=mask, kernel_options={"BLOCK_M": 48})

    got, want = _run(odd, _inputs(1, 2, 2, 128, 16), grad=False)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert _events()[-1].stats.extern_ops == ["higher_order.flex_attention"]


def window_of_two_blocks(b, h, q, kv):
    return (q >= kv) & (q - kv <= 128)  # at blocks of 64: each row of blocks two partial, one full


def test_each_program_walks_only_the_blocks_its_mask_row_lists(monkeypatch):
    """The forward's programs visit the kv blocks their row of the block mask lists, the backward's
    dk/dv programs the q blocks of their column (q_indices, full_q_indices) and its dq programs the
    kv blocks of their row, each listed block once, in tiles, and no block the mask skips. Counted
    as the interpreter's matmuls per launch (forward 2 per tile, dk/dv 4, dq 3) against what the
    lists give: a walk over every block, or a list walked twice, counts more (results stay right,
    since a walked block the mask skips is masked out, so only a count shows it)."""
    from triton.runtime import interpreter

    dots = []
    create_dot = interpreter.InterpreterBuilder.create_dot

    def counted(self, *args, **kwargs):
        dots.append(1)
        return create_dot(self, *args, **kwargs)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", counted)
    mask = create_block_mask(window_of_two_blocks, 1, 2, 512, 512, device="cpu", BLOCK_SIZE=64)
    assert mask.kv_num_blocks[0, 0, 2:].tolist() == [2] * 6 and mask.full_kv_num_blocks[0, 0, 1:].tolist() == [1] * 7
    q, k, v = _inputs(1, 2, 2, 512, 16)
    out = torch.compile(_attend(mask), backend="fxcc")(q, k, v)
    forward_dots = len(dots)
    torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    backward_dots = len(dots) - forward_dots
    forward, backward = (next(k for k in _artifact(e).manifest.kernels if k.name.startswith(KERNEL_PREFIX))
                         for e in _events())
    fc, bc = forward.constexprs, backward.constexprs
    kv_rows = (mask.kv_num_blocks + mask.full_kv_num_blocks).sum().item()  # listed (q block, kv block) pairs
    q_cols = (mask.q_num_blocks + mask.full_q_num_blocks).sum().item()
    assert kv_rows == q_cols == 2 * (8 + 7 + 6)
    # each listed pair of 64 x 64 blocks, cut into the programs' rows and the walk's tiles
    assert forward_dots == 2 * kv_rows * (64 // fc["BLOCK_M"]) * (64 // fc["BLOCK_N"])
    assert backward_dots == (4 * q_cols * (64 // bc["BLOCK_N1"]) * (64 // bc["BLOCK_M1"])
                             + 3 * kv_rows * (64 // bc["BLOCK_M2"]) * (64 // bc["BLOCK_N2"]))

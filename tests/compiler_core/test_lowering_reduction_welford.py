"""One-pass variance (lowering/reduction.py's welford, codegen.triton's _welford_*): var_mean, batch
and group norm statistics in every kernel form (persistent, looped row, looped column, split with a
short last chunk, symbolic rows) match eager on data far from zero, where sum(x²) - n·mean² would
cancel, and each reads x once."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F

from fxcc.compiler_core import target
from tests.compiler_core.helpers import compile_fn, kernel_steps, run

# The interpreter's reductions split as a 2-SM GPU's would (see test_lowering_reduction_split).
TINY_GPU_SMS = 2

# (offset, scale) of x = offset + scale * randn: the mean is 1e3 or 1e6 standard deviations away.
OFFSETS = [(1000.0, 1.0), (1e4, 1e-2)]


@pytest.fixture
def tiny_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    caps = target.capabilities("interpret")
    monkeypatch.setitem(target._CAPABILITIES, "interpret", dataclasses.replace(caps, sm_count=TINY_GPU_SMS))


def far_from_zero(sizes: tuple[int, ...], offset: float, scale: float, dtype: torch.dtype,
                  channels_last: bool = False) -> torch.Tensor:
    x = (offset + scale * torch.randn(*sizes, dtype=torch.float64)).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def assert_var_mean(got: tuple[torch.Tensor, ...], x: torch.Tensor, dims: tuple[int, ...] | int) -> None:
    """Against eager in fp64 on the very values x holds: variance to 1% (bf16 outputs: 2%), mean to
    its dtype's rounding at the offset."""
    var, mean = torch.var_mean(x.double(), dims)
    rtol = 2e-2 if x.dtype == torch.bfloat16 else 1e-2
    torch.testing.assert_close(got[0].double(), var, rtol=rtol, atol=0)
    eps = torch.finfo(x.dtype).eps
    torch.testing.assert_close(got[1].double(), mean, rtol=2 * eps, atol=0)


# (name, sizes, dims, channels_last): rows of 1000 fit registers, rows of 9001 loop, (N, H, W) of
# a channels-last tensor are a column reduction.
FORMS = {
    "persistent": ((4, 1000), -1, False),
    "looped_row": ((3, 9001), -1, False),
    "looped_column": ((2, 24, 19, 17), (0, 2, 3), True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset,scale", OFFSETS)
@pytest.mark.parametrize("form", sorted(FORMS))
def test_var_mean_far_from_zero(form: str, offset: float, scale: float, dtype: torch.dtype) -> None:
    sizes, dims, cl = FORMS[form]
    torch.manual_seed(0)
    x = far_from_zero(sizes, offset, scale, dtype, cl)
    art = compile_fn(lambda a: torch.var_mean(a, dims), x)
    assert_var_mean(run(art, x), x, dims)
    (src,) = [art.blobs[k.source.digest].decode() for k in art.manifest.kernels]
    # x once over the rows, for the mean and the squared deviations (and, looped, each row's first
    # element: the accumulation's shift; a tile in registers takes two passes over it, unshifted)
    loads = [line for line in src.splitlines() if "tl.load(" in line]
    shifted = form != "persistent"
    assert len(loads) == 1 + shifted and sum("rindex" in line for line in loads) == 1, loads


# Split into two stages on the tiny GPU; 1103 and 9001 are prime, so the last chunk is short.
SPLIT = {
    "column": ((1, 16, 1103, 1), (0, 2, 3), True),
    "row": ((2, 9001), -1, False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset,scale", OFFSETS)
@pytest.mark.parametrize("form", sorted(SPLIT))
def test_split_var_mean_combines_chunks_by_chans_formula(tiny_gpu: None, form: str, offset: float, scale: float,
                                                         dtype: torch.dtype) -> None:
    sizes, dims, cl = SPLIT[form]
    torch.manual_seed(0)
    x = far_from_zero(sizes, offset, scale, dtype, cl)
    art = compile_fn(lambda a: torch.var_mean(a, dims), x)
    assert_var_mean(run(art, x), x, dims)
    # one first stage (the chunks' mean, m2 and weight) and one second stage
    assert len(kernel_steps(art)) == 2


@pytest.mark.parametrize("offset,scale", OFFSETS)
def test_batch_norm_training_statistics_far_from_zero(tiny_gpu: None, offset: float, scale: float) -> None:
    """Batch norm's forward (split statistics of a channels-last activation) and backward, no
    further from eager in fp64 than eager in fp32 is (at 1e4 + randn·1e-2 the fp32 mean itself is
    off by a twentieth of a standard deviation, in eager as here)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileRequest

    def step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
        with torch.enable_grad():
            y = F.batch_norm(x, None, None, w, b, training=True)
            return (y.detach(), *torch.autograd.grad(y, (x, w, b), grad))

    torch.manual_seed(0)
    x = far_from_zero((4, 16, 19, 17), offset, scale, torch.float32, channels_last=True)
    w, b = torch.rand(16) + 0.5, torch.randn(16)
    grad = torch.randn(4, 16, 19, 17).contiguous(memory_format=torch.channels_last)
    inputs = [x, w, b, grad]
    with torch.enable_grad():
        gm = make_fx(step, decomposition_table=decomposition_table())(*inputs)
    art = compile_request(CompileRequest(graph=capture_graph(gm, inputs).spec))
    got = load_plan(art)(inputs)
    want = step(*(t.double() for t in inputs))
    for g, eager, ref in zip(got, step(*inputs), want, strict=True):
        eager_error = (eager.double() - ref).abs().max().item()
        assert (g.double() - ref).abs().max().item() <= 2 * eager_error + 1e-3


def test_group_norm_statistics_far_from_zero() -> None:
    torch.manual_seed(0)
    x = far_from_zero((2, 8, 30, 30), 1000.0, 1.0, torch.float32)
    w, b = torch.rand(8) + 0.5, torch.randn(8)
    fn = lambda a, ww, bb: torch.ops.aten.native_group_norm(a, ww, bb, 2, 8, 900, 4, 1e-5)
    art = compile_fn(fn, x, w, b, decompose=False)
    got = run(art, x, w, b)
    want = fn(x.double(), w.double(), b.double())
    for g, ref in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), ref, atol=1e-3, rtol=1e-3)


def test_symbolic_rows_loop_with_welford(fresh_compiles: None) -> None:
    """A symbolic row length takes the looped form: every length the graph serves is right."""
    from fxcc.client import backend

    compiled = torch.compile(lambda a: torch.var_mean(a, -1), backend="fxcc", dynamic=True)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (5000, 7001):
            x = far_from_zero((3, n), 1000.0, 1.0, torch.float32)
            assert_var_mean(compiled(x), x, -1)
    assert backend.events() and all(e.source != "fallback" for e in backend.events()), backend.events()


@pytest.mark.parametrize("offset,scale", OFFSETS)
@pytest.mark.parametrize("width", [1000, 9001])  # a persistent row, a looped one
def test_layer_norm_far_from_zero(width: int, offset: float, scale: float) -> None:
    """native_layer_norm's output, mean and rstd no further from eager in fp64 than eager in fp32."""
    torch.manual_seed(0)
    x = far_from_zero((4, width), offset, scale, torch.float32)
    w, b = torch.rand(width) + 0.5, torch.randn(width)
    fn = lambda a, ww, bb: torch.ops.aten.native_layer_norm(a, [width], ww, bb, 1e-5)
    art = compile_fn(fn, x, w, b, decompose=False)
    for g, eager, ref in zip(run(art, x, w, b), fn(x, w, b), fn(x.double(), w.double(), b.double()), strict=True):
        eager_error = (eager.double() - ref).abs().max().item()
        assert (g.double() - ref).abs().max().item() <= 2 * eager_error + 1e-4 * ref.abs().max().item()

"""On a GPU: a torch.library custom op and a user's @triton.jit kernel inside compiled graphs run on
the client (the op by name, the kernel through Triton's own launcher) and the rest of each graph fuses."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from fxcc.client.backend import events, fxcc_backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]


@triton.jit
def scale_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2 + tl.load(y_ptr + offs, mask=m), mask=m)


@torch.library.custom_op("fxcc_gpu::shift", mutates_args=())
def shift(x: torch.Tensor, k: int) -> torch.Tensor:
    return x + k


@shift.register_fake
def _(x, k):
    return torch.empty_like(x)


@pytest.fixture(autouse=True)
def _fresh(fresh_compiles, monkeypatch):
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    yield


def with_kernel(x):
    a, b = x.sin(), x.cos()
    out = torch.empty_like(a)
    scale_add_kernel[(triton.cdiv(a.numel(), 256),)](a, b, out, a.numel(), BLOCK=256)
    return out.exp() - x


def with_op(x):
    return shift(x.sin() * x, 3).cos() + x


@pytest.mark.parametrize("fn, op", [(with_kernel, "triton_kernel.scale_add_kernel"), (with_op, "fxcc_gpu.shift.default")])
def test_runs_on_the_client_and_the_rest_fuses(fn, op):
    x = torch.randn(10_000, device="cuda")
    with torch.no_grad():
        got = torch.compile(fn, backend=fxcc_backend)(x)
    torch.testing.assert_close(got, fn(x))
    (event,) = [e for e in events() if e.source != "fallback"]
    assert op in event.stats.extern_ops
    assert event.stats.kernels == 2, event.stats

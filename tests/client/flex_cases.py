"""What the flex_attention tests share on CPU (tests/client) and on a GPU (tests/gpu): one function's
output and grads of q, k and v at a low precision, each held to its distance from a run at a high one."""

from __future__ import annotations

from collections.abc import Callable

import torch


def results(impl: Callable[..., torch.Tensor], base: list[torch.Tensor], grad: torch.Tensor,
            dtype: torch.dtype) -> list[torch.Tensor]:
    """[out, dq, dk, dv] of `impl` on leaves of `base` at `dtype`, as fp32.

    Note: each leaf is made from a detached `base`: `x.to(dtype)` is `x` itself where the dtype is
    already x's, and requires_grad_() would then turn `base` into the leaf, every later
    `base.to(...)` a non-leaf whose .grad stays None.
    """
    leaves = [x.detach().to(dtype).requires_grad_() for x in base]
    out = impl(*leaves)
    out.backward(grad.to(dtype))
    return [out.float(), *(x.grad.float() for x in leaves)]


def assert_as_close_as_eager(fn: Callable[..., torch.Tensor], compiled: Callable[..., torch.Tensor],
                             base: list[torch.Tensor], grad: torch.Tensor, low: torch.dtype, high: torch.dtype,
                             factor: float, floor: float) -> None:
    """`compiled` at `low` within factor × eager's own error at `low` (+ floor) of eager at `high`,
    for the output and each grad. The high run comes first, on `base`'s own dtype where it is `high`."""
    exact = results(fn, base, grad, high)
    eager = results(fn, base, grad, low)
    got = results(compiled, base, grad, low)
    for name, a, e, ref in zip(("out", "dq", "dk", "dv"), got, eager, exact):
        err, bound = (a - ref).abs().max().item(), factor * (e - ref).abs().max().item() + floor
        assert err <= bound, f"{name}: max error {err} against eager's bound {bound}"

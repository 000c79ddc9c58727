"""fxcc's own aten-level ops (`torch.ops.fxcc.*`): graph nodes that passes emit for fxcc's templates.

Note: each op has a fake kernel, so a pass that adds one gets its FakeTensor like any aten node's
(passes/edit.py), and an eager kernel built from aten ops, so that a plan that
runs one as an extern call (its template could not be lowered) still computes the right result.
Only the ops named in OPS resolve from the wire (compiler_core.wire.resolve_target).
"""

from __future__ import annotations

import torch

OPS = frozenset({"fxcc.flash_attention.default", "fxcc.aligned_rows.default"})


@torch.library.custom_op("fxcc::flash_attention", mutates_args=())
def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    is_causal: bool, allow_tf32: bool, heads_outer: bool,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q @ kᵀ · scale + bias [causal: key j ≤ query i]) @ v over [Z, H, ·, ·] tensors, laid
    out [Z, L, H, Dv] in memory (as aten's memory-efficient and flash kernels lay theirs out), or
    contiguous with `heads_outer` (as aten's CPU kernel does). `bias`: an additive mask
    broadcastable to [Z, H, L, S] (SDPA's float `attn_mask`); a row whose every score is -inf gives
    zeros, as aten's fused kernels give.
    `allow_tf32`: fp32 products may round their inputs to TF32 (fxcc's kernel does; this
    eager form, the fallback, computes them as aten's SDPA does)."""
    if bias is not None and is_causal:
        rows, cols = q.shape[-2], k.shape[-2]
        keep = torch.ones(rows, cols, dtype=torch.bool, device=q.device).tril()
        bias, is_causal = bias.masked_fill(~keep, float("-inf")), False
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=is_causal, scale=scale)
    laid_out = _empty_out(q, v, heads_outer)
    laid_out.copy_(out)
    return laid_out


@flash_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, is_causal: bool,
      allow_tf32: bool, heads_outer: bool, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _empty_out(q, v, heads_outer)


def _empty_out(q: torch.Tensor, v: torch.Tensor, heads_outer: bool) -> torch.Tensor:
    z, h, rows, _ = q.shape
    if heads_outer:
        return q.new_empty((z, h, rows, v.shape[-1]))
    return q.new_empty((z, rows, h, v.shape[-1])).transpose(1, 2)


@torch.library.custom_op("fxcc::aligned_rows", mutates_args=())
def aligned_rows(x: torch.Tensor, align: int) -> torch.Tensor:
    """A 2-D x's values in new memory whose rows start `align` elements apart or a multiple of that
    (row stride: its columns rounded up to `align`), for a matmul whose operand's leading dimension
    must be aligned (passes/pad_mm.py). The gaps between rows are never read."""
    out = _empty_aligned(x, align)
    out.copy_(x)
    return out


@aligned_rows.register_fake
def _(x: torch.Tensor, align: int) -> torch.Tensor:
    return _empty_aligned(x, align)


def _empty_aligned(x: torch.Tensor, align: int) -> torch.Tensor:
    rows, cols = x.shape
    return x.new_empty_strided((rows, cols), (-(-cols // align) * align, 1))

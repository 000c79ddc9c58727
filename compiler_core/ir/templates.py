"""What a template kernel's source depends on, as lowering describes it for codegen to render."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionParams:
    """What the source of one attention kernel depends on (sizes and strides are arguments)."""

    head_dim: int
    value_dim: int
    causal: bool
    scale: float
    dtype: torch.dtype
    precision: str  # tl.dot's input_precision for fp32 inputs: "tf32" or "ieee"
    # An additive mask (SDPA's float attn_mask) read with strides of its own, broadcast dims at
    # stride 0; rows whose every score is -inf give zeros, as aten's fused kernels give.
    bias: bool = False
    # The bias's key stride is 1 (a mask written or expanded from a contiguous one): the source
    # says so, as Triton's JIT specializes an argument of 1, so its loads are vector loads (ptxas of
    # a build with the stride as an argument: scalar loads, 16 per row of a 64-key tile).
    bias_dense: bool = False

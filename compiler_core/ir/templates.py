"""What a template kernel's source depends on, as lowering describes it for codegen to render."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy
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
    # A bias the kernel computes per tile from smaller tensors (TileBias, rendered by codegen),
    # where writing it whole would cost memory (T5's mask of its position bias, [B, H, L, S], from
    # [1, H, L, S] and [B, 1, 1, S]): one pointer per tensor it reads, their (dtype, elements
    # spanned) in `bias_buffers`, and no bias strides.
    bias_mod: TileBias | None = None
    bias_buffers: tuple[tuple[str, int], ...] = ()


# A tile's coordinates in fxcc's attention template (codegen.attention): the program's batch and head
# (int64 scalars) and each score's row and key ([BLOCK_M, BLOCK_N] tiles), under these names.
TILE_INDEX = ("z", "h", "bias_i", "bias_j")


def tile_symbols() -> tuple[sympy.Symbol, ...]:
    """The index symbols a tile expression is built over (rendered as TILE_INDEX's names)."""
    return tuple(sympy.Symbol(name, integer=True, nonnegative=True) for name in TILE_INDEX)


@dataclass(frozen=True, eq=False)
class TileBias:
    """A bias computed per tile: one element of it is `loader(index)` (ops.* over loads of `buffers`
    at indices of tile_symbols() only), the buffers (plan name, dtype) in the order of the kernel's
    pointers B0, B1, ... Rendered by codegen.flex_mods.render_tile."""

    loader: Callable[[list[Any]], Any]
    index: tuple[Any, ...]
    buffers: tuple[tuple[str, torch.dtype], ...]

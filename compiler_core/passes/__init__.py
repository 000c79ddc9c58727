"""Graph passes that rewrite an aten FX graph in place, under the compilation's one ShapeEnv, before lowering."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import fx


def run_passes(gm: fx.GraphModule, target: str, allow_tf32: bool = False) -> bool:
    """Every pass, in order, on `gm` in place; whether any rewrote it (graph.wire_graph then derives
    its wire form). `allow_tf32`: the request's CompileOptions.allow_tf32 (fp32 kernels may use TF32)."""
    from fxcc.compiler_core.passes.attention import fuse_attention
    from fxcc.compiler_core.passes.bias import peel_biases
    from fxcc.compiler_core.passes.cse import merge_common
    from fxcc.compiler_core.passes.index_add import index_puts_as_index_add
    from fxcc.compiler_core.passes.layout import channels_last_convs
    from fxcc.compiler_core.passes.pad_mm import pad_matmuls

    changed = fuse_attention(gm, target, allow_tf32)
    changed = merge_common(gm) or changed
    changed = pad_matmuls(gm, target) or changed
    changed = index_puts_as_index_add(gm, target) or changed
    changed = peel_biases(gm, target) or changed
    return channels_last_convs(gm, target) or changed

"""Graph passes that rewrite an aten FX graph (and its GraphSpec) before lowering."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import fx

    from fxcc.compiler_core.wire import GraphSpec


def run_passes(gm: fx.GraphModule, spec: GraphSpec, target: str,
               allow_tf32: bool = False) -> tuple[fx.GraphModule, GraphSpec]:
    """Every pass, in order (the compile and the build's dtype lookup see the same graph).
    `allow_tf32`: the request's CompileOptions.allow_tf32 (fp32 kernels may use TF32)."""
    from fxcc.compiler_core.passes.attention import fuse_attention
    from fxcc.compiler_core.passes.layout import channels_last_convs
    from fxcc.compiler_core.passes.pad_mm import pad_matmuls

    gm, spec = fuse_attention(gm, spec, target, allow_tf32)
    gm, spec = pad_matmuls(gm, spec, target)
    return channels_last_convs(gm, spec, target)

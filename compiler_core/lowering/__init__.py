"""aten FX graph → loop IR (`lower_graph`, in `core`), with every op family's lowerings registered.

`core` holds the registry and the graph walk; the op-family modules import it and register their
lowerings; this package imports them all, so importing it (or anything in it) loads every lowering.
"""

from __future__ import annotations

from fxcc.compiler_core.lowering import (  # noqa: F401 - importing registers their lowerings
    attention,
    indexing,
    normalization,
    pointwise,
    pooling,
    reduction,
    views,
)
from fxcc.compiler_core.lowering.core import (
    LOWERINGS,
    REALIZE_READS_SHARED,
    ExternCall,
    ExternTuple,
    GraphLowering,
    TemplateKernel,
    current_graph,
    current_node,
    lower_graph,
    node_val,
    register_lowering,
    size_arg,
)

__all__ = [
    "LOWERINGS", "REALIZE_READS_SHARED", "ExternCall", "ExternTuple", "GraphLowering", "TemplateKernel",
    "current_graph", "current_node", "lower_graph", "node_val", "register_lowering", "size_arg",
]

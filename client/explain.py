"""`fxcc.explain(model)(*inputs)`: what fxcc did with each graph, and where Dynamo broke graphs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fxcc.client import backend


@dataclass
class Explanation:
    graphs: list[backend.CompileEvent] = field(default_factory=list)
    graph_breaks: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"fxcc: {len(self.graphs)} aten graph(s), {len(self.graph_breaks)} Dynamo graph break(s)"]
        for i, e in enumerate(self.graphs):
            s = e.stats
            if s is None:
                lines.append(f"  graph {i}: {e.source}: {e.error}")
                continue
            lines.append(
                f"  graph {i} [{e.key[:12]}, {e.source}]: {s.nodes} nodes, {s.nodes_lowered} lowered, "
                f"{s.nodes_extern} extern, {s.kernels} Triton kernels, {s.ops_fused} ops fused, "
                f"{s.intermediate_bytes_avoided} intermediate bytes avoided")
            if s.extern_ops:
                lines.append(f"    extern ops: {', '.join(s.extern_ops)}")
            if e.runs_as:
                lines.append(f"    runs as: {e.runs_as}")
            if e.pre_aot:
                lines.append(f"    AOTAutograd: {e.pre_aot}")
            if e.aot_wrapper is False:
                lines.append("    each call: the plan directly (a plain inference graph: no AOTAutograd wrapper)")
        for reason in self.graph_breaks:
            lines.append(f"  graph break: {reason}")
        return "\n".join(lines)


def explain(model: Callable, **compile_kwargs: Any) -> Callable[..., Explanation]:
    """A function that runs `model(*inputs)` compiled with fxcc and explains what happened."""

    def run(*args: Any, **kwargs: Any) -> Explanation:
        torch._dynamo.reset()
        breaks = torch._dynamo.explain(model)(*args, **kwargs)
        reasons = [" ".join(str(getattr(r, "reason", r)).split())[:300] for r in breaks.break_reasons]
        torch._dynamo.reset()
        before = len(backend.events())
        torch.compile(model, backend="fxcc", **compile_kwargs)(*args, **kwargs)
        return Explanation(graphs=backend.events()[before:], graph_breaks=reasons)

    return run

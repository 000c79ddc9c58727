"""torch.cond and while_loop: their subgraphs compiled as graphs of their own, one plan each.

Note: to the outer graph a control flow node is an extern step (opaque: its results' specs come
from the client, compiler_core.opaque); its subgraphs are self-contained GraphSpecs (their own
inputs and size symbols) that run through the whole pipeline, so each fuses on its own. Their
kernels join the artifact's list (kernel names are content digests: one name, one source). The
client picks the branch or loops at run time (client/control_flow.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from fxcc.compiler_core.artifact import CompileStats, ControlPlan, KernelInfo, Plan
from fxcc.compiler_core.lowering import ExternCall
from fxcc.compiler_core.wire import ControlFlow, GraphSpec

# (subgraph, its hints, where: "<control node>[<subgraph index>]") -> its plan, kernels and stats
# (the pipeline's front stages on it: compiler_core.pipeline)
CompileSub = Callable[[GraphSpec, dict[str, int], str], tuple[Plan, list[KernelInfo], CompileStats]]


def compile_control_flow(items: Sequence[Any], compile_sub: CompileSub) -> tuple[list[Any], list[KernelInfo],
                                                                                   list[CompileStats]]:
    """`items` with each control flow call's subgraphs compiled (ExternCall.control a ControlPlan),
    the subgraphs' kernels, and their stats."""
    out: list[Any] = []
    kernels: list[KernelInfo] = []
    stats: list[CompileStats] = []
    for item in items:
        if isinstance(item, ExternCall) and isinstance(item.control, ControlFlow):
            flow = item.control
            plans = []
            for i, graph in enumerate(flow.graphs):
                plan, ks, st = compile_sub(graph, flow.hints[i] if i < len(flow.hints) else {}, f"{item.out}[{i}]")
                plans.append(plan)
                kernels += ks
                stats.append(st)
            item = dataclasses.replace(item, control=ControlPlan(kind=flow.kind, plans=plans, carried=flow.carried,
                                                                 outputs=flow.outputs))
        out.append(item)
    return out, kernels, stats


def merged_kernels(kernels: Sequence[KernelInfo]) -> list[KernelInfo]:
    """One KernelInfo per name (a subgraph may launch a kernel the outer graph launches too)."""
    return list({k.name: k for k in kernels}.values())


def merged_stats(stats: CompileStats, sub: Sequence[CompileStats]) -> CompileStats:
    """The outer graph's stats with its subgraphs' launches, nodes and extern ops added."""
    if not sub:
        return stats
    return stats.model_copy(update={
        "nodes": stats.nodes + sum(s.nodes for s in sub),
        "nodes_lowered": stats.nodes_lowered + sum(s.nodes_lowered for s in sub),
        "nodes_extern": stats.nodes_extern + sum(s.nodes_extern for s in sub),
        "kernels": stats.kernels + sum(s.kernels for s in sub),
        "ops_fused": stats.ops_fused + sum(s.ops_fused for s in sub),
        "extern_ops": sorted(set(stats.extern_ops).union(*(s.extern_ops for s in sub))),
    })

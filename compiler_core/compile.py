"""The pieces of the pipeline's codegen stage (compiler_core/pipeline.py): kernel sources as blobs, the
plan's symbols and guards, its stats, and the plan that runs every node as an extern call."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from typing import Any

import sympy
import torch
from torch import fx

from fxcc.compiler_core import flex_lowering, stage_logs  # noqa: F401 - flex_lowering registers flex_attention's lowering
from fxcc.compiler_core.artifact import (
    CompileStats,
    ControlPlan,
    ExternStep,
    FreeStep,
    KernelInfo,
    Plan,
    SymbolBinding,
    Versions,
    add_blob,
)
from fxcc.compiler_core.codegen.attention import render_template
from fxcc.compiler_core.codegen.flex_attention import FlexParams, render_flex_template
from fxcc.compiler_core.codegen.triton import RenderedKernel, render_kernel
from fxcc.compiler_core.errors import UnsupportedOp
from fxcc.compiler_core.keys import compiler_fingerprint
from fxcc.compiler_core.lowering import ExternCall, GraphLowering, TemplateKernel
from fxcc.compiler_core.scheduler import Kernel
from fxcc.compiler_core.symbolic import from_torch, hint
from fxcc.compiler_core.symexpr import dump
from fxcc.compiler_core.wire import GraphSpec, _refs


def output_strides(gm: fx.GraphModule, free: list[int]) -> list[list[int] | None]:
    """The strides of the outputs in `free` as the plan gives them: its graph's (after the
    passes), which lowering writes outputs in; None for the others and for symbolic ones."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    result: list[list[int] | None] = []
    for i, a in enumerate(out.args[0]):
        val = a.meta.get("val") if isinstance(a, fx.Node) else None
        strides = list(val.stride()) if isinstance(val, torch.Tensor) and i in free else None
        result.append(strides if strides is not None and all(isinstance(s, int) for s in strides) else None)
    return result


def value_dtypes(gm: fx.GraphModule) -> dict[str, str]:
    """The dtype name of each node of `gm` whose value is a tensor."""
    return {n.name: str(v.dtype).removeprefix("torch.") for n in gm.graph.nodes
            if isinstance(v := n.meta.get("val"), torch.Tensor)}


def symbol_bindings(graph: GraphSpec) -> list[SymbolBinding]:
    """Where each size symbol is read at run time: the first input that is it, or the first input
    dimension whose size is exactly it. Raises UnsupportedOp for a symbol with neither."""
    ranges = {s.name: s for s in graph.symbols}
    found: dict[str, SymbolBinding] = {}
    for i, p in enumerate(graph.placeholders):
        spots = [(p.symbol, None)] if p.symbol else [(s, d) for d, s in enumerate(p.spec.sizes)]
        for text, dim in spots:
            if isinstance(text, str) and text in ranges and text not in found:
                r = ranges[text]
                found[text] = SymbolBinding(name=text, input=i, dim=dim, lo=r.lo, hi=r.hi)
    missing = sorted(set(ranges) - set(found))
    if missing:
        raise UnsupportedOp(f"size symbols {missing} are no input's size")
    return [found[s.name] for s in graph.symbols]


def range_guards(graph: GraphSpec) -> list[str]:
    """The symbols' ranges, and every input size and stride given by an expression, as guards
    (`s0 >= 2`; the runtime compares actual sizes with their expressions separately)."""
    out = [f"{s.name} >= {s.lo}" for s in graph.symbols]
    out += [f"{s.name} <= {s.hi}" for s in graph.symbols if s.hi is not None]
    return out


def shape_env_guards(syms: Any) -> list[str]:
    """The guards the ShapeEnv recorded while the graph was rebuilt and lowered, as fxcc text.

    Note: a lowering that needed a concrete size (int() of a SymInt) specialized it and left a
    guard `s0 == 8` here: the plan is then right only for that size, and the client checks it.
    """
    out: list[str] = []
    for g in syms.shape_env.guards:
        expr = from_torch(g.expr, syms.rename)
        if expr is sympy.true:
            continue
        out.append(dump(expr))
    for theirs, value in syms.shape_env.replacements.items():
        ours = syms.rename.get(str(theirs))
        if ours is not None:
            out.append(dump(sympy.Eq(ours, from_torch(value, syms.rename))))
    return sorted(set(out))


def render_kernels(g: GraphLowering, items: Sequence[Kernel | ExternCall], target: str) -> dict[int, RenderedKernel]:
    """Triton source for every kernel of the schedule (fused or from a template), keyed by its position."""
    out = {i: render_kernel(item, g.buffers, target) for i, item in enumerate(items) if isinstance(item, Kernel)}
    out |= {i: render_flex_template(item, target) if isinstance(item.params, FlexParams) else render_template(item, target)
            for i, item in enumerate(items) if isinstance(item, TemplateKernel)}
    return out


def kernel_infos(rendered: Sequence[RenderedKernel] | object, blobs: dict[str, bytes]) -> list[KernelInfo]:
    """One KernelInfo per distinct kernel, its source stored as a content-addressed blob."""
    infos: dict[str, KernelInfo] = {}
    for rk in rendered:  # type: ignore[union-attr]
        if rk.name not in infos:
            ref = add_blob(blobs, rk.source.encode())
            infos[rk.name] = KernelInfo(name=rk.name, source=ref, num_warps=rk.num_warps,
                                        num_stages=rk.num_stages, constexprs=rk.constexprs)
    return list(infos.values())


WRITE_BACK_OPS = frozenset({"aten.copy_.default", "aten._foreach_copy_.default"})


def compile_stats(graph: GraphSpec, g: GraphLowering, items: Sequence[Kernel | ExternCall],
                  kernels: list[KernelInfo]) -> CompileStats:
    launches = [i for i in items if isinstance(i, (Kernel, TemplateKernel))]
    unstored = [n.buffer for k in launches if isinstance(k, Kernel) for n in k.nodes if n.name not in k.stored]
    # Write-backs that kernels store instead (scheduler.store_into_inputs) are no extern ops of the plan.
    write_backs = {i.op for i in items if isinstance(i, ExternCall) and i.out in g.write_backs}
    extern_ops = {op for op in g.extern_ops if op not in WRITE_BACK_OPS} | write_backs
    return CompileStats(
        nodes=len(graph.nodes), nodes_lowered=g.nodes_lowered,
        nodes_extern=len(graph.nodes) - g.nodes_lowered, extern_ops=sorted(extern_ops),
        kernels=len(launches), ops_fused=max(0, g.nodes_lowered - len(launches)),
        intermediate_bytes_avoided=hint(g.bytes_not_materialized(unstored)),  # at the example's sizes
    )


def extern_plan(graph: GraphSpec) -> tuple[Plan, CompileStats]:
    """A plan that runs every node as an aten call (the fallback that is always correct)."""
    steps: list = []
    last_use = last_uses(graph)
    for n in graph.nodes:
        control = None if n.control is None else ControlPlan(
            kind=n.control.kind, plans=[extern_plan(g)[0] for g in n.control.graphs], carried=n.control.carried,
            outputs=n.control.outputs)
        steps.append(ExternStep(op=n.target, args=n.args, kwargs=n.kwargs, out=n.name, opaque=n.opaque,
                                triton=n.triton, control=control, flex=n.flex))
        dead = [name for name, last in last_use.items() if last == n.name]
        if dead:
            steps.append(FreeStep(names=dead))
    ops = sorted({n.target for n in graph.nodes if n.target != "getitem"})
    stats = CompileStats(nodes=len(graph.nodes), nodes_extern=len(graph.nodes), extern_ops=ops)
    symbols = symbol_bindings(graph) if graph.symbols else []
    plan = Plan(inputs=[p.name for p in graph.placeholders], steps=steps, outputs=graph.outputs,
                symbols=symbols, guards=range_guards(graph))
    return plan, stats


def last_uses(graph: GraphSpec) -> dict[str, str]:
    """For each value that is not a graph output: the name of the node that reads it last."""
    outputs = set(_refs(graph.outputs))
    last: dict[str, str] = {}
    for n in graph.nodes:
        for ref in _refs(list(n.args) + list(n.kwargs.values())):
            last[ref] = n.name
    return {v: user for v, user in last.items() if v not in outputs}


def local_versions() -> Versions:
    return Versions(
        compiler_core=compiler_fingerprint(),
        torch=importlib.metadata.version("torch"),
        triton=importlib.metadata.version("triton"),
    )

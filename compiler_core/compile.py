"""The compile pipeline: request → rebuilt graph → loop IR → fused kernels → Triton source → plan → artifact."""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import time
from collections.abc import Sequence
from typing import Any

import sympy
import torch
from torch import fx

from fxcc.compiler_core import flex_lowering, stage_logs  # noqa: F401 - flex_lowering registers flex_attention's lowering
from fxcc.compiler_core.artifact import (
    Artifact,
    ArtifactManifest,
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
from fxcc.compiler_core.control_flow import compile_control_flow, merged_kernels, merged_stats
from fxcc.compiler_core.errors import InvalidGraph, UnsupportedOp
from fxcc.compiler_core.graph import rebuild_graph
from fxcc.compiler_core.keys import compile_key, compiler_fingerprint
from fxcc.compiler_core.lowering import ExternCall, GraphLowering, TemplateKernel, lower_graph
from fxcc.compiler_core.passes import run_passes
from fxcc.compiler_core.plan import build_plan
from fxcc.compiler_core.scheduler import Kernel, schedule
from fxcc.compiler_core.stage_logs import (
    emit,
    format_graph,
    format_guards,
    format_ir,
    format_kernels,
    format_plan,
    format_schedule,
)
from fxcc.compiler_core.symbolic import from_torch, hint, symbol_scope
from fxcc.compiler_core.symexpr import dump
from fxcc.compiler_core.wire import CompileRequest, GraphSpec, _refs

log = logging.getLogger("fxcc.compile")


def compile_request(request: CompileRequest) -> Artifact:
    """Compile one graph for its target. Raises FxccError subclasses on bad input."""
    t0 = time.perf_counter()
    key = compile_key(request)
    dtypes: dict[str, str] = {}
    scheduled: dict[str, tuple[Kernel, dict[str, Any], str]] = {}
    with stage_logs.recording() as stages:
        plan, kernels, stats, blobs = compile_or_extern(request.graph, request.hints, request.options.target.kind,
                                                        request.options.allow_tf32, f"key {key[:12]}", dtypes, scheduled)
    stats = stats.model_copy(update={"compile_s": round(time.perf_counter() - t0, 4)})
    manifest = ArtifactManifest(key=key, versions=local_versions(), target=request.options.target,
                                plan=plan, kernels=kernels, stats=stats,
                                stage_log=add_blob(blobs, stage_logs.stage_log_json(stages)))
    return Artifact(manifest, blobs, value_dtypes=dtypes or None, scheduled=scheduled or None)


def compile_or_extern(graph: GraphSpec, hints: dict[str, int], target: str, allow_tf32: bool,
                      title: str, dtypes: dict[str, str] | None = None,
                      scheduled: dict[str, tuple[Kernel, dict[str, Any], str]] | None = None,
                      ) -> tuple[Plan, list[KernelInfo], CompileStats, dict[str, bytes]]:
    """The graph compiled (its plan, kernels, stats and blobs), or where the compiler cannot, run
    node by node as extern calls. Raises InvalidGraph for a graph that is wrong. `dtypes`, when
    given, gets the dtype of each tensor value of the graph the plan was made from (passes
    applied): the build's kernel signatures read them (Artifact.value_dtypes); `scheduled` the
    fused kernels by name (Artifact.scheduled)."""
    gm = rebuild_graph(graph, hints)
    blobs: dict[str, bytes] = {}
    try:
        plan, kernels, stats = compile_graph(gm, graph, target, blobs, allow_tf32=allow_tf32, title=title,
                                             dtypes=dtypes, scheduled=scheduled)
        return plan, kernels, stats, blobs
    except InvalidGraph:
        raise
    except UnsupportedOp as e:
        log.info("whole graph runs as extern calls: %s", e)
    except Exception as e:  # noqa: BLE001 - the user's program never dies because of fxcc
        # Note: reaching this is a compiler bug; the graph still runs, every node as its aten op.
        log.warning("compiling failed, the whole graph runs as extern calls: %s: %s", type(e).__name__, e)
    plan, stats = extern_plan(graph)
    return plan, [], stats, {}


def compile_graph(gm: fx.GraphModule, graph: GraphSpec, target: str, blobs: dict[str, bytes],
                  allow_tf32: bool = False, title: str = "graph",
                  dtypes: dict[str, str] | None = None,
                  scheduled: dict[str, tuple[Kernel, dict[str, Any], str]] | None = None,
                  ) -> tuple[Plan, list[KernelInfo], CompileStats]:
    """The pipeline, one step per line: loop IR, fused kernels, Triton source, plan (blobs filled).

    With size symbols, everything runs in their scope (sizes are SymPy over s0, s1, …), and the
    plan gets the symbols' bindings and every guard the ShapeEnv recorded on the way. Each stage's
    output is printed where FXCC_LOGS asks for it (compiler_core.stage_logs).
    """
    gm, graph = run_passes(gm, graph, target, allow_tf32)
    if dtypes is not None:
        dtypes.update(value_dtypes(gm))
    emit("graph", title, lambda: format_graph(gm))
    syms = gm.meta.get("fxcc_syms")
    scope = symbol_scope(syms.rename, syms.hints) if syms else contextlib.nullcontext()
    with scope:
        lowered = lower_graph(gm, graph, target)
        emit("ir", title, lambda: format_ir(lowered))
        items = schedule(lowered)
        emit("schedule", title, lambda: format_schedule(items))
        items, sub_kernels, sub_stats = compile_control_flow(
            items, lambda sub, hints: _compile_subgraph(sub, hints, target, blobs, allow_tf32, title))
        rendered = render_kernels(lowered, items, target)
        if scheduled is not None:
            for i, rk in rendered.items():
                if isinstance(items[i], Kernel):
                    scheduled.setdefault(rk.name, (items[i], lowered.buffers, target))
        emit("kernels", title, lambda: format_kernels(rendered))
        if syms:
            lowered.symbols = symbol_bindings(graph)
            lowered.guards = range_guards(graph) + shape_env_guards(syms)
            lowered.input_strides = [list(p.spec.strides) if p.spec else None for p in graph.placeholders]
        plan = build_plan(lowered, items, rendered)
        if graph.free_layout_outputs:
            plan = plan.model_copy(update={"output_strides": output_strides(gm, graph.free_layout_outputs)})
        emit("plan", title, lambda: format_plan(plan))
        emit("guards", title, lambda: format_guards(plan))
        kernels = merged_kernels(kernel_infos(rendered.values(), blobs) + sub_kernels)
        return plan, kernels, merged_stats(compile_stats(graph, lowered, items, kernels), sub_stats)


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


def _compile_subgraph(graph: GraphSpec, hints: dict[str, int], target: str, blobs: dict[str, bytes],
                      allow_tf32: bool, title: str) -> tuple[Plan, list[KernelInfo], CompileStats]:
    """A control flow subgraph through the whole pipeline (compiler_core.control_flow), its blobs
    added to the artifact's."""
    plan, kernels, stats, sub_blobs = compile_or_extern(graph, hints, target, allow_tf32, f"{title} (subgraph)")
    blobs.update(sub_blobs)
    return plan, kernels, stats


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


def compile_stats(graph: GraphSpec, g: GraphLowering, items: Sequence[Kernel | ExternCall],
                  kernels: list[KernelInfo]) -> CompileStats:
    launches = [i for i in items if isinstance(i, (Kernel, TemplateKernel))]
    unstored = [n.buffer for k in launches if isinstance(k, Kernel) for n in k.nodes if n.name not in k.stored]
    return CompileStats(
        nodes=len(graph.nodes), nodes_lowered=g.nodes_lowered,
        nodes_extern=len(graph.nodes) - g.nodes_lowered, extern_ops=sorted(set(g.extern_ops)),
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

"""The compile pipeline: request → rebuilt graph → plan (kernels + extern calls) → artifact."""

from __future__ import annotations

import importlib.metadata
import time

import compiler_core
from compiler_core.artifact import (
    Artifact, ArtifactManifest, CompileStats, ExternStep, FreeStep, Plan, Versions,
)
from compiler_core.graph import rebuild_graph
from compiler_core.keys import compile_key
from compiler_core.wire import CompileRequest, GraphSpec, NodeRef, _refs


def compile_request(request: CompileRequest) -> Artifact:
    """Compile one graph for its target. Raises FxccError subclasses on bad input."""
    t0 = time.perf_counter()
    key = compile_key(request)
    rebuild_graph(request.graph)  # validates the spec and re-derives shapes
    plan, stats = extern_plan(request.graph)
    stats = stats.model_copy(update={"compile_s": round(time.perf_counter() - t0, 4)})
    manifest = ArtifactManifest(
        key=key, versions=local_versions(), target=request.options.target, plan=plan, stats=stats,
    )
    return Artifact(manifest, {})


def extern_plan(graph: GraphSpec) -> tuple[Plan, CompileStats]:
    """A plan that runs every node as an aten call (the fallback that is always correct)."""
    steps: list = []
    last_use = last_uses(graph)
    for n in graph.nodes:
        steps.append(ExternStep(op=n.target, args=n.args, kwargs=n.kwargs, out=n.name))
        dead = [name for name, last in last_use.items() if last == n.name]
        if dead:
            steps.append(FreeStep(names=dead))
    ops = sorted({n.target for n in graph.nodes if n.target != "getitem"})
    stats = CompileStats(nodes=len(graph.nodes), nodes_extern=len(graph.nodes), extern_ops=ops)
    plan = Plan(inputs=[p.name for p in graph.placeholders], steps=steps, outputs=graph.outputs)
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
        compiler_core=compiler_core.__version__,
        torch=importlib.metadata.version("torch"),
        triton=importlib.metadata.version("triton"),
    )

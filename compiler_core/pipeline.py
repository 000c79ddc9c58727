"""The compile pipeline, the table of contents: a request through rebuild → passes → lower → schedule →
codegen → tune (on a GPU) → build → package, each stage handing its output in memory to the next.

Every compile runs here: the worker's compile process (worker/steps.py), the embedded worker and the
client's in-process compiles (client/graphs.py), a tune job on a stored artifact (`retune`), each
control flow subgraph (the front stages on a Compilation of its own). Callers learn the stages from
`Compilation.on_stage` (the worker maps them to its job's stages); `Compilation.stages` keeps each
stage's duration.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal

from fxcc.compiler_core import flex_lowering, scheduler, stage_logs  # noqa: F401 - flex_lowering registers flex_attention's lowering
from fxcc.compiler_core.artifact import Artifact, ArtifactManifest, CompileStats, KernelInfo, Plan, add_blob
from fxcc.compiler_core.autotune import autotune_for_target
from fxcc.compiler_core.build import apply_builds, build_kernel, build_tasks, cuda_build_unavailable
from fxcc.compiler_core.build_tasks import BuildTask
from fxcc.compiler_core.codegen.triton import RenderedKernel
from fxcc.compiler_core.compile import (
    compile_stats,
    extern_plan,
    kernel_infos,
    local_versions,
    output_strides,
    range_guards,
    render_kernels,
    shape_env_guards,
    symbol_bindings,
    value_dtypes,
)
from fxcc.compiler_core.control_flow import compile_control_flow, merged_kernels, merged_stats
from fxcc.compiler_core.errors import InvalidGraph, UnsupportedOp
from fxcc.compiler_core.graph import rebuild_graph, wire_graph
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.lowering import ExternCall, GraphLowering, lower_graph
from fxcc.compiler_core.passes import run_passes
from fxcc.compiler_core.plan import build_plan
from fxcc.compiler_core.scheduler import Kernel
from fxcc.compiler_core.stage_logs import (
    emit,
    format_graph,
    format_guards,
    format_ir,
    format_kernels,
    format_plan,
    format_schedule,
)
from fxcc.compiler_core.symbolic import symbol_scope
from fxcc.compiler_core.wire import CompileRequest, GraphSpec

log = logging.getLogger("fxcc.compile")

StageCallback = Callable[[str], None]  # hears each stage's name as it starts
TuneLock = Callable[[str], AbstractContextManager[Any]]  # a host-wide lock of the GPU tuned on


@dataclass(frozen=True)
class StageTime:
    name: str
    seconds: float


@dataclass(eq=False)
class Compilation:
    """One graph's compile as it goes: what was asked (the request, the GPU to tune on, where the
    kernels are built) and what each stage made, handed in memory to the next.

    `build`: "here" builds the cubins in this process, "tasks" leaves BuildTasks in `tasks` for
    other processes (worker/builds.py), "none" builds nothing. The one ShapeEnv of a symbolic graph,
    with its hints and the guards it recorded, is `syms` (made by the rebuild, kept by the passes).
    """

    request: CompileRequest
    tune_device: str | None = None
    build: Literal["here", "tasks", "none"] = "none"
    on_stage: StageCallback | None = None
    tune_lock: TuneLock | None = None
    key: str = ""  # compile_key(request) unless given (a subgraph's is its graph's)
    title: str = ""  # names the graph in the stage logs
    record: bool = True  # keep the stage log in the artifact (a subgraph's goes into its graph's)
    # What the stages made, in order.
    graph: GraphSpec | None = None  # the wire form of `gm`, derived once the passes rewrote it
    gm: Any = None  # the FX graph with FakeTensors (torch.fx.GraphModule)
    lowered: GraphLowering | None = None
    items: list[Kernel | ExternCall] = field(default_factory=list)
    sub_kernels: list[KernelInfo] = field(default_factory=list)  # control flow subgraphs' kernels
    sub_stats: list[CompileStats] = field(default_factory=list)
    sub_dtypes: dict[str, str] = field(default_factory=dict)  # their values' dtypes, as value_dtypes names them
    rendered: dict[int, RenderedKernel] = field(default_factory=dict)
    plan: Plan | None = None
    blobs: dict[str, bytes] = field(default_factory=dict)
    artifact: Artifact | None = None
    tasks: list[BuildTask] | None = None
    extern_reason: str | None = None  # why the whole graph runs as extern calls, when it does
    stages: list[StageTime] = field(default_factory=list)
    stage_log: list[dict[str, str]] = field(default_factory=list)
    _front: Compilation | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.graph is None:
            self.graph = self.request.graph
        if not self.key:
            self.key = compile_key(self.request)
        if not self.title:
            self.title = f"key {self.key[:12]}"

    @property
    def target(self) -> str:
        return self.request.options.target.kind

    @property
    def syms(self) -> Any:
        """The graph's size symbols (graph.SymValues: the ShapeEnv, its hints, fxcc's names), or None."""
        return None if self.gm is None else self.gm.meta.get("fxcc_syms")

    def symbols(self) -> AbstractContextManager[None]:
        """Within: sizes are SymPy over the graph's symbols (compiler_core.symbolic)."""
        syms = self.syms
        return symbol_scope(syms.rename, syms.hints) if syms else contextlib.nullcontext()

    def scheduled(self) -> dict[str, tuple[Kernel, dict[str, Any], str]]:
        """The fused kernels by name, (Kernel, buffers, target), as tuning reads them: this
        compile's own, or for an artifact made elsewhere (a tune job's), its request's front stages'."""
        c = self if self.lowered is not None else self.front()
        out: dict[str, tuple[Kernel, dict[str, Any], str]] = {}
        for i, rk in c.rendered.items():
            if isinstance(c.items[i], Kernel):
                out.setdefault(rk.name, (c.items[i], c.lowered.buffers, c.target))
        return out

    def value_dtypes(self) -> dict[str, str] | None:
        """The dtype of each tensor value of the graph the plan was made from (passes applied), as
        the build's kernel signatures read them, a control flow subgraph's under its place
        (`cond_1[0]/add`: build.subgraph_dtypes); None where the graph ran as extern calls."""
        c = self if self.gm is not None else self.front()
        return value_dtypes(c.gm) | c.sub_dtypes if c.gm is not None and c.extern_reason is None else None

    def front(self) -> Compilation:
        """The front stages of this request run on a Compilation of their own (once): what a tune
        job, which starts from a stored artifact, needs of the compile that made it."""
        if self._front is None:
            self._front = run(Compilation(self.request, key=self.key, record=False), FRONT)
        return self._front

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Within: stage `name` runs (the callback has heard of it; its duration is kept after)."""
        if self.on_stage is not None:
            self.on_stage(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stages.append(StageTime(name, round(time.perf_counter() - t0, 4)))
            log.debug("%s: %s took %.4f s", self.title, name, self.stages[-1].seconds)


# ---------------------------------------------------------------- the stages


def rebuild(c: Compilation) -> None:
    """The FX graph of the wire spec, a FakeTensor on every node, sizes from one ShapeEnv (the request's hints)."""
    c.gm = rebuild_graph(c.graph, c.request.hints)


def passes(c: Compilation) -> None:
    """fxcc's graph rewrites (attention fusion, matmul padding, channels-last convs) of the FX graph in
    place, under its ShapeEnv (what a match asked of the sizes stays a guard); then its wire form."""
    if run_passes(c.gm, c.target, c.request.options.allow_tf32):
        c.graph = wire_graph(c.gm, c.graph)
    emit("graph", c.title, lambda: format_graph(c.gm))


def lower(c: Compilation) -> None:
    """Each aten node to loop IR buffers (define-by-run bodies), or an extern call where it has no lowering."""
    with c.symbols():
        c.lowered = lower_graph(c.gm, c.graph, c.target)
    emit("ir", c.title, lambda: format_ir(c.lowered))


def schedule(c: Compilation) -> None:
    """The loop IR fused into kernels; each control flow subgraph through the front stages on its own."""
    with c.symbols():
        items = scheduler.schedule(c.lowered)
        emit("schedule", c.title, lambda: format_schedule(items))
        c.items, c.sub_kernels, c.sub_stats = compile_control_flow(
            items, lambda sub, hints, where: _subgraph(c, sub, hints, where))


def codegen(c: Compilation) -> None:
    """Triton source for every kernel, then the plan (launches, extern calls, frees, symbols, guards)."""
    with c.symbols():
        c.rendered = render_kernels(c.lowered, c.items, c.target)
        emit("kernels", c.title, lambda: format_kernels(c.rendered))
        if c.syms:
            c.lowered.symbols = symbol_bindings(c.graph)
            c.lowered.guards = range_guards(c.graph) + shape_env_guards(c.syms)
            c.lowered.input_strides = [list(p.spec.strides) if p.spec else None for p in c.graph.placeholders]
        plan = build_plan(c.lowered, c.items, c.rendered)
        if c.graph.free_layout_outputs:
            plan = plan.model_copy(update={"output_strides": output_strides(c.gm, c.graph.free_layout_outputs)})
        c.plan = plan
        emit("plan", c.title, lambda: format_plan(plan))
        emit("guards", c.title, lambda: format_guards(plan))
        kernels = merged_kernels(kernel_infos(c.rendered.values(), c.blobs) + c.sub_kernels)
        stats = merged_stats(compile_stats(c.graph, c.lowered, c.items, kernels), c.sub_stats)
    c.artifact = _unpackaged(c, plan, kernels, stats)


def tune(c: Compilation) -> None:
    """Each kernel's launch configs benchmarked on the GPU; the fastest that computes what the heuristic's does wins."""
    lock = c.tune_lock(c.tune_device) if c.tune_lock else contextlib.nullcontext()
    with lock:
        c.artifact = autotune_for_target(c.artifact, c.request, c.tune_device, scheduled=c.scheduled)


def build(c: Compilation) -> None:
    """A cubin per kernel for the target's arch (no GPU needed), here or as build tasks for other processes."""
    arch = c.request.options.target.arch
    tasks = build_tasks(c.artifact, c.request, arch, c.value_dtypes())
    if c.build == "tasks":
        c.tasks = tasks
    else:
        c.artifact = apply_builds(c.artifact, arch, {t.name: build_kernel(t) for t in tasks})


def package(c: Compilation) -> None:
    """The manifest completed: the front stages' compile time and the stage log the service shows (a blob)."""
    manifest = c.artifact.manifest
    compile_s = sum(s.seconds for s in c.stages if s.name in FRONT)
    update: dict[str, Any] = {"stats": manifest.stats.model_copy(update={"compile_s": round(compile_s, 4)})}
    if c.record:
        update["stage_log"] = add_blob(c.artifact.blobs, stage_logs.stage_log_json(c.stage_log))
    c.artifact.manifest = manifest.model_copy(update=update)


def tunes(c: Compilation) -> bool:
    """Whether the tune stage runs: a GPU to tune on and kernels to tune (autotune_for_target checks the arch)."""
    return c.tune_device is not None and bool(c.artifact.manifest.kernels)


def builds(c: Compilation) -> bool:
    """Whether the build stage runs: asked for, a CUDA target with kernels, and a Triton here that targets CUDA."""
    return (c.build != "none" and c.request.options.target.kind == "cuda" and bool(c.artifact.manifest.kernels)
            and cuda_build_unavailable() is None)


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Compilation], None]
    when: Callable[[Compilation], bool] = lambda c: True
    # A failure here is a compiler bug or a graph it cannot compile: the graph then runs as extern calls.
    falls_back: bool = False


PIPELINE: tuple[Stage, ...] = (
    Stage("rebuild", rebuild),
    Stage("passes", passes, falls_back=True),
    Stage("lower", lower, falls_back=True),
    Stage("schedule", schedule, falls_back=True),
    Stage("codegen", codegen, falls_back=True),
    Stage("tune", tune, when=tunes),
    Stage("build", build, when=builds),
    Stage("package", package),
)
STAGES = tuple(s.name for s in PIPELINE)
FRONT = ("rebuild", "passes", "lower", "schedule", "codegen")


def run(c: Compilation, stages: Sequence[str] = STAGES) -> Compilation:
    """Run `stages` of the pipeline on `c`, in the pipeline's order. Raises InvalidGraph for a graph
    that is wrong; where the compiler cannot compile it, the graph runs node by node as extern calls."""
    recording = stage_logs.recording() if c.record else contextlib.nullcontext(c.stage_log)
    with recording as entries:
        c.stage_log = entries
        for stage in PIPELINE:
            if stage.name not in stages or (stage.falls_back and c.extern_reason is not None) or not stage.when(c):
                continue
            try:
                with c.stage(stage.name):
                    stage.run(c)
            except InvalidGraph:
                raise
            except UnsupportedOp as e:
                if not stage.falls_back:
                    raise
                log.info("whole graph runs as extern calls: %s", e)
                _run_as_extern(c, str(e))
            except Exception as e:
                if not stage.falls_back:
                    raise
                # Note: reaching this is a compiler bug; the graph still runs, every node as its aten op.
                log.warning("compiling failed, the whole graph runs as extern calls: %s: %s", type(e).__name__, e)
                _run_as_extern(c, f"{type(e).__name__}: {e}")
    return c


def _run_as_extern(c: Compilation, why: str) -> None:
    c.extern_reason = why
    c.blobs = {}
    c.plan, stats = extern_plan(c.request.graph)
    c.artifact = _unpackaged(c, c.plan, [], stats)


def _unpackaged(c: Compilation, plan: Plan, kernels: list[KernelInfo], stats: CompileStats) -> Artifact:
    """The artifact of the plan and kernels, untuned and unbuilt, before `package` completes its manifest."""
    manifest = ArtifactManifest(key=c.key, versions=local_versions(), target=c.request.options.target, plan=plan,
                                kernels=kernels, stats=stats)
    return Artifact(manifest, c.blobs)


def _subgraph(c: Compilation, graph: GraphSpec, hints: dict[str, int],
              where: str) -> tuple[Plan, list[KernelInfo], CompileStats]:
    """A control flow subgraph through the front stages, its blobs and value dtypes added to its graph's."""
    request = c.request.model_copy(update={"graph": graph, "hints": hints})
    sub = run(Compilation(request, key=c.key, title=f"{c.title} (subgraph)", record=False), FRONT)
    c.blobs.update(sub.blobs)
    c.sub_dtypes.update({f"{where}/{name}": dtype for name, dtype in (sub.value_dtypes() or {}).items()})
    return sub.plan, sub.artifact.manifest.kernels, sub.artifact.manifest.stats


# ---------------------------------------------------------------- entry points


def compile_request(request: CompileRequest, on_stage: StageCallback | None = None) -> Artifact:
    """The request's artifact, untuned and without binaries. Raises FxccError subclasses on bad input."""
    return run(Compilation(request, on_stage=on_stage)).artifact


def compile_and_build(request: CompileRequest, tune_device: str | None = None,
                      on_stage: StageCallback | None = None) -> Artifact:
    """The request's artifact, tuned on `tune_device` when that is a GPU of the target's arch, with
    cubins for a CUDA target (a CPU-only process builds too; only tuning needs a GPU)."""
    return run(Compilation(request, tune_device=tune_device, build="here", on_stage=on_stage)).artifact


def retune(request: CompileRequest, stored: Artifact, device: str, on_stage: StageCallback | None = None,
           tune_lock: TuneLock | None = None) -> Artifact:
    """A stored untuned artifact of `request` tuned on GPU `device`, and the cubins of the kernels
    whose config changed rebuilt (the others keep theirs); unchanged when nothing could be tuned.
    The kernels tuning measures come from the request's front stages, run again here: the stored
    artifact holds sources, not loop IR."""
    c = Compilation(request, tune_device=device, build="here", on_stage=on_stage, tune_lock=tune_lock,
                    key=stored.manifest.key, record=False, artifact=stored)
    run(c, ("tune",))
    return run(c, ("build",)).artifact if c.artifact.manifest.tuned else c.artifact

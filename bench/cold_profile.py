"""Where a cold compile's time goes, stage by stage, in one process on a CPU (issue 25).

    .venv/bin/python -m bench.cold_profile --layers 48 --batch 1 --seq 128 [--repeat 2] [--profile DIR] [--json FILE]

Builds transformers' GPT2LMHeadModel(GPT2Config(n_layer=--layers), random weights), eval, and
measures, with torch.no_grad():
- client: torch.compile(model, backend="fxcc") to the backend's request (Dynamo, AOTAutograd,
  fxcc's capture, the request model, its key, its JSON body), with an empty FXCC_CACHE_DIR unless
  one is set; the service is replaced by a stub that keeps the request, so the graph falls back
  to eager (its run is timed apart, `client.eager_run`, and taken out of `client.dynamo`); with
  `--compile` the graph is compiled in-process instead (no FXCC_URL: the embedded default;
  `client.compile`, inside `client.backend_total`), so that its Dynamo package is saved as on a
  user's cold first call (the checker and worker parts then get no request);
- inside `client.dynamo`: `client.guards` (the frames' guards: built, and serialized for the
  package), `client.package_save` (each package pickled, signed, written) and `counts` (torch's
  guard builds, packages saved). FXCC_DYNAMO_CACHE=0 against 1 (the default) is what recording the
  package costs a cold first call (issue 25: `--layers 12 --parts client`, compare `cpu_seconds`);
- checker: what the API's request checker does with the body (service/checker.check_body:
  parse, op allow-list, key, shape propagation);
- worker: what a compile process does with it for an sm_90 target (parse, then the pipeline's
  front stages, compiler_core/pipeline.py: rebuild_graph, passes, lowering, scheduling, rendering,
  plan), and the build tasks it would hand on (the build stage's tasks: the kernels' content keys). Cubin builds are not timed here
  (bench.build_pool does; they are spread over the cluster's build processes).
Tracing and lowering do not depend on the device, so the numbers hold for the GPU machine's host
part too (scaled by its CPU). `--profile DIR` writes a cProfile per part (client.prof,
checker.prof, worker.prof; the first repeat) with the top functions by cumulative time (*.txt).
The checker and worker parts run --repeat times and keep each stage's best time (a warm process
has paid its imports before its first job; this machine's load varies), after freezing the heap
as those processes do once warm (service/subproc.freeze_heap). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Timer:
    """Seconds per named stage, summed over calls (wrappers patched onto module attributes)."""

    def __init__(self) -> None:
        self.s: dict[str, float] = {}  # wall seconds
        self.cpu: dict[str, float] = {}  # this process's CPU seconds (steadier on a shared machine)
        self.undo: list[Callable[[], None]] = []

    def wrap(self, module: Any, name: str, stage: str | None = None) -> None:
        original = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.stage(stage or name):
                return original(*args, **kwargs)

        setattr(module, name, timed)
        self.undo.append(lambda: setattr(module, name, original))

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.s[name] = self.s.get(name, 0.0) + time.perf_counter() - t0
            self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c0

    def restore(self) -> None:
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()

    def rounded(self, which: dict[str, float] | None = None) -> dict[str, float]:
        return {k: round(v, 3) for k, v in (self.s if which is None else which).items()}


@contextmanager
def profiled(folder: Path | None, name: str, top: int) -> Iterator[None]:
    if folder is None:
        yield
        return
    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        folder.mkdir(parents=True, exist_ok=True)
        prof.dump_stats(folder / f"{name}.prof")
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
        (folder / f"{name}.txt").write_text(out.getvalue())


def client_part(layers: int, batch: int, seq: int, timer: Timer, compile_graphs: bool = False,
                counts: dict[str, int] | None = None) -> list[bytes]:
    """torch.compile → each graph's request body; the service replaced by a stub (or, with
    `compile_graphs`, the graphs compiled in-process and no body kept)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from fxcc.client import backend, capture, graphs
    from fxcc.compiler_core import keys

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=layers, use_cache=False)).eval()
    ids = torch.randint(0, 50257, (batch, seq))
    bodies: list[bytes] = []

    class Stubbed(Exception):
        pass

    def fetch(self: Any, request: Any, key: str) -> Any:
        with timer.stage("client.serialize"):
            bodies.append(request.model_dump_json().encode())
        raise Stubbed("request kept by bench.cold_profile")

    timer.wrap(capture, "capture_graph", "client.capture")
    timer.wrap(graphs, "capture_graph", "client.capture")
    timer.wrap(graphs, "compile_key", "client.key")
    timer.wrap(keys, "compile_key", "client.key")
    original_call = backend.GraphCompiler.__call__
    original_fetch = backend.GraphCompiler.fetch

    def call(self: Any, gm: Any, example_inputs: list[Any]) -> Any:
        with timer.stage("client.fxcc_backend"):
            return original_call(self, gm, example_inputs)

    backend.GraphCompiler.__call__ = call  # type: ignore[method-assign]
    if compile_graphs:
        timer.wrap(backend.GraphCompiler, "fetch", "client.compile")
    else:
        backend.GraphCompiler.fetch = fetch  # type: ignore[method-assign]
    import importlib

    importlib.import_module("torch._dynamo")
    importlib.import_module("torch._dynamo.repro.after_dynamo")
    _time_guards(backend, timer, {} if counts is None else counts)
    # Note: timed inside fxcc's backend, which Dynamo gets by its name as a user's call does (a
    # wrapped backend would get no Dynamo package, whose saving a cold call pays).
    timer.wrap(backend, "_pre_aot", "client.backend_total")
    timer.wrap(backend, "_run_aot", "client.backend_total")

    os.environ["FXCC_FALLBACK"] = "eager"
    with torch.no_grad():
        model(ids)  # warm
        with timer.stage("client.eager_run"):
            model(ids)
    import warnings
    with timer.stage("client.first_call_total"), torch.no_grad(), warnings.catch_warnings():
        compiled = torch.compile(model, backend="fxcc")
        warnings.simplefilter("ignore")
        compiled(ids)
    backend.GraphCompiler.__call__ = original_call  # type: ignore[method-assign]
    backend.GraphCompiler.fetch = original_fetch  # type: ignore[method-assign]
    timer.restore()
    return bodies


def _time_guards(backend: Any, timer: Timer, counts: dict[str, int]) -> None:
    """Time the frames' guards (as Dynamo's convert_frame builds them: fxcc's hook when the package
    cache is on) and the packages' saving; count torch's guard builds and the packages saved."""
    from torch._dynamo import convert_frame, guards

    getattr(backend, "fxcc_backend")  # noqa: B009 - registers fxcc, turns the package cache on (or not)
    timer.wrap(convert_frame, "CheckFunctionManager", "client.guards")
    counted = guards.CheckFunctionManager.build_guards

    def build_guards(*args: Any, **kwargs: Any) -> Any:
        counts["guard_builds"] = counts.get("guard_builds", 0) + 1
        return counted(*args, **kwargs)

    guards.CheckFunctionManager.build_guards = build_guards  # type: ignore[method-assign]
    timer.undo.append(lambda: setattr(guards.CheckFunctionManager, "build_guards", counted))
    if os.environ.get("FXCC_DYNAMO_CACHE", "1") != "0":
        from fxcc.client import dynamo_cache, dynamo_precompile

        timer.wrap(dynamo_precompile, "_save", "client.package_save")
        timer.undo.append(lambda: counts.update(packages_saved=dynamo_cache.counters().get("saved", 0)))


def checker_part(bodies: list[bytes], timer: Timer) -> None:
    from fxcc.service import checker

    timer.wrap(checker, "propagate_shapes", "checker.propagate_shapes")
    with timer.stage("checker.total"):
        for body in bodies:
            answer, _ = checker.check_body(body, 1_000_000)
            if answer["type"] != "ok":
                raise RuntimeError(f"the checker refused the request: {answer}")
    timer.restore()


def worker_part(bodies: list[bytes], timer: Timer, arch: int) -> dict[str, Any]:
    from fxcc.compiler_core import build, pipeline, scheduler
    from fxcc.compiler_core.wire import CompileRequest, Target

    timer.wrap(build, "_node_dtypes", "worker.build_tasks.rebuild")
    timer.wrap(scheduler, "schedule", "worker.schedule")
    for name in ("rebuild_graph", "run_passes", "lower_graph", "render_kernels", "build_plan",
                 "compile_control_flow", "kernel_infos"):
        timer.wrap(pipeline, name, f"worker.{name}")
    out: dict[str, Any] = {"graphs": len(bodies), "kernels": 0, "nodes": 0, "build_tasks": 0}
    for cached in _process_memos():  # each repeat as a compile process's first job of this model
        cached.cache_clear()
    for body in bodies:
        with timer.stage("worker.parse"):
            request = CompileRequest.model_validate_json(body)
        opts = request.options.model_copy(update={"target": Target(kind="cuda", arch=arch)})
        request = request.model_copy(update={"options": opts})
        # Note: a compile process's pipeline with its build left to build tasks (worker/steps.lower_steps),
        # its build stage timed apart.
        with timer.stage("worker.compile_request"):
            c = pipeline.run(pipeline.Compilation(request, build="tasks"), (*pipeline.FRONT, "package"))
        with timer.stage("worker.build_tasks"):
            pipeline.run(c, ("build",))
        artifact, tasks = c.artifact, c.tasks or []
        out["kernels"] += len(artifact.manifest.kernels)
        out["nodes"] += len(request.graph.nodes)
        out["build_tasks"] += len(tasks)
        out.setdefault("stats", []).append(artifact.manifest.stats.model_dump(exclude_none=True))
    timer.restore()
    return out


def _process_memos() -> list[Any]:
    """The compiler's per-process memos (functools caches), where this version has them."""
    import importlib

    found = []
    for module, name in (("sizevars", "_simplify_index"), ("sizevars", "_linear_index"),
                         ("lowering.common", "_strides_of"), ("ir.nodes", "_read_step")):
        fn = getattr(importlib.import_module(f"fxcc.compiler_core.{module}"), name, None)
        if fn is not None and hasattr(fn, "cache_clear"):
            found.append(fn)
    return found


def _freeze_heap() -> None:
    from fxcc.service import subproc

    freeze = getattr(subproc, "freeze_heap", None)
    if freeze is not None:
        freeze()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--profile", type=Path, help="cProfile output per part into this folder")
    p.add_argument("--top", type=int, default=60)
    p.add_argument("--json", type=Path, help="write the result here too")
    p.add_argument("--parts", default="client,checker,worker")
    p.add_argument("--repeat", type=int, default=2, help="runs of the checker and worker parts (best kept)")
    p.add_argument("--compile", action="store_true",
                   help="compile the graphs in-process (the package saved as on a cold call), no stub")
    a = p.parse_args()
    parts = a.parts.split(",")
    # A cold client: an empty local cache (the pre-AOT entries and Dynamo packages it saves
    # included), FXCC_PRE_AOT_CACHE and FXCC_DYNAMO_CACHE as the environment says (on by default).
    os.environ.setdefault("FXCC_CACHE_DIR", tempfile.mkdtemp(prefix="fxcc-cold-profile-"))
    timer = Timer()
    counts: dict[str, int] = {}
    with profiled(a.profile, "client", a.top):
        bodies = client_part(a.layers, a.batch, a.seq, timer, a.compile, counts)
    result: dict[str, Any] = {"layers": a.layers, "batch": a.batch, "seq": a.seq,
                              "dynamo_cache": os.environ.get("FXCC_DYNAMO_CACHE", "1") != "0",
                              "compile": a.compile, "body_bytes": sum(len(b) for b in bodies), "counts": counts}
    # The service's parts run --repeat times (a warm checker or compile process has paid its imports
    # and first-use set-up before its first job): each stage's best time is kept. Those processes
    # freeze their heap once warm (service/subproc.freeze_heap), so this one does too, where this
    # version has it: the client's objects then stay out of the collector's way as theirs do.
    _freeze_heap()
    best: dict[str, float] = {}
    best_cpu: dict[str, float] = {}
    for i in range(a.repeat):
        again = Timer()
        if "checker" in parts:
            with profiled(a.profile if i == 0 else None, "checker", a.top):
                checker_part(bodies, again)
        if "worker" in parts:
            with profiled(a.profile if i == 0 else None, "worker", a.top):
                result.update(worker_part(bodies, again, a.arch))
        best = {k: min(v, best.get(k, v)) for k, v in again.s.items()}
        best_cpu = {k: min(v, best_cpu.get(k, v)) for k, v in again.cpu.items()}
    timer.s.update(best)
    timer.cpu.update(best_cpu)
    for s in (timer.s, timer.cpu):
        s["client.dynamo"] = s["client.first_call_total"] - s.get("client.backend_total", 0.0) - s["client.eager_run"]
        s["client.aot_autograd"] = s.get("client.backend_total", 0.0) - s.get("client.fxcc_backend", 0.0)
    result["seconds"] = timer.rounded()
    result["cpu_seconds"] = timer.rounded(timer.cpu)
    text = json.dumps(result, indent=1)
    if a.json:
        a.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

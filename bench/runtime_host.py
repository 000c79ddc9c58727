"""Host cost of fxcc's plan runtime (client/runtime.py) per step, on the CPU, kernels stubbed.

    TRITON_INTERPRET=1 .venv/bin/python -m bench.runtime_host                 # 6-layer GPT-2 training step
    TRITON_INTERPRET=1 .venv/bin/python -m bench.runtime_host --profile 25    # and cProfile's top 25
    TRITON_INTERPRET=1 .venv/bin/python -m bench.runtime_host --model resnet18 --stub-externs

A diagnostic, not a benchmark and not a test (issue 19, item 3). A model is compiled for a
training step by fxcc in-process: a transformers GPT-2 (GPT2Config(n_layer=6), small widths so
that its aten ops cost little) or bench.models' torchvision ResNet-18 at a small image (its convs
laid out channels-last as for a CUDA target, so the plans are the GPU's). The first step runs for
real (the Triton interpreter). Then every plan's kernel steps are replaced by no-ops (with
--stub-externs its matmuls and convolutions too, whose CPU compute would hide the rest), so what
is left of a call is the runtime's own work (reading and writing its environment, allocations,
frees, the other extern calls' dispatch) and nothing of the interpreter. Each plan (forward,
backward) is called again with the arguments AOTAutograd first gave it, and the whole step
(forward + backward through Dynamo, AOTAutograd and the autograd engine) is timed too, as the
median CPU time of this thread (torch on one thread). Prints one JSON line: per plan its steps
by kind, the median host µs per call, per step and by step kind, the call behind fxcc's wrappers
(`boxed_us`: what AOTAutograd calls), and the extern steps' aten calls alone (`extern_ops`); with
--profile, cProfile's functions by own time over the plans' calls.

torchvision must be importable (bench-only: `pip install --no-deps torchvision==<torch's match>`).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.host_layers import spy_on_plans


def plan_runner(runner: Any) -> Any:
    """The PlanRunner inside what the backend wraps (hand_on's closure, a GraphedPlan)."""
    from fxcc.client.runtime import PlanRunner

    todo, seen = [runner], set()
    while todo:
        r = todo.pop()
        if isinstance(r, PlanRunner):
            return r
        if id(r) in seen:
            continue
        seen.add(id(r))
        todo += [getattr(r, "runner", None)] + [c.cell_contents for c in (getattr(r, "__closure__", None) or ())
                                                 if callable(c.cell_contents)]
        todo = [t for t in todo if t is not None]
    return None


def stub_kernels(runner: Any) -> int:
    """Replace the runner's kernel steps by no-ops; how many there were.

    Note: a kernel's integer buffer (positions, shifted labels) may be an extern's indices: with
    the kernel gone its memory would be garbage, so those few buffers are allocated zeroed."""
    from fxcc.compiler_core.artifact import AllocStep, KernelStep
    from fxcc.compiler_core.wire import torch_dtype

    def noop(env: dict[str, Any]) -> None:
        return None

    def zeroed(step: AllocStep) -> Callable[[dict[str, Any]], None]:
        dtype, sizes, strides = torch_dtype(step.spec.dtype), tuple(step.spec.sizes), tuple(step.spec.strides)

        def run(env: dict[str, Any]) -> None:
            env[step.out] = torch.zeros(sizes, dtype=dtype).as_strided(sizes, strides) if all(
                isinstance(n, int) for n in sizes) else torch.empty(0, dtype=dtype)
        return run

    n = 0
    for i, step in enumerate(runner.manifest.plan.steps):
        if isinstance(step, KernelStep):
            runner._steps[i] = noop
            n += 1
        elif isinstance(step, AllocStep) and step.reuse is None and not torch_dtype(step.spec.dtype).is_floating_point:
            runner._steps[i] = zeroed(step)
    return n


HEAVY_EXTERNS = ("convolution", "convolution_backward", "mm", "addmm", "bmm")


def stub_heavy_externs(runner: Any, runtime: Any = None) -> int:
    """Replace the runner's matmuls and convolutions (their CPU compute, not what a GPU's host
    spends on them) by steps that hand back the result of their first call; how many there were.
    What is left of a call is fxcc's work around them and the other ops' dispatch. `runtime`: the
    module whose PlanRunner made `runner` (client/runtime.py, or --baseline's)."""
    if runtime is None:
        from fxcc.client import runtime
    from fxcc.compiler_core.artifact import ExternStep

    direct = runtime._direct

    def once(op: Any) -> Any:
        inner, first = direct(op), []

        def call(*xs: Any, **kw: Any) -> Any:
            if not first:
                first.append(inner(*xs, **kw))
            return first[0]
        return call

    n = 0
    for i, step in enumerate(runner.manifest.plan.steps):
        if isinstance(step, ExternStep) and step.op.split(".")[1:2] and step.op.split(".")[1] in HEAVY_EXTERNS:
            runtime._direct = once
            try:
                runner._steps[i] = runtime.PlanRunner._extern(step)
            finally:
                runtime._direct = direct
            n += 1
    return n


def median_us(fn: Callable[[], Any], calls: int) -> float:
    """Median CPU time of this thread over `calls` calls (torch runs on one thread here): other
    processes on the machine take wall time from a call, not the CPU time it spends."""
    fn()
    times = []
    for _ in range(calls):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return round(1e6 * statistics.median(times), 1)


def cuda_host_us(fn: Callable[[], Any], calls: int) -> dict[str, float]:
    """On a GPU, the median wall and CPU µs of a call issued onto an idle queue (synchronized
    before, not after: the call's host work, not its kernels). Wall well above CPU means the call
    waited (a host synchronisation, a blocking copy)."""
    fn()
    wall, cpu = [], []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    torch.cuda.synchronize()
    return {"wall_us": round(1e6 * statistics.median(wall), 1), "cpu_us": round(1e6 * statistics.median(cpu), 1)}


# CUDA API calls that make the host wait for the device (or copy through it).
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuStreamSynchronize", "cuCtxSynchronize", "cuMemcpy")


def cuda_api_calls(fn: Callable[[], Any], steps: int = 3) -> dict[str, Any]:
    """torch.profiler over `steps` calls: per call, the CUDA runtime/driver API calls by name
    (launches, synchronisations, copies) with their host µs, and the aten ops by own host µs."""
    from bench.models import profiled

    prof = profiled(fn, steps)
    api: dict[str, list[float]] = {}
    ops: dict[str, float] = {}
    for e in prof.key_averages():
        name = e.key
        if name.startswith(("cuda", "cu")) and not name.startswith("cutlass"):
            api[name] = [round(e.count / steps, 1), round(e.cpu_time_total / steps, 1)]
        elif name.startswith("aten::"):
            ops[name] = round(e.self_cpu_time_total / steps, 1)
    top = dict(sorted(ops.items(), key=lambda kv: -kv[1])[:15])
    syncs = {k: v for k, v in api.items() if k.startswith(SYNC_CALLS)}
    return {"api_calls_per_step": api, "syncs_per_step": syncs, "aten_self_us_per_step": top}


def against(path: str, seen: list[dict[str, Any]], calls: int, heavy: bool) -> list[dict[str, float]]:
    """Per plan, the median CPU µs of a call by this runtime and by the one at `path`, calls
    alternating between the two (a busy machine slows both alike)."""
    import importlib.util
    from pathlib import Path

    from fxcc.compiler_core.artifact import load_artifact

    spec = importlib.util.spec_from_file_location("fxcc_runtime_baseline", path)
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    out = []
    for entry in seen:
        runner = plan_runner(entry["runner"])
        if runner is None or entry["args"] is None:
            continue
        art = load_artifact(Path(os.environ["FXCC_CACHE_DIR"]) / "artifacts", runner.manifest.key)
        base = old.PlanRunner(art)
        stub_kernels(base)
        if heavy:
            stub_heavy_externs(base, old)
        args = list(entry["args"]) + list(entry["constants"])
        times: dict[str, list[float]] = {"this": [], "baseline": []}
        for r in (runner, base):
            r(list(args))
        for _ in range(calls):
            for name, r in (("this", runner), ("baseline", base)):
                t0 = time.thread_time()
                r(list(args))
                times[name].append(time.thread_time() - t0)
        this, was = (round(1e6 * statistics.median(times[k]), 1) for k in ("this", "baseline"))
        out.append({"steps": len(runner.manifest.plan.steps), "baseline_us": was, "this_us": this,
                    "saved_us_per_step": round((was - this) / len(runner.manifest.plan.steps), 3)})
    return out


def build_gpt2(a: argparse.Namespace) -> tuple[torch.nn.Module, tuple[Any, ...], str]:
    _import_torchvision(required=False)  # transformers imports it when installed
    from transformers import GPT2Config, GPT2LMHeadModel

    from bench.model_zoo import LmLoss

    config = GPT2Config(n_layer=a.layers, n_embd=a.width, n_head=4, vocab_size=512, n_positions=a.seq,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = LmLoss(GPT2LMHeadModel(config)).train().to(a.device)
    ids = torch.randint(0, 512, (a.batch, a.seq)).to(a.device)
    return model, (ids,), f"transformers GPT-2, {a.layers} layers, width {a.width}, batch {a.batch}, seq {a.seq}"


def build_resnet18(a: argparse.Namespace) -> tuple[torch.nn.Module, tuple[Any, ...], str]:
    """bench.models' resnet18_train (torchvision's definition, cross entropy), at a CPU-sized input."""
    _import_torchvision()
    from bench.model_zoo import _vision

    built = _vision("torchvision", "resnet18", a.batch, "float32", train=True, size=a.size)(a.device, False)
    return built.module.train(), built.inputs, f"torchvision ResNet-18, batch {a.batch}, {a.size}x{a.size}"


def _import_torchvision(required: bool = True) -> None:
    """torchvision, or a clear exit (`required`; else nothing). A CUDA wheel of torchvision under
    a CPU torch (what a CPU machine may have beside torch's CPU wheel) fails to load its C++ ops
    and then to register fakes for two of them, which breaks transformers' import too; their
    schemas are declared here so that its Python models load (they use none of its C++ ops)."""
    import sys

    try:
        import torchvision.models
        return
    except ImportError as e:
        if not required:
            return
        raise SystemExit(f"bench.runtime_host --model resnet18 needs torchvision ({e}): pip install "
                         "--no-deps torchvision==<the version matching torch>") from None
    except RuntimeError:
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
    lib = torch.library.Library("torchvision", "FRAGMENT")
    _TORCHVISION_SHIMS.append(lib)
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision.models  # noqa: F401


_TORCHVISION_SHIMS: list[Any] = []
MODELS = {"gpt2": build_gpt2, "resnet18": build_resnet18}


def per_kind_us(runner: Any, args: list[Any], calls: int, sync: Callable[[], Any] = lambda: None) -> dict[str, float]:
    """Median µs per call that the runner's steps of each kind take, each step between two reads
    of the clock (the clock's own cost, measured here, taken off each step), and
    what is left of a call (begin, finish, the loop): `other`. `sync` runs before each call (on a
    GPU: an idle queue, so that no launch waits for room in it)."""
    from fxcc.compiler_core.artifact import AllocStep, ExternStep, FreeStep, KernelStep

    clock = time.perf_counter  # a vDSO read: thread_time's syscall costs more than a step
    t0 = clock()
    for _ in range(1000):
        clock()
    tick = (clock() - t0) / 1001
    names = {KernelStep: "kernel", ExternStep: "extern", AllocStep: "alloc", FreeStep: "free"}
    kinds = [names[type(s)] for s in runner.manifest.plan.steps]
    totals: dict[str, list[float]] = {k: [] for k in (*names.values(), "other")}
    for _ in range(calls + 1):
        spent = dict.fromkeys(names.values(), 0.0)
        sync()
        start = clock()
        env = runner.begin(list(args))
        for kind, run in zip(kinds, runner._steps):
            t0 = clock()
            run(env)
            spent[kind] += clock() - t0 - tick
        runner.finish(env)
        whole = clock() - start - tick * (len(kinds) + 1)
        for k, v in spent.items():
            totals[k].append(v)
        totals["other"].append(whole - sum(spent.values()))
    return {k: round(1e6 * statistics.median(v[1:]), 1) for k, v in totals.items()}


def extern_ops_us(runner: Any, args: list[Any], calls: int, sync: Callable[[], Any] = lambda: None) -> dict[str, Any]:
    """The extern steps' aten calls alone (torch's dispatch and, on the CPU, their compute): each
    step rebuilt around a timed op, median CPU µs per call by op name. What the extern steps take
    beyond this is fxcc's own work around the op (reading arguments, re-layouts)."""
    from fxcc.client import runtime
    from fxcc.compiler_core.artifact import ExternStep

    spent: dict[str, float] = {}
    direct = runtime._direct
    clock = time.thread_time

    def timed(name: str) -> Callable[[Any], Any]:
        def wrap(op: Any) -> Any:
            inner = direct(op)

            def call(*xs: Any, **kw: Any) -> Any:
                t0 = clock()
                try:
                    return inner(*xs, **kw)
                finally:
                    spent[name] = spent.get(name, 0.0) + clock() - t0
            return call
        return wrap

    saved = list(runner._steps)
    try:
        for i, step in enumerate(runner.manifest.plan.steps):
            if isinstance(step, ExternStep) and step.control is None and step.flex is None and \
                    step.opaque is None and step.triton is None:
                runtime._direct = timed(step.op.split(".")[1] if step.op.startswith("aten.") else step.op)
                try:
                    runner._steps[i] = runtime.PlanRunner._extern(step)
                finally:
                    runtime._direct = direct
        runner(list(args))
        samples: list[dict[str, float]] = []
        for _ in range(calls):
            sync()
            spent.clear()
            runner(list(args))
            samples.append(dict(spent))
    finally:
        runner._steps[:] = saved
    ops = {k: round(1e6 * statistics.median(s.get(k, 0.0) for s in samples), 1) for k in samples[0]}
    return {"op_us": round(sum(ops.values()), 1), "by_op_us": dict(sorted(ops.items(), key=lambda kv: -kv[1]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    ap.add_argument("--layers", type=int, default=6, help="gpt2: layers")
    ap.add_argument("--width", type=int, default=64, help="gpt2: width")
    ap.add_argument("--seq", type=int, default=16, help="gpt2: sequence length")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--size", type=int, default=32, help="resnet18: image height and width")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True,
                    help="lay conv graphs out channels-last as for a CUDA target (the layout pass let run for "
                         "the CPU interpreter, as tests/models does), so the plans are the GPU's")
    ap.add_argument("--stub-externs", action="store_true",
                    help="also stub matmuls and convolutions (each returns its first result): their CPU "
                         "compute hides fxcc's host work around them")
    ap.add_argument("--eager", action="store_true",
                    help="also time the same step eagerly (aten's own dispatch, compute included)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="cuda: real kernels on the GPU, nothing stubbed; each call's wall and CPU µs on an "
                         "idle queue, the step's CUDA API calls (syncs) by torch.profiler, a fused AdamW step")
    ap.add_argument("--inductor", action="store_true", help="cuda: Inductor's step beside fxcc's")
    ap.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions by own time")
    ap.add_argument("--baseline", default=None,
                    help="another client/runtime.py (git show main:client/runtime.py > /tmp/rt.py): its "
                         "runners of the same plans are called in turn with this one's, call for call")
    a = ap.parse_args()
    os.environ.setdefault("FXCC_CACHE_DIR", tempfile.mkdtemp(prefix="fxcc-runtime-host-"))
    cuda = a.device == "cuda"
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # stubbed kernels leave garbage that extern ops compute over
    from fxcc.client.backend import fxcc_backend
    from fxcc.compiler_core.artifact import AllocStep, ExternStep, FreeStep, KernelStep

    seen: list[dict[str, Any]] = []
    spy_on_plans(seen)
    if a.channels_last and not cuda:
        from fxcc.compiler_core.passes import layout

        layout.TARGETS, layout.DEVICES = layout.TARGETS | {"interpret"}, layout.DEVICES | {"cpu"}
    model, inputs, what = MODELS[a.model](a)
    compiled = torch.compile(model, backend=fxcc_backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True) if cuda else None

    def step(fn: Callable[..., Any] = compiled) -> None:
        model.zero_grad(set_to_none=True)
        fn(*inputs).backward()
        if opt is not None:
            opt.step()

    step()  # compiles the forward and the backward, runs them for real
    result: dict[str, Any] = {"model": what, "device": a.device, "torch": torch.__version__,
                              "channels_last": a.channels_last or cuda, "plans": []}
    timed = (lambda fn: cuda_host_us(fn, a.calls)) if cuda else (lambda fn: median_us(fn, a.calls))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    calls: list[Callable[[], Any]] = []
    for entry in seen:
        runner = plan_runner(entry["runner"])
        if runner is None or entry["args"] is None:
            continue
        if not cuda:
            stub_kernels(runner)
        heavy = stub_heavy_externs(runner) if a.stub_externs and not cuda else 0
        args = list(entry["args"]) + list(entry["constants"])
        steps = runner.manifest.plan.steps
        kinds = {k.__name__: sum(isinstance(s, k) for s in steps) for k in (KernelStep, ExternStep, AllocStep, FreeStep)}
        t = timed(lambda r=runner, x=args: r(list(x)))
        us, wall = (t["cpu_us"], t["wall_us"]) if isinstance(t, dict) else (t, None)
        boxed = entry["boxed"]
        result["plans"].append({"steps": len(steps), **kinds, "stubbed_externs": heavy, "call_us": us,
                                "call_wall_us": wall,
                                "us_per_step": round(us / max(1, len(steps)), 2),
                                "us_per_launch": round(us / max(1, kinds["KernelStep"] + kinds["ExternStep"]), 2),
                                # what AOTAutograd calls: the plan behind fxcc's wrappers (client/graphs.py)
                                "boxed_us": timed(lambda b=boxed, x=entry["args"]: b(list(x))),
                                "by_kind_us": per_kind_us(runner, args, a.calls, sync),
                                "extern_ops": extern_ops_us(runner, args, a.calls, sync)})
        calls.append(lambda r=runner, x=args: r(list(x)))
    from fxcc.client import runtime

    result["relaid_extern_results"] = len(runtime._relaid)  # extern results copied into the plan's layout
    result["plans_call_us"] = round(sum(p["call_us"] for p in result["plans"]), 1)
    if a.baseline:
        result["against_baseline"] = against(a.baseline, seen, a.calls, a.stub_externs)
    # Dynamo's guards, AOTAutograd's runtime wrapper, the autograd engine, fxcc's wrappers, the plans
    result["training_step_us"] = median_us(step, max(20, a.calls // 4)) if not cuda else cuda_host_us(step, a.calls)
    if cuda:
        from fxcc.client import cuda_loader

        result["cubin_jit_fallbacks"] = cuda_loader.stats.jit_fallbacks
        result["threads"] = sorted(t.name for t in threading.enumerate())  # a busy one takes the GIL from a step
        result["fxcc_api"] = cuda_api_calls(step)
    if cuda and a.inductor:
        inductor = torch.compile(model)
        result["inductor_step_us"] = cuda_host_us(lambda: step(inductor), a.calls)
        result["inductor_api"] = cuda_api_calls(lambda: step(inductor))
    if a.eager:
        result["eager_step_us"] = median_us(lambda: step(model), max(20, a.calls // 4))
    print(json.dumps(result), flush=True)
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.calls):
            for call in calls:
                call()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(a.profile)
        print(out.getvalue())


if __name__ == "__main__":
    main()

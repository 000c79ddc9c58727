"""Host cost of fxcc's plan runtime (client/runtime.py) per step, on the CPU, kernels stubbed.

    TRITON_INTERPRET=1 .venv/bin/python -m bench.runtime_host                 # 6-layer GPT-2 training step
    TRITON_INTERPRET=1 .venv/bin/python -m bench.runtime_host --profile 25    # and cProfile's top 25

A diagnostic, not a benchmark and not a test (issue 19, item 3). A transformers GPT-2
(GPT2Config(n_layer=6), small widths so that its aten ops cost little) is compiled for a training
step by fxcc in-process; the first step runs for real (the Triton interpreter). Then every plan's
kernel steps are replaced by no-ops, so what is left of a call is the runtime's own work (reading
and writing its environment, allocations, frees, the extern calls' dispatch over tiny tensors)
and nothing of the interpreter. Each plan (forward, backward) is called again with the arguments
AOTAutograd first gave it, and the whole step (forward + backward through AOTAutograd and
Dynamo) is timed too, as the median CPU time of this thread (torch on one thread). Prints one JSON line: per plan its steps by kind and the median host µs per
call and per step; with --profile, cProfile's functions by own time over those calls.
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


def against(path: str, seen: list[dict[str, Any]], calls: int) -> list[dict[str, float]]:
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


def build(layers: int, width: int, batch: int, seq: int) -> tuple[torch.nn.Module, torch.Tensor]:
    from transformers import GPT2Config, GPT2LMHeadModel

    from bench.model_zoo import LmLoss

    config = GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=512, n_positions=seq,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = LmLoss(GPT2LMHeadModel(config)).train()
    return model, torch.randint(0, 512, (batch, seq))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions by own time")
    ap.add_argument("--baseline", default=None,
                    help="another client/runtime.py (git show main:client/runtime.py > /tmp/rt.py): its "
                         "runners of the same plans are called in turn with this one's, call for call")
    a = ap.parse_args()
    os.environ.setdefault("FXCC_CACHE_DIR", tempfile.mkdtemp(prefix="fxcc-runtime-host-"))
    torch.set_num_threads(1)
    from fxcc.client.backend import fxcc_backend
    from fxcc.compiler_core.artifact import AllocStep, ExternStep, FreeStep, KernelStep

    seen: list[dict[str, Any]] = []
    spy_on_plans(seen)
    model, ids = build(a.layers, a.width, a.batch, a.seq)
    compiled = torch.compile(model, backend=fxcc_backend)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        compiled(ids).backward()

    step()  # compiles the forward and the backward, runs them for real
    result: dict[str, Any] = {"model": f"transformers GPT-2, {a.layers} layers, width {a.width}, "
                                       f"batch {a.batch}, seq {a.seq}", "torch": torch.__version__, "plans": []}
    calls: list[Callable[[], Any]] = []
    for entry in seen:
        runner = plan_runner(entry["runner"])
        if runner is None or entry["args"] is None:
            continue
        stub_kernels(runner)
        args = list(entry["args"]) + list(entry["constants"])
        steps = runner.manifest.plan.steps
        kinds = {k.__name__: sum(isinstance(s, k) for s in steps) for k in (KernelStep, ExternStep, AllocStep, FreeStep)}
        us = median_us(lambda r=runner, x=args: r(list(x)), a.calls)
        result["plans"].append({"steps": len(steps), **kinds, "call_us": us,
                                "us_per_step": round(us / max(1, len(steps)), 2),
                                "us_per_launch": round(us / max(1, kinds["KernelStep"] + kinds["ExternStep"]), 2)})
        calls.append(lambda r=runner, x=args: r(list(x)))
    result["plans_call_us"] = round(sum(p["call_us"] for p in result["plans"]), 1)
    if a.baseline:
        result["against_baseline"] = against(a.baseline, seen, a.calls)
    result["training_step_us"] = median_us(step, max(20, a.calls // 4))  # Dynamo + AOTAutograd + plans
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

"""Measure one workload in this process: eager vs Inductor vs fxcc runtime, memory, kernels, bandwidth.

`python -m bench.measure --workload cos_sin --out result.json` (bench.run starts one per workload).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def bench_ms(fn: Callable[[], Any], spread: dict[str, float] | None = None) -> float:
    """Median runtime in ms (triton.testing.do_bench: CUDA events, L2 flushed between runs).

    With `spread`, also fills its 10th and 90th percentiles and the medians of the first and last
    tenth of the runs: a process in a slow mode for its whole measurement shows a high p10; a
    clock still ramping up shows a first tenth slower than the last.
    """
    from triton.testing import do_bench

    times = [float(t) for t in do_bench(fn, warmup=50, rep=300, return_mode="all")]
    sorted_times = sorted(times)
    n = len(times)
    if spread is not None:
        tenth = max(1, n // 10)
        spread.update(p10=round(sorted_times[n // 10], 4), p90=round(sorted_times[(9 * n) // 10], 4),
                      first_tenth=round(sorted(times[:tenth])[tenth // 2], 4),
                      last_tenth=round(sorted(times[-tenth:])[tenth // 2], 4), runs=n)
    return statistics.median(times)  # what return_mode="median" gives


def device_ms(fn: Callable[[], Any], runs: int = 500, head_start_us: float = 200.0) -> float:
    """Median GPU time in ms with the host kept out: as do_bench (L2 flushed by zeroing 256 MB
    before each run, CUDA events around the call), but the GPU first sleeps `head_start_us`, so
    the call is enqueued before its start event runs and the events time only the kernels.

    Note: do_bench's events run as soon as the flush kernel ends; a call whose host time is longer
    than that flush (tens of µs) makes the GPU wait between the start event and its first kernel,
    and host jitter then shows up as runtime. For kernels of a few tens of µs this is the
    difference between the two numbers.
    """
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    cycles = int(2e9 * head_start_us * 1e-6)  # SM cycles at about the H200's boost clock
    for _ in range(10):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for start, end in events:
        cache.zero_()
        torch.cuda._sleep(cycles)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def peak_mb(fn: Callable[[], Any]) -> float:
    """Memory one call takes beyond what was allocated before it (its peak, outputs included)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return round(peak / 2**20, 1)


class Reserved:
    """The most memory the caching allocator held (reserved, graph pools included) from `start()`
    on, over the peak call and two more: what a compiled model keeps from other work. `start` empties the cache
    first, so what an earlier phase (eager, the other compiler, autotuning) left cached is not
    counted; memory still allocated (weights, inputs, held graph pools) is."""

    def start(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    def mb(self) -> float:
        torch.cuda.synchronize()
        return round(torch.cuda.max_memory_reserved() / 2**20, 1)


def host_ms(fn: Callable[[], Any], calls: int = 20) -> float:
    """Median host time of one call with an idle GPU queue: above the runtime, a call is host-bound."""
    fn()
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return round(sorted(times)[len(times) // 2] * 1000, 3)


def copy_gbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read + written) on `nbytes` (1 GiB: the memory-bound
    ceiling; a workload's own size: what a copy of that size reaches, launch and tail included)."""
    src = torch.randn(max(1, nbytes // 4), device="cuda")
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return round(2 * src.nbytes / ms / 1e6, 1)


def rel_error(got: Any, ref: Any) -> float:
    got = got[0] if isinstance(got, (tuple, list)) else got
    ref = ref[0] if isinstance(ref, (tuple, list)) else ref
    diff = (got.double() - ref.double()).norm()
    return float(diff / ref.double().norm().clamp_min(1e-30))


def artifact_bytes(cache_dir: Path, keys: list[str]) -> int:
    from fxcc.compiler_core.artifact import load_artifact

    total = 0
    for key in keys:
        art = load_artifact(cache_dir / "artifacts", key)
        if art is not None:
            total += len(art.manifest_json()) + sum(len(b) for b in art.blobs.values())
    return total


def measure(name: str) -> dict[str, Any]:
    from bench.workloads import make_workload
    from fxcc.client import backend, cuda_graphs, cuda_loader
    from fxcc.client.backend import fxcc_backend
    from fxcc.compiler_core.build import cuda_build_unavailable

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    res: dict[str, Any] = {"name": name, "copy_gbps": copy_gbps()}
    w = make_workload(name)
    res["dtype"] = w.dtype
    fn, inputs = w.fn, w.inputs
    with torch.no_grad():
        ref = fn(*inputs)
        res["eager_ms"] = bench_ms(lambda: fn(*inputs))
        res["eager_device_ms"] = device_ms(lambda: fn(*inputs))
        res["eager_peak_mb"] = peak_mb(lambda: fn(*inputs))

        from torch._inductor import metrics

        torch._dynamo.reset()
        metrics.reset()
        t0 = time.perf_counter()
        ind = torch.compile(fn)
        out = ind(*inputs)
        torch.cuda.synchronize()
        res["inductor_compile_s"] = round(time.perf_counter() - t0, 2)
        res["kernels_inductor"] = metrics.generated_kernel_count
        res["inductor_rel_err"] = rel_error(out, ref)
        del out
        reserved = Reserved()
        reserved.start()
        res["inductor_peak_mb"] = peak_mb(lambda: ind(*inputs))
        for _ in range(2):
            ind(*inputs)
        res["inductor_reserved_mb"] = reserved.mb()
        res["inductor_ms_spread"] = {}
        res["inductor_ms"] = bench_ms(lambda: ind(*inputs), res["inductor_ms_spread"])
        res["inductor_device_ms"] = device_ms(lambda: ind(*inputs))
        res["inductor_host_ms"] = host_ms(lambda: ind(*inputs))

        torch._dynamo.reset()
        backend.clear_events()
        res["fxcc_builds_cubins"] = cuda_build_unavailable() is None
        t0 = time.perf_counter()
        fx = torch.compile(fn, backend=fxcc_backend)
        out = fx(*inputs)
        torch.cuda.synchronize()
        res["fxcc_compile_s"] = round(time.perf_counter() - t0, 2)
        evs = backend.events()
        res["fxcc_graphs"] = len(evs)
        res["fxcc_sources"] = sorted({e.source for e in evs})
        res["fxcc_errors"] = sorted({e.error for e in evs if e.error})[:5]
        res["kernels_fxcc"] = sum(e.stats.kernels for e in evs if e.stats)
        res["fxcc_extern_nodes"] = sum(e.stats.nodes_extern for e in evs if e.stats)
        res["fxcc_rel_err"] = rel_error(out, ref)
        del out
        reserved.start()
        # Note: the second call is the one that captures a CUDA graph (client/cuda_graphs.py);
        # its allocations are the graph pool's, held from then on, so its peak is the honest one
        # (a replay allocates only the copies of its outputs).
        res["fxcc_peak_mb"] = peak_mb(lambda: fx(*inputs))
        for _ in range(2):
            fx(*inputs)
        res["fxcc_reserved_mb"] = reserved.mb()
        res["fxcc_ms_spread"] = {}
        res["fxcc_ms"] = bench_ms(lambda: fx(*inputs), res["fxcc_ms_spread"])
        res["fxcc_device_ms"] = device_ms(lambda: fx(*inputs))
        res["fxcc_replay_peak_mb"] = peak_mb(lambda: fx(*inputs))
        res["fxcc_host_ms"] = host_ms(lambda: fx(*inputs))
        res["fxcc_extern_ops"] = sorted({o for e in evs if e.stats for o in e.stats.extern_ops})
        res["artifact_bytes"] = artifact_bytes(Path(os.environ["FXCC_CACHE_DIR"]),
                                               [e.key for e in evs if e.key])
        res["fxcc_cubin_modules_loaded"] = cuda_loader.stats.modules_loaded
        res["fxcc_jit_fallbacks"] = cuda_loader.stats.jit_fallbacks
        res["fxcc_graph_captures"] = cuda_graphs.stats.captures
        res["fxcc_graph_replays"] = cuda_graphs.stats.replays
        res["fxcc_graph_pool_mb"] = round(cuda_graphs.stats.pool_bytes / 2**20, 1)
        res["fxcc_graph_off"] = cuda_graphs.stats.disabled[:3]
        if name == "cos_sin":
            res.update(handmade_cos_sin(inputs[0], ref))
    res["fxcc_vs_inductor"] = round(res["fxcc_ms"] / res["inductor_ms"], 3)
    res["fxcc_vs_inductor_device"] = round(res["fxcc_device_ms"] / res["inductor_device_ms"], 3)
    if w.min_bytes:
        for k in ("eager", "inductor", "fxcc"):
            res[f"{k}_gbps"] = round(w.min_bytes / res[f"{k}_ms"] / 1e6, 1)
        res["gbps"] = res["fxcc_gbps"]
        res["fxcc_pct_of_copy"] = round(100 * res["fxcc_gbps"] / res["copy_gbps"], 1)
        # a copy moving the workload's own bytes (half read, half written)
        res["copy_same_bytes_gbps"] = copy_gbps(w.min_bytes // 2)
        res["fxcc_pct_of_same_copy"] = round(100 * res["fxcc_gbps"] / res["copy_same_bytes_gbps"], 1)
    return res


def handmade_cos_sin(x: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    """The hand-written fused kernel's artifact run from its cubin by the plan runner (no Dynamo):
    what the loader delivers once the codegen fuses cos(sin(x))."""
    from bench.handmade import cos_sin_artifact, cos_sin_request
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.build import build_artifact

    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    request = cos_sin_request(x.numel(), arch=arch)
    runner = load_plan(build_artifact(cos_sin_artifact(request), request, arch))
    out = runner([x])[0]
    ms = bench_ms(lambda: runner([x]))
    return {"handmade_fxcc_ms": ms, "handmade_rel_err": rel_error(out, ref),
            "handmade_gbps": round(2 * x.nbytes / ms / 1e6, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workload", required=True)
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args()
    res = measure(a.workload)
    a.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


if __name__ == "__main__":
    main()

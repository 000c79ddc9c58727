"""Where a workload's GPU time goes: the top CUDA kernels under eager, Inductor and fxcc.

A diagnostic, not a benchmark: `python -m bench.profile_kernels --workload gpt2_small` prints,
per compiler, the kernels with the most total CUDA time over a few calls (torch.profiler), so
a gap between fxcc and Inductor can be placed on the kernels that make it.

    python3 -m bench.profile_kernels --model bert_train --out $OUT     # a bench/model_zoo.py model
    python3 -m bench.profile_kernels --model gpt2 --memory --out $OUT  # and where fxcc's memory is

`--model` takes the models suite's names (bench/model_zoo.py; a training model runs its whole step:
forward, backward, AdamW) and also prints each compiler's device time per kind of kernel (Triton,
GEMM, cuDNN, aten's own, copies). `--memory` adds, after the calls, the allocator's segments (torch's
memory snapshot) by pool: how much fxcc's CUDA-graph pool reserved, how much of it is allocated at
the end, and its largest blocks; and, before the profiled calls, the first five calls one by one
(`calls`: each call's peak, what stays allocated and reserved after it, fxcc's captures, replays and
step-by-step calls so far): which call makes the peak (the compile, the step-by-step warm-up, a
capture, a recapture of a training backward). With `--out` all of it goes into
DIR/profile-<model>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.workloads import WORKLOADS

MB = 1 << 20


def top_kernels(fn, inputs, calls: int = 5, top: int = 15, grad: bool = False) -> list[tuple[str, float, int]]:
    from torch.profiler import ProfilerActivity, profile

    with torch.set_grad_enabled(grad):
        for _ in range(3):
            fn(*inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*inputs)
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append((e.key, t / 1000 / calls, e.count // calls))
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


KINDS = (("attention", ("flash", "fmha", "attention")), ("triton", ("triton_", "fxcc_")),
         ("gemm", ("gemm", "sm90_", "cutlass", "cublas", "xmma", "nvjet")),
         ("cudnn", ("cudnn", "conv", "nchwToNhwc", "nhwcToNchw", "implicit_convolve", "winograd")),
         ("copy", ("memcpy", "memset", "copy")))


def kind_of(name: str) -> str:
    """A profiler kernel name's kind: attention, triton (Inductor's triton_*, fxcc's fxcc_*), gemm, cudnn,
    copy, or aten (the rest)."""
    low = name.lower()
    for kind, marks in KINDS:
        if any(m.lower() in low for m in marks):
            return kind
    return "aten"


def by_kind(rows: list[tuple[str, float, int]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, ms, count in rows:
        k = out.setdefault(kind_of(name), {"ms": 0.0, "launches": 0})
        k["ms"] = round(k["ms"] + ms, 4)
        k["launches"] += count
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms"]))


def memory_by_pool() -> list[dict[str, Any]]:
    """The caching allocator's segments grouped by pool (0: the default pool; others are CUDA-graph
    pools): reserved and allocated MB, segment count, the largest allocated blocks."""
    pools: dict[str, dict[str, Any]] = {}
    for seg in torch.cuda.memory_snapshot():
        pool = str(seg.get("segment_pool_id", (0, 0)))
        p = pools.setdefault(pool, {"pool": pool, "segments": 0, "reserved_mb": 0.0, "allocated_mb": 0.0,
                                    "largest_blocks_mb": []})
        p["segments"] += 1
        p["reserved_mb"] += seg["total_size"] / MB
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                p["allocated_mb"] += b["size"] / MB
                p["largest_blocks_mb"].append(round(b["size"] / MB, 1))
    for p in pools.values():
        p["reserved_mb"], p["allocated_mb"] = round(p["reserved_mb"], 1), round(p["allocated_mb"], 1)
        p["largest_blocks_mb"] = sorted(p["largest_blocks_mb"], reverse=True)[:12]
    return sorted(pools.values(), key=lambda p: -p["reserved_mb"])


def memory_trace(call: Any, base: int, calls: int = 5, grad: bool = False) -> list[dict[str, Any]]:
    """The first `calls` calls one by one (the compile, the step-by-step warm-up, the captures, the
    first replays): each call's peak and what stays allocated and reserved after it, in MB beyond
    `base`, with fxcc's CUDA-graph counters so far (captures, replays, step-by-step calls): which
    call makes a compiler's peak, and what each graph capture holds."""
    from fxcc.client import cuda_graphs

    out = []
    with torch.set_grad_enabled(grad):
        for i in range(calls):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            call()
            torch.cuda.synchronize()
            st = cuda_graphs.stats
            out.append({"call": i + 1, "peak_mb": round((torch.cuda.max_memory_allocated() - base) / MB, 1),
                        "allocated_mb": round((torch.cuda.memory_allocated() - base) / MB, 1),
                        "reserved_mb": round(torch.cuda.memory_reserved() / MB, 1),
                        "graphs": {"captures": st.captures, "replays": st.replays, "step_by_step": st.step_by_step,
                                   "copied_in": st.copied_in, "copied_out": st.copied_out, "step_by_step_why": dict(st.step_by_step_why)}})
    return out


def profile_model(name: str, compilers: list[str], memory: bool) -> dict[str, Any]:
    """Top kernels, device time by kind and (with `memory`) the allocator's pools of a zoo model."""
    from bench.model_zoo import ZOO
    from bench.models import PeakWindow, compiled, training_step

    spec = ZOO[name]
    built = spec.build("cuda", False)
    module = built.module.train() if spec.kind == "training" else built.module.eval()
    out: dict[str, Any] = {"model": name, "source": spec.source, "kind": spec.kind, "compilers": {}}
    for compiler in compilers:
        mode = {"inductor": "inductor_default", "inductor_ro": "inductor_reduce_overhead"}.get(compiler, compiler)
        for p in module.parameters():
            p.grad = None  # the last compiler's gradients, optimizer state and caches gone first
        window = PeakWindow("cuda")
        window.start()
        base = window.base
        fn = compiled(mode, module)
        if spec.kind == "training":
            params = [p for p in module.parameters() if p.requires_grad]
            call = training_step(fn, torch.optim.AdamW(params, lr=1e-4, fused=True), built.inputs)
        else:
            def call(fn: Any = fn, mark: bool = mode == "inductor_reduce_overhead") -> Any:
                if mark:
                    torch.compiler.cudagraph_mark_step_begin()
                return fn(*built.inputs)
        trace = memory_trace(call, base, grad=spec.kind == "training") if memory else []
        rows = top_kernels(call, (), top=10_000, grad=spec.kind == "training")
        total = sum(r[1] for r in rows)
        peak = max([(torch.cuda.max_memory_allocated() - base) / MB] + [t["peak_mb"] for t in trace])
        entry: dict[str, Any] = {"device_ms": round(total, 4), "launches": sum(r[2] for r in rows),
                                 "by_kind": by_kind(rows),
                                 "top": [{"name": n[:160], "ms": round(ms, 4), "count": c} for n, ms, c in rows[:25]],
                                 "peak_mb": round(peak, 1)}
        if memory:
            entry["pools"] = memory_by_pool()
            entry["calls"] = trace
        if compiler == "fxcc":
            from fxcc.client import cuda_graphs

            st = cuda_graphs.stats
            entry["graph_pool_mb"] = round(st.pool_bytes / MB, 1)
            entry["graphs"] = {"captures": st.captures, "replays": st.replays, "step_by_step": st.step_by_step,
                               "copied_in": st.copied_in, "copied_out": st.copied_out, "step_by_step_why": dict(st.step_by_step_why),
                               "disabled": sorted(set(st.disabled))[:6]}
            print(f"   fxcc graphs: {json.dumps(entry['graphs'])}", flush=True)
        print(f"== {name} {compiler}: {total:.3f} ms of device time a call, {entry['launches']} launches; "
              f"peak {entry['peak_mb']} MB; by kind {json.dumps(entry['by_kind'])}", flush=True)
        for r in entry["top"][:15]:
            print(f"{r['ms']:8.3f} ms  x{r['count']:<4d} {r['name'][:110]}", flush=True)
        for t in entry.get("calls", []):
            print(f"   call {t['call']}: peak {t['peak_mb']} MB, then {t['allocated_mb']} allocated, "
                  f"{t['reserved_mb']} reserved; graphs {t.get('graphs')}", flush=True)
        for p in entry.get("pools", []):
            print(f"   pool {p['pool']}: {p['segments']} segments, {p['reserved_mb']} MB reserved, "
                  f"{p['allocated_mb']} allocated; largest {p['largest_blocks_mb'][:6]}", flush=True)
        out["compilers"][compiler] = entry
        del fn, call  # (and the optimizer the training step holds) before the next compiler's window
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="gpt2_small")
    ap.add_argument("--model", default=None, help="a bench/model_zoo.py model (gpt2, bert_train, resnet18_train...)")
    ap.add_argument("--compilers", default="inductor,fxcc",
                    help="eager, inductor, inductor_ro (reduce-overhead, --model only), fxcc")
    ap.add_argument("--memory", action="store_true", help="--model: the allocator's pools after the calls")
    ap.add_argument("--out", default=None, help="--model: write DIR/profile-<model>.json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    os.environ.setdefault("FXCC_CACHE_DIR", tempfile.mkdtemp(prefix="fxcc-prof-"))
    if args.model is not None:
        doc = profile_model(args.model, args.compilers.split(","), args.memory)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"profile-{args.model}.json").write_text(json.dumps(doc, indent=1))
        return
    for compiler in args.compilers.split(","):
        torch._dynamo.reset()
        wl = WORKLOADS[args.workload]("cuda")
        backend = compiler
        if compiler == "fxcc":
            from fxcc.client.backend import fxcc_backend

            backend = fxcc_backend  # works without the package's entry point
        fn = wl.fn if compiler == "eager" else torch.compile(wl.fn, backend=backend)
        rows = top_kernels(fn, wl.inputs)
        total = sum(r[1] for r in rows)
        print(f"== {args.workload} {compiler}: top kernels, ms per call (sum of shown {total:.3f})")
        for name, ms, count in rows:
            print(f"{ms:8.3f} ms  x{count:<4d} {name[:110]}")
        if compiler == "fxcc":
            from fxcc.client import runtime

            print(f"extern results copied into the planned layout: {sorted(runtime._relaid)}")


if __name__ == "__main__":
    main()

"""Where a workload's GPU time goes: the top CUDA kernels under eager, Inductor and fxcc.

A diagnostic, not a benchmark: `python -m bench.profile_kernels --workload gpt2_small` prints,
per compiler, the kernels with the most total CUDA time over a few calls (torch.profiler), so
a gap between fxcc and Inductor can be placed on the kernels that make it.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

from bench.workloads import WORKLOADS


def top_kernels(fn, inputs, calls: int = 5, top: int = 15) -> list[tuple[str, float, int]]:
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="gpt2_small")
    ap.add_argument("--compilers", default="inductor,fxcc")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    os.environ.setdefault("FXCC_CACHE_DIR", tempfile.mkdtemp(prefix="fxcc-prof-"))
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

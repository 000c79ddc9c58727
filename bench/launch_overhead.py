"""Host cost per launch of a tiny kernel: fxcc's cubin launcher vs Triton's JIT launcher, and
per call of a tiny compiled graph: fxcc vs Inductor (both through torch.compile).

`python -m bench.launch_overhead` prints one JSON line. Each number is wall time per call over
many back-to-back calls on a 1024-element tensor, so the GPU is never the bottleneck.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch


def per_call_us(fn: Callable[[], Any], calls: int = 5000) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return round(best, 2)


def main() -> None:
    from bench.handmade import cos_sin_artifact, cos_sin_request
    from fxcc.client import cuda_loader
    from fxcc.client.backend import fxcc_backend
    from fxcc.client.cuda_loader import CubinKernel, LaunchMeta, StepLauncher
    from fxcc.client.runtime import load_kernel, load_plan
    from fxcc.compiler_core.build import build_artifact

    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    n = 1024
    request = cos_sin_request(n, arch=arch)
    art = build_artifact(cos_sin_artifact(request), request, arch)
    info = art.manifest.kernels[0]
    key = f"sm_{arch}"
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    res: dict[str, Any] = {"elements": n}

    kernel = CubinKernel(art.blobs[info.binaries[key].digest], LaunchMeta.from_metadata(info.metadata, key))
    launcher = StepLauncher(kernel, [1], ["x", "out", n])
    dev = x.device.index
    res["cubin_launch_us"] = per_call_us(lambda: launcher([x, out], dev))
    fn, stream = kernel.handle(dev), torch.cuda.current_stream().cuda_stream
    res["driver_call_only_us"] = per_call_us(  # cuLaunchKernel through ctypes, args pre-packed
        lambda: cuda_loader._launch(fn, 1, 1, 1, launcher.block, 0, stream, launcher.params_addr, dev))

    jit = load_kernel(info, art.blobs[info.source.digest])
    res["triton_jit_launch_us"] = per_call_us(lambda: jit[(1,)](x, out, n, XBLOCK=1024, num_warps=4))

    runner = load_plan(art)
    res["fxcc_plan_call_us"] = per_call_us(lambda: runner([x]))

    def cos_sin(t: torch.Tensor) -> torch.Tensor:
        return torch.cos(torch.sin(t))

    with torch.no_grad():
        fx = torch.compile(cos_sin, backend=fxcc_backend)
        res["fxcc_compiled_call_us"] = per_call_us(lambda: fx(x))
        torch._dynamo.reset()
        ind = torch.compile(cos_sin)
        res["inductor_compiled_call_us"] = per_call_us(lambda: ind(x))
        res["eager_call_us"] = per_call_us(lambda: cos_sin(x))
    print(json.dumps(res))


if __name__ == "__main__":
    main()

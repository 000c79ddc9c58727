"""First-call latency in a fresh process: torch.compile + the first call, until its result is ready.

`python -m bench.first_call --workload cos_sin --compiler inductor|fxcc [--tiny]`. Caches come
from the environment (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, FXCC_CACHE_DIR; FXCC_URL for fxcc
through a service), so the parent decides cold (empty) or warm (filled). CUDA start-up and input
creation happen before the clock starts; imports of torch._dynamo / _inductor / fxcc happen after
it (they are part of what a first call costs). `--tiny` runs a CPU-sized version on the CPU
(kernels in Triton's interpreter: set TRITON_INTERPRET=1), to check the scripts without a GPU.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workload", required=True)
    p.add_argument("--compiler", choices=("inductor", "fxcc"), required=True)
    p.add_argument("--tiny", action="store_true", help="a CPU-sized workload on the CPU")
    a = p.parse_args()

    from bench.workloads import make_workload

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    w = make_workload(a.workload, tiny=a.tiny)
    sync = (lambda: None) if a.tiny else torch.cuda.synchronize
    sync()
    t0 = time.perf_counter()
    importlib.import_module("torch._dynamo")  # timed apart: both compilers pay it

    if a.compiler == "fxcc":
        from client.backend import fxcc_backend
    t_imports = time.perf_counter() - t0
    compiled = torch.compile(w.fn) if a.compiler == "inductor" else torch.compile(w.fn, backend=fxcc_backend)
    with torch.no_grad():
        compiled(*w.inputs)
    sync()
    res: dict[str, object] = {"first_call_s": round(time.perf_counter() - t0, 3),
                              "imports_s": round(t_imports, 3),
                              "inductor_imported": "torch._inductor.compile_fx" in sys.modules}
    if a.compiler == "fxcc":
        from client import backend, cuda_loader

        res["sources"] = sorted({e.source for e in backend.events()})
        # fxcc's own share: from AOTAutograd's graph to a loaded plan (capture, key, cache or
        # service, digest checks, module loads); the rest after the imports is Dynamo + AOTAutograd.
        res["fxcc_own_s"] = round(sum(e.seconds for e in backend.events()), 3)
        res["cubin_modules_loaded"] = cuda_loader.stats.modules_loaded
        res["jit_fallbacks"] = cuda_loader.stats.jit_fallbacks
    print(json.dumps(res))


if __name__ == "__main__":
    main()

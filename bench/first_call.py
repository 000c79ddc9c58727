"""First-call latency in a fresh process: torch.compile + the first call, until its result is ready.

`python -m bench.first_call --workload cos_sin --compiler inductor|fxcc [--tiny] [--split]`. Caches
come from the environment (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, FXCC_CACHE_DIR; FXCC_URL for
fxcc through a service), so the parent decides cold (empty) or warm (filled). CUDA start-up and
input creation happen before the clock starts; imports of torch._dynamo / _inductor / fxcc happen
after it (they are part of what a first call costs). `--tiny` runs a CPU-sized version on the CPU
(kernels in Triton's interpreter: set TRITON_INTERPRET=1), to check the scripts without a GPU;
`--device cpu` runs the bench-size workload on the CPU.

`--split` (fxcc only) says where the first call's time went: imports, Dynamo (tracing, guards,
bytecode: what is left), AOTAutograd (decompositions, functionalization, partitioning: the
backend's time outside fxcc's compilers), fxcc's own work (capture, key, cache, loading the plan)
and the first run of the compiled graphs; and whether the pre-AOT cache served the graphs
(`pre_aot`: hit/miss/off per graph, AOTAutograd then not run). `--no-run` (with `--split`) stops
when the first graph is compiled, before it runs: for workloads too slow to run on a CPU
(ResNet-50 at bench size in Triton's interpreter); the cache is filled all the same.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


class _CompiledOnly(Exception):
    """Raised by --no-run in place of the first run of a compiled graph."""


class Split:
    """Times spent in fxcc's backend (AOTAutograd + fxcc) and in the compiled graphs' runs."""

    def __init__(self, no_run: bool) -> None:
        self.backend_s = 0.0
        self.run_s = 0.0
        self.graphs = 0
        self.no_run = no_run

    def backend(self, fxcc_backend: Callable) -> Callable:
        def timed(gm: Any, example_inputs: list[Any], **kwargs: Any) -> Callable:
            t0 = time.perf_counter()
            try:
                return self._timed_run(fxcc_backend(gm, example_inputs, **kwargs))
            finally:
                self.backend_s += time.perf_counter() - t0
                self.graphs += 1
        return timed

    def _timed_run(self, fn: Callable) -> Callable:
        def run(*args: Any) -> Any:
            if self.no_run:
                raise _CompiledOnly
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.run_s += time.perf_counter() - t0
        return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workload", required=True)
    p.add_argument("--compiler", choices=("inductor", "fxcc"), required=True)
    p.add_argument("--tiny", action="store_true", help="a CPU-sized workload on the CPU")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu: the bench-size workload there")
    p.add_argument("--split", action="store_true", help="fxcc: imports / Dynamo / AOTAutograd / fxcc / run")
    p.add_argument("--no-run", action="store_true", help="with --split: stop before the first run")
    a = p.parse_args()
    if a.no_run and not (a.split and a.compiler == "fxcc"):
        p.error("--no-run needs --split and --compiler fxcc")

    from bench.workloads import make_workload

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    w = make_workload(a.workload, device=a.device, tiny=a.tiny)
    on_gpu = not a.tiny and a.device.startswith("cuda")
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    sync()
    t0 = time.perf_counter()
    importlib.import_module("torch._dynamo")  # timed apart: both compilers pay it

    if a.compiler == "fxcc":
        from fxcc.client.backend import fxcc_backend
    t_imports = time.perf_counter() - t0
    split = Split(a.no_run) if a.split and a.compiler == "fxcc" else None
    if a.compiler == "inductor":
        compiled = torch.compile(w.fn)
    else:
        compiled = torch.compile(w.fn, backend=split.backend(fxcc_backend) if split else fxcc_backend)
    ran = True
    with torch.no_grad():
        try:
            compiled(*w.inputs)
        except _CompiledOnly:
            ran = False
    sync()
    total = time.perf_counter() - t0
    res: dict[str, object] = {"first_call_s": round(total, 3),
                              "imports_s": round(t_imports, 3),
                              "inductor_imported": "torch._inductor.compile_fx" in sys.modules}
    if a.compiler == "fxcc":
        from fxcc.client import backend, cuda_loader

        evs = backend.events()
        res["sources"] = sorted({e.source for e in evs})
        # fxcc's own share: from AOTAutograd's graph to a loaded plan (capture, key, cache or
        # service, digest checks, module loads); the rest after the imports is Dynamo + AOTAutograd.
        own = sum(e.seconds for e in evs)
        res["fxcc_own_s"] = round(own, 3)
        res["cubin_modules_loaded"] = cuda_loader.stats.modules_loaded
        res["jit_fallbacks"] = cuda_loader.stats.jit_fallbacks
        if split is not None:
            aot = max(0.0, split.backend_s - own)
            rest = total - t_imports
            res.update({
                "dynamo_graphs": split.graphs,
                "dynamo_s": round(rest - split.backend_s - split.run_s, 3),
                "aot_s": round(aot, 3),
                "aot_share": round(aot / total, 3) if total else None,
                "run_s": round(split.run_s, 3) if ran else None,
                "pre_aot": [getattr(e, "pre_aot", "n/a") for e in evs],
                "aot_runs": getattr(backend, "aot_runs", lambda: None)(),
            })
    print(json.dumps(res))


if __name__ == "__main__":
    main()

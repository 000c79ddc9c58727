"""One worker's cold compile of a many-kernel graph, its kernels built in its compile process or by
build tasks over 1..N build processes (issue 25 part 2). No GPU needed: CUDA targets cross-compile.

    python -m bench.build_pool [--layers 6] [--processes 1 2] [--arch 90]

The graph: fxcc's GPT-2 example (`client/examples.py`, `--layers` layers, d 256, 4 heads, vocab 4096)
at batch 2 × 64, traced for a CUDA target. For each configuration, a fresh embedded store and an
empty TRITON_CACHE_DIR, one compile consumer and (for build tasks) N build consumers, all warm
before the clock starts; then one compile job, timed from submit to done. Prints one JSON line per
configuration: the job's total and its building stage in seconds, the kernels and build tasks, and
the speed-up of building against the compile process's own one-by-one build.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target


def gpt2_request(layers: int, arch: int) -> CompileRequest:
    import torch

    from bench.plan_memory import capture
    from fxcc.client.examples import GPT2

    torch.manual_seed(0)
    model = GPT2(vocab=4096, d=256, layers=layers, heads=4).eval()
    specs = capture(model, (torch.randint(0, 4096, (2, 64)),), "cuda")
    return CompileRequest(graph=specs[0], options=CompileOptions(target=Target(kind="cuda", arch=arch)))


def one_run(request: CompileRequest, processes: int, root: Path) -> dict[str, Any]:
    """`processes` 0: the compile process builds; else build tasks over that many build processes."""
    from fxcc.service.embedded_store import EmbeddedStore
    from fxcc.worker.builds import start_build_consumers
    from fxcc.worker.limits import JobLimits
    from fxcc.worker.loop import Consumer
    from fxcc.worker.process import JobPolicy

    os.environ["TRITON_CACHE_DIR"] = str(root / "triton")  # the processes started below inherit it
    store = EmbeddedStore(root / "store")
    stop = threading.Event()
    consumer = Consumer(store, "compiler", stop, block_ms=20, policy=JobPolicy(build_tasks=processes > 0))
    builders = start_build_consumers(store, "w", processes, stop, limits=JobLimits(), max_attempts=3, block_ms=20)
    consumer.thread.start()
    try:
        while not (consumer.ready and all(b.ready for b in builders)):
            time.sleep(0.05)
        t0 = time.perf_counter()
        job_id = store.submit(compile_key(request), request.model_dump_json(), "interactive").job_id
        while not (job := store.get_job(job_id)).finished:
            time.sleep(0.01)
        total_s = time.perf_counter() - t0
    finally:
        stop.set()
        for c in (consumer, *builders):
            c.thread.join(timeout=30)
    art = store.get_artifact(job.key)
    stages = job.stages
    return {"build_processes": processes, "state": job.state.value, "total_s": round(total_s, 3),
            "building_s": round(stages["storing"] - stages["building"], 3) if "building" in stages else None,
            "kernels": len(art.manifest.kernels) if art else None, "build_tasks": len(job.tasks),
            "binaries": sum(1 for k in art.manifest.kernels if k.binaries) if art else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--arch", type=int, default=90)
    a = p.parse_args()
    request = gpt2_request(a.layers, a.arch)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fxcc-bench-build-pool-") as tmp:
        for n in (0, *a.processes):
            row = {"layers": a.layers, "cores": os.cpu_count(), **one_run(request, n, Path(tmp) / f"p{n}")}
            if rows and row["building_s"] and rows[0]["building_s"]:
                row["building_speedup"] = round(rows[0]["building_s"] / row["building_s"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

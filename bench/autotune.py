"""Autotuning on a GPU: each workload's plan untuned (heuristic configs) and tuned, in one process.

    python -m bench.autotune --workloads fast --max-autotune softmax --out bench/results/autotune.json

Per workload and mode: kernels, candidates benchmarked, seconds spent tuning, the plan's time
untuned and tuned (median of do_bench, same process), and each kernel's heuristic and winning
config with their times. Results are written after every workload (a timeout keeps what is done).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from bench.measure import bench_ms, rel_error
from bench.workloads import FAST, WORKLOADS, make_workload


def _request(fn: Any, inputs: tuple[torch.Tensor, ...], mode: str) -> tuple[Any, list[torch.Tensor]]:
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph
    from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target

    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    cap = capture_graph(gm, list(inputs))
    major, minor = torch.cuda.get_device_capability()
    options = CompileOptions(mode=mode, target=Target(kind="cuda", arch=major * 10 + minor))
    return CompileRequest(graph=cap.spec, options=options), list(inputs) + cap.constants


def measure(name: str, mode: str) -> dict[str, Any]:
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_and_build

    w = make_workload(name)
    request, args = _request(w.fn, w.inputs, mode)
    with torch.no_grad():
        ref = w.fn(*w.inputs)
    row: dict[str, Any] = {"name": name, "mode": mode}
    untuned = compile_and_build(request)
    t0 = time.perf_counter()
    tuned = compile_and_build(request, tune_device="cuda")
    row["tune_s"] = round(time.perf_counter() - t0, 2)
    row["tuned"] = tuned.manifest.tuned
    row["kernels"] = len(tuned.manifest.kernels)
    for label, art in (("untuned", untuned), ("tuned", tuned)):
        run = load_plan(art)
        out = run(args)
        row[f"{label}_rel_err"] = rel_error(out[0] if len(out) == 1 else out, ref)
        row[f"{label}_ms"] = bench_ms(lambda run=run: run(args))
    row["tuned_vs_untuned"] = round(row["tuned_ms"] / row["untuned_ms"], 3)
    row["per_kernel"] = [
        {"kernel": k.name, "sizes": k.tuning.sizes, "candidates": len(k.tuning.timings_ms) + len(k.tuning.rejected),
         "rejected": len(k.tuning.rejected), "heuristic": k.tuning.heuristic,
         "heuristic_ms": k.tuning.timings_ms[k.tuning.heuristic], "winner": k.tuning.winner,
         "winner_ms": k.tuning.timings_ms[k.tuning.winner]}
        for k in tuned.manifest.kernels if k.tuning is not None]
    row["candidates"] = sum(k["candidates"] for k in row["per_kernel"])
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="fast", help="names, comma-separated, or `fast`")
    p.add_argument("--max-autotune", default="", help="workloads to tune again in max-autotune mode")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    names = list(FAST) if a.workloads == "fast" else a.workloads.split(",")
    runs = [(n, "default") for n in names] + [(n, "max-autotune") for n in a.max_autotune.split(",") if n]
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "notes": "ms: median of triton.testing.do_bench of the whole plan, one process",
                           "rows": []}
    for name, mode in runs:
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload {name}")
        row = measure(name, mode)
        doc["rows"].append(row)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=1))
        print(f"{name:20s} {mode:13s} kernels {row['kernels']:3d} candidates {row['candidates']:4d} "
              f"tune {row['tune_s']:7.1f} s  untuned {row['untuned_ms']:.4f} ms  tuned {row['tuned_ms']:.4f} ms "
              f"({row['tuned_vs_untuned']:.3f})  err {row['tuned_rel_err']:.2e}", flush=True)
        for k in row["per_kernel"]:
            print(f"    {k['sizes']!s:16s} {k['heuristic']:28s} {k['heuristic_ms']:.4f} -> "
                  f"{k['winner']:28s} {k['winner_ms']:.4f}", flush=True)


if __name__ == "__main__":
    main()

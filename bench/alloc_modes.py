"""Does a memory-bound kernel's do_bench time depend on where its buffers landed?

A diagnostic, not a benchmark: `python -m bench.alloc_modes --workload bias_gelu_ln_fp32`.
Session 4 saw the same LayerNorm kernel measure about 45 or 70 µs depending on the process, for
Inductor and fxcc alike but independently of each other. This compiles the workload under both,
then measures each in several allocation states of one process: between states it keeps the last
outputs alive, so the next calls' outputs (and do_bench's L2-flush buffer) land at new addresses.
Per state it prints each compiler's do_bench median, a back-to-back time (events around 100 calls,
no flush), a copy of the input into a fresh buffer, and the outputs' addresses. One JSON line per
state, then a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import torch


def back_to_back_ms(fn, calls: int = 100) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def main() -> None:
    from triton.testing import do_bench

    from bench.workloads import make_workload
    from fxcc.client.backend import fxcc_backend

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workload", default="bias_gelu_ln_fp32")
    ap.add_argument("--states", type=int, default=8)
    a = ap.parse_args()
    os.environ.setdefault("FXCC_CACHE_DIR", tempfile.mkdtemp(prefix="fxcc-modes-"))
    w = make_workload(a.workload)
    x = w.inputs[0]
    fns = {}
    with torch.no_grad():
        for name, backend in (("inductor", "inductor"), ("fxcc", fxcc_backend)):
            torch._dynamo.reset()
            fns[name] = torch.compile(w.fn, backend=backend)
            fns[name](*w.inputs)
        fns["copy"] = lambda: torch.empty_like(x).copy_(x)
        keep = []
        rows = []
        for state in range(a.states):
            row: dict[str, object] = {"state": state}
            for name, fn in fns.items():
                call = (lambda fn=fn: fn(*w.inputs)) if name != "copy" else fn
                out = call()
                out = out[0] if isinstance(out, (tuple, list)) else out
                row[f"{name}_ptr_mb"] = round(out.data_ptr() / 2**20, 1)
                del out
                row[f"{name}_ms"] = round(float(do_bench(call, warmup=25, rep=200, return_mode="median")), 4)
                row[f"{name}_b2b_ms"] = round(back_to_back_ms(call), 4)
            rows.append(row)
            print(json.dumps(row), flush=True)
            for fn in (fns["inductor"], fns["fxcc"]):  # hold outputs: the next state allocates anew
                keep.append(fn(*w.inputs))
            keep.append(torch.empty(int(1.5 * 2**20) * (state + 1), dtype=torch.uint8, device="cuda"))
    summary = {k: [r[k] for r in rows] for k in rows[0] if k.endswith("_ms")}
    summary = {k: {"min": min(v), "median": statistics.median(v), "max": max(v)} for k, v in summary.items()}
    ratio = [r["fxcc_ms"] / r["inductor_ms"] for r in rows]
    summary["fxcc_vs_inductor_per_state"] = [round(v, 3) for v in ratio]
    summary["fxcc_vs_inductor_median_of_states"] = round(
        statistics.median(r["fxcc_ms"] for r in rows) / statistics.median(r["inductor_ms"] for r in rows), 3)
    print(json.dumps({"summary": summary}, indent=1))


if __name__ == "__main__":
    main()

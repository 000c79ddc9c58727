"""Host time per call of a compiled workload, layer by layer: the whole torch.compile'd call
(Dynamo's guards, AOTAutograd's runtime wrapper, fxcc's wrapper, the plan), fxcc's boxed callable
(what AOTAutograd calls), the plan alone — and Inductor's whole call beside them.

A diagnostic, not a benchmark: `python -m bench.host_layers --workload bias_gelu_ln_fp32`.
Each number is the median host time of one call with an idle GPU queue (bench.measure.host_ms).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

import torch

from bench.measure import host_ms
from bench.workloads import make_workload


def spy_on_plans(seen: list[dict[str, Any]]) -> None:
    """Record each plan fxcc hands to AOTAutograd: its boxed callable, the runner inside it, its
    constants, and the first inputs AOTAutograd passes it."""
    from fxcc.client import graphs

    original = graphs._guarded

    def spy(runner: Any, constants: list[Any], eager: Any, key: str) -> Any:
        boxed = original(runner, constants, eager, key)
        entry: dict[str, Any] = {"boxed": boxed, "runner": runner, "constants": constants, "args": None}

        def recording(args: list[Any]) -> Any:
            if entry["args"] is None:
                entry["args"] = list(args)
            return boxed(args)
        recording._boxed_call = True  # type: ignore[attr-defined]
        seen.append(entry)
        return recording

    graphs._guarded = spy  # type: ignore[assignment]


def layers(name: str, seen: list[dict[str, Any]], calls: int) -> dict[str, Any]:
    from fxcc.client.backend import fxcc_backend

    seen.clear()
    torch._dynamo.reset()
    wl = make_workload(name)
    res: dict[str, Any] = {"workload": name}
    with torch.no_grad():
        fx = torch.compile(wl.fn, backend=fxcc_backend)
        for _ in range(3):
            fx(*wl.inputs)
        res["fxcc_whole_us"] = 1000 * host_ms(lambda: fx(*wl.inputs), calls)
        if len(seen) == 1 and seen[0]["args"] is not None:
            plan = seen[0]
            args, constants = plan["args"], plan["constants"]
            res["runner"] = type(plan["runner"]).__name__
            res["inputs"], res["constants"] = len(args), len(constants)
            res["fxcc_boxed_us"] = 1000 * host_ms(lambda: plan["boxed"](list(args)), calls)
            res["fxcc_plan_us"] = 1000 * host_ms(lambda: plan["runner"](list(args) + constants), calls)
        else:
            res["graphs"] = len(seen)
        torch._dynamo.reset()
        ind = torch.compile(wl.fn)
        for _ in range(3):
            ind(*wl.inputs)
        res["inductor_whole_us"] = 1000 * host_ms(lambda: ind(*wl.inputs), calls)
        res["eager_us"] = 1000 * host_ms(lambda: wl.fn(*wl.inputs), calls)
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", action="append", default=None)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    os.environ.setdefault("FXCC_CACHE_DIR", tempfile.mkdtemp(prefix="fxcc-host-"))
    seen: list[dict[str, Any]] = []
    spy_on_plans(seen)
    for name in args.workload or ["bias_gelu_ln_fp32"]:
        print(json.dumps(layers(name, seen, args.calls)), flush=True)


if __name__ == "__main__":
    main()

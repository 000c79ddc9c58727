"""What repeating an earlier node's metadata saves the service's check and a worker's compile (issue 25).

    PYTHONPATH=<transformers> .venv/bin/python -m bench.repeats --layers 48 [--rounds 4]   # this CPU, ~2 min

Captures transformers' GPT2LMHeadModel(GPT2Config(n_layer=--layers)), batch 4 × 512, as fxcc's client
would for CUDA (Dynamo and AOTAutograd; nothing runs), then times, alternating over --rounds and
keeping each one's best: the service's request check (compiler_core.graph.propagate_shapes) and a
worker's compile of it for sm_90 with TF32 (pipeline.compile_request: rebuild, passes, lowering,
scheduling, rendering, plan; no cubin builds), once running every node's op on FakeTensors
(`every_op`) and once with nodes that repeat an earlier one taking its outputs' metadata
(`repeats`, compiler_core.graph.Repeats, the default). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from bench import plan_memory
from fxcc.compiler_core import graph, pipeline
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target


class _EveryOp(graph.Repeats):
    def key(self, *args: Any) -> None:
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=a.layers, use_cache=False)).eval()
    ids = torch.randint(0, 50257, (4, 512))
    (spec,) = plan_memory.capture(lambda x: model(x, use_cache=False).logits, (ids,), "cuda")
    request = CompileRequest(graph=spec, options=CompileOptions(target=Target(kind="cuda", arch=90), allow_tf32=True))
    pipeline.compile_request(request)  # imports and per-process memos, as a warm worker has them
    best: dict[str, dict[str, float]] = {}
    real = graph.Repeats
    try:
        for _ in range(a.rounds):
            for name, cls in (("every_op", _EveryOp), ("repeats", real)):
                graph.Repeats = cls
                t = time.perf_counter()
                repeated = graph.propagate_shapes(spec)
                check = time.perf_counter() - t
                t = time.perf_counter()
                pipeline.compile_request(request)
                compile_s = time.perf_counter() - t
                row = best.setdefault(name, {"check_s": check, "compile_s": compile_s, "repeated_nodes": repeated})
                row["check_s"], row["compile_s"] = min(row["check_s"], check), min(row["compile_s"], compile_s)
    finally:
        graph.Repeats = real
    print(json.dumps({"model": f"GPT2LMHeadModel n_layer={a.layers}", "nodes": len(spec.nodes),
                      **{k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in best.items()}}))


if __name__ == "__main__":
    main()

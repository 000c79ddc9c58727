"""Planned memory of the seed TransformerBlock with and without the attention pass (no GPU needed).

    python -m bench.attention_memory                 # full size (batch 32, seq 512, d 1024, 16 heads), sm_90
    python -m bench.attention_memory --small --target interpret

Captures the block's inference graph through AOTAutograd (fake tensors only, nothing runs at full
size), compiles it with and without `fxcc.compiler_core.passes.attention`, and prints per plan:
`peak_alloc_mb` (plan.peak_alloc_bytes: the plan's own AllocStep buffers) and `peak_live_mb` (every
storage alive at once while the plan runs, extern results included, replayed on FakeTensors: what
the device allocator would hold beyond the inputs, before rounding and library workspaces), and
the kernel count. Prints one JSON line. `bench.plan_memory` does the same for every benchmark workload.
"""

from __future__ import annotations

import argparse
import json
from typing import Any
from unittest import mock

import torch

from bench.plan_memory import capture, peak_live_bytes
from fxcc.client.examples import TransformerBlock
from fxcc.compiler_core import pipeline
from fxcc.compiler_core.passes import attention
from fxcc.compiler_core.plan import peak_alloc_bytes
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, GraphSpec, Target

MB = 1 << 20


def capture_block(batch: int, seq: int, d_model: int, heads: int, device: str) -> GraphSpec:
    """The TransformerBlock's inference graph, traced with fake tensors, its inputs on `device`."""
    with torch.device("meta"):
        model = TransformerBlock(d_model, heads).eval()
    model = model.to_empty(device="cpu")
    (spec,) = capture(model, (torch.empty(batch, seq, d_model),), device)
    return spec


def measure(spec: GraphSpec, target: Target, with_pass: bool) -> dict[str, Any]:
    request = CompileRequest(graph=spec, options=CompileOptions(target=target))
    if with_pass:
        art = pipeline.compile_request(request)
    else:
        with mock.patch.object(attention, "fuse_attention", lambda gm, target, allow_tf32=False: False):
            art = pipeline.compile_request(request)
    plan, stats = art.manifest.plan, art.manifest.stats
    return {"kernels": stats.kernels, "extern_ops": stats.extern_ops,
            "peak_alloc_mb": round(peak_alloc_bytes(plan.steps, plan.outputs) / MB, 1),
            "peak_live_mb": round(peak_live_bytes(plan, spec) / MB, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="batch 2, seq 32, d 64, 4 heads")
    p.add_argument("--target", choices=("cuda", "interpret"), default="cuda")
    a = p.parse_args()
    dims = (2, 32, 64, 4) if a.small else (32, 512, 1024, 16)
    target = Target(kind="cuda", arch=90) if a.target == "cuda" else Target(kind="interpret")
    spec = capture_block(*dims, device="cuda" if a.target == "cuda" else "cpu")
    print(json.dumps({"shape": dict(zip(("batch", "seq", "d_model", "heads"), dims)), "target": a.target,
                      "before": measure(spec, target, False), "after": measure(spec, target, True)}))


if __name__ == "__main__":
    main()

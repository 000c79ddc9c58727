"""The reduction kernels of a ResNet-18 training step compiled for an H200, described on a CPU.

`python -m bench.reduction_shapes [--batch 32] [--size 224] [--out DIR]`: torchvision's ResNet-18
structure (bench.conv_plan_counts) traced through AOTAutograd as the backend traces it (forward and
backward, channels-last saved activations), each graph compiled for a CUDA sm_90 target with the
layout pass, nothing run on a GPU. Per reduction kernel: xnumel (outputs), rnumel (elements
reduced per output), the tile, programs launched, whether a column (outer) reduction, and the
bytes between the loads of adjacent outputs and of adjacent reduced elements of its widest input
(lanes run along the outputs in a column tile, along the reduced elements in a row tile:
`lane_bytes`). A summary line counts kernels under one wave of the device's SMs and kernels whose
lanes read more than 4 bytes apart, and `read_bytes`: the bytes of the buffers the graph's
reduction kernels load, summed over their launches (each input buffer counted whole, once a launch).
Structure, not timings (bench/README.md has the numbers).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from fxcc.compiler_core.wire import GraphSpec

SM_COUNT = 132  # sm_90 H100/H200, the target's
COLUMNS = ("xnumel", "rnumel", "XBLOCK", "RBLOCK", "programs", "column", "x_step_bytes", "r_step_bytes",
           "lane_bytes", "run_bytes")


def training_specs(model: torch.nn.Module, x: torch.Tensor, keep_input_mutations: bool = False) -> list[GraphSpec]:
    """The forward and backward graph specs of one training step of `model` on `x`, their inputs
    on a (fake) CUDA device, as the backend captures them for a CUDA worker (the forward's saved
    activations of free layout, the pass's output strides reported to AOTAutograd). With
    keep_input_mutations, as the backend's AOTAutograd makes them: batch norm's running statistics
    written inside the forward."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph
    from fxcc.client.graphs import _forward_strides, saved_outputs
    from fxcc.compiler_core.compile import output_strides
    from fxcc.compiler_core.graph import rebuild_graph
    from fxcc.compiler_core.passes.layout import channels_last_convs

    specs: list[GraphSpec] = []

    def compiler(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        strides = _forward_strides(gm)
        cap = capture_graph(gm, inputs)
        spec = on_cuda(cap.spec)
        if strides is not None:
            spec = spec.model_copy(update={"free_layout_outputs": saved_outputs(cap)})
            new_gm = rebuild_graph(spec)
            channels_last_convs(new_gm, "cuda")
            strides.extend(None if s is None else tuple(s) for s in output_strides(new_gm, spec.free_layout_outputs))
        specs.append(spec)
        return make_boxed_func(gm)

    def backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        return aot_module_simplified(gm, inputs, fw_compiler=compiler, bw_compiler=compiler,
                                     decompositions=decomposition_table(),
                                     keep_inference_input_mutations=keep_input_mutations)
    torch._dynamo.reset()
    try:
        torch.compile(model, backend=backend)(x).sum().backward()
    finally:
        torch._dynamo.reset()
    return specs


def on_cuda(spec: GraphSpec) -> GraphSpec:
    placeholders = [p.model_copy(update={"spec": p.spec.model_copy(update={"device": "cuda"})}) if p.spec else p
                    for p in spec.placeholders]
    return spec.model_copy(update={"placeholders": placeholders})


def reduction_rows(spec: GraphSpec) -> list[dict[str, Any]]:
    """One row per reduction kernel of `spec` compiled for sm_90 (see the module's docstring)."""
    from fxcc.compiler_core.codegen.triton import render_kernel
    from fxcc.compiler_core.pipeline import FRONT, Compilation, run
    from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target

    options = CompileOptions(target=Target(kind="cuda", arch=90), allow_tf32=True)
    c = run(Compilation(CompileRequest(graph=spec, options=options), record=False), FRONT)
    plan, scheduled = c.plan, c.scheduled()
    rows = []
    for step in plan.steps:  # one row per launch (equal kernels share a name)
        if step.kind != "kernel" or step.kernel not in scheduled or scheduled[step.kernel][0].rnumel == 1:
            continue
        kernel, buffers, target = scheduled[step.kernel]
        rk = render_kernel(kernel, buffers, target)
        step_x, step_r, itemsize = widest_read(kernel, buffers)
        rows.append({"xnumel": kernel.xnumel, "rnumel": kernel.rnumel, "XBLOCK": rk.constexprs["XBLOCK"],
                     "RBLOCK": rk.constexprs.get("RBLOCK"), "looped": kernel.looped, "programs": step.grid[0],
                     "column": kernel.column, "x_step_bytes": step_x * itemsize, "r_step_bytes": step_r * itemsize,
                     **lanes(step_x, step_r, rk.constexprs, itemsize), "read_bytes": read_bytes(kernel, buffers)})
    return rows


def read_bytes(kernel: Any, buffers: dict[str, Any]) -> int:
    """Bytes of the buffers `kernel` loads (not those it computes), each counted whole once."""
    from fxcc.compiler_core.ir.nodes import body_reads
    from fxcc.compiler_core.sizevars import numel

    own = kernel.names()
    names = {name for node in kernel.nodes for name, _ in body_reads(node).loads if name not in own}
    return sum(int(numel(buffers[n].sizes)) * buffers[n].dtype.itemsize for n in names)


def widest_read(kernel: Any, buffers: dict[str, Any]) -> tuple[int, int, int]:
    """(elements between adjacent outputs' loads, between adjacent reduced elements', itemsize) of
    the load of the kernel's first reduction that walks the largest buffer."""
    from fxcc.compiler_core.ir.ops import CountingHandler, use_handler
    from fxcc.compiler_core.sizevars import RINDEX, XINDEX, numel, simplify_index, unflatten

    red = next(n.data for n in kernel.nodes if n.is_reduction())
    counter = CountingHandler()
    with use_handler(counter):
        red.inner_fn(unflatten(XINDEX, red.ranges), unflatten(RINDEX, red.reduction_ranges))
    best = (-1, 0, 0, 4)
    for name, index in counter.loads:
        e = simplify_index(index, {XINDEX: kernel.xnumel, RINDEX: kernel.rnumel})
        if not e.has(RINDEX) or name not in buffers:
            continue
        at = e.subs({XINDEX: 0, RINDEX: 0})
        size = numel(buffers[name].sizes)
        if size > best[0]:
            best = (size, int(e.subs({XINDEX: 1, RINDEX: 0}) - at), int(e.subs({XINDEX: 0, RINDEX: 1}) - at),
                    buffers[name].dtype.itemsize)
    return best[1], best[2], best[3]


def lanes(step_x: int, step_r: int, tile: dict[str, int], itemsize: int) -> dict[str, int]:
    """Bytes between adjacent lanes' loads and contiguous bytes a tile row reads, along the tile's
    axis of smaller step (Triton orders a tile's lanes along the contiguous axis it finds)."""
    along_x = 0 < abs(step_x) <= abs(step_r) or step_r == 0
    step = abs(step_x if along_x else step_r)
    block = tile["XBLOCK"] if along_x else tile.get("RBLOCK", 1)
    return {"lane_bytes": step * itemsize, "run_bytes": (block if step == 1 else 1) * itemsize}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"reduction_kernels": len(rows), "column": sum(r["column"] for r in rows),
            "under_one_wave": sum(r["programs"] < SM_COUNT for r in rows),
            "strided_lanes": sum(r["lane_bytes"] > 4 for r in rows),
            "runs_under_128_bytes": sum(r["run_bytes"] < 128 for r in rows),
            "programs_min": min((r["programs"] for r in rows), default=0),
            "programs": sum(r["programs"] for r in rows), "read_bytes": sum(r["read_bytes"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--out", type=Path, default=None, help="write reduction_shapes.json there")
    args = ap.parse_args()
    from bench.conv_plan_counts import ResNet18

    torch.manual_seed(0)
    model = ResNet18().train()
    specs = training_specs(model, torch.randn(args.batch, 3, args.size, args.size))
    report: dict[str, Any] = {"batch": args.batch, "size": args.size, "graphs": {}}
    for name, spec in zip(("forward", "backward"), specs):
        rows = reduction_rows(spec)
        shapes = Counter(tuple(r[k] for k in COLUMNS) for r in rows)
        for key, count in sorted(shapes.items(), key=lambda kv: -kv[0][0] * kv[0][1]):
            print(json.dumps({"graph": name, "count": count, **dict(zip(COLUMNS, key))}))
        report["graphs"][name] = {"summary": summary(rows), "kernels": rows}
        print(json.dumps({"graph": name, **summary(rows)}))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "reduction_shapes.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

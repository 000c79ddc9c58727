"""Planned peak memory of the benchmark workloads at full size, without a GPU.

    python -m bench.plan_memory                                  # transformer_block, gpt2_small, resnet50; sm_90
    python -m bench.plan_memory --workloads transformer_block --tiny --target interpret

Captures each workload's inference graphs through Dynamo and AOTAutograd (parameters are empty
CPU tensors, the model never runs), compiles them for the target, and prints one JSON line per
workload with, summed over its graphs where it has several:

- `peak_live_mb`: the most bytes of storage alive at once while the plan runs, inputs excluded,
  extern results included (the plan replayed on FakeTensors): what the device allocator holds
  beyond the inputs, before its rounding and library workspaces; `bench.measure`'s `fxcc_peak_mb`
  is this number as torch.cuda.max_memory_allocated sees it on a GPU;
- `peak_alloc_mb`: the same for the plan's own AllocStep buffers only;
- `allocs`, `reused`, `inplace`: AllocSteps, those that take a dead buffer's storage, and those
  among them that take the storage of a buffer their own kernel reads (writing in place);
- `kernels`, `externs`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch._functorch.aot_autograd import aot_module_simplified
from torch._subclasses.fake_tensor import FakeTensorMode

from fxcc.client.backend import decomposition_table
from fxcc.client.capture import capture_graph
from fxcc.client.cuda_graphs import flat_tensors
from fxcc.compiler_core import compile as pipeline
from fxcc.compiler_core.artifact import AllocStep, ExternStep, FreeStep, KernelStep, Plan
from fxcc.compiler_core.graph import decode_arg
from fxcc.compiler_core.plan import peak_alloc_bytes
from fxcc.compiler_core.wire import (
    CompileOptions,
    CompileRequest,
    GraphSpec,
    NodeRef,
    Target,
    resolve_target,
    torch_dtype,
)

MB = 1 << 20
DEFAULT = ("transformer_block", "gpt2_small", "resnet50")


def capture(fn: Any, inputs: tuple[torch.Tensor, ...], device: str) -> list[GraphSpec]:
    """`fn`'s inference graphs (Dynamo + AOTAutograd with fxcc's decompositions), inputs on `device`.

    The compiled function never runs the graph: it returns empty tensors of the outputs' specs.
    """
    specs: list[GraphSpec] = []

    def compiler(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        specs.append(capture_graph(gm, example).spec)
        outs = [n.meta["val"] for n in gm.graph.output_node().args[0]]
        return lambda *args: [torch.empty_strided(o.shape, o.stride(), dtype=o.dtype) for o in outs]

    def backend(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        return aot_module_simplified(gm, example, fw_compiler=compiler, decompositions=decomposition_table())

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=backend)(*inputs)
    return [_on_device(s, device) for s in specs]


def _on_device(spec: GraphSpec, device: str) -> GraphSpec:
    """`spec` as traced on `device`: its inputs and every device argument (arange's, say) moved there."""
    def move(x: Any) -> Any:
        if isinstance(x, dict):
            moved = {k: move(v) for k, v in x.items()}
            if moved.get("kind") == "device" or ("dtype" in moved and "device" in moved):
                moved["value" if moved.get("kind") == "device" else "device"] = device
            return moved
        if isinstance(x, list):
            return [move(v) for v in x]
        return x
    return GraphSpec.model_validate(move(spec.model_dump()))


def workload(name: str, tiny: bool) -> tuple[Any, tuple[torch.Tensor, ...]]:
    """The workload's function and CPU inputs; a model's parameters are allocated, never filled."""
    from bench.workloads import make_workload

    if tiny:
        w = make_workload(name, tiny=True)
        return w.fn, w.inputs
    with torch.device("meta"):
        w = make_workload(name, device="meta")
    fn = w.fn.to_empty(device="cpu").eval() if isinstance(w.fn, torch.nn.Module) else w.fn
    inputs = tuple(torch.zeros(x.shape, dtype=x.dtype) for x in w.inputs)
    return fn, inputs


def peak_live_bytes(plan: Plan, spec: GraphSpec) -> int:
    """Most bytes of storage (inputs excluded) alive at once when `plan` runs, replayed on FakeTensors.

    As the runtime does, an extern result laid out otherwise than its `expect_strides` is copied.
    """
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    env: dict[str, Any] = {}
    with mode:
        for p in spec.placeholders:
            if p.spec is None:
                continue
            s = p.spec
            env[p.name] = torch.empty_strided(s.sizes, s.strides, dtype=torch_dtype(s.dtype), device=s.device)
    caller = list(env.values())  # the caller holds its inputs (and their storages' addresses) throughout
    inputs = {_storage(t) for t in caller}
    device = next(p.spec.device for p in spec.placeholders if p.spec)  # AllocSteps go where the inputs are
    peak = 0
    for step in plan.steps:
        if isinstance(step, AllocStep):
            s = step.spec
            with mode:
                if step.reuse:
                    old = env.pop(step.reuse)
                    env[step.out] = old.as_strided(s.sizes, s.strides, old.storage_offset())
                else:
                    env[step.out] = torch.empty_strided(s.sizes, s.strides, dtype=torch_dtype(s.dtype),
                                                        device=device)
        elif isinstance(step, ExternStep):
            op = resolve_target(step.op)
            with mode:
                value = op(*(decode_arg(a, env) for a in step.args),
                           **{k: decode_arg(v, env) for k, v in step.kwargs.items()})
                expect = step.expect_strides
                if isinstance(value, torch.Tensor) and expect is not None and \
                        any(n > 1 and a != b for n, a, b in zip(value.shape, value.stride(), expect)):
                    # (no copy_: FakeTensors of a CPU-only torch cannot copy on "cuda"; only
                    # the bytes matter here. A CUDA conv's fake result on a CPU-only torch is
                    # contiguous where cuDNN's real one follows its channels_last input.)
                    value = torch.empty_strided(value.shape, expect, dtype=value.dtype,
                                                device=value.device)
                env[step.out] = value
        elif isinstance(step, FreeStep):
            for n in step.names:
                env.pop(n, None)
        live = {_storage(t): _nbytes(t) for t in flat_tensors(env.values())}
        peak = max(peak, sum(b for s, b in live.items() if s not in inputs))
    return peak


def _storage(t: torch.Tensor) -> int:
    # Note: not id() of the storage object: each untyped_storage() call makes a new wrapper, and
    # a freed wrapper's id is soon another's, which merged distinct storages into one.
    return t.untyped_storage()._cdata


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def inplace_count(plan: Plan) -> int:
    """AllocSteps that take the storage of a buffer the next kernel reads (it writes in place)."""
    steps = plan.steps
    count = 0
    for at, step in enumerate(steps):
        if isinstance(step, AllocStep) and step.reuse is not None:
            kernel = next((s for s in steps[at + 1:] if isinstance(s, KernelStep)), None)
            names = [a.name for a in kernel.args if isinstance(a, NodeRef)] if kernel else []
            count += names.count(step.out) > 1
    return count


def measure_plan(spec: GraphSpec, target: Target, tf32: bool = False) -> dict[str, Any]:
    options = CompileOptions(target=target, allow_tf32=tf32)
    art = pipeline.compile_request(CompileRequest(graph=spec, options=options))
    plan, stats = art.manifest.plan, art.manifest.stats
    allocs = [s for s in plan.steps if isinstance(s, AllocStep)]
    return {"kernels": stats.kernels, "externs": sum(isinstance(s, ExternStep) for s in plan.steps),
            "allocs": len(allocs), "reused": sum(s.reuse is not None for s in allocs),
            "inplace": inplace_count(plan),
            "peak_alloc_mb": peak_alloc_bytes(plan.steps, plan.outputs) / MB,
            "peak_live_mb": peak_live_bytes(plan, spec) / MB}


def measure(name: str, target: Target, tiny: bool, tf32: bool = False) -> dict[str, Any]:
    fn, inputs = workload(name, tiny)
    specs = capture(fn, inputs, "cuda" if target.kind == "cuda" else "cpu")
    per_graph = [measure_plan(s, target, tf32) for s in specs]
    total = {k: sum(g[k] for g in per_graph) for k in per_graph[0]}
    return {"workload": name, "graphs": len(specs), **{k: round(v, 1) for k, v in total.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=list(DEFAULT))
    p.add_argument("--target", choices=("cuda", "interpret"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="bench.workloads' CPU-sized versions")
    p.add_argument("--tf32", action="store_true", help="compile as a client with TF32 on does (bench.measure "
                   "runs so): fp32 attention becomes fxcc's template kernel")
    a = p.parse_args()
    target = Target(kind="cuda", arch=90) if a.target == "cuda" else Target(kind="interpret")
    for name in a.workloads:
        print(json.dumps({"target": a.target, "tiny": a.tiny, "tf32": a.tf32, **measure(name, target, a.tiny, a.tf32)}),
              flush=True)


if __name__ == "__main__":
    main()

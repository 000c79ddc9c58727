"""Planned peak memory of the benchmark workloads at full size, without a GPU.

    python -m bench.plan_memory                                  # transformer_block, gpt2_small, resnet50; sm_90
    python -m bench.plan_memory --workloads transformer_block --tiny --target interpret
    python -m bench.plan_memory --training gpt2_train bert_train    # backward plans, saved activations
    python -m bench.plan_memory --workloads t5_encoder bert --tf32 --math-sdpa  # as transformers' models trace on CUDA

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
from fxcc.compiler_core import pipeline
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


def capture_training(fn: Any, inputs: tuple[torch.Tensor, ...], device: str) -> list[tuple[GraphSpec, GraphSpec]]:
    """`fn`'s training graphs (forward, backward) as fxcc's backend captures them (its partition and
    decompositions), inputs on `device`; `fn` returns a loss (else its sum is one). Nothing runs:
    each compiled graph returns empty tensors of its outputs' specs."""
    from fxcc.client.backend import partition_joint_graph

    forwards: list[GraphSpec] = []
    backwards: list[GraphSpec] = []

    def compiler(into: list[GraphSpec]) -> Any:
        def compile_one(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
            into.append(capture_graph(gm, example).spec)
            outs = [None if n is None else n.meta["val"] for n in gm.graph.output_node().args[0]]

            def run(*args: Any) -> list[Any]:
                return [None if o is None else torch.empty_strided(o.shape, o.stride(), dtype=o.dtype) for o in outs]
            return run
        return compile_one

    def backend(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        return aot_module_simplified(gm, example, fw_compiler=compiler(forwards), bw_compiler=compiler(backwards),
                                     partition_fn=partition_joint_graph, decompositions=decomposition_table(training=True),
                                     keep_inference_input_mutations=True)

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend)(*inputs)
    (out if out.dim() == 0 else out.sum()).backward()
    if len(forwards) != len(backwards):
        raise RuntimeError(f"{len(forwards)} forward graphs, {len(backwards)} backward graphs")
    return [(_on_device(f, device), _on_device(b, device)) for f, b in zip(forwards, backwards)]


def backward_memory(spec: GraphSpec, target: Target, tf32: bool = False) -> dict[str, Any]:
    """A backward plan's peak, counting what only its call's list holds (its inputs but the
    forward's primals, the parameters and inputs that their owners hold): held for the whole call
    (a caller's list kept, as before session 18) and let go after each one's last read."""
    options = CompileOptions(target=target, allow_tf32=tf32)
    art = pipeline.compile_request(CompileRequest(graph=spec, options=options))
    plan = art.manifest.plan
    counted = frozenset(p.name for p in spec.placeholders if p.spec is not None and not p.name.startswith("primals"))
    return {"kernels": art.manifest.stats.kernels,
            "saved_mb": sum(_spec_bytes(p.spec) for p in spec.placeholders if p.name in counted) / MB,
            "peak_held_mb": peak_live_bytes(plan, spec, counted) / MB,
            "peak_let_go_mb": peak_live_bytes(plan, spec, counted, let_go=True) / MB}


def _spec_bytes(s: Any) -> int:
    extent = 1 + sum((n - 1) * st for n, st in zip(s.sizes, s.strides) if n > 0)
    return extent * torch.empty((), dtype=torch_dtype(s.dtype)).element_size()


def measure_training(name: str, target: Target, tiny: bool, tf32: bool = False) -> dict[str, Any]:
    """A bench/model_zoo.py training model (transformers' GPT-2, BERT...): its backward plans' peaks."""
    from bench.model_zoo import ZOO

    spec = ZOO[name]
    if spec.kind != "training":
        raise SystemExit(f"{name} is not a training model of bench/model_zoo.py")
    built = spec.build("cpu", tiny)
    pairs = capture_training(built.module.train(), built.inputs, "cuda" if target.kind == "cuda" else "cpu")
    per_graph = [backward_memory(b, target, tf32) for _, b in pairs]
    total = {k: sum(g[k] for g in per_graph) for k in per_graph[0]}
    return {"model": name, "source": spec.source, "note": spec.note, "graphs": len(pairs),
            **{k: round(v, 1) for k, v in total.items()}}


def _on_device(spec: GraphSpec, device: str) -> GraphSpec:
    """`spec` as traced on `device`: its inputs and every device argument (arange's, say) moved there."""
    def move(x: Any) -> Any:
        if isinstance(x, dict):
            moved = {k: move(v) for k, v in x.items()}
            if moved.get("kind") == "device":
                moved["value"] = device
            elif "dtype" in moved and isinstance(moved.get("device"), str):  # a TensorSpec
                moved["device"] = device
            return moved
        if isinstance(x, list):
            return [move(v) for v in x]
        return x
    return GraphSpec.model_validate(move(spec.model_dump()))


def workload(name: str, tiny: bool) -> tuple[Any, tuple[torch.Tensor, ...]]:
    """The workload's function and CPU inputs; a model's parameters are allocated, never filled.

    A bench/model_zoo.py inference model (transformers' gpt2, bert...) is built on the CPU with
    its random weights, its inputs at the suite's sizes (unless `tiny`)."""
    from bench.model_zoo import ZOO
    from bench.workloads import make_workload

    if name in ZOO:
        if ZOO[name].kind != "inference":
            raise SystemExit(f"{name} is a training model of bench/model_zoo.py: --training {name}")
        built = ZOO[name].build("cpu", tiny)
        return built.module.eval(), built.inputs

    if tiny:
        w = make_workload(name, tiny=True)
        return w.fn, w.inputs
    with torch.device("meta"):
        w = make_workload(name, device="meta")
    fn = w.fn.to_empty(device="cpu").eval() if isinstance(w.fn, torch.nn.Module) else w.fn
    inputs = tuple(torch.zeros(x.shape, dtype=x.dtype) for x in w.inputs)
    return fn, inputs


def peak_live_bytes(plan: Plan, spec: GraphSpec, counted: frozenset[str] = frozenset(),
                    let_go: bool = False) -> int:
    """Most bytes of storage (inputs excluded) alive at once when `plan` runs, replayed on FakeTensors.

    As the runtime does, an extern result laid out otherwise than its `expect_strides` is copied.
    `counted`: inputs that count too (a backward's saved activations and incoming gradients, which
    only the call's list holds): for the whole call, or with `let_go` until the step after their last
    read (a plan that takes its inputs over, client/runtime.py PlanRunner.steal).
    """
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    env: dict[str, Any] = {}
    with mode:
        for p in spec.placeholders:
            if p.spec is None:
                continue
            s = p.spec
            env[p.name] = torch.empty_strided(s.sizes, s.strides, dtype=torch_dtype(s.dtype), device=s.device)
    # the caller holds its inputs (and their storages' addresses) throughout; those `counted` are
    # held here too, only so that no later storage takes a freed one's address (and key)
    caller = list(env.values())
    inputs = {_storage(t) for n, t in env.items() if n not in counted}
    pinned = {} if let_go else {_storage(t): _nbytes(t) for n, t in env.items() if n in counted}
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
        live = {_storage(t): _nbytes(t) for t in flat_tensors(env.values())} | pinned
        peak = max(peak, sum(b for s, b in live.items() if s not in inputs))
    del caller
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
    p.add_argument("--workloads", nargs="+", default=list(DEFAULT),
                   help="bench/workloads.py names or bench/model_zoo.py inference models (gpt2, bert, t5_encoder...)")
    p.add_argument("--target", choices=("cuda", "interpret"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="bench.workloads' CPU-sized versions")
    p.add_argument("--tf32", action="store_true", help="compile as a client with TF32 on does (bench.measure "
                   "runs so): fp32 attention becomes fxcc's template kernel")
    p.add_argument("--math-sdpa", action="store_true", help="capture with torch's math SDPA only, as transformers' "
                   "BERT and T5 trace on CUDA (AOTAutograd decomposes their masked SDPA; on this CPU torch "
                   "would pick its flash kernel)")
    p.add_argument("--training", nargs="+", metavar="MODEL",
                   help="bench/model_zoo.py training models (gpt2_train, bert_train): each backward plan's peak "
                   "with its saved activations held for the whole call or let go after their last read")
    a = p.parse_args()
    target = Target(kind="cuda", arch=90) if a.target == "cuda" else Target(kind="interpret")
    if a.training:
        for name in a.training:
            print(json.dumps({"target": a.target, "tiny": a.tiny, "tf32": a.tf32,
                              **measure_training(name, target, a.tiny, a.tf32)}), flush=True)
        return
    for name in a.workloads:
        with _sdpa(a.math_sdpa):
            row = measure(name, target, a.tiny, a.tf32)
        print(json.dumps({"target": a.target, "tiny": a.tiny, "tf32": a.tf32, "math_sdpa": a.math_sdpa, **row}),
              flush=True)


def _sdpa(math_only: bool) -> Any:
    """A context where SDPA takes torch's math path only (math_only), else nothing."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH]) if math_only else contextlib.nullcontext()


if __name__ == "__main__":
    main()

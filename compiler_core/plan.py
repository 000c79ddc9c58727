"""From a schedule and its rendered kernels to a Plan: allocations, launches, extern calls and frees."""

from __future__ import annotations

from collections.abc import Sequence

from compiler_core.artifact import AllocStep, ExternStep, FreeStep, KernelStep, Plan
from compiler_core.codegen.triton import RenderedKernel
from compiler_core.ir.nodes import Buffer
from compiler_core.lowering import ExternCall, GraphLowering
from compiler_core.scheduler import Kernel
from compiler_core.wire import IntArg, NodeRef, TensorSpec, _refs, dtype_name

Step = AllocStep | ExternStep | KernelStep | FreeStep


def build_plan(g: GraphLowering, items: Sequence[Kernel | ExternCall],
               rendered: dict[int, RenderedKernel]) -> Plan:
    """Steps in schedule order; each buffer is freed right after its last reader."""
    steps: list[Step] = []
    reads: list[list[str]] = []
    for i, item in enumerate(items):
        if isinstance(item, ExternCall):
            steps.append(ExternStep(op=item.op, args=item.args, kwargs=item.kwargs, out=item.out))
            reads.append(_refs(item.args + list(item.kwargs.values())))
            continue
        rk = rendered[i]
        for node in item.nodes:
            if node.name in item.stored:
                steps.append(AllocStep(out=node.name, spec=_spec(node.buffer)))
                reads.append([])
        args: list[NodeRef | IntArg] = [NodeRef(name=a) for a in rk.args]
        args.append(IntArg(value=rk.xnumel))
        if rk.rnumel > 1:
            args.append(IntArg(value=rk.rnumel))
        steps.append(KernelStep(kernel=rk.name, args=args, grid=rk.grid))
        reads.append(list(rk.args))
    return Plan(inputs=list(g.inputs), steps=_with_frees(steps, reads, g.outputs), outputs=g.outputs)


def _spec(b: Buffer) -> TensorSpec:
    return TensorSpec(dtype=dtype_name(b.dtype), sizes=list(b.sizes), strides=list(b.strides))


def _with_frees(steps: list[Step], reads: list[list[str]], outputs: Sequence) -> list[Step]:
    keep = set(_refs(list(outputs)))
    last: dict[str, int] = {}
    for i, names in enumerate(reads):
        for n in names:
            last[n] = i
    out: list[Step] = []
    for i, step in enumerate(steps):
        out.append(step)
        dead = sorted(n for n, at in last.items() if at == i and n not in keep)
        if dead:
            out.append(FreeStep(names=dead))
    return out

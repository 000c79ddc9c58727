"""Pad big matmuls whose output rows are not 16-byte aligned (CUDA targets).

cuBLAS picks its fast kernels only when every leading dimension is a multiple of 16 bytes. A
language model's head (vocabulary 50257) writes rows of 50257 floats: cuBLAS falls back to an
`align1` kernel that ran 2.45 ms of GPT-2's 8.3 ms on the H200, against 0.8 ms for an aligned
one. This pass rewrites `mm(a, b)` (and `addmm(bias, a, b)`) with N % align != 0 into

    padded = constant_pad_nd(b, [0, pad])     # N → N + pad columns, zeros
    wide = mm(a, padded)                      # aligned rows
    out = slice(wide, 1, 0, N)                # the same values; a view with row stride N + pad

and keeps the node's name on the slice, so its users are untouched. Where the result must leave
the graph in eager's layout, the lowering copies it (graph outputs always get eager's strides).

Note: only static shapes, only floating dtypes, only outputs of at least MIN_ELEMENTS (the pad
copy of b must be cheap next to the matmul), never on the interpreter target.
"""

from __future__ import annotations

import logging

import torch
from torch import fx

from fxcc.compiler_core.graph import rebuild_graph
from fxcc.compiler_core.wire import FloatArg, GraphSpec, IntArg, ListArg, Node, NodeRef

log = logging.getLogger("fxcc.passes.pad_mm")
aten = torch.ops.aten

ALIGN_BYTES = 16
MIN_ELEMENTS = 1 << 22
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def pad_matmuls(gm: fx.GraphModule, spec: GraphSpec, target: str) -> tuple[fx.GraphModule, GraphSpec]:
    """`gm` and `spec` with unaligned big matmuls padded (else unchanged)."""
    if target != "cuda" or spec.symbols:
        return gm, spec
    try:
        pads = find_unaligned(gm)
        if not pads:
            return gm, spec
        rewritten = rewrite(spec, pads)
        new_gm = rebuild_graph(rewritten, like=(gm, spec))  # only the rewritten nodes propagate again
    except Exception as e:  # noqa: BLE001 - an unsure rewrite is no rewrite
        log.warning("matmul padding skipped: %s: %s", type(e).__name__, e)
        return gm, spec
    log.info("padded %d matmul(s) to aligned rows", len(pads))
    return new_gm, rewritten


def find_unaligned(gm: fx.GraphModule) -> dict[str, tuple[int, int]]:
    """node name → (N, pad) for each mm/addmm worth padding."""
    out: dict[str, tuple[int, int]] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dtype not in _DTYPES or val.dim() != 2:
            continue
        m, n = (int(s) for s in val.shape)
        align = ALIGN_BYTES // val.element_size()
        if n % align == 0 or m * n < MIN_ELEMENTS:
            continue
        if node.target is aten.addmm.default:
            bias = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
            if not isinstance(bias, torch.Tensor) or bias.dim() == 0 or int(bias.shape[-1]) != n:
                continue  # a broadcast bias column cannot be padded along N
        out[node.name] = (n, (-n) % align)
    return out


def rewrite(spec: GraphSpec, pads: dict[str, tuple[int, int]]) -> GraphSpec:
    nodes: list[Node] = []
    producers = {w.name: w for w in spec.nodes}
    for w in spec.nodes:
        if w.name not in pads:
            nodes.append(w)
            continue
        n, pad = pads[w.name]
        args = list(w.args)
        padded_at = [1] if w.target == "aten.mm.default" else [0, 2]  # addmm: bias and b
        for i in padded_at:
            name = f"{w.name}_fxpad{i}"
            source = _transposed_source(args[i], producers) if i == padded_at[-1] else None
            if source is not None:
                # b = t(W) (a Linear's weight): pad W's rows, in W's own memory order, and
                # transpose the padded copy, so the copy reads and writes contiguously and the
                # matmul still gets a transposed operand (cuBLAS's "tn" kernels, as unpadded).
                nodes.append(Node(name=f"{name}_rows", target="aten.constant_pad_nd.default",
                                  args=[source, ListArg(items=[IntArg(value=0), IntArg(value=0),
                                                               IntArg(value=0), IntArg(value=pad)]),
                                        FloatArg(value=0.0)]))
                nodes.append(Node(name=name, target="aten.t.default", args=[NodeRef(name=f"{name}_rows")]))
            else:
                nodes.append(Node(name=name, target="aten.constant_pad_nd.default",
                                  args=[args[i], ListArg(items=[IntArg(value=0), IntArg(value=pad)]),
                                        FloatArg(value=0.0)]))
            args[i] = NodeRef(name=name)
        wide = f"{w.name}_fxwide"
        nodes.append(Node(name=wide, target=w.target, args=args, kwargs=w.kwargs))
        nodes.append(Node(name=w.name, target="aten.slice.Tensor",
                          args=[NodeRef(name=wide), IntArg(value=1), IntArg(value=0), IntArg(value=n)]))
    return GraphSpec.model_validate({**spec.model_dump(), "nodes": [x.model_dump() for x in nodes]})


def _transposed_source(arg: object, producers: dict[str, Node]) -> NodeRef | None:
    """W where `arg` is `t(W)` or `permute(W, [1, 0])` of a 2-D W, else None."""
    if not isinstance(arg, NodeRef) or arg.name not in producers:
        return None
    w = producers[arg.name]
    if not w.args or not isinstance(w.args[0], NodeRef):
        return None
    if w.target == "aten.t.default":
        return w.args[0]
    if w.target == "aten.permute.default" and len(w.args) > 1 and isinstance(w.args[1], ListArg) and \
            [getattr(x, "value", None) for x in w.args[1].items] == [1, 0]:
        return w.args[0]
    return None

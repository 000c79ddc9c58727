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

from fxcc.compiler_core.passes.edit import GraphEdit

log = logging.getLogger("fxcc.passes.pad_mm")
aten = torch.ops.aten

ALIGN_BYTES = 16
MIN_ELEMENTS = 1 << 22
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def pad_matmuls(gm: fx.GraphModule, target: str) -> bool:
    """Unaligned big matmuls of `gm` padded in place; whether any was."""
    if target != "cuda" or gm.meta.get("fxcc_syms") is not None:
        return False
    try:
        pads = find_unaligned(gm)
    except Exception as e:  # noqa: BLE001 - an unsure rewrite is no rewrite
        log.warning("matmul padding skipped: %s: %s", type(e).__name__, e)
        return False
    if not pads:
        return False
    edit = GraphEdit(gm)
    padded = 0
    for node in [n for n in gm.graph.nodes if n.name in pads]:
        try:
            edit.replace(node, padded_node(edit, node, *pads[node.name]))
            padded += 1
        except Exception as e:  # noqa: BLE001 - this matmul's nodes are taken back
            edit.rollback()
            log.warning("matmul padding skipped %s: %s: %s", node.name, type(e).__name__, e)
    edit.finish()  # only the nodes after a padded matmul derive their values again
    log.info("padded %d matmul(s) to aligned rows", padded)
    return padded > 0


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


def padded_node(edit: GraphEdit, mm: fx.Node, n: int, pad: int) -> fx.Node:
    """Before `mm`: its padded operands, the wide matmul, and the slice of its first N columns (returned)."""
    args = list(mm.args)
    padded_at = [1] if mm.target is aten.mm.default else [0, 2]  # addmm: bias and b
    for i in padded_at:
        name = f"{mm.name}_fxpad{i}"
        source = _transposed_source(args[i]) if i == padded_at[-1] else None
        if source is not None:
            # b = t(W) (a Linear's weight): pad W's rows, in W's own memory order, and
            # transpose the padded copy, so the copy reads and writes contiguously and the
            # matmul still gets a transposed operand (cuBLAS's "tn" kernels, as unpadded).
            rows = edit.add(mm, aten.constant_pad_nd.default, (source, [0, 0, 0, pad], 0.0), name=f"{name}_rows")
            args[i] = edit.add(mm, aten.t.default, (rows,), name=name)
        else:
            args[i] = edit.add(mm, aten.constant_pad_nd.default, (args[i], [0, pad], 0.0), name=name)
    wide = edit.add(mm, mm.target, tuple(args), dict(mm.kwargs), name=f"{mm.name}_fxwide")
    return edit.add(mm, aten.slice.Tensor, (wide, 1, 0, n), name=mm.name)


def _transposed_source(arg: object) -> fx.Node | None:
    """W where `arg` is `t(W)` or `permute(W, [1, 0])` of a 2-D W, else None."""
    if not isinstance(arg, fx.Node) or arg.op != "call_function" or not arg.args:
        return None
    w = arg.args[0]
    if not isinstance(w, fx.Node):
        return None
    if arg.target is aten.t.default:
        return w
    if arg.target is aten.permute.default and len(arg.args) > 1 and list(arg.args[1]) == [1, 0]:
        return w
    return None

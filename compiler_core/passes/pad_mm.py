"""Pad big matmuls whose leading dimensions are not 16-byte aligned (CUDA targets).

cuBLAS picks its fast kernels only when every leading dimension is a multiple of 16 bytes. A
language model's head (vocabulary 50257) writes rows of 50257 floats: cuBLAS falls back to an
`align1` kernel that ran 2.45 ms of GPT-2's 8.3 ms on the H200, against 0.8 ms for an aligned
one. This pass rewrites `mm(a, b)` (and `addmm(bias, a, b)`), a: [M, K], b: [K, N], padding with
zeros each dim that is some matrix's leading dimension and unaligned:

- N, the output's rows (the head's forward): b's columns (and a row bias) padded, the result a
  slice of the first N columns, a view with row stride N + pad;
- K, a row-major a's rows or a column-major b's columns (the head's backward for its input,
  `mm(grad_logits, W)`): a's columns and b's rows padded, so the added products are zeros;
- M, a column-major a's columns (the head's backward for its weight, `mm(grad_logits.t(), x)`):
  a's rows padded, the result a slice of the first M rows (contiguous).

    padded = constant_pad_nd(b, [0, pad])     # N → N + pad columns, zeros
    wide = mm(a, padded)                      # aligned rows
    out = slice(wide, 1, 0, N)                # the same values; a view with row stride N + pad

The result keeps the node's name, so its users are untouched. Where the result must leave the graph
in eager's layout, the lowering copies it (graph outputs always get eager's strides). An operand
that is `t(W)` is padded in W's own memory order and transposed again, and one operand padded the
same way for two matmuls (the logits' gradient, for both of the head's backward matmuls) is one node.

Note: only static shapes, only floating dtypes, only matmuls big enough that the pad copies are
cheap next to them (MIN_ELEMENTS outputs for N, MIN_FLOPS for K and M), never on the interpreter
target.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import fx

from fxcc.compiler_core.passes.edit import GraphEdit

log = logging.getLogger("fxcc.passes.pad_mm")
aten = torch.ops.aten

ALIGN_BYTES = 16
MIN_ELEMENTS = 1 << 22
MIN_FLOPS = 1 << 32  # M·N·K of a matmul padded along K or M (each pad copies a whole operand)
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Pads:
    """Zeros added to a matmul's M, K and N (0: that dim is left alone)."""

    m: int
    k: int
    n: int
    sizes: tuple[int, int, int]  # (M, K, N) before padding


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
    shared: dict[tuple[fx.Node, int, int], fx.Node] = {}
    padded = 0
    for node in [n for n in gm.graph.nodes if n.name in pads]:
        kept = dict(shared)
        try:
            edit.replace(node, padded_node(edit, node, pads[node.name], shared))
            padded += 1
        except Exception as e:  # noqa: BLE001 - this matmul's nodes are taken back
            edit.rollback()
            shared = kept  # the pads this rewrite added went with it
            log.warning("matmul padding skipped %s: %s: %s", node.name, type(e).__name__, e)
    edit.finish()  # only the nodes after a padded matmul derive their values again
    log.info("padded %d matmul(s) to aligned leading dimensions", padded)
    return padded > 0


def find_unaligned(gm: fx.GraphModule) -> dict[str, Pads]:
    """node name → the pads of each mm/addmm worth padding."""
    out: dict[str, Pads] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dtype not in _DTYPES or val.dim() != 2:
            continue
        a_node, b_node = node.args[-2:]
        a, b = (x.meta.get("val") if isinstance(x, fx.Node) else None for x in (a_node, b_node))
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() != 2 or b.dim() != 2:
            continue
        m, k, n = int(a.shape[0]), int(a.shape[1]), int(val.shape[1])
        align = ALIGN_BYTES // val.element_size()
        big = m * n * k >= MIN_FLOPS
        pad_n = (-n) % align if m * n >= MIN_ELEMENTS else 0
        pad_k = (-k) % align if big and (_row_major(a) or _column_major(b)) else 0
        pad_m = (-m) % align if big and _column_major(a) else 0
        if node.target is aten.addmm.default:
            bias = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
            if not isinstance(bias, torch.Tensor) or bias.dim() == 0:
                pad_n = 0
            elif int(bias.shape[-1]) != n:
                pad_n = 0  # a broadcast bias column cannot be padded along N
            if isinstance(bias, torch.Tensor) and bias.dim() == 2 and int(bias.shape[0]) != 1:
                pad_m = 0  # nor a bias with rows of its own along M
        if not (pad_m or pad_k or pad_n):
            continue
        # a padded operand is a fresh contiguous copy (of W, for t(W)): its leading dim must come out aligned
        if (pad_m or pad_k) and _padded_ld(a_node, m + pad_m, k + pad_k) % align:
            continue
        if (pad_k or pad_n) and _padded_ld(b_node, k + pad_k, n + pad_n) % align:
            continue
        out[node.name] = Pads(pad_m, pad_k, pad_n, (m, k, n))
    return out


def _padded_ld(arg: fx.Node, rows: int, cols: int) -> int:
    """The leading dim of `arg` padded to [rows, cols] as `_padded` makes it: t() of a contiguous copy of
    W (column-major, ld = rows) where arg is t(W), else a contiguous copy (row-major, ld = cols)."""
    return rows if _transposed_source(arg) is not None else cols


def _row_major(t: torch.Tensor) -> bool:
    return int(t.stride(1)) == 1 and int(t.shape[1]) > 1


def _column_major(t: torch.Tensor) -> bool:
    return int(t.stride(0)) == 1 and int(t.shape[0]) > 1 and not _row_major(t)


def padded_node(edit: GraphEdit, mm: fx.Node, pads: Pads, shared: dict[tuple[fx.Node, int, int], fx.Node]) -> fx.Node:
    """Before `mm`: its padded operands, the wide matmul, and the slice of its first M rows and N
    columns (returned)."""
    args = list(mm.args)
    a_at, b_at = len(args) - 2, len(args) - 1
    args[a_at] = _padded(edit, mm, args[a_at], pads.m, pads.k, f"{mm.name}_fxpad{a_at}", shared)
    args[b_at] = _padded(edit, mm, args[b_at], pads.k, pads.n, f"{mm.name}_fxpad{b_at}", shared)
    if mm.target is aten.addmm.default and pads.n:
        args[0] = edit.add(mm, aten.constant_pad_nd.default, (args[0], [0, pads.n], 0.0), name=f"{mm.name}_fxpad0")
    wide = edit.add(mm, mm.target, tuple(args), dict(mm.kwargs), name=f"{mm.name}_fxwide")
    m, _, n = pads.sizes
    out = wide
    if pads.n:
        out = edit.add(mm, aten.slice.Tensor, (out, 1, 0, n), name=mm.name if not pads.m else f"{mm.name}_fxcols")
    if pads.m:
        out = edit.add(mm, aten.slice.Tensor, (out, 0, 0, m), name=mm.name)
    return out


def _padded(edit: GraphEdit, before: fx.Node, arg: fx.Node, rows: int, cols: int, name: str,
            shared: dict[tuple[fx.Node, int, int], fx.Node]) -> fx.Node:
    """`arg` (2-D) with `rows` zero rows and `cols` zero columns added; `arg` itself for none.

    Note: b = t(W) (a Linear's weight) pads W in its own memory order and transposes the padded
    copy, so the copy reads and writes contiguously and the matmul still gets a transposed operand
    (cuBLAS's "tn" kernels, as unpadded)."""
    if not rows and not cols:
        return arg
    source = _transposed_source(arg)
    if source is not None:
        key = (edit.current(source), cols, rows)
        if key not in shared:
            shared[key] = edit.add(before, aten.constant_pad_nd.default, (source, [0, rows, 0, cols], 0.0),
                                   name=f"{name}_rows")
        return edit.add(before, aten.t.default, (shared[key],), name=name)
    key = (edit.current(arg), rows, cols)
    if key not in shared:
        shared[key] = edit.add(before, aten.constant_pad_nd.default, (arg, [0, cols, 0, rows], 0.0), name=name)
    return shared[key]


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

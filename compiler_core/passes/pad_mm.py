"""Give big matmuls 16-byte aligned leading dimensions (CUDA targets).

cuBLAS picks its fast kernels only when every leading dimension is a multiple of 16 bytes. A
language model's head (vocabulary 50257) writes rows of 50257 floats: cuBLAS falls back to an
`align1` kernel that ran 2.45 ms of GPT-2's 8.3 ms on the H200, against 0.8 ms for an aligned
one; its backward reads the logits' gradient, rows of 50257 floats, in two matmuls (`mm(grad, W)`
and `mm(grad.t(), x)`: 1.67 ms of align1 kernels in transformers' BERT training step). For
`mm(a, b)` (and `addmm(bias, a, b)`), a: [M, K], b: [K, N]:

- an operand whose leading dimension is unaligned (a row-major a's K, a column-major a's M, a
  column-major b's K) is re-strided: its source tensor (W for `t(W)`) is written once with
  aligned rows, `fxcc.aligned_rows(x, align)` (compiler_core/fxcc_ops.py: the same values, row
  stride rounded up), and every reader of it that accepts any strides reads that copy (no other
  matmul copies it again; the kernel that computes a gradient writes it so in the first place);
- the output's rows (N, the head's forward) are padded: b's columns (and a row bias) padded with
  zeros, the result a slice of the first N columns, a view with row stride N + pad:

    padded = constant_pad_nd(b, [0, pad])     # N → N + pad columns, zeros
    wide = mm(a, padded)                      # aligned rows
    out = slice(wide, 1, 0, N)                # the same values; a view with row stride N + pad

The result keeps the node's name, so its users are untouched. Where the result must leave the graph
in eager's layout, the lowering copies it (graph outputs always get eager's strides).

Note: only static shapes, only floating dtypes, only matmuls big enough that a copy is cheap next
to them (MIN_ELEMENTS outputs for N, MIN_FLOPS for an operand), never on the interpreter target.
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
MIN_FLOPS = 1 << 32  # M·N·K of a matmul whose operand is re-strided (a copy of the whole operand)
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# views whose result is valid for any strides of their input (a reader through one of them may read
# a re-strided copy); view/reshape/as_strided may need the input's own strides
_ANY_STRIDES_VIEWS = frozenset({aten.permute.default, aten.t.default, aten.transpose.int, aten.expand.default,
                                aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.slice.Tensor,
                                aten.select.int})
# (_unsafe_view is no view to its schema, yet needs viewable strides as view does)
_NEEDS_STRIDES = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                            aten.as_strided.default})


@dataclass(frozen=True)
class Alignment:
    """What a matmul needs: operands to re-stride (positions in its args), zeros added to N."""

    restride: tuple[int, ...]
    pad_n: int
    n: int


def pad_matmuls(gm: fx.GraphModule, target: str) -> bool:
    """Unaligned big matmuls of `gm` aligned in place; whether any was."""
    if target != "cuda" or gm.meta.get("fxcc_syms") is not None:
        return False
    try:
        found = find_unaligned(gm)
    except Exception as e:  # noqa: BLE001 - an unsure rewrite is no rewrite
        log.warning("matmul padding skipped: %s: %s", type(e).__name__, e)
        return False
    if not found:
        return False
    edit = GraphEdit(gm)
    aligned: dict[fx.Node, fx.Node] = {}  # source → its aligned copy
    done = 0
    for node in [n for n in gm.graph.nodes if n.name in found]:
        plan = found[node.name]
        try:
            for at in plan.restride:
                restride(edit, node.args[at], aligned)
            if plan.pad_n:
                edit.replace(node, padded_node(edit, node, plan.n, plan.pad_n))
            done += 1
        except Exception as e:  # noqa: BLE001 - this matmul's new nodes are taken back
            edit.rollback()
            log.warning("matmul padding skipped %s: %s: %s", node.name, type(e).__name__, e)
    edit.finish()  # only the nodes after a changed one derive their values again
    log.info("aligned %d matmul(s)' leading dimensions", done)
    return done > 0


def find_unaligned(gm: fx.GraphModule) -> dict[str, Alignment]:
    """node name → what each mm/addmm worth aligning needs."""
    out: dict[str, Alignment] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dtype not in _DTYPES or val.dim() != 2:
            continue
        a_at, b_at = len(node.args) - 2, len(node.args) - 1
        a, b = (x.meta.get("val") if isinstance(x, fx.Node) else None for x in node.args[-2:])
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() != 2 or b.dim() != 2:
            continue
        m, k, n = int(a.shape[0]), int(a.shape[1]), int(val.shape[1])
        align = ALIGN_BYTES // val.element_size()
        restride = []
        if m * n * k >= MIN_FLOPS:
            if _leading_dim(a) % align:
                restride.append(a_at)
            if _leading_dim(b) % align and not _row_major(b):  # a row-major b's rows are N: padded below
                restride.append(b_at)
        pad_n = (-n) % align if m * n >= MIN_ELEMENTS else 0
        if pad_n and node.target is aten.addmm.default:
            bias = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
            if not isinstance(bias, torch.Tensor) or bias.dim() == 0 or int(bias.shape[-1]) != n:
                pad_n = 0  # a broadcast bias column cannot be padded along N
        if restride or pad_n:
            out[node.name] = Alignment(tuple(restride), pad_n, n)
    return out


def _row_major(t: torch.Tensor) -> bool:
    return int(t.stride(1)) == 1 and int(t.shape[1]) > 1


def _leading_dim(t: torch.Tensor) -> int:
    """The stride cuBLAS reads as the matrix's leading dimension (rows of a row-major matrix, columns
    of a column-major one)."""
    if int(t.shape[0]) <= 1 or int(t.shape[1]) <= 1:
        return 0  # a vector: any
    return int(t.stride(0)) if int(t.stride(1)) == 1 else int(t.stride(1))


def restride(edit: GraphEdit, operand: fx.Node, aligned: dict[fx.Node, fx.Node]) -> None:
    """`operand`'s source (W where it is t(W), else itself) written once with aligned rows, right after
    the source, and read by the source's readers that accept any strides (the operand among them)."""
    source = _transposed_source(operand) or operand
    source = edit.current(source)
    if source in aligned or source in aligned.values():
        return
    val = source.meta["val"]
    align = ALIGN_BYTES // val.element_size()
    from fxcc.compiler_core.fxcc_ops import aligned_rows

    copy = edit.add(_after(source), aligned_rows._opoverload, (source, align), name=f"{source.name}_fxaligned")
    readers = [u for u in source.users if u is not copy and _any_strides(u)]
    if operand is not source and operand not in readers:
        raise RuntimeError(f"{operand.name} reads {source.name} through a view that needs its strides")
    edit.reroute(source, copy, readers)
    aligned[source] = copy


def _after(node: fx.Node) -> fx.Node:
    """The node before which a node computed from `node` goes (after the graph's inputs, for one)."""
    after = node.next
    while after.op == "placeholder":
        after = after.next
    return after


def _any_strides(user: fx.Node) -> bool:
    """Whether `user` computes the same values from an input of any strides (no view/reshape that
    may need its input's own, and no graph output, which keeps eager's layout)."""
    if user.op != "call_function" or user.target in _NEEDS_STRIDES:
        return False
    return user.target in _ANY_STRIDES_VIEWS or not getattr(user.target, "is_view", True)


def padded_node(edit: GraphEdit, mm: fx.Node, n: int, pad: int) -> fx.Node:
    """Before `mm`: its operands padded along N, the wide matmul, and the slice of its first N columns (returned)."""
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

"""Accumulating index_put along the first dim as index_add (CUDA targets): an embedding's backward.

AOTAutograd's decomposition of `embedding_dense_backward` (and of `index.Tensor`'s backward) ends in

    index_put(zeros, [idx], grad, accumulate=True)

which the client runs as an extern aten call. On CUDA, aten's accumulating index_put sorts the indices
first (`indexing_backward_kernel`): transformers' BERT training step spent 0.98 ms of its 9.0 ms of
device time there on the H200, for three embeddings, where Inductor scatters with atomic adds. With
one index tensor on the first dim it is the same sum as

    wrapped = where(idx < 0, idx + N, idx)          # index_put wraps negative indices
    out = index_add(zeros, 0, wrapped.reshape(-1), grad.expand(*idx.shape, *rest).reshape(-1, *rest))

whose CUDA kernel adds with atomics. The sum's order differs (as Inductor's does); under
`torch.use_deterministic_algorithms(True)` aten's index_add itself takes the sorted path.

Note: only static shapes, one integer index tensor on dim 0 (no None before it, no boolean masks),
values of the destination's dtype; never on the interpreter target.
"""

from __future__ import annotations

import logging

import torch
from torch import fx

from fxcc.compiler_core.passes.edit import GraphEdit, rewrite_each

log = logging.getLogger("fxcc.passes.index_add")
aten = torch.ops.aten

_INDEX_DTYPES = (torch.int64, torch.int32)


def index_puts_as_index_add(gm: fx.GraphModule, target: str) -> bool:
    """Every accumulating first-dim index_put of `gm` rewritten as index_add in place; whether any was."""
    if target != "cuda" or gm.meta.get("fxcc_syms") is not None:
        return False
    found = [n for n in gm.graph.nodes if rewritable(n)]
    if not found:
        return False
    rewritten = rewrite_each(gm, found, index_add_node, log, "index_put")
    log.info("%d accumulating index_put(s) run as index_add", rewritten)
    return rewritten > 0


def rewritable(node: fx.Node) -> bool:
    """Whether `node` is index_put(self, [idx], values, True) with one integer idx on dim 0."""
    if node.op != "call_function" or node.target is not aten.index_put.default:
        return False
    args = list(node.args) + [node.kwargs.get("accumulate", False)] * (4 - len(node.args))
    base, indices, values, accumulate = args[:4]
    if accumulate is not True or not isinstance(indices, (list, tuple)) or len(indices) != 1:
        return False
    if not all(isinstance(a, fx.Node) for a in (base, indices[0], values)):
        return False
    out, idx, src = (a.meta.get("val") for a in (base, indices[0], values))
    if not all(isinstance(t, torch.Tensor) for t in (out, idx, src)):
        return False
    if idx.dtype not in _INDEX_DTYPES or out.dim() == 0 or src.dtype != out.dtype:
        return False
    expanded = (*idx.shape, *out.shape[1:])
    try:
        broadcast = torch.broadcast_shapes(tuple(src.shape), expanded)
    except RuntimeError:
        return False
    return tuple(broadcast) == expanded and idx.numel() > 0


def index_add_node(edit: GraphEdit, node: fx.Node) -> fx.Node:
    """Before `node`: the wrapped flat index, the values as rows, and the index_add (returned)."""
    base, (idx,), values = node.args[0], node.args[1], node.args[2]
    out_val, idx_val = base.meta["val"], idx.meta["val"]
    rows, rest = int(out_val.shape[0]), [int(s) for s in out_val.shape[1:]]
    name = node.name
    negative = edit.add(node, aten.lt.Scalar, (idx, 0), name=f"{name}_neg")
    shifted = edit.add(node, aten.add.Tensor, (idx, rows), name=f"{name}_shift")
    wrapped = edit.add(node, aten.where.self, (negative, shifted, idx), name=f"{name}_wrap")
    flat = edit.add(node, aten.reshape.default, (wrapped, [idx_val.numel()]), name=f"{name}_flatidx")
    expanded = [*(int(s) for s in idx_val.shape), *rest]
    if list(values.meta["val"].shape) != expanded:
        values = edit.add(node, aten.expand.default, (values, expanded), name=f"{name}_expand")
    source = edit.add(node, aten.reshape.default, (values, [idx_val.numel(), *rest]), name=f"{name}_rows")
    return edit.add(node, aten.index_add.default, (base, 0, flat, source), name=name)

"""Indexing lowerings: masked loads (constant_pad_nd, cat), indirect loads (index_select, gather,
embedding, index.Tensor) and a one-hot scatter (scatter.value).

A masked load reads only where its condition holds (`ops.masked`), so a padded or concatenated
value reads each input only inside that input's range. An indirect load reads an index tensor,
wraps negative values and uses the result in the address (`ops.indirect_indexing`).

Note: eager raises on an out-of-range index; a kernel cannot. The generated load is masked to
the dim's range, so an out-of-range index never reads outside the buffer (it reads 0).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from fxcc.compiler_core.errors import UnsupportedOp
from fxcc.compiler_core.ir.nodes import Lazy, TensorValue, count_ops, make_loader
from fxcc.compiler_core.ir.ops import compute_dtype, ops
from fxcc.compiler_core.lowering.common import broadcast_loader, check_dtypes, is_tensor, remap_view
from fxcc.compiler_core.lowering.core import aten, current_graph, node_val, register_lowering
from fxcc.compiler_core.sizevars import Expr
from fxcc.compiler_core.symbolic import sizes_of

# A cat of more inputs than this stays one extern call (each input is a masked load per element).
MAX_CAT_INPUTS = 32
# A cat input whose body costs more ops than this is written to memory before the cat reads it.
CAT_PIECE_OPS_INLINE = 8
INDEX_DTYPES = (torch.int64, torch.int32)


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _in_range(i: Expr, lo: int | None, hi: int | None) -> Any:
    """`lo <= i < hi` as a bool value (None: no bound on that side)."""
    conds = []
    if lo is not None:
        conds.append(ops.ge(ops.index_expr(i, torch.int64), ops.constant(lo, torch.int64)))
    if hi is not None:
        conds.append(ops.lt(ops.index_expr(i, torch.int64), ops.constant(hi, torch.int64)))
    cond = conds[0]
    for c in conds[1:]:
        cond = ops.logical_and(cond, c)
    return cond


def _converted(value: TensorValue, dtype: torch.dtype) -> Callable[[Sequence[Expr]], Any]:
    load = make_loader(value)
    comp = compute_dtype(dtype)
    return lambda index: ops.to_dtype(load(index), comp)


@register_lowering(aten.constant_pad_nd.default)
def _constant_pad_nd(x: TensorValue, pad: Sequence[int], value: Any = 0) -> Lazy:
    """Each padded dim reads x at i - lo where lo <= i < lo + size, else `value`."""
    val = node_val()
    check_dtypes(x.dtype, val.dtype)
    if len(pad) % 2 or len(pad) // 2 > len(x.sizes) or not isinstance(value, (bool, int, float)):
        raise UnsupportedOp("constant_pad_nd with an odd pad list or a symbolic value")
    rank = len(x.sizes)
    lows = [0] * rank
    highs = [0] * rank
    for k in range(len(pad) // 2):
        lows[rank - 1 - k], highs[rank - 1 - k] = pad[2 * k], pad[2 * k + 1]
    load = _converted(x, val.dtype)
    fill = torch.tensor(value, dtype=val.dtype).item()  # eager casts the value to the dtype first
    bounds = [(d, lows[d] if lows[d] > 0 else None, lows[d] + x.sizes[d] if highs[d] > 0 else None)
              for d in range(rank)]
    bounds = [b for b in bounds if b[1] is not None or b[2] is not None]

    def inner(index: Sequence[Expr]) -> Any:
        source = [i - lo for i, lo in zip(index, lows)]
        if not bounds:
            return load(source)
        cond = _in_range(index[bounds[0][0]], bounds[0][1], bounds[0][2])
        for d, lo, hi in bounds[1:]:
            cond = ops.logical_and(cond, _in_range(index[d], lo, hi))
        return ops.masked(cond, lambda: load(source), fill)
    return Lazy(val.dtype, sizes_of(val), inner)


@register_lowering(aten.cat.default)
def _cat(tensors: Sequence[TensorValue], dim: int = 0) -> Lazy:
    """Piecewise: input k (at offset o_k along `dim`) is read where o_k <= i < o_k + n_k."""
    val = node_val()
    out = sizes_of(val)
    check_dtypes(val.dtype, *(t.dtype for t in tensors))
    rank = len(out)
    dim = _dim(dim, rank)
    # Note: a 1-d empty tensor joins a cat of any rank (legacy behaviour): it adds nothing.
    pieces = [t for t in tensors if len(t.sizes) == rank and t.sizes[dim] > 0]
    if not pieces:  # then the result is empty too
        return Lazy(val.dtype, out, lambda index: ops.constant(0, compute_dtype(val.dtype)))
    if len(pieces) > MAX_CAT_INPUTS:
        raise UnsupportedOp(f"cat of {len(pieces)} inputs")
    if len(pieces) > 1:
        pieces = [_cheap(t) for t in pieces]
    loads, offsets, start = [], [], 0
    for t in pieces:
        loads.append(_converted(t, val.dtype))
        offsets.append((start, start + t.sizes[dim]))
        start += t.sizes[dim]
    if start != out[dim]:
        raise UnsupportedOp("cat sizes do not add up")

    def piece(k: int, index: Sequence[Expr]) -> Any:
        lo, hi = offsets[k]
        shifted = [i - lo if d == dim else i for d, i in enumerate(index)]
        if len(pieces) == 1:
            return loads[k](shifted)
        cond = _in_range(index[dim], lo if k > 0 else None, hi if k < len(pieces) - 1 else None)
        return cond, ops.masked(cond, lambda: loads[k](shifted), 0)

    def inner(index: Sequence[Expr]) -> Any:
        if len(pieces) == 1:
            return piece(0, index)
        _, value = piece(len(pieces) - 1, index)
        for k in range(len(pieces) - 2, -1, -1):
            cond, v = piece(k, index)
            value = ops.where(cond, v, value)
        return value
    return Lazy(val.dtype, out, inner)


def _cheap(value: TensorValue) -> TensorValue:
    """`value`, written to memory first if computing it costs more than a few ops.

    Note: every element of a cat evaluates each piece's body (all but one masked off), so a
    costly piece is computed once into a buffer rather than once per piece of the output.
    """
    if isinstance(value, Lazy) and count_ops(value).ops > CAT_PIECE_OPS_INLINE:
        return current_graph().realize(value)
    return value


def _broadcast_sizes(*shapes: Sequence[Any]) -> tuple[Any, ...]:
    """numpy's broadcast of sizes that may be expressions (torch.broadcast_shapes takes ints):
    compared as expressions, so no guard; sizes that differ (neither 1) are not broadcast here."""
    rank = max(len(s) for s in shapes)
    out: list[Any] = []
    for k in range(rank):
        dims = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        wide = [d for d in dims if sympy.sympify(d) != 1]
        if any(sympy.sympify(d) != sympy.sympify(wide[0]) for d in wide[1:]):
            raise UnsupportedOp(f"index shapes {[list(s) for s in shapes]} do not broadcast")
        out.append(wide[0] if wide else 1)
    return tuple(out)


def _nothing(val: torch.Tensor) -> Lazy:
    """An empty result: it reads no index, so none can be out of range."""
    check_dtypes(val.dtype)
    return Lazy(val.dtype, sizes_of(val), lambda index: ops.constant(0, compute_dtype(val.dtype)))


def _as_1d(value: TensorValue) -> TensorValue:
    """A 0-d value seen as one element of a 1-d one (a 0-d tensor indexes as a dim of size 1;
    the lowering's result keeps the node's own 0-d sizes)."""
    if not is_tensor(value) or value.sizes:
        return value
    return remap_view(value, (1,), lambda idx: [])


def _padded(index: Sequence[Expr], rank: int) -> list[Expr]:
    """A 0-d result's (empty) index as the index of a 0-d operand seen through `_as_1d`."""
    return [sympy.Integer(0)] * (rank - len(index)) + list(index)


def _index_loader(index: TensorValue, sizes: Sequence[int]) -> Callable[[Sequence[Expr]], Any]:
    if not is_tensor(index) or index.dtype not in INDEX_DTYPES:
        raise UnsupportedOp("indexing with a non-integer (or boolean mask) index")
    return broadcast_loader(index, sizes)


def _indirect(load_index: Callable[[Sequence[Expr]], Any], where: Sequence[Expr], size: int) -> Expr:
    """The wrapped index value at `where`, as a symbol for addresses into a dim of `size`."""
    return ops.indirect_indexing(load_index(where), size)


def _check_indexable(*sizes: int) -> None:
    """Every index into an empty dim is out of range: eager raises, so such a node stays extern
    (unless the result is empty, when no index is ever read)."""
    if any(s == 0 for s in sizes) and node_val().numel() > 0:
        raise UnsupportedOp("indexing into an empty dim")


@register_lowering(aten.index_select.default)
def _index_select(x: TensorValue, dim: int, index: TensorValue) -> Lazy:
    val = node_val()
    if val.numel() == 0:
        return _nothing(val)
    check_dtypes(x.dtype)
    if not x.sizes:
        x = _as_1d(x)
    if len(index.sizes) > 1:
        raise UnsupportedOp("index_select with a multi-dim index")
    return _along_dim(x, dim, index, lambda i, d: [i[d]] if index.sizes else [])


@register_lowering(aten.gather.default)
def _gather(x: TensorValue, dim: int, index: TensorValue, *, sparse_grad: bool = False) -> Lazy:
    """out[i] = x[i with dim replaced by index[i]]."""
    val = node_val()
    if val.numel() == 0:
        return _nothing(val)
    check_dtypes(x.dtype)
    if not x.sizes:
        x, index = _as_1d(x), _as_1d(index)
    if len(index.sizes) != len(x.sizes):
        raise UnsupportedOp("gather with an index of another rank")
    return _along_dim(x, dim, index, lambda i, d: i)


def _along_dim(x: TensorValue, dim: int, index: TensorValue,
               where: Callable[[list[Expr], int], list[Expr]]) -> Lazy:
    """out[i] = x[i with `dim` replaced by index[where(i, dim)]] (index_select, gather)."""
    val = node_val()
    rank = len(x.sizes)
    dim = _dim(dim, rank)
    load_index = _index_loader(index, index.sizes)
    load = _converted(x, val.dtype)
    size = x.sizes[dim]
    _check_indexable(size)

    def inner(i: Sequence[Expr]) -> Any:
        full = list(_padded(i, rank))
        full[dim] = _indirect(load_index, where(list(full), dim), size)
        return load(full)
    return Lazy(val.dtype, sizes_of(val), inner)


@register_lowering(aten.scatter.value)
def _scatter_value(x: TensorValue, dim: int, index: TensorValue, value: Any) -> Lazy:
    """One element per slice along `dim` set to `value`: out[i] = value where index[i, dim → 0] == i[dim],
    else x[i]. A cross-entropy's backward (`scatter(zeros, 1, target[:, None], -1)`), fused with its
    readers instead of a fill and a scatter over the logits' size.

    Note: an index out of range sets nothing (eager raises); only an index of size 1 along `dim` and
    of x's sizes elsewhere is lowered (another scatter is an extern call)."""
    val = node_val()
    if val.numel() == 0:
        return _nothing(val)
    check_dtypes(x.dtype)
    rank = len(x.sizes)
    if not rank or not isinstance(value, (bool, int, float)):
        raise UnsupportedOp("scatter of a 0-d tensor or of a symbolic value")
    dim = _dim(dim, rank)
    if len(index.sizes) != rank or index.sizes[dim] != 1 or \
            any(index.sizes[d] != x.sizes[d] for d in range(rank) if d != dim):
        raise UnsupportedOp("scatter of more than one element per slice")
    load_index = _index_loader(index, x.sizes)  # broadcast along dim: the slice's one index
    load = _converted(x, val.dtype)
    fill = torch.tensor(value, dtype=val.dtype).item()  # eager casts the value to the dtype first
    comp = compute_dtype(val.dtype)

    def inner(i: Sequence[Expr]) -> Any:
        hit = ops.eq(ops.to_dtype(load_index(i), torch.int64), ops.index_expr(i[dim], torch.int64))
        return ops.where(hit, ops.constant(fill, comp), load(i))
    return Lazy(val.dtype, sizes_of(val), inner)


@register_lowering(aten.embedding.default)
def _embedding(weight: TensorValue, indices: TensorValue, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> Lazy:
    """weight[indices]: rows of a [num, dim] table (padding_idx matters only to the backward)."""
    val = node_val()
    if val.numel() == 0:
        return _nothing(val)
    check_dtypes(weight.dtype)
    if len(weight.sizes) != 2:
        raise UnsupportedOp("embedding of a table that is not 2-d")
    nidx = len(indices.sizes)
    load_index = _index_loader(indices, indices.sizes)
    load = _converted(weight, val.dtype)
    size = weight.sizes[0]
    _check_indexable(size)

    def inner(i: Sequence[Expr]) -> Any:
        return load([_indirect(load_index, i[:nidx], size), i[nidx]])
    return Lazy(val.dtype, sizes_of(val), inner)


@register_lowering(aten.index.Tensor, aten._unsafe_index.Tensor)
def _index(x: TensorValue, indices: Sequence[TensorValue | None]) -> Lazy:
    """Advanced indexing with integer tensors: the broadcast index dims replace the indexed dims
    where those are adjacent, else lead the result (numpy's rule)."""
    val = node_val()
    if val.numel() == 0:
        return _nothing(val)
    check_dtypes(x.dtype)
    rank = len(x.sizes)
    if len(indices) > rank:
        raise UnsupportedOp("more index tensors than dims")
    indices = list(indices) + [None] * (rank - len(indices))
    indexed = [d for d, t in enumerate(indices) if t is not None]
    if not indexed:
        raise UnsupportedOp("index with no index tensors")
    _check_indexable(*(x.sizes[d] for d in indexed))
    bshape = _broadcast_sizes(*(tuple(indices[d].sizes) for d in indexed))
    loaders = {d: _index_loader(indices[d], bshape) for d in indexed}
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    rest = [d for d in range(rank) if d not in loaders]
    nb = len(bshape)
    # Position in the output of each kept dim of x, and of the broadcast index dims.
    if adjacent:
        before = [d for d in rest if d < indexed[0]]
        bstart = len(before)
        place = {d: (k if d < indexed[0] else k + nb) for k, d in enumerate(rest)}
    else:
        bstart = 0
        place = {d: nb + k for k, d in enumerate(rest)}
    out = sizes_of(val)
    expect = [0] * (len(rest) + nb)
    for d in rest:
        expect[place[d]] = x.sizes[d]
    expect[bstart:bstart + nb] = bshape
    if tuple(expect) != out:
        raise UnsupportedOp(f"index result {list(out)}, expected {expect}")
    load = _converted(x, val.dtype)

    def inner(i: Sequence[Expr]) -> Any:
        bidx = list(i[bstart:bstart + nb])
        full: list[Expr] = [sympy.Integer(0)] * rank
        for d in rest:
            full[d] = i[place[d]]
        for d, ld in loaders.items():
            full[d] = _indirect(ld, bidx, x.sizes[d])
        return load(full)
    return Lazy(val.dtype, out, inner)

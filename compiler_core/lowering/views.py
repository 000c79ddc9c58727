"""View lowerings: permute, transpose, expand, slice, select, squeeze/unsqueeze, view/reshape, as_strided;
and fxcc.aligned_rows, a copy in a chosen layout.

Views are index remappings: on a buffer they give another StridedView (no copy); where the
result is not strided (reshape of non-contiguous data) they give a Lazy value that reads
through FloorDiv/ModularIndexing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
from torch import fx

from fxcc.compiler_core.errors import UnsupportedOp
from fxcc.compiler_core.ir.nodes import Lazy, StridedView, TensorValue, make_loader
from fxcc.compiler_core.ir.ops import compute_dtype, ops
from fxcc.compiler_core.lowering.common import remap_view
from fxcc.compiler_core.lowering.core import (
    aten,
    current_graph,
    current_node,
    node_val,
    prims,
    register_lowering,
)
from fxcc.compiler_core.sizevars import Expr, FloorDiv, ModularIndexing, flatten, numel, unflatten
from fxcc.compiler_core.symbolic import hint, is_symbolic, offset_of, sizes_of, strides_of, sym_value


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


@register_lowering(aten.permute.default)
def _permute(x: TensorValue, dims: Sequence[int]) -> TensorValue:
    dims = [_dim(d, len(x.sizes)) for d in dims]
    inverse = [dims.index(i) for i in range(len(dims))]
    return remap_view(x, [x.sizes[d] for d in dims], lambda idx: [idx[i] for i in inverse])


@register_lowering(aten.transpose.int)
def _transpose(x: TensorValue, a: int, b: int) -> TensorValue:
    dims = list(range(len(x.sizes)))
    if dims:
        a, b = _dim(a, len(dims)), _dim(b, len(dims))
        dims[a], dims[b] = dims[b], dims[a]
    return _permute(x, dims)


@register_lowering(aten.t.default)
def _t(x: TensorValue) -> TensorValue:
    return _transpose(x, 0, 1) if len(x.sizes) == 2 else x


@register_lowering(aten.expand.default)
def _expand(x: TensorValue, sizes: Sequence[int], *, implicit: bool = False) -> TensorValue:
    out = sizes_of(node_val())
    lead = len(out) - len(x.sizes)

    def remap(idx: Sequence[Expr]) -> list[Expr]:
        return [sympy.Integer(0) if own == 1 and o != 1 else i
                for i, own, o in zip(idx[lead:], x.sizes, out[lead:])]
    return remap_view(x, out, remap)


@register_lowering(aten.slice.Tensor)
def _slice(x: TensorValue, dim: int = 0, start: Any = None, end: Any = None, step: Any = 1) -> TensorValue:
    dim = _dim(dim, len(x.sizes))
    size = x.sizes[dim]
    bounds = [None if b is None else _size_value(b) for b in (start, end)]
    step = _size_value(step)
    out = list(x.sizes)
    if is_symbolic(size, *bounds, step):
        first, out[dim] = _symbolic_slice(size, *bounds, step, sizes_of(node_val())[dim])
        _check_first(dim, first, out[dim])
    else:
        r = range(int(size))[slice(*bounds, step)]
        out[dim], first = len(r), (r.start if len(r) else 0)

    def remap(idx: Sequence[Expr]) -> list[Expr]:
        idx = list(idx)
        idx[dim] = first + idx[dim] * step
        return idx
    return remap_view(x, out, remap)


def _size_value(v: Any) -> Any:
    """A slice argument as a size expression (an int, or a SymInt's expression: no guard)."""
    return v if isinstance(v, sympy.Basic) else sym_value(v)


def _symbolic_slice(size: Any, start: Any, end: Any, step: Any, length: Any) -> tuple[Any, Any]:
    """(first index, length) of a slice with a symbolic size or bound, without a guard.

    Note: Python's range() would make every SymInt an int, a guard that specializes the plan to
    one size (BERT's position ids sliced to the sequence length: a plan per length). Eager's
    clamping is the ShapeEnv's: the result's length, from the node's FakeTensor, is checked
    against the unclamped bounds as expressions (a negative bound counts from the end); where
    they differ (a bound that clamping moved), the slice is an extern call.
    """
    if not isinstance(step, int) or step < 1:
        raise UnsupportedOp(f"slice with step {step}")
    big = 1 << 62  # `x[a:]` arrives as end = sys.maxsize

    def bound(b: Any, default: Any) -> Any:
        if b is None or (isinstance(b, int) and b >= big):
            return default
        if isinstance(b, int):
            return size + b if b < 0 else b
        if b.is_negative:  # -s1: counts from the end (size symbols are positive)
            return size + b
        if b.is_nonnegative:
            return b
        raise UnsupportedOp(f"slice bound {b} of unknown sign")

    first, stop = bound(start, 0), bound(end, size)
    count = stop - first if step == 1 else FloorDiv(stop - first + step - 1, step)
    if sympy.expand(sympy.sympify(count) - sympy.sympify(length)) != 0:
        raise UnsupportedOp(f"slice [{start}:{end}:{step}] of a size-{size} dim gives {length}, "
                            f"not {count}: eager clamped it")
    return first, length


def _check_first(dim: int, first: Any, length: Any) -> None:
    """The slice's first index against its FakeTensor's storage offset (the ShapeEnv's own
    reading of the bounds), compared as expressions: a slice that reads elsewhere is an extern."""
    node = current_node()
    src, out = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None, node_val()
    if not isinstance(src, torch.Tensor) or hint(length) == 0:
        return
    moved = sympy.sympify(offset_of(out)) - sympy.sympify(offset_of(src))
    if sympy.expand(moved - sympy.sympify(first) * sympy.sympify(strides_of(src)[dim])) != 0:
        raise UnsupportedOp(f"slice starts at {first}, its FakeTensor at offset {moved}")


@register_lowering(aten.select.int)
def _select(x: TensorValue, dim: int, index: int) -> TensorValue:
    dim = _dim(dim, len(x.sizes))
    index = index + x.sizes[dim] if index < 0 else index
    out = [s for i, s in enumerate(x.sizes) if i != dim]
    return remap_view(x, out, lambda idx: [*idx[:dim], sympy.Integer(index), *idx[dim:]])


@register_lowering(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
                   aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                   prims.collapse_view.default, aten.alias.default)
def _reshape(x: TensorValue, *args: Any) -> TensorValue:
    out = sizes_of(node_val())
    if numel(out) != numel(x.sizes):
        raise UnsupportedOp("reshape changes the element count")
    if tuple(x.sizes) == out:
        return x
    if numel(out) == 0:  # nothing to read: no index map (and unflatten would divide by a size 0)
        return Lazy(x.dtype, out, lambda idx: ops.constant(0, compute_dtype(x.dtype)))
    return remap_view(x, out, lambda idx: unflatten(flatten(idx, out), x.sizes))


# Note: aten.as_strided stays an extern call: it addresses storage absolutely, and an input's
# storage offset at run time need not be the traced one.


@register_lowering(aten.split_with_sizes.default, aten.split.Tensor)
def _split(x: TensorValue, sizes: Any, dim: int = 0) -> tuple[TensorValue, ...]:
    dim = _dim(dim, len(x.sizes))
    if isinstance(sizes, int):
        n = x.sizes[dim]
        sizes = [min(sizes, n - start) for start in range(0, n, sizes)] or [0]
    pieces, start = [], 0
    for size in sizes:
        pieces.append(_slice(x, dim, start, start + size))
        start += size
    return tuple(pieces)


@register_lowering(aten.unbind.int)
def _unbind(x: TensorValue, dim: int = 0) -> tuple[TensorValue, ...]:
    dim = _dim(dim, len(x.sizes))
    return tuple(_select(x, dim, i) for i in range(x.sizes[dim]))


@register_lowering(aten.flip.default)
def _flip(x: TensorValue, dims: Sequence[int]) -> TensorValue:
    """Reversed dims: index n - 1 - i (a Lazy read; strides stay non-negative in this IR)."""
    flipped = {_dim(d, len(x.sizes)) for d in dims}

    def remap(idx: Sequence[Expr]) -> list[Expr]:
        return [x.sizes[d] - 1 - i if d in flipped and x.sizes[d] > 1 else i for d, i in enumerate(idx)]
    return remap_view(x, x.sizes, remap)


@register_lowering(aten.diagonal.default)
def _diagonal(x: TensorValue, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TensorValue:
    """The other dims in order, then the diagonal: element k is x[..., k - min(offset, 0), k + max(offset, 0)]."""
    rank = len(x.sizes)
    d1, d2 = _dim(dim1, rank), _dim(dim2, rank)
    if d1 == d2:
        raise UnsupportedOp("diagonal of one dim with itself")
    out = tuple(int(s) for s in node_val().shape)
    rest = [d for d in range(rank) if d not in (d1, d2)]
    lo1, lo2 = max(-offset, 0), max(offset, 0)

    def remap(idx: Sequence[Expr]) -> list[Expr]:
        full: list[Expr] = [sympy.Integer(0)] * rank
        for k, d in enumerate(rest):
            full[d] = idx[k]
        full[d1] = idx[-1] + lo1
        full[d2] = idx[-1] + lo2
        return full
    return remap_view(x, out, remap)


@register_lowering(aten.repeat.default)
def _repeat(x: TensorValue, repeats: Sequence[int]) -> TensorValue:
    """Tiled: output index i reads x at i mod size (new leading dims are ignored)."""
    out = tuple(int(s) for s in node_val().shape)
    if numel(out) == 0:
        return Lazy(x.dtype, out, lambda idx: ops.constant(0, compute_dtype(x.dtype)))
    lead = len(out) - len(x.sizes)

    def remap(idx: Sequence[Expr]) -> list[Expr]:
        return [ModularIndexing(i, 1, n) for i, n in zip(idx[lead:], x.sizes)]
    return remap_view(x, out, remap)


@register_lowering(aten.unfold.default)
def _unfold(x: TensorValue, dim: int, size: int, step: int) -> TensorValue:
    """Windows along `dim` as a new last dim: out[..., w, ..., k] = x[..., w * step + k, ...]."""
    rank = len(x.sizes)
    out = tuple(int(s) for s in node_val().shape)
    if rank == 0:
        return remap_view(x, out, lambda idx: [])
    dim = _dim(dim, rank)

    def remap(idx: Sequence[Expr]) -> list[Expr]:
        src = list(idx[:rank])
        src[dim] = idx[dim] * step + idx[rank]
        return src
    return remap_view(x, out, remap)


def _aligned_rows_op() -> Any:
    from fxcc.compiler_core import fxcc_ops

    return fxcc_ops.aligned_rows._opoverload


@register_lowering(_aligned_rows_op())
def _aligned_rows(x: TensorValue, align: int) -> StridedView:
    """x written to a buffer of the node's own layout, rows `align`-aligned (passes/pad_mm.py): the
    kernel that computes x (or copies it) stores with that row stride; the gaps stay unwritten."""
    val = node_val()
    if not isinstance(x, Lazy):
        x = Lazy(x.dtype, x.sizes, make_loader(x))
    return current_graph().realize(x, strides_of(val))

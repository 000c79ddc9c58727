"""View lowerings: permute, transpose, expand, slice, select, squeeze/unsqueeze, view/reshape, as_strided.

Views are index remappings: on a buffer they give another StridedView (no copy); where the
result is not strided (reshape of non-contiguous data) they give a Lazy value that reads
through FloorDiv/ModularIndexing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from compiler_core.errors import UnsupportedOp
from compiler_core.ir.nodes import TensorValue
from compiler_core.lowering import aten, node_val, prims, register_lowering
from compiler_core.lowering.common import remap_view
from compiler_core.sizevars import Expr, flatten, numel, unflatten
from compiler_core.symbolic import sizes_of


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
def _slice(x: TensorValue, dim: int = 0, start: int | None = None, end: int | None = None,
           step: int = 1) -> TensorValue:
    dim = _dim(dim, len(x.sizes))
    r = range(x.sizes[dim])[slice(start, end, step)]
    out = list(x.sizes)
    out[dim] = len(r)
    first = r.start if len(r) else 0

    def remap(idx: Sequence[Expr]) -> list[Expr]:
        idx = list(idx)
        idx[dim] = first + idx[dim] * r.step
        return idx
    return remap_view(x, out, remap)


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

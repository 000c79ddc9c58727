"""Shared lowering work: type promotion, broadcasting, scalar operands, and building Lazy pointwise values."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from fxcc.compiler_core.errors import UnsupportedOp
from fxcc.compiler_core.ir.nodes import Lazy, Loader, StridedView, TensorValue, index_vars, make_loader
from fxcc.compiler_core.ir.ops import compute_dtype, ops
from fxcc.compiler_core.lowering.core import current_graph, node_val
from fxcc.compiler_core.sizevars import Expr, FloorDiv, ModularIndexing, linear_index, simplify_index
from fxcc.compiler_core.symbolic import hints_of, is_symbolic, sizes_of
from fxcc.compiler_core.target import capabilities

Kind = ELEMENTWISE_TYPE_PROMOTION_KIND
SUPPORTED_DTYPES = frozenset({
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint8, torch.bool,
})


def is_tensor(x: Any) -> bool:
    return isinstance(x, (StridedView, Lazy))


def as_meta(x: Any) -> Any:
    """A meta tensor standing for a value (for torch's promotion rules); scalars pass through."""
    if is_tensor(x):
        return torch.empty(hints_of(x.sizes), dtype=x.dtype, device="meta")
    return x


def check_dtypes(*dtypes: torch.dtype) -> None:
    for d in dtypes:
        if d not in SUPPORTED_DTYPES:
            raise UnsupportedOp(f"dtype {d} has no native lowering")


def promote(args: Sequence[Any], kind: Kind) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) as torch's elementwise ops pick them."""
    metas = [as_meta(a) for a in args if is_tensor(a) or isinstance(a, (bool, int, float))]
    comp, res = elementwise_dtypes(*metas, type_promotion_kind=kind)
    return compute_dtype(comp), res


def broadcast_loader(value: TensorValue, sizes: Sequence[int]) -> Loader:
    """A loader over `sizes` reading `value` broadcast (numpy rules) to them."""
    inner = make_loader(value)
    lead = len(sizes) - len(value.sizes)
    own = value.sizes

    def load(index: Sequence[Expr]) -> Any:
        idx = [sympy.Integer(0) if s == 1 and o != 1 else i
               for i, s, o in zip(index[lead:], own, sizes[lead:])]
        return inner(idx)
    return load


def operand(x: Any, sizes: Sequence[int], dtype: torch.dtype,
            common: torch.dtype | None = None) -> Callable[[Sequence[Expr]], Any]:
    """A loader for a tensor or Python scalar operand, converted to `dtype`.

    A scalar is first rounded to `common` (the operands' promoted dtype), as eager does before
    computing in fp32: `x_fp16 < 0.1` compares against fp16(0.1), not fp32(0.1).
    """
    if is_tensor(x):
        check_dtypes(x.dtype)
        load = broadcast_loader(x, sizes)
        return lambda index: ops.to_dtype(load(index), dtype)
    if isinstance(x, (bool, int, float)):
        if common is not None and common.is_floating_point and not isinstance(x, bool):
            x = torch.tensor(x, dtype=common).item()
        return lambda index: ops.constant(x, dtype)
    raise UnsupportedOp(f"operand of type {type(x).__name__}")


def pointwise(fn: Callable[..., Any], *args: Any, kind: Kind = Kind.DEFAULT,
              compute: torch.dtype | None = None) -> Lazy:
    """The Lazy value of `fn` applied elementwise to broadcast, promoted operands.

    The result's sizes and dtype come from the node's FakeTensor; torch's promotion must agree.
    """
    val = node_val()
    sizes, out_dtype = sizes_of(val), val.dtype
    check_dtypes(out_dtype)
    comp, res = promote(args, kind)
    if res != out_dtype:
        raise UnsupportedOp(f"promotion gives {res}, eager gives {out_dtype}")
    comp = compute or comp
    common = promote(args, Kind.NO_OPMATH)[1] if len(args) > 1 else None
    loaders = [operand(a, sizes, comp, common) for a in args]
    store_dtype = compute_dtype(out_dtype)

    def inner(index: Sequence[Expr]) -> Any:
        return ops.to_dtype(fn(*[ld(index) for ld in loaders]), store_dtype)
    return Lazy(out_dtype, sizes, inner)


def remap_view(value: TensorValue, sizes: Sequence[int],
               remap: Callable[[Sequence[Expr]], Sequence[Expr]]) -> TensorValue:
    """`value` seen through an index remapping: a StridedView when the result is strided, else Lazy."""
    sizes = tuple(s if is_symbolic(s) else int(s) for s in sizes)
    if isinstance(value, StridedView):
        syms = index_vars("v", sizes)
        expr = linear_index(remap(syms), value.strides, value.offset)
        expr = simplify_index(expr, {s: n for s, n in zip(syms, sizes)})
        strided = _as_strides(expr, syms, sizes)
        if strided is not None:
            strides, offset = strided
            return StridedView(value.buffer, sizes, strides, offset)
    inner = make_loader(value)
    return Lazy(value.dtype, sizes, lambda index: inner(remap(index)))


def _as_strides(expr: Expr, syms: list[sympy.Symbol], sizes: Sequence[Any]) -> tuple[tuple[Any, ...], Any] | None:
    """(strides, offset) when `expr` is linear in the index symbols; strides and offset may be
    size expressions (symbolic sizes), never negative."""
    return _strides_of(expr, tuple(syms), tuple(sizes))


@functools.lru_cache(maxsize=1 << 14)  # pure, and asked again in every layer (sizevars.simplify_index)
def _strides_of(expr: Expr, syms: tuple[sympy.Symbol, ...], sizes: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any] | None:
    if expr.has(FloorDiv, ModularIndexing):
        return None
    expr = expr.subs({s: 0 for s, n in zip(syms, sizes) if n == 1})
    if not syms:  # a 0-d view: one element at a fixed offset
        return ((), int(expr)) if expr.is_Integer and expr >= 0 else None
    try:
        poly = sympy.Poly(expr, *syms)
    except sympy.PolynomialError:
        return None
    if poly.total_degree() > 1:
        return None
    strides = tuple(_size(expr.coeff(s)) if n != 1 else 0 for s, n in zip(syms, sizes))
    offset = _size(expr.subs({s: 0 for s in syms}))
    if any(x is None for x in (*strides, offset)):
        return None
    return strides, offset


def _size(e: Expr) -> Any:
    """An int, or a size expression that cannot be negative; None for anything else."""
    if e.is_Integer:
        return int(e) if e >= 0 else None
    if e.free_symbols - {x for x in e.free_symbols if x.is_positive} or not e.is_nonnegative:
        return None
    return e


def require(*ops_needed: str) -> None:
    """Raise UnsupportedOp unless the target's renderer spells every op exactly."""
    target = current_graph().target
    caps = capabilities(target)
    for op in ops_needed:
        if not caps.spells(op):
            raise UnsupportedOp(f"{op} has no exact {target} spelling")

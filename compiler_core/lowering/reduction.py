"""Reduction lowerings: sum, mean, amax/amin, prod, var/var_mean and layer norm (Welford), softmax, log_softmax (pooling: lowering/pooling.py).

Each reduction becomes a `Reduction` buffer (accumulated in fp32 for fp16/bf16) plus Lazy
pointwise work around it; the scheduler then fuses the prologue and epilogue into one kernel
when the rows fit in registers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxcc.compiler_core.errors import UnsupportedOp
from fxcc.compiler_core.ir.nodes import (
    COLUMN_RNUMEL_MIN,
    Lazy,
    Pointwise,
    Reduction,
    StridedView,
    TensorValue,
    is_column,
    make_loader,
)
from fxcc.compiler_core.ir.ops import WELFORD, compute_dtype, ops
from fxcc.compiler_core.lowering.common import broadcast_loader, check_dtypes, require
from fxcc.compiler_core.lowering.core import aten, current_graph, node_val, register_lowering
from fxcc.compiler_core.sizevars import Expr, flatten, numel, unflatten
from fxcc.compiler_core.symbolic import is_symbolic, sizes_of, strides_of
from fxcc.compiler_core.target import Capabilities, capabilities

Prologue = Callable[[Any, Sequence[Expr]], Any]


def _dims(x: TensorValue, dims: Any) -> list[int]:
    rank = len(x.sizes)
    if rank == 0:
        return []  # dim 0 or -1 of a 0-d tensor: the one element, reduced over nothing
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d + rank if d < 0 else d for d in dims})


def reduce(x: TensorValue, dims: Sequence[int], keepdim: bool, rtype: str, acc: torch.dtype,
           prologue: Prologue | None = None) -> StridedView:
    """A Reduction buffer of `rtype` over `dims` of `x` (in dtype `acc`); `prologue(v, full_index)`
    transforms each element first."""
    out, rsizes, inner = _reduction_body(x, dims, keepdim, acc, prologue)
    if numel(out) == 0 or numel(rsizes) == 0:
        return _empty_reduction(out, rtype, acc)
    red = Reduction(acc, out, rsizes, rtype, inner, tuple(x.sizes), tuple(dims))
    split = _split_plan(red, capabilities(current_graph().target))
    if split:
        return _split_reduce(red, *split)
    return current_graph().add_computed(red)


def _reduction_body(x: TensorValue, dims: Sequence[int], keepdim: bool, acc: torch.dtype,
                    prologue: Prologue | None) -> tuple[tuple[int, ...], tuple[int, ...], Any]:
    """(output sizes, reduced sizes, body) of a reduction over `dims` of `x`."""
    sizes = x.sizes
    kept = [d for d in range(len(sizes)) if d not in dims]
    out = tuple(1 if d in dims else s for d, s in enumerate(sizes)) if keepdim else tuple(sizes[d] for d in kept)
    rsizes = tuple(sizes[d] for d in dims)
    load = make_loader(x)

    def inner(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        full: list[Any] = [None] * len(sizes)
        for k, d in enumerate(kept):
            full[d] = index[d] if keepdim else index[k]
        for k, d in enumerate(dims):
            full[d] = rindex[k]
        v = ops.to_dtype(load(full), acc)
        return prologue(v, full) if prologue else v
    return out, rsizes, inner


def welford(x: TensorValue, dims: Sequence[int], keepdim: bool, acc: torch.dtype) -> tuple[StridedView, StridedView]:
    """(mean, sum of squared deviations from it) buffers of `x` over `dims`, by one Welford
    reduction: x is read once for both (split in two stages as `reduce` splits, partials
    combined by Chan's formula). codegen.triton's _welford_* say how each kernel form computes it.
    """
    out, rsizes, inner = _reduction_body(x, dims, keepdim, acc, None)
    g = current_graph()
    if numel(out) == 0 or numel(rsizes) == 0:
        nothing = float("nan") if numel(rsizes) == 0 else 0.0  # the mean of no elements
        mean = g.add_computed(Pointwise(acc, out, lambda index: ops.constant(nothing, acc)))
        return mean, _empty_reduction(out, "sum", acc)
    red = Reduction(acc, out, rsizes, WELFORD[0], inner, tuple(x.sizes), tuple(dims))
    split = _split_plan(red, capabilities(g.target))
    if split:
        return _split_welford(red, *split)
    return g.add_computed(red), g.add_computed(dataclasses.replace(red, reduction_type=WELFORD[1]))


def _empty_reduction(out: tuple[int, ...], rtype: str, acc: torch.dtype) -> StridedView:
    """A reduction with no outputs (an empty buffer) or over no elements (the identity: 0 for sum,
    1 for prod; eager rejects max/min over nothing)."""
    identity = {"sum": 0, "prod": 1}.get(rtype)
    if identity is None and numel(out) != 0:
        raise UnsupportedOp(f"{rtype} over no elements")
    value = identity or 0
    return current_graph().add_computed(Pointwise(acc, out, lambda index: ops.constant(value, acc)))


# Without an occupancy model (the interpreter): a few outputs over very long rows reduce in two
# stages, so that the first has many programs.
SPLIT_MIN_RNUMEL = 1 << 16
SPLIT_MAX_OUTPUTS = 64
# With one (CUDA): a reduction whose programs would not fill FILL_WAVES waves of the device's SMs
# splits its rows into chunks, a first stage of (chunk, output) programs and a second that
# reduces the chunks' partials. Note: several waves, since a loop of loads keeps a few KB in
# flight per program: an SM needs several programs resident to hide memory latency.
FILL_WAVES = 4
# Outputs one program of a column reduction covers (codegen.triton's column tile), and one of a
# row reduction too long for registers (a row per program).
COLUMN_PROGRAM_OUTPUTS = 64
# Elements of a row each first-stage program reduces at least: a few iterations of the column
# tile's loop (16 deep), and two looped row tiles (2048 wide): enough to amortise a program's start
# and its partial's store and reload.
COLUMN_CHUNK_MIN = 64
ROW_CHUNK_MIN = 4096
# At most this many chunks: the second stage then reduces rows short enough for one persistent
# tile (a column reduction of at most COLUMN_RNUMEL_MIN partials), not a loop of its own.
SPLIT_MAX = COLUMN_RNUMEL_MIN


def _split_plan(red: Reduction, caps: Capabilities) -> tuple[int, bool] | None:
    """(chunks per row, whether a column reduction) for a reduction to split; None: one stage."""
    outputs, rnumel = numel(red.ranges), numel(red.reduction_ranges)
    if is_symbolic(outputs, rnumel):
        return None  # Note: a split picked for one size could be wrong for another
    if not caps.sm_count:
        if outputs > SPLIT_MAX_OUTPUTS or rnumel < SPLIT_MIN_RNUMEL:
            return None
        split = next((s for s in (1024, 512, 256, 128, 64) if rnumel % s == 0), None)
        return (split, is_column(red)) if split else None
    if rnumel <= COLUMN_RNUMEL_MIN:
        return None  # see _split_factor
    column = is_column(red)
    split = _split_factor(outputs, rnumel, column, caps.sm_count)
    return (split, column) if split else None


def _split_factor(outputs: int, rnumel: int, column: bool, sm_count: int) -> int | None:
    """Into how many chunks to split each row on a device of `sm_count` SMs (None: do not).

    Note: only rows that a kernel loops over (a column's longer than COLUMN_RNUMEL_MIN, a row's
    longer than ROW_CHUNK_MIN): a row in one persistent tile also fuses the work around it (a
    softmax's max, sum and normalisation in one kernel), which two stages would not.
    """
    if rnumel <= COLUMN_RNUMEL_MIN:
        return None
    programs = -(-outputs // COLUMN_PROGRAM_OUTPUTS) if column else outputs
    fill = FILL_WAVES * sm_count
    most = min(SPLIT_MAX, rnumel // (COLUMN_CHUNK_MIN if column else ROW_CHUNK_MIN))
    if programs >= fill or most < 2:
        return None
    want = min(most, -(-fill // programs))
    # Note: a split that divides the rows needs no mask on the first stage's loads; the nearest
    # one within a quarter of the wanted count, else the wanted count with the last chunk short.
    near = [s for s in range(max(2, want - want // 4), min(most, want + want // 4) + 1) if rnumel % s == 0]
    return min(near, key=lambda s: (abs(s - want), -s)) if near else want


def _identity(rtype: str, acc: torch.dtype) -> float | int:
    """What reducing by `rtype` in `acc` leaves unchanged (the value of a chunk's missing tail)."""
    if rtype == "sum":
        return 0
    if rtype == "prod":
        return 1
    if acc.is_floating_point:
        return float("-inf") if rtype == "max" else float("inf")
    info = torch.iinfo(acc)
    return info.min if rtype == "max" else info.max


def _split_reduce(red: Reduction, split: int, column: bool) -> StridedView:
    """reduce(rows) == reduce over `split` chunks of reduce(chunk): exact for max/min, reassociated
    for sum/prod (as any parallel reduction is).

    Note: the partial buffer is (split, *out) for a column reduction, so adjacent outputs of the
    first stage are adjacent elements of one chunk (its loads coalesce, as the unsplit reduction's
    would), and the second stage is a short column reduction; a row reduction's is (*out, split),
    so both stages read along rows.
    """
    rtype, acc = red.reduction_type, red.dtype
    first = _chunk_body(red, split, column, _identity(rtype, acc))
    g = current_graph()
    partial = g.add_computed(_first_stage(red, split, column, rtype, first))
    load = make_loader(partial)
    return g.add_computed(Reduction(acc, red.ranges, (split,), rtype,
                                    lambda index, rindex: load(_partial_index(index, rindex, column))))


def _split_welford(red: Reduction, split: int, column: bool) -> tuple[StridedView, StridedView]:
    """(mean, m2) of a Welford reduction in two stages: each chunk's (mean, m2, weight) (a chunk's
    missing tail weighs nothing), then the chunks' triples combined (see _split_reduce's Note for
    the partials' layout)."""
    acc = red.dtype
    rnumel = numel(red.reduction_ranges)
    chunk = -(-rnumel // split)

    def first(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        value = _chunk_body(red, split, column, 0)(index, rindex)
        if chunk * split == rnumel:
            return value
        inside = _chunk_inside(index, rindex, split, column, rnumel)
        return value, ops.constant(0.0, acc), ops.to_dtype(inside, acc)
    g = current_graph()
    loads = [make_loader(g.add_computed(_first_stage(red, split, column, part, first))) for part in WELFORD]

    def second(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        at = _partial_index(index, rindex, column)
        return tuple(load(at) for load in loads)
    final = Reduction(acc, red.ranges, (split,), WELFORD[0], second)
    return g.add_computed(final), g.add_computed(dataclasses.replace(final, reduction_type=WELFORD[1]))


def _first_stage(red: Reduction, split: int, column: bool, rtype: str, body: Any) -> Reduction:
    chunk = -(-numel(red.reduction_ranges) // split)
    out = (split, *red.ranges) if column else (*red.ranges, split)
    return Reduction(red.dtype, out, (chunk,), rtype, body, split_stage=True)


def _partial_index(index: Sequence[Expr], rindex: Sequence[Expr], column: bool) -> list[Expr]:
    return [rindex[0], *index] if column else [*index, rindex[0]]


def _chunk_inside(index: Sequence[Expr], rindex: Sequence[Expr], split: int, column: bool, rnumel: int) -> Any:
    """Whether a first stage's element lies in the row (the last chunk may be short)."""
    chunk = -(-rnumel // split)
    piece = index[0] if column else index[-1]
    pos = torch.int32 if chunk * split < 2**31 else torch.int64
    return ops.lt(ops.index_expr(piece * chunk + rindex[0], pos), ops.constant(rnumel, pos))


def _chunk_body(red: Reduction, split: int, column: bool, missing: float) -> Any:
    """A first stage's body: `red`'s body over one chunk of each row (`missing` past the row's end)."""
    rsizes, inner = red.reduction_ranges, red.inner_fn
    rnumel = numel(rsizes)
    chunk = -(-rnumel // split)

    def first(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
        piece, kept = (index[0], index[1:]) if column else (index[-1], index[:-1])
        flat = piece * chunk + rindex[0]
        if chunk * split == rnumel:
            return inner(kept, unflatten(flat, rsizes))
        inside = _chunk_inside(index, rindex, split, column, rnumel)
        return ops.masked(inside, lambda: inner(kept, unflatten(flat, rsizes)), missing)
    return first


def _epilogue(dtype: torch.dtype, sizes: Sequence[int], fn: Callable[..., Any], *bufs: TensorValue) -> Lazy:
    loaders = [broadcast_loader(b, sizes) for b in bufs]
    comp = compute_dtype(dtype)
    return Lazy(dtype, tuple(sizes), lambda index: ops.to_dtype(fn(*[ld(index) for ld in loaders]), comp))


def _as_is(val: torch.Tensor, buf: TensorValue) -> TensorValue:
    """A reduction's value: its buffer itself where that holds eager's result in eager's dtype
    and layout, else that buffer cast (a Lazy epilogue).

    Note: an identity epilogue left the value Lazy, so a graph output of a sum was written again
    by a copy, fused into whichever later kernel took it, that loaded the sums its own kernel
    had just stored; an extern call reading it got such a copy too.
    """
    if isinstance(buf, StridedView) and buf.is_whole_buffer() and buf.dtype == val.dtype \
            and tuple(buf.sizes) == sizes_of(val) \
            and all(n == 1 or a == b for n, a, b in zip(buf.sizes, buf.strides, strides_of(val))):
        return buf
    return _epilogue(val.dtype, sizes_of(val), lambda v: v, buf)


def _acc_dtype(out: torch.dtype) -> torch.dtype:
    return compute_dtype(out)


def _simple(rtype: str) -> Callable[..., TensorValue]:
    def lower(x: TensorValue, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorValue:
        val = node_val()
        check_dtypes(x.dtype, val.dtype)
        if rtype in ("max", "min", "prod") and x.dtype == torch.bool:
            raise UnsupportedOp(f"{rtype} of bool")
        dims = _dims(x, dims)
        acc = _acc_dtype(val.dtype)
        if numel([x.sizes[d] for d in dims]) == 1:
            load = make_loader(x)
            sizes = sizes_of(val)
            squeezed = [d for d in range(len(x.sizes)) if d not in dims or keepdim]

            def one(index: Sequence[Expr]) -> Any:
                full = [0] * len(x.sizes)
                for k, d in enumerate(squeezed):
                    full[d] = index[k]
                return ops.to_dtype(load(full), acc)
            return Lazy(val.dtype, sizes, one)
        return _as_is(val, reduce(x, dims, keepdim, rtype, acc))
    return lower


register_lowering(aten.sum.dim_IntList, aten.sum.default)(_simple("sum"))
register_lowering(aten.amax.default)(_simple("max"))
register_lowering(aten.amin.default)(_simple("min"))


@register_lowering(aten.prod.dim_int, aten.prod.default)
def _prod(x: TensorValue, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorValue:
    return _simple("prod")(x, dim, keepdim)


@register_lowering(aten.mean.dim, aten.mean.default)
def _mean(x: TensorValue, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Lazy:
    val = node_val()
    check_dtypes(x.dtype, val.dtype)
    if not val.dtype.is_floating_point:
        raise UnsupportedOp("mean of integers")
    dims = _dims(x, dims)
    n = numel([x.sizes[d] for d in dims])
    acc = _acc_dtype(val.dtype)
    buf = reduce(x, dims, keepdim, "sum", acc)
    return _epilogue(val.dtype, sizes_of(val), lambda s: ops.truediv(s, ops.constant(float(n), acc)), buf)


def _keep_or_squeeze(buf: StridedView, dims: list[int], keepdim: bool, sizes: Sequence[int]) -> TensorValue:
    if keepdim:
        return buf
    kept = [d for d in range(len(buf.sizes)) if d not in dims]
    return StridedView(buf.buffer, tuple(sizes), tuple(buf.strides[d] for d in kept), buf.offset)


def _var_parts(x: TensorValue, dims: Any, correction: Any, keepdim: bool) -> tuple[Lazy, Lazy]:
    val = node_val()
    out = val[0] if isinstance(val, (tuple, list)) else val
    check_dtypes(x.dtype, out.dtype)
    if not out.dtype.is_floating_point:
        raise UnsupportedOp("variance of integers")
    dims = _dims(x, dims)
    acc = _acc_dtype(out.dtype)
    corr = 1.0 if correction is None else float(correction)
    n = numel([x.sizes[d] for d in dims])
    denom = max(0.0, n - corr)
    mean, m2 = welford(x, dims, True, acc)
    sizes = sizes_of(out)
    mean_v = _keep_or_squeeze(mean, dims, keepdim, sizes)
    m2_v = _keep_or_squeeze(m2, dims, keepdim, sizes)
    var = _epilogue(out.dtype, sizes, lambda s: ops.truediv(s, ops.constant(denom, acc)), m2_v)
    return var, _epilogue(out.dtype, sizes, lambda m: m, mean_v)


@register_lowering(aten.var.correction)
def _var(x: TensorValue, dims: Any = None, *, correction: Any = None, keepdim: bool = False) -> Lazy:
    return _var_parts(x, dims, correction, keepdim)[0]


@register_lowering(aten.var_mean.correction)
def _var_mean(x: TensorValue, dims: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> tuple[Lazy, Lazy]:
    return _var_parts(x, dims, correction, keepdim)


def _softmax_parts(x: TensorValue, dim: int) -> tuple[torch.dtype, Any, Any, Any]:
    val = node_val()
    check_dtypes(x.dtype, val.dtype)
    if not val.dtype.is_floating_point:
        raise UnsupportedOp("softmax of integers")
    require("exp")
    dims = _dims(x, dim)
    acc = compute_dtype(val.dtype)
    if val.dtype == torch.float64 or x.dtype == torch.float64:
        acc = torch.float64
    peak = reduce(x, dims, True, "max", acc)
    peak_load = broadcast_loader(peak, x.sizes)
    denom = reduce(x, dims, True, "sum", acc, lambda v, full: ops.exp(ops.sub(v, peak_load(full))))
    return acc, make_loader(x), peak_load, broadcast_loader(denom, x.sizes)


@register_lowering(aten._softmax.default)
def _softmax(x: TensorValue, dim: int, half_to_float: bool) -> Lazy:
    acc, load, peak, denom = _softmax_parts(x, dim)
    out = node_val().dtype

    def inner(index: Sequence[Expr]) -> Any:
        v = ops.to_dtype(load(index), acc)
        e = ops.exp(ops.sub(v, peak(index)))
        return ops.to_dtype(ops.truediv(e, denom(index)), compute_dtype(out))
    return Lazy(out, x.sizes, inner)


@register_lowering(aten._log_softmax.default)
def _log_softmax(x: TensorValue, dim: int, half_to_float: bool) -> Lazy:
    require("log")
    acc, load, peak, denom = _softmax_parts(x, dim)
    out = node_val().dtype

    def inner(index: Sequence[Expr]) -> Any:
        v = ops.to_dtype(load(index), acc)
        return ops.to_dtype(ops.sub(ops.sub(v, peak(index)), ops.log(denom(index))), compute_dtype(out))
    return Lazy(out, x.sizes, inner)


@register_lowering(aten.native_layer_norm.default)
def _layer_norm(x: TensorValue, normalized_shape: Sequence[int], weight: TensorValue | None,
                bias: TensorValue | None, eps: float) -> tuple[Lazy, Lazy, Lazy]:
    out_val, mean_val, rstd_val = node_val()
    check_dtypes(x.dtype, out_val.dtype, mean_val.dtype)
    if not x.dtype.is_floating_point:
        raise UnsupportedOp("layer norm of integers")
    require("rsqrt")
    rank = len(x.sizes)
    dims = list(range(rank - len(normalized_shape), rank))
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    total, m2 = welford(x, dims, True, acc)
    inv_n = 1.0 / numel([x.sizes[d] for d in dims])
    mean_load = broadcast_loader(total, x.sizes)
    var_load = broadcast_loader(m2, x.sizes)
    load = make_loader(x)
    w_load = broadcast_loader(weight, x.sizes) if weight is not None else None
    b_load = broadcast_loader(bias, x.sizes) if bias is not None else None

    def stats(mean: Any, m: Any) -> tuple[Any, Any]:
        rstd = ops.rsqrt(ops.add(ops.mul(m, ops.constant(inv_n, acc)), ops.constant(float(eps), acc)))
        return mean, rstd

    def inner(index: Sequence[Expr]) -> Any:
        mean, rstd = stats(mean_load(index), var_load(index))
        y = ops.mul(ops.sub(ops.to_dtype(load(index), acc), mean), rstd)
        if w_load is not None:
            y = ops.mul(y, ops.to_dtype(w_load(index), acc))
        if b_load is not None:
            y = ops.add(y, ops.to_dtype(b_load(index), acc))
        return ops.to_dtype(y, compute_dtype(out_val.dtype))

    stat_sizes = sizes_of(mean_val)
    mean = _epilogue(mean_val.dtype, stat_sizes, lambda s, m: stats(s, m)[0], total, m2)
    rstd = _epilogue(rstd_val.dtype, stat_sizes, lambda s, m: stats(s, m)[1], total, m2)
    return Lazy(out_val.dtype, x.sizes, inner), mean, rstd


@register_lowering(aten.linalg_vector_norm.default)
def _vector_norm(x: TensorValue, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                 dtype: Any = None) -> Lazy:
    """The 2-, 1-, 0- and ±inf-norms: sqrt(sum(x²)), sum(|x|), count of non-zeros, max/min |x|;
    any other order p: (sum |x|^p)^(1/p)."""
    val = node_val()
    check_dtypes(x.dtype, val.dtype)
    if not val.dtype.is_floating_point or not x.dtype.is_floating_point:
        raise UnsupportedOp("norm of integers")
    ord = float(ord)
    dims = _dims(x, dim)
    if numel([x.sizes[d] for d in dims]) == 0 and ord in (float("inf"), float("-inf")):
        raise UnsupportedOp("inf-norm over no elements")  # eager raises
    if ord == 2.0:
        require("sqrt")
    acc = torch.float64 if torch.float64 in (x.dtype, val.dtype) else torch.float32
    special = {
        2.0: lambda v, full: ops.mul(v, v),
        1.0: lambda v, full: ops.abs(v),
        0.0: lambda v, full: ops.to_dtype(ops.ne(v, ops.constant(0.0, acc)), acc),
        float("inf"): lambda v, full: ops.abs(v),
        float("-inf"): lambda v, full: ops.abs(v),
    }
    prologue = special.get(ord)
    finish: Callable[[Any], Any] = ops.sqrt if ord == 2.0 else (lambda v: v)
    if prologue is None:  # (sum |x|^p)^(1/p)
        from fxcc.compiler_core.lowering.pointwise import _pow_op
        power = _pow_op()
        prologue = lambda v, full: power(ops.abs(v), ops.constant(ord, acc))
        finish = lambda v: power(v, ops.constant(1.0 / ord, acc))
    rtype = {float("inf"): "max", float("-inf"): "min"}.get(ord, "sum")
    buf = reduce(x, dims, keepdim, rtype, acc, prologue)
    return _epilogue(val.dtype, sizes_of(val), finish, buf)


register_lowering(aten.max.default)(_simple("max"))
register_lowering(aten.min.default)(_simple("min"))


def _arg_reduce(x: TensorValue, dim: Any, keepdim: bool, rtype: str) -> tuple[StridedView, TensorValue]:
    """(extreme values with kept dims, index of the first extreme) over `dim` (None: all, flattened).

    Note: two reductions, as softmax's: the max (or min), NaN-propagating as torch's, then the
    smallest position whose value equals it (or is NaN when it is NaN), so ties and NaNs pick
    the first occurrence, as eager does.
    """
    check_dtypes(x.dtype)
    if x.dtype == torch.bool:
        raise UnsupportedOp(f"arg{rtype} of bool")
    dims = _dims(x, dim)
    rsizes = [x.sizes[d] for d in dims]
    n = numel(rsizes)
    if n == 0:
        raise UnsupportedOp(f"arg{rtype} over no elements")  # eager raises
    acc = compute_dtype(x.dtype)
    peak = reduce(x, dims, True, rtype, acc)
    peak_load = broadcast_loader(peak, x.sizes)
    load = make_loader(x)

    def position(_: Any, full: Sequence[Expr]) -> Any:
        v, p = ops.to_dtype(load(full), acc), peak_load(full)
        hit = ops.eq(v, p)
        if x.dtype.is_floating_point:
            hit = ops.logical_or(hit, ops.logical_and(ops.ne(v, v), ops.ne(p, p)))
        pos = flatten([full[d] for d in dims], rsizes)
        return ops.where(hit, ops.index_expr(pos, torch.int64), ops.constant(n, torch.int64))
    index = reduce(x, dims, keepdim, "min", torch.int64, position)
    return peak, index


def _arg(rtype: str) -> Callable[..., TensorValue]:
    def lower(x: TensorValue, dim: Any = None, keepdim: bool = False) -> TensorValue:
        val = node_val()
        if not x.sizes:
            return Lazy(val.dtype, sizes_of(val), lambda index: ops.constant(0, torch.int64))
        _, index = _arg_reduce(x, dim, keepdim, rtype)
        return _as_is(val, index)
    return lower


register_lowering(aten.argmax.default)(_arg("max"))
register_lowering(aten.argmin.default)(_arg("min"))


def _value_and_index(rtype: str) -> Callable[..., tuple[TensorValue, TensorValue]]:
    def lower(x: TensorValue, dim: int, keepdim: bool = False) -> tuple[TensorValue, TensorValue]:
        values, indices = node_val()
        if not x.sizes:
            load = make_loader(x)
            return (Lazy(values.dtype, (), lambda index: ops.to_dtype(load([]), compute_dtype(values.dtype))),
                    Lazy(indices.dtype, (), lambda index: ops.constant(0, torch.int64)))
        peak, index = _arg_reduce(x, dim, keepdim, rtype)
        dims = _dims(x, dim)
        sizes = sizes_of(values)
        peak_view = _keep_or_squeeze(peak, dims, keepdim, sizes)
        return _as_is(values, peak_view), _as_is(indices, index)
    return lower


register_lowering(aten.max.dim)(_value_and_index("max"))
register_lowering(aten.min.dim)(_value_and_index("min"))


def _any_all(rtype: str) -> Callable[..., Lazy]:
    """any (max) / all (min) of x != 0, reduced as int32 (NaN counts as true, as in eager)."""
    def lower(x: TensorValue, dim: Any = None, keepdim: bool = False) -> Lazy:
        val = node_val()
        check_dtypes(x.dtype)
        dims = _dims(x, dim)
        load = make_loader(x)
        comp = compute_dtype(x.dtype)

        def truth(_: Any, full: Sequence[Expr]) -> Any:
            return ops.to_dtype(ops.ne(ops.to_dtype(load(full), comp), ops.constant(0, comp)), torch.int32)
        if numel([x.sizes[d] for d in dims]) == 0:
            # Note: any of nothing is false, all of nothing is true.
            empty = rtype == "min"
            return Lazy(val.dtype, sizes_of(val), lambda index: ops.constant(empty, compute_dtype(val.dtype)))
        buf = reduce(x, dims, keepdim, rtype, torch.int32, truth)
        out = compute_dtype(val.dtype)
        return _epilogue(val.dtype, sizes_of(val), lambda v: ops.to_dtype(ops.ne(v, ops.constant(0, torch.int32)), out), buf)
    return lower


register_lowering(aten.any.default, aten.any.dim, aten.any.dims)(_any_all("max"))
register_lowering(aten.all.default, aten.all.dim, aten.all.dims)(_any_all("min"))


# Scans up to this long are lowered as a reduction per output (quadratic work); longer ones stay extern.
SCAN_AS_REDUCTION_MAX = 512


def _scan(rtype: str, identity: float) -> Callable[..., TensorValue]:
    """cumsum / cumprod: out[..., i, ...] = reduce over r <= i of x[..., r, ...].

    Note: a masked reduction per output element, not a scan: O(n²) work, so only for short
    scan dims (Triton's scan primitives would need a scan node in the scheduler). The sum's
    order differs from eager's sequential one, as any parallel reduction's does.
    """
    def lower(x: TensorValue, dim: int, *, dtype: Any = None) -> TensorValue:
        val = node_val()
        check_dtypes(x.dtype, val.dtype)
        acc = compute_dtype(val.dtype)
        load = make_loader(x)
        sizes = sizes_of(val)
        if not x.sizes or val.numel() == 0:
            return Lazy(val.dtype, sizes, lambda index: ops.to_dtype(load(index), acc))
        d = _dims(x, dim)[0]
        n = x.sizes[d]
        if n > SCAN_AS_REDUCTION_MAX:
            raise UnsupportedOp(f"scan over {n} elements")

        def inner(index: Sequence[Expr], rindex: Sequence[Expr]) -> Any:
            src = list(index)
            src[d] = rindex[0]
            keep = ops.le(ops.index_expr(rindex[0], torch.int64), ops.index_expr(index[d], torch.int64))
            return ops.where(keep, ops.to_dtype(load(src), acc), ops.constant(identity, acc))
        return _as_is(val, current_graph().add_computed(Reduction(acc, sizes, (n,), rtype, inner)))
    return lower


register_lowering(aten.cumsum.default)(_scan("sum", 0))
register_lowering(aten.cumprod.default)(_scan("prod", 1))

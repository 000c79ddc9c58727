"""Pooling lowerings: avg_pool2d, max_pool2d_with_indices and both backwards, as unrolled windows.

A pooled output reads a small window of its input; a backward's input gradient reads the few
windows that cover its position (at most ceil(k / s) per dim: Inductor's `window_size`), each
unrolled into the loop body, so no atomics or scatter are needed and everything stays pointwise
(fusable with the ReLU or batch norm before it and the gradient sum after it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxcc.compiler_core.errors import UnsupportedOp
from fxcc.compiler_core.ir.nodes import Lazy, Reduction, TensorValue, make_loader
from fxcc.compiler_core.ir.ops import compute_dtype, ops
from fxcc.compiler_core.lowering.common import check_dtypes
from fxcc.compiler_core.lowering.core import aten, current_graph, node_val, register_lowering
from fxcc.compiler_core.sizevars import Expr, FloorDiv
from fxcc.compiler_core.symbolic import is_symbolic, sizes_of

# Window taps unrolled into one loop body at most (Inductor's bound, for the same reason: longer
# bodies make slow Triton code); larger windows run as the aten op.
MAX_TAPS = 25
I64 = torch.int64


def _pair(v: Any, default: Sequence[int]) -> tuple[int, int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if not v:
        v = list(default)
    return (int(v[0]), int(v[-1]))


def _c(v: int) -> Any:
    return ops.constant(v, I64)


def _check(x: TensorValue, out: torch.Tensor, what: str) -> None:
    check_dtypes(x.dtype, out.dtype)
    if not x.dtype.is_floating_point or len(x.sizes) not in (3, 4) or out.numel() == 0 \
            or is_symbolic(*x.sizes[-2:]):
        raise UnsupportedOp(f"{what} of integers, of another rank, empty or of symbolic size")


def _divisor(ho: Expr, wo: Expr, geometry: tuple[int, ...], count_include_pad: bool,
             divisor_override: int | None, acc: torch.dtype) -> Any:
    """What ATen divides the window of output (ho, wo) by: the window clipped to the padded input,
    or to the input itself without count_include_pad."""
    kh, kw, sh, sw, ph, pw, ih, iw = geometry
    if divisor_override:
        return ops.constant(float(divisor_override), acc)
    hs = ops.sub(ops.index_expr(ho * sh, I64), _c(ph))
    ws = ops.sub(ops.index_expr(wo * sw, I64), _c(pw))
    he = ops.minimum(ops.add(hs, _c(kh)), _c(ih + ph))
    we = ops.minimum(ops.add(ws, _c(kw)), _c(iw + pw))
    if not count_include_pad:
        hs, ws = ops.maximum(hs, _c(0)), ops.maximum(ws, _c(0))
        he, we = ops.minimum(he, _c(ih)), ops.minimum(we, _c(iw))
    return ops.to_dtype(ops.mul(ops.sub(he, hs), ops.sub(we, ws)), acc)


@register_lowering(aten.avg_pool2d.default)
def _avg_pool2d(x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int] = (), padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: int | None = None) -> Lazy:
    """A sum over each window (masked loads outside the input) divided as ATen divides."""
    val = node_val()
    _check(x, val, "avg_pool2d")
    kh, kw = _pair(kernel_size, ())
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding, (0, 0))
    ih, iw = x.sizes[-2:]
    geometry = (kh, kw, sh, sw, ph, pw, ih, iw)
    lead = len(x.sizes) - 2
    acc = compute_dtype(val.dtype)
    load = make_loader(x)

    def tap(index: Sequence[Expr], i: Any, j: Any) -> Any:
        h = index[lead] * sh - ph + i
        w = index[lead + 1] * sw - pw + j
        return ops.masked(_inside(h, w, ih, iw), lambda: ops.to_dtype(load([*index[:lead], h, w]), acc), 0.0)

    if kh * kw <= MAX_TAPS:
        # Note: unrolled, a pointwise value, which a kernel walks in its output's memory order:
        # as a reduction over the window its outputs were walked in NCHW order, so a channels-last
        # pool (timm's ResNet-50d shortcuts, 2x2) read and wrote 256 elements apart per thread.
        def total(index: Sequence[Expr]) -> Any:
            out = None
            for i in range(kh):
                for j in range(kw):
                    v = tap(index, i, j)
                    out = v if out is None else ops.add(out, v)
            return out
    else:
        window = current_graph().add_computed(
            Reduction(acc, sizes_of(val), (kh, kw), "sum", lambda index, rindex: tap(index, rindex[0], rindex[1])))
        total = make_loader(window)
    out = compute_dtype(val.dtype)

    def mean(index: Sequence[Expr]) -> Any:
        d = _divisor(index[lead], index[lead + 1], geometry, count_include_pad, divisor_override, acc)
        return ops.to_dtype(ops.truediv(total(index), d), out)
    return Lazy(val.dtype, sizes_of(val), mean)


def _inside(h: Expr, w: Expr, ih: int, iw: int) -> Any:
    hv, wv = ops.index_expr(h, I64), ops.index_expr(w, I64)
    return ops.logical_and(ops.logical_and(ops.ge(hv, _c(0)), ops.lt(hv, _c(ih))),
                           ops.logical_and(ops.ge(wv, _c(0)), ops.lt(wv, _c(iw))))


@register_lowering(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int] = (),
                             padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple[Lazy, Lazy]:
    """Each window's maximum and the flat (h * W + w) position of it, as ATen picks it: the first
    maximum in row-major window order, a NaN over anything (the last NaN), the window's first
    element when all are -inf."""
    values, indices = node_val()
    _check(x, values, "max_pool2d")
    kh, kw = _pair(kernel_size, ())
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding, (0, 0))
    if _pair(dilation, (1, 1)) != (1, 1) or kh * kw > MAX_TAPS:
        raise UnsupportedOp("max_pool2d with dilation or a large window")
    ih, iw = x.sizes[-2:]
    lead = len(x.sizes) - 2
    acc = compute_dtype(x.dtype)
    load = make_loader(x)

    def window(index: Sequence[Expr]) -> tuple[Any, Any]:
        hs, ws = index[lead] * sh - ph, index[lead + 1] * sw - pw
        best = ops.constant(float("-inf"), acc)
        at = ops.add(ops.mul(ops.maximum(ops.index_expr(hs, I64), _c(0)), _c(iw)),
                     ops.maximum(ops.index_expr(ws, I64), _c(0)))
        for i in range(kh):
            for j in range(kw):
                h, w = hs + i, ws + j
                v = ops.masked(_inside(h, w, ih, iw),
                               lambda h=h, w=w: ops.to_dtype(load([*index[:lead], h, w]), acc), float("-inf"))
                take = ops.logical_or(ops.gt(v, best), ops.isnan(v))
                best = ops.where(take, v, best)
                at = ops.where(take, ops.index_expr(h * iw + w, I64), at)
        return best, at
    out = compute_dtype(values.dtype)
    return (Lazy(values.dtype, sizes_of(values), lambda index: ops.to_dtype(window(index)[0], out)),
            Lazy(indices.dtype, sizes_of(indices), lambda index: ops.to_dtype(window(index)[1], indices.dtype)))


def _covering(k: int, s: int) -> int:
    """How many windows (size k, stride s) cover one position at most (Inductor's window_size)."""
    return max(max(h // s - max(0, (h - k) // s), 1) for h in range(k * 2))


def _gradient(grad: TensorValue, x: TensorValue, geometry: tuple[int, ...],
              tap: Callable[[list[Expr], Expr, Expr, Expr, Expr], Any]) -> Lazy:
    """The input gradient: at each input position (h, w), the sum of `tap(prefix, qh, qw, h, w)`
    over the pooled outputs (qh, qw) whose windows cover it.

    Note: the first covering window is qh0 = floor((h + pad - k) / s) + 1; its numerator is
    shifted by a multiple of s to be non-negative, so FloorDiv means the same whatever the
    target's integer division does with negatives. Later candidates are masked out where they
    fall off the output or their window ends before h.
    """
    val = node_val()
    kh, kw, sh, sw, ph, pw, _, _ = geometry
    nh, nw = _covering(kh, sh), _covering(kw, sw)
    if nh * nw > MAX_TAPS:
        raise UnsupportedOp("pooling backward over too many windows")
    oh, ow = grad.sizes[-2:]
    mh, mw = -(-kh // sh), -(-kw // sw)
    acc = compute_dtype(val.dtype)
    out = compute_dtype(val.dtype)

    def inner(index: Sequence[Expr]) -> Any:
        *prefix, h, w = index
        h0 = FloorDiv(h + ph - kh + sh + mh * sh, sh) - mh
        w0 = FloorDiv(w + pw - kw + sw + mw * sw, sw) - mw
        total = ops.constant(0.0, acc)
        for i in range(nh):
            for j in range(nw):
                qh, qw = h0 + i, w0 + j
                qhv, qwv = ops.index_expr(qh, I64), ops.index_expr(qw, I64)
                covers = ops.logical_and(
                    ops.logical_and(ops.logical_and(ops.ge(qhv, _c(0)), ops.lt(qhv, _c(oh))),
                                    ops.le(ops.index_expr(qh * sh - ph - h, I64), _c(0))),
                    ops.logical_and(ops.logical_and(ops.ge(qwv, _c(0)), ops.lt(qwv, _c(ow))),
                                    ops.le(ops.index_expr(qw * sw - pw - w, I64), _c(0))))
                total = ops.add(total, ops.masked(covers, lambda qh=qh, qw=qw: tap(prefix, qh, qw, h, w), 0.0))
        return ops.to_dtype(total, out)
    return Lazy(val.dtype, sizes_of(val), inner)


@register_lowering(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(grad: TensorValue, x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int],
                         padding: Any, dilation: Any, ceil_mode: bool, indices: TensorValue) -> Lazy:
    """Each covering window's gradient where that window's maximum was this position."""
    val = node_val()
    _check(x, val, "max_pool2d backward")
    check_dtypes(grad.dtype)
    kh, kw = _pair(kernel_size, ())
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding, (0, 0))
    if _pair(dilation, (1, 1)) != (1, 1):
        raise UnsupportedOp("max_pool2d backward with dilation")
    ih, iw = x.sizes[-2:]
    acc = compute_dtype(val.dtype)
    load_grad, load_index = make_loader(grad), make_loader(indices)

    def tap(prefix: list[Expr], qh: Expr, qw: Expr, h: Expr, w: Expr) -> Any:
        hit = ops.eq(ops.to_dtype(load_index([*prefix, qh, qw]), I64), ops.index_expr(h * iw + w, I64))
        return ops.where(hit, ops.to_dtype(load_grad([*prefix, qh, qw]), acc), ops.constant(0.0, acc))
    return _gradient(grad, x, (kh, kw, sh, sw, ph, pw, ih, iw), tap)


@register_lowering(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(grad: TensorValue, x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int],
                         padding: Any, ceil_mode: bool, count_include_pad: bool,
                         divisor_override: int | None) -> Lazy:
    """Each covering window's gradient divided by that window's divisor."""
    val = node_val()
    _check(x, val, "avg_pool2d backward")
    check_dtypes(grad.dtype)
    kh, kw = _pair(kernel_size, ())
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding, (0, 0))
    ih, iw = x.sizes[-2:]
    geometry = (kh, kw, sh, sw, ph, pw, ih, iw)
    acc = compute_dtype(val.dtype)
    load_grad = make_loader(grad)

    def tap(prefix: list[Expr], qh: Expr, qw: Expr, h: Expr, w: Expr) -> Any:
        d = _divisor(qh, qw, geometry, count_include_pad, divisor_override, acc)
        return ops.truediv(ops.to_dtype(load_grad([*prefix, qh, qw]), acc), d)
    return _gradient(grad, x, geometry, tap)

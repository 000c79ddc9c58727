"""Batch norm lowerings (inference: running statistics, pointwise; training, with or without running
statistics, and instance norm: per-channel reductions) and group norm.

Their backwards arrive decomposed (client/backend.py NORM_DECOMPOSITIONS: torch._decomp's
native_batch_norm_backward and native_group_norm_backward) into sums and pointwise ops that fuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fxcc.compiler_core.errors import UnsupportedOp
from fxcc.compiler_core.ir.nodes import Lazy, Loader, TensorValue, make_loader
from fxcc.compiler_core.ir.ops import compute_dtype, ops
from fxcc.compiler_core.lowering.common import broadcast_loader, check_dtypes, remap_view, require
from fxcc.compiler_core.lowering.core import aten, node_val, register_lowering
from fxcc.compiler_core.lowering.reduction import _keep_or_squeeze, welford
from fxcc.compiler_core.sizevars import Expr, FloorDiv, flatten, numel, unflatten
from fxcc.compiler_core.symbolic import is_symbolic, sizes_of


def _channel(value: TensorValue | None) -> Loader | None:
    """A loader over x's index reading a per-channel [C] tensor at the channel (dim 1)."""
    if value is None:
        return None
    load = make_loader(value)
    return lambda index: load([index[1]])


def _acc(x: TensorValue) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _normalize(x: TensorValue, mean: Loader, rstd: Loader, weight: Loader | None, bias: Loader | None,
               acc: torch.dtype, out: torch.dtype) -> Lazy:
    load = make_loader(x)

    def inner(index: Sequence[Expr]) -> Any:
        y = ops.mul(ops.sub(ops.to_dtype(load(index), acc), mean(index)), rstd(index))
        if weight is not None:
            y = ops.mul(y, ops.to_dtype(weight(index), acc))
        if bias is not None:
            y = ops.add(y, ops.to_dtype(bias(index), acc))
        return ops.to_dtype(y, compute_dtype(out))
    return Lazy(out, x.sizes, inner)


def _empty(val: torch.Tensor) -> Lazy:
    return Lazy(val.dtype, sizes_of(val), lambda index: ops.constant(0, compute_dtype(val.dtype)))


@register_lowering(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_inference(x: TensorValue, weight: TensorValue | None, bias: TensorValue | None,
                          running_mean: TensorValue, running_var: TensorValue, momentum: float,
                          eps: float) -> tuple[Lazy, Lazy, Lazy]:
    out, save_mean, save_rstd = node_val()
    check_dtypes(x.dtype, out.dtype)
    if not x.dtype.is_floating_point or len(x.sizes) < 2:
        raise UnsupportedOp("batch norm of integers or of rank < 2")
    require("rsqrt")
    acc = _acc(x)
    rm, rv = _channel(running_mean), _channel(running_var)

    def mean(index: Sequence[Expr]) -> Any:
        return ops.to_dtype(rm(index), acc)

    def rstd(index: Sequence[Expr]) -> Any:
        return ops.rsqrt(ops.add(ops.to_dtype(rv(index), acc), ops.constant(float(eps), acc)))
    y = _normalize(x, mean, rstd, _channel(weight), _channel(bias), acc, out.dtype)
    if 0 in sizes_of(save_mean):  # a CPU tensor's: empty
        return y, _empty(save_mean), _empty(save_rstd)
    # Note: on any other device (CUDA) torch returns the running mean and 1 / sqrt(running_var + eps)
    # per channel (torch._decomp's native_batch_norm_helper: "CPU and CUDA give different shapes").
    rm_c, rv_c = make_loader(running_mean), make_loader(running_var)

    def per_channel(val: torch.Tensor, fn: Loader) -> Lazy:
        return Lazy(val.dtype, sizes_of(val), lambda index: ops.to_dtype(fn(index), compute_dtype(val.dtype)))

    def rstd_c(index: Sequence[Expr]) -> Any:
        return ops.rsqrt(ops.add(ops.to_dtype(rv_c(index), acc), ops.constant(float(eps), acc)))
    return (y, per_channel(save_mean, lambda index: ops.to_dtype(rm_c(index), acc)),
            per_channel(save_rstd, rstd_c))


@register_lowering(aten._native_batch_norm_legit_functional.default)
def _batch_norm_training(x: TensorValue, weight: TensorValue | None, bias: TensorValue | None,
                         running_mean: TensorValue, running_var: TensorValue, training: bool,
                         momentum: float, eps: float) -> tuple[Lazy, ...]:
    return _batch_statistics(x, weight, bias, (running_mean, running_var), training, momentum, eps)


@register_lowering(aten._native_batch_norm_legit.no_stats)
def _batch_norm_no_stats(x: TensorValue, weight: TensorValue | None, bias: TensorValue | None,
                         training: bool, momentum: float, eps: float) -> tuple[Lazy, ...]:
    """Batch norm without running statistics (instance norm is this over a [1, N*C, ...] view)."""
    return _batch_statistics(x, weight, bias, None, training, momentum, eps)


def _batch_statistics(x: TensorValue, weight: TensorValue | None, bias: TensorValue | None,
                      running: tuple[TensorValue, TensorValue] | None, training: bool,
                      momentum: float, eps: float) -> tuple[Lazy, ...]:
    """(out, save_mean, save_rstd[, new running_mean, new running_var]) from the batch's statistics
    per channel (one Welford reduction: mean and squared deviations in one read of x)."""
    vals = node_val()
    check_dtypes(x.dtype, *(v.dtype for v in vals))
    if not training or not x.dtype.is_floating_point or len(x.sizes) < 2:
        raise UnsupportedOp("batch norm outside training, of integers, or of rank < 2")
    require("rsqrt")
    acc = _acc(x)
    dims = [d for d in range(len(x.sizes)) if d != 1]
    n = numel([x.sizes[d] for d in dims])
    mean, m2 = welford(x, dims, True, acc)
    mean_x, m2_x = broadcast_loader(mean, x.sizes), broadcast_loader(m2, x.sizes)
    mean_c, m2_c = make_loader(mean), make_loader(m2)
    rank = len(x.sizes)

    def at_channel(load: Loader) -> Loader:
        return lambda index: load([0, index[0], *([0] * (rank - 2))])

    def rstd_of(m: Any) -> Any:
        var = ops.truediv(m, _count(n, acc))
        return ops.rsqrt(ops.add(var, ops.constant(float(eps), acc)))

    y = _normalize(x, mean_x, lambda i: rstd_of(m2_x(i)), _channel(weight),
                   _channel(bias), acc, vals[0].dtype)
    c = (x.sizes[1],)
    mean_at, m_at = at_channel(mean_c), at_channel(m2_c)

    def per_channel(dtype: torch.dtype, fn: Any) -> Lazy:
        return Lazy(dtype, c, lambda index: ops.to_dtype(fn(index), compute_dtype(dtype)))

    stats = (y, per_channel(vals[1].dtype, mean_at),
             per_channel(vals[2].dtype, lambda i: rstd_of(m_at(i))))
    if running is None:
        return stats
    rm, rv = make_loader(running[0]), make_loader(running[1])
    keep, new = 1.0 - float(momentum), float(momentum)

    def blend(old: Any, stat: Any) -> Any:
        return ops.add(ops.mul(ops.to_dtype(old, acc), ops.constant(keep, acc)), ops.mul(stat, ops.constant(new, acc)))

    return (
        *stats,
        per_channel(vals[3].dtype, lambda i: blend(rm(i), mean_at(i))),
        per_channel(vals[4].dtype, lambda i: blend(rv(i), ops.truediv(m_at(i), _count(n - 1, acc)))),
    )


def _count(n: Expr, acc: torch.dtype) -> Any:
    """A count of elements (n, or n - 1 for an unbiased variance) as a value of dtype `acc`.

    Note: with a symbolic batch the count is a size expression the kernel computes from its size
    arguments; 0 for n - 1 with a batch of one element, and m2 / 0 = 0 / 0 = nan, as eager's is.
    """
    if is_symbolic(n):
        return ops.index_expr(n, acc)
    return ops.constant(float(n), acc) if n != 0 else ops.constant(float("nan"), acc)


@register_lowering(aten.native_group_norm.default)
def _group_norm(x: TensorValue, weight: TensorValue | None, bias: TensorValue | None, n: int, c: int,
                hxw: int, group: int, eps: float) -> tuple[Lazy, Lazy, Lazy]:
    """x as [N, G, C/G * HxW] (row-major): per (sample, group) mean and rstd (Welford), then
    (x - mean) * rstd * weight[c] + bias[c]; mean and rstd come out as [N, G]."""
    out, mean_val, rstd_val = node_val()
    check_dtypes(x.dtype, out.dtype, mean_val.dtype)
    if not x.dtype.is_floating_point or len(x.sizes) < 2 or out.numel() == 0 or group <= 0 or c % group:
        raise UnsupportedOp("group norm of integers, of rank < 2, empty, or with uneven groups")
    require("rsqrt")
    acc = _acc(x)
    per_group = (c // group) * hxw
    grouped = remap_view(x, (n, group, per_group), lambda idx: unflatten(flatten(idx, (n, group, per_group)), x.sizes))
    mean, m2 = welford(grouped, [2], True, acc)
    count = per_group
    stat_sizes = (n, group)
    mean_v = _keep_or_squeeze(mean, [2], False, stat_sizes)
    m2_v = _keep_or_squeeze(m2, [2], False, stat_sizes)
    mean_load, m2_load = make_loader(mean_v), make_loader(m2_v)
    channels_per_group = c // group

    def stats(mean: Any, m: Any) -> tuple[Any, Any]:
        var = ops.truediv(m, ops.constant(float(count), acc))
        return mean, ops.rsqrt(ops.add(var, ops.constant(float(eps), acc)))

    def group_of(index: Sequence[Expr]) -> list[Expr]:
        return [index[0], FloorDiv(index[1], channels_per_group)]

    y = _normalize(x, lambda i: stats(mean_load(group_of(i)), m2_load(group_of(i)))[0],
                   lambda i: stats(mean_load(group_of(i)), m2_load(group_of(i)))[1],
                   _channel(weight), _channel(bias), acc, out.dtype)

    def stat(val: torch.Tensor, k: int) -> Lazy:
        return Lazy(val.dtype, stat_sizes, lambda index: ops.to_dtype(
            stats(mean_load(index), m2_load(index))[k], compute_dtype(val.dtype)))
    return y, stat(mean_val, 0), stat(rstd_val, 1)

"""Pointwise lowerings: unary math, binary arithmetic with broadcasting and scalars, comparisons, where, casts."""

from __future__ import annotations

import math
from typing import Any

import torch

from fxcc.compiler_core.errors import UnsupportedOp
from fxcc.compiler_core.ir.nodes import Lazy, TensorValue
from fxcc.compiler_core.ir.ops import compute_dtype, ops
from fxcc.compiler_core.lowering.common import Kind, check_dtypes, is_tensor, operand, pointwise, require
from fxcc.compiler_core.lowering.core import aten, current_graph, node_val, prims, register_lowering
from fxcc.compiler_core.symbolic import is_symbolic, sizes_of
from fxcc.compiler_core.target import capabilities

_FLOAT_UNARY = {
    aten.sin: "sin", aten.cos: "cos", aten.tan: "tan", aten.exp: "exp", aten.exp2: "exp2",
    aten.expm1: "expm1", aten.log: "log", aten.log2: "log2", aten.log10: "log10", aten.log1p: "log1p",
    aten.sqrt: "sqrt", aten.rsqrt: "rsqrt", aten.tanh: "tanh", aten.sigmoid: "sigmoid",
    aten.erf: "erf", aten.reciprocal: "reciprocal", aten.asin: "asin", aten.acos: "acos",
    aten.atan: "atan", aten.sinh: "sinh", aten.cosh: "cosh", aten.asinh: "asinh", aten.acosh: "acosh",
    aten.atanh: "atanh",
}
_ROUNDING = {aten.floor: "floor", aten.ceil: "ceil", aten.trunc: "trunc", aten.round: "round"}


def _float_unary(name: str) -> Any:
    def lower(x: TensorValue) -> Lazy:
        if not has_spelling(name) and name in _VIA_FLOAT64 and node_val().dtype != torch.float64:
            return pointwise(_via_float64(_VIA_FLOAT64[name]), x, kind=Kind.INT_TO_FLOAT)
        require(name)
        return pointwise(lambda a: ops.unary_op(name, a), x, kind=Kind.INT_TO_FLOAT)
    return lower


def _via_float64(fn: Any) -> Any:
    """`fn` computed in float64 from a float32 value: float64's rounding errors are far below
    float32's, so the rounded result is float32's correctly rounded one but for rare ties."""
    return lambda a: ops.to_dtype(fn(ops.to_dtype(a, torch.float64)), torch.float32)


def _c64(v: float) -> Any:
    return ops.constant(v, torch.float64)


def _sinh64(a: Any) -> Any:
    # Note: below |x| = 1e-3 the difference of exponentials cancels; the series is exact there.
    a3 = ops.mul(ops.mul(a, a), a)
    series = ops.add(a, ops.add(ops.truediv(a3, _c64(6.0)), ops.truediv(ops.mul(a3, ops.mul(a, a)), _c64(120.0))))
    direct = ops.mul(ops.sub(ops.exp(a), ops.exp(ops.neg(a))), _c64(0.5))
    return ops.where(ops.lt(ops.abs(a), _c64(1e-3)), series, direct)


def _poly(t: Any, coeffs: list[float]) -> Any:
    """coeffs[0] + coeffs[1] * t + ... by Horner's rule."""
    acc = _c64(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = ops.add(ops.mul(acc, t), _c64(c))
    return acc


def _atan64(a: Any) -> Any:
    """atan: |x| > 1 folded by atan(x) = pi/2 - atan(1/x), three halvings
    (atan(t) = 2 atan(t / (1 + sqrt(1 + t²)))) to t <= tan(pi/32), then the Taylor series to t^17
    (the next term is below 1e-20)."""
    ax = ops.abs(a)
    big = ops.gt(ax, _c64(1.0))
    t = ops.where(big, ops.truediv(_c64(1.0), ax), ax)
    for _ in range(3):
        t = ops.truediv(t, ops.add(_c64(1.0), ops.sqrt(ops.add(_c64(1.0), ops.mul(t, t)))))
    series = ops.mul(t, _poly(ops.mul(t, t), [(-1.0) ** k / (2 * k + 1) for k in range(9)]))
    r = ops.mul(series, _c64(8.0))
    r = ops.where(big, ops.sub(_c64(math.pi / 2), r), r)
    return ops.where(ops.lt(a, _c64(0.0)), ops.neg(r), r)


def _asin64(a: Any) -> Any:
    # Note: 1 - x² is exact in float64 for a float32 x; x = ±1 gives atan(±inf) = ±pi/2.
    return _atan64(ops.truediv(a, ops.sqrt(ops.sub(_c64(1.0), ops.mul(a, a)))))


def _small_or(a: Any, series: list[float], direct: Any) -> Any:
    """`series` (odd powers: a * poly(a²)) below |a| = 1e-3, where `direct` cancels; else `direct`."""
    small = ops.mul(a, _poly(ops.mul(a, a), series))
    return ops.where(ops.lt(ops.abs(a), _c64(1e-3)), small, direct)


def _asinh64(a: Any) -> Any:
    ax = ops.abs(a)
    direct = ops.log(ops.add(ax, ops.sqrt(ops.add(ops.mul(ax, ax), _c64(1.0)))))
    direct = ops.where(ops.lt(a, _c64(0.0)), ops.neg(direct), direct)
    return _small_or(a, [1.0, -1.0 / 6.0, 3.0 / 40.0], direct)


def _atanh64(a: Any) -> Any:
    direct = ops.mul(_c64(0.5), ops.log(ops.truediv(ops.add(_c64(1.0), a), ops.sub(_c64(1.0), a))))
    return _small_or(a, [1.0, 1.0 / 3.0, 1.0 / 5.0], direct)


def _acosh64(a: Any) -> Any:
    # Note: below 1 the result is NaN (x + sqrt(x² - 1) would cancel to 0 for large negative x).
    direct = ops.log(ops.add(a, ops.sqrt(ops.sub(ops.mul(a, a), _c64(1.0)))))
    return ops.where(ops.lt(a, _c64(1.0)), _c64(math.nan), direct)


# Unary ops the interpreter has no spelling for, composed in float64 for float32 (and narrower) values.
_VIA_FLOAT64 = {
    "log10": lambda a: ops.mul(ops.log(a), _c64(1.0 / math.log(10.0))),
    "tan": lambda a: ops.truediv(ops.sin(a), ops.cos(a)),
    "cosh": lambda a: ops.mul(ops.add(ops.exp(a), ops.exp(ops.neg(a))), _c64(0.5)),
    "sinh": _sinh64,
    "atan": _atan64,
    "asin": _asin64,
    "acos": lambda a: ops.sub(_c64(math.pi / 2), _asin64(a)),
    "asinh": _asinh64,
    "acosh": _acosh64,
    "atanh": _atanh64,
}


def has_spelling(op: str) -> bool:
    return capabilities(current_graph().target).spells(op)


for _packet, _name in _FLOAT_UNARY.items():
    register_lowering(_packet.default)(_float_unary(_name))


def _rounding(name: str) -> Any:
    def lower(x: TensorValue) -> Lazy:
        if not x.dtype.is_floating_point:
            return pointwise(lambda a: a, x)  # floor/ceil/trunc/round of an integer is itself
        if name == "round" and not has_spelling("round"):
            require("floor", "fmod")
            return pointwise(_round_half_even(compute_dtype(x.dtype)), x)
        require(name)
        return pointwise(lambda a: ops.unary_op(name, a), x)
    return lower


def _round_half_even(dt: torch.dtype) -> Any:
    """Round half to even from floor: x - floor(x) is exact, so the tie test is too."""
    def fn(a: Any) -> Any:
        f = ops.floor(a)
        d = ops.sub(a, f)
        half, one, two, zero = (ops.constant(v, dt) for v in (0.5, 1.0, 2.0, 0.0))
        up = ops.add(f, one)
        tie = ops.where(ops.eq(ops.fmod(f, two), zero), f, up)
        return ops.where(ops.gt(d, half), up, ops.where(ops.lt(d, half), f, tie))
    return fn


for _packet, _name in _ROUNDING.items():
    register_lowering(_packet.default)(_rounding(_name))


@register_lowering(aten.abs.default)
def _abs(x: TensorValue) -> Lazy:
    if x.dtype == torch.bool:
        return pointwise(lambda a: a, x)
    return pointwise(ops.abs, x)


@register_lowering(aten.neg.default)
def _neg(x: TensorValue) -> Lazy:
    return pointwise(ops.neg, x)


@register_lowering(aten.relu.default)
def _relu(x: TensorValue) -> Lazy:
    if x.dtype == torch.bool:
        raise UnsupportedOp("relu of bool")
    return pointwise(lambda a: ops.maximum(a, ops.constant(0, compute_dtype(x.dtype))), x)


@register_lowering(aten.gelu.default)
def _gelu(x: TensorValue, approximate: str = "none") -> Lazy:
    if not x.dtype.is_floating_point:
        raise UnsupportedOp("gelu of integers")
    dt = compute_dtype(x.dtype)

    def c(v: float) -> Any:
        return ops.constant(v, dt)

    def exact(a: Any) -> Any:
        if dt == torch.float32:
            # Note: fp32's gate is Phi through a cheaper erfc (codegen's _fxcc_normal_cdf): on the
            # H200, bias+GELU+LayerNorm in bf16 spends a third of its time in libdevice's erf.
            return ops.mul(a, ops.normal_cdf(a))
        cdf = ops.mul(c(0.5), ops.add(c(1.0), ops.erf(ops.mul(a, c(math.sqrt(0.5))))))
        return ops.mul(a, cdf)

    def tanh(a: Any) -> Any:
        inner = ops.mul(c(math.sqrt(2.0 / math.pi)), ops.add(a, ops.mul(c(0.044715), ops.mul(a, ops.mul(a, a)))))
        return ops.mul(ops.mul(c(0.5), a), ops.add(c(1.0), ops.tanh(inner)))

    require(("normal_cdf" if dt == torch.float32 else "erf") if approximate == "none" else "tanh")
    if approximate not in ("none", "tanh"):
        raise UnsupportedOp(f"gelu approximate={approximate}")
    return pointwise(exact if approximate == "none" else tanh, x)


def _alpha(fn: Any, alpha: Any, dtype: torch.dtype) -> Any:
    if alpha == 1:
        return fn
    return lambda a, b: fn(a, ops.mul(b, ops.constant(alpha, dtype)))


@register_lowering(aten.add.Tensor, aten.add.Scalar)
def _add(a: Any, b: Any, alpha: Any = 1) -> Lazy:
    comp = _comp(a, b)
    return pointwise(_alpha(ops.add, alpha, comp), a, b)


@register_lowering(aten.sub.Tensor, aten.sub.Scalar)
def _sub(a: Any, b: Any, alpha: Any = 1) -> Lazy:
    comp = _comp(a, b)
    return pointwise(_alpha(ops.sub, alpha, comp), a, b)


@register_lowering(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(a: Any, b: Any, alpha: Any = 1) -> Lazy:
    comp = _comp(a, b)
    return pointwise(_alpha(lambda x, y: ops.sub(y, x), alpha, comp), a, b)


def _comp(*args: Any) -> torch.dtype:
    from fxcc.compiler_core.lowering.common import promote
    return promote(args, Kind.DEFAULT)[0]


@register_lowering(aten.mul.Tensor, aten.mul.Scalar)
def _mul(a: Any, b: Any) -> Lazy:
    return pointwise(ops.mul, a, b)


@register_lowering(aten.div.Tensor, aten.div.Scalar)
def _div(a: Any, b: Any) -> Lazy:
    return pointwise(ops.truediv, a, b, kind=Kind.INT_TO_FLOAT)


@register_lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(a: Any, b: Any, *, rounding_mode: str | None = None) -> Lazy:
    if rounding_mode is None:
        return _div(a, b)
    if rounding_mode not in ("trunc", "floor") or not node_val().dtype.is_floating_point:
        raise UnsupportedOp(f"div rounding_mode={rounding_mode} for {node_val().dtype}")
    if rounding_mode == "floor":
        require("floor", "fmod")
        return pointwise(_floor_divide(_comp(a, b)), a, b)
    require("trunc")
    return pointwise(lambda x, y: ops.trunc(ops.truediv(x, y)), a, b)


def _floor_divide(dt: torch.dtype) -> Any:
    """a // b for floats, step for step as c10's div_floor_floating (so results match eager's).

    Note: floor(a / b) is not it: a / b rounds, and can round up to the next integer.
    """
    return lambda a, b: _floor_divide_body(a, b, dt)


def _floor_divide_body(a: Any, b: Any, dt: torch.dtype) -> Any:
    zero, one, half = (ops.constant(v, dt) for v in (0.0, 1.0, 0.5))
    mod = ops.fmod(a, b)
    div = ops.truediv(ops.sub(a, mod), b)
    adjust = ops.logical_and(ops.ne(mod, zero), ops.ne(ops.lt(b, zero), ops.lt(mod, zero)))
    div = ops.where(adjust, ops.sub(div, one), div)
    floored = ops.floor(div)
    floored = ops.where(ops.gt(ops.sub(div, floored), half), ops.add(floored, one), floored)
    # div == 0: a zero with the sign of a / b (a / b * 0 keeps the sign, a and b being finite here)
    signed_zero = ops.mul(ops.truediv(a, b), zero)
    return ops.where(ops.eq(b, zero), ops.truediv(a, b), ops.where(ops.ne(div, zero), floored, signed_zero))


@register_lowering(aten.maximum.default)
def _maximum(a: Any, b: Any) -> Lazy:
    return pointwise(ops.maximum, a, b)


@register_lowering(aten.minimum.default)
def _minimum(a: Any, b: Any) -> Lazy:
    return pointwise(ops.minimum, a, b)


@register_lowering(aten.clamp.default, aten.clamp.Tensor)
def _clamp(x: TensorValue, min: Any = None, max: Any = None) -> Lazy:
    if node_val().dtype == torch.bool:
        raise UnsupportedOp("clamp of bool")

    def fn(a: Any, *bounds: Any) -> Any:
        it = iter(bounds)
        if min is not None:
            a = ops.maximum(a, next(it))
        if max is not None:
            a = ops.minimum(a, next(it))
        return a
    return pointwise(fn, x, *[v for v in (min, max) if v is not None])


@register_lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(x: TensorValue, min: Any) -> Lazy:
    return _clamp(x, min, None)


@register_lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(x: TensorValue, max: Any) -> Lazy:
    return _clamp(x, None, max)


@register_lowering(aten.hardtanh.default)
def _hardtanh(x: TensorValue, min_val: Any = -1.0, max_val: Any = 1.0) -> Lazy:
    if not x.dtype.is_floating_point:
        raise UnsupportedOp("hardtanh of integers")
    return _clamp(x, min_val, max_val)


@register_lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def _remainder(a: Any, b: Any) -> Lazy:
    """Python's modulo for floats, as ATen computes it: fmod, then moved into b's sign.

    Note: integers only by a non-zero scalar; eager raises on an integer division by zero.
    """
    _check_divisor(b)
    require("fmod")
    dt = _comp(a, b)

    def fn(x: Any, y: Any) -> Any:
        zero = ops.constant(0.0, dt)
        mod = ops.fmod(x, y)
        wrong_sign = ops.logical_and(ops.ne(mod, zero), ops.ne(ops.lt(y, zero), ops.lt(mod, zero)))
        return ops.where(wrong_sign, ops.add(mod, y), mod)
    return pointwise(fn, a, b)


@register_lowering(aten.fmod.Tensor, aten.fmod.Scalar)
def _fmod(a: Any, b: Any) -> Lazy:
    _check_divisor(b)
    require("fmod")
    return pointwise(ops.fmod, a, b)


def _check_divisor(b: Any) -> None:
    """Integer `%` only by a non-zero Python scalar (Triton's and C's `%` truncate, as fmod does)."""
    dtype = node_val().dtype
    if dtype.is_floating_point:
        return
    if dtype == torch.bool or is_tensor(b) or not isinstance(b, int) or isinstance(b, bool) or b == 0:
        raise UnsupportedOp("integer remainder by a tensor (eager raises on a zero divisor)")


def _float_test(op: str, integer_answer: bool) -> Any:
    def lower(x: TensorValue) -> Lazy:
        if not x.dtype.is_floating_point:
            return pointwise(lambda a: ops.constant(integer_answer, torch.bool), x, kind=Kind.ALWAYS_BOOL,
                             compute=torch.bool)
        require(op)
        return pointwise(lambda a: ops.unary_op(op, a), x, kind=Kind.ALWAYS_BOOL, compute=compute_dtype(x.dtype))
    return lower


register_lowering(aten.isnan.default)(_float_test("isnan", False))
register_lowering(aten.isinf.default)(_float_test("isinf", False))
register_lowering(aten.isfinite.default)(_float_test("isfinite", True))


@register_lowering(aten.sign.default, aten.sgn.default)
def _sign(x: TensorValue) -> Lazy:
    """(x > 0) - (x < 0): NaN gives 0, as eager's sign does."""
    if x.dtype == torch.bool:
        return pointwise(lambda a: a, x)
    dt = compute_dtype(x.dtype)

    def fn(a: Any) -> Any:
        zero = ops.constant(0, dt)
        return ops.sub(ops.to_dtype(ops.gt(a, zero), dt), ops.to_dtype(ops.lt(a, zero), dt))
    return pointwise(fn, x)


@register_lowering(aten.pow.Tensor_Scalar)
def _pow_scalar(x: TensorValue, exponent: Any) -> Lazy:
    if not node_val().dtype.is_floating_point or isinstance(exponent, bool):
        raise UnsupportedOp("integer pow")
    dt = compute_dtype(node_val().dtype)
    special = {
        2: lambda a: ops.mul(a, a), 3: lambda a: ops.mul(ops.mul(a, a), a), 1: lambda a: a,
        0.5: ops.sqrt, -0.5: ops.rsqrt, -1: ops.reciprocal,
        -2: lambda a: ops.reciprocal(ops.mul(a, a)),
    }
    if exponent == 0:
        return pointwise(lambda a, e: ops.constant(1.0, dt), x, exponent, kind=Kind.BOOL_TO_LONG)
    fn = special.get(exponent)
    if fn is not None:
        return pointwise(lambda a, e: fn(a), x, exponent, kind=Kind.BOOL_TO_LONG)
    return pointwise(_pow_op(), x, exponent, kind=Kind.BOOL_TO_LONG)


@register_lowering(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(a: Any, b: Any) -> Lazy:
    if not node_val().dtype.is_floating_point:
        raise UnsupportedOp("integer pow")
    return pointwise(_pow_op(), a, b, kind=Kind.BOOL_TO_LONG)


def _pow_op() -> Any:
    """The target's pow, else C's pow composed from exp and log in float64 (with its special
    cases: x^0 = 1^y = 1, (-1)^±inf = 1, negative bases with integer exponents, -0.0)."""
    if has_spelling("pow"):
        return ops.pow
    if node_val().dtype == torch.float64:
        raise UnsupportedOp("pow of float64 has no exact interpret spelling")
    require("exp", "log", "floor", "fmod")
    return _via_float64_binary(_pow64)


def _via_float64_binary(fn: Any) -> Any:
    return lambda a, b: ops.to_dtype(fn(ops.to_dtype(a, torch.float64), ops.to_dtype(b, torch.float64)),
                                     torch.float32)


def _pow64(a: Any, b: Any) -> Any:
    zero, one, two, inf = _c64(0.0), _c64(1.0), _c64(2.0), _c64(math.inf)
    mag = ops.exp(ops.mul(b, ops.log(ops.abs(a))))
    integral = ops.eq(ops.floor(b), b)
    odd = ops.eq(ops.abs(ops.fmod(b, two)), one)
    neg_zero = ops.logical_and(ops.eq(a, zero), ops.lt(ops.truediv(one, a), zero))
    negative = ops.logical_or(ops.lt(a, zero), neg_zero)
    out = ops.where(ops.logical_and(negative, odd), ops.neg(mag), mag)
    no_real_root = ops.logical_and(ops.logical_and(ops.lt(a, zero), ops.ne(a, ops.neg(inf))),
                                   ops.logical_not(integral))
    out = ops.where(no_real_root, _c64(math.nan), out)
    unit = ops.logical_or(ops.eq(b, zero), ops.eq(a, one))
    unit = ops.logical_or(unit, ops.logical_and(ops.eq(a, ops.neg(one)), ops.eq(ops.abs(b), inf)))
    return ops.where(unit, one, out)


def _compare(op: str) -> Any:
    def lower(a: Any, b: Any) -> Lazy:
        return pointwise(lambda x, y: ops.binary_op(op, x, y), a, b, kind=Kind.ALWAYS_BOOL,
                         compute=_comp(a, b))
    return lower


for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    _packet = getattr(aten, _op)
    register_lowering(_packet.Tensor, _packet.Scalar)(_compare(_op))


def _logical(op: str) -> Any:
    def lower(a: Any, b: Any) -> Lazy:
        return pointwise(lambda x, y: ops.binary_op(op, x, y), a, b, kind=Kind.ALWAYS_BOOL,
                         compute=torch.bool)
    return lower


for _op in ("logical_and", "logical_or", "logical_xor"):
    register_lowering(getattr(aten, _op).default)(_logical(_op))


@register_lowering(aten.logical_not.default)
def _logical_not(x: TensorValue) -> Lazy:
    return pointwise(ops.logical_not, x, kind=Kind.ALWAYS_BOOL, compute=torch.bool)


def _bitwise(op: str) -> Any:
    def lower(a: Any, b: Any) -> Lazy:
        if node_val().dtype.is_floating_point:
            raise UnsupportedOp("bitwise op on floats")
        return pointwise(lambda x, y: ops.binary_op(op, x, y), a, b)
    return lower


for _op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    _packet = getattr(aten, _op)
    register_lowering(_packet.Tensor, _packet.Scalar)(_bitwise(_op))


@register_lowering(aten.bitwise_not.default)
def _bitwise_not(x: TensorValue) -> Lazy:
    if x.dtype == torch.bool:
        return pointwise(ops.logical_not, x, kind=Kind.ALWAYS_BOOL, compute=torch.bool)
    return pointwise(ops.bitwise_not, x)


@register_lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(cond: Any, a: Any, b: Any) -> Lazy:
    val = node_val()
    sizes = sizes_of(val)
    if not is_tensor(cond) or cond.dtype != torch.bool:
        raise UnsupportedOp("where with a non-bool condition")
    comp = compute_dtype(val.dtype)
    check_dtypes(val.dtype)
    c = operand(cond, sizes, torch.bool)
    x, y = operand(a, sizes, comp), operand(b, sizes, comp)
    return Lazy(val.dtype, sizes, lambda index: ops.where(c(index), x(index), y(index)))


def _cast(x: TensorValue) -> Lazy:
    val = node_val()
    check_dtypes(x.dtype, val.dtype)
    comp = compute_dtype(val.dtype)
    sizes = sizes_of(val)
    load = operand(x, sizes, compute_dtype(x.dtype))

    def inner(index: Any) -> Any:
        v = ops.to_dtype(load(index), val.dtype)
        return ops.to_dtype(v, comp)  # fp16/bf16: round, then compute on in fp32
    return Lazy(val.dtype, sizes, inner)


@register_lowering(prims.convert_element_type.default)
def _convert_element_type(x: TensorValue, dtype: torch.dtype) -> Lazy:
    return _cast(x)


@register_lowering(aten._to_copy.default)
def _to_copy(x: TensorValue, *, dtype: Any = None, layout: Any = None, device: Any = None,
             pin_memory: Any = None, non_blocking: bool = False, memory_format: Any = None) -> Lazy:
    if layout not in (None, torch.strided) or pin_memory:
        raise UnsupportedOp("_to_copy to another layout")
    if device is not None and torch.device(device).type != node_val().device.type:
        raise UnsupportedOp("_to_copy to another device")
    _check_memory_format(memory_format)
    return _cast(x)


def _check_memory_format(memory_format: Any) -> None:
    """Any dense memory format: the values do not depend on it, and a copy written to memory
    (a graph output, an extern call's operand) takes the node's own strides, eager's layout."""
    if memory_format not in (None, torch.preserve_format, torch.contiguous_format, torch.channels_last,
                             torch.channels_last_3d):
        raise UnsupportedOp(f"copy to {memory_format}")


@register_lowering(aten.clone.default, aten.lift_fresh_copy.default)
def _clone(x: TensorValue, *, memory_format: Any = None) -> Lazy:
    # lift_fresh_copy: a copy of a tensor constant (torch.tensor(...) inside a traced function).
    _check_memory_format(memory_format)
    return _cast(x)


@register_lowering(aten.copy.default)
def _copy(dst: TensorValue, src: TensorValue, non_blocking: bool = False) -> Lazy:
    """Functional copy: src broadcast to dst's sizes, in dst's dtype (dst's values are unused)."""
    if not is_tensor(src):
        raise UnsupportedOp("copy from a non-tensor")
    return _cast(src)


@register_lowering(aten.empty.memory_format)
def _empty(size: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
           memory_format: Any = None) -> Lazy:
    """Uninitialised memory may hold anything: zeros are as good as any, and cost nothing when the
    graph overwrites it (a functional copy never reads it)."""
    if layout not in (None, torch.strided):
        raise UnsupportedOp("empty with another layout")
    _check_memory_format(memory_format)
    val = node_val()
    check_dtypes(val.dtype)
    return Lazy(val.dtype, sizes_of(val), lambda index: ops.constant(0, compute_dtype(val.dtype)))


@register_lowering(aten.elu.default)
def _elu(x: TensorValue, alpha: Any = 1.0, scale: Any = 1.0, input_scale: Any = 1.0) -> Lazy:
    """scale * (x if x > 0 else alpha * expm1(x * input_scale)), as eager's elu."""
    if not x.dtype.is_floating_point:
        raise UnsupportedOp("elu of integers")
    require("expm1")
    dt = compute_dtype(x.dtype)

    def fn(a: Any) -> Any:
        c = lambda v: ops.constant(float(v), dt)
        neg = ops.mul(c(alpha), ops.expm1(ops.mul(a, c(input_scale))))
        return ops.mul(c(scale), ops.where(ops.gt(a, c(0.0)), a, neg))
    return pointwise(fn, x)


@register_lowering(aten.leaky_relu.default)
def _leaky_relu(x: TensorValue, negative_slope: Any = 0.01) -> Lazy:
    if not x.dtype.is_floating_point:
        raise UnsupportedOp("leaky_relu of integers")
    dt = compute_dtype(x.dtype)

    def fn(a: Any) -> Any:
        return ops.where(ops.gt(a, ops.constant(0.0, dt)), a, ops.mul(a, ops.constant(float(negative_slope), dt)))
    return pointwise(fn, x)


@register_lowering(aten.full.default)
def _full(size: Any, fill_value: Any, *, dtype: Any = None, layout: Any = None, device: Any = None,
          pin_memory: Any = None) -> Lazy:
    val = node_val()
    check_dtypes(val.dtype)
    if not isinstance(fill_value, (bool, int, float)):
        raise UnsupportedOp("full with a symbolic value")
    comp = compute_dtype(val.dtype)
    return Lazy(val.dtype, sizes_of(val), lambda index: ops.constant(fill_value, comp))



@register_lowering(aten.scalar_tensor.default, aten.full_like.default)
def _fill(*args: Any, **kwargs: Any) -> Lazy:
    fill_value = args[1] if len(args) > 1 else args[0]
    if not isinstance(fill_value, (bool, int, float)):
        raise UnsupportedOp("fill with a non-scalar value")
    if kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        raise UnsupportedOp("fill to another memory format")
    val = node_val()
    check_dtypes(val.dtype)
    comp = compute_dtype(val.dtype)
    return Lazy(val.dtype, sizes_of(val), lambda index: ops.constant(fill_value, comp))


@register_lowering(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(*args: Any, dtype: Any = None, layout: Any = None, device: Any = None,
            pin_memory: Any = None) -> Lazy:
    start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
    # Note: the end only sizes the result (the node's FakeTensor has that size, maybe symbolic:
    # arange(seq_len)); start and step are in every element.
    if not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in (start, step)):
        raise UnsupportedOp("arange with a symbolic start or step")
    val = node_val()
    check_dtypes(val.dtype)
    if is_symbolic(*sizes_of(val)) and (val.dtype.is_floating_point or isinstance(start, float)
                                        or isinstance(step, float)):
        raise UnsupportedOp("float arange of a symbolic length")
    if isinstance(start, float) or isinstance(step, float):
        if not val.dtype.is_floating_point:
            raise UnsupportedOp("integer arange with float bounds")
        # Note: start + i * step in float64 then rounded, as ATen's CPU kernel computes it.
        comp = compute_dtype(val.dtype)
        return Lazy(val.dtype, sizes_of(val), lambda index: ops.to_dtype(ops.add(
            ops.constant(float(start), torch.float64),
            ops.mul(ops.index_expr(index[0], torch.float64), ops.constant(float(step), torch.float64))), comp))
    if val.dtype.is_floating_point and max(abs(start), abs(start + step * val.shape[0])) > 2**24:
        raise UnsupportedOp("float arange beyond exact integers")
    comp = compute_dtype(val.dtype)
    return Lazy(val.dtype, sizes_of(val),
                lambda index: ops.to_dtype(ops.index_expr(start + index[0] * step, torch.int64), comp))


def _nan_ignoring(pick: str) -> Any:
    """fmax / fmin: the other operand where one is NaN, else maximum / minimum."""
    def lower(a: Any, b: Any) -> Lazy:
        if not node_val().dtype.is_floating_point:
            return pointwise(lambda x, y: ops.binary_op(pick, x, y), a, b)

        def fn(x: Any, y: Any) -> Any:
            return ops.where(ops.isnan(x), y, ops.where(ops.isnan(y), x, ops.binary_op(pick, x, y)))
        return pointwise(fn, a, b)
    return lower


register_lowering(aten.fmax.default)(_nan_ignoring("maximum"))
register_lowering(aten.fmin.default)(_nan_ignoring("minimum"))

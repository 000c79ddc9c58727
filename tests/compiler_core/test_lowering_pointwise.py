"""Pointwise lowerings vs eager: unary math, binary ops with broadcasting and scalars, casts, dtypes; the
OpInfo sweep's special values (floor division, remainder/fmod, clamp with tensor bounds, isnan/isinf/isfinite,
sign, log1p/expm1, elu, leaky_relu, copies to other memory formats, empty tensors)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.compiler_core.helpers import check, kernel_steps

torch.manual_seed(0)
X = torch.randn(6, 7)
Y = torch.randn(7)
XI = torch.randint(-5, 5, (6, 7))
YI = torch.randint(1, 4, (7,), dtype=torch.int32)
B = torch.randn(6, 7) > 0

UNARY = {
    "sin": torch.sin, "cos": torch.cos, "exp": torch.exp, "exp2": torch.exp2,
    "log": lambda x: torch.log(x.abs() + 0.1), "log2": lambda x: torch.log2(x.abs() + 0.1),
    "sqrt": lambda x: x.abs().sqrt(), "rsqrt": lambda x: (x.abs() + 0.1).rsqrt(),
    "abs": torch.abs, "neg": torch.neg, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "erf": torch.erf, "relu": torch.relu, "reciprocal": lambda x: (x + 10).reciprocal(),
    "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "square": lambda x: x ** 2, "cube": lambda x: x ** 3, "pow_half": lambda x: x.abs() ** 0.5,
    "clamp": lambda x: x.clamp(-0.5, 0.5), "clamp_min": lambda x: x.clamp(min=0.1),
}

BINARY = {
    "add": lambda a, b: a + b, "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "sub": lambda a, b: a - b, "sub_alpha": lambda a, b: torch.sub(a, b, alpha=3),
    "mul": lambda a, b: a * b, "div": lambda a, b: a / (b.abs() + 1),
    "maximum": torch.maximum, "minimum": torch.minimum,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "where": lambda a, b: torch.where(a > b, a, b),
}

SCALAR = {
    "add": lambda a: a + 2, "radd": lambda a: 1.5 + a, "sub": lambda a: a - 3, "rsub": lambda a: 3 - a,
    "mul": lambda a: a * -2.5, "div": lambda a: a / 4, "lt": lambda a: a < 1,
    "where": lambda a: torch.where(a > 0, a, 0.0),
}

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def tol(dtype: torch.dtype) -> dict[str, float]:
    if dtype in (torch.float16, torch.bfloat16):
        return {"atol": 2e-2, "rtol": 2e-2}
    return {"atol": 1e-5, "rtol": 1e-5}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name: str, dtype: torch.dtype) -> None:
    check(UNARY[name], X.to(dtype), **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcast(name: str, dtype: torch.dtype) -> None:
    check(BINARY[name], X.to(dtype), Y.to(dtype), **tol(dtype))


@pytest.mark.parametrize("name", sorted(SCALAR))
@pytest.mark.parametrize("x", [X, XI, X.t()], ids=["float", "int", "transposed"])
def test_scalar_operands(name: str, x: torch.Tensor) -> None:
    check(SCALAR[name], x)


def test_mixed_dtypes_promote():
    check(lambda a, b: a + b, XI, Y)
    check(lambda a, b: a * b, XI, YI)
    check(lambda a, b: a / b, XI, YI)
    check(lambda a, b: a + b, X.half(), Y)
    check(lambda a, b: a * b, X.bfloat16(), X.half(), atol=2e-2, rtol=2e-2)


def test_int_and_bool_ops():
    check(lambda a: (a * 3 - 1).abs() & 7, XI)
    check(lambda a, b: (a | b) ^ (a & b), XI, XI.flip(0))
    check(lambda b: ~b | b.logical_not(), B)
    check(lambda b, c: torch.logical_and(b, c) | torch.logical_xor(b, c), B, B.t().contiguous().t())
    check(lambda a: torch.logical_or(a, a > 2), XI)
    check(lambda a: torch.relu(a) + a.abs(), XI)


def test_casts():
    check(lambda a: a.half() * 2, X)
    check(lambda a: (a * 3).to(torch.int32), X)
    check(lambda a: a.to(torch.bool), X)
    check(lambda a: a.to(torch.float64) / 3, XI)
    check(lambda b: b.to(torch.float32) + 1, B)
    check(lambda a: a.to(torch.uint8), XI.abs())
    # Triton's interpreter truncates fp32 → bf16 where GPUs round: allow one bf16 ulp.
    check(lambda a: a.bfloat16().float(), X, atol=0, rtol=2**-7)


def test_div_rounding_modes():
    check(lambda a, b: torch.div(a, b, rounding_mode="trunc"), X, Y)
    art = check(lambda a, b: torch.div(a, b, rounding_mode="floor"), X, Y)
    assert art.manifest.stats.nodes_extern == 0
    art = check(lambda a, b: torch.div(a, b, rounding_mode="floor"), XI, YI)
    assert "aten.div.Tensor_mode" in art.manifest.stats.extern_ops  # integers: eager raises on / 0
    check(lambda a, b: torch.div(a, b, rounding_mode="trunc"), XI, YI)


def test_nan_propagates_through_maximum_and_relu():
    x = X.clone()
    x[0, 0] = float("nan")
    check(lambda a, b: torch.maximum(a, b) + torch.minimum(b, a), x, Y)
    check(torch.relu, x)
    check(lambda a: a.clamp(-0.1, 0.1), x)


def test_full_and_fill():
    check(lambda a: torch.full_like(a, 3.5) + a, X)
    check(lambda a: torch.where(a > 0, a, torch.zeros_like(a)), X)


def test_unsupported_op_becomes_extern_and_matches():
    art = check(lambda a: torch.atan2(a, a + 1).sin(), X)
    stats = art.manifest.stats
    assert "aten.atan2.default" in stats.extern_ops
    assert stats.kernels == 2  # a + 1 for the extern, then sin of its result


def test_interpret_target_externs_ops_without_exact_spelling():
    # float32 acos is composed in float64; float64's has no exact composition on the interpreter
    art = check(lambda a: torch.acos(a.clamp(-1, 1)) + 1, X.double())
    assert "aten.acos.default" in art.manifest.stats.extern_ops


def test_scalars_round_to_the_promoted_dtype_first():
    x = torch.tensor([0.1, 0.2, -0.1, 0.0999], dtype=torch.float16)
    check(lambda a: a < 0.1, x)
    check(lambda a: a == 0.1, x)
    check(lambda a: a + 0.1, x)


def test_fp16_chains_round_after_each_op_like_eager():
    # Without rounding each fused op's result to fp16, some products land across an integer.
    x = torch.randn(4096)
    check(lambda a: ((a.half() * 1.5).sin() * 100).to(torch.int32), x, atol=0, rtol=0)


def test_exact_gelu_is_accurate_across_its_range_and_in_its_lower_tail() -> None:
    """fp32's GELU gate is Phi through an erfc (codegen's _fxcc_normal_cdf): against float64 it keeps
    a small relative error everywhere, where 1 + erf(x) in fp32 (eager's spelling) cancels to
    nothing below x = -3; fp64 keeps libdevice's / numpy's erf."""
    from tests.compiler_core.helpers import compile_fn, run

    x = torch.linspace(-9.0, 9.0, 20001)
    art = compile_fn(F.gelu, x)
    assert "_fxcc_normal_cdf(" in art.blobs[art.manifest.kernels[0].source.digest].decode()
    (got,) = run(art, x)
    x64 = x.double()
    ref = x64 * 0.5 * torch.special.erfc(-x64 * 0.5 ** 0.5)  # float64 gelu cancels too, below -8
    rel = ((got.double() - ref).abs() / ref.abs().clamp_min(1e-300))[ref.abs() > 1e-30]
    assert rel.max() < 2e-5, rel.max()  # exp(-x*x/2) of an fp32 x: ~x*x ulps in the far tail
    eager_rel = ((F.gelu(x).double() - ref).abs() / ref.abs().clamp_min(1e-300))[ref.abs() > 1e-30]
    assert eager_rel.max() > 1e-2  # eager's fp32 cancellation, which the erfc form avoids

    art64 = compile_fn(F.gelu, x64)
    assert "_fxcc_normal_cdf(" not in art64.blobs[art64.manifest.kernels[0].source.digest].decode().split(
        "@triton.jit\ndef fxcc")[-1]
    (got64,) = run(art64, x64)
    torch.testing.assert_close(got64, F.gelu(x64), rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------- Pointwise lowerings added for the OpInfo sweep

torch.manual_seed(0)
SPECIAL = torch.tensor([0.0, -0.0, 1e-8, -1e-8, 1e-3, -0.5, 3.0, 7.5, -7.5, 1e20, -1e20, 100.0, -100.0,
                        float("inf"), -float("inf"), float("nan"), -1.0, -2.0])
XW = torch.randn(6, 7) * 4
YW = torch.randn(7) * 3


def native(art) -> bool:
    return art.manifest.stats.nodes_extern == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_floor_divide_remainder_fmod_match_eager_on_signs_zeros_and_infs(dtype):
    a = SPECIAL.to(dtype)[:, None].expand(-1, 6)
    b = torch.tensor([2.0, -2.0, 0.0, 0.3, float("inf"), -float("inf")], dtype=dtype)
    assert native(check(lambda p, q: torch.div(p, q, rounding_mode="floor"), a, b))
    assert native(check(torch.remainder, a, b))
    assert native(check(torch.fmod, a, b))
    assert native(check(lambda p: torch.remainder(p, -1.5) + torch.fmod(p, 2.5), XW.to(dtype)))


def test_integer_remainder_by_a_constant_is_native_by_a_tensor_extern():
    xi = torch.randint(-9, 9, (5, 4))
    for d in (4, -3):
        assert native(check(lambda p: torch.remainder(p, d) + torch.fmod(p, d), xi))  # noqa: B023 - called at once
    assert native(check(lambda p: torch.remainder(p, 3), xi.to(torch.uint8)))
    art = check(lambda p, q: torch.remainder(p, q), xi, torch.randint(1, 5, (4,)))
    assert "aten.remainder.Tensor" in art.manifest.stats.extern_ops  # eager raises on a zero divisor


def test_pow_round_and_float64_compositions_on_the_interpreter():
    v = torch.tensor([0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, 1e-30, 1e30,
                      float("inf"), -float("inf"), float("nan"), 7.3, -0.3])
    a = v[:, None].expand(-1, len(v))
    for dtype in (torch.float32, torch.bfloat16):
        assert native(check(torch.pow, a.to(dtype), v.to(dtype)))  # C's special cases, every pair
        assert native(check(lambda p: torch.pow(p, 2.7) + torch.pow(1.7, p), XW.to(dtype)))
        ties = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.49999997, 1e10, -1e-8,
                             3.5000002, float("nan"), float("inf"), -float("inf")])
        assert native(check(torch.round, ties.to(dtype)))
        x = torch.cat([torch.tensor([1e-8, -1e-5, 0.0, 1e-3, -1e-3, 9.0]), torch.randn(200) * 3]).to(dtype)
        assert native(check(lambda p: torch.stack([p.sinh(), p.cosh(), p.tan(), p.abs().log10()]), x))
    art = check(torch.pow, a.double(), v.double())
    assert "aten.pow.Tensor_Tensor" in art.manifest.stats.extern_ops  # float64 has no exact composition


def test_clamp_with_tensor_bounds_and_integers():
    lo, hi = torch.randn(7) - 1, torch.randn(6, 1) + 1
    x = XW.clone()
    x[0, 0] = float("nan")
    lo[1] = float("nan")
    assert native(check(lambda p, q, r: torch.clamp(p, q, r), x, lo, hi))
    assert native(check(lambda p, q: torch.clamp(p, min=q), x, lo))
    assert native(check(lambda p, r: torch.clamp(p, max=r), x, hi))
    assert native(check(lambda p: torch.clamp(p, -3, 2), torch.randint(-9, 9, (5, 4))))
    assert native(check(lambda p: F.hardtanh(p, -0.5, 0.5) + F.relu6(p), XW))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_tests_and_sign(dtype):
    x = SPECIAL.to(dtype)
    assert native(check(lambda p: torch.stack([p.isnan(), p.isinf(), p.isfinite()]), x))
    assert native(check(torch.sign, x))
    assert native(check(lambda p: torch.nan_to_num(p, nan=1.0, posinf=2.0, neginf=-2.0), x))
    xi = torch.arange(-3, 3)
    assert native(check(lambda p: torch.stack([p.isnan(), p.isinf(), p.isfinite()]), xi))
    assert native(check(torch.sign, xi))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_log1p_and_expm1_are_accurate_on_the_interpreter(dtype):
    x = torch.cat([SPECIAL, torch.logspace(-30, 1, 50), -torch.logspace(-30, 0, 50)]).to(dtype)
    assert native(check(torch.log1p, x))
    assert native(check(torch.expm1, x))
    assert native(check(lambda p: F.softplus(p) + F.elu(p) + F.celu(p, 0.5) + F.selu(p), XW.to(dtype)))


def test_leaky_relu():
    assert native(check(lambda p: F.leaky_relu(p, 0.2), XW))


def test_copies_to_channels_last_keep_eager_strides():
    x = torch.randn(2, 3, 4, 5)
    assert native(check(lambda p: (p + 1).to(memory_format=torch.channels_last), x))
    assert native(check(lambda p: torch.clone(p, memory_format=torch.channels_last) * 2, x))


def test_empty_tensors_need_no_kernel():
    e = torch.randn(3, 0, 4)
    art = check(lambda p: p.sin() * 2 + 1, e)
    assert native(art) and not kernel_steps(art)
    art = check(lambda p: p.sum(1) + 1, e)  # a sum over nothing is 0
    assert native(art)
    art = check(lambda p: p.prod(1), e)  # a product over nothing is 1
    assert native(art)
    art = check(lambda p: p.sum(0), e)  # no outputs at all
    assert native(art) and not kernel_steps(art)
    assert native(check(lambda p: torch.cat([p, p.cos()], 1), e))


def test_reductions_over_dim_0_of_a_0d_tensor():
    s = torch.tensor(2.5)
    assert native(check(lambda p: p.sum(0) + p.amax(-1, keepdim=True), s))
    assert native(check(lambda p: torch.softmax(p, 0), s))
    assert native(check(lambda p: p.expand(()) * 2, s))


def test_norms():
    x = torch.randn(5, 33)
    for o in (2, 1, 0, float("inf"), -float("inf")):
        assert native(check(lambda p: torch.linalg.vector_norm(p, o, dim=1), x))  # noqa: B023 - called at once
        assert native(check(lambda p: torch.linalg.vector_norm(p, o), x.to(torch.bfloat16)))  # noqa: B023 - called at once
    assert native(check(lambda p: F.normalize(p, dim=1), x))
    x[0, :3] = 0
    for o in (3, 0.5, -1, 3.5, -0.5):  # (sum |x|^p)^(1/p) through the interpreter's pow
        assert native(check(lambda p: torch.linalg.vector_norm(p, o, dim=1), x))  # noqa: B023 - called at once
        assert native(check(lambda p: torch.linalg.vector_norm(p, o), x.to(torch.bfloat16)))  # noqa: B023 - called at once
    art = check(lambda p: torch.linalg.vector_norm(p, 3), x.double())
    assert "aten.linalg_vector_norm.default" in art.manifest.stats.extern_ops  # no float64 pow


def test_any_all():
    b = torch.randn(4, 5) > 0
    nan = torch.tensor([[0.0, float("nan")], [0.0, 0.0]])
    for fn in (lambda p: p.any(), lambda p: p.all(1), lambda p: p.any(0, keepdim=True),
               lambda p: torch.all(p, dim=(0, 1))):
        for t in (b, XW[:4, :5], nan, torch.randint(-1, 2, (4, 5)), torch.zeros(3, 0)):
            assert native(check(fn, t))


def test_flip_and_diagonal():
    x = torch.randn(4, 5, 6)
    assert native(check(lambda p: torch.flip(p, (0, 2)) + 1, x))
    assert native(check(lambda p: torch.flip(p.transpose(0, 2), (1,)), x))
    for off in (-2, 0, 3, 9):
        assert native(check(lambda p: torch.diagonal(p, off, 2, 0) * 2, x))  # noqa: B023 - called at once


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_argmax_argmin_and_max_min_with_indices_pick_the_first_tie_or_nan(dtype):
    x = torch.randint(0, 4, (5, 7, 6)).float()  # many ties
    if dtype.is_floating_point:
        x[1, 2, 3] = x[2, 0, 0] = x[2, 5, 0] = float("nan")
    x = x.to(dtype)
    for fn in (lambda p: p.argmax(), lambda p: p.argmin(1), lambda p: p.argmax(-1, keepdim=True),
               lambda p: p.max(1), lambda p: p.min(2, keepdim=True), lambda p: p.max(), lambda p: p.min()):
        assert native(check(fn, x))
        assert native(check(fn, x.transpose(0, 2)))
    assert native(check(lambda p: p.argmax(1), torch.randint(0, 50, (3, 9000)).to(dtype)))  # looped rows
    assert native(check(lambda p: p.argmax(0), torch.tensor(3).to(dtype)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_cumsum_cumprod(dtype):
    x = (torch.randn(5, 33, 4) * 2).to(dtype)
    assert native(check(lambda p: p.cumsum(1), x))
    assert native(check(lambda p: p.cumsum(-1).sum(1), x.transpose(0, 1)))
    if dtype != torch.bool:
        assert native(check(lambda p: p.cumprod(0) * 2, x))
    assert native(check(lambda p: torch.cumsum(p, 0, dtype=torch.float64), x))
    assert native(check(lambda p: p.cumsum(0), torch.tensor(3).to(dtype)))
    art = check(lambda p: p.cumsum(1), torch.randn(2, 600).to(dtype))
    assert "aten.cumsum.default" in art.manifest.stats.extern_ops  # long scans stay extern


def test_fmax_fmin_ignore_nans():
    x, y = XW.clone(), YW.clone()
    x[0, 0] = y[1] = float("nan")
    x[2, 3] = y[3] = float("nan")  # both NaN: NaN
    assert native(check(torch.fmax, x, y))
    assert native(check(torch.fmin, x, y))


def test_float_arange():
    assert native(check(lambda p: torch.arange(0.5, 3.1, 0.3) + p, torch.randn(9)))
    assert native(check(lambda p: torch.arange(-1, 1, 0.25, dtype=torch.bfloat16) * p, torch.randn(8)))


def test_repeat_unfold_and_diagonal_views_keep_eager_strides():
    x = torch.randn(3, 4)
    for fn in (lambda p: p.repeat(2, 1, 3), lambda p: p.t().repeat(2, 3) + 1, lambda p: p.repeat(0, 2),
               lambda p: p.unfold(1, 2, 1), lambda p: (p + 1).unfold(0, 2, 1), lambda p: torch.diagonal(p),
               lambda p: torch.diagonal(p.sin(), 1)):
        assert native(check(fn, x))
    assert native(check(lambda p: p.unfold(0, 1, 1), torch.tensor(2.0)))


def test_realized_shared_values_keep_eager_layout_for_extern_readers():
    """A value realized for several readers (here a channels_last copy) is written in eager's
    layout: convolution, an extern call, lays its result out like its input, and later kernels
    read that result with the strides eager's convolution gives."""
    w = torch.randn(4, 3, 3, 3)

    def fn(x, k):
        y = x
        for _ in range(10):
            y = (y * 1.01 + 0.1).sin()
        z = y.contiguous(memory_format=torch.channels_last)
        return F.conv2d(z, k) + 1, z.sum()
    check(fn, torch.randn(2, 3, 8, 8), w)

    def permuted(x, k):
        y = x.permute(0, 3, 1, 2)
        for _ in range(10):
            y = (y * 1.01 + 0.1).sin()
        return F.conv2d(y, k) * 2, y.sum()
    check(permuted, torch.randn(2, 8, 8, 3), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inverse_trig_and_hyperbolic_via_float64_on_the_interpreter(dtype):
    special = torch.tensor([0.0, -0.0, 1e-8, -1e-8, 1e-4, -1e-3, 0.999, 1.0, -1.0, 1.0000001, 0.99999994,
                            -0.99999994, 1.5, -2.0, 10.0, 1e10, 1e30, 3e38, -3e38, float("inf"),
                            -float("inf"), float("nan")])
    x = torch.cat([special, torch.randn(500) * 3, torch.rand(500) * 2 - 1, torch.logspace(-38, 38, 200),
                   -torch.logspace(-38, 38, 200)]).to(dtype)
    for fn in (torch.atan, torch.asin, torch.acos, torch.asinh, torch.acosh, torch.atanh):
        assert native(check(fn, x))
    assert native(check(torch.atan, torch.arange(-5, 5)))  # integers compute in float32
    art = check(torch.atan, x.double())
    assert "aten.atan.default" in art.manifest.stats.extern_ops  # float64 has no exact composition


@pytest.mark.parametrize("cfg", [
    {"kernel_size": 3}, {"kernel_size": (3, 2), "stride": (2, 1), "padding": 1},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
    {"kernel_size": 2, "divisor_override": 3},
    {"kernel_size": 4, "stride": 3, "padding": 2, "ceil_mode": True, "count_include_pad": False},
])
def test_avg_pool2d_windows_padding_and_divisors(cfg):
    x = torch.randn(2, 3, 9, 8)
    for t in (x, x.to(torch.bfloat16), x[0], x.permute(0, 1, 3, 2)):
        assert native(check(lambda p: F.avg_pool2d(p, **cfg), t, decompose=False))

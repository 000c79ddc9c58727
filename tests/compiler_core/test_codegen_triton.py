"""Triton codegen: deterministic source, simple index math, per-target spellings; index text evaluates to its
expression; kernels differing only in launch config stay apart."""

from __future__ import annotations

import itertools

import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.sizevars import FloorDiv, ModularIndexing, render_index
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target
from tests.compiler_core.helpers import compile_fn


def sources(art) -> list[str]:
    return [art.blobs[k.source.digest].decode() for k in art.manifest.kernels]


def test_same_graph_gives_byte_identical_source():
    x = torch.randn(16, 8)
    a = compile_fn(lambda x: torch.cos(torch.sin(x)) + 1, x)
    b = compile_fn(lambda x: torch.cos(torch.sin(x)) + 1, x)
    assert sources(a) == sources(b)
    assert [k.source.digest for k in a.manifest.kernels] == [k.source.digest for k in b.manifest.kernels]
    assert a.manifest.plan == b.manifest.plan


def test_contiguous_loads_index_by_xindex():
    (src,) = sources(compile_fn(lambda x: torch.cos(torch.sin(x)), torch.randn(64, 32)))
    assert "tl.load(in_ptr0 + (xindex), xmask)" in src
    assert "tl.store(out_ptr0 + (xindex), " in src
    assert src.count("@triton.jit\ndef fxcc_pw_") == 1
    assert "import triton\nimport triton.language as tl\n" in src


def test_broadcast_and_transpose_index_math():
    (src,) = sources(compile_fn(lambda x, b: x.t().contiguous() + b, torch.randn(8, 4), torch.randn(8)))
    assert "(xindex % 8)" in src and "(xindex // 8)" in src
    # eager keeps x.t()'s layout for x.t() + b: walk memory order, broadcast b along it
    (src,) = sources(compile_fn(lambda x, b: x.t() + b, torch.randn(8, 4), torch.randn(8)))
    assert "tl.load(in_ptr1 + ((xindex // 4)), xmask)" in src


def test_low_precision_computes_in_fp32_and_casts_on_store():
    (src,) = sources(compile_fn(lambda x: x.sin() * 2, torch.randn(8, 4).half()))
    assert ".to(tl.float32)" in src and ".to(tl.float16)" in src


def test_cuda_target_uses_libdevice():
    x = torch.randn(8, 4)
    gm = make_fx(lambda x: torch.tanh(x).log1p())(x)
    req = CompileRequest(graph=capture_graph(gm, [x]).spec,
                         options=CompileOptions(target=Target(kind="cuda", arch=90)))
    art = compile_request(req)
    (src,) = sources(art)
    assert "libdevice.tanh(" in src and "libdevice.log1p(" in src
    assert "from triton.language.extra import libdevice" in src


def test_transposed_outputs_are_written_in_memory_order():
    x = torch.randn(16, 8).t()  # eager keeps this layout for pointwise results
    (src,) = sources(compile_fn(lambda a: a.sin() * 2, x))
    assert "tl.load(in_ptr0 + (xindex), xmask)" in src
    assert "tl.store(out_ptr0 + (xindex), " in src


def test_masks_of_sizes_every_tile_covers_are_constants_others_compare():
    from tests.compiler_core.helpers import check

    def ln(x):
        return torch.nn.functional.layer_norm(torch.nn.functional.gelu(x), x.shape[-1:])

    even = torch.randn(4096, 64)  # rows a multiple of the widest XBLOCK, a power-of-two row
    (src,) = sources(check(ln, even))
    assert "xmask = tl.full([XBLOCK, 1], True, tl.int1)" in src
    assert "rmask = tl.full([1, RBLOCK], True, tl.int1)" in src
    assert "< xnumel" not in src and "< rnumel" not in src
    (src,) = sources(check(lambda x: x.sin() * 2, torch.randn(8192)))
    assert "xmask = tl.full([XBLOCK], True, tl.int1)" in src and "< xnumel" not in src

    # rows and lengths some config's tile overhangs keep their compares, and still match eager
    for shape in ((4095, 64), (4096, 48), (2048, 64)):
        (src,) = sources(check(ln, torch.randn(*shape)))
        assert ("xmask = xindex < xnumel" in src) == (shape[0] % 4096 != 0), shape
        assert ("rmask = rindex < rnumel" in src) == (shape[1] != 64), shape
    (src,) = sources(check(lambda x: x.sin() * 2, torch.randn(100)))
    assert "xmask = xindex < xnumel" in src


# ---------------------------------------------------------------- Regressions: index text evaluates to its expression; kernels differing only in launch config stay apart

x, y = sympy.symbols("x y", integer=True, nonnegative=True)


def _value(expr, env):
    """The integer value of an index expression, from its definition rather than its text."""
    if expr.is_Integer:
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return env[expr.name]
    if isinstance(expr, FloorDiv):
        return _value(expr.args[0], env) // _value(expr.args[1], env)
    if isinstance(expr, ModularIndexing):
        a, d, m = expr.args
        return (_value(a, env) // _value(d, env)) % _value(m, env)
    if expr.is_Add:
        return sum(_value(a, env) for a in expr.args)
    if expr.is_Mul:
        out = 1
        for a in expr.args:
            out *= _value(a, env)
        return out
    raise AssertionError(expr)


def _check(expr):
    code = compile(render_index(expr), "<index>", "eval")
    for xv, yv in itertools.product(range(0, 2000, 37), range(0, 50, 7)):
        env = {"x": xv, "y": yv}
        assert eval(code, {}, dict(env)) == _value(expr, env), (render_index(expr), env)  # our own rendering, never received text


def test_sums_inside_floordiv_and_mod_keep_their_parentheses():
    a = ModularIndexing(x, 1, 16) + 16 * FloorDiv(x, 512)
    for expr in (FloorDiv(a, 64), ModularIndexing(a, 1, 64), 192 * FloorDiv(a, 64) + 384 * ModularIndexing(x, 16, 32),
                 ModularIndexing(a, 4, 8), FloorDiv(x + y, 3) * 5):
        _check(expr)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 64), st.integers(0, 7))
def test_random_nested_index_expressions(c1, c2, div, off):
    inner = c1 * ModularIndexing(x, 1, 16) + c2 * FloorDiv(x, 32) + off + y
    _check(FloorDiv(inner, div) + ModularIndexing(inner, div, 7) * c1)


def test_same_body_different_block_sizes_are_different_kernels():
    """One graph computing the same pointwise body over 8 and over 32 elements."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.capture import capture_graph
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileRequest

    def f(a, b, c, d):
        return torch.mm(a * b, a.t()), torch.mm(c * d, c.t())

    args = [torch.randn(8, 1), torch.randn(8, 1), torch.randn(32, 1), torch.randn(32, 1)]
    gm = make_fx(f)(*args)
    art = compile_request(CompileRequest(graph=capture_graph(gm, args).spec))
    got = load_plan(art)(args)
    for g, e in zip(got, f(*args)):
        torch.testing.assert_close(g, e)
    names = [k.name for k in art.manifest.kernels]
    assert len(names) == len(set(names))


def test_zero_dim_inputs_load_as_blocks():
    """relu and logical_and of 0-d tensors (scalar loads used to break Triton's interpreter)."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.capture import capture_graph
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileRequest

    def f(a, b, c):
        return torch.relu(a), torch.logical_and(a, b), a * c

    args = [torch.tensor(-1.5), torch.tensor(2.0), torch.randn(4, 3)]
    gm = make_fx(f)(*args)
    art = compile_request(CompileRequest(graph=capture_graph(gm, args).spec))
    assert art.manifest.stats.nodes_extern == 0
    for got, exp in zip(load_plan(art)(args), f(*args)):
        torch.testing.assert_close(got, exp)


def test_interpreted_bf16_stores_round_to_nearest_even():
    """Triton's interpreter truncates fp32 → bf16; kernels round first, so results equal torch's."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.capture import capture_graph
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileRequest

    def f(x):
        return (x * 1.0001).to(torch.bfloat16)

    x = torch.randn(4096) * 100
    x[:4] = torch.tensor([float("nan"), float("inf"), -6.0615, 3.4e38])
    gm = make_fx(f)(x)
    art = compile_request(CompileRequest(graph=capture_graph(gm, [x]).spec))
    assert art.manifest.stats.kernels == 1
    (got,) = load_plan(art)([x])
    torch.testing.assert_close(got, f(x), rtol=0, atol=0, equal_nan=True)


def test_single_element_float_arange():
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.capture import capture_graph
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileRequest

    def f(x):
        return torch.arange(1, dtype=torch.float32) + x, torch.arange(0, 3, dtype=torch.float32) * x

    args = [torch.randn(1)]
    gm = make_fx(f)(*args)
    art = compile_request(CompileRequest(graph=capture_graph(gm, args).spec))
    for got, exp in zip(load_plan(art)(args), f(*args)):
        torch.testing.assert_close(got, exp)


def test_bool_and_int_to_bf16():
    """bool/int → bf16 went straight to bf16 bits in the interpreter (a dropout mask became 0)."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.capture import capture_graph
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileRequest

    def f(g, mask, i):
        return g * mask * 2.0, i.to(torch.bfloat16) + g

    args = [torch.randn(64).bfloat16(), torch.rand(64) > 0.5, torch.randint(-300, 300, (64,))]
    gm = make_fx(f)(*args)
    art = compile_request(CompileRequest(graph=capture_graph(gm, args).spec))
    assert art.manifest.stats.kernels >= 1
    for got, exp in zip(load_plan(art)(args), f(*args)):
        torch.testing.assert_close(got, exp)


def test_tensor_constants_are_copied_by_a_kernel():
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileRequest

    def f(x):
        return x * torch.tensor([1.5, -2.0, 3.0])

    x = torch.randn(4, 3)
    gm = make_fx(f, decomposition_table=decomposition_table())(x)
    assert any(n.target is torch.ops.aten.lift_fresh_copy.default for n in gm.graph.nodes)
    cap = capture_graph(gm, [x])
    art = compile_request(CompileRequest(graph=cap.spec))
    assert "aten.lift_fresh_copy.default" not in art.manifest.stats.extern_ops
    torch.testing.assert_close(load_plan(art)([x] + cap.constants)[0], f(x))

"""Codegen regressions: index text evaluates to its expression; kernels differing only in launch config stay apart."""

import itertools

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from fxcc.compiler_core.sizevars import FloorDiv, ModularIndexing, render_index

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
    from fxcc.compiler_core.compile import compile_request
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
    from fxcc.compiler_core.compile import compile_request
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
    from fxcc.compiler_core.compile import compile_request
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
    from fxcc.compiler_core.compile import compile_request
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
    from fxcc.compiler_core.compile import compile_request
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
    from fxcc.compiler_core.compile import compile_request
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

"""Randomised checks: index simplification keeps values, and random view/pointwise/reduction chains match eager."""

from __future__ import annotations

import math

import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fxcc.compiler_core.sizevars import (
    XINDEX,
    FloorDiv,
    ModularIndexing,
    contiguous_strides,
    flatten,
    linear_index,
    render_index,
    simplify_index,
    unflatten,
)
from tests.compiler_core.helpers import check

sizes_st = st.lists(st.integers(1, 5), min_size=1, max_size=4)


def _value(expr: sympy.Expr, x: int) -> int:
    return int(expr.subs(XINDEX, x).replace(
        lambda e: isinstance(e, (FloorDiv, ModularIndexing)), lambda e: e.func(*e.args)))


@settings(max_examples=80, deadline=None)
@given(sizes_st, st.data())
def test_simplify_keeps_every_in_range_value(sizes: list[int], data: st.DataObject) -> None:
    """A reshape of a permuted buffer, as index math: simplified and rendered forms agree everywhere."""
    perm = data.draw(st.permutations(range(len(sizes))))
    strides = contiguous_strides([sizes[p] for p in perm])
    strides = [strides[perm.index(i)] for i in range(len(sizes))]
    target = data.draw(st.sampled_from(_factorizations(math.prod(sizes))))
    idx = unflatten(flatten(unflatten(XINDEX, target), target), sizes)
    raw = linear_index(idx, strides)
    n = math.prod(sizes)
    simple = simplify_index(raw, {XINDEX: n})
    text = render_index(simple)
    for x in range(n):
        want = _value(raw, x)
        assert _value(simple, x) == want
        assert eval(text, {"xindex": x}) == want


def _factorizations(n: int) -> list[list[int]]:
    out = [[n]]
    for a in range(2, n):
        if n % a == 0:
            out.append([a, n // a])
            for b in range(2, n // a):
                if (n // a) % b == 0:
                    out.append([a, b, n // a // b])
    return out


VIEWS = ["permute", "transpose", "slice", "unsqueeze", "reshape", "select", "expand"]
MATH = ["sin", "add", "mul_input", "sum", "softmax", "relu"]


def _apply(op: str, y: torch.Tensor, x: torch.Tensor, r: int) -> torch.Tensor:
    rank = y.dim()
    d = r % max(rank, 1)
    if op == "permute" and rank > 1:
        return y.permute(*reversed(range(rank)))
    if op == "transpose" and rank > 1:
        return y.transpose(0, d)
    if op == "slice" and rank and y.shape[d] > 1:
        return y.narrow(d, 1, y.shape[d] - 1)[(slice(None),) * d + (slice(None, None, 2),)]
    if op == "unsqueeze":
        return y.unsqueeze(d)
    if op == "reshape" and rank > 1:
        return y.reshape(-1)
    if op == "select" and rank > 1:
        return y.select(d, y.shape[d] - 1)
    if op == "expand" and rank and y.shape[d] == 1:
        return y.expand(*[3 if i == d else s for i, s in enumerate(y.shape)])
    if op == "sin":
        return y.sin()
    if op == "add":
        return y + 0.5
    if op == "mul_input" and y.numel() == x.numel():
        return y * x.reshape(y.shape)
    if op == "sum" and rank:
        return y.sum(d)
    if op == "softmax" and rank:
        return torch.softmax(y, d)
    if op == "relu":
        return torch.relu(y - 0.1)
    return y


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(2, 5), min_size=1, max_size=3),
       st.lists(st.tuples(st.sampled_from(VIEWS + MATH), st.integers(0, 3)), min_size=1, max_size=6))
def test_random_chains_match_eager(sizes: list[int], ops: list[tuple[str, int]]) -> None:
    x = torch.randn(sizes)

    def f(a: torch.Tensor) -> torch.Tensor:
        y = a
        for op, r in ops:
            y = _apply(op, y, a, r)
        return y * 1.0 + 0.0 if y is a else y

    check(f, x, atol=1e-5, rtol=1e-5)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(0, 5), st.integers(1, 48), st.integers(1, 7),
       st.integers(1, 8), st.integers(1, 6))
def test_simplify_two_symbols(cx: int, cr: int, c0: int, div: int, mod: int, nx: int, nr: int) -> None:
    from fxcc.compiler_core.sizevars import RINDEX

    a = cx * XINDEX + cr * RINDEX + c0
    for expr in (FloorDiv(a, div), ModularIndexing(a, div, mod), FloorDiv(a, div) * 3 + ModularIndexing(a, 1, div)):
        simple = simplify_index(expr, {XINDEX: nx, RINDEX: nr})
        for x in range(nx):
            for r in range(nr):
                want = int(expr.subs({XINDEX: x, RINDEX: r}))
                assert int(simple.subs({XINDEX: x, RINDEX: r})) == want, (expr, simple, x, r)

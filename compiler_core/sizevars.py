"""All SymPy in fxcc: index symbols, FloorDiv/ModularIndexing, layouts as index maps, simplification, rendering.

Note: sizes are concrete ints here (the wire carries no symbolic shapes yet), so every query is
exact and no guard is ever recorded. Index expressions only ever see non-negative integers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import sympy

Expr = sympy.Expr

XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)


class FloorDiv(sympy.Function):
    """a // b for non-negative integer a and positive integer b."""

    nargs = 2
    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a: Expr, b: Expr) -> Expr | None:
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if isinstance(a, FloorDiv):
            return FloorDiv(a.args[0], a.args[1] * b)
        if isinstance(a, ModularIndexing) and _divides(a.args[2], b):
            x, d, m = a.args
            return ModularIndexing(x, d * b, m / b)
        if a.is_Add:  # (k*b*y + z) // b == k*y + z // b  when every k*b*y term divides
            whole = [t for t in a.args if _divides(t, b)]
            if whole:
                rest = sympy.Add(*[t for t in a.args if not _divides(t, b)])
                return sympy.Add(*[t / b for t in whole]) + FloorDiv(rest, b)
        if a.is_Mul and _divides(a, b):
            return a / b
        return None


class ModularIndexing(sympy.Function):
    """(a // div) % mod for non-negative integer a."""

    nargs = 3
    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a: Expr, div: Expr, mod: Expr) -> Expr | None:
        if mod == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and div.is_Integer and mod.is_Integer:
            return sympy.Integer((int(a) // int(div)) % int(mod))
        if isinstance(a, ModularIndexing) and _divides(a.args[2], div):
            x, d1, m1 = a.args
            inner = m1 / div  # ((x // d1) % m1) // div == (x // (d1*div)) % inner
            if _divides(inner, mod):
                return ModularIndexing(x, d1 * div, mod)
            if _divides(mod, inner):
                return ModularIndexing(x, d1 * div, inner)
        if isinstance(a, FloorDiv):
            return ModularIndexing(a.args[0], a.args[1] * div, mod)
        if a.is_Add:  # drop terms that are whole multiples of div*mod
            keep = [t for t in a.args if not _divides(t, div * mod)]
            if len(keep) < len(a.args):
                return ModularIndexing(sympy.Add(*keep), div, mod)
        return None


def _divides(term: Expr, b: Expr) -> bool:
    """b divides term for every value of the symbols (b a positive integer or size product)."""
    if b.is_Integer:
        coeff, _ = term.as_coeff_Mul()
        return bool(coeff.is_Integer and int(coeff) % int(b) == 0)
    num, den = sympy.fraction(sympy.cancel(term / b))
    if den != 1 or not num.is_polynomial():
        return False
    return all(c.is_Integer for c in sympy.Poly(num, *sorted(num.free_symbols, key=str)).coeffs()) \
        if num.free_symbols else bool(num.is_Integer)


def contiguous_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(sizes):
        out.append(acc)
        acc *= _at_least_one(s)
    return tuple(reversed(out))


def _at_least_one(size: Any) -> Any:
    """max(size, 1), as torch strides past an empty dim; a symbolic size whose value may be 0
    (`s0 - 2`, a slice's) counts as itself: asking would need a guard, and where it is 0 the
    tensor is empty, so no stride of it addresses anything."""
    if isinstance(size, sympy.Basic) and not size.is_Integer:
        return size
    return max(int(size), 1)


def linear_index(index: Sequence[Expr], strides: Sequence[int], offset: int = 0) -> Expr:
    return _linear_index(tuple(index), tuple(strides), offset)


@functools.lru_cache(maxsize=1 << 15)  # pure, and asked again in every layer (simplify_index says why)
def _linear_index(index: tuple[Expr, ...], strides: tuple[int, ...], offset: int) -> Expr:
    return sympy.Add(sympy.sympify(offset), *[i * s for i, s in zip(index, strides) if s != 0])


def unflatten(flat: Expr, sizes: Sequence[int]) -> list[Expr]:
    """Per-dimension indices of `flat`, a row-major position in a tensor of `sizes`."""
    return [ModularIndexing(flat, st, sz) if sz != 1 else sympy.Integer(0)
            for sz, st in zip(sizes, contiguous_strides(sizes))]


def flatten(index: Sequence[Expr], sizes: Sequence[int]) -> Expr:
    return linear_index(index, contiguous_strides(sizes))


def numel(sizes: Sequence[int]) -> int:
    return math.prod(sizes)


def simplify_index(expr: Expr, bounds: dict[sympy.Symbol, int]) -> Expr:
    """`expr` with chained ModularIndexing terms merged and range-redundant wraps removed.

    `bounds[s]` is an exclusive upper bound of symbol s (only in-range values matter: others
    are masked off).

    Note: a pure function of its arguments (symbols carry their assumptions in their identity),
    so its results are kept: index symbols are named by position (xindex, v0, …), and the blocks
    of a deep network ask the same questions again in every layer (most of a 48-layer GPT-2's
    simplification time went to repeats).
    """
    return _simplify_index(expr, tuple(bounds.items()))


@functools.lru_cache(maxsize=1 << 15)
def _simplify_index(expr: Expr, bounds_items: tuple[tuple[sympy.Symbol, int], ...]) -> Expr:
    bounds = dict(bounds_items)
    expr = sympy.expand(expr)
    for _ in range(8):
        new = _merge_chains(expr)
        new = new.replace(lambda e: isinstance(e, (ModularIndexing, FloorDiv)),
                          lambda e: _drop_wrap(e, bounds))
        new = sympy.expand(new)
        if new == expr:
            break
        expr = new
    return expr


def _split_small(a: Expr, div: Expr, bounds: dict[sympy.Symbol, int]) -> tuple[Expr, int] | None:
    """(W, g) with a == g*W + R, g dividing div and 0 <= R < g: then a // div == W // (div/g)."""
    if not a.is_Add or not div.is_Integer:
        return None
    for term in a.args:
        g = term.as_coeff_Mul()[0]
        if not g.is_Integer or g <= 1 or int(div) % int(g):
            continue
        whole = [t for t in a.args if _divides(t, g)]
        rest = sympy.Add(*[t for t in a.args if not _divides(t, g)])
        hi = upper_bound(rest, bounds)
        if hi is not None and provably_le(hi, g):
            return sympy.Add(*whole) / g, int(g)
    return None


def _drop_wrap(e: Expr, bounds: dict[sympy.Symbol, int]) -> Expr:
    split = _split_small(e.args[0], e.args[1], bounds)
    if split is not None:
        whole, g = split
        if isinstance(e, ModularIndexing):
            return ModularIndexing(sympy.expand(whole), e.args[1] / g, e.args[2])
        return FloorDiv(sympy.expand(whole), e.args[1] / g)
    if isinstance(e, ModularIndexing):
        a, div, mod = e.args
        hi = upper_bound(a, bounds)
        if hi is not None and provably_le(hi, div * mod):
            return FloorDiv(a, div)
        return e
    a, b = e.args
    hi = upper_bound(a, bounds)
    if hi is not None and provably_le(hi, b):
        return sympy.Integer(0)
    return e


def provably_le(a: Expr | int, b: Expr | int) -> bool:
    """a <= b for every value of the size symbols (positive integers); False when unsure."""
    d = sympy.expand(sympy.Integer(b) if isinstance(b, int) else b) - \
        sympy.expand(sympy.Integer(a) if isinstance(a, int) else a)
    if d.is_Integer:
        return int(d) >= 0
    return bool(d.is_nonnegative)


def upper_bound(e: Expr, bounds: dict[sympy.Symbol, Expr | int]) -> Expr | int | None:
    """An exclusive upper bound of non-negative `e`, or None when unknown.

    `bounds` holds index symbols' (exclusive) bounds, ints or size expressions; a size symbol
    (a positive integer constant of the kernel, not in `bounds`) bounds itself: s0 < s0 + 1.
    """
    if e.is_Integer:
        return int(e) + 1
    if isinstance(e, sympy.Symbol):
        b = bounds.get(e)
        if b is None:
            return e + 1 if e.is_positive else None
        return int(b) if isinstance(b, int) or b.is_Integer else b
    if isinstance(e, ModularIndexing):
        return int(e.args[2]) if e.args[2].is_Integer else e.args[2]
    if isinstance(e, FloorDiv):
        hi = upper_bound(e.args[0], bounds)
        if hi is None or not e.args[1].is_Integer:
            return None
        return (hi - 1) // int(e.args[1]) + 1 if isinstance(hi, int) else FloorDiv(hi - 1, e.args[1]) + 1
    if e.is_Mul:
        coeff, rest = e.as_coeff_Mul()
        if not coeff.is_Integer or coeff < 0:
            return None
        factors = rest.args if rest.is_Mul else (rest,)
        his = [upper_bound(f, bounds) for f in factors]
        if any(h is None for h in his):
            return None
        hi = math.prod(h - 1 for h in his) * int(coeff) + 1
        return int(hi) if isinstance(hi, int) or hi.is_Integer else sympy.expand(hi)
    if e.is_Add:
        his = [upper_bound(t, bounds) for t in e.args]
        if any(h is None for h in his):
            return None
        hi = sum(h - 1 for h in his) + 1
        return int(hi) if isinstance(hi, int) or hi.is_Integer else sympy.expand(hi)
    return None


def _merge_chains(expr: Expr) -> Expr:
    """k*MI(a, d, m1) + k*m1*MI(a, d*m1, m2)  →  k*MI(a, d, m1*m2); repeatedly, in every Add."""
    if not expr.args:
        return expr
    expr = expr.func(*[_merge_chains(a) for a in expr.args])
    if not expr.is_Add:
        return expr
    terms = list(expr.args)
    changed = True
    while changed:
        changed = False
        for i, t1 in enumerate(terms):
            k1, m_1 = t1.as_coeff_Mul()
            if not isinstance(m_1, ModularIndexing):
                continue
            a, d1, n1 = m_1.args
            for j, t2 in enumerate(terms):
                if i == j:
                    continue
                k2, m_2 = t2.as_coeff_Mul()
                if (isinstance(m_2, ModularIndexing) and m_2.args[0] == a and m_2.args[1] == d1 * n1
                        and k2 == k1 * n1):
                    merged = k1 * ModularIndexing(a, d1, n1 * m_2.args[2])
                    terms = [t for n, t in enumerate(terms) if n not in (i, j)] + [merged]
                    changed = True
                    break
                if isinstance(m_2, FloorDiv) and m_2.args[0] == a and m_2.args[1] == d1 * n1 and k2 == k1 * n1:
                    merged = k1 * FloorDiv(a, d1)
                    terms = [t for n, t in enumerate(terms) if n not in (i, j)] + [merged]
                    changed = True
                    break
            if changed:
                break
    return sympy.Add(*terms)


def render_index(expr: Expr) -> str:
    """Triton/Python text of an index expression (integer arithmetic only)."""
    if expr.is_Integer:
        return str(int(expr))
    if isinstance(expr, sympy.Symbol):
        return expr.name
    if isinstance(expr, FloorDiv):
        return f"({_operand(expr.args[0])} // {_operand(expr.args[1])})"
    if isinstance(expr, ModularIndexing):
        a, div, mod = expr.args
        inner = _operand(a) if div == 1 else f"({_operand(a)} // {_operand(div)})"
        return f"({inner} % {_operand(mod)})"
    if expr.is_Add:
        parts = sorted((render_index(t) for t in expr.args), key=lambda s: (s[0] == "-", len(s), s))
        return " + ".join(parts).replace("+ -", "- ")
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        if coeff == -1:
            return f"-{render_index(rest)}"
        return "*".join(_operand(a) for a in expr.args)
    if expr.is_Pow and expr.args[1].is_Integer and 1 <= int(expr.args[1]) <= 8:
        return "*".join([_operand(expr.args[0])] * int(expr.args[1]))
    raise ValueError(f"cannot render index {expr}")


def _operand(expr: Expr) -> str:
    """`expr` rendered to sit next to *, // or %: sums and products get parentheses, since
    `a + b // c` means `a + (b // c)` in Python and Triton."""
    text = render_index(expr)
    return f"({text})" if expr.is_Add or expr.is_Mul or expr.is_Pow else text

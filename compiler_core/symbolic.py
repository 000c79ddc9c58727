"""Symbolic sizes: torch's SymInts ↔ fxcc's SymPy (size symbols s0, s1, …) and hints.

Note: fxcc names a graph's size symbols itself (`s0`, `s1`, … in order of first appearance in
the placeholders), so the same graph from any process gets the same names and the same key,
whatever names Dynamo's ShapeEnv chose. The SymPy functions torch's ShapeEnv uses (its FloorDiv,
ModularIndexing, PythonMod, Min/Max) are mapped onto fxcc's own (compiler_core.sizevars); an
expression using anything else is UnsupportedOp (the graph then runs eagerly, and says so).
Symbols are positive integers: Dynamo specializes sizes 0 and 1, so a symbol is never either.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import sympy

from fxcc.compiler_core.errors import InvalidGraph, UnsupportedOp
from fxcc.compiler_core.sizevars import FloorDiv, ModularIndexing
from fxcc.compiler_core.symexpr import MAX_EXPONENT

SizeExpr = int | sympy.Expr


def size_symbol(name: str) -> sympy.Symbol:
    """The SymPy symbol of one of a graph's sizes (the same assumptions everywhere)."""
    return sympy.Symbol(name, integer=True, positive=True)


# Maps torch ShapeEnv symbols (by name) to fxcc's, for the graph being compiled.
_RENAME: ContextVar[Mapping[str, sympy.Symbol] | None] = ContextVar("fxcc_sym_rename", default=None)
# Values of fxcc's symbols in the example that triggered the compile: heuristics only, never code.
_HINTS: ContextVar[Mapping[sympy.Symbol, int] | None] = ContextVar("fxcc_sym_hints", default=None)


@contextlib.contextmanager
def symbol_scope(rename: Mapping[str, sympy.Symbol], hints: Mapping[sympy.Symbol, int]) -> Iterator[None]:
    """Within: SymInts convert with `rename`, and `hint` evaluates with `hints`."""
    t1, t2 = _RENAME.set(dict(rename)), _HINTS.set(dict(hints))
    try:
        yield
    finally:
        _RENAME.reset(t1)
        _HINTS.reset(t2)


def from_torch(expr: Any, rename: Mapping[str, sympy.Symbol] | None = None) -> sympy.Expr:
    """A ShapeEnv expression in fxcc's SymPy (fxcc's symbol names and functions)."""
    rename = (_RENAME.get() or {}) if rename is None else rename
    import torch.utils._sympy.functions as tf

    def conv(e: Any) -> sympy.Expr:
        if isinstance(e, sympy.Integer):
            return sympy.Integer(int(e))
        if isinstance(e, sympy.Symbol):
            if e.name not in rename:
                raise UnsupportedOp(f"size symbol {e.name} is not one of the graph's inputs")
            return rename[e.name]
        if isinstance(e, sympy.Add):
            return sympy.Add(*[conv(a) for a in e.args])
        if isinstance(e, sympy.Mul):
            return sympy.Mul(*[conv(a) for a in e.args])
        if isinstance(e, (sympy.Pow, tf.PowByNatural)) and e.args[1].is_Integer and e.args[1] >= 0:
            return conv(e.args[0]) ** int(e.args[1])
        if isinstance(e, tf.FloorDiv):
            return FloorDiv(conv(e.args[0]), conv(e.args[1]))
        if isinstance(e, tf.CeilDiv):
            a, b = conv(e.args[0]), conv(e.args[1])
            return FloorDiv(a + b - 1, b)
        if isinstance(e, tf.ModularIndexing):
            return ModularIndexing(*[conv(a) for a in e.args])
        if isinstance(e, (tf.PythonMod, tf.Mod, sympy.Mod)):
            return sympy.Mod(conv(e.args[0]), conv(e.args[1]))
        if isinstance(e, (tf.Max, sympy.Max)):
            return sympy.Max(*[conv(a) for a in e.args])
        if isinstance(e, (tf.Min, sympy.Min)):
            return sympy.Min(*[conv(a) for a in e.args])
        if isinstance(e, sympy.core.relational.Relational) and type(e) in _RELATIONS:
            return type(e)(conv(e.lhs), conv(e.rhs))
        raise UnsupportedOp(f"size expression {e} ({type(e).__name__}) cannot travel")
    return conv(sympy.Integer(expr) if isinstance(expr, int) else expr)


_RELATIONS = (sympy.Eq, sympy.Ne, sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge)


def to_torch(expr: sympy.Expr, symbols: Mapping[sympy.Symbol, Any]) -> Any:
    """`expr` evaluated with torch values (ints or SymInts) for fxcc's symbols."""
    import torch

    def ev(e: sympy.Expr) -> Any:
        if e.is_Integer:
            return int(e)
        if isinstance(e, sympy.Symbol):
            return symbols[e]
        if e.is_Add:
            out = ev(e.args[0])
            for a in e.args[1:]:
                out = out + ev(a)
            return out
        if e.is_Mul:
            out = ev(e.args[0])
            for a in e.args[1:]:
                out = out * ev(a)
            return out
        if e.is_Pow:
            # Note: one multiplication per unit of the exponent, so the exponent must be bounded
            # (parse has refused larger ones in text from a client; this holds for any caller).
            exponent = int(e.args[1])
            if not 0 <= exponent <= MAX_EXPONENT:
                raise InvalidGraph(f"size expression {e}: exponent {exponent} outside [0, {MAX_EXPONENT}]")
            out = 1
            for _ in range(exponent):
                out = out * ev(e.args[0])
            return out
        if isinstance(e, FloorDiv):
            return ev(e.args[0]) // ev(e.args[1])
        if isinstance(e, ModularIndexing):
            return (ev(e.args[0]) // ev(e.args[1])) % ev(e.args[2])
        if isinstance(e, sympy.Mod):
            return ev(e.args[0]) % ev(e.args[1])
        if isinstance(e, (sympy.Max, sympy.Min)):
            pick = torch.sym_max if isinstance(e, sympy.Max) else torch.sym_min
            return functools.reduce(pick, [ev(a) for a in e.args])
        raise UnsupportedOp(f"size expression {e} cannot be rebuilt")
    return ev(expr)


def sym_value(v: Any) -> SizeExpr:
    """An int, or a SymInt's expression in fxcc's SymPy (an int when it is constant)."""
    import torch

    if isinstance(v, torch.SymInt):
        e = from_torch(v.node.expr)
        return int(e) if e.is_Integer else e
    return int(v)


def sizes_of(t: Any) -> tuple[SizeExpr, ...]:
    return tuple(sym_value(s) for s in t.shape)


def strides_of(t: Any) -> tuple[SizeExpr, ...]:
    return tuple(sym_value(s) for s in t.stride())


def offset_of(t: Any) -> SizeExpr:
    return sym_value(t.storage_offset())


def size_symbols_of(expr: sympy.Basic) -> set[sympy.Symbol]:
    """The graph's size symbols in `expr` (not index variables, not indirect-load symbols)."""
    return {s for s in expr.free_symbols if _SIZE_NAME.fullmatch(s.name) and s.is_positive}


_SIZE_NAME = re.compile(r"s[0-9]+")


def is_symbolic(*exprs: Any) -> bool:
    return any(isinstance(e, sympy.Basic) and not e.is_Integer for e in exprs)


def hint(expr: SizeExpr) -> int:
    """`expr`'s value in the example that triggered the compile (for heuristics only)."""
    if isinstance(expr, int):
        return expr
    if expr.is_Integer:
        return int(expr)
    value = expr.xreplace({k: sympy.Integer(v) for k, v in (_HINTS.get() or {}).items()})
    if not isinstance(value, sympy.Basic) or not value.is_Integer:
        raise UnsupportedOp(f"no hint for size {expr}")
    return int(value)


def hints_of(exprs: Sequence[SizeExpr]) -> tuple[int, ...]:
    return tuple(hint(e) for e in exprs)


def dense_strides_like(sizes: Sequence[int], strides: Sequence[int]) -> tuple[int, ...] | None:
    """`strides` if they describe a dense, non-overlapping layout of `sizes`, else None.

    Symbolic strides are ordered by their value in the example; the check itself is exact."""
    try:
        dims = sorted(((st, sz) for sz, st in zip(sizes, strides) if sz != 1),
                      key=lambda d: (hint(d[0]), hint(d[1])))
    except Exception:  # noqa: BLE001 - no hint: not provably dense
        return None
    acc = 1
    for st, sz in dims:
        if st != acc:
            return None
        acc *= sz
    return tuple(strides)

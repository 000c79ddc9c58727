"""Guards: relations over size symbols that must hold for a compiled artifact to be reused, as symexpr text.

The worker writes each guard with `symexpr.dump`; the client reads them with `parse_guard` and
checks them against the sizes of the call (`check_guards`, or `compile_guards` on the hot path).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from fxcc.compiler_core.symexpr import Env, Rel, SymExpr, SymExprError, parse


def parse_guard(text: str) -> Rel:
    """The guard in `text`; SymExprError unless it parses and is a relation (==, !=, <, <=, >, >=)."""
    node = parse(text)
    if not isinstance(node, Rel):
        raise SymExprError(f"a guard must be a relation (==, !=, <, <=, >, >=) at position 0: {node}")
    return node


def check_guards(guards: Sequence[SymExpr], env: Env) -> str | None:
    """None when every guard holds under `env`, else the canonical text of the first that fails.

    Note: a guard that cannot be evaluated (unknown symbol, division by zero) raises SymExprError
    rather than counting as failed: it means the artifact and the call disagree on the symbols,
    which is a bug to report, not a cache miss.
    """
    for guard in guards:
        if not isinstance(guard, Rel):
            raise SymExprError(f"a guard must be a relation: {guard}")
        if not guard.evaluate(env):
            return str(guard)
    return None


def compile_guards(texts: Sequence[str]) -> Callable[[Env], str | None]:
    """`check_guards` of the parsed `texts` as one function env -> str | None, for the hot path."""
    guards = [parse_guard(t) for t in texts]
    checks = tuple((g.closure(), str(g)) for g in guards)

    def check(env: Env) -> str | None:
        for holds, text in checks:
            if not holds(env):
                return text
        return None

    return check


def guard_hash(texts: Sequence[str]) -> str:
    """First 16 hex digits of the sha256 of the sorted canonical guard texts joined by newlines.

    Note: each text is parsed and printed back, which validates it and makes the hash blind to
    spacing and redundant parentheses; texts written by `symexpr.dump` come back unchanged. The
    order of `texts` does not matter; duplicates do.
    """
    canonical = sorted(str(parse_guard(t)) for t in texts)
    return hashlib.sha256("\n".join(canonical).encode()).hexdigest()[:16]

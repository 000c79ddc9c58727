"""guards: parsing only relations, checking them against sizes, and a hash blind to order and spacing."""

import hashlib

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from fxcc.compiler_core.guards import check_guards, compile_guards, guard_hash, parse_guard
from fxcc.compiler_core.sizevars import FloorDiv
from fxcc.compiler_core.symexpr import SymExprError, dump, parse

S0, S1 = (sympy.Symbol(n, integer=True, positive=True) for n in ("s0", "s1"))
GUARDS = [
    dump(sympy.Eq(2 * FloorDiv(S0, 2), S0)),  # s0 is even
    dump(sympy.Le(S0 * S1, 4096)),
    dump(sympy.Ne(S1, 1)),
]


def test_guard_texts_are_canonical():
    assert GUARDS == ["2*floordiv(s0, 2) == s0", "s0*s1 <= 4096", "s1 != 1"]


@pytest.mark.parametrize("env, failing", [
    ({"s0": 8, "s1": 4}, None),
    ({"s0": 7, "s1": 4}, "2*floordiv(s0, 2) == s0"),
    ({"s0": 8, "s1": 1024}, "s0*s1 <= 4096"),
    ({"s0": 8, "s1": 1}, "s1 != 1"),
    ({"s0": 7, "s1": 1}, "2*floordiv(s0, 2) == s0"),  # the first failing one, in the given order
])
def test_check_guards_names_the_first_failing_guard(env, failing):
    guards = [parse_guard(t) for t in GUARDS]
    assert check_guards(guards, env) == failing
    assert compile_guards(GUARDS)(env) == failing


def test_check_guards_of_none_holds():
    assert check_guards([], {}) is None
    assert compile_guards([])({}) is None


def test_failing_guard_is_reported_in_canonical_text():
    assert check_guards([parse_guard("  s0*( s1 )<=4")], {"s0": 3, "s1": 2}) == "s0*s1 <= 4"


@pytest.mark.parametrize("text", ["s0", "s0 + 1", "min(s0, s1)", "pow(s0, 2)"])
def test_parse_guard_rejects_non_relations(text):
    with pytest.raises(SymExprError, match="must be a relation"):
        parse_guard(text)
    with pytest.raises(SymExprError, match="must be a relation"):
        compile_guards(["s0 > 1", text])


def test_check_guards_rejects_non_relations():
    with pytest.raises(SymExprError, match="must be a relation"):
        check_guards([parse("s0 > 1"), parse("s0")], {"s0": 2})


@pytest.mark.parametrize("text", ["s0 >", "s0 = 1", "__import__('os') == 1", "s0 < s1 < 2"])
def test_parse_guard_rejects_malformed_text(text):
    with pytest.raises(SymExprError):
        parse_guard(text)


@pytest.mark.parametrize("text, env, message", [
    ("s2 == 1", {"s0": 1}, "unknown symbol 's2'"),
    ("floordiv(s0, s1 - 1) == 0", {"s0": 1, "s1": 1}, "division by zero"),
])
def test_unevaluable_guard_raises_rather_than_fails(text, env, message):
    with pytest.raises(SymExprError, match=message):
        check_guards([parse_guard(text)], env)
    with pytest.raises(SymExprError, match=message):
        compile_guards([text])(env)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=2, max_size=2), st.permutations(GUARDS))
def test_compiled_guards_agree_with_check_guards(sizes, order):
    env = {"s0": sizes[0], "s1": sizes[1]}
    assert compile_guards(order)(env) == check_guards([parse_guard(t) for t in order], env)


def test_guard_hash_is_sha256_of_sorted_texts():
    expected = hashlib.sha256("\n".join(sorted(GUARDS)).encode()).hexdigest()[:16]
    assert guard_hash(GUARDS) == expected
    assert len(expected) == 16


def test_guard_hash_ignores_order_and_spacing_but_not_content():
    base = guard_hash(GUARDS)
    assert guard_hash(list(reversed(GUARDS))) == base
    assert guard_hash(["2 * floordiv( s0,2 ) == s0", "(s0*s1) <= 4096", "s1!=1"]) == base
    assert guard_hash(GUARDS[:2]) != base
    assert guard_hash(GUARDS + GUARDS[:1]) != base
    assert guard_hash([*GUARDS[:2], "s1 != 2"]) != base
    assert guard_hash([]) == hashlib.sha256(b"").hexdigest()[:16]


def test_guard_hash_rejects_invalid_guards():
    with pytest.raises(SymExprError, match="must be a relation"):
        guard_hash(["s0 + 1"])

"""Symbolic sizes as text: dump SymPy size expressions and guards, parse and evaluate them without SymPy.

Plans carry buffer sizes, strides, kernel size arguments, launch grids and guards as expressions
over size symbols. The worker writes them with `dump`; the client reads them with `parse` and
evaluates them with `SymExpr.evaluate` or, on its hot path, with `compile_exprs`.

Grammar (whitespace between tokens is free):

    rel   := expr [('<=' | '<' | '==' | '!=' | '>=' | '>') expr]
    expr  := term (('+' | '-') term)*
    term  := unary ('*' unary)*
    unary := '-' unary | atom
    atom  := INT | SYMBOL | FUNC '(' expr (',' expr)* ')' | '(' expr ')'
    FUNC  := floordiv(a, b) | mod(a, b) | modidx(a, div, mod) | min(a, b, ...) | max(a, b, ...)
           | pow(a, INT)
    SYMBOL := [a-z][a-z0-9_]{0,31}, not a FUNC name;   INT := [0-9]+ with value < 2**63

Meaning on integers, the same as the SymPy classes `to_sympy` builds:
    floordiv(a, b)      floor(a / b) (FloorDiv on integers); b == 0 is an error
    mod(a, b)           a - b*floor(a / b), the sign of b (sympy.Mod, Python %); b == 0 is an error
    modidx(a, div, mod) (a // div) % mod (ModularIndexing); a < 0, div <= 0 or mod <= 0 are errors
    pow(a, n)           a**n, n a literal in [0, MAX_EXPONENT]

Bounds, checked by `parse` (so by everything that reads text: the service's request models, the
worker, the client's runtime):
    MAX_CHARS characters, MAX_TOKENS tokens, MAX_DEPTH nested parentheses, calls and minus signs;
    a pow exponent at most MAX_EXPONENT; a degree at most MAX_DEGREE, where the degree bounds how
    many 63-bit factors a value can multiply together (a symbol or a literal >= 2 counts 1, a
    product adds its factors' degrees, pow(a, n) is n times a's, a sum or a function takes the
    largest of its arguments'); and every subexpression without symbols evaluates to less than
    MAX_MAGNITUDE in magnitude.

Note: nothing received is ever eval'd, exec'd, sympified or unpickled. Text is read by a
tokenizer built from ASCII-only regular expressions and a recursive-descent parser whose input
is bounded as above, so neither the parser nor the tree walks can exhaust the stack, and the
degree bound keeps every number SymPy folds while building `to_sympy`'s expression below
MAX_DEGREE * 63 bits (`pow(3, 100000000)` or `pow(pow(pow(3, 64), 64), 64)` would otherwise be
computed in full, holding the GIL). Evaluation is exact Python-int arithmetic with every
intermediate value bounded by MAX_MAGNITUDE (2**63, what an int64 size can hold), checked before
a power is computed, so `pow(x, 60)` at x = 2**40 fails fast instead of computing.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import sympy

from fxcc.compiler_core.sizevars import FloorDiv, ModularIndexing

MAX_CHARS = 4096
MAX_TOKENS = 1024
MAX_DEPTH = 64
MAX_LITERAL = 1 << 63  # exclusive
MAX_MAGNITUDE = 1 << 63  # exclusive, for every value evaluation produces or reads
MAX_EXPONENT = 64
MAX_DEGREE = 64

Env = Mapping[str, int]
Value = int | bool
Evaluator = Callable[[Env], Value]

# FUNC name -> (fewest, most) arguments; None: no upper bound.
FUNCS: dict[str, tuple[int, int | None]] = {
    "floordiv": (2, 2), "mod": (2, 2), "modidx": (3, 3), "min": (2, None), "max": (2, None), "pow": (2, 2),
}
RELATIONS: dict[str, Callable[[int, int], bool]] = {
    "<=": operator.le, "<": operator.lt, "==": operator.eq, "!=": operator.ne, ">=": operator.ge, ">": operator.gt,
}
_SYMPY_RELATIONS: dict[str, type] = {
    "<=": sympy.Le, "<": sympy.Lt, "==": sympy.Eq, "!=": sympy.Ne, ">=": sympy.Ge, ">": sympy.Gt,
}
_RELATION_OPS: dict[type, str] = {cls: op for op, cls in _SYMPY_RELATIONS.items()}

_SYMBOL_RE = re.compile(r"[a-z][a-z0-9_]{0,31}", re.ASCII)
_TOKEN_RE = re.compile(r"(?P<ws>[ \t\r\n]+)|(?P<int>[0-9]+)|(?P<name>[a-z][a-z0-9_]*)"
                       r"|(?P<op><=|>=|==|!=|[-+*(),<>])", re.ASCII)


class SymExprError(ValueError):
    """Text or an expression outside the format, or an evaluation outside its domain.

    Messages end in "at position N" (a 0-based character offset into the text) wherever the
    problem has one, followed for evaluation errors by the text of the failing subexpression.
    """


# ---------------------------------------------------------------- the tree


@dataclass(frozen=True)
class SymExpr:
    """A parsed expression: an immutable tree. `pos` is its offset in the text it came from (-1: none).

    Note: `pos` takes no part in equality, so trees parsed from differently spaced texts are equal.
    """

    def evaluate(self, env: Env) -> Value:
        """The exact value under `env` (symbol name -> int): int for arithmetic, bool for a relation.

        Note: this runs the same closures as `compile_exprs` (built once per tree), so both apply
        the same checks and raise the same errors.
        """
        return self._evaluator(env)

    @cached_property
    def symbols(self) -> frozenset[str]:
        return frozenset().union(*(c.symbols for c in self.children()))

    def children(self) -> tuple[SymExpr, ...]:
        return ()

    def to_sympy(self) -> sympy.Basic:
        raise NotImplementedError

    def closure(self) -> Evaluator:
        """A function env -> value made of nested closures, one per node."""
        raise NotImplementedError

    @cached_property
    def _evaluator(self) -> Evaluator:
        return self.closure()

    def _fail(self, problem: str) -> SymExprError:
        where = f" at position {self.pos}" if self.pos >= 0 else ""
        text = str(self)
        return SymExprError(f"{problem}{where}: {text if len(text) <= 80 else text[:77] + '...'}")


@dataclass(frozen=True)
class Int(SymExpr):
    value: int
    pos: int = field(default=-1, compare=False, repr=False)

    def __str__(self) -> str:
        return str(self.value)

    def to_sympy(self) -> sympy.Basic:
        return sympy.Integer(self.value)

    def closure(self) -> Evaluator:
        value = self.value
        return lambda env: value


@dataclass(frozen=True)
class Sym(SymExpr):
    name: str
    pos: int = field(default=-1, compare=False, repr=False)

    def __str__(self) -> str:
        return self.name

    @cached_property
    def symbols(self) -> frozenset[str]:
        return frozenset((self.name,))

    def to_sympy(self) -> sympy.Basic:
        return sympy.Symbol(self.name, integer=True, positive=True)

    def closure(self) -> Evaluator:
        name = self.name

        def symbol(env: Env) -> int:
            try:
                value = env[name]
            except KeyError:
                raise self._fail(f"unknown symbol {name!r}") from None
            if not isinstance(value, int) or isinstance(value, bool):
                raise self._fail(f"symbol {name!r} is bound to a {type(value).__name__}, not an int")
            return _bounded(value, self)

        return symbol


@dataclass(frozen=True)
class Neg(SymExpr):
    operand: SymExpr
    pos: int = field(default=-1, compare=False, repr=False)

    def __str__(self) -> str:
        return "-" + _wrap(self.operand, (Add, Mul))

    def children(self) -> tuple[SymExpr, ...]:
        return (self.operand,)

    def to_sympy(self) -> sympy.Basic:
        return -self.operand.to_sympy()

    def closure(self) -> Evaluator:
        operand = self.operand.closure()
        return lambda env: -operand(env)


@dataclass(frozen=True)
class Add(SymExpr):
    """A sum; a subtracted term is a `Neg` here (`a - b` is Add((a, Neg(b))))."""

    terms: tuple[SymExpr, ...]
    pos: int = field(default=-1, compare=False, repr=False)

    def __str__(self) -> str:
        parts = [_wrap(self.terms[0], (Add,))]
        for term in self.terms[1:]:
            if isinstance(term, Neg):
                parts.append(" - " + _wrap(term.operand, (Add,)))
            else:
                parts.append(" + " + _wrap(term, (Add,)))
        return "".join(parts)

    def children(self) -> tuple[SymExpr, ...]:
        return self.terms

    def to_sympy(self) -> sympy.Basic:
        return sympy.Add(*[t.to_sympy() for t in self.terms])

    def closure(self) -> Evaluator:
        terms = tuple(t.closure() for t in self.terms)

        def add(env: Env) -> int:
            return _bounded(sum(t(env) for t in terms), self)  # each term is bounded, so the sum is small

        return add


@dataclass(frozen=True)
class Mul(SymExpr):
    factors: tuple[SymExpr, ...]
    pos: int = field(default=-1, compare=False, repr=False)

    def __str__(self) -> str:
        return "*".join(_wrap(f, (Add, Mul)) for f in self.factors)

    def children(self) -> tuple[SymExpr, ...]:
        return self.factors

    def to_sympy(self) -> sympy.Basic:
        """Note: a minus sign on a factor becomes a factor -1, so `-(x + 1)*y` is -1*(x + 1)*y as
        SymPy builds it, not y*(-x - 1) (SymPy distributes -1 over a sum when it is the only factor)."""
        args = []
        for f in self.factors:
            while isinstance(f, Neg):
                args.append(sympy.Integer(-1))
                f = f.operand
            args.append(f.to_sympy())
        return sympy.Mul(*args)

    def closure(self) -> Evaluator:
        factors = tuple(f.closure() for f in self.factors)

        def mul(env: Env) -> int:
            product = 1
            for f in factors:
                product = _bounded(product * f(env), self)
            return product

        return mul


@dataclass(frozen=True)
class Call(SymExpr):
    """floordiv, mod, modidx, min, max or pow; pow's second argument is always an `Int`."""

    func: str
    args: tuple[SymExpr, ...]
    pos: int = field(default=-1, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.func}({', '.join(str(a) for a in self.args)})"

    def children(self) -> tuple[SymExpr, ...]:
        return self.args

    def to_sympy(self) -> sympy.Basic:
        args = [a.to_sympy() for a in self.args]
        try:
            return _SYMPY_FUNCS[self.func](*args)
        except ZeroDivisionError:  # a divisor SymPy folds to 0 (`modidx(x, 0, 2)`)
            raise self._fail("division by zero") from None

    def closure(self) -> Evaluator:
        args = tuple(a.closure() for a in self.args)
        if self.func in ("min", "max"):
            pick = min if self.func == "min" else max
            return lambda env: pick(a(env) for a in args)
        if self.func == "pow":
            base, exponent = args[0], self.args[1].value
            return lambda env: _pow(base(env), exponent, self)
        op = _INT_FUNCS[self.func]
        if len(args) == 2:
            a, b = args
            return lambda env: op(self, a(env), b(env))
        a, b, c = args
        return lambda env: op(self, a(env), b(env), c(env))


@dataclass(frozen=True)
class Rel(SymExpr):
    op: str
    lhs: SymExpr
    rhs: SymExpr
    pos: int = field(default=-1, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.lhs} {self.op} {self.rhs}"

    def children(self) -> tuple[SymExpr, ...]:
        return (self.lhs, self.rhs)

    def to_sympy(self) -> sympy.Basic:
        return _SYMPY_RELATIONS[self.op](self.lhs.to_sympy(), self.rhs.to_sympy())

    def closure(self) -> Evaluator:
        compare, lhs, rhs = RELATIONS[self.op], self.lhs.closure(), self.rhs.closure()
        return lambda env: compare(lhs(env), rhs(env))


def _wrap(node: SymExpr, kinds: tuple[type, ...]) -> str:
    """`node`'s text, in parentheses when it is one of `kinds` (so the text parses back to this tree)."""
    return f"({node})" if isinstance(node, kinds) else str(node)


# ---------------------------------------------------------------- integer semantics


def _bounded(value: int, node: SymExpr) -> int:
    if -MAX_MAGNITUDE < value < MAX_MAGNITUDE:
        return value
    raise node._fail("value out of range (|v| >= 2**63)")


def _floordiv(node: SymExpr, a: int, b: int) -> int:
    if b == 0:
        raise node._fail("division by zero")
    return a // b


def _mod(node: SymExpr, a: int, b: int) -> int:
    if b == 0:
        raise node._fail("modulo by zero")
    return a % b


def _modidx(node: SymExpr, a: int, div: int, mod: int) -> int:
    """Note: ModularIndexing is defined for a >= 0 and positive div and mod only (its rewrites assume
    so), so anything else is an error rather than a guess at what a negative index would mean."""
    if div == 0 or mod == 0:
        raise node._fail("division by zero")
    if a < 0 or div < 0 or mod < 0:
        raise node._fail(f"modidx needs a >= 0, div > 0, mod > 0 (got {a}, {div}, {mod})")
    return (a // div) % mod


def _pow(base: int, exponent: int, node: SymExpr) -> int:
    if base in (0, 1, -1):  # the value only depends on whether the exponent is 0, odd or even
        return base ** (exponent if exponent < 2 else 2 - exponent % 2)
    if exponent * (abs(base).bit_length() - 1) >= 63:  # |base|**exponent >= 2**63, not computed
        raise node._fail("value out of range (|v| >= 2**63)")
    return _bounded(base**exponent, node)


_INT_FUNCS = {"floordiv": _floordiv, "mod": _mod, "modidx": _modidx}
_SYMPY_FUNCS: dict[str, Callable[..., sympy.Basic]] = {
    "floordiv": FloorDiv, "mod": sympy.Mod, "modidx": ModularIndexing,
    "min": sympy.Min, "max": sympy.Max, "pow": sympy.Pow,
}


# ---------------------------------------------------------------- text -> tree


@dataclass(frozen=True)
class _Token:
    kind: str  # "int", "name", "op" or "end"
    text: str
    pos: int


def _tokenize(text: str) -> list[_Token]:
    """The tokens of `text`, ending with an "end" token; enforces MAX_CHARS and MAX_TOKENS."""
    if not isinstance(text, str):
        raise SymExprError(f"expected str, got {type(text).__name__} at position 0")
    if len(text) > MAX_CHARS:
        raise SymExprError(f"text longer than {MAX_CHARS} characters ({len(text)}) at position {MAX_CHARS}")
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise SymExprError(f"unexpected character {text[pos]!r} at position {pos}")
        if m.lastgroup != "ws":
            if len(tokens) == MAX_TOKENS:
                raise SymExprError(f"more than {MAX_TOKENS} tokens at position {pos}")
            tokens.append(_Token(m.lastgroup, m.group(), pos))
        pos = m.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


def parse(text: str) -> SymExpr:
    """The tree of `text` (see the module's grammar and bounds); SymExprError names the problem
    and position."""
    node = _Parser(_tokenize(text)).parse()
    degree = _degree(node)
    if degree > MAX_DEGREE:
        raise node._fail(f"degree {degree} over the limit of {MAX_DEGREE}")
    return node


def _degree(node: SymExpr) -> int:
    """The module's degree of `node`, evaluating each largest subexpression without symbols once.

    Note: a constant subexpression is evaluated here (bounded, so fast), and its errors (out of
    range, division by zero) are the text's: SymPy would fold it while building the expression."""
    if not node.symbols:
        value = node.evaluate({})
        return int(abs(value) >= 2)
    if isinstance(node, Sym):
        return 1
    if isinstance(node, Mul):  # its constant factors are one number to SymPy
        constants = [f for f in node.factors if not f.symbols]
        coefficient = Mul(tuple(constants), pos=constants[0].pos).evaluate({}) if constants else 1
        return int(abs(coefficient) >= 2) + sum(_degree(f) for f in node.factors if f.symbols)
    if isinstance(node, Call) and node.func == "pow":
        return node.args[1].value * _degree(node.args[0])
    return max(_degree(c) for c in node.children())


class _Parser:
    """Recursive descent over the grammar; `depth` counts open parentheses, calls and unary minuses."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.i = 0
        self.depth = 0

    def parse(self) -> SymExpr:
        if self.peek().kind == "end":
            raise SymExprError("empty expression at position 0")
        node = self.rel()
        self.expect("end")
        return node

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def at(self, *texts: str) -> bool:
        token = self.peek()
        return token.kind == "op" and token.text in texts

    def expect(self, kind: str, text: str | None = None) -> _Token:
        token = self.peek()
        if token.kind != kind or (text is not None and token.text != text):
            wanted = repr(text) if text else {"end": "end of text"}.get(kind, kind)
            raise SymExprError(f"expected {wanted}, found {_describe(token)} at position {token.pos}")
        return self.take()

    def enter(self, token: _Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SymExprError(f"nesting deeper than {MAX_DEPTH} at position {token.pos}")

    def rel(self) -> SymExpr:
        lhs = self.expr()
        if self.at(*RELATIONS):
            op = self.take()
            return Rel(op.text, lhs, self.expr(), pos=lhs.pos)
        return lhs

    def expr(self) -> SymExpr:
        first = self.term()
        terms = [first]
        while self.at("+", "-"):
            sign = self.take()
            term = self.term()
            terms.append(Neg(term, pos=sign.pos) if sign.text == "-" else term)
        return first if len(terms) == 1 else Add(tuple(terms), pos=first.pos)

    def term(self) -> SymExpr:
        first = self.unary()
        factors = [first]
        while self.at("*"):
            self.take()
            factors.append(self.unary())
        return first if len(factors) == 1 else Mul(tuple(factors), pos=first.pos)

    def unary(self) -> SymExpr:
        if self.at("-"):
            sign = self.take()
            self.enter(sign)
            node = Neg(self.unary(), pos=sign.pos)
            self.depth -= 1
            return node
        return self.atom()

    def atom(self) -> SymExpr:
        token = self.take()
        if token.kind == "int":
            return _literal(token)
        if token.kind == "name":
            return self.call(token) if token.text in FUNCS else _symbol(token, self.peek())
        if token.kind == "op" and token.text == "(":
            self.enter(token)
            node = self.expr()
            self.expect("op", ")")
            self.depth -= 1
            return node
        raise SymExprError(f"expected a number, symbol, function or '(', found {_describe(token)} "
                           f"at position {token.pos}")

    def call(self, name: _Token) -> SymExpr:
        self.expect("op", "(")
        self.enter(name)
        args = [self.expr()]
        while self.at(","):
            self.take()
            args.append(_exponent(self.expect("int")) if name.text == "pow" else self.expr())
        close = self.expect("op", ")")
        self.depth -= 1
        fewest, most = FUNCS[name.text]
        if len(args) < fewest or (most is not None and len(args) > most):
            count = str(fewest) if fewest == most else f"at least {fewest}"
            raise SymExprError(f"{name.text} takes {count} arguments, got {len(args)} at position {close.pos}")
        return Call(name.text, tuple(args), pos=name.pos)


def _literal(token: _Token) -> Int:
    if len(token.text.lstrip("0")) > 19 or int(token.text) >= MAX_LITERAL:
        raise SymExprError(f"integer literal >= 2**63 at position {token.pos}")
    return Int(int(token.text), pos=token.pos)


def _exponent(token: _Token) -> Int:
    exponent = _literal(token)
    if exponent.value > MAX_EXPONENT:
        raise SymExprError(f"pow exponent {exponent.value} over the limit of {MAX_EXPONENT} at position {token.pos}")
    return exponent


def _symbol(token: _Token, following: _Token) -> Sym:
    if following.kind == "op" and following.text == "(":
        raise SymExprError(f"unknown function {token.text!r} at position {token.pos}")
    if len(token.text) > 32:
        raise SymExprError(f"symbol name longer than 32 characters at position {token.pos}")
    return Sym(token.text, pos=token.pos)


def _describe(token: _Token) -> str:
    return "end of text" if token.kind == "end" else repr(token.text)


def compile_exprs(texts: Sequence[str]) -> Callable[[Env], tuple[Value, ...]]:
    """One function env -> the values of all `texts`, for the client's hot path (nested closures,
    no generated source); the same checks and errors as `SymExpr.evaluate`."""
    evaluators = tuple(parse(t).closure() for t in texts)

    def evaluate_all(env: Env) -> tuple[Value, ...]:
        return tuple(e(env) for e in evaluators)

    return evaluate_all


# ---------------------------------------------------------------- SymPy -> text


def dump(expr: sympy.Basic | int) -> str:
    """The canonical text of `expr`: deterministic, and `parse` reads it back to an equal expression.

    Note: the order of commutative arguments (sums, products, min, max) is by their text, not by
    SymPy's internal order, so the text depends only on the expression. The text is checked
    against the parser's limits here, so the worker never ships text the client would refuse.
    """
    text = str(from_sympy(expr))
    parse(text)
    return text


def from_sympy(expr: sympy.Basic | int) -> SymExpr:
    """The canonical tree of a SymPy expression or relation built from the supported classes."""
    if isinstance(expr, int) and not isinstance(expr, bool):
        expr = sympy.Integer(expr)
    if type(expr) in _RELATION_OPS:
        return Rel(_RELATION_OPS[type(expr)], _from_sympy(expr.lhs), _from_sympy(expr.rhs))
    return _from_sympy(expr)


def _from_sympy(expr: sympy.Basic) -> SymExpr:
    if isinstance(expr, sympy.Integer):
        value = int(expr)
        if abs(value) >= MAX_LITERAL:
            raise SymExprError(f"integer {value} out of range (|v| >= 2**63)")
        return Int(value) if value >= 0 else Neg(Int(-value))
    if type(expr) is sympy.Symbol:
        if not _SYMBOL_RE.fullmatch(expr.name) or expr.name in FUNCS:
            raise SymExprError(f"symbol name {expr.name!r} is not [a-z][a-z0-9_]{{0,31}} or is a function name")
        return Sym(expr.name)
    if isinstance(expr, sympy.Add):
        return _sum(expr)
    if isinstance(expr, sympy.Mul):
        return _product(expr)
    if isinstance(expr, sympy.Pow):
        if not (isinstance(expr.exp, sympy.Integer) and expr.exp >= 0):
            raise SymExprError(f"exponent must be a non-negative integer: {expr}")
        return Call("pow", (_from_sympy(expr.base), _from_sympy(expr.exp)))
    funcs = {FloorDiv: "floordiv", ModularIndexing: "modidx", sympy.Mod: "mod"}
    if type(expr) in funcs:
        return Call(funcs[type(expr)], tuple(_from_sympy(a) for a in expr.args))
    if type(expr) in (sympy.Min, sympy.Max):
        return Call(expr.func.__name__.lower(), _sorted(_from_sympy(a) for a in expr.args))
    raise SymExprError(f"unsupported in a size expression: {type(expr).__name__} ({expr})")


def _sum(expr: sympy.Add) -> SymExpr:
    """Positive terms first, then subtracted ones; numbers last in each group; otherwise by text."""
    terms = []
    for term in expr.args:
        negative = bool(term.as_coeff_Mul()[0] < 0)
        magnitude = _from_sympy(-term if negative else term)
        terms.append(((negative, bool(term.is_Number), str(magnitude)), term, magnitude))
    terms.sort(key=lambda t: t[0])
    (negative, _, _), first, magnitude = terms[0]
    out = [_from_sympy(first) if negative else magnitude]
    out += [Neg(m) if key[0] else m for key, _, m in terms[1:]]
    return Add(tuple(out))


def _product(expr: sympy.Mul) -> SymExpr:
    """The coefficient first, then the other factors by text; a minus sign goes on the first factor."""
    coeff, rest = expr.as_coeff_mul()
    if not isinstance(coeff, sympy.Integer):
        raise SymExprError(f"non-integer coefficient {coeff} in {expr}")
    factors = list(_sorted(_from_sympy(f) for f in rest))
    if abs(coeff) != 1:
        factors.insert(0, _from_sympy(abs(coeff)))
    if coeff < 0:
        factors[0] = Neg(factors[0])
    return factors[0] if len(factors) == 1 else Mul(tuple(factors))


def _sorted(nodes) -> tuple[SymExpr, ...]:
    return tuple(sorted(nodes, key=str))

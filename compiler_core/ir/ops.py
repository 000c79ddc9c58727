"""The op vocabulary of loop bodies, the handler protocol, and `ops`: calls routed to the current handler.

Note: the current handler lives in a ContextVar, not in process-global state, so a worker can
compile many graphs at once (threads or asyncio tasks each see their own handler).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import sympy
import torch

# Groups of the vocabulary; handlers and passes test membership instead of repeating lists.
UNARY_FLOAT = frozenset({
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "erf", "erfc",
    "sigmoid", "reciprocal", "floor", "ceil", "trunc", "round",
    "normal_cdf",  # Phi(x) = (1 + erf(x / sqrt 2)) / 2, fp32 only (exact GELU's gate)
})
UNARY_ANY = frozenset({"abs", "neg", "bitwise_not", "sign"})
UNARY_TO_BOOL = frozenset({"logical_not", "isnan", "isinf", "isfinite", "signbit"})
BINARY_ARITH = frozenset({
    "add", "sub", "mul", "truediv", "maximum", "minimum", "pow", "fmod", "atan2",
    "bitwise_and", "bitwise_or", "bitwise_xor",
})
BINARY_TO_BOOL = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"})
REDUCTIONS = frozenset({"sum", "prod", "max", "min"})
# One Welford accumulation's outputs (lowering.reduction.welford): nodes of these types with one body
# (the same inner_fn) are accumulated once in a kernel; each stores its part.
WELFORD = ("welford_mean", "welford_m2", "welford_weight")

UNARY = UNARY_FLOAT | UNARY_ANY | UNARY_TO_BOOL
BINARY = BINARY_ARITH | BINARY_TO_BOOL

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype math runs in for values stored as `dtype` (fp32 for fp16/bf16)."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def result_dtype(op: str, *dtypes: torch.dtype) -> torch.dtype:
    """Dtype inference: the dtype of `op` applied to operands of `dtypes` (already promoted)."""
    if op in UNARY_TO_BOOL or op in BINARY_TO_BOOL:
        return torch.bool
    return dtypes[0]


class OpsHandler:
    """The protocol: every loop body speaks only these methods.

    Implementations: Triton text emission (codegen), read collection and op counting (analysis).
    Values are whatever the handler likes; loop bodies pass them through untouched.
    """

    def load(self, name: str, index: sympy.Expr) -> Any:
        raise NotImplementedError

    def constant(self, value: bool | float, dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def to_dtype(self, x: Any, dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def unary(self, op: str, x: Any) -> Any:
        raise NotImplementedError

    def binary(self, op: str, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def indirect_indexing(self, x: Any, size: int) -> sympy.Symbol:
        """A symbol standing for integer value `x` used as an index into a dim of `size`.

        Negative values wrap (x + size), as torch's indexing does; loads whose index holds the
        symbol are masked to in-range values (an out-of-range index reads `0`, never memory
        outside the buffer).
        """
        raise NotImplementedError

    def masked(self, mask: Any, body: Callable[[], Any], other: bool | float) -> Any:
        """`body()` where `mask` holds, else `other`; loads inside `body` are masked by `mask`,
        so their addresses may be out of range where it does not hold."""
        raise NotImplementedError


_handler: ContextVar[OpsHandler | None] = ContextVar("fxcc_ops_handler", default=None)


@contextlib.contextmanager
def use_handler(handler: OpsHandler) -> Iterator[OpsHandler]:
    """Route `ops.*` calls in this context to `handler`."""
    token = _handler.set(handler)
    try:
        yield handler
    finally:
        _handler.reset(token)


def current_handler() -> OpsHandler:
    h = _handler.get()
    if h is None:
        raise RuntimeError("ops.* called outside use_handler(...)")
    return h


class _Ops:
    """`ops.sin(x)`, `ops.add(a, b)`, `ops.load(...)`: forwards to the current handler."""

    def __getattr__(self, name: str) -> Any:
        if name in UNARY:
            return lambda x: current_handler().unary(name, x)
        if name in BINARY:
            return lambda a, b: current_handler().binary(name, a, b)
        if name == "unary_op":
            return lambda op, x: current_handler().unary(op, x)
        if name == "binary_op":
            return lambda op, a, b: current_handler().binary(op, a, b)
        if name in ("load", "constant", "index_expr", "to_dtype", "where", "indirect_indexing", "masked"):
            return getattr(current_handler(), name)
        raise AttributeError(f"ops.{name} is not in the op vocabulary")


ops = _Ops()


class CountingHandler(OpsHandler):
    """Counts ops and records loads (buffer name, index) of a loop body."""

    def __init__(self) -> None:
        self.ops = 0
        self.indirect = 0
        self.loads: list[tuple[str, sympy.Expr]] = []

    def load(self, name: str, index: sympy.Expr) -> Any:
        self.loads.append((name, index))
        return None

    def constant(self, value: bool | float, dtype: torch.dtype) -> Any:
        return None

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> Any:
        return None

    def to_dtype(self, x: Any, dtype: torch.dtype) -> Any:
        return None

    def unary(self, op: str, x: Any) -> Any:
        self.ops += 1

    def binary(self, op: str, a: Any, b: Any) -> Any:
        self.ops += 1

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        self.ops += 1

    def indirect_indexing(self, x: Any, size: int) -> sympy.Symbol:
        # Note: a fresh symbol per use: an indirect read never equals a direct one, so the
        # scheduler never takes it from a producer's registers.
        self.ops += 1
        self.indirect += 1
        return sympy.Symbol(f"indirect{self.indirect}", integer=True, nonnegative=True)

    def masked(self, mask: Any, body: Callable[[], Any], other: bool | float) -> Any:
        self.ops += 1
        return body()

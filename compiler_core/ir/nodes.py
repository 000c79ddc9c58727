"""Loop IR: buffers with layouts, Pointwise/Reduction bodies, and the tensor values lowerings pass around.

Note: a value is either a `StridedView` of a buffer (views are index remappings, never copies)
or a `Lazy` computation (a loader not yet written anywhere). Loaders always return values in
`compute_dtype(dtype)` (fp32 for fp16/bf16); the cast to the stored dtype happens on store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import sympy
import torch

from fxcc.compiler_core.ir.ops import CountingHandler, ops, use_handler
from fxcc.compiler_core.sizevars import RINDEX, XINDEX, Expr, linear_index, numel, simplify_index, unflatten

Loader = Callable[[Sequence[Expr]], Any]

# Reductions along a strided dim (is_column) loop over r in wide x tiles once rows are longer than
# this; shorter ones fit a persistent tile at least 8 outputs wide (scheduler, codegen.triton).
COLUMN_RNUMEL_MIN = 256


@dataclass(frozen=True)
class Buffer:
    """Storage the plan names: a graph input, an extern call's result, or a kernel's output."""

    name: str
    dtype: torch.dtype
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    kind: Literal["input", "extern", "computed"]
    storage_offset: int = 0  # of the tensor itself (inputs, extern results); views add to it

    def index(self, index: Sequence[Expr]) -> Expr:
        return linear_index(index, self.strides)


@dataclass(frozen=True)
class Pointwise:
    """out[index] = inner_fn(index) over `ranges`."""

    dtype: torch.dtype
    ranges: tuple[int, ...]
    inner_fn: Loader


@dataclass(frozen=True)
class Reduction:
    """out[index] = reduce_{rindex} inner_fn(index, rindex) over `reduction_ranges`.

    `source_sizes`/`reduced_dims` say which dims of the reduced tensor rindex walks, so that
    pointwise work over that tensor can share the kernel even when the dims are not trailing.

    A Welford reduction (`reduction_type` in ops.WELFORD) accumulates (mean, m2, weight) of its
    body's values, each element of weight 1, or of (mean, m2, weight) triples its body returns
    (partials of a split's first stage, combined by Chan's formula); the node stores one part.
    """

    dtype: torch.dtype
    ranges: tuple[int, ...]
    reduction_ranges: tuple[int, ...]
    reduction_type: str
    inner_fn: Callable[[Sequence[Expr], Sequence[Expr]], Any]
    source_sizes: tuple[int, ...] = ()
    reduced_dims: tuple[int, ...] = ()
    # The first stage of a split reduction (lowering.reduction): a kernel of its own, tiled as a
    # column reduction whenever it reads as one, however short its chunks.
    split_stage: bool = False

    @functools.cached_property
    def read_steps(self) -> tuple[tuple[Expr, Expr], ...]:
        """For each load of the body that walks the reduced elements: (elements between the loads
        of adjacent outputs, elements between those of adjacent reduced elements), in the flat
        (output, reduced) coordinates a kernel iterates.

        Note: kept on the node, which is frozen (its body and ranges never change; a changed
        reduction is a new node, dataclasses.replace, with nothing kept): the scheduler asks for
        it again for every kernel a reduction may join.
        """
        counter = CountingHandler()
        with use_handler(counter):
            self.inner_fn(unflatten(XINDEX, self.ranges), unflatten(RINDEX, self.reduction_ranges))
        xnumel, rnumel = numel(self.ranges), numel(self.reduction_ranges)
        steps = (_read_step(index, xnumel, rnumel) for _, index in counter.loads)
        return tuple(step for step in steps if step is not None)


@dataclass(frozen=True)
class ComputedBuffer:
    """A buffer whose contents a kernel computes."""

    buffer: Buffer
    data: Pointwise | Reduction

    @property
    def name(self) -> str:
        return self.buffer.name

    @functools.cached_property
    def loads(self) -> tuple[tuple[str, Expr], ...]:
        """The loads (buffer, index over the node's own index symbols) of the body, in its order.

        Note: kept on the node, which is frozen (see Reduction.read_steps): dead-code elimination,
        fusion, store marking and rendering each ask for it, several times per node.
        """
        return tuple(body_reads(self).loads)

    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)

    def numels(self) -> tuple[int, int]:
        """(output elements, elements reduced per output); 1 for pointwise."""
        if isinstance(self.data, Reduction):
            return numel(self.data.ranges), numel(self.data.reduction_ranges)
        return numel(self.data.ranges), 1


@dataclass(frozen=True)
class StridedView:
    """A view of a buffer: element `index` lives at `offset + sum(index * strides)` of its storage."""

    buffer: Buffer
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @property
    def dtype(self) -> torch.dtype:
        return self.buffer.dtype

    def is_whole_buffer(self) -> bool:
        b = self.buffer
        return self.sizes == b.sizes and self.strides == b.strides and self.offset == 0


@dataclass(frozen=True)
class Lazy:
    """A computation not yet written to memory; `loader(index)` computes one element."""

    dtype: torch.dtype
    sizes: tuple[int, ...]
    loader: Loader


TensorValue = StridedView | Lazy


def make_loader(value: TensorValue) -> Loader:
    if isinstance(value, Lazy):
        return value.loader
    name, strides, offset = value.buffer.name, value.strides, value.offset

    def load(index: Sequence[Expr]) -> Any:
        return ops.load(name, linear_index(index, strides, offset))
    return load


def index_vars(prefix: str, sizes: Sequence[int]) -> list[sympy.Symbol]:
    return [sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True) for i in range(len(sizes))]


def count_ops(value: TensorValue) -> CountingHandler:
    """The ops and loads one element of `value` costs."""
    counter = CountingHandler()
    if isinstance(value, Lazy):
        with use_handler(counter):
            value.loader(index_vars("i", value.sizes))
    else:
        counter.loads.append((value.buffer.name, sympy.Integer(0)))
    return counter


def body_reads(node: ComputedBuffer) -> CountingHandler:
    """The loads (buffer, index over the node's own index symbols) of a computed buffer's body."""
    counter = CountingHandler()
    data = node.data
    with use_handler(counter):
        if isinstance(data, Reduction):
            data.inner_fn(index_vars("i", data.ranges), index_vars("r", data.reduction_ranges))
        else:
            data.inner_fn(index_vars("i", data.ranges))
    return counter


@functools.lru_cache(maxsize=1 << 12)  # pure, and asked again in every layer (sizevars.simplify_index)
def _read_step(index: Expr, xnumel: Expr | int, rnumel: Expr | int) -> tuple[Expr, Expr] | None:
    """Reduction.read_steps' step of one load at `index` over XINDEX and RINDEX, or None for a load
    that does not walk the reduced elements."""
    e = simplify_index(index, {XINDEX: xnumel, RINDEX: rnumel})
    if not e.has(RINDEX):
        return None
    at = e.subs({XINDEX: 0, RINDEX: 0})
    return e.subs({XINDEX: 1, RINDEX: 0}) - at, e.subs({XINDEX: 0, RINDEX: 1}) - at


def is_column(red: Reduction) -> bool:
    """Whether `red` reads memory contiguous across outputs and strided along the reduced
    elements (a column, or outer, reduction: a bias gradient, batch-norm statistics of a
    channels-last tensor): its tiles want to be wide along the outputs."""
    return any(sx == 1 and sr != 1 for sx, sr in red.read_steps)

"""Fusion: groups computed buffers into kernels that share an iteration space, and decides what is stored.

Note: a kernel iterates `xnumel` outputs (rows) × `rnumel` reduced elements. A node joins the open
kernel when its index space maps onto the kernel's, and every value it reads from that kernel
is the one the kernel holds in registers at the same (xindex, rindex): same index after
simplification. Anything else starts a new kernel, so fusion never changes what is computed.

Note: a looped kernel runs one `for roffset` loop over the row; every reduction of the kernel
accumulates in it (sibling reductions: the same (xnumel, rnumel), tile and partition, and none
reads a value the kernel computes, so each body needs only memory), and only per-row work follows
the loop. A persistent kernel holds the whole row, so its reductions may also read each other.

Note: after in-order fusion, a kernel may move into an earlier kernel (horizontal fusion), as
extra outputs: a pointwise one into any kernel of its iteration space, a reduction kernel into
one of the same tile (xnumel, rnumel, column or row, partition), where its reductions become
siblings of the target's. Only when everything it reads already exists at that point (graph
inputs, earlier kernels and extern calls, or values the target kernel holds at the same index)
and no extern call it moves past may write memory. Buffers are written once, so nothing before
its old place can read what it writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fxcc.compiler_core.ir.nodes import COLUMN_RNUMEL_MIN, Buffer, ComputedBuffer, Reduction, is_column
from fxcc.compiler_core.ir.ops import CountingHandler, use_handler
from fxcc.compiler_core.lowering import ExternCall, GraphLowering
from fxcc.compiler_core.sizevars import RINDEX, XINDEX, Expr, numel, simplify_index, unflatten
from fxcc.compiler_core.symbolic import hint, is_symbolic
from fxcc.compiler_core.wire import Arg, ListArg, NodeRef, _refs

# Rows up to this long are reduced in registers in one pass (and may fuse prologue/epilogue).
PERSISTENT_RNUMEL_MAX = 4096


def too_long_for_registers(rnumel: Any) -> bool:
    """A row that needs the looped reduction: longer than a persistent one holds, or symbolic
    (Note: a symbolic row length may take any size, and only the looped form serves them all)."""
    return is_symbolic(rnumel) or rnumel > PERSISTENT_RNUMEL_MAX


@dataclass
class Kernel:
    """One kernel to generate: its nodes in order, iteration space, and which buffers it stores."""

    xnumel: int
    rnumel: int
    nodes: list[ComputedBuffer] = field(default_factory=list)
    stored: set[str] = field(default_factory=set)
    # Stored buffers the kernel writes into a graph input's memory instead (buffer -> input):
    # AOTAutograd's write-backs of mutated inputs (store_into_inputs); the plan allocates none.
    into_inputs: dict[str, str] = field(default_factory=dict)

    column: bool = False  # reduces along a strided dim while outputs are contiguous
    # (sizes, reduced dims) of the tensor the kernel's reductions walk: pointwise nodes of
    # those sizes map kept dims to xindex and reduced dims to rindex.
    partition: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    # Why the kernel ended where it did (the next node's refusal), for the schedule's log.
    closed_by: str | None = field(default=None, compare=False)

    # Note: name -> node of `nodes`, so that asking whether a kernel holds a value costs the same
    # in a kernel of 20000 nodes as in one of 2 (fusing a wide graph stays linear). Nodes join only
    # through `add`.
    _by_name: dict[str, ComputedBuffer] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.nodes}

    @property
    def looped(self) -> bool:
        return too_long_for_registers(self.rnumel) or self.column

    def add(self, node: ComputedBuffer) -> None:
        self.nodes.append(node)
        self._by_name[node.name] = node

    def pop(self) -> ComputedBuffer:
        """The last node, taken out again."""
        node = self.nodes.pop()
        del self._by_name[node.name]
        return node

    def node_named(self, name: str) -> ComputedBuffer | None:
        """The kernel's node that computes buffer `name`, if any."""
        return self._by_name.get(name)

    def names(self) -> set[str]:
        return set(self._by_name)


@dataclass(frozen=True)
class Coords:
    """A node's index (and reduction index) in kernel coordinates; `full` when it spans rindex."""

    index: list[Expr]
    rindex: list[Expr]
    full: bool


def node_coords(node: ComputedBuffer, xnumel: int, rnumel: int,
                partition: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> Coords | None:
    """Where `node` sits in a kernel of `xnumel` × `rnumel`, or None when it does not fit."""
    data = node.data
    if isinstance(data, Reduction):
        if numel(data.ranges) != xnumel or numel(data.reduction_ranges) != rnumel:
            return None
        return Coords(unflatten(XINDEX, data.ranges), unflatten(RINDEX, data.reduction_ranges), True)
    sizes = data.ranges
    n = numel(sizes)
    if rnumel == 1:
        return Coords(_in_storage_order(XINDEX, sizes, node.buffer.strides), [], False) if n == xnumel else None
    if n == xnumel:
        return Coords(unflatten(XINDEX, sizes), [], False)
    if n != xnumel * rnumel:
        return None
    if partition is not None and partition[0] == tuple(sizes):
        kept = [d for d in range(len(sizes)) if d not in partition[1]]
        index: list[Expr] = [*unflatten(XINDEX, [sizes[d] for d in kept]),
                             *unflatten(RINDEX, [sizes[d] for d in partition[1]])]
        order = kept + list(partition[1])
        return Coords([index[order.index(d)] for d in range(len(sizes))], [], True)
    for k in range(len(sizes) + 1):
        if numel(sizes[:k]) == xnumel and numel(sizes[k:]) == rnumel:
            return Coords(unflatten(XINDEX, sizes[:k]) + unflatten(RINDEX, sizes[k:]), [], True)
    return None


def _in_storage_order(flat: Expr, sizes: Sequence[int], strides: Sequence[int]) -> list[Expr]:
    """Per-dim indices for position `flat` of a walk over a buffer in its memory order, so a
    kernel writing a transposed (eager-strided) buffer still reads and writes contiguously."""
    order = sorted(range(len(sizes)), key=lambda d: (-hint(strides[d]), d))  # any order is exact
    walk = unflatten(flat, [sizes[d] for d in order])
    index: list[Expr] = list(walk)
    for k, d in enumerate(order):
        index[d] = walk[k]
    return index


def kernel_index(expr: Expr, kernel: Kernel) -> Expr:
    return simplify_index(expr, {XINDEX: kernel.xnumel, RINDEX: kernel.rnumel})


def run_body(node: ComputedBuffer, coords: Coords) -> Any:
    if isinstance(node.data, Reduction):
        return node.data.inner_fn(coords.index, coords.rindex)
    return node.data.inner_fn(coords.index)


def store_index(node: ComputedBuffer, coords: Coords, kernel: Kernel) -> Expr:
    return kernel_index(node.buffer.index(coords.index), kernel)


def _reads(node: ComputedBuffer, coords: Coords) -> list[tuple[str, Expr]]:
    rec = CountingHandler()
    with use_handler(rec):
        run_body(node, coords)
    return rec.loads


def _fits(kernel: Kernel, node: ComputedBuffer) -> bool:
    """Can `node` join `kernel`, reading every in-kernel value from registers?"""
    return misfit(kernel, node) is None


def misfit(kernel: Kernel, node: ComputedBuffer) -> str | None:
    """Why `node` cannot join `kernel` (None: it can), in words for the schedule's log."""
    if node.is_reduction() and kernel.looped:
        return _sibling_misfit(kernel, node)
    if node.is_reduction() and too_long_for_registers(numel(node.data.reduction_ranges)):
        return "its reduction is too long for registers and the kernel is not a looped one of its tile"
    coords = node_coords(node, kernel.xnumel, kernel.rnumel, kernel.partition)
    if coords is None:
        return _space_misfit(kernel, node)
    if kernel.looped and coords.full:
        return "after a looped reduction only per-row work or sibling reductions can follow"
    for name, index in _reads(node, coords):
        producer = kernel.node_named(name)
        if producer is None:
            continue
        pc = node_coords(producer, kernel.xnumel, kernel.rnumel, kernel.partition)
        if pc is None or kernel_index(index, kernel) != store_index(producer, pc, kernel):
            return f"it reads {name} at another index than the kernel computes it (not in registers)"
        if pc.full and not producer.is_reduction() and not coords.full:
            return f"a row-wide value ({name}) cannot feed a per-row node"
    return None


def _space_misfit(kernel: Kernel, node: ComputedBuffer) -> str:
    return (f"its iteration space {node.numels()} does not map onto the kernel's "
            f"(x={kernel.xnumel}, r={kernel.rnumel})")


def _sibling_misfit(kernel: Kernel, node: ComputedBuffer) -> str | None:
    """Why reduction `node` cannot share looped `kernel`'s r-loop (None: it can)."""
    if node.numels() != (kernel.xnumel, kernel.rnumel):
        return _space_misfit(kernel, node)
    if (wants_column(node), _partition(node)) != (kernel.column, kernel.partition):
        return "it reduces another tile than the kernel's looped reduction (column or partition differ)"
    for name, _ in node.loads:
        if kernel.node_named(name) is not None:
            return f"it reads {name}, which the kernel computes (a looped kernel's reductions read only memory)"
    return None


def loopable(kernel: Kernel) -> bool:
    """Whether `kernel` has a looped form: reductions first in it and reading nothing it computes
    (they share one r-loop), every other node per-row work (see the module's Note)."""
    if kernel.rnumel == 1 or not kernel.nodes or not kernel.nodes[0].is_reduction():
        return False
    own = kernel.names()
    for node in kernel.nodes:
        if node.is_reduction():
            if node.numels() != (kernel.xnumel, kernel.rnumel) or any(n in own for n, _ in node.loads):
                return False
            continue
        coords = node_coords(node, kernel.xnumel, kernel.rnumel, kernel.partition)
        if coords is None or coords.full:
            return False
    return True


def wants_column(node: ComputedBuffer) -> bool:
    """Whether reduction `node` starts a column kernel (looped, in wide x tiles).

    Short strided rows still fit a persistent tile at least 8 outputs wide (see launch_config),
    which can take more work after the reduction; a split's first stage takes none.
    """
    r = node.numels()[1]
    split_stage = isinstance(node.data, Reduction) and node.data.split_stage
    return (hint(r) > COLUMN_RNUMEL_MIN or split_stage) and is_column_reduction(node)


def is_column_reduction(node: ComputedBuffer) -> bool:
    """A reduction whose input is contiguous across outputs and strided along the reduced dim
    (e.g. a bias gradient, sum over rows): it wants wide XBLOCK tiles and a loop over r, since
    one row per program would read memory a column at a time."""
    if not node.is_reduction() or hint(node.numels()[0]) < 8:
        return False
    return is_column(node.data)


def _partition(node: ComputedBuffer) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    data = node.data
    if not isinstance(data, Reduction) or not data.source_sizes:
        return None
    return data.source_sizes, data.reduced_dims


def _retarget(kernel: Kernel, node: ComputedBuffer) -> Kernel | None:
    """A pointwise kernel widened to a reduction's (x, r) space, if all its nodes fit there."""
    if kernel.rnumel != 1 or not node.is_reduction():
        return None
    x, r = node.numels()
    if x * r != kernel.xnumel:
        return None
    wide = Kernel(x, r, list(kernel.nodes), partition=_partition(node))
    coords = [node_coords(n, x, r, wide.partition) for n in wide.nodes]
    if any(c is None or not c.full for c in coords):
        return None
    return wide if _fits(wide, node) else None


def fuse_nodes(program: Sequence[ComputedBuffer | ExternCall]) -> list[Kernel | ExternCall]:
    """Greedy in-order fusion. Extern calls that read nothing of the open kernel (and write
    nothing) move before it."""
    out: list[Kernel | ExternCall] = []
    open_kernel: Kernel | None = None
    for item in program:
        if isinstance(item, ExternCall):
            reads = _refs(item.args + list(item.kwargs.values()))
            # Note: a writing extern call never moves before a kernel, which may read what it writes.
            if open_kernel is not None and (_may_write(item) or any(open_kernel.node_named(r) is not None
                                                                   for r in reads)):
                open_kernel.closed_by = f"extern {item.op} ({item.out}) reads a value of the kernel or writes"
                out.append(open_kernel)
                open_kernel = None
            out.append(item)
            continue
        if open_kernel is not None:
            why = misfit(open_kernel, item)
            if why is None:
                open_kernel.add(item)
                continue
            wide = _retarget(open_kernel, item)
            if wide is not None:
                open_kernel = wide
                open_kernel.add(item)
                continue
            open_kernel.closed_by = f"{item.name} did not fuse: {why}"
            out.append(open_kernel)
        x, r = item.numels()
        open_kernel = Kernel(x, r, [item], column=wants_column(item), partition=_partition(item))
    if open_kernel is not None:
        out.append(open_kernel)
    return out


def hoist_kernels(items: Sequence[Kernel | ExternCall]) -> list[Kernel | ExternCall]:
    """Horizontal fusion: each kernel joins the nearest earlier kernel it fits in, if any (a
    pointwise one any kernel of its space, a reduction kernel one of its tile)."""
    out: list[Kernel | ExternCall] = []
    made_at: dict[str, int] = {}  # buffer → position in `out` of the item that writes it
    for item in items:
        if isinstance(item, Kernel):
            hoisted = _hoist_target(out, made_at, item)
            if hoisted is not None:
                at, merged = hoisted
                out[at] = merged
                made_at.update((n.name, at) for n in item.nodes)
                continue
        if isinstance(item, ExternCall):
            made_at.update((name, len(out)) for name in item.written)
        else:
            made_at.update((n.name, len(out)) for n in item.nodes)
        out.append(item)
    return out


def _hoist_target(out: Sequence[Kernel | ExternCall], made_at: dict[str, int],
                  kernel: Kernel) -> tuple[int, Kernel] | None:
    """(position, that kernel) for the nearest kernel in `out` that can take all of `kernel`, which
    it then holds (extended in place; left as it was where none can)."""
    own = kernel.names()
    reads = {name for node in kernel.nodes for name, _ in node.loads if name not in own}
    # Inputs (absent from made_at) exist from the start; a value written at `earliest` can be read
    # there only from the target's registers, which _fits checks.
    earliest = max((made_at.get(name, -1) for name in reads), default=-1)
    for at in range(len(out) - 1, max(earliest, 0) - 1, -1):
        target = out[at]
        if isinstance(target, ExternCall):
            if _may_write(target):
                return None  # reads moved above it could see memory before it changes
            continue
        if kernel.rnumel != 1 and not _same_tile(target, kernel):
            continue
        # Note: nodes join the target on trial and leave again if one does not fit, rather than
        # joining a copy: copying a wide target for every hoisted kernel is quadratic.
        for joined, node in enumerate(kernel.nodes):
            if not _fits(target, node):
                for _ in range(joined):
                    target.pop()
                break
            target.add(node)
        else:
            return at, target
    return None


def _same_tile(a: Kernel, b: Kernel) -> bool:
    """Whether two kernels walk their rows alike: one may take the other's reductions as siblings."""
    return (a.xnumel, a.rnumel, a.column, a.looped, a.partition) == (b.xnumel, b.rnumel, b.column, b.looped,
                                                                     b.partition)


def _may_write(call: ExternCall) -> bool:
    """Whether an extern call might write into an existing tensor (in-place or out= overloads).

    Note: lower_graph lets through only AOTAutograd's write-backs into graph inputs (copy_, after
    every other read of the input); hoisting must not move a kernel above one, and dead-code
    elimination keeps them.
    """
    parts = call.op.split(".")
    name = parts[1] if len(parts) > 2 else parts[-1]
    return name.endswith("_") or "out" in call.kwargs or (len(parts) > 2 and parts[-1].startswith("out"))


def eliminate_dead(g: GraphLowering) -> list[ComputedBuffer | ExternCall]:
    """The program without computed buffers and extern calls that nothing needs."""
    needed = set(_refs(g.outputs))
    kept: list[ComputedBuffer | ExternCall] = []
    for item in reversed(g.program):
        names = item.written if isinstance(item, ExternCall) else (item.name,)
        if not needed.intersection(names) and not (isinstance(item, ExternCall) and _may_write(item)):
            continue
        kept.append(item)
        if isinstance(item, ExternCall):
            needed.update(_refs(item.args + list(item.kwargs.values())))
        else:
            needed.update(name for name, _ in item.loads)
    return kept[::-1]


def mark_stores(schedule: list[Kernel | ExternCall], outputs: Sequence[Arg]) -> None:
    """A kernel stores a buffer only if an output, an extern call or another kernel reads it."""
    wanted = set(_refs(list(outputs)))
    for item in schedule:
        if isinstance(item, ExternCall):
            wanted.update(_refs(item.args + list(item.kwargs.values())))
        else:
            own = item.names()
            for node in item.nodes:
                wanted.update(name for name, _ in node.loads if name not in own)
    for k in (i for i in schedule if isinstance(i, Kernel)):
        k.stored = {n.name for n in k.nodes if n.name in wanted}


def inplace_reads(kernel: Kernel, buffers: dict[str, Buffer]) -> dict[str, list[str]]:
    """For each buffer `kernel` stores: the buffers it reads whose memory it could write it into.

    Note: writing `out` over `src` is safe when every element of `src` is read only before
    `out`'s value at the same address is stored, by the thread that stores it. So `src` must
    have `out`'s dtype, sizes and strides (no dim of stride 0), and every load of `src` in the
    kernel must be at `out`'s store index in kernel coordinates and happen in `out`'s own body
    or in a kernel node `out` depends on (its loaded value feeds the stored one, so the load
    comes first, whatever the compiler reorders). A transpose, a reduction over `src`, a
    neighbour (pooling), a load by an unrelated node of the kernel: never in place. Whether
    `src` dies here, and whether another name shares its memory, is the plan's question.
    """
    coords = {n.name: node_coords(n, kernel.xnumel, kernel.rnumel, kernel.partition) for n in kernel.nodes}
    if any(c is None for c in coords.values()):
        return {}
    loads = {n.name: [(name, kernel_index(index, kernel)) for name, index in _reads(n, coords[n.name])]
             for n in kernel.nodes}
    own = kernel.names()
    readers: dict[str, list[tuple[str, Expr]]] = {}  # buffer -> (kernel node, index) of each load of it
    for n, named in loads.items():
        for load, index in named:
            readers.setdefault(load, []).append((n, index))
    found: dict[str, list[str]] = {}
    for node in kernel.nodes:
        b = node.buffer
        if node.name not in kernel.stored or any(st == 0 for n, st in zip(b.sizes, b.strides) if n != 1):
            continue
        where = store_index(node, coords[node.name], kernel)
        deps = _in_kernel_deps(node.name, loads, own)
        sources = dict.fromkeys(name for d in deps for name, _ in loads[d] if name not in own)
        fits = []
        for name in sources:
            src = buffers.get(name)
            if src is None or (src.dtype, src.sizes, src.strides) != (b.dtype, b.sizes, b.strides):
                continue
            if all(n in deps and index == where for n, index in readers[name]):
                fits.append(name)
        if fits:
            found[node.name] = fits
    return found


def _in_kernel_deps(name: str, loads: dict[str, list[tuple[str, Expr]]], own: set[str]) -> set[str]:
    """`name` and every node of its kernel whose value it reads, directly or not."""
    deps, todo = {name}, [name]
    while todo:
        for load, _ in loads[todo.pop()]:
            if load in own and load not in deps:
                deps.add(load)
                todo.append(load)
    return deps


# ---------------------------------------------------------------- writing mutated inputs


def store_into_inputs(items: Sequence[Kernel | ExternCall], g: GraphLowering) -> list[Kernel | ExternCall]:
    """The write-backs of mutated inputs (copy_(input, value), run last) stored instead by the kernels
    that compute their values, straight into the input's memory, as Inductor's `..._copy__` kernels
    do: batch norm's running statistics need no buffer of their own and no copy step.

    Note: a graph's values are those before any write-back, so a value goes into input `dst` early
    only where nothing reads `dst` (or an extern result made from it) after its kernel, and that
    kernel reads `dst` only at the addresses it stores, in the value's own body or in kernel nodes
    it depends on (inplace_reads' rule: each element is read before the same thread overwrites it).
    The value's buffer must have the input's dtype, sizes and strides, and be no graph output (the
    caller would get the input itself). Other write-backs stay copies, still after everything else.
    """
    made_by = {name: k for k, item in enumerate(items) if isinstance(item, Kernel)
               for name in item.stored}
    outputs = set(_refs(list(g.outputs)))
    taken: dict[str, str] = {}  # value buffer -> input
    for item in items:
        if not (isinstance(item, ExternCall) and item.out in g.write_backs):
            continue
        for dst, src in _write_pairs(item):
            at = made_by.get(src)
            if at is None or src in outputs or src in taken or dst in taken.values():
                continue
            kernel, buf, into = items[at], g.buffers.get(src), g.buffers.get(dst)
            if (buf is None or into is None or into.kind != "input" or into.storage_offset != 0
                    or (buf.dtype, buf.sizes, buf.strides) != (into.dtype, into.sizes, into.strides)):
                continue
            if _read_after(items, at, dst, _aliases(items, dst, g.write_backs), g.write_backs) or \
                    not _reads_only_where_stored(kernel, src, dst):
                continue
            taken[src] = dst
            kernel.into_inputs[src] = dst
    if not taken:
        return list(items)
    out: list[Kernel | ExternCall] = []
    for item in items:
        if isinstance(item, ExternCall) and item.out in g.write_backs:
            item = _without_pairs(item, taken)
            if item is None:
                continue
        out.append(item)
    return out


def _write_pairs(call: ExternCall) -> list[tuple[str, str]]:
    """(input, value) names of a write-back: copy_(dst, src) or _foreach_copy_(dsts, srcs)."""
    if call.op == "aten.copy_.default":
        dst, src = call.args[:2]
        return [(dst.name, src.name)] if isinstance(dst, NodeRef) and isinstance(src, NodeRef) else []
    if call.op == "aten._foreach_copy_.default":
        dsts, srcs = call.args[:2]
        return [(d.name, s.name) for d, s in zip(dsts.items, srcs.items)
                if isinstance(d, NodeRef) and isinstance(s, NodeRef)]
    return []


def _without_pairs(call: ExternCall, taken: dict[str, str]) -> ExternCall | None:
    """The write-back without the pairs kernels now store (None when none is left)."""
    left = [(d, s) for d, s in _write_pairs(call) if taken.get(s) != d]
    if not left:
        return None
    if call.op == "aten.copy_.default" or len(left) == len(_write_pairs(call)):
        return call
    return replace(call, args=[ListArg(items=[NodeRef(name=d) for d, _ in left]),
                               ListArg(items=[NodeRef(name=s) for _, s in left])])


def _aliases(items: Sequence[Kernel | ExternCall], name: str, write_backs: set[str]) -> set[str]:
    """`name` and every extern result made from it, directly or not (each may share its memory)."""
    names = {name}
    for item in items:
        if isinstance(item, ExternCall) and item.out not in write_backs and \
                names.intersection(_refs(item.args + list(item.kwargs.values()))):
            names.update(item.written)
    return names


def _read_after(items: Sequence[Kernel | ExternCall], at: int, dst: str, names: set[str],
                write_backs: set[str]) -> bool:
    """Whether an item after `at` (write-backs aside) reads input `dst` or any of its aliases
    `names`, or kernel `at` reads an alias of it (an extern's view: at addresses not checked)."""
    for k in range(at, len(items)):
        item = items[k]
        if isinstance(item, ExternCall):
            if item.out not in write_backs and names.intersection(_refs(item.args + list(item.kwargs.values()))):
                return True
            continue
        loads = {name for node in item.nodes for name, _ in node.loads}
        if names.intersection(loads) - ({dst} if k == at else set()):
            return True
    return False


def _reads_only_where_stored(kernel: Kernel, name: str, src: str) -> bool:
    """Whether `kernel` loads `src` only at `name`'s store index, in `name`'s body or in kernel
    nodes `name` depends on (see inplace_reads)."""
    coords = {n.name: node_coords(n, kernel.xnumel, kernel.rnumel, kernel.partition) for n in kernel.nodes}
    if any(c is None for c in coords.values()):
        return False
    loads = {n.name: [(load, kernel_index(index, kernel)) for load, index in _reads(n, coords[n.name])]
             for n in kernel.nodes}
    node = kernel.node_named(name)
    where = store_index(node, coords[name], kernel)
    deps = _in_kernel_deps(name, loads, kernel.names())
    return all(n in deps and index == where for n, named in loads.items() for load, index in named if load == src)


def schedule(g: GraphLowering) -> list[Kernel | ExternCall]:
    """Dead code out, nodes fused into kernels, pointwise kernels hoisted into earlier ones, stores
    decided, write-backs of mutated inputs stored by the kernels that compute them."""
    items = hoist_kernels(fuse_nodes(eliminate_dead(g)))
    mark_stores(items, g.outputs)
    return store_into_inputs(items, g)


"""From a schedule and its rendered kernels to a Plan: allocations, launches, extern calls and frees."""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable, Sequence
from typing import Any

from fxcc.compiler_core.artifact import AllocStep, ExternStep, FreeStep, KernelStep, Plan
from fxcc.compiler_core.codegen.triton import RenderedKernel
from fxcc.compiler_core.ir.nodes import Buffer
from fxcc.compiler_core.lowering import ExternCall, GraphLowering, TemplateKernel, size_arg
from fxcc.compiler_core.scheduler import Kernel, inplace_reads
from fxcc.compiler_core.symbolic import is_symbolic
from fxcc.compiler_core.symexpr import dump
from fxcc.compiler_core.wire import (
    IntArg,
    ListArg,
    NodeRef,
    SymArg,
    TensorSpec,
    _refs,
    dtype_name,
    resolve_target,
    torch_dtype,
)

Step = AllocStep | ExternStep | KernelStep | FreeStep


def build_plan(g: GraphLowering, items: Sequence[Kernel | ExternCall],
               rendered: dict[int, RenderedKernel]) -> Plan:
    """Steps in schedule order; each buffer is freed right after its last reader, kernels write
    in place of inputs that die with them, and (static sizes) buffers take dead buffers' storage."""
    steps: list[Step] = []
    reads: list[list[str]] = []
    inplace: list[dict[str, list[str]]] = []  # per kernel: scheduler.inplace_reads
    # A buffer a kernel stores into a graph input (Kernel.into_inputs) is that input from then on.
    into: dict[str, str] = {}
    for i, item in enumerate(items):
        if isinstance(item, TemplateKernel):
            rk = rendered[i]
            for name in item.written:
                steps.append(AllocStep(out=name, spec=_spec(g.buffers[name])))
                reads.append([])
            args = [*_renamed(item.args, into), *(NodeRef(name=n) for n in item.written)]
            args += [size_arg(x) for x in item.int_args]
            steps.append(KernelStep(kernel=rk.name, args=args, grid=[size_text(x) for x in rk.grid]))
            reads.append(_refs(args))
            inplace.append({})
            continue
        if isinstance(item, ExternCall):
            expect = None if item.expect_strides is None else [size_text(x) for x in item.expect_strides]
            args, kwargs = _renamed(item.args, into), dict(zip(item.kwargs, _renamed(list(item.kwargs.values()), into)))
            steps.append(ExternStep(op=item.op, args=args, kwargs=kwargs, out=item.out,
                                    expect_strides=expect, opaque=item.opaque, triton=item.triton,
                                    control=item.control, flex=item.flex))
            reads.append(_refs(args + list(kwargs.values())))
            continue
        rk = rendered[i]
        into.update(item.into_inputs)
        for node in item.nodes:
            if node.name in item.stored and node.name not in item.into_inputs:
                steps.append(AllocStep(out=node.name, spec=_spec(node.buffer)))
                reads.append([])
        args: list[NodeRef | IntArg | SymArg] = [NodeRef(name=into.get(a, a)) for a in rk.args]
        args.append(size_arg(rk.xnumel))
        if rk.reduction:
            args.append(size_arg(rk.rnumel))
        args += [size_arg(s) for s in rk.size_args]
        steps.append(KernelStep(kernel=rk.name, args=args, grid=[size_text(x) for x in rk.grid]))
        reads.append(_refs(args))
        inplace.append(inplace_reads(item, g.buffers))
    planned = write_in_place(_with_frees(steps, reads, g.outputs), inplace, g.outputs)
    # Note: with symbolic sizes, storage reuse would compare byte counts that differ per call;
    # such plans allocate every buffer but those written in place, which take a buffer of their
    # very layout (frees still return memory to torch's caching allocator).
    final = planned if g.symbols else reuse_buffers(planned, g.outputs)
    return Plan(inputs=list(g.inputs), steps=final, outputs=g.outputs, symbols=g.symbols,
                guards=g.guards, input_strides=g.input_strides)


def _renamed(args: list[Any], names: dict[str, str]) -> list[Any]:
    """`args` with each NodeRef to a key of `names` (lists included) referring to its value instead."""
    if not names:
        return args
    out = []
    for a in args:
        if isinstance(a, NodeRef) and a.name in names:
            a = NodeRef(name=names[a.name])
        elif isinstance(a, ListArg):
            a = ListArg(items=_renamed(a.items, names))
        out.append(a)
    return out


def size_text(x: Any) -> int | str:
    return int(x) if not is_symbolic(x) else dump(x)


def _spec(b: Buffer) -> TensorSpec:
    return TensorSpec(dtype=dtype_name(b.dtype), sizes=[size_text(s) for s in b.sizes],
                      strides=[size_text(s) for s in b.strides])


def _with_frees(steps: list[Step], reads: list[list[str]], outputs: Sequence) -> list[Step]:
    keep = set(_refs(list(outputs)))
    last: dict[str, int] = {}
    for i, names in enumerate(reads):
        for n in names:
            last[n] = i
    dying: dict[int, list[str]] = {}  # step -> the names it reads last
    for n, at in last.items():
        if n not in keep:
            dying.setdefault(at, []).append(n)
    out: list[Step] = []
    for i, step in enumerate(steps):
        out.append(step)
        if i in dying:
            out.append(FreeStep(names=sorted(dying[i])))
    return out


# ---------------------------------------------------------------- writing in place


def write_in_place(steps: Sequence[Step], candidates: Sequence[dict[str, list[str]]],
                   outputs: Sequence) -> list[Step]:
    """Let a kernel write a buffer into the storage of one it reads whose memory dies with it.

    `candidates[k]` is scheduler.inplace_reads of the plan's k-th KernelStep: for each buffer it
    stores, the buffers it reads at exactly the addresses it writes. One of those is taken when
    the kernel is its last reader, it is its storage's only name (no live or later-freed view,
    getitem or tuple shares it), and it is that storage's own tensor: a kernel's buffer or a
    fresh extern result (torch's tensor, Note in _StorageTracker). The output's AllocStep then
    names it in `reuse`, the kernel reads the output's name instead, and no FreeStep drops it.

    Note: this never raises a peak. The storage lives on, at the same size, exactly as long as
    the output would have, and the output's own allocation, live at once with it, is gone:
    Inductor's in-place buffers (bias+GELU over a matmul's result needs no second buffer).
    Graph outputs, and anything an output may point into, keep storage of their own.
    """
    first = _track(steps, outputs)
    storages = _StorageTracker(outputs)
    out: list[Step] = []
    taken: set[str] = set()
    allocs: list[AllocStep] = []  # the AllocSteps of the kernel that comes next
    kernels = iter(candidates)
    for at, step in enumerate(steps):
        if isinstance(step, AllocStep):
            allocs.append(step)
            continue
        if isinstance(step, KernelStep):
            after = steps[at + 1] if at + 1 < len(steps) else None
            dying = set(after.names) if isinstance(after, FreeStep) else set()
            swap = _in_place_sources(next(kernels), allocs, dying, storages, first.pinned)
            allocs = [a.model_copy(update={"reuse": swap[a.out]}) if a.out in swap else a for a in allocs]
            rename = {src: dst for dst, src in swap.items()}
            taken |= set(rename)
            step = step.model_copy(update={"args": [NodeRef(name=rename[a.name])
                                                    if isinstance(a, NodeRef) and a.name in rename else a
                                                    for a in step.args]})
        for alloc in allocs:
            storages.bind_alloc(alloc)
            out.append(alloc)
        allocs = []
        if isinstance(step, ExternStep):
            storages.bind_extern(step)
        elif isinstance(step, FreeStep):
            storages.free(step.names)
        out.append(step)
    out.extend(allocs)
    return _drop_frees(out, taken)


def _in_place_sources(candidates: dict[str, list[str]], allocs: Sequence[AllocStep], dying: set[str],
                      storages: _StorageTracker, pinned: set[str]) -> dict[str, str]:
    """{output: the buffer whose storage it takes} for one kernel (see write_in_place)."""
    swap: dict[str, str] = {}
    for alloc in allocs:
        if alloc.out in pinned or alloc.reuse is not None:
            continue
        for src in candidates.get(alloc.out, ()):
            if src in swap.values() or src not in dying:
                continue
            roots = storages.roots.get(src, frozenset())
            if len(roots) != 1:
                continue
            (storage,) = roots
            if storage in pinned or storages.owners.get(storage) != src or storages.holders[storage] != {src}:
                continue
            swap[alloc.out] = src
            break
    return swap


# ---------------------------------------------------------------- buffer reuse


def reuse_buffers(steps: Sequence[Step], outputs: Sequence) -> list[Step]:
    """Let an AllocStep take the storage of a dead AllocStep buffer of its dtype, big enough,
    where holding that storage until then does not raise the plan's peak of live bytes.

    Note: a storage is dead once every name bound to it (the buffer and every alias an extern
    made of it: view, permute, getitem, ...) has been freed and none of them is a graph output.
    The plan keeps the storage's last owner out of its FreeStep; the AllocStep that names it in
    `reuse` takes the storage and drops that name. An extern that might return an alias counts
    as aliasing all of its inputs, and graph outputs always get storage of their own (the caller
    keeps them; they must not be views). One plan runs on one device, so every AllocStep storage
    is on the same device.

    Note: storage only moves from a dead buffer to a later one here, which saves allocator calls
    but cannot lower torch.cuda.max_memory_allocated: the caching allocator hands a freed block
    to the next allocation anyway. So extern results' storages (torch's) stay out of this pool;
    what lowers the peak is a kernel writing in place of a dying input (write_in_place).
    """
    live = live_bytes(steps, outputs)
    budget = max(live, default=0)
    # externs_before[t]: how many steps before step t may allocate memory torch owns.
    externs_before = list(itertools.accumulate((_allocates(s) for s in steps), initial=0))
    first = _track(steps, outputs)
    dies_at = _death_steps(steps, outputs)
    storages = _StorageTracker(outputs)
    pool: dict[str, int] = {}  # dead storage -> the step that freed it
    taken: set[str] = set()  # owners whose storage a later AllocStep takes: not freed
    out: list[Step] = []
    for at, step in enumerate(steps):
        if isinstance(step, AllocStep) and step.reuse is None and step.out not in first.pinned:
            need, end = spec_nbytes(step.spec), dies_at[step.out]
            for have, s in sorted((storages.capacity[s], s) for s in pool):
                if storages.dtype[s] != step.spec.dtype or have < need:
                    continue
                # Held from its death until here, then `have - need` more than before until `end`.
                # Note: an allocating extern in either span could have had that memory had it
                # been freed, so reuse there would raise the device's peak though not the plan's.
                freed = pool[s]
                if externs_before[at] > externs_before[freed] or \
                        (have > need and externs_before[end] > externs_before[at]):
                    continue
                if max(live[freed:at], default=0) + have > budget or \
                        max(live[at:end], default=0) + have - need > budget:
                    continue
                live[freed:at] = [b + have for b in live[freed:at]]
                live[at:end] = [b + have - need for b in live[at:end]]
                del pool[s]
                taken.add(storages.owners[s])
                step = step.model_copy(update={"reuse": storages.owners[s]})
                break
        if isinstance(step, AllocStep):
            storages.bind_alloc(step)
        elif isinstance(step, ExternStep):
            storages.bind_extern(step)
        elif isinstance(step, FreeStep):
            for s in storages.free(step.names):
                if s in storages.capacity and s not in storages.pinned and s not in first.pinned:
                    pool[s] = at
        out.append(step)
    return _drop_frees(out, taken)


def peak_alloc_bytes(steps: Sequence[Step], outputs: Sequence) -> int:
    """The most bytes of AllocStep storage the plan holds at once (extern results not counted)."""
    return max(live_bytes(steps, outputs), default=0)


def live_bytes(steps: Sequence[Step], outputs: Sequence) -> list[int]:
    """Bytes of AllocStep storage held after each step (static plans).

    A storage counts while any name bound to it (its buffer, an alias of it, a buffer that
    reuses it) is in the plan's environment, as the runtime holds it. Extern results are
    torch's: not counted, nor is a kernel's buffer that took one's storage (written in place).
    """
    storages = _StorageTracker(outputs)
    live, held = 0, []
    for step in steps:
        if isinstance(step, AllocStep):
            if step.reuse is None:
                live += spec_nbytes(step.spec)
            storages.bind_alloc(step)
        elif isinstance(step, ExternStep):
            storages.bind_extern(step)
        elif isinstance(step, FreeStep):
            live -= sum(storages.capacity.get(s, 0) for s in storages.free(step.names))
        held.append(live)
    return held


def _death_steps(steps: Sequence[Step], outputs: Sequence) -> dict[str, int]:
    """For each AllocStep buffer of a plan without reuse: the step that frees its storage (or the end)."""
    storages = _StorageTracker(outputs)
    dies = {s.out: len(steps) for s in steps if isinstance(s, AllocStep)}
    for at, step in enumerate(steps):
        if isinstance(step, AllocStep):
            storages.bind_alloc(step)
        elif isinstance(step, ExternStep):
            storages.bind_extern(step)
        elif isinstance(step, FreeStep):
            for s in storages.free(step.names):
                dies[s] = at
    return dies


def _track(steps: Sequence[Step], outputs: Sequence) -> _StorageTracker:
    """The tracker after binding every name of `steps` (frees ignored)."""
    storages = _StorageTracker(outputs)
    for step in steps:
        if isinstance(step, AllocStep):
            storages.bind_alloc(step)
        elif isinstance(step, ExternStep):
            storages.bind_extern(step)
    return storages


def spec_nbytes(spec: TensorSpec) -> int:
    """Bytes of storage a tensor of `spec` spans (offset 0)."""
    if any(n == 0 for n in spec.sizes):
        return 0
    span = 1 + sum((n - 1) * st for n, st in zip(spec.sizes, spec.strides))
    return span * torch_dtype(spec.dtype).itemsize


class _StorageTracker:
    """Which storages each name of the plan may point into, and which names hold them.

    Note: a storage is named by the buffer that first had it: a kernel's buffer (an AllocStep
    without `reuse`) or a fresh extern result. An extern result is fresh when the op is trusted
    to return new memory (_may_alias) and the plan fixes its layout (`expect_strides`: the
    runtime copies a result laid out otherwise, so its strides are the plan's); a getitem is
    fresh when its tuple came from such an op, and the tuple holds that storage too while it
    lives. Other extern results point into whatever their inputs do. Graph inputs point into
    nothing the plan may take.
    """

    def __init__(self, outputs: Sequence) -> None:
        self.outputs = set(_refs(list(outputs)))
        self.roots: dict[str, frozenset[str]] = {}  # name -> storages (named by their first buffer)
        self.holders: dict[str, set[str]] = {}  # storage -> names bound to it now
        self.owners: dict[str, str] = {}  # storage -> the buffer that has it now, at its data pointer
        self.capacity: dict[str, int] = {}  # storages an AllocStep made (its static byte count)
        self.dtype: dict[str, str] = {}
        self.pinned: set[str] = set()  # storages a graph output may point into
        self.fresh_tuples: set[str] = set()  # extern results (tuples) of ops that return new memory
        self.items: dict[tuple[str, str], str] = {}  # (fresh tuple, index) -> its item's storage

    def bind_alloc(self, step: AllocStep) -> None:
        if step.reuse is not None:
            (storage,) = self.roots[step.reuse]
            self._unbind(step.reuse)
        else:
            storage = step.out
            if not step.spec.symbolic:
                self.capacity[storage] = spec_nbytes(step.spec)
            self.dtype[storage] = step.spec.dtype
        self.owners[storage] = step.out
        self._bind(step.out, frozenset([storage]))

    def bind_extern(self, step: ExternStep) -> None:
        refs = _refs(step.args + list(step.kwargs.values()))
        if step.op == "getitem" and step.expect_strides is not None and refs and refs[0] in self.fresh_tuples:
            item = (refs[0], repr(step.args[1:]))
            if item in self.items:  # the same tensor again: one storage, two names
                self._bind(step.out, frozenset([self.items[item]]))
                return
            self.items[item] = step.out
            self.owners[step.out] = step.out
            self._bind(step.out, frozenset([step.out]))
            self._bind(refs[0], self.roots[refs[0]] | {step.out})
        elif _may_alias(step.op):
            self._bind(step.out, frozenset(s for r in refs for s in self.roots.get(r, ())))
        elif step.expect_strides is not None:
            self.owners[step.out] = step.out
            self._bind(step.out, frozenset([step.out]))
        else:
            self.fresh_tuples.add(step.out)
            self._bind(step.out, frozenset())

    def free(self, names: Iterable[str]) -> list[str]:
        """Unbind `names`; the storages no name is bound to any more."""
        return [s for n in names for s in self._unbind(n)]

    def _bind(self, name: str, roots: frozenset[str]) -> None:
        self.roots[name] = roots
        for s in roots:
            self.holders.setdefault(s, set()).add(name)
        if name in self.outputs:
            self.pinned |= roots

    def _unbind(self, name: str) -> list[str]:
        emptied = []
        for s in self.roots.get(name, ()):
            held = self.holders[s]
            if name in held:
                held.discard(name)
                if not held:
                    emptied.append(s)
        return emptied


def _drop_frees(steps: list[Step], taken: set[str]) -> list[Step]:
    """The steps with `taken` names left out of FreeSteps (their AllocStep successor drops them)."""
    out: list[Step] = []
    for step in steps:
        if isinstance(step, FreeStep) and taken.intersection(step.names):
            names = [n for n in step.names if n not in taken]
            if not names:
                continue
            step = FreeStep(names=names)
        out.append(step)
    return out


def _allocates(step: Step) -> bool:
    """Whether a step may allocate memory outside the plan's AllocSteps (any extern but a view)."""
    return isinstance(step, ExternStep) and not _returns_view(step.op)


@functools.lru_cache(maxsize=1024)
def _returns_view(op: str) -> bool:
    """Whether an extern op only returns views of its inputs (getitem, view, permute, ...)."""
    import torch

    if op == "getitem":
        return True
    try:
        fn: Any = resolve_target(op)
    except Exception:  # noqa: BLE001 - an op we cannot inspect may allocate
        return False
    returns = fn._schema.returns if isinstance(fn, torch._ops.OpOverload) else []
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


# Ops whose result shares its input's storage although their schema does not say so.
_UNANNOTATED_VIEWS = frozenset({"_unsafe_view", "_reshape_alias", "lift_fresh"})


@functools.lru_cache(maxsize=1024)
def _may_alias(op: str) -> bool:
    """Whether an extern op's result may share storage with one of its inputs (when unsure: yes).

    An op is trusted to return fresh tensors only when it is an aten/prims overload whose schema
    marks no return as an alias, that has no CompositeImplicitAutograd kernel (those may return
    an input as is, like type_as), and that is not a known unannotated view.
    """
    import torch

    try:
        fn: Any = resolve_target(op)
    except Exception:  # noqa: BLE001 - an op we cannot inspect may alias
        return True
    if fn is operator.getitem or not isinstance(fn, torch._ops.OpOverload):
        return True
    if fn._schema.name.split("::")[-1] in _UNANNOTATED_VIEWS:
        return True
    if any(r.alias_info is not None for r in fn._schema.returns):
        return True
    return torch._C._dispatch_has_kernel_for_dispatch_key(fn.name(), "CompositeImplicitAutograd")

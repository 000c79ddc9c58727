"""aten FX graph → loop IR: the lowering registry and `lower_graph`, which falls back to extern calls.

The lowerings themselves live in this package's op-family modules, which import this one and
register; the package imports them all, so whoever imports the package has every lowering.

Note: lowerings run with the graph being lowered and the FX node being lowered in ContextVars
(`current_graph()`, `current_node()`), so concurrent compiles never share state.
"""

from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch import fx

from fxcc.compiler_core.errors import LoweringError, UnsupportedOp
from fxcc.compiler_core.ir.nodes import (
    Buffer,
    ComputedBuffer,
    Lazy,
    Pointwise,
    Reduction,
    StridedView,
    TensorValue,
    count_ops,
    make_loader,
)
from fxcc.compiler_core.ir.ops import ops
from fxcc.compiler_core.sizevars import contiguous_strides, numel
from fxcc.compiler_core.symbolic import dense_strides_like, hint, offset_of, sizes_of, strides_of
from fxcc.compiler_core.symexpr import dump
from fxcc.compiler_core.wire import (
    Arg,
    DeviceArg,
    DtypeArg,
    GraphSpec,
    IntArg,
    ListArg,
    NodeRef,
    SymArg,
    dtype_name,
    target_name,
)

log = logging.getLogger("fxcc.lowering")

aten = torch.ops.aten
prims = torch.ops.prims

LOWERINGS: dict[Any, Callable[..., Any]] = {}

# A lazy value read by several consumers is recomputed in each, unless its body is this big or
# reads this many buffers. Note: without the reads bound, a residual stream (x + a + b + ...,
# read by each layer's LayerNorm and by the next add) stayed lazy through a whole network: each
# LayerNorm kernel re-read every earlier layer's output (GPT-2's were 4-5x slower than
# Inductor's on the H200) and all those outputs stayed alive to the end.
REALIZE_OPS_SHARED = 24
REALIZE_READS_SHARED = 4
VIEW_TARGETS = frozenset({
    aten.permute.default, aten.transpose.int, aten.t.default, aten.expand.default, aten.slice.Tensor,
    aten.select.int, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default,
    aten.as_strided.default, prims.collapse_view.default, aten.split_with_sizes.default,
    aten.split.Tensor, aten.unbind.int, aten.diagonal.default, aten.unfold.default,
})


def is_view(node: fx.Node) -> bool:
    """Whether `node` is a view of its first argument (getitem counts only on a split)."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    if node.target is operator.getitem:
        return node.args[0].op == "call_function" and node.args[0].target in VIEW_TARGETS
    return node.target in VIEW_TARGETS
REALIZE_OPS_ALWAYS = 96
# Predicates of nodes whose Lazy value stays unwritten at their own lowering, whatever its cost or
# readers: each reader writes or recomputes what it needs (an attention mask that fxcc's template
# computes from the mask's own inputs, lowering/attention.py). A reader that cannot still realizes it.
KEEP_LAZY: list[Callable[[fx.Node], bool]] = []



def register_lowering(*targets: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `fn` as the lowering of each aten/prims overload in `targets`."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for t in targets:
            LOWERINGS[t] = fn
        return fn
    return wrap


@dataclass(frozen=True)
class ExternCall:
    """An aten op (or getitem) the client runs; `out` names its result."""

    out: str
    op: str
    args: list[Arg]
    kwargs: dict[str, Arg] = field(default_factory=dict)
    # The strides the plan's kernels assume for a fresh (non-view) tensor result: the runtime
    # copies a result laid out otherwise into them (see ExternStep.expect_strides).
    expect_strides: tuple[Any, ...] | None = None
    opaque: Any = None  # wire.OpaqueOp of an op only the client runs (compiler_core.opaque)
    triton: Any = None  # wire.UserKernel: a user's Triton kernel, launched by the client
    control: Any = None  # wire.ControlFlow, then (compiler_core.control_flow) its artifact.ControlPlan
    flex: Any = None  # wire.FlexAttention of a flex_attention node run eagerly (compiler_core.flex)

    @property
    def written(self) -> tuple[str, ...]:
        """The plan names this call defines."""
        return (self.out,)


@dataclass(frozen=True)
class TemplateKernel(ExternCall):
    """A kernel fxcc renders from a template (codegen.attention), not from loop IR.

    Note: to the scheduler it is an extern call (opaque: never fused, reads `args`, writes
    `out`); the plan allocates `out` and launches it as an ordinary KernelStep with `int_args`
    (ints or size expressions) after the buffers `args` and `out`.
    """

    params: Any = None  # ir.templates.AttentionParams (codegen.flex_attention.FlexParams)
    int_args: tuple[Any, ...] = ()
    sizes: dict[str, Any] = field(default_factory=dict)  # q_len, kv_len, batch_heads: for the grid
    # Further buffers the kernel writes (flex_attention's logsumexp, its backward's dk and dv): the
    # plan allocates each and passes it after `out`.
    extra_outs: tuple[str, ...] = ()

    @property
    def written(self) -> tuple[str, ...]:
        return (self.out, *self.extra_outs)


@dataclass(frozen=True)
class ExternTuple:
    """The tuple an extern call returned; items become buffers through getitem calls."""

    name: str
    vals: tuple[Any, ...]


@dataclass
class GraphLowering:
    """The loop IR of one graph: a program of computed buffers and extern calls, in order."""

    spec: GraphSpec
    target: str = "interpret"
    inputs: list[str] = field(default_factory=list)
    program: list[ComputedBuffer | ExternCall] = field(default_factory=list)
    outputs: list[Arg] = field(default_factory=list)
    buffers: dict[str, Buffer] = field(default_factory=dict)
    nodes_lowered: int = 0
    extern_ops: list[str] = field(default_factory=list)
    symbols: list[Any] = field(default_factory=list)  # SymbolBindings of a symbolic graph
    guards: list[str] = field(default_factory=list)  # relations the plan's code assumes
    input_strides: list[Any] = field(default_factory=list)  # per input, for a symbolic plan
    lazy_values: list[Lazy] = field(default_factory=list)
    # Out names of the extern calls that write mutated inputs back (_write_inputs): the scheduler
    # may have the kernels computing their values store them into the inputs instead.
    write_backs: set[str] = field(default_factory=set)
    _realized: set[int] = field(default_factory=set)
    env: dict[fx.Node, Any] = field(default_factory=dict)
    wire: dict[fx.Node, Any] = field(default_factory=dict)
    _replayed: set[str] = field(default_factory=set)
    _taken: set[str] = field(default_factory=set)
    _counter: int = 0

    def new_name(self, stem: str = "buf") -> str:
        while True:
            name = f"{stem}{self._counter}"
            self._counter += 1
            if name not in self._taken:
                self._taken.add(name)
                return name

    def add_buffer(self, buf: Buffer) -> StridedView:
        self.buffers[buf.name] = buf
        return StridedView(buf, buf.sizes, buf.strides, 0)

    def add_computed(self, data: Pointwise | Reduction, strides: tuple[int, ...] | None = None) -> StridedView:
        sizes = data.ranges
        strides = strides or contiguous_strides(sizes)
        if _nbytes(sizes, data.dtype) == 0:
            return self._empty_buffer(sizes, strides, data.dtype)
        buf = Buffer(self.new_name(), data.dtype, sizes, strides, "computed")
        self.program.append(ComputedBuffer(buf, data))
        return self.add_buffer(buf)

    def _empty_buffer(self, sizes: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype) -> StridedView:
        """A zero-element buffer: allocated by the plan, never written (no kernel over no elements).

        Note: this is how lowerings of empty tensors stay native: their values need no code.
        """
        name = self.new_name("empty")
        self.program.append(ExternCall(name, "aten.empty_strided.default", [_ints(sizes), _ints(strides)],
                                       {"dtype": DtypeArg(value=dtype_name(dtype)),
                                        "device": DeviceArg(value=self._device())}))
        return self.add_buffer(Buffer(name, dtype, sizes, strides, "extern"))

    def _device(self) -> str:
        node = _node.get()
        val = node.meta.get("val") if node is not None else None
        if isinstance(val, torch.Tensor):
            return val.device.type
        return next((p.spec.device for p in self.spec.placeholders), "cpu")

    def realize(self, value: TensorValue, strides: tuple[int, ...] | None = None) -> StridedView:
        """`value` written to memory (a no-op for values already there)."""
        if isinstance(value, StridedView):
            return value
        self._realized.add(id(value))
        return self.add_computed(Pointwise(value.dtype, value.sizes, value.loader), strides)

    def extern_ref(self, value: TensorValue, node: fx.Node | None = None) -> NodeRef:
        """A plan name holding `value` in eager's layout, for an extern call or a graph output.

        Note: a view of a graph input is replayed with the graph's own view ops, never with
        as_strided: an input's storage offset at run time need not be the one traced (a saved
        tensor that was a view in eager may be a fresh buffer when fxcc's forward made it).
        """
        like = node.meta.get("val") if node is not None else None
        if _nbytes(value.sizes, value.dtype) == 0 and like is not None:
            return self._empty_ref(like)
        if isinstance(value, StridedView) and not value.is_whole_buffer() and value.buffer.kind == "input":
            replayed = self._replay_views(node)
            if replayed is not None:
                return replayed
            value = Lazy(value.dtype, value.sizes, make_loader(value))
        if isinstance(value, Lazy):
            strides = None
            if like is not None:
                strides = dense_strides_like(sizes_of(like), strides_of(like))
            value = self.realize(value, strides)
        if value.is_whole_buffer() and value.buffer.storage_offset == 0:
            return NodeRef(name=value.buffer.name)
        name = self.new_name("view")
        b = value.buffer
        self.program.append(ExternCall(name, "aten.as_strided.default", [
            NodeRef(name=b.name), _ints(value.sizes), _ints(value.strides),
            size_arg(b.storage_offset + value.offset)]))
        return NodeRef(name=name)

    def _empty_ref(self, like: torch.Tensor) -> NodeRef:
        """A new empty tensor shaped like `like` (no kernel launches over zero elements)."""
        name = self.new_name("empty")
        self.program.append(ExternCall(name, "aten.empty_strided.default", [
            _ints(sizes_of(like)), _ints(strides_of(like))],
            {"dtype": DtypeArg(value=dtype_name(like.dtype)), "device": DeviceArg(value=like.device.type)}))
        return NodeRef(name=name)

    def _replay_views(self, node: fx.Node | None) -> NodeRef | None:
        """The graph's chain of view ops from a whole buffer to `node`, as extern calls (one
        aten.view where they only reshape a contiguous buffer)."""
        chain: list[fx.Node] = []
        while node is not None:
            value = self.env.get(node)
            if isinstance(value, StridedView) and value.is_whole_buffer():
                break
            if not is_view(node):
                return None
            chain.append(node)
            node = node.args[0] if isinstance(node.args[0], fx.Node) else None
        if node is None or not chain:
            return None
        # The chain starts from the base's buffer, which need not carry the base node's name.
        base_wire = self.wire[node].name if node in self.wire else node.name
        base_ref = NodeRef(name=self.env[node].buffer.name)
        if len(chain) > 1 and _one_view(self.env[node], chain):
            wire = self.wire[chain[0]]
            key = f"{wire.name}@{base_ref.name}"
            if key not in self._replayed:
                self._replayed.add(key)
                self.program.append(ExternCall(wire.name, "aten.view.default",
                                               [base_ref, _ints(sizes_of(chain[0].meta["val"]))]))
            return NodeRef(name=wire.name)
        for n in reversed(chain):
            wire = self.wire[n]
            key = f"{wire.name}@{base_ref.name}"
            if key not in self._replayed:
                self._replayed.add(key)
                args = [base_ref if a == NodeRef(name=base_wire) else a for a in wire.args]
                self.program.append(ExternCall(wire.name, wire.target, args, dict(wire.kwargs)))
        return NodeRef(name=self.wire[chain[0]].name)

    def bytes_not_materialized(self, unstored: list[Buffer]) -> int:
        """Bytes of intermediates that no kernel wrote: values inlined into readers, or held in registers."""
        lazy = sum(_nbytes(v.sizes, v.dtype) for v in self.lazy_values if id(v) not in self._realized)
        return lazy + sum(_nbytes(b.sizes, b.dtype) for b in unstored)


# Views that keep their input's elements in order: a chain of them from a contiguous tensor is one
# aten.view of it to the last one's sizes.
RESHAPES = frozenset({
    aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.view.default,
    aten._unsafe_view.default, aten.reshape.default, aten.alias.default, prims.collapse_view.default,
})


def _one_view(base: StridedView, chain: list[fx.Node]) -> bool:
    """Whether the chain of views `chain` (last first) from `base`, a whole buffer, is one aten.view
    of it: every view keeps the elements in order, and the base is contiguous (Note: then
    aten.view gives the chain's sizes and strides, those of size-1 dims aside, at any storage
    offset: an input's at run time need not be the one traced, see extern_ref)."""
    if not all(n.target in RESHAPES for n in chain):
        return False
    val = chain[0].meta.get("val")
    if not isinstance(val, torch.Tensor):
        return False
    contiguous = contiguous_strides(base.sizes)
    return all(n == 1 or a == b for n, a, b in zip(base.sizes, base.strides, contiguous))


def _nbytes(sizes: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n * dtype.itemsize


def _ints(xs: tuple[Any, ...]) -> ListArg:
    return ListArg(items=[size_arg(x) for x in xs])


def size_arg(x: Any) -> IntArg | SymArg:
    """An int, or a size expression over the graph's symbols, as a plan argument."""
    if isinstance(x, int) or (isinstance(x, sympy.Basic) and x.is_Integer):
        return IntArg(value=int(x))
    return SymArg(expr=dump(x))


_graph: ContextVar[GraphLowering | None] = ContextVar("fxcc_graph", default=None)
_node: ContextVar[fx.Node | None] = ContextVar("fxcc_node", default=None)


def current_graph() -> GraphLowering:
    g = _graph.get()
    if g is None:
        raise RuntimeError("no graph is being lowered")
    return g


def current_node() -> fx.Node:
    n = _node.get()
    if n is None:
        raise RuntimeError("no node is being lowered")
    return n


def node_val() -> Any:
    """The FakeTensor (or tuple) the node being lowered produces: the ground truth of its meta."""
    return current_node().meta["val"]


def lowering_context(graph: GraphLowering, node: fx.Node | None) -> contextlib.AbstractContextManager[None]:
    """The context a lowering runs in (`current_graph()`, `current_node()`), for lowerings that lower
    a graph of their own (flex_attention's mods)."""
    return _lowering(graph, node)


@contextlib.contextmanager
def _lowering(graph: GraphLowering, node: fx.Node | None) -> Iterator[None]:
    t1, t2 = _graph.set(graph), _node.set(node)
    try:
        yield
    finally:
        _node.reset(t2)
        _graph.reset(t1)


def lower_graph(gm: fx.GraphModule, spec: GraphSpec, target: str = "interpret") -> GraphLowering:
    """Lower every node of `gm` (rebuilt from `spec`) to loop IR, or to an extern call."""
    g = GraphLowering(spec, target)
    writes = input_writes(gm)
    g._taken = {p.name for p in spec.placeholders} | {n.name for n in spec.nodes}
    env = g.env
    placeholders = iter(spec.placeholders)
    wire_nodes = iter(spec.nodes)
    with _lowering(g, None):
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                p = next(placeholders)
                val = node.meta["val"]
                g.inputs.append(p.name)
                if p.spec is None:  # a SymInt input: its uses carry its expression
                    env[node] = val
                    continue
                env[node] = g.add_buffer(Buffer(p.name, val.dtype, sizes_of(val), strides_of(val),
                                                "input", p.spec.storage_offset))
                env[node] = _on_users_device(g, node, env[node])
            elif node.op == "call_function":
                wire = g.wire[node] = next(wire_nodes)
                if node not in writes:
                    env[node] = _lower_node(g, node, wire, env)
            elif node.op == "output":
                shared = _shared_view_roots(node.args[0])
                g.outputs = [_output(g, a, w, env, shared) for a, w in zip(node.args[0], spec.outputs)]
        _write_inputs(g, writes, env)
    return g


def _on_users_device(g: GraphLowering, node: fx.Node, view: StridedView) -> StridedView:
    """A CPU scalar input (0-d or one element) whose values end up read on a GPU, copied to that
    device first (an extern _to_copy, as Inductor's lowering copies a CPU scalar). Eager lets a
    CUDA op take a CPU scalar as an operand (a module's float attribute that Dynamo made an input:
    a 0-d float64 CPU tensor, converted to float32 on the CPU, then multiplied on the GPU), but a
    kernel launched on the GPU cannot read host memory (the H200 read it as an illegal address).
    The CPU nodes between the input and the GPU ones then compute on the GPU, the same values.
    An input whose CPU values are also graph outputs, or read on two GPUs, is not lowered."""
    val = node.meta["val"]
    if val.device.type != "cpu" or any(not isinstance(s, int) or s != 1 for s in val.shape):
        return view
    devices: set[str] = set()
    on_cpu = False
    todo, seen = [node], {node}
    while todo:
        for u in todo.pop().users:
            v = u.meta.get("val")
            if u.op == "output":
                on_cpu = True
            elif isinstance(v, torch.Tensor) and v.device.type != "cpu":
                devices.add(v.device.type)
            elif u not in seen:  # a CPU value made from it (a dtype conversion): where do its go?
                seen.add(u)
                todo.append(u)
    if not devices:
        return view
    if on_cpu or len(devices) > 1:
        raise UnsupportedOp(f"CPU scalar input {node.name} is read on the CPU and on {sorted(devices)}",
                            node=node.name)
    (device,) = devices
    name = g.new_name("to_device")
    g.program.append(ExternCall(name, "aten._to_copy.default", [NodeRef(name=view.buffer.name)],
                                {"device": DeviceArg(value=device)}))
    return g.add_buffer(Buffer(name, val.dtype, sizes_of(val), strides_of(val), "extern"))


def input_writes(gm: fx.GraphModule) -> list[fx.Node]:
    """The graph's `copy_(input, value)` nodes: AOTAutograd's write-back of a mutated input (batch
    norm's running statistics, a KV cache), which it puts after every other use of the input.

    Note: any other mutation (or a write-back that something reads, or into an input that an
    output aliases) sends the whole graph to extern calls: deferred (lazy) reads would see it.
    """
    mutating = [n for n in gm.graph.nodes if n.op == "call_function" and _is_mutating(n.target)]
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    outputs = {a for n in gm.graph.nodes if n.op == "output" for a in n.args[0] if isinstance(a, fx.Node)}
    dsts: set[fx.Node] = set()
    for n in mutating:
        dst = n.args[0] if n.target is aten.copy_.default and not n.kwargs and len(n.args) == 2 else None
        if (not isinstance(dst, fx.Node) or dst.op != "placeholder" or n.users or dst in dsts
                or any(order[u] > order[n] for u in dst.users) or _aliased_by(dst, outputs)):
            raise UnsupportedOp("graph mutates a tensor", op=str(n.target), node=n.name)
        dsts.add(dst)
    return mutating


def _aliased_by(node: fx.Node, outputs: set[fx.Node]) -> bool:
    """Whether `node` or a chain of views of it is a graph output."""
    todo = [node]
    while todo:
        n = todo.pop()
        if n in outputs:
            return True
        todo.extend(u for u in n.users if is_view(u) and u.args[0] is n)
    return False


def _write_inputs(g: GraphLowering, writes: list[fx.Node], env: dict[fx.Node, Any]) -> None:
    """The write-backs, as extern copy_ calls after everything else the plan computes (the scheduler
    has kernels store what they can straight into the inputs: scheduler.store_into_inputs).

    Note: every value written back is computed first, before any copy_ runs: one of them may read
    an input that another write-back overwrites (the graph's values are those before any write).
    """
    for node in writes:
        src = node.args[1]
        value, val = env.get(src), src.meta.get("val") if isinstance(src, fx.Node) else None
        if isinstance(value, Lazy) and isinstance(val, torch.Tensor) and _nbytes(value.sizes, value.dtype):
            env[src] = g.realize(value, dense_strides_like(sizes_of(val), strides_of(val)))
    # One _foreach_copy_ per dtype: torch's multi-tensor launch takes lists of one dtype only, and
    # a list that mixes them (batch norm's float statistics and its int64 num_batches_tracked)
    # runs as one copy_ per tensor (a ResNet-18 step: 60 memcpys, 0.34 ms of host time).
    by_dtype: dict[torch.dtype, list[fx.Node]] = {}
    for n in writes:
        if _small_write(n):
            by_dtype.setdefault(n.args[0].meta["val"].dtype, []).append(n)
    together = {n for group in by_dtype.values() if len(group) >= 2 for n in group}
    with _lowering(g, None):
        for node in writes:
            if node not in together:
                env[node] = _extern(g, node, g.wire[node], env)
                g.write_backs.add(g.wire[node].name)
        for group in by_dtype.values():
            if len(group) >= 2:
                _write_together(g, group, env)


# Write-backs of at most this many elements each go out together, one _foreach_copy_ per dtype (one
# multi-tensor launch on CUDA each): a ResNet-18 step's 60 batch-norm statistics, 2 launches, not 60.
SMALL_WRITE_MAX = 1 << 16


def _small_write(node: fx.Node) -> bool:
    val = node.args[0].meta.get("val")
    return (isinstance(node.args[1], fx.Node) and isinstance(val, torch.Tensor)
            and all(isinstance(s, int) for s in val.shape) and val.numel() <= SMALL_WRITE_MAX)


def _write_together(g: GraphLowering, writes: list[fx.Node], env: dict[fx.Node, Any]) -> None:
    """copy_(dst, src) for each of `writes` as one extern _foreach_copy_(dsts, srcs)."""
    dsts, srcs = [], []
    for node in writes:
        dst, src = node.args[0], node.args[1]
        dsts.append(g.extern_ref(env[dst], dst))
        value = env[src]
        if isinstance(value, Lazy):
            value = env[src] = g.realize(value, dense_strides_like(sizes_of(src.meta["val"]), strides_of(src.meta["val"])))
        srcs.append(g.extern_ref(value, src))
    name = g.new_name("writeback")
    g.write_backs.add(name)
    g.program.append(ExternCall(name, "aten._foreach_copy_.default", [ListArg(items=dsts), ListArg(items=srcs)]))
    g.extern_ops.append("aten._foreach_copy_.default")
    for node in writes:
        env[node] = env[node.args[0]]




def _is_mutating(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def _lower_node(g: GraphLowering, node: fx.Node, wire: Any, env: dict[fx.Node, Any]) -> Any:
    if node.target is operator.getitem:
        src, i = env[node.args[0]], node.args[1]
        if isinstance(src, ExternTuple):
            g.program.append(ExternCall(wire.name, "getitem", [NodeRef(name=src.name), IntArg(value=i)],
                                        expect_strides=_fresh_strides(node.args[0], src.vals[i])))
            return _extern_result(g, wire.name, src.vals[i])
        g.nodes_lowered += 1
        return src[i]
    fn = LOWERINGS.get(node.target)
    if fn is not None:
        args = fx.node.map_arg(node.args, lambda n: env[n])
        kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
        try:
            with _lowering(g, node):
                out = fn(*args, **kwargs)
            _check(node, out)
            g.nodes_lowered += 1
            return _maybe_realize(g, node, _round_like_eager(out))
        except UnsupportedOp as e:
            log.debug("extern %s: %s", node.target, e)
        except Exception as e:  # noqa: BLE001 - correctness first: a lowering that fails is an extern call
            # Note: a failure here is a bug in a lowering (an edge case it did not foresee), never
            # a reason to fail the compile; the node runs as its aten op and the log names it.
            log.warning("lowering %s (node %s) failed, running it as an extern call: %s: %s",
                        node.target, node.name, type(e).__name__, e)
    return _extern(g, node, wire, env)


def _round_like_eager(out: Any) -> Any:
    """fp16/bf16 results rounded to their dtype where eager's op would round them.

    Note: fused code computes in fp32; without this, a chain of fp16 ops would skip the rounding
    eager does after each op, and a later cast to an integer could land on the other side.
    """
    if isinstance(out, tuple):
        return tuple(_round_like_eager(o) for o in out)
    if not isinstance(out, Lazy) or out.dtype not in (torch.float16, torch.bfloat16):
        return out
    inner, dtype = out.loader, out.dtype
    return Lazy(dtype, out.sizes, lambda index: ops.to_dtype(ops.to_dtype(inner(index), dtype), torch.float32))


def _check(node: fx.Node, out: Any) -> None:
    """A lowering must reproduce eager's sizes and dtype exactly."""
    val = node.meta["val"]
    outs, vals = (out, val) if isinstance(val, (tuple, list)) else ((out,), (val,))
    for o, v in zip(outs, vals):
        if isinstance(v, torch.Tensor) and (tuple(o.sizes) != sizes_of(v) or o.dtype != v.dtype):
            raise LoweringError(f"lowering gave {o.dtype}{list(o.sizes)}, eager gives "
                                f"{v.dtype}{list(v.shape)}", op=str(node.target), node=node.name)


def _maybe_realize(g: GraphLowering, node: fx.Node, out: Any) -> Any:
    if not isinstance(out, Lazy):
        return out
    g.lazy_values.append(out)
    if any(keep(node) for keep in KEEP_LAZY):
        return out
    counted = count_ops(out)
    cost, reads = counted.ops, len({name for name, _ in counted.loads})
    shared = len(node.users) > 1 and (cost > REALIZE_OPS_SHARED or reads > REALIZE_READS_SHARED)
    if cost > REALIZE_OPS_ALWAYS or shared:
        # Note: in eager's layout, since an extern call may read this buffer as it is, and some
        # (convolution, a preserve-format clone) give results laid out like their inputs.
        val = node.meta.get("val")
        strides = dense_strides_like(sizes_of(val), strides_of(val)) if isinstance(val, torch.Tensor) else None
        return g.realize(out, strides)
    return out


def _extern(g: GraphLowering, node: fx.Node, wire: Any, env: dict[fx.Node, Any]) -> Any:
    """Run `node` as its aten op on the client, with its tensor inputs in eager's layouts."""
    refs: dict[str, Arg] = {}
    for arg_node in node.all_input_nodes:
        value, val = env[arg_node], arg_node.meta.get("val")
        if isinstance(value, Lazy) and isinstance(val, torch.Tensor) and _nbytes(value.sizes, value.dtype):
            value = realize_for_reading(g, arg_node, env)
        refs[arg_node.name] = g.extern_ref(value, arg_node)
    by_wire_name = {n.name: refs[n.name] for n in node.all_input_nodes}

    def swap(a: Arg) -> Arg:
        if isinstance(a, NodeRef):
            return by_wire_name.get(a.name, a)
        if isinstance(a, ListArg):
            return ListArg(items=[swap(x) for x in a.items])
        return a

    val = node.meta["val"]
    g.program.append(ExternCall(wire.name, wire.target, [swap(a) for a in wire.args],
                                {k: swap(v) for k, v in wire.kwargs.items()},
                                expect_strides=_fresh_strides(node, val), opaque=wire.opaque,
                                triton=wire.triton, control=wire.control, flex=wire.flex))
    g.extern_ops.append(target_name(node.target))
    val = node.meta["val"]
    if isinstance(val, (tuple, list)):
        return ExternTuple(wire.name, tuple(val))
    return _extern_result(g, wire.name, val)


def realize_for_reading(g: GraphLowering, node: fx.Node, env: dict[fx.Node, Any] | None = None) -> StridedView:
    """`node`'s Lazy value in memory for a reader that takes buffers (an extern call, a template):
    through its view's base where that base is worth writing (_realize_view_base), else written
    itself in eager's layout; `env` (the graph's, by default) then holds the buffer.

    Note: written once for every later reader too, as Inductor's realize does: a later kernel
    loads this buffer instead of recomputing it from its sources, which would keep those alive (a
    ResNet's block outputs held every conv result of the stage).
    """
    env = g.env if env is None else env
    value = _realize_view_base(g, node)
    if not isinstance(value, StridedView):
        val = node.meta["val"]
        value = g.realize(value, dense_strides_like(sizes_of(val), strides_of(val)))
    env[node] = value
    return value


def _realize_view_base(g: GraphLowering, node: fx.Node) -> TensorValue:
    """`node`'s value, read through a view of its base written to memory where a later node
    reads that base too; else its Lazy value unchanged.

    Note: a view of a Lazy value is Lazy, so realizing it for an extern call (a Linear's input,
    `view(layer_norm(x))`) wrote the view's own buffer and left the base Lazy: a later reader
    of the base (the residual add after it) recomputed it from all its sources. The base is
    written instead, in eager's layout, and the graph's view ops run again on its buffer, as
    Inductor realizes a view's storage. Only for views of as many elements as their base (no
    slice writes more than the extern reads), and only when a node not yet lowered reads the
    base (a lone view keeps its own buffer, which a kernel may write in place of its input: the
    GELU between two Linears). A view of more elements than its base (an expand: an attention
    mask [B, 1, S, S] broadcast over the heads for SDPA's bias) always reads its base written
    once: the extern gets eager's broadcast view (stride 0) of it, as Inductor's realize does,
    where writing the view would copy the base once per head (transformers' GPT-2 on the H200: a
    50-MB bias written by a 0.136-ms kernel, and memory-efficient attention reading all of it);
    not where a view of the chain is also a graph output (it would share its base's storage, which
    keeps an inference plan from replaying as a CUDA graph).
    """
    value = g.env[node]
    chain: list[fx.Node] = []  # from `node` up to the base's reader
    base = node
    while is_view(base) and base.target is not operator.getitem and isinstance(g.env.get(base.args[0]), Lazy):
        chain.append(base)
        base = base.args[0]
    if not chain or base.op != "call_function":
        return value
    base_value, base_val = g.env[base], base.meta.get("val")
    if not isinstance(base_val, torch.Tensor):
        return value
    count = numel(base_value.sizes)
    returned = any(u.op == "output" for n in chain for u in n.users)
    if returned or not _broadcasts(value, count):  # a returned view stays a buffer of its own
        if any(numel(g.env[n].sizes) != count for n in chain):
            return value
        along = {base, *chain}
        if not any(u not in g.env for n in along - {node} for u in n.users if u not in along):
            return value
    g.env[base] = g.realize(base_value, dense_strides_like(sizes_of(base_val), strides_of(base_val)))
    redone: dict[fx.Node, Any] = {}
    try:
        for n in reversed(chain):
            args = fx.node.map_arg(n.args, lambda a: redone.get(a, g.env[a]))
            kwargs = fx.node.map_arg(n.kwargs, lambda a: redone.get(a, g.env[a]))
            with _lowering(g, n):
                redone[n] = LOWERINGS[n.target](*args, **kwargs)
            _check(n, redone[n])
    except Exception as e:  # noqa: BLE001 - the views' Lazy values stay right: they read the base's sources
        log.warning("views of %s (realized) failed to lower again: %s: %s", base.name, type(e).__name__, e)
        return value
    g.env.update(redone)
    return redone[node]


def _broadcasts(value: TensorValue, base_count: Any) -> bool:
    """Whether `value`, a view, reads more elements than its base holds (it broadcasts some)."""
    try:
        return bool(hint(numel(value.sizes)) > hint(base_count))
    except Exception:  # noqa: BLE001 - no hint: keep the view's own buffer
        return False

def _fresh_strides(node: fx.Node, val: Any) -> tuple[Any, ...] | None:
    """The strides eager gives `val`, a tensor result of `node`'s op, if that op returns fresh
    memory (never for views, whose layout follows their input's by definition).

    Note: an extern op's output layout can depend on its inputs' layouts (SDPA, clone, …), and
    fxcc may hand it inputs laid out unlike eager's; the plan's kernels index the result with
    eager's strides, so the runtime checks them (one tuple compare) and copies when they differ.
    """
    if not isinstance(val, torch.Tensor) or _nbytes(sizes_of(val), val.dtype) == 0:
        return None
    schema = getattr(node.target, "_schema", None)
    if schema is None or any(r.alias_info is not None for r in schema.returns):
        return None
    return strides_of(val)


def _extern_result(g: GraphLowering, name: str, val: Any) -> Any:
    if not isinstance(val, torch.Tensor):
        return val
    return g.add_buffer(Buffer(name, val.dtype, sizes_of(val), strides_of(val), "extern",
                               offset_of(val)))


def _view_root(node: fx.Node) -> fx.Node:
    while is_view(node):
        node = node.args[0]
    return node


def _shared_view_roots(outputs: Any) -> set[fx.Node]:
    """Nodes that are graph outputs, or the root of more than one output's chain of views: outputs
    viewing them keep the view relation eager gives them (_view_of_realized_base)."""
    nodes = [a for a in outputs if isinstance(a, fx.Node)]
    seen: set[fx.Node] = set()
    shared = set(nodes)
    for a in nodes:
        root = _view_root(a)
        if root in seen:
            shared.add(root)
        seen.add(root)
    return shared


def _output(g: GraphLowering, a: Any, wire: Arg, env: dict[fx.Node, Any],
            shared: set[fx.Node] = frozenset()) -> Arg:
    """A graph output as a plan name, in eager's layout (a copy only where the layouts differ).

    Note: a dense view of a value no kernel wrote yet (batch norm's saved statistics, unsqueezed
    to [1, C, 1, 1] for its backward) becomes a buffer of its own, written by the kernel that
    computes it, rather than the base's buffer and a chain of view steps (3 per statistic); not
    where its root is an output or the root of another output (eager's aliasing stays).
    """
    if not isinstance(a, fx.Node):
        return wire
    value, val = env[a], a.meta["val"]
    if not isinstance(val, torch.Tensor):
        return wire
    if _nbytes(sizes_of(val), val.dtype) == 0:
        return g.extern_ref(value, a)
    if not _laid_out_like(value, val) and is_view(a) and not _own_buffer(g, a, shared):
        viewed = _view_of_realized_base(g, a)
        if viewed is not None:
            return viewed
    want = dense_strides_like(sizes_of(val), strides_of(val))
    if isinstance(value, StridedView) and want is not None and not _same_layout(value, val):
        value = Lazy(value.dtype, value.sizes, make_loader(value))
    if isinstance(value, Lazy):
        return NodeRef(name=g.realize(value, want).buffer.name)
    return g.extern_ref(value, a)


def _own_buffer(g: GraphLowering, node: fx.Node, shared: set[fx.Node]) -> bool:
    """Whether output `node`, a view, is written as a buffer of its own (see _output)."""
    root, val = _view_root(node), node.meta["val"]
    if root in shared or not isinstance(g.env.get(root), Lazy) or not isinstance(g.env.get(node), Lazy):
        return False
    want = dense_strides_like(sizes_of(val), strides_of(val))
    return want is not None and all(n == 1 or a == b for n, a, b in zip(sizes_of(val), want, strides_of(val)))


def _laid_out_like(value: TensorValue, val: torch.Tensor) -> bool:
    return isinstance(value, StridedView) and _same_layout(value, val)


def _view_of_realized_base(g: GraphLowering, node: fx.Node) -> NodeRef | None:
    """An output that eager returns as a view of an intermediate: that intermediate written in
    eager's layout, then the graph's own view ops on it, so strides match eager's."""
    base = node
    while is_view(base):
        base = base.args[0]
    value, val = g.env.get(base), base.meta.get("val")
    if not isinstance(val, torch.Tensor) or base.op != "call_function":
        return None
    strides = dense_strides_like(sizes_of(val), strides_of(val))
    if strides is None or not isinstance(value, (Lazy, StridedView)):
        return None
    if isinstance(value, StridedView) and not (value.is_whole_buffer() and value.buffer.kind == "computed"
                                               and _same_layout(value, val)):
        value = Lazy(value.dtype, value.sizes, make_loader(value))
    g.env[base] = g.realize(value, strides)
    return g._replay_views(node)


def _same_layout(value: StridedView, val: torch.Tensor) -> bool:
    return all(sz == 1 or a == b for sz, a, b in zip(value.sizes, value.strides, val.stride()))


"""Rebuild an FX graph from a GraphSpec and re-derive every shape, dtype and stride with FakeTensors.

Note: the worker trusts no client metadata. Only the placeholders' specs come from the client;
each node's `meta["val"]` is recomputed here by running the aten op under FakeTensorMode, so a
spec whose ops do not fit together is rejected with an InvalidGraph naming the node.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

import sympy
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from fxcc.compiler_core import collectives
from fxcc.compiler_core.errors import InvalidGraph
from fxcc.compiler_core.opaque import OpaqueTarget, check_opaque_node, value_form
from fxcc.compiler_core.symbolic import size_symbol
from fxcc.compiler_core.wire import (
    Arg,
    BoolArg,
    DeviceArg,
    DtypeArg,
    FloatArg,
    GraphSpec,
    IntArg,
    LayoutArg,
    ListArg,
    MemoryFormatArg,
    Node,
    NodeRef,
    NoneArg,
    StrArg,
    SymArg,
    TensorSpec,
    plain_arg,
    resolve_target,
    target_name,
    torch_dtype,
)

_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
    "preserve_format": torch.preserve_format,
}


def decode_arg(arg: Arg, env: dict[str, Any], syms: Any = None) -> Any:
    """A wire argument as the Python value an aten op takes; node references via `env`, size
    expressions via `syms` (SymValues in the worker; the client's runtime binds its own)."""
    if isinstance(arg, NodeRef):
        return env[arg.name]
    if isinstance(arg, SymArg):
        if syms is None:
            raise InvalidGraph(f"size expression {arg.expr!r} in a graph without symbols")
        return syms.value(arg.expr)
    if isinstance(arg, (IntArg, BoolArg, StrArg)):
        return arg.value
    if isinstance(arg, FloatArg):
        return arg.to_python()
    if isinstance(arg, NoneArg):
        return None
    if isinstance(arg, DtypeArg):
        return torch_dtype(arg.value)
    if isinstance(arg, DeviceArg):
        return torch.device(arg.value)
    if isinstance(arg, LayoutArg):
        return torch.strided
    if isinstance(arg, MemoryFormatArg):
        return _MEMORY_FORMATS[arg.value]
    if isinstance(arg, ListArg):
        return [decode_arg(a, env, syms) for a in arg.items]
    raise InvalidGraph(f"cannot decode argument {arg!r}")


def fake_input(mode: FakeTensorMode, spec: TensorSpec, syms: SymValues | None = None) -> torch.Tensor:
    sizes = [_size(s, syms) for s in spec.sizes]
    strides = [_size(s, syms) for s in spec.strides]
    with mode:
        return torch.empty_strided(sizes, strides, dtype=torch_dtype(spec.dtype), device=spec.device)


def _size(s: int | str, syms: SymValues | None) -> Any:
    if isinstance(s, int):
        return s
    if syms is None:
        raise InvalidGraph(f"size {s!r} without symbols")
    return syms.value(s)


class SymValues:
    """The graph's size symbols as SymInts of one ShapeEnv (or plain ints, from `values`).

    `rename` maps the ShapeEnv's own symbol names to fxcc's (s0, s1, …); the lowering reads
    sizes through it (compiler_core.symbolic.symbol_scope).
    """

    def __init__(self, spec: GraphSpec, hints: dict[str, int]) -> None:
        from torch._dynamo.source import ConstantSource
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

        self.shape_env = ShapeEnv(duck_shape=False)
        self.symbols: dict[sympy.Symbol, Any] = {}
        self.rename: dict[str, sympy.Symbol] = {}
        self.hints: dict[sympy.Symbol, int] = {}
        for s in spec.symbols:
            ours = size_symbol(s.name)
            h = hints.get(s.name, max(s.lo, 2) if s.hi is None else min(max(s.lo, 2), s.hi))
            source = ConstantSource(f"fxcc_{s.name}")
            theirs = self.shape_env.create_symbol(h, source, dynamic_dim=DimDynamic.DYNAMIC)
            if not isinstance(theirs, sympy.Symbol):
                raise InvalidGraph(f"size symbol {s.name} with hint {h} was specialized")
            self.shape_env.constrain_symbol_range(theirs, compiler_min=s.lo, compiler_max=s.hi or int_oo())
            self.symbols[ours] = self.shape_env.create_symintnode(theirs, hint=h, source=source)
            self.rename[theirs.name] = ours
            self.hints[ours] = h

    def value(self, text: str) -> Any:
        from fxcc.compiler_core.symbolic import to_torch
        from fxcc.compiler_core.symexpr import SymExprError, parse

        try:
            expr = parse(text).to_sympy()
        except SymExprError as e:
            raise InvalidGraph(f"bad size expression {text!r}: {e}") from None
        return to_torch(expr, self.symbols)


def int_oo() -> Any:
    from torch.utils._sympy.numbers import int_oo as oo

    return oo


def _opaque_target(n: Any, mode: FakeTensorMode, syms: SymValues | None) -> OpaqueTarget:
    """The FX target of an op or a Triton kernel only the client runs, or of control flow (whose
    subgraphs compile on their own): its fakes come from the node's output specs (compiler_core.opaque)."""
    if n.triton is not None or n.control is not None:
        specs, form = list((n.triton or n.control).outputs), "tuple"
    else:
        schema = check_opaque_node(n.target, n.opaque.op_schema, n.opaque.functional, len(n.opaque.outputs),
                                   [o is not None for o in n.opaque.outputs])
        specs, form = list(n.opaque.outputs), value_form(schema, n.opaque.functional)
    return OpaqueTarget(n.target, lambda: [None if s is None else fake_input(mode, s, syms) for s in specs], form)


def _node_target(n: Any, mode: FakeTensorMode, syms: SymValues | None) -> Any:
    """What a wire node calls: a flex_attention node's target (its mods rebuilt and checked), an
    opaque step's (custom op, user kernel, control flow), or an allow-listed aten/prims overload."""
    if n.flex is not None:
        return _flex_target(n)
    if n.opaque or n.triton or n.control:
        return _opaque_target(n, mode, syms)
    return resolve_target(n.target, node=n.name)


def _flex_target(n: Any) -> Any:
    """The FX target of a flex_attention node, once each of its mod graphs has been rebuilt (which
    checks their ops against the allow-list and their shapes: compiler_core.flex)."""
    from fxcc.compiler_core.flex import FlexTarget

    for g in (n.flex.score_mod, n.flex.mask_mod, n.flex.joint):
        if g is not None:
            rebuild_graph(g)
    return FlexTarget(n.flex.kind, n.flex.n_outputs)


def rebuild_graph(spec: GraphSpec, hints: dict[str, int] | None = None, repeat: bool = True) -> fx.GraphModule:
    """An FX GraphModule equivalent to `spec`, with `meta["val"]` (a FakeTensor) on every node.

    With size symbols, FakeTensors have symbolic sizes from one ShapeEnv (in gm.meta["fxcc_syms"]):
    the compilation's, which the passes rewrite the graph under and whose guards the plan keeps.
    Each node remembers the wire node it was made from (`wire_graph` reuses it while a pass leaves
    the node as it was). Without symbols, a node that repeats an earlier one (Repeats) takes that
    one's outputs' metadata (`repeat=False`: every node runs its op; gm.meta["fxcc_repeats"]
    counts the nodes that did not, gm.meta["fxcc_repeat_memo"] is the Repeats, which the passes'
    edits use too).
    """
    graph = fx.Graph()
    syms = SymValues(spec, hints or {}) if spec.symbols else None
    mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=syms.shape_env if syms else None)
    repeats = Repeats(mode) if syms is None and repeat else None
    nodes: dict[str, fx.Node] = {}
    fakes: dict[str, Any] = {}
    for p in spec.placeholders:
        node = graph.placeholder(p.name)
        if p.symbol is not None:
            node.meta["val"] = fakes[p.name] = _size(p.symbol, syms)
        else:
            node.meta["val"] = fakes[p.name] = fake_input(mode, p.spec, syms)
        nodes[p.name] = node
    for n in spec.nodes:
        target = _node_target(n, mode, syms)
        if n.target in collectives.OPS:
            collectives.check_node(n.target, n.args, n.name)
        args = tuple(decode_arg(a, nodes, syms) for a in n.args)
        kwargs = {k: decode_arg(v, nodes, syms) for k, v in n.kwargs.items()}
        val = _propagate(n, target, mode, fakes, syms, repeats)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # size expressions as SymInt arguments
            node = graph.call_function(target, args, kwargs)
        node.name = n.name
        node.meta["val"] = fakes[n.name] = val
        _remember_wire(node, n)
        nodes[n.name] = node
    out = graph.output(tuple(decode_arg(a, nodes, syms) for a in spec.outputs))
    _remember_wire(out, spec.outputs)
    gm = _graph_module(graph)
    gm.meta["fxcc_syms"] = syms
    gm.meta["fxcc_fake_mode"] = mode
    gm.meta["fxcc_repeats"] = repeats.hits if repeats else 0
    gm.meta["fxcc_repeat_memo"] = repeats  # the passes' edits run their ops through it too (passes/edit.py)
    gm.meta["fxcc_free_outputs"] = frozenset(spec.free_layout_outputs)
    return gm


def propagate_shapes(spec: GraphSpec) -> int:
    """What rebuild_graph checks (every node's op runs on FakeTensors of its arguments, or repeats
    an earlier node's), without the FX graph: the service's request check. Raises InvalidGraph
    naming the node that fails; returns how many nodes repeated an earlier one."""
    syms = SymValues(spec, {}) if spec.symbols else None
    mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=syms.shape_env if syms else None)
    repeats = Repeats(mode) if syms is None else None
    fakes: dict[str, Any] = {}
    for p in spec.placeholders:
        fakes[p.name] = _size(p.symbol, syms) if p.symbol is not None else fake_input(mode, p.spec, syms)
    for n in spec.nodes:
        target = _node_target(n, mode, syms)
        if n.target in collectives.OPS:
            collectives.check_node(n.target, n.args, n.name)
        fakes[n.name] = _propagate(n, target, mode, fakes, syms, repeats)
    for a in spec.outputs:
        decode_arg(a, fakes, syms)
    return repeats.hits if repeats else 0


def _propagate(n: Any, target: Any, mode: FakeTensorMode, fakes: dict[str, Any], syms: SymValues | None,
               repeats: Repeats | None = None) -> Any:
    """Node `n`'s value: its op run on its arguments' FakeTensors, or the outputs of an earlier node
    it repeats (`repeats`). Raises InvalidGraph."""
    fake_args = tuple(decode_arg(a, fakes, syms) for a in n.args)
    fake_kwargs = {k: decode_arg(v, fakes, syms) for k, v in n.kwargs.items()}
    try:
        if repeats is not None:
            val = repeats.run(target, fake_args, fake_kwargs)
        else:
            with mode:
                val = target(*fake_args, **fake_kwargs)
    except Exception as e:  # noqa: BLE001 - any failure here means the spec is wrong
        raise InvalidGraph(f"{n.target} rejects its arguments: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}",
                           op=n.target, node=n.name) from None
    if target is operator.getitem and not isinstance(fake_args[0], (tuple, list)):
        raise InvalidGraph("getitem of a non-tuple", op="getitem", node=n.name)
    return val


# Tags of ops whose outputs' metadata is not a function of their arguments' metadata alone.
_UNREPEATABLE_TAGS = frozenset(getattr(torch.Tag, t) for t in ("dynamic_output_shape", "data_dependent_output",
                                                                "inplace_view") if hasattr(torch.Tag, t))


class Repeats:
    """Outputs' metadata of the nodes of one static graph, by what determines it: a node that
    repeats an earlier one (a model's 48 identical layers) is not run again.

    Note: running an op on FakeTensors costs 0.3-0.5 ms even from FakeTensorMode's own cache
    (its key over the arguments, then a FakeTensor built per output); a 48-layer GPT-2's 2207
    nodes spent 2.6 s of the worker's 6.8 s compile so, and the service's check as much again.
    The key here is the op and each argument: a FakeTensor's sizes, strides, storage offset,
    dtype and device (no argument with a conj or neg bit, a gradient or a constant), any other
    value with its type (True is not 1). Only what the meta kernel's
    result depends on alone is repeated: aten and prims overloads that mutate nothing and whose
    tags do not say their outputs depend on data; outputs that are FakeTensors (or None) of this
    mode without conj/neg bits, gradients or constants; a view op's outputs each on the storage
    of an argument (rebuilt on that argument of the repeating node), any other op's outputs each on
    a fresh storage of its own of exactly the bytes its sizes and strides span. The first node
    of each key runs its op and is checked as every node was; a node that repeats it would be
    checked the same way and give the same result. Graphs with size symbols run every op (their
    FakeTensors' sizes are expressions of one ShapeEnv). A repeated view is not an autograd view
    (`_base` None, as FakeTensorMode's own cache makes them): ask the op's schema whether a node
    is a view, not its value.
    """

    def __init__(self, mode: FakeTensorMode) -> None:
        self.mode = mode
        self.entries: dict[tuple[Any, ...], Any] = {}
        self.hits = 0

    def run(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`target(*args, **kwargs)` on this mode's FakeTensors, or the outputs of the call it repeats."""
        key = self.key(target, args, kwargs)
        if key is not None:
            val = self.replay(key, args, kwargs)
            if val is not None:
                return val
        with self.mode:
            val = target(*args, **kwargs)
        if key is not None:
            self.record(key, target, args, kwargs, val)
        return val

    def key(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
            return None
        if target._schema.is_mutable or _UNREPEATABLE_TAGS.intersection(target.tags):
            return None
        try:
            return (target, _arg_key(args), _arg_key(sorted(kwargs.items())))
        except _Unkeyable:
            return None

    def replay(self, key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        entry = self.entries.get(key)
        if entry is None:
            return None
        kind, outs = entry
        tensors = _tensors(args, kwargs)
        made = []
        for o in outs:
            if o is None:
                made.append(None)
                continue
            view, sizes, strides, offset, dtype, device = o
            with torch._C._DisableTorchDispatch():  # a plain meta tensor, whatever mode is active
                meta = torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
                if view is not None:
                    meta.set_(tensors[view].untyped_storage(), offset, sizes, strides)
            made.append(FakeTensor(self.mode, meta, device))
        self.hits += 1
        return made[0] if kind == "one" else tuple(made) if kind == "tuple" else made

    def record(self, key: tuple[Any, ...], target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               val: Any) -> None:
        kind = "tuple" if isinstance(val, tuple) else "list" if isinstance(val, list) else "one"
        outs = [val] if kind == "one" else list(val)
        tensors = _tensors(args, kwargs)
        if any(getattr(t, "constant", None) is not None for t in tensors):
            return
        inputs = {t.untyped_storage()._cdata: i for i, t in reversed(list(enumerate(tensors)))}
        seen: set[int] = set()
        entry = []
        for o in outs:
            if o is None:
                entry.append(None)
                continue
            if not isinstance(o, FakeTensor) or o.fake_mode is not self.mode or o.is_conj() or o.is_neg() \
                    or o.requires_grad or o.constant is not None or o.layout != torch.strided:
                return
            storage = o.untyped_storage()
            view = inputs.get(storage._cdata)
            if target.is_view:
                if view is None:
                    return
            elif view is not None or storage._cdata in seen or o.storage_offset() != 0 or \
                    storage.nbytes() != _span_bytes(o):
                return
            seen.add(storage._cdata)
            entry.append((view, tuple(o.shape), o.stride(), o.storage_offset(), o.dtype, o.device))
        self.entries[key] = (kind, entry)


class _Unkeyable(Exception):
    pass


def _arg_key(a: Any) -> Any:
    if isinstance(a, FakeTensor):
        # conj/neg bits and gradients change what an op gives (a conj view's dtype view is an
        # error), and a constant its value: such arguments are not keyed (torch's own cache keys them)
        if a.is_conj() or a.is_neg() or a.requires_grad or a.constant is not None:
            raise _Unkeyable
        return ("T", tuple(a.shape), a.stride(), a.storage_offset(), a.dtype, a.device)
    if isinstance(a, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _Unkeyable
    if a is None or isinstance(a, (bool, int, str, torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return (type(a).__name__, a)
    if isinstance(a, float):
        return ("float", repr(a))
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_arg_key(x) for x in a))
    raise _Unkeyable


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The FakeTensors among the arguments, depth first, in _arg_key's order."""
    out: list[Any] = []

    def walk(a: Any) -> None:
        if isinstance(a, FakeTensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                walk(x)

    walk(args)
    walk([v for _, v in sorted(kwargs.items())])
    return out


def _span_bytes(t: torch.Tensor) -> int:
    """Bytes a storage needs for `t` at offset 0: 0 when it has no elements."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()


# ---------------------------------------------------------------- the wire form of a rewritten graph

_WIRE = "fxcc_wire"  # node.meta: (the wire form, the target, args and kwargs it was rebuilt with)


def _remember_wire(node: fx.Node, wire: Any) -> None:
    node.meta[_WIRE] = (wire, node.target, node.args, node.kwargs)


def keep_wire(new: fx.Node, old: fx.Node) -> None:
    """`new` (a copy of `old` in another graph, its arguments the copies of old's, names kept)
    has old's wire form, where old still had the one it was rebuilt from."""
    wire = kept_wire(old)
    if wire is not None:
        _remember_wire(new, wire)


def kept_wire(node: fx.Node) -> Any:
    """The wire form `node` was rebuilt from, while its target and arguments are the same objects
    (a pass that changes them gives the node new ones: FX makes a new args tuple), else None."""
    kept = node.meta.get(_WIRE)
    if kept is None:
        return None
    wire, target, args, kwargs = kept
    return wire if node.target is target and node.args is args and node.kwargs is kwargs else None


def wire_graph(gm: fx.GraphModule, spec: GraphSpec) -> GraphSpec:
    """The wire form of `gm`, the rebuild of `spec` as the passes left it: each node the passes
    kept as it was rebuilt keeps its wire node (opaque ops, control flow and flex_attention
    included); each node a pass made or changed is encoded from its FX target and arguments.
    `spec` itself where no pass changed anything.

    Note: the key is computed on the request as received (compile_key), never on this: the
    passes' output depends on the compiler, and a key must not.
    """
    syms = gm.meta.get("fxcc_syms")
    nodes: list[Node] = []
    outputs: Any = None
    for node in gm.graph.nodes:
        if node.op == "call_function":
            nodes.append(kept_wire(node) or Node(
                name=node.name, target=target_name(node.target), args=[wire_arg(a, syms) for a in node.args],
                kwargs={k: wire_arg(v, syms) for k, v in node.kwargs.items()}))
        elif node.op == "output":
            outputs = kept_wire(node)
            if outputs is None:
                outputs = [wire_arg(a, syms) for a in node.args[0]]
    if outputs is spec.outputs and len(nodes) == len(spec.nodes) and all(a is b for a, b in zip(nodes, spec.nodes)):
        return spec
    return GraphSpec(symbols=spec.symbols, placeholders=spec.placeholders, nodes=nodes, outputs=outputs,
                     free_layout_outputs=spec.free_layout_outputs)


def wire_arg(a: Any, syms: SymValues | None = None) -> Arg:
    """An argument of an FX node as a wire argument (the inverse of decode_arg); a SymInt as its
    expression over the graph's size symbols."""
    if isinstance(a, fx.Node):
        return NodeRef(name=a.name)
    if isinstance(a, torch.SymInt):
        from fxcc.compiler_core.symbolic import from_torch
        from fxcc.compiler_core.symexpr import dump

        expr = from_torch(a.node.expr, syms.rename if syms else {})
        return IntArg(value=int(expr)) if expr.is_Integer else SymArg(expr=dump(expr))
    if isinstance(a, (list, tuple)):
        return ListArg(items=[wire_arg(x, syms) for x in a])
    plain = plain_arg(a)
    if plain is not None:
        return plain
    raise ValueError(f"an argument of type {type(a).__name__} has no wire form")


def _graph_module(graph: fx.Graph) -> fx.GraphModule:
    """A GraphModule of `graph` whose Python code is made only if something calls it.

    Note: the compiler reads the graph and never runs the module; generating a deep network's
    forward (thousands of nodes) cost about 0.3 s.
    """
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # an older or newer torch without it: eager code generation
        return fx.GraphModule(torch.nn.Module(), graph)
    return _LazyGraphModule(torch.nn.Module(), graph)

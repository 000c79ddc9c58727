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
from torch._subclasses.fake_tensor import FakeTensorMode

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


def rebuild_graph(spec: GraphSpec, hints: dict[str, int] | None = None) -> fx.GraphModule:
    """An FX GraphModule equivalent to `spec`, with `meta["val"]` (a FakeTensor) on every node.

    With size symbols, FakeTensors have symbolic sizes from one ShapeEnv (in gm.meta["fxcc_syms"]):
    the compilation's, which the passes rewrite the graph under and whose guards the plan keeps.
    Each node remembers the wire node it was made from (`wire_graph` reuses it while a pass leaves
    the node as it was).
    """
    graph = fx.Graph()
    syms = SymValues(spec, hints or {}) if spec.symbols else None
    mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=syms.shape_env if syms else None)
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
        val = _propagate(n, target, mode, fakes, syms)
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
    gm.meta["fxcc_free_outputs"] = frozenset(spec.free_layout_outputs)
    return gm


def propagate_shapes(spec: GraphSpec) -> None:
    """What rebuild_graph checks (every node's op runs on FakeTensors of its arguments), without
    the FX graph: the service's request check. Raises InvalidGraph naming the node that fails."""
    syms = SymValues(spec, {}) if spec.symbols else None
    mode = FakeTensorMode(allow_non_fake_inputs=False, shape_env=syms.shape_env if syms else None)
    fakes: dict[str, Any] = {}
    for p in spec.placeholders:
        fakes[p.name] = _size(p.symbol, syms) if p.symbol is not None else fake_input(mode, p.spec, syms)
    for n in spec.nodes:
        target = _node_target(n, mode, syms)
        if n.target in collectives.OPS:
            collectives.check_node(n.target, n.args, n.name)
        fakes[n.name] = _propagate(n, target, mode, fakes, syms)
    for a in spec.outputs:
        decode_arg(a, fakes, syms)


def _propagate(n: Any, target: Any, mode: FakeTensorMode, fakes: dict[str, Any], syms: SymValues | None) -> Any:
    """Node `n`'s value: its op run on its arguments' FakeTensors. Raises InvalidGraph."""
    fake_args = tuple(decode_arg(a, fakes, syms) for a in n.args)
    fake_kwargs = {k: decode_arg(v, fakes, syms) for k, v in n.kwargs.items()}
    try:
        with mode:
            val = target(*fake_args, **fake_kwargs)
    except Exception as e:  # noqa: BLE001 - any failure here means the spec is wrong
        raise InvalidGraph(f"{n.target} rejects its arguments: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}",
                           op=n.target, node=n.name) from None
    if target is operator.getitem and not isinstance(fake_args[0], (tuple, list)):
        raise InvalidGraph("getitem of a non-tuple", op="getitem", node=n.name)
    return val


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

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
    NodeRef,
    NoneArg,
    StrArg,
    SymArg,
    TensorSpec,
    _refs,
    resolve_target,
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


def rebuild_graph(spec: GraphSpec, hints: dict[str, int] | None = None,
                  like: tuple[fx.GraphModule, GraphSpec] | None = None) -> fx.GraphModule:
    """An FX GraphModule equivalent to `spec`, with `meta["val"]` (a FakeTensor) on every node.

    With size symbols, FakeTensors have symbolic sizes from one ShapeEnv (in gm.meta["fxcc_syms"]).
    `like`: an earlier rebuild (gm, spec) of a static graph that `spec` was rewritten from (a
    graph pass): each node the rewrite left as it was keeps its value (see _Reuse).
    """
    graph = fx.Graph()
    syms = SymValues(spec, hints or {}) if spec.symbols else None
    reuse = _Reuse.of(like, spec)
    mode = reuse.mode if reuse else FakeTensorMode(allow_non_fake_inputs=False,
                                                   shape_env=syms.shape_env if syms else None)
    nodes: dict[str, fx.Node] = {}
    fakes: dict[str, Any] = {}
    for p in spec.placeholders:
        node = graph.placeholder(p.name)
        if p.symbol is not None:
            node.meta["val"] = fakes[p.name] = _size(p.symbol, syms)
        else:
            kept = reuse.placeholder(p) if reuse else None
            node.meta["val"] = fakes[p.name] = fake_input(mode, p.spec, syms) if kept is None else kept
        nodes[p.name] = node
    for n in spec.nodes:
        target = _node_target(n, mode, syms)
        if n.target in collectives.OPS:
            collectives.check_node(n.target, n.args, n.name)
        args = tuple(decode_arg(a, nodes, syms) for a in n.args)
        kwargs = {k: decode_arg(v, nodes, syms) for k, v in n.kwargs.items()}
        val = reuse.value(n, fakes) if reuse else _NOT_KEPT
        if val is _NOT_KEPT:
            val = _propagate(n, target, mode, fakes, syms)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # size expressions as SymInt arguments
            node = graph.call_function(target, args, kwargs)
        node.name = n.name
        node.meta["val"] = fakes[n.name] = val
        nodes[n.name] = node
    graph.output(tuple(decode_arg(a, nodes, syms) for a in spec.outputs))
    gm = _graph_module(graph)
    gm.meta["fxcc_syms"] = syms
    gm.meta["fxcc_fake_mode"] = mode
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


_NOT_KEPT = object()


class _Reuse:
    """The values of an earlier rebuild that a rewritten spec may keep.

    Note: a node keeps its earlier value only when its wire form is equal (same op, arguments
    and keyword arguments, by name) and every node it reads kept its value too: then the op
    would see the same FakeTensors and give the same result. The values and the FakeTensorMode
    are shared with the earlier graph (FakeTensors of one graph must come from one mode). Only
    for static graphs: a symbolic graph is rebuilt in a ShapeEnv of its own (passes/attention.py
    says why), and FakeTensor propagation costs most of a pass's rebuild of a deep network.
    """

    def __init__(self, gm: fx.GraphModule, spec: GraphSpec) -> None:
        self.mode: FakeTensorMode = gm.meta["fxcc_fake_mode"]
        self.vals = {n.name: n.meta["val"] for n in gm.graph.nodes if n.op != "output"}
        self.wire = {n.name: n for n in spec.nodes}
        self.placeholders = {p.name: p for p in spec.placeholders}
        self.kept: set[str] = set()

    @classmethod
    def of(cls, like: tuple[fx.GraphModule, GraphSpec] | None, spec: GraphSpec) -> _Reuse | None:
        if like is None or spec.symbols or like[1].symbols or like[0].meta.get("fxcc_fake_mode") is None:
            return None
        return cls(*like)

    def placeholder(self, p: Any) -> Any:
        old = self.placeholders.get(p.name)
        if old is None or old != p or p.name not in self.vals:
            return None
        self.kept.add(p.name)
        return self.vals[p.name]

    def value(self, n: Any, fakes: dict[str, Any]) -> Any:
        old = self.wire.get(n.name)
        if old is None or old != n or n.name not in self.vals:
            return _NOT_KEPT
        if not all(name in self.kept for name in _refs(list(n.args) + list(n.kwargs.values()))):
            return _NOT_KEPT
        self.kept.add(n.name)
        return self.vals[n.name]


def _graph_module(graph: fx.Graph) -> fx.GraphModule:
    """A GraphModule of `graph` whose Python code is made only if something calls it.

    Note: the compiler reads the graph and never runs the module; generating a deep network's
    forward (thousands of nodes) cost about 0.3 s per rebuild, and a compile rebuilds after
    each pass that rewrites the graph.
    """
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # an older or newer torch without it: eager code generation
        return fx.GraphModule(torch.nn.Module(), graph)
    return _LazyGraphModule(torch.nn.Module(), graph)

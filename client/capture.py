"""Turns an aten-level FX graph and its example inputs into a GraphSpec that can travel."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from pydantic import ValidationError
from torch import fx

from fxcc.client.opaque_ops import is_opaque, opaque_refusal, unfunctionalized
from fxcc.client.process_groups import Bindings, GroupNames, handed_on
from fxcc.client.user_kernels import is_user_kernel, kernel_of, remember
from fxcc.compiler_core.errors import InvalidGraph, UnsupportedOp
from fxcc.compiler_core.symbolic import from_torch, size_symbol
from fxcc.compiler_core.symexpr import dump
from fxcc.compiler_core.wire import (
    Arg,
    ControlFlow,
    FlexAttention,
    GraphSpec,
    IntArg,
    ListArg,
    Node,
    NodeRef,
    OpaqueOp,
    Placeholder,
    SymArg,
    SymbolSpec,
    TensorSpec,
    UserKernel,
    dtype_name,
    plain_arg,
    target_name,
)


@dataclass
class Capture:
    """A GraphSpec plus the tensors the graph holds as constants (passed after the inputs)."""

    spec: GraphSpec
    constants: list[torch.Tensor]
    hints: dict[str, int] = field(default_factory=dict)  # example values of the size symbols
    # process groups and inputs only handed on, bound by the caller (client/process_groups.py)
    bindings: Bindings = field(default_factory=Bindings)
    # a training graph's outputs that its CUDA graph hands out from its pool whatever their size
    # (client/training_graphs.py; set by client/graphs.py while AOTAutograd compiles it)
    pool_outputs: frozenset[int] = frozenset()


class Symbols:
    """The graph's size symbols: Dynamo's ShapeEnv symbols renamed s0, s1, … in order of first
    appearance, with their ranges and the example's values (hints)."""

    def __init__(self) -> None:
        self.rename: dict[str, sympy.Symbol] = {}
        self.specs: list[SymbolSpec] = []
        self.hints: dict[str, int] = {}

    def text(self, v: Any) -> int | str:
        """An int, or a SymInt's expression as fxcc text (new symbols declared on the way)."""
        if not isinstance(v, torch.SymInt):
            return int(v)
        expr = v.node.expr
        shape_env = v.node.shape_env
        for sym in sorted(expr.free_symbols, key=lambda s: s.name):
            if sym.name not in self.rename:
                self._declare(sym, shape_env)
        ours = from_torch(expr, self.rename)
        return int(ours) if ours.is_Integer else dump(ours)

    def _declare(self, sym: sympy.Symbol, shape_env: Any) -> None:
        name = f"s{len(self.specs)}"
        self.rename[sym.name] = size_symbol(name)
        vr = shape_env.var_to_range.get(sym)
        lo = int(vr.lower) if vr is not None and vr.lower.is_Integer else 2
        hi = int(vr.upper) if vr is not None and vr.upper.is_Integer else None
        values = getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val
        hint = values.get(sym)
        if hint is None:
            raise UnsupportedOp(f"size symbol {sym} has no example value (data-dependent size)")
        self.specs.append(SymbolSpec(name=name, lo=max(lo, 0), hi=hi))
        self.hints[name] = int(hint)


def tensor_spec(t: torch.Tensor, symbols: Symbols | None = None) -> TensorSpec:
    """The spec of a concrete or fake tensor; raises UnsupportedOp for odd tensors (and for
    symbolic ones without `symbols`)."""
    if t.layout != torch.strided:
        raise UnsupportedOp(f"{t.layout} tensors are not supported")
    if t.device.type not in ("cpu", "cuda"):
        raise UnsupportedOp(f"device {t.device.type} is not supported")
    values = (*t.shape, *t.stride(), t.storage_offset())
    if any(isinstance(s, torch.SymInt) for s in values) and symbols is None:
        raise UnsupportedOp("symbolic shapes are not supported here")
    sym = symbols or Symbols()
    sizes = [sym.text(s) for s in t.shape]
    strides = [sym.text(s) for s in t.stride()]
    offset = sym.text(t.storage_offset())
    if isinstance(offset, str):
        raise UnsupportedOp("a symbolic storage offset is not supported")
    return TensorSpec(dtype=dtype_name(t.dtype), sizes=sizes, strides=strides,
                      storage_offset=offset, device=t.device.type)


def encode_arg(a: Any, node: str, symbols: Symbols | None = None) -> Arg:
    """A Python argument of an aten call as a wire argument."""
    if isinstance(a, fx.Node):
        val = a.meta.get("val")
        if isinstance(val, torch.SymInt) and symbols is not None:
            return _sym_arg(val, symbols)
        return NodeRef(name=a.name)
    if isinstance(a, torch.SymInt):
        if symbols is None:
            raise UnsupportedOp("a symbolic size argument outside a symbolic graph", node=node)
        return _sym_arg(a, symbols)
    if isinstance(a, (torch.SymFloat, torch.SymBool)):
        raise UnsupportedOp(f"a {type(a).__name__} argument cannot travel", node=node)
    if isinstance(a, torch.layout) and a != torch.strided:
        raise UnsupportedOp(f"layout {a} is not supported", node=node)
    plain = plain_arg(a)
    if plain is not None:
        return plain
    if isinstance(a, (list, tuple)):
        return ListArg(items=[encode_arg(x, node, symbols) for x in a])
    raise UnsupportedOp(f"argument of type {type(a).__name__} cannot travel", node=node)


def _sym_arg(v: torch.SymInt, symbols: Symbols) -> Arg:
    text = symbols.text(v)
    return IntArg(value=text) if isinstance(text, int) else SymArg(expr=text)


def opaque_node(n: fx.Node, symbols: Symbols, groups: GroupNames | None = None) -> Node:
    """The wire node of an op outside aten/prims (client/opaque_ops.py): its arguments as data,
    its schema, and its outputs' specs from the node's FakeTensors (the op's fake kernel made them).
    A collective's process group travels as its binding in `groups` (client/process_groups.py)."""
    op, args, kwargs, functional = unfunctionalized(n)
    if groups is not None:
        args = groups.bind(target_name(op), args, n.name)
    why = opaque_refusal(op)
    if why is not None:
        raise UnsupportedOp(f"op {op} cannot run as an opaque step: {why}", op=str(op), node=n.name)
    val = n.meta.get("val")
    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    if any(v is not None and not isinstance(v, torch.Tensor) for v in vals):
        raise UnsupportedOp(f"op {op} returns a non-tensor", op=str(op), node=n.name)
    outputs = [None if v is None else tensor_spec(v, symbols) for v in vals]
    return Node(name=n.name, target=target_name(op),
                args=[encode_arg(a, n.name, symbols) for a in args],
                kwargs={k: encode_arg(v, n.name, symbols) for k, v in kwargs.items()},
                opaque=OpaqueOp(op_schema=str(op._schema), functional=functional, outputs=outputs))


def user_kernel_node(n: fx.Node, symbols: Symbols) -> Node:
    """The wire node of a user's Triton kernel (client/user_kernels.py): its identity, grid and
    arguments (tensors and constants as data), and the specs of the tensors it returns."""
    jit, constants = kernel_of(n)
    module, qualname, sha = remember(jit)
    tensors = dict(n.kwargs["kwargs"])
    cloned = [k for k in tensors if k in n.kwargs["tensors_to_clone"]]
    val = n.meta.get("val") or {}
    outputs = [tensor_spec(val[k], symbols) for k in cloned]
    args = {k: encode_arg(v, n.name, symbols) for k, v in {**tensors, **constants}.items()}
    (grid,) = n.kwargs["grid"]
    return Node(name=n.name, target=f"triton_kernel.{jit.fn.__name__}", kwargs=args,
                triton=UserKernel(module=module, qualname=qualname, source_sha256=sha, cloned=cloned,
                                  outputs=outputs,
                                  grid=[symbols.text(g.meta["val"] if isinstance(g, fx.Node) else g) for g in grid]))


def is_control(n: fx.Node) -> bool:
    return isinstance(n.target, torch._ops.HigherOrderOperator) and n.target.name() in ("cond", "while_loop")


def control_node(n: fx.Node, gm: fx.GraphModule, symbols: Symbols) -> Node:
    """The wire node of torch.cond or while_loop: its operands, and its subgraphs captured as graphs
    of their own (compiler_core.control_flow)."""
    kind = n.target.name()
    if kind == "cond":
        pred, if_true, if_false, operands = n.args
        if not isinstance(pred, fx.Node) or not isinstance(pred.meta.get("val"), torch.Tensor):
            raise UnsupportedOp("cond on a predicate that is not a tensor", node=n.name)
        args, graphs, carried = [pred, *operands], [if_true, if_false], 0
    else:
        cond_fn, body_fn, carried_inputs, additional = n.args
        args, graphs, carried = [*carried_inputs, *additional], [cond_fn, body_fn], len(carried_inputs)
    subs = [operator.attrgetter(g.target)(gm) for g in graphs]
    captured = [_capture(sub, [p.meta["val"] for p in sub.graph.nodes if p.op == "placeholder"]) for sub in subs]
    if any(c.constants for c in captured):
        raise UnsupportedOp(f"a {kind} subgraph holds constants", node=n.name)
    val = n.meta.get("val")
    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        raise UnsupportedOp(f"{kind} gives a non-tensor", node=n.name)
    return Node(name=n.name, target=f"control.{kind}", args=[encode_arg(a, n.name, symbols) for a in args],
                control=ControlFlow(kind=kind, graphs=[c.spec for c in captured], hints=[c.hints for c in captured],
                                    carried=carried, outputs=[tensor_spec(v, symbols) for v in vals]))


FLEX_KINDS = {"flex_attention": "forward", "flex_attention_backward": "backward"}


def is_flex(n: fx.Node) -> bool:
    return isinstance(n.target, torch._ops.HigherOrderOperator) and n.target.name() in FLEX_KINDS


def flex_node(n: fx.Node, gm: fx.GraphModule, symbols: Symbols) -> Node:
    """The wire node of flex_attention or its backward (compiler_core.flex): its tensors and block
    mask tensors as arguments, its score_mod, mask_mod and joint graph captured as graphs of aten ops."""
    kind = FLEX_KINDS[n.target.name()]
    if kind == "forward":
        q, k, v, score_mod, block, scale, options, score_bufs, mask_bufs = n.args
        tensors, joint = [q, k, v], None
    else:
        q, k, v, out, lse, grad_out, grad_lse, score_mod, joint, block, scale, options, score_bufs, mask_bufs = n.args
        tensors = [q, k, v, out, lse, grad_out, grad_lse]
        if any(u.target is operator.getitem and u.args[1] == 3 for u in n.users):
            raise UnsupportedOp("flex_attention_backward with gradients of captured tensors", node=n.name)
    *block_fields, mask_mod = block
    graphs = [score_mod, mask_mod] + ([joint] if joint is not None else [])
    captured = []
    for g in graphs:
        sub = operator.attrgetter(g.target)(gm)
        c = _capture(sub, [p.meta["val"] for p in sub.graph.nodes if p.op == "placeholder"])
        if c.constants:
            raise UnsupportedOp("a flex_attention mod holds constants", node=n.name)
        captured.append(c.spec)
    val = n.meta.get("val")
    n_outputs = len(val) if kind == "forward" and isinstance(val, (tuple, list)) else 3
    opts = {str(key): value for key, value in dict(options).items()
            if isinstance(value, (bool, int, float, str)) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", str(key))}
    args = [*tensors, list(block_fields), scale, list(score_bufs), list(mask_bufs)]
    return Node(name=n.name, target=f"higher_order.{n.target.name()}", args=[encode_arg(a, n.name, symbols) for a in args],
                flex=FlexAttention(kind=kind, score_mod=captured[0], mask_mod=captured[1],
                                   joint=captured[2] if joint is not None else None, n_outputs=n_outputs,
                                   kernel_options=opts))


def capture_graph(gm: fx.GraphModule, example_inputs: list[Any]) -> Capture:
    """The GraphSpec of `gm`. get_attr constants become extra placeholders after the inputs.

    Raises UnsupportedOp for anything the wire format cannot carry (the caller runs it eagerly).
    """
    try:
        return _capture(gm, example_inputs)
    except (InvalidGraph, ValidationError) as e:  # a dtype or argument that cannot travel
        raise UnsupportedOp(f"graph cannot travel: {str(e).splitlines()[0]}") from None


def _capture(gm: fx.GraphModule, example_inputs: list[Any]) -> Capture:
    placeholders: list[Placeholder] = []
    nodes: list[Node] = []
    outputs: list[Arg] = []
    constants: list[torch.Tensor] = []
    const_placeholders: list[Placeholder] = []
    symbols = Symbols()
    groups = GroupNames()
    handed: dict[fx.Node, int] = {}  # inputs only handed on, by input position
    handed_out: tuple[tuple[int, int], ...] = ()
    kernel_results: dict[str, list[str]] = {}  # user Triton kernels' nodes: the names of their results
    inputs = iter(example_inputs)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            ex = next(inputs)
            if handed_on(n, ex):
                handed[n] = len(handed) + len(placeholders)
                continue
            if isinstance(ex, torch.SymInt):
                text = symbols.text(ex)
                if not isinstance(text, str) or not re.fullmatch(r"s[0-9]+", text):
                    raise UnsupportedOp(f"graph input {n.name} is the size expression {text}")
                placeholders.append(Placeholder(name=n.name, symbol=text))
                continue
            if not isinstance(ex, torch.Tensor):
                raise UnsupportedOp(f"graph input {n.name} is a {type(ex).__name__}, not a tensor")
            placeholders.append(Placeholder(name=n.name, spec=tensor_spec(ex, symbols)))
        elif n.op == "get_attr":
            value = operator.attrgetter(n.target)(gm)
            if isinstance(value, fx.GraphModule):
                continue  # a control flow subgraph: its node captures it (control_node)
            if not isinstance(value, torch.Tensor):
                raise UnsupportedOp(f"graph attribute {n.target} is not a tensor", node=n.name)
            constants.append(value)
            const_placeholders.append(Placeholder(name=n.name, spec=tensor_spec(value)))
        elif n.op == "call_function" and isinstance(n.meta.get("val"), torch.SymInt):
            continue  # a size computation (sym_size, s0 * 64): its users carry its expression
        elif n.op == "call_function" and is_opaque(n):
            nodes.append(opaque_node(n, symbols, groups))
        elif n.op == "call_function" and is_control(n):
            nodes.append(control_node(n, gm, symbols))
        elif n.op == "call_function" and is_flex(n):
            nodes.append(flex_node(n, gm, symbols))
        elif n.op == "call_function" and is_user_kernel(n):
            nodes.append(user_kernel_node(n, symbols))
            kernel_results[n.name] = nodes[-1].triton.cloned
        elif n.op == "call_function" and n.target is operator.getitem and n.args[0].name in kernel_results:
            # Note: the kernel's value is a dict by argument name in FX, a tuple in that order on the wire.
            index = kernel_results[n.args[0].name].index(n.args[1])
            nodes.append(Node(name=n.name, target="getitem", args=[NodeRef(name=n.args[0].name), IntArg(value=index)]))
        elif n.op == "call_function":
            if n.target is not operator.getitem and not isinstance(n.target, torch._ops.OpOverload):
                raise UnsupportedOp(f"call of {n.target} is not an aten op", node=n.name)
            if isinstance(n.target, torch._ops.OpOverload) and n.target.namespace not in ("aten", "prims"):
                raise UnsupportedOp(f"op {n.target} is outside aten/prims", op=str(n.target), node=n.name)
            nodes.append(Node(
                name=n.name, target=target_name(n.target),
                args=[encode_arg(a, n.name, symbols) for a in n.args],
                kwargs={k: encode_arg(v, n.name, symbols) for k, v in n.kwargs.items()},
            ))
        elif n.op == "output":
            (result,) = n.args
            outs = result if isinstance(result, (list, tuple)) else [result]
            outputs = [encode_arg(o, "output", symbols) for o in outs if o not in handed]
            handed_out = tuple((i, handed[o]) for i, o in enumerate(outs) if o in handed)
        else:
            raise UnsupportedOp(f"FX node kind {n.op} is not supported", node=n.name)
    spec = GraphSpec(symbols=symbols.specs, placeholders=placeholders + const_placeholders,
                     nodes=nodes, outputs=outputs)
    return Capture(spec, constants, symbols.hints, Bindings(tuple(groups.names), tuple(handed.values()), handed_out))

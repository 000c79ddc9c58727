"""Turns an aten-level FX graph and its example inputs into a GraphSpec that can travel."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import ValidationError
from torch import fx

from compiler_core.errors import InvalidGraph, UnsupportedOp
from compiler_core.wire import (
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
    Placeholder,
    StrArg,
    TensorSpec,
    dtype_name,
    target_name,
)

_MEMORY_FORMATS = {
    torch.contiguous_format: "contiguous_format",
    torch.channels_last: "channels_last",
    torch.channels_last_3d: "channels_last_3d",
    torch.preserve_format: "preserve_format",
}


@dataclass
class Capture:
    """A GraphSpec plus the tensors the graph holds as constants (passed after the inputs)."""

    spec: GraphSpec
    constants: list[torch.Tensor]


def tensor_spec(t: torch.Tensor) -> TensorSpec:
    """The spec of a concrete or fake tensor; raises UnsupportedOp for symbolic or odd tensors."""
    if t.layout != torch.strided:
        raise UnsupportedOp(f"{t.layout} tensors are not supported")
    if t.device.type not in ("cpu", "cuda"):
        raise UnsupportedOp(f"device {t.device.type} is not supported")
    try:
        sizes = [int(s) for s in t.shape]
        strides = [int(s) for s in t.stride()]
        offset = int(t.storage_offset())
    except (TypeError, RuntimeError) as e:
        raise UnsupportedOp(f"symbolic shapes are not supported yet: {e}") from None
    if any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride())):
        raise UnsupportedOp("symbolic shapes are not supported yet")
    return TensorSpec(dtype=dtype_name(t.dtype), sizes=sizes, strides=strides,
                      storage_offset=offset, device=t.device.type)


def encode_arg(a: Any, node: str) -> Arg:
    """A Python argument of an aten call as a wire argument."""
    if isinstance(a, fx.Node):
        return NodeRef(name=a.name)
    if isinstance(a, bool):
        return BoolArg(value=a)
    if isinstance(a, int):
        return IntArg(value=a)
    if isinstance(a, float):
        return FloatArg(value=a if math.isfinite(a) else ("nan" if math.isnan(a) else
                                                           ("inf" if a > 0 else "-inf")))
    if a is None:
        return NoneArg()
    if isinstance(a, str):
        return StrArg(value=a)
    if isinstance(a, torch.dtype):
        return DtypeArg(value=dtype_name(a))
    if isinstance(a, torch.device):
        return DeviceArg(value=a.type)
    if isinstance(a, torch.layout):
        if a != torch.strided:
            raise UnsupportedOp(f"layout {a} is not supported", node=node)
        return LayoutArg(value="strided")
    if isinstance(a, torch.memory_format):
        return MemoryFormatArg(value=_MEMORY_FORMATS[a])
    if isinstance(a, (list, tuple)):
        return ListArg(items=[encode_arg(x, node) for x in a])
    raise UnsupportedOp(f"argument of type {type(a).__name__} cannot travel", node=node)


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
    inputs = iter(example_inputs)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            ex = next(inputs)
            if not isinstance(ex, torch.Tensor):
                raise UnsupportedOp(f"graph input {n.name} is a {type(ex).__name__}, not a tensor")
            placeholders.append(Placeholder(name=n.name, spec=tensor_spec(ex)))
        elif n.op == "get_attr":
            value = operator.attrgetter(n.target)(gm)
            if not isinstance(value, torch.Tensor):
                raise UnsupportedOp(f"graph attribute {n.target} is not a tensor", node=n.name)
            constants.append(value)
            const_placeholders.append(Placeholder(name=n.name, spec=tensor_spec(value)))
        elif n.op == "call_function":
            if n.target is not operator.getitem and not isinstance(n.target, torch._ops.OpOverload):
                raise UnsupportedOp(f"call of {n.target} is not an aten op", node=n.name)
            if isinstance(n.target, torch._ops.OpOverload) and n.target.namespace not in ("aten", "prims"):
                raise UnsupportedOp(f"op {n.target} is outside aten/prims", op=str(n.target), node=n.name)
            nodes.append(Node(
                name=n.name, target=target_name(n.target),
                args=[encode_arg(a, n.name) for a in n.args],
                kwargs={k: encode_arg(v, n.name) for k, v in n.kwargs.items()},
            ))
        elif n.op == "output":
            (result,) = n.args
            outs = result if isinstance(result, (list, tuple)) else [result]
            outputs = [encode_arg(o, "output") for o in outs]
        else:
            raise UnsupportedOp(f"FX node kind {n.op} is not supported", node=n.name)
    spec = GraphSpec(placeholders=placeholders + const_placeholders, nodes=nodes, outputs=outputs)
    return Capture(spec, constants)

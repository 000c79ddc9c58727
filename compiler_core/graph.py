"""Rebuild an FX graph from a GraphSpec and re-derive every shape, dtype and stride with FakeTensors.

Note: the worker trusts no client metadata. Only the placeholders' specs come from the client;
each node's `meta["val"]` is recomputed here by running the aten op under FakeTensorMode, so a
spec whose ops do not fit together is rejected with an InvalidGraph naming the node.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode

from compiler_core.errors import InvalidGraph
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
    NodeRef,
    NoneArg,
    StrArg,
    TensorSpec,
    resolve_target,
    torch_dtype,
)

_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
    "preserve_format": torch.preserve_format,
}


def decode_arg(arg: Arg, env: dict[str, Any]) -> Any:
    """A wire argument as the Python value an aten op takes; node references via `env`."""
    if isinstance(arg, NodeRef):
        return env[arg.name]
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
        return [decode_arg(a, env) for a in arg.items]
    raise InvalidGraph(f"cannot decode argument {arg!r}")


def fake_input(mode: FakeTensorMode, spec: TensorSpec) -> torch.Tensor:
    with mode:
        return torch.empty_strided(spec.sizes, spec.strides, dtype=torch_dtype(spec.dtype),
                                   device=spec.device)


def rebuild_graph(spec: GraphSpec) -> fx.GraphModule:
    """An FX GraphModule equivalent to `spec`, with `meta["val"]` (a FakeTensor) on every node."""
    graph = fx.Graph()
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    nodes: dict[str, fx.Node] = {}
    fakes: dict[str, Any] = {}
    for p in spec.placeholders:
        node = graph.placeholder(p.name)
        node.meta["val"] = fakes[p.name] = fake_input(mode, p.spec)
        nodes[p.name] = node
    for n in spec.nodes:
        target = resolve_target(n.target, node=n.name)
        args = tuple(decode_arg(a, nodes) for a in n.args)
        kwargs = {k: decode_arg(v, nodes) for k, v in n.kwargs.items()}
        fake_args = tuple(decode_arg(a, fakes) for a in n.args)
        fake_kwargs = {k: decode_arg(v, fakes) for k, v in n.kwargs.items()}
        try:
            with mode:
                val = target(*fake_args, **fake_kwargs)
        except Exception as e:  # noqa: BLE001 - any failure here means the spec is wrong
            raise InvalidGraph(f"{n.target} rejects its arguments: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}",
                               op=n.target, node=n.name) from None
        if target is operator.getitem and not isinstance(fake_args[0], (tuple, list)):
            raise InvalidGraph("getitem of a non-tuple", op="getitem", node=n.name)
        node = graph.call_function(target, args, kwargs)
        node.name = n.name
        node.meta["val"] = fakes[n.name] = val
        nodes[n.name] = node
    graph.output(tuple(decode_arg(a, nodes) for a in spec.outputs))
    return fx.GraphModule(torch.nn.Module(), graph)

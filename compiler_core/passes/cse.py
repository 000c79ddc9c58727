"""Common subexpressions: a pure node that repeats an earlier one (same op, same arguments) is
replaced by it.

Note: AOTAutograd does not deduplicate an inference graph, and torch's math SDPA converts a
boolean mask into a float one inside every call: transformers' BERT on CUDA had twelve identical
`where(mask, 0, -inf)` nodes, one per layer. Fused into a softmax each is free; read by the
attention template (passes/attention.py) each was a buffer of its own, and horizontal fusion
(scheduler.hoist_kernels) wrote all twelve at the start: 96 MB alive for the whole call where one
8-MB buffer does. Only nodes that cannot differ are merged:
- aten and prims ops that write none of their arguments and draw no random numbers (never a
  custom op: a user's or a collective may do more than its schema says);
- in graphs where no op writes anything but a graph input (AOTAutograd's input mutations), so no
  merged value is written afterwards through one of its names;
- never a graph output, nor the base of one (through views): two outputs would then be one
  memory, which the caller (AOTAutograd's runtime, a CUDA graph's output copy) takes for two;
- numbers compared with their type and sign (1, 1.0 and True differ; so do 0.0 and -0.0).

It runs after the attention pass: merged first, the key and mask views that two attention calls
share would have readers outside either call's chain, which the pass leaves alone.
"""

from __future__ import annotations

import logging
import math
import operator
from typing import Any

import torch
from torch import fx

log = logging.getLogger("fxcc.passes.cse")


def merge_common(gm: fx.GraphModule) -> bool:
    """Each pure node equal to an earlier one replaced by it (see module Note); whether any was."""
    nodes = list(gm.graph.nodes)
    if _writes_intermediates(nodes):
        return False
    outputs = _output_nodes(nodes)
    seen: dict[Any, fx.Node] = {}
    merged = 0
    for node in nodes:
        if node.op != "call_function" or node in outputs or not _pure(node.target):
            continue
        try:
            key = (node.target, _key(node.args), _key(tuple(sorted(node.kwargs.items()))))
            hash(key)
        except _Unkeyable:
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        node.replace_all_uses_with(first)
        gm.graph.erase_node(node)
        merged += 1
    if merged:
        gm.recompile()
        log.info("cse: %d node(s) merged into equal earlier ones", merged)
    return merged > 0


class _Unkeyable(Exception):
    pass


def _key(a: Any) -> Any:
    """A hashable form of an argument: nodes by identity, numbers with their type (1, 1.0 and True
    are different arguments), NaN never equal to anything."""
    if isinstance(a, fx.Node):
        return ("node", a)
    if isinstance(a, (tuple, list)):
        return (type(a).__name__, tuple(_key(x) for x in a))
    if isinstance(a, float):
        if math.isnan(a):
            raise _Unkeyable
        return ("float", a.hex())  # -0.0 is not 0.0 (1 / -0.0 is -inf)
    if a is None or isinstance(a, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                   torch.memory_format)):
        return (type(a).__name__, a)
    raise _Unkeyable


# Ops whose schemas do not say that they write (batch norm in training updates its running statistics).
_HIDDEN_WRITES = frozenset({"native_batch_norm", "batch_norm", "cudnn_batch_norm", "miopen_batch_norm",
                            "_batch_norm_impl_index", "instance_norm"})


def _pure(target: Any) -> bool:
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims") \
            or target._schema.name.split("::")[-1] in _HIDDEN_WRITES:
        return False  # a custom op (a user's, a collective) may do more than its schema says
    schema = target._schema
    if schema.is_mutable or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    return torch.Tag.nondeterministic_seeded not in target.tags


def _writes_intermediates(nodes: list[fx.Node]) -> bool:
    """Whether an op writes an argument that is not a graph input, or writes an input before the
    graph's last reads (AOTAutograd's write-backs come after everything else)."""
    written = False
    for node in nodes:
        if written and node.op not in ("output", "placeholder") and not _writes(node):
            return True
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            if node.op == "call_function" and getattr(target, "__module__", None) not in ("_operator", "math") \
                    and not getattr(target, "__name__", "").startswith("sym_"):
                return True  # a Python function that is not arithmetic on sizes: what it does is unknown
            continue
        for i, arg in enumerate(target._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            values = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, fx.Node) and v.op != "placeholder" for v in values):
                return True
            written = True
    return False


def _writes(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and any(
        a.alias_info is not None and a.alias_info.is_write for a in target._schema.arguments)


def _output_nodes(nodes: list[fx.Node]) -> set[fx.Node]:
    """The graph's outputs and every node whose storage one of them shares (the bases of output
    views, through chains of views): merging two such would make two outputs one memory."""
    out: set[fx.Node] = set()
    for n in nodes:
        if n.op == "output":
            fx.node.map_arg(n.args, lambda x: out.add(x) or x)
    for n in reversed(nodes):
        if n in out and n.op == "call_function" and _aliases(n.target):
            fx.node.map_arg((n.args, n.kwargs), lambda x: out.add(x) or x)
    return out


def _aliases(target: Any) -> bool:
    """Whether a call of `target` may return (part of) an argument's storage: a view, getitem, or
    an op of unknown kind."""
    if target is operator.getitem or not isinstance(target, torch._ops.OpOverload):
        return True
    return any(r.alias_info is not None for r in target._schema.returns)

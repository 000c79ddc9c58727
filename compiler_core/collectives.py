"""Collectives in a graph: torch's functional collectives (`_c10d_functional`), which travel as
opaque nodes (compiler_core/opaque.py) that the client runs on its own process groups, each group
named in the graph by a binding, never by its name.

Note: tensor parallelism (DTensor) and functional collectives traced by Dynamo put
`_c10d_functional.all_reduce(x, "sum", "<group name>")` and its `wait_tensor` into graphs. A
group's name is a process-local counter ("0", "3", ...) that differs between two jobs of one model,
so it never enters a key: the client writes a graph's groups as `group0`, `group1`, ... in order of
first use (`binding`) and keeps their names; the plan it loads binds each to the caller's group at
run time (client/process_groups.py). A graph that names a group otherwise is refused (`check_node`),
so no artifact under a shared key can hold one rank's group. Everything else of a collective's
result (its sizes and dtype, a gather's or scatter's group size) is in the graph as for any op.
Like every opaque op, a collective is an extern step in graph order, the worker never looks it up,
kernels fuse up to it and from its `wait_tensor` on, and its result counts as possibly sharing its
inputs' storage (plan._may_alias), so nothing reuses the storage `wait_tensor` hands back.
"""

from __future__ import annotations

import re
from typing import Any

from fxcc.compiler_core.errors import InvalidGraph

# Wire target of each collective → the positions of its group and (for a reduction) its reduce op;
# wait_tensor takes neither.
_ARGS: dict[str, tuple[int | None, int | None]] = {
    "_c10d_functional.all_reduce.default": (2, 1),
    "_c10d_functional.all_reduce_coalesced.default": (2, 1),
    "_c10d_functional.all_gather_into_tensor.default": (2, None),
    "_c10d_functional.all_gather_into_tensor_coalesced.default": (2, None),
    "_c10d_functional.reduce_scatter_tensor.default": (3, 1),
    "_c10d_functional.reduce_scatter_tensor_coalesced.default": (3, 1),
    "_c10d_functional.broadcast.default": (2, None),
    "_c10d_functional.all_to_all_single.default": (3, None),
    "_c10d_functional.wait_tensor.default": (None, None),
    "_c10d_functional_autograd.all_gather_into_tensor.default": (2, None),
    "_c10d_functional_autograd.reduce_scatter_tensor.default": (3, 1),
    "_c10d_functional_autograd.all_to_all_single.default": (3, None),
    "_dtensor.shard_dim_alltoall.default": (3, None),
}
OPS: frozenset[str] = frozenset(_ARGS)
REDUCE_OPS = frozenset({"sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum"})
MAX_GROUPS = 64
_BINDING_RE = re.compile(r"group([0-9]{1,2})")


def binding(index: int) -> str:
    """How a graph names the `index`-th process group it uses."""
    if not 0 <= index < MAX_GROUPS:
        raise ValueError(f"a graph may use at most {MAX_GROUPS} process groups")
    return f"group{index}"


def binding_index(text: str) -> int | None:
    """The group index a binding names, or None for anything that is not a binding."""
    m = _BINDING_RE.fullmatch(text)
    return int(m.group(1)) if m is not None and int(m.group(1)) < MAX_GROUPS else None


def group_slot(target: str) -> int | None:
    """Where a collective takes its group (None for wait_tensor and for any other op)."""
    return _ARGS.get(target, (None, None))[0]


def check_node(target: str, args: list[Any], node: str) -> None:
    """A collective node's group argument must be a binding, its reduction a known one: InvalidGraph
    (a 422 in the service) otherwise."""
    group_at, reduce_at = _ARGS[target]
    if group_at is None:
        return
    if len(args) <= group_at:
        raise InvalidGraph(f"{target} takes its process group as argument {group_at}", op=target, node=node)
    group = args[group_at]
    if getattr(group, "kind", None) != "str" or binding_index(group.value) is None:
        raise InvalidGraph(f"{target} names its process group by a binding (group0, group1, ...), "
                           "never by the group's name", op=target, node=node)
    reduce_op = args[reduce_at] if reduce_at is not None else None
    if reduce_op is not None and (getattr(reduce_op, "kind", None) != "str" or reduce_op.value not in REDUCE_OPS):
        raise InvalidGraph(f"{target} takes one of the reductions {sorted(REDUCE_OPS)}", op=target, node=node)

"""Process groups for fxcc's client: one rank standing in for a whole job (`fxcc precompile
--world-size N`), and the binding of a plan's collectives to the caller's groups at run time
(compiler_core/collectives.py says why a group's name never travels).

Note: a distributed script's graphs depend on its world size (a tensor-parallel shard's sizes, an
all-gather's group size) but never on which rank traces them, nor on the names of its groups
(kept out of every key). So one process that believes it is rank 0 of N traces the graphs that
every rank of an N-rank job will ask for: under torch's fake process group, whose collectives move
no data, the script runs through without the other ranks.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from fxcc.compiler_core import collectives
from fxcc.compiler_core.errors import ArtifactError, UnsupportedOp


def stand_in_for_job(world_size: int, rank: int = 0) -> None:
    """Make this process rank `rank` of a `world_size`-rank job whose every collective is fake:
    torchrun's environment variables are set, and `torch.distributed.init_process_group` (also
    when DeviceMesh calls it) makes a fake group of that size, whatever backend the script asks."""
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("this torch has no torch.distributed")
    _register_fake_backend()
    for name, value in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", world_size),
                        ("LOCAL_WORLD_SIZE", world_size), ("GROUP_RANK", 0)):
        os.environ[name] = str(value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    real = dist.init_process_group
    if getattr(real, "_fxcc_stand_in", False):
        return

    @functools.wraps(real)
    def init_fake(*args: Any, **kwargs: Any) -> Any:
        for name in ("backend", "init_method", "store", "rank", "world_size"):
            kwargs.pop(name, None)
        args = args[1:] if args else args  # the backend, when given positionally
        return real(*args, backend="fake", store=_fake_store(), rank=rank, world_size=world_size, **kwargs)

    init_fake._fxcc_stand_in = True  # type: ignore[attr-defined]
    dist.init_process_group = init_fake
    dist.distributed_c10d.init_process_group = init_fake
    from torch.distributed import device_mesh

    if hasattr(device_mesh, "init_process_group"):  # imported by name there: init_device_mesh calls it
        device_mesh.init_process_group = init_fake
    _ddp_keeps_gradients()


def _ddp_keeps_gradients() -> None:
    """DDP under the fake group: each bucket's all-reduce hands back the bucket as it is.

    Note: the fake group's works complete with no value, where DDP's reducer expects the reduced
    bucket (an internal assert in backward). A comm hook that returns the bucket unreduced lets
    the backward run; its values do not matter to the graphs traced."""
    from torch.nn.parallel import DistributedDataParallel

    init = DistributedDataParallel.__init__
    if getattr(init, "_fxcc_stand_in", False):
        return

    def unreduced(state: Any, bucket: Any) -> Any:
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done
    # DDP checks the hook's annotations as objects (this module's are strings)
    unreduced.__annotations__ = {"state": object, "bucket": torch.distributed.GradBucket,
                                 "return": torch.futures.Future[torch.Tensor]}

    @functools.wraps(init)
    def init_unreduced(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.register_comm_hook(None, unreduced)

    init_unreduced._fxcc_stand_in = True  # type: ignore[attr-defined]
    DistributedDataParallel.__init__ = init_unreduced


def _register_fake_backend() -> None:
    """torch's fake process-group backend (registered when its module is imported)."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401


def _fake_store() -> Any:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


# ---------------------------------------------------------------- a graph's groups, bound at run time


@dataclass(frozen=True)
class Bindings:
    """What a captured graph takes from its process, kept out of its spec and key: the names of the
    process groups its collectives use (the plan's `group<i>`), the positions of inputs that are only
    handed on (a DTensor's DeviceMesh, an opaque object AOTAutograd passes to the graph and back out),
    and which outputs are such inputs: (output position, input position)."""

    groups: tuple[str, ...] = ()
    handed_on: tuple[int, ...] = ()
    outputs: tuple[tuple[int, int], ...] = ()


class GroupNames:
    """The process groups of one graph being captured, numbered in order of first use."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def bind(self, target: str, args: tuple[Any, ...], node: str) -> tuple[Any, ...]:
        """`args` of a collective node with its group replaced by the group's binding."""
        slot = collectives.group_slot(target)
        if slot is None or len(args) <= slot:
            return args
        name = _group_name(args[slot], node)
        if name not in self.names:
            self.names.append(name)
        return (*args[:slot], collectives.binding(self.names.index(name)), *args[slot + 1:])


def _group_name(group: Any, node: str) -> str:
    """A collective's group argument (its name, or a ProcessGroup) as the group's name."""
    if isinstance(group, str):
        return group
    name = getattr(group, "group_name", None)
    if isinstance(name, str):
        return name
    raise UnsupportedOp(f"a collective's group of type {type(group).__name__} cannot be bound", node=node)


def handed_on(node: fx.Node, example: Any) -> bool:
    """Whether a graph input that is no tensor nor size is only handed on: nothing but the graph's
    output reads it (torch 2.13's AOTAutograd passes a DTensor's DeviceMesh so)."""
    if isinstance(example, (torch.Tensor, torch.SymInt)):
        return False
    return all(user.op == "output" for user in node.users)


def bind_group(step_args: list[Any], slot: int, groups: tuple[str, ...], op: str) -> str:
    """The caller's group name for a plan step's `group<i>` argument."""
    arg = step_args[slot] if slot < len(step_args) else None
    index = collectives.binding_index(getattr(arg, "value", "")) if getattr(arg, "kind", None) == "str" else None
    if index is None or index >= len(groups):
        raise ArtifactError(f"{op} names a process group this plan was not bound to ({arg})", node=op)
    return groups[index]


def hand_on(runner: Callable[[list[Any]], Any], bindings: Bindings) -> Callable[[list[Any]], Any]:
    """`runner` called with every graph input (and constants after them): the inputs only handed on
    are left out of the plan's call, and put back into the graph's outputs where they belong."""
    if not bindings.handed_on:
        return runner
    skipped = frozenset(bindings.handed_on)
    outputs = sorted(bindings.outputs)

    def run(args: list[Any]) -> Any:
        result = list(runner([a for i, a in enumerate(args) if i not in skipped]))
        for position, i in outputs:
            result.insert(position, args[i])
        return tuple(result)
    return run

"""Process groups for fxcc's client: one rank standing in for a whole job (`fxcc precompile
--world-size N`), and the binding of a plan's collectives to the caller's groups at run time.

Note: a distributed script's graphs depend on its world size (a tensor-parallel shard's sizes, an
all-gather's group size) but never on which rank traces them, nor on the names of its groups
(kept out of every key). So one process that believes it is rank 0 of N traces the graphs that
every rank of an N-rank job will ask for: under torch's fake process group, whose collectives move
no data, the script runs through without the other ranks.
"""

from __future__ import annotations

import functools
import os
from typing import Any


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
    import torch
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

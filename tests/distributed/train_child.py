"""A training job run by torchrun (one process per rank, gloo on CPU): the same tiny model trained a
few steps eagerly and with torch.compile(backend="fxcc"), under DDP, FSDP2 or tensor parallelism.
Each rank writes its losses (both runs) and the key and source of every graph fxcc got to
OUT/rank<N>.json. Each rank has its own FXCC_CACHE_DIR (FXCC_CACHE_ROOT/rank<N>).

FXCC_RANKS_DEVICE=cuda (tests/gpu/test_ranks_gpu.py): each rank on GPU LOCAL_RANK % the GPUs there
are, NCCL when every rank has a GPU of its own, else gloo (NCCL refuses two ranks on one GPU)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

RANK = int(os.environ["RANK"])
DEVICE = os.environ.get("FXCC_RANKS_DEVICE", "cpu")
if os.environ.get("FXCC_CACHE_ROOT"):
    os.environ["FXCC_CACHE_DIR"] = str(Path(os.environ["FXCC_CACHE_ROOT"]) / f"rank{RANK}")

import torch
import torch.distributed as dist
from torch import nn

STEPS = 3
BATCH = 4


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(torch.nn.functional.gelu(self.up(x)))
        return self.head(torch.tanh(h) + x)


def build(kind: str, width: int) -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank and in both runs
    model = MLP(width).to(device())
    world = dist.get_world_size()
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # Buckets smaller than one layer's gradients, so that DDPOptimizer splits the graph per
        # bucket (DDP and DDPOptimizer read the first bucket's cap, 1 MiB, from this constant).
        cap = width * width * 4
        dist._DEFAULT_FIRST_BUCKET_BYTES = cap
        return DistributedDataParallel(model, bucket_cap_mb=cap / 2**20)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(DEVICE, (world,))
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in (model.up, model.down, model.head):
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if kind == "tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        return parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    raise SystemExit(f"unknown parallelism {kind}")


def device() -> torch.device:
    if DEVICE == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", RANK)) % torch.cuda.device_count())
    return torch.device("cpu")


def process_group_backend() -> str:
    if DEVICE != "cuda":
        return "gloo"
    return "nccl" if torch.cuda.device_count() >= int(os.environ["WORLD_SIZE"]) else "gloo"


def train(model: nn.Module, width: int) -> list[float]:
    # One tensor at a time: under TP the unsharded head's parameters are plain tensors beside the
    # sharded layers' DTensors, a mix that torch 2.11's foreach kernels refuse.
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    # TP: every rank sees the same batch; DDP and FSDP: each rank its own.
    gen = torch.Generator().manual_seed(1000 + (0 if os.environ["FXCC_PARALLEL"] == "tp" else RANK))
    losses = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, width, generator=gen).to(device())
        y = torch.randn(BATCH, 4, generator=gen).to(device())
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--width", type=int, default=16)
    args = p.parse_args()
    kind = os.environ["FXCC_PARALLEL"]
    if DEVICE == "cuda":
        torch.cuda.set_device(device())
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group(process_group_backend())
    eager = train(build(kind, args.width), args.width)
    from torch._dynamo.utils import counters

    from fxcc.client.backend import aot_runs, events

    compiled = torch.compile(build(kind, args.width), backend="fxcc")
    losses = train(compiled, args.width)
    rows = [{"key": e.key, "source": e.source, "error": e.error, "job_id": e.job_id,
             "kernels": e.stats.kernels if e.stats else 0,
             "extern_ops": e.stats.extern_ops if e.stats else []} for e in events()]
    Path(args.out, f"rank{RANK}.json").write_text(json.dumps(
        {"rank": RANK, "world": dist.get_world_size(), "backend": dist.get_backend(), "device": str(device()),
         "eager": eager, "fxcc": losses, "events": rows,
         "dynamo_graphs": counters["stats"]["unique_graphs"], "aot_graphs": aot_runs()}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

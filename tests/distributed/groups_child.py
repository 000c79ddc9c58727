"""Run by torchrun on 4 ranks (gloo, CPU): one function with an all-reduce, compiled with fxcc for
two process groups of each rank (its pair, {0, 1} or {2, 3}, and the whole world): groups of other
names and sizes, one graph and one key. Each rank writes its groups' names, the events' keys and
sources, and both results to OUT/rank<N>.json."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def compiled_for(group: dist.ProcessGroup):
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(funcol.all_reduce(torch.relu(x) * 2, "sum", group)) + 1
    return torch.compile(f, backend="fxcc")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--width", type=int, default=8)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    os.environ["FXCC_CACHE_DIR"] = str(Path(os.environ["FXCC_CACHE_ROOT"]) / f"rank{rank}")
    dist.init_process_group("gloo")
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes both
    pair, world = pairs[rank // 2], dist.group.WORLD
    from fxcc.client.backend import events

    x = torch.full((4, args.width), 0.1 * (rank + 1))
    results = {name: compiled_for(group)(x).flatten().tolist() for name, group in (("pair", pair), ("world", world))}
    Path(args.out, f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "groups": [dist.distributed_c10d._get_process_group_name(g) for g in (pair, world)],
        "events": [{"key": e.key, "source": e.source, "error": e.error,
                    "extern_ops": e.stats.extern_ops if e.stats else []} for e in events()],
        "results": results}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

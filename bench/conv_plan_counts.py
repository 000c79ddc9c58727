"""What fxcc's plans launch for a ResNet-18 training step (forward and backward), counted on a CPU.

`TRITON_INTERPRET=1 python -m bench.conv_plan_counts [--channels-last]`: ResNet-18's structure
(torchvision's: 7×7 stem, max pool, four stages of two basic blocks, 64 to 512 channels) at a CPU
size (batch 2, 64×64), one training step through fxcc, and per graph: plan steps (by kind), Triton
kernels, extern calls that launch work (views and tuple items aside) by op, views and tuple items,
and nodes; for the step, how many parameter gradients AccumulateGrad copies into their parameter's
layout (each one more launch on the host). `--channels-last` lets the layout
pass run for the CPU interpreter as it runs for CUDA targets, so the plans are those a GPU worker
makes. Counts, not timings: a plan's steps do not depend on the device it runs on.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

NO_LAUNCH = {"getitem", "aten.view.default", "aten.unsqueeze.default", "aten.permute.default",
             "aten.squeeze.dim", "aten.squeeze.dims", "aten.alias.default", "aten.expand.default",
             "aten.as_strided.default", "aten.t.default", "aten.reshape.default", "aten._unsafe_view.default",
             "aten.empty_strided.default"}


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        widths, blocks, cin = (64, 128, 256, 512), [], 64
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--size", type=int, default=64)
    args = ap.parse_args()
    os.environ.setdefault("FXCC_CACHE_DIR", tempfile.mkdtemp(prefix="fxcc-counts-"))
    os.environ["FXCC_FALLBACK"] = "error"
    if args.channels_last:
        from fxcc.compiler_core.passes import layout

        layout.TARGETS = layout.TARGETS | {"interpret"}
        layout.DEVICES = layout.DEVICES | {"cpu"}
    from fxcc.client import backend
    from fxcc.client.cache import LocalCache
    from fxcc.client.settings import ClientSettings

    torch.manual_seed(0)
    model = ResNet18()
    x, y = torch.randn(2, 3, args.size, args.size), torch.randint(0, 1000, (2,))
    # A gradient laid out unlike its parameter is copied by AccumulateGrad (one more launch each).
    relaid = []
    for p in model.parameters():
        p.register_hook(lambda g, p=p: relaid.append(_strides_differ(g, p)))
    F.cross_entropy(torch.compile(model, backend="fxcc")(x), y).backward()
    cache = LocalCache(ClientSettings.from_env().cache_dir)
    total = {"kernels": 0, "externs": 0}
    for name, e in zip(("forward", "backward"), backend.events()):
        art = cache.get(e.key)
        ops = Counter(s.op for s in art.manifest.plan.steps if s.kind == "extern" and s.op not in NO_LAUNCH)
        steps = art.manifest.plan.steps
        kernels = sum(1 for s in steps if s.kind == "kernel")
        views = sum(1 for s in steps if s.kind == "extern" and s.op in NO_LAUNCH)
        total["kernels"] += kernels
        total["externs"] += sum(ops.values())
        print(json.dumps({"graph": name, "nodes": e.stats.nodes, "steps": len(steps),
                          "steps_by_kind": dict(Counter(s.kind for s in steps)), "kernels": kernels,
                          "externs": sum(ops.values()), "views_and_items": views, "extern_ops": dict(ops)}))
    print(json.dumps({"step": total, "launches": total["kernels"] + total["externs"],
                      "accumulate_grad_copies": sum(relaid)}))


def _strides_differ(grad: torch.Tensor, param: torch.Tensor) -> bool:
    """Whether AccumulateGrad re-lays `grad` out as `param` (strides of size-1 dims aside)."""
    return any(n != 1 and a != b for n, a, b in zip(param.shape, grad.stride(), param.stride()))


if __name__ == "__main__":
    main()

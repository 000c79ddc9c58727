"""The seed articles' workloads, shared by the demo, the tests and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def cos_sin(x: torch.Tensor) -> torch.Tensor:
    """The seed's fusion example: one kernel, no buffer for sin(x)."""
    return torch.cos(torch.sin(x))


class BiasGeluLayerNorm(nn.Module):
    """The seed's memory-bound chain: bias add, GELU, LayerNorm."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(d) * 0.1)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(x + self.bias))


class TransformerBlock(nn.Module):
    """The seed's TransformerBlock (attention, two LayerNorms, a GELU MLP, residuals)."""

    def __init__(self, d_model: int = 1024, nhead: int = 16) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, nhead, batch_first=True)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_model * 4),
            nn.GELU(),
            nn.Linear(d_model * 4, d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn_out, _ = self.attn(x, x, x)
        x = self.norm1(x + attn_out)
        mlp_out = self.mlp(x)
        return self.norm2(x + mlp_out)


@dataclass
class Workload:
    name: str
    fn: Any
    inputs: tuple[torch.Tensor, ...]


def seed_workloads(device: str = "cpu", small: bool = True, seed: int = 0) -> list[Workload]:
    """The three seed examples; `small` picks CPU-friendly sizes (for the demo and tests)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    n, rows, d, (b, s, dm, h) = ((4096, 64, 256, (2, 32, 64, 4)) if small
                                 else (1 << 26, 16384, 1024, (32, 512, 1024, 16)))
    block = TransformerBlock(dm, h).to(device).eval()
    bgl = BiasGeluLayerNorm(d).to(device).eval()
    return [
        Workload("cos(sin(x))", cos_sin, (torch.randn(n, generator=g).to(device),)),
        Workload("bias+GELU+LayerNorm", bgl, (torch.randn(rows, d, generator=g).to(device),)),
        Workload("TransformerBlock", block, (torch.randn(b, s, dm, generator=g).to(device),)),
    ]

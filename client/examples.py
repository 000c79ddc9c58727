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


class GPT2Block(nn.Module):
    """A GPT-2-style decoder block: pre-LN causal self-attention and a GELU(tanh) MLP, residuals."""

    def __init__(self, d: int = 768, heads: int = 12) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """A GPT-2-shaped decoder: token and position embeddings, `layers` blocks, final LN, LM head."""

    def __init__(self, vocab: int = 50257, d: int = 768, layers: int = 12, heads: int = 12,
                 max_seq: int = 1024) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_seq, d)
        self.blocks = nn.ModuleList(GPT2Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    """A Llama-style block: RMSNorm, rotary embeddings, causal attention, SwiGLU MLP."""

    def __init__(self, d: int = 256, heads: int = 4, hidden: int = 688, max_seq: int = 512) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        hd = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(max_seq).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.norm1(x)
        q, k, v = (w(h).view(b, s, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        cos, sin = self.cos[:s], self.sin[:s]
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(att.transpose(1, 2).reshape(b, s, d))
        h = self.norm2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Bottleneck(nn.Module):
    """A ResNet bottleneck: 1×1, 3×3, 1×1 convolutions, each with BatchNorm and ReLU, residual."""

    def __init__(self, cin: int = 64, width: int = 16, stride: int = 1) -> None:
        super().__init__()
        cout = width * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    """A ResNet-50-shaped network (3, 4, 6, 3 bottlenecks) built from torch.nn, no downloads."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def model_blocks(seed: int = 0) -> dict[str, tuple[nn.Module, torch.Tensor]]:
    """The model blocks at test size, each with an input: the same models and weights per seed."""
    torch.manual_seed(seed)
    return {
        "transformer": (TransformerBlock(64, 4), torch.randn(2, 16, 64)),
        "gpt2": (GPT2Block(64, 4), torch.randn(2, 16, 64)),
        "llama": (LlamaBlock(64, 4, 172, 32), torch.randn(2, 16, 64)),
        "bottleneck": (Bottleneck(32, 8, 2), torch.randn(2, 32, 8, 8)),
    }

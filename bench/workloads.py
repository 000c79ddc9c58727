"""The benchmark workloads (issue 7): name -> model, inputs, dtype, and bytes a fused version must move."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fxcc.client.examples import GPT2, BiasGeluLayerNorm, ResNet50, TransformerBlock, cos_sin


@dataclass
class BenchWorkload:
    name: str
    dtype: str
    fn: Callable[..., Any]
    inputs: tuple[torch.Tensor, ...]
    min_bytes: int | None  # fewest bytes through memory (each input read, output written once)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def _bgl(dtype: torch.dtype, device: str) -> BenchWorkload:
    rows, d = 16384, 1024
    model = BiasGeluLayerNorm(d).to(device=device, dtype=dtype).eval()
    x = torch.randn(rows, d, device=device, dtype=dtype)
    name = "bias_gelu_ln_" + ("fp32" if dtype == torch.float32 else "bf16")
    return BenchWorkload(name, str(dtype).removeprefix("torch."), model, (x,), 2 * x.nbytes)


def _cos_sin(device: str) -> BenchWorkload:
    x = torch.randn(1 << 26, device=device)
    return BenchWorkload("cos_sin", "float32", cos_sin, (x,), 2 * x.nbytes)


def _softmax_wl(device: str) -> BenchWorkload:
    x = torch.randn(16384, 4096, device=device)
    return BenchWorkload("softmax", "float32", _softmax, (x,), 2 * x.nbytes)


def _transformer_block(device: str) -> BenchWorkload:
    model = TransformerBlock(1024, 16).to(device).eval()
    x = torch.randn(32, 512, 1024, device=device)
    return BenchWorkload("transformer_block", "float32", model, (x,), None)


def _gpt2(device: str) -> BenchWorkload:
    model = GPT2().to(device).eval()  # 12 layers, d 768, 12 heads
    ids = torch.randint(0, 50257, (8, 512), device=device)
    return BenchWorkload("gpt2_small", "float32", model, (ids,), None)


def _resnet50(device: str) -> BenchWorkload:
    model = ResNet50().to(device).eval()
    x = torch.randn(32, 3, 224, 224, device=device)
    return BenchWorkload("resnet50", "float32", model, (x,), None)


WORKLOADS: dict[str, Callable[[str], BenchWorkload]] = {
    "cos_sin": _cos_sin,
    "bias_gelu_ln_fp32": lambda device: _bgl(torch.float32, device),
    "bias_gelu_ln_bf16": lambda device: _bgl(torch.bfloat16, device),
    "softmax": _softmax_wl,
    "transformer_block": _transformer_block,
    "gpt2_small": _gpt2,
    "resnet50": _resnet50,
}
FAST = ("cos_sin", "bias_gelu_ln_fp32", "bias_gelu_ln_bf16", "softmax")
MODELS = ("transformer_block", "gpt2_small", "resnet50")


def _tiny(name: str) -> BenchWorkload:
    """A CPU-sized version of `name` (Triton's interpreter runs it in well under a second)."""
    if name == "cos_sin":
        return BenchWorkload(name, "float32", cos_sin, (torch.randn(4096),), None)
    if name == "softmax":
        return BenchWorkload(name, "float32", _softmax, (torch.randn(64, 128),), None)
    if name == "bias_gelu_ln_fp32":
        return BenchWorkload(name, "float32", BiasGeluLayerNorm(256).eval(), (torch.randn(64, 256),), None)
    if name == "transformer_block":
        return BenchWorkload(name, "float32", TransformerBlock(64, 4).eval(), (torch.randn(2, 32, 64),), None)
    raise KeyError(f"no tiny version of {name!r}; tiny: {', '.join(TINY)}")


TINY = ("cos_sin", "softmax", "bias_gelu_ln_fp32", "transformer_block")


def make_workload(name: str, device: str = "cuda", seed: int = 0, tiny: bool = False) -> BenchWorkload:
    """The workload `name` on `device`; `tiny`: a CPU-sized version for checking the scripts here."""
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    torch.manual_seed(seed)
    return _tiny(name) if tiny else WORKLOADS[name](device)

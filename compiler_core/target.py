"""What a compile target's kernels can do: asked by passes and lowering, which never ask codegen.

A target is `"cuda"` (Triton for NVIDIA GPUs, with libdevice) or `"interpret"` (Triton's CPU
interpreter, which has no libdevice). codegen spells exactly the math named here for its target
(codegen/triton.py checks its tables against these sets when it loads), and renders the attention
template for the head dims and dtypes named here; a lowering that needs anything else externs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Unary math with an exact spelling on every target, and per target (libdevice on CUDA; the
# interpreter's tl.* forms and fxcc's own exact compositions).
COMMON_UNARY = frozenset({"normal_cdf", "abs", "neg", "bitwise_not", "logical_not", "reciprocal", "isnan",
                          "isinf", "isfinite"})
CUDA_UNARY = frozenset({"sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
                        "atanh", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "erf",
                        "floor", "ceil", "trunc", "round", "sigmoid"})
INTERPRET_UNARY = frozenset({"sin", "cos", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "erf", "floor", "ceil",
                             "sigmoid", "tanh", "trunc", "log1p", "expm1"})
COMMON_BINARY = frozenset({"add", "sub", "mul", "truediv", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
                           "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "maximum",
                           "minimum", "fmod"})
CUDA_BINARY = frozenset({"pow"})

# fxcc's flash-attention template: head dims that tl.dot takes (K >= 16) and whose tiles fit
# registers; input dtypes it serves. Note: fp16/bf16 attention stays on aten's flash kernel (FA2,
# tuned per arch, with warp-specialised Hopper variants in newer torch): the template has no claim
# to be faster there, and has not been measured against it. fp32 runs only with TF32 allowed
# (compile option `allow_tf32`); exact fp32 keeps aten's kernel.
ATTENTION_HEAD_DIMS = (16, 32, 64, 128)
ATTENTION_DTYPES = (torch.float32,)

# Streaming multiprocessors per CUDA arch, for occupancy decisions (how many programs fill the GPU).
# Note: an arch names a family, not a part (an sm_80 A30 has 56 SMs, an A100 108): the count of the
# part fxcc's numbers were measured on. Lowering sees only the target's kind, so a CUDA target
# without its arch counts as sm_90 (H100/H200).
SM_COUNTS = {70: 80, 75: 40, 80: 108, 86: 84, 89: 128, 90: 132, 100: 148, 120: 170}
DEFAULT_CUDA_ARCH = 90


def sm_count(arch: int) -> int:
    """The SMs of `arch`'s reference part (an unknown arch counts as the nearest older one's)."""
    known = [a for a in SM_COUNTS if a <= arch]
    return SM_COUNTS[max(known)] if known else SM_COUNTS[min(SM_COUNTS)]


@dataclass(frozen=True)
class Capabilities:
    """One target's answers, for passes and lowerings to ask."""

    target: str
    unary: frozenset[str]
    binary: frozenset[str]
    attention_head_dims: tuple[int, ...] = ATTENTION_HEAD_DIMS
    attention_dtypes: tuple[torch.dtype, ...] = ATTENTION_DTYPES
    # The device's SMs, which reduction splits fill (0: no occupancy model: the interpreter runs
    # one program at a time, and its reductions keep the rule of few outputs over very long rows).
    sm_count: int = 0

    def spells(self, op: str) -> bool:
        """Whether the target's kernels compute `op` exactly (lowerings extern the rest)."""
        return op in self.unary or op in self.binary


_CAPABILITIES = {
    "cuda": Capabilities("cuda", COMMON_UNARY | CUDA_UNARY, COMMON_BINARY | CUDA_BINARY,
                         sm_count=sm_count(DEFAULT_CUDA_ARCH)),
    "interpret": Capabilities("interpret", COMMON_UNARY | INTERPRET_UNARY, COMMON_BINARY),
}


def capabilities(target: str) -> Capabilities:
    """The capabilities of `target` ("cuda"; anything else compiles for the interpreter)."""
    return _CAPABILITIES["cuda" if target == "cuda" else "interpret"]

"""The client's numeric settings that change what a compiled graph may compute (sent in CompileOptions)."""

from __future__ import annotations

import torch


def matmul_allows_tf32() -> bool:
    """Whether eager's fp32 matmuls may round their inputs to TF32 here, now.

    Note: torch >= 2.9 has a second API (`torch.backends.cuda.matmul.fp32_precision`, "tf32" /
    "ieee", "none" while unset); once it was set, reading the legacy `allow_tf32` raises. The new
    one wins when set; when neither can be read, exact fp32 (never a looser answer than eager's).
    """
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision in ("tf32", "ieee"):
        return precision == "tf32"
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:
        return False

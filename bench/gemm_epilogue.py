"""Micro-benchmark: would a Triton GEMM with its pointwise epilogue fused beat cuBLAS plus a
separate pointwise kernel at the transformer shapes of the `models` suite? (issue 19: the fp32
language-model rows spend ~65% of their device time in cuBLAS; the rest is the pointwise and
normalization kernels around it.)

    python3 -m bench.gemm_epilogue --out $OUT          # GPU; one JSON line per shape, and DIR/gemm-epilogue.json
    TRITON_INTERPRET=1 .venv/bin/python -m bench.gemm_epilogue --device cpu --tiny   # checks the kernel only

For each (M, K, N, epilogue) it times, with triton.testing.do_bench in one process:
`cublas`: torch.addmm (TF32 on for fp32), the epilogue not applied; `cublas_epilogue`: addmm and then
the epilogue as one Triton pointwise kernel (what fxcc and Inductor run today); `triton_fused`: the
best of a few configs of a plain Triton tiled GEMM (this file's) with bias and epilogue applied to
the accumulator before its one store. Shapes are those of transformers' BERT-base (batch 8, seq 512),
GPT-2 (batch 4, seq 512), T5-small's encoder and ViT-B/16 (batch 16) as bench/model_zoo.py builds them.
Not a headline: it decides whether a GEMM template is worth building.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
import triton
import triton.language as tl

# (name, M, K, N, epilogue): bias always; "gelu" erf GELU (BERT, ViT), "gelu_tanh" (GPT-2's gelu_new),
# "relu" (T5, no bias there: bias of zeros costs the same read), "residual" adds an [M, N] tensor.
SHAPES = [
    ("bert_ffn_up", 4096, 768, 3072, "gelu"),
    ("bert_ffn_down", 4096, 3072, 768, "residual"),
    ("bert_qkv_each", 4096, 768, 768, "none"),
    ("gpt2_qkv", 2048, 768, 2304, "none"),
    ("gpt2_ffn_up", 2048, 768, 3072, "gelu_tanh"),
    ("gpt2_ffn_down", 2048, 3072, 768, "residual"),
    ("t5_ffn_up", 4096, 512, 2048, "relu"),
    ("vit_ffn_up", 3152, 768, 3072, "gelu"),
]
TINY = [("tiny", 64, 32, 48, e) for e in ("gelu", "gelu_tanh", "relu", "residual", "none")]

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)
CONFIGS = [
    (128, 128, 32, 8, 4, 4), (128, 128, 32, 8, 8, 3), (128, 256, 32, 8, 8, 3), (64, 128, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4), (128, 128, 64, 8, 8, 3), (256, 128, 32, 8, 8, 3), (64, 256, 32, 8, 8, 3),
]


@triton.jit
def _epilogue(acc, EPI: tl.constexpr):
    if EPI == "gelu":
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    elif EPI == "gelu_tanh":
        inner = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = 0.5 * acc * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0))
    elif EPI == "relu":
        acc = tl.maximum(acc, 0.0)
    return acc


@triton.jit
def _gemm(A, B, bias, R, C, M, N, K, sam, sak, sbk, sbn, scm, EPI: tl.constexpr, PREC: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(A + rm[:, None] * sam + (k0 + rk)[None, :] * sak,
                    mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
        b = tl.load(B + (k0 + rk)[:, None] * sbk + rn[None, :] * sbn,
                    mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PREC)
    ok = (rm[:, None] < M) & (rn[None, :] < N)
    acc += tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if EPI == "residual":
        acc += tl.load(R + rm[:, None] * scm + rn[None, :], mask=ok, other=0.0).to(tl.float32)
    else:
        acc = _epilogue(acc, EPI)
    tl.store(C + rm[:, None] * scm + rn[None, :], acc.to(C.dtype.element_ty), mask=ok)


@triton.jit
def _pointwise(X, R, Y, n, EPI: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)
    if EPI == "residual":
        x += tl.load(R + offs, mask=ok, other=0.0).to(tl.float32)
    else:
        x = _epilogue(x, EPI)
    tl.store(Y + offs, x.to(Y.dtype.element_ty), mask=ok)


def fused(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, res: torch.Tensor | None, epi: str,
          cfg: tuple[int, ...], out: torch.Tensor) -> torch.Tensor:
    M, K = a.shape
    N = w.shape[1]
    bm, bn, bk, gm, warps, stages = cfg
    # bf16 operands: the precision flag does not apply ("ieee": the interpreter's dot takes them as they are)
    prec = "tf32" if a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "ieee"
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    _gemm[grid](a, w, bias, res if res is not None else out, out, M, N, K, a.stride(0), a.stride(1),
                w.stride(0), w.stride(1), out.stride(0), EPI=epi, PREC=prec,
                BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, num_warps=warps, num_stages=stages)
    return out


def separate(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, res: torch.Tensor | None, epi: str,
             out: torch.Tensor) -> torch.Tensor:
    y = torch.addmm(bias, a, w)
    if epi == "none":
        return y
    n = y.numel()
    _pointwise[(triton.cdiv(n, 1024),)](y, res if res is not None else y, out, n, EPI=epi, BLOCK=1024)
    return out


def reference(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, res: torch.Tensor | None, epi: str) -> torch.Tensor:
    y = torch.addmm(bias.double(), a.double(), w.double())
    if epi == "gelu":
        return torch.nn.functional.gelu(y)
    if epi == "gelu_tanh":
        return torch.nn.functional.gelu(y, approximate="tanh")
    if epi == "relu":
        return torch.relu(y)
    if epi == "residual":
        return y + res.double()
    return y


def measure(shape: tuple[Any, ...], device: str, dtype: torch.dtype, configs: list[tuple[int, ...]]) -> dict[str, Any]:
    name, M, K, N, epi = shape
    g = torch.Generator(device="cpu").manual_seed(0)
    a = (torch.randn(M, K, generator=g) / K ** 0.25).to(device, dtype)
    w = (torch.randn(K, N, generator=g) / K ** 0.25).to(device, dtype)
    bias = torch.randn(N, generator=g).to(device, dtype)
    res = torch.randn(M, N, generator=g).to(device, dtype) if epi == "residual" else None
    ref = reference(a, w, bias, res, epi)
    out = torch.empty(M, N, device=device, dtype=dtype)
    row: dict[str, Any] = {"name": name, "M": M, "K": K, "N": N, "epilogue": epi, "dtype": str(dtype).split(".")[1]}
    sep = separate(a, w, bias, res, epi, out).double()
    row["separate_rel_err"] = float((sep - ref).norm() / ref.norm())
    timing = device == "cuda"
    if timing:
        row["cublas_ms"] = triton.testing.do_bench(lambda: torch.addmm(bias, a, w))
        row["cublas_epilogue_ms"] = triton.testing.do_bench(lambda: separate(a, w, bias, res, epi, out))
    best = None
    for cfg in configs:
        try:
            got = fused(a, w, bias, res, epi, cfg, out).double()
        except Exception as e:  # noqa: BLE001 (a config that does not fit, out of shared memory, is skipped)
            row.setdefault("skipped", []).append(f"{cfg}: {type(e).__name__}")
            continue
        err = float((got - ref).norm() / ref.norm())
        ms = triton.testing.do_bench(lambda c=cfg: fused(a, w, bias, res, epi, c, out)) if timing else 0.0
        if best is None or ms < best[0]:
            best = (ms, cfg, err)
    if best is not None:
        row["triton_fused_ms"], row["triton_config"], row["triton_rel_err"] = best[0], list(best[1]), best[2]
        if timing:
            row["fused_vs_cublas_epilogue"] = round(best[0] / row["cublas_epilogue_ms"], 3)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--dtypes", default=None, help="default float32,bfloat16 (--tiny: float32; the "
                   "interpreter's dot of bf16 operands is wrong, so bf16 is checked by rel_err on the GPU)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    shapes = TINY if a.tiny else SHAPES
    configs = [(32, 32, 16, 2, 4, 1)] if a.tiny else CONFIGS
    rows = []
    for dt in (a.dtypes or ("float32" if a.tiny else "float32,bfloat16")).split(","):
        for s in shapes:
            row = measure(s, a.device, getattr(torch, dt), configs)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        gpu = torch.cuda.get_device_name() if a.device == "cuda" else a.device
        with open(os.path.join(a.out, "gemm-epilogue.json"), "w") as f:
            json.dump({"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

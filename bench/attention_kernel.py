"""fxcc's flash-attention template against aten's attention kernels on a GPU (not a test).

    python -m bench.attention_kernel [--no-sweep] [--out bench/results/attention-kernel.json]

For the TransformerBlock's attention (B32 H16 S512 D64, non-causal) and GPT-2's (B8 H12 S512 D64,
causal), in fp32 with TF32 and in bf16, times with triton.testing.do_bench (median ms):
- fxcc: the template through fxcc's own path (a graph compiled, cubins built, run by the client
  runtime's plan) for fp32/TF32, where the compiler uses it; and the same template launched by
  Triton's JIT (`fxcc-jit`) for both dtypes (in bf16 the compiler keeps aten's kernel);
- aten's memory-efficient kernel, and in bf16 aten's flash kernel;
- the math path: bmm, softmax, bmm (TF32 matmuls in fp32);
and prints TFLOP/s (4·B·H·S²·D, halved when causal) and each one's max error against a float64
reference; then a sweep of the template's autotune candidates (fp32/TF32). About a minute.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

CASES = {"transformer_block": (32, 16, 512, 64, False), "gpt2": (8, 12, 512, 64, True)}


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = scores.shape[-1]
        scores = scores + torch.full((s, s), float("-inf"), device=q.device, dtype=torch.float64).triu(1)
    return torch.softmax(scores, -1) @ v.double()


def math_path(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    b, h, s, d = q.shape
    scores = torch.bmm(q.reshape(b * h, s, d), k.reshape(b * h, s, d).transpose(1, 2)) / math.sqrt(d)
    if causal:
        scores = scores + torch.full((s, s), float("-inf"), device=q.device, dtype=q.dtype).triu(1)
    return torch.bmm(torch.softmax(scores, -1), v.reshape(b * h, s, d)).view(b, h, s, d)


def fxcc_plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[Any, Any]:
    """The template through fxcc's path: SDPA traced, compiled with TF32 allowed, cubins built,
    loaded by the client runtime. (runner, artifact)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_and_build
    from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=decomposition_table())(q, k, v)
    cap = capture_graph(gm, [q, k, v])
    major, minor = torch.cuda.get_device_capability()
    options = CompileOptions(target=Target(kind="cuda", arch=major * 10 + minor), allow_tf32=True)
    art = compile_and_build(CompileRequest(graph=cap.spec, options=options))
    return load_plan(art), art


class JitTemplate:
    """The template's source for q's dtype, launched by Triton's JIT under any config."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, tmp: Path) -> None:
        from fxcc.compiler_core.codegen.attention import AttentionParams

        self.q, self.k, self.v, self.causal, self.tmp = q, k, v, causal, tmp
        b, h, s, d = q.shape
        self.params = AttentionParams(d, d, causal, 1 / math.sqrt(d), q.dtype, "tf32")
        self.out = torch.empty(b, s, h, d, device=q.device, dtype=q.dtype).transpose(1, 2)
        self.fns: dict[Any, Any] = {}

    def launch(self, config: Any) -> torch.Tensor:
        from fxcc.compiler_core.autotune import load_jit
        from fxcc.compiler_core.codegen.attention import launch_grid, render_attention

        fn = self.fns.get(config)
        if fn is None:
            r = render_attention(self.params, config)
            fn = self.fns[config] = load_jit(r.source, r.name, self.tmp, interpret=False)
        q, k, v, o = self.q, self.k, self.v, self.out
        b, h, s, _ = q.shape
        ints = [0, *q.stride()[:3], 0, *k.stride()[:3], 0, *v.stride()[:3], *o.stride()[:3], b, h, s, s]
        fn[tuple(launch_grid(s, b * h, config.block_m))](q, k, v, o, *ints, **config.constexprs,
                                                          num_warps=config.num_warps, num_stages=config.num_stages)
        return o


def run_case(name: str, dtype_name: str, sweep: bool, tmp: Path) -> dict[str, Any]:
    from triton.testing import do_bench

    from fxcc.compiler_core.autotune_attention import candidate_configs
    from fxcc.compiler_core.codegen.attention import heuristic_config

    b, h, s, d, causal = CASES[name]
    dtype = torch.float32 if dtype_name == "fp32-tf32" else torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=g).to(dtype) for _ in range(3))
    ref = reference(q, k, v, causal)
    flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
    jit = JitTemplate(q, k, v, causal, tmp)
    heuristic = heuristic_config(jit.params, s, s, "cuda")
    fns: dict[str, Any] = {"fxcc-jit": lambda: jit.launch(heuristic)}
    if dtype == torch.float32:
        runner, art = fxcc_plan(q, k, v, causal)
        assert any(kk.name.startswith("fxcc_flash_") for kk in art.manifest.kernels), "template not used"
        fns = {"fxcc": lambda: runner([q, k, v])[0]} | fns
    fns["aten-efficient"] = lambda: torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, None, False, is_causal=causal)[0]
    if dtype != torch.float32:
        fns["aten-flash"] = lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[0]
    fns["math"] = lambda: math_path(q, k, v, causal)
    rows: dict[str, Any] = {}
    for label, fn in fns.items():
        with torch.no_grad():
            err = (fn().double() - ref).abs().max().item()
            ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
        rows[label] = {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1), "max_err": float(f"{err:.3g}")}
        print(f"  {name:18s} {dtype_name:9s} {label:15s} {ms:8.4f} ms {flops / ms / 1e9:7.1f} TFLOP/s  "
              f"max err {err:.2e}")
    out = {"shape": [b, h, s, d], "causal": causal, "dtype": dtype_name, "heuristic": heuristic.label,
           "results": rows}
    if sweep and dtype == torch.float32:
        times = {}
        for config in candidate_configs(heuristic, s, s, 2 * d, q.element_size()):
            try:
                times[config.label] = do_bench(lambda c=config: jit.launch(c), warmup=10, rep=40,
                                               return_mode="median")
            except Exception as e:  # noqa: BLE001 - a config that does not compile is reported
                times[config.label] = float("nan")
                print(f"    {config.label}: {type(e).__name__}")
        ranked = sorted(times.items(), key=lambda kv: (math.isnan(kv[1]), kv[1]))
        print(f"    sweep ({len(times)} configs), heuristic {heuristic.label} {times[heuristic.label]:.4f} ms; best: "
              + ", ".join(f"{lab} {t:.4f}" for lab, t in ranked[:5]))
        out["sweep_ms"] = {lab: round(t, 4) for lab, t in ranked}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-sweep", action="store_true", help="skip the config sweep")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = True  # the math path's fp32 matmuls in TF32, as eager's would be
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    results = []
    with tempfile.TemporaryDirectory(prefix="fxcc-attn-bench-") as tmp:
        for name in CASES:
            for dtype_name in ("fp32-tf32", "bf16"):
                results.append(run_case(name, dtype_name, not args.no_sweep, Path(tmp)))
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "cases": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()

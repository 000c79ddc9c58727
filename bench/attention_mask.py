"""fxcc's flash-attention template with a mask (SDPA's float bias) against aten's memory-efficient
kernel, the one Inductor runs for a masked fp32 SDPA (not a test).

    python3 -m bench.attention_mask [--out DIR]          # DIR/attention-mask.json

transformers' GPT-2 under torch.compile hands SDPA its causal mask as a [B, 1, S, S] bias of 0 and
-inf (B8 H12 S512 D64 in the models suite), fp32 with TF32. For each mask (causal; none masked, all
zeros; a padding mask of half the keys) the template under each launch config of its autotune
candidates (and the heuristic's), launched by Triton's JIT, and aten's kernel, as medians of
triton.testing.do_bench, with each one's max error against a float64 reference. The causal and
padding masks let the template skip key tiles masked whole; the zeros one is the same work unskipped.
`--batch N` sets B (the models suite's GPT-2 row runs batch 4). `--model-plan`: transformers' GPT-2
(2 layers, batch 4, seq 512) compiled by fxcc in this process: its template launches' integer
arguments, config and grid, as the plan holds them (to compare the plan's launch with this one's).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import torch


def masks(b: int, s: int) -> dict[str, torch.Tensor]:
    i, j = torch.arange(s, device="cuda")[:, None], torch.arange(s, device="cuda")[None, :]
    neg = float("-inf")
    causal = torch.zeros(s, s, device="cuda").masked_fill(j > i, neg)
    padding = torch.zeros(s, s, device="cuda").masked_fill(j >= s // 2, neg)
    return {name: m.expand(b, 1, s, s).contiguous() for name, m in
            (("causal", causal), ("zeros", torch.zeros(s, s, device="cuda")), ("padding", padding))}


def main() -> None:
    from triton.testing import do_bench

    from fxcc.compiler_core.autotune import load_jit
    from fxcc.compiler_core.autotune_attention import candidate_configs
    from fxcc.compiler_core.codegen.attention import (
        AttentionParams,
        heuristic_config,
        launch_grid,
        render_attention,
    )

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--model-plan", action="store_true")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    if a.model_plan:
        model_plan()
    b, h, s, d = a.batch, 12, 512, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=g) for _ in range(3))
    params = AttentionParams(d, d, False, 1 / math.sqrt(d), torch.float32, "tf32", True)
    heuristic = heuristic_config(params, s, s, "cuda", b * h)
    configs = candidate_configs(heuristic, s, s, 2 * d, 4)
    out = torch.empty(b, h, s, d, device="cuda")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        fns: dict[Any, Any] = {}
        for name, bias in masks(b, s).items():
            full = bias.expand(b, h, s, s)
            ref = torch.softmax((q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d) + full.double(), -1) \
                @ v.double()
            row: dict[str, Any] = {"mask": name, "heuristic": heuristic.label, "configs": {}}

            def aten(full: torch.Tensor = full) -> torch.Tensor:
                return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, full, False)[0]
            row["aten_efficient_ms"] = round(do_bench(aten, warmup=10, rep=50, return_mode="median"), 4)
            row["aten_efficient_err"] = float((aten().double() - ref).abs().max())
            for c in configs:
                fn = fns.get(c)
                if fn is None:
                    r = render_attention(params, c)
                    fn = fns[c] = load_jit(r.source, r.name, Path(tmp), interpret=False)
                ints = [0, *q.stride()[:3], 0, *k.stride()[:3], 0, *v.stride()[:3], 0, *full.stride(),
                        *out.stride()[:3], b, h, s, s]

                def launch(fn: Any = fn, c: Any = c, bias: torch.Tensor = bias, ints: list[int] = ints) -> torch.Tensor:
                    fn[tuple(launch_grid(s, b * h, c.block_m))](q, k, v, bias, out, *ints, **c.constexprs,
                                                                num_warps=c.num_warps, num_stages=c.num_stages)
                    return out
                try:
                    err = float((launch().double() - ref).abs().max())
                    ms = do_bench(launch, warmup=10, rep=50, return_mode="median")
                except Exception as e:  # noqa: BLE001 - a config that does not build: say so, go on
                    row["configs"][c.label] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                    continue
                row["configs"][c.label] = {"ms": round(ms, 4), "err": err}
            timed = [(r["ms"], label) for label, r in row["configs"].items() if "ms" in r]
            best = min(timed) if timed else (None, None)
            row["best"] = {"config": best[1], "ms": best[0]}
            row["heuristic_ms"] = row["configs"].get(heuristic.label, {}).get("ms")
            print(json.dumps({key: row[key] for key in ("mask", "aten_efficient_ms", "heuristic", "heuristic_ms", "best")}),
                  flush=True)
            rows.append(row)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"attention-mask-b{b}.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                                               "shape": [b, h, s, d], "rows": rows}, indent=1))


def model_plan() -> None:
    import transformers

    from fxcc.client import backend
    from fxcc.client.cache import LocalCache
    from fxcc.client.settings import ClientSettings
    from fxcc.compiler_core.codegen.attention import int_args, is_template_kernel

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).cuda().eval()
    ids = torch.randint(0, config.vocab_size, (4, 512), device="cuda")
    with torch.no_grad():
        torch.compile(model, backend="fxcc")(input_ids=ids)
    cache = LocalCache(ClientSettings.from_env().cache_dir)
    for e in backend.events():
        art = cache.get(e.key) if e.key else None
        if art is None:
            continue
        infos = {k.name: k for k in art.manifest.kernels}
        for st in art.manifest.plan.steps:
            if st.kind == "kernel" and is_template_kernel(st.kernel):
                k = infos[st.kernel]
                src = art.blobs[k.source.digest].decode()
                facts = next(line for line in src.splitlines() if line.startswith("# fxcc-attention"))
                print(json.dumps({"kernel": st.kernel, "grid": st.grid, "constexprs": k.constexprs,
                                  "num_warps": k.num_warps, "num_stages": k.num_stages, "facts": facts,
                                  "ints": int_args(st.args)}, default=str), flush=True)
                break


if __name__ == "__main__":
    main()

"""Autotuning fxcc's attention template: its own candidates (query/key tiles, warps, stages) and bench.

Note: the template's launch config is BLOCK_M × BLOCK_N tiles, num_warps and num_stages; its
grid is one program per BLOCK_M query rows of each (batch, head), so a tuned kernel's launches
are regridded from their integer arguments (`retile_step`). Candidates that hold more K/V tiles
in shared memory than an SM has are never tried. With TF32, configs differ from the heuristic's
result by rounding (each tile's exponentials are rounded to TF32 against another running max),
so they are checked against it within TF32's tolerance, not fp32's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fxcc.compiler_core.artifact import AllocStep, KernelInfo, KernelStep, Plan, TuningRecord
from fxcc.compiler_core.codegen.attention import (
    HEAD_DIMS,
    AttentionConfig,
    int_args,
    launch_grid,
    source_facts,
)
from fxcc.compiler_core.codegen.triton import next_pow2
from fxcc.compiler_core.tuning import Timer, device_name, load_jit, mismatch, select_config
from fxcc.compiler_core.wire import NodeRef

log = logging.getLogger("fxcc.autotune")

BLOCK_MS = {"default": (64, 128), "max-autotune": (32, 64, 128, 256)}
BLOCK_NS = {"default": (32, 64, 128), "max-autotune": (16, 32, 64, 128)}
WARPS = {"default": (4, 8), "max-autotune": (2, 4, 8)}
STAGES = {"default": (2, 3), "max-autotune": (1, 2, 3, 4)}
# Shared memory the K and V tiles of every stage may take (bytes): under an sm_90 SM's 228 KB
# with room for the compiler's own (the P tile, layout conversions).
STAGE_SMEM_MAX = 160 * 1024
# Relative tolerance (of the output's largest magnitude) for TF32 candidates.
TF32_TOLERANCE = 1e-2


def candidate_configs(heuristic: AttentionConfig, q_len: int, kv_len: int, head_dims: int, itemsize: int,
                      mode: str = "default") -> list[AttentionConfig]:
    """The heuristic config first, then the grid of candidates that fit the sequences and the
    shared memory. `head_dims`: head dim plus value dim (elements of a K row and a V row).

    Note: default mode leaves out one stage (no K/V prefetch: Hopper's loads want it) and 64-row
    tiles on 8 warps (two warp groups over 64 rows leave the MMA units half fed).
    """
    key = "max-autotune" if mode == "max-autotune" else "default"
    m_top, n_top = max(16, next_pow2(q_len)), max(16, next_pow2(kv_len))
    out = [heuristic]
    for m in BLOCK_MS[key]:
        for n in BLOCK_NS[key]:
            for w in WARPS[key]:
                for s in STAGES[key]:
                    c = AttentionConfig(m, n, w, s)
                    if m > m_top or n > n_top or s * n * head_dims * itemsize > STAGE_SMEM_MAX:
                        continue
                    if key == "default" and m == 64 and w == 8:
                        continue
                    if c not in out:
                        out.append(c)
    return out


def retile_step(step: KernelStep, block_m: int) -> KernelStep:
    """The launch with its grid recomputed for `block_m` query rows per program."""
    sizes = int_args(step.args)
    return step.model_copy(update={"grid": launch_grid(sizes["q_len"], sizes["batch"] * sizes["heads"], block_m)})


class AttentionBench:
    """One template launch over random q/k/v storage of its sizes and strides, on `device`."""

    def __init__(self, fn: Any, step: KernelStep, plan: Plan, device: str, timer: Timer,
                 facts: dict[str, str] | None = None) -> None:
        import torch

        self.fn, self.timer, self.device = fn, timer, device
        self.sizes = int_args(step.args)
        pointers = [a for a in step.args if isinstance(a, NodeRef)]
        out_ref = pointers[-1]
        alloc = next(s for s in plan.steps if isinstance(s, AllocStep) and s.out == out_ref.name)
        dtype = getattr(torch, alloc.spec.dtype)
        n = self.sizes
        spans: dict[str, int] = {}
        dtypes: dict[str, Any] = {}
        # A bias computed per tile reads tensors of their own dtypes and spans (the source's facts).
        tile_reads = [x.split(":") for x in facts["bias_buffers"].split(",")] if facts and facts.get("bias_buffers") else []
        for ref, (kind, span) in zip(pointers[3:-1], tile_reads):
            spans[ref.name] = max(spans.get(ref.name, 0), int(span))
            dtypes[ref.name] = getattr(torch, kind)
        for ref, p in zip(pointers[:3] if tile_reads else pointers[:-1], ("q", "k", "v", "b")):
            if p == "b":  # the bias: [Z, H, L, S] by its strides (0 where broadcast)
                last = n["b_off"] + sum((size - 1) * n[f"b_{d}"] for size, d in
                                        ((n["batch"], "sz"), (n["heads"], "sh"), (n["q_len"], "sm"), (n["kv_len"], "sn")))
            else:
                rows = n["q_len" if p == "q" else "kv_len"]
                s_row = n[f"{p}_sm" if p == "q" else f"{p}_sn"]
                last = (n[f"{p}_off"] + (n["batch"] - 1) * n[f"{p}_sz"] + (n["heads"] - 1) * n[f"{p}_sh"]
                        + (rows - 1) * s_row + max(HEAD_DIMS))
            spans[ref.name] = max(spans.get(ref.name, 0), last + 1)
        gen = torch.Generator(device=device).manual_seed(0)
        storage = {name: _random(span, dtypes.get(name, dtype), device, gen) for name, span in spans.items()}
        self.out = torch.empty_strided([int(x) for x in alloc.spec.sizes], [int(x) for x in alloc.spec.strides],
                                       dtype=dtype, device=device)
        self.args = [storage[a.name] for a in pointers[:-1]] + [self.out]
        self.args += [getattr(a, "value", None) for a in step.args[len(pointers):]]

    def launch(self, config: AttentionConfig) -> None:
        grid = tuple(launch_grid(self.sizes["q_len"], self.sizes["batch"] * self.sizes["heads"], config.block_m))
        self.fn[grid](*self.args, **config.constexprs, num_warps=config.num_warps, num_stages=config.num_stages)

    def run(self, config: AttentionConfig) -> list[Any]:
        import torch

        self.out.fill_(float("nan"))  # a row a candidate skips stays NaN, which the check catches
        self.launch(config)
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
        return [self.out.clone()]

    def time_ms(self, config: AttentionConfig) -> float:
        return self.timer(config, lambda: self.launch(config))


def _random(n: int, dtype: Any, device: str, gen: Any) -> Any:
    """`n` random values of `dtype` (a mask's half true)."""
    import torch

    values = torch.randn(n, device=device, generator=gen)
    return values > 0 if dtype == torch.bool else values.to(dtype)


def tf32_mismatch(got: Sequence[Any], expected: Sequence[Any]) -> str | None:
    """`mismatch` within TF32's rounding (relative to the output's largest magnitude)."""
    import torch

    for g, e in zip(got, expected):
        if g.shape != e.shape or g.dtype != e.dtype:
            return mismatch(got, expected)
        scale = max(1.0, float(e.abs().max()))
        if not torch.allclose(g.double(), e.double(), rtol=TF32_TOLERANCE, atol=TF32_TOLERANCE * scale):
            return "output differs from the heuristic config's beyond TF32 rounding"
    return None


def tune_template(info: KernelInfo, launches: Sequence[KernelStep], plan: Plan, source: str, mode: str,
                  device: str, timer: Timer, tmp: Path) -> KernelInfo:
    """`info` with the fastest of its candidate configs, measured on its largest launch."""
    def work(s: KernelStep) -> int:
        n = int_args(s.args)
        return n["batch"] * n["heads"] * n["q_len"] * n["kv_len"]

    step = max(launches, key=work)
    sizes = int_args(step.args)
    c = info.constexprs
    heuristic = AttentionConfig(c["BLOCK_M"], c["BLOCK_N"], info.num_warps, info.num_stages)
    facts = source_facts(source)
    head_dims = int(facts["head_dim"]) + int(facts["value_dim"])
    itemsize = 4 if facts["dtype"] == "float32" else 2
    candidates = candidate_configs(heuristic, sizes["q_len"], sizes["kv_len"], head_dims, itemsize, mode)
    fn = load_jit(source, info.name, tmp, interpret=not device.startswith("cuda"))
    bench = AttentionBench(fn, step, plan, device, timer, facts)
    check = tf32_mismatch if facts["precision"] == "tf32" else mismatch
    winner, timings, rejected = select_config(candidates, bench, check)
    log.info("kernel %s: %s won over %d candidates (heuristic %s: %.4f ms, winner %.4f ms)", info.name,
             winner.label, len(candidates), heuristic.label, timings[heuristic.label], timings[winner.label])
    record = TuningRecord(device=device_name(device), heuristic=heuristic.label, winner=winner.label,
                          timings_ms={k: round(v, 5) for k, v in timings.items()}, rejected=rejected,
                          sizes=[sizes["batch"] * sizes["heads"], sizes["q_len"], sizes["kv_len"]])
    update: dict[str, Any] = {"tuning": record}
    if winner != heuristic:
        update |= {"constexprs": winner.constexprs, "num_warps": winner.num_warps,
                   "num_stages": winner.num_stages, "binaries": {}, "metadata": {}}
    return info.model_copy(update=update)

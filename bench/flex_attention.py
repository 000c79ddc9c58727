"""flex_attention on a GPU: fxcc's templates against Inductor's and eager's, forward and forward+backward (not a test).

    python3 -m bench.flex_attention --out DIR [--quick]      # DIR/h200-flex-attention.json

For each shape (bf16; B=4 H=16 S=2048 D=64 and B=2 H=16 S=4096 D=128) and mask (causal, and a
sliding window of 256 keys, each a BlockMask from create_block_mask), in one process:
- fxcc: `torch.compile(fn, backend="fxcc")` (in-process compile, cubins for this card, the default
  settings, FXCC_FALLBACK=error so that a refusal shows instead of running eagerly);
- Inductor: `torch.compile(flex_attention)`, as torch's docs say to run it;
- eager: flex_attention uncompiled (torch's dense math path, which materializes the scores);
times as medians of triton.testing.do_bench (L2 flushed between runs), forward under no_grad and
forward+backward (`out.backward(grad)`, grads of q, k, v), with fxcc / Inductor as a ratio, fxcc's
kernel counts and extern ops per graph, and fxcc's and eager's max errors against Inductor's results
(fxcc's also per tensor: out, dq, dk, dv), each impl's first call on leaves without grads.
`--quick`: the first shape only, fewer repetitions (a few minutes). `--kernel-options JSON`: flex_attention's
kernel_options for every impl (Inductor and fxcc both read the tile ones: BLOCK_M, BLOCK_N, BLOCK_M1, BLOCK_N1,
BLOCK_M2, BLOCK_N2, num_warps, num_stages, each also as fwd_NAME / bwd_NAME), e.g.
'{"bwd_BLOCK_M1": 32, "bwd_BLOCK_N2": 32}'. `--masks NAME,...` runs those masks only; `--profile` adds each impl's
CUDA kernels (torch.profiler over 5 calls, ms per call and launches per call) to its rows, to place a
gap on the kernel that makes it (the flex template, delta's reduction, or something else).
`--host-profile N`: each impl's host time per call (N calls back to back, then one synchronize: the
clock stops at the last launch, `host_us`), and for fxcc and Inductor cProfile's top functions over
those calls by own time, printed and in the rows (`host`): a forward+backward whose kernels take
less than its launches is measured by do_bench at its host time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

SHAPES = ((4, 16, 2048, 64), (2, 16, 4096, 128))
WINDOW = 256
ROUNDS = 3


def causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
    return q >= kv


def sliding(b: Any, h: Any, q: Any, kv: Any) -> Any:
    return (q >= kv) & (q - kv <= WINDOW)


MASKS = {"causal": causal, "sliding_window": sliding}


def _median_ms(fn: Any, rep: int, grads: list[torch.Tensor] | None = None) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=rep, grad_to_none=grads, return_mode="median"))


def _max_err(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def _kernel_ms(call: Any, leaves: list[torch.Tensor], calls: int = 5, top: int = 6) -> dict[str, Any]:
    """`call`'s CUDA time per call, all kernels summed (`device_ms`: well under the row's time, the
    call is host-bound), and its `top` kernels by time, {name: [ms per call, launches per call]}."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            for x in leaves:
                x.grad = None
            call()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append((e.key[:90], round(t / 1000 / calls, 4), e.count / calls))
    rows.sort(key=lambda r: -r[1])
    return {"device_ms": round(sum(r[1] for r in rows), 4), "top": {name: [ms, count] for name, ms, count in rows[:top]}}


def _host(call: Any, leaves: list[torch.Tensor], calls: int, profiled: bool, top: int = 25) -> dict[str, Any]:
    """Host µs per call of `call` (`calls` back to back, the clock read before the synchronize) and,
    with `profiled`, cProfile's `top` functions by own time over another `calls` calls."""
    import cProfile
    import io
    import pstats

    def loop() -> None:
        for _ in range(calls):
            for x in leaves:
                x.grad = None
            call()

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loop()
    host_us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    out: dict[str, Any] = {"host_us": round(host_us, 1)}
    if profiled:
        prof = cProfile.Profile()
        prof.runcall(loop)
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
        out["profile"] = text.getvalue().splitlines()[-top - 2:]
    return out


def run_case(shape: tuple[int, int, int, int], mask_name: str, rep: int,
             kernel_options: dict[str, Any] | None = None, profile: bool = False,
             host_calls: int = 0) -> list[dict[str, Any]]:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from fxcc.client import backend

    b, h, s, d = shape
    block_mask = create_block_mask(MASKS[mask_name], b, h, s, s, device="cuda")
    inductor_flex = torch.compile(flex_attention)

    def fxcc_fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flex_attention(q, k, v, block_mask=block_mask, kernel_options=kernel_options)

    fxcc = torch.compile(fxcc_fn, backend="fxcc")
    impls = {
        "fxcc": fxcc,
        "inductor": lambda q, k, v: inductor_flex(q, k, v, block_mask=block_mask, kernel_options=kernel_options),
        "eager": lambda q, k, v: flex_attention(q, k, v, block_mask=block_mask),
    }
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn(b, h, s, d, device="cuda", generator=g, dtype=torch.bfloat16)
    rows = []
    for mode in ("forward", "forward_backward"):
        train = mode == "forward_backward"
        leaves = [x.detach().clone().requires_grad_(train) for x in (q, k, v)]
        results: dict[str, list[torch.Tensor]] = {}
        first_call_s: dict[str, float] = {}
        kernels: dict[str, dict[str, Any]] = {}
        host: dict[str, dict[str, Any]] = {}
        n_events = len(backend.events())
        calls: dict[str, Any] = {}
        for name, fn in impls.items():
            def call(fn: Any = fn, train: bool = train, leaves: list[torch.Tensor] = leaves) -> Any:
                if not train:
                    with torch.no_grad():
                        return fn(*leaves)
                out = fn(*leaves)
                out.backward(dout)
                return out

            # Note: do_bench leaves its last run's grads on the leaves; the next impl's first call
            # would add its own to them.
            for x in leaves:
                x.grad = None
            t0 = time.perf_counter()
            out = call()
            torch.cuda.synchronize()
            first_call_s[name] = round(time.perf_counter() - t0, 2)
            results[name] = [out.detach()] + ([x.grad.clone() for x in leaves] if train else [])
            for x in leaves:
                x.grad = None
            calls[name] = call
        # Note: a call whose kernels take less than its host work (a sliding window's forward, ~0.06
        # ms of kernels) times the host, which drifts within a process (0.065 to 0.141 ms for one
        # call in three runs); rounds interleave the impls and the median of rounds is kept.
        rounds: dict[str, list[float]] = {name: [] for name in impls}
        for _ in range(ROUNDS):
            for name, call in calls.items():
                rounds[name].append(_median_ms(call, rep, leaves if train else None))
        times = {name: statistics.median(r) for name, r in rounds.items()}
        for name, call in calls.items():
            if profile:
                kernels[name] = _kernel_ms(call, leaves)
            if host_calls:
                host[name] = _host(call, leaves, host_calls, name != "eager")
                for line in host[name].get("profile", []):
                    print(f"  {name} {mode}: {line}", flush=True)
        events = [e for e in backend.events()[n_events:] if e.source != "fallback"]
        rows.append({
            "shape": {"B": b, "H": h, "S": s, "D": d}, "mask": mask_name, "mode": mode, "dtype": "bfloat16",
            "sparsity_pct": round(float(block_mask.sparsity()), 1),
            "fxcc_ms": round(times["fxcc"], 4), "inductor_ms": round(times["inductor"], 4),
            "eager_ms": round(times["eager"], 4),
            "fxcc_vs_inductor": round(times["fxcc"] / times["inductor"], 3),
            "fxcc_vs_eager": round(times["fxcc"] / times["eager"], 3),
            "fxcc_max_err_vs_inductor": _max_err(results["fxcc"], results["inductor"]),
            "eager_max_err_vs_inductor": _max_err(results["eager"], results["inductor"]),
            "fxcc_max_err_by_tensor": dict(zip(("out", "dq", "dk", "dv"), (
                _max_err([a], [b]) for a, b in zip(results["fxcc"], results["inductor"])))),
            "fxcc_graphs": [{"kernels": e.stats.kernels if e.stats else None,
                             "extern_ops": e.stats.extern_ops if e.stats else None, "source": e.source,
                             "runs_as": e.runs_as}
                            for e in events],
            "rounds_ms": {name: [round(t, 4) for t in r] for name, r in rounds.items()},
            "first_call_s": first_call_s,
            **({"kernels_ms": kernels,
                "fxcc_device_vs_inductor": round(kernels["fxcc"]["device_ms"] / kernels["inductor"]["device_ms"], 3)}
               if profile else {}),
            **({"host": {n: {"host_us": h["host_us"]} for n, h in host.items()},
                "host_profile": {n: h["profile"] for n, h in host.items() if "profile" in h}} if host_calls else {}),
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for h200-flex-attention.json")
    parser.add_argument("--quick", action="store_true", help="the first shape only, fewer repetitions")
    parser.add_argument("--kernel-options", type=json.loads, default=None,
                        help="flex_attention kernel_options (JSON) for fxcc and Inductor, e.g. tiles")
    parser.add_argument("--shapes", default=None, help="indices into SHAPES (B, H, S, D): " + "; ".join(
        f"{i}: {s}" for i, s in enumerate(SHAPES)) + " (default: all, or 0 with --quick)")
    parser.add_argument("--masks", default=",".join(MASKS), help=f"masks to run, of {','.join(MASKS)}")
    parser.add_argument("--profile", action="store_true", help="each impl's CUDA kernels (torch.profiler) in its rows")
    parser.add_argument("--host-profile", type=int, default=0, metavar="N",
                        help="each impl's host µs per call over N calls, and cProfile's top functions")
    args = parser.parse_args()
    os.environ.setdefault("FXCC_FALLBACK", "error")
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    import triton

    shapes = [SHAPES[int(i)] for i in args.shapes.split(",")] if args.shapes else SHAPES[:1] if args.quick else SHAPES
    rep = 50 if args.quick else 200
    rows = []
    for shape in shapes:
        for mask_name in args.masks.split(","):
            torch._dynamo.reset()
            rows += run_case(shape, mask_name, rep, args.kernel_options, args.profile, args.host_profile)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "fxcc_cuda_graphs": os.environ.get("FXCC_CUDA_GRAPHS", "default"), "kernel_options": args.kernel_options,
        "rows": rows,
        "worst_fxcc_vs_inductor": max(r["fxcc_vs_inductor"] for r in rows),
        **({"worst_fxcc_device_vs_inductor": max(r["fxcc_device_vs_inductor"] for r in rows)} if args.profile else {}),
    }
    path = args.out / "h200-flex-attention.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}; worst fxcc/Inductor {result['worst_fxcc_vs_inductor']}")


if __name__ == "__main__":
    main()

"""Conv nets on the GPU, fxcc against Inductor and eager in one process (issue 19, items 1, 2 and 4):
step time, kernels per step (torch.profiler), and the kernels that tell whether batch norm, pooling
and the layout were compiled: aten batch norm kernels, cuDNN's layout conversions, aten pooling.

`python3 -m bench.norm_layout_check --out $OUT` (H200: torchvision ResNet-18 training step at batch
32, fp32 with TF32; timm EfficientNet-B0 inference at batch 32 if timm is installed). `--quick`
times fewer steps. Writes `$OUT/norm_layout_check.json` and prints a table. Not a test: nothing
here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

# Kernel names that mean work fxcc (or Inductor) should have compiled or avoided.
MARKERS = {
    "layout_conversions": ("nchwToNhwc", "nhwcToNchw"),
    "aten_batch_norm": ("batch_norm",),
    "aten_pooling": ("max_pool", "avg_pool", "MaxPool", "AvgPool"),
    "depthwise_nchw": ("conv_depthwise2d",),
}


def make_model(name: str) -> tuple[torch.nn.Module, bool]:
    """(model on CUDA, training?) with random weights."""
    torch.manual_seed(0)
    if name == "resnet18":
        import torchvision

        return torchvision.models.resnet18(weights=None).cuda().train(), True
    if name == "efficientnet_b0":
        import timm

        return timm.create_model("efficientnet_b0", pretrained=False).cuda().eval(), False
    raise ValueError(name)


def step_fn(model: Callable, training: bool, x: torch.Tensor, y: torch.Tensor,
            params: list[torch.nn.Parameter]) -> Callable[[], Any]:
    """One training step (forward, loss, backward; grads reset) or one inference call."""
    if training:
        def step() -> Any:
            for p in params:
                p.grad = None
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss.detach()
        return step

    def infer() -> Any:
        with torch.no_grad():
            return model(x)
    return infer


def timed_ms(fn: Callable[[], Any], steps: int) -> float:
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def profile_step(fn: Callable[[], Any], steps: int = 3) -> dict[str, Any]:
    """Kernels per step (launches), device ms per step, and the marker kernels' counts."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    kernels: Counter[str] = Counter()
    times: Counter[str] = Counter()  # device microseconds per kernel name
    device_us = 0.0
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t <= 0 or e.key.startswith(("Memcpy", "Memset")):
            continue
        kernels[e.key] += e.count
        times[e.key] += t
        device_us += t
    markers = {k: sum(n for name, n in kernels.items() if any(m in name for m in ms)) // steps
               for k, ms in MARKERS.items()}
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    return {"kernels_per_step": sum(kernels.values()) // steps, "device_ms": round(device_us / 1000 / steps, 3),
            **markers, "most_launched": [[name[:100], n // steps] for name, n in top],
            # where the device time goes: [name, ms per step, launches per step]
            "most_device_time": [[name[:100], round(t / 1000 / steps, 4), kernels[name] // steps]
                                 for name, t in times.most_common(15)]}


def fxcc_plans() -> list[dict[str, Any]]:
    from fxcc.client import backend

    out = []
    for e in backend.events():
        s = e.stats
        out.append({"source": e.source, "kernels": s.kernels if s else None,
                    "extern_ops": dict(Counter(s.extern_ops)) if s else None, "error": e.error,
                    "runs_as": e.runs_as})
    return out


def run_one(name: str, compiler: str, batch: int, steps: int) -> dict[str, Any]:
    torch._dynamo.reset()
    model, training = make_model(name)
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    params = [p for p in model.parameters() if p.requires_grad]
    if compiler == "eager":
        compiled: Callable = model
    elif compiler == "fxcc":
        from fxcc.client import backend
        from fxcc.client.backend import fxcc_backend

        backend.reset()
        compiled = torch.compile(model, backend=fxcc_backend)
    elif compiler == "inductor_reduce_overhead":
        compiled = torch.compile(model, mode="reduce-overhead")
    else:
        compiled = torch.compile(model)
    fn = step_fn(compiled, training, x, y, params)
    t0 = time.perf_counter()
    first = fn()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    # read now: a CUDA-graphed output (Inductor's reduce-overhead) is overwritten by the next replay
    first_value = float(first.float().sum())  # the first loss (or the logits' sum): against eager's
    del first
    for _ in range(5):
        fn()
    row: dict[str, Any] = {"model": name, "compiler": compiler, "kind": "training" if training else "inference",
                           "batch": batch, "first_call_s": round(first_s, 2), "step_ms": round(timed_ms(fn, steps), 3)}
    row.update(profile_step(fn))
    row["first_value"] = first_value
    if compiler == "fxcc":
        row["fxcc_graphs"] = fxcc_plans()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--models", default="resnet18,efficientnet_b0")
    ap.add_argument("--compilers", default="eager,inductor,fxcc")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="time 10 steps, not 50")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    os.environ.setdefault("FXCC_CACHE_DIR", tempfile.mkdtemp(prefix="fxcc-norm-layout-"))
    steps = 10 if args.quick else 50
    rows = []
    for name in args.models.split(","):
        try:
            make_model(name)
        except ImportError as e:
            print(f"skipping {name}: {e}")
            continue
        compilers = args.compilers.split(",")
        if name == "efficientnet_b0" and "inductor" in compilers:
            compilers.append("inductor_reduce_overhead")  # fxcc replays CUDA graphs in inference
        for compiler in compilers:
            try:
                rows.append(run_one(name, compiler, args.batch, steps))
            except Exception as e:  # noqa: BLE001 - a benchmark reports what failed and goes on
                rows.append({"model": name, "compiler": compiler, "error": f"{type(e).__name__}: {e}"[:500]})
            print(json.dumps(rows[-1])[:2000], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "norm_layout_check.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'model':16} {'compiler':26} {'step ms':>8} {'dev ms':>8} {'kernels':>8} {'layout cv':>9} "
          f"{'aten bn':>8} {'aten pool':>9} {'dw nchw':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:16} {r['compiler']:26} error: {r['error'][:80]}")
            continue
        print(f"{r['model']:16} {r['compiler']:26} {r['step_ms']:8.3f} {r['device_ms']:8.3f} {r['kernels_per_step']:8d} "
              f"{r['layout_conversions']:9d} {r['aten_batch_norm']:8d} {r['aten_pooling']:9d} {r['depthwise_nchw']:8d}")


if __name__ == "__main__":
    main()

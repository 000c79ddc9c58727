"""The `models` suite (issue 19): real models from transformers, timm and torchvision (random
weights, configs built in code, bench/model_zoo.py), fxcc against eager and Inductor in one process.

    python3 -m bench.models --out $OUT                              # every model; DIR/h200-models.json
    python3 -m bench.models --models training,gpt2 --out $OUT --time-budget-s 500
    TRITON_INTERPRET=1 .venv/bin/python -m bench.models --device cpu --tiny --models gpt2 --out /tmp/m

Each model runs in a process of its own (a crash or a hang costs that row, which records why; the
next model goes on), under `--model-timeout-s`; no model starts once `--time-budget-s` is spent
(they are listed as `not_reached`). In that process, one after the other, each from the same
weights: eager, Inductor's default, Inductor's `reduce-overhead` (inference rows), fxcc (its
embedded in-process default, a fresh FXCC_CACHE_DIR per model). Per mode: the median step time
(do_bench), device time and kernel launches per step (torch.profiler), the peak memory (from an
emptied cache, torch.cuda.max_memory_allocated beyond what was allocated before: compile, first
calls, CUDA-graph captures and replays included; weights and inputs excluded), and the error
against eager. Inference compares fxcc with the faster of Inductor's two modes (`inductor_ms`,
`inductor_peak_mb` are that mode's); a training step is forward, backward and a fused AdamW step
(the optimizer is eager in every mode), and its losses over 5 steps from the same weights are
compared with eager's. Results merge into `--out`/h200-models.json by model name.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.model_zoo import GROUPS, ZOO, Built, ModelSpec, Skip

MB = 1 << 20
LOSS_STEPS = 5
# Relative error (Frobenius norm of the difference over eager's) within which a row matches eager.
# Eager itself runs TF32 matmuls and cuDNN convolutions: another summation order is ~1e-3 away.
OUTPUT_TOL = {"float32": 1e-2, "bfloat16": 4e-2}
LOSS_TOL = 1e-2  # per step, relative to eager's loss
INFERENCE_MODES = ("eager", "inductor_default", "inductor_reduce_overhead", "fxcc")
TRAINING_MODES = ("eager", "inductor_default", "fxcc")
NOTES = {
    "ms": "median of triton.testing.do_bench (L2 flushed between calls; wall time of a whole call or step, "
          "host included: a host-bound step shows here, not in device_ms)",
    "device_ms": "GPU time of one call or step: every kernel, memcpy and memset torch.profiler saw over 3 "
                 "steps, summed, / 3; kernels: kernel launches per step (memcpy/memset excluded)",
    "peak_mb": "torch.cuda.max_memory_allocated over compile + 3 calls (5 steps for training) after "
               "clearing cuBLAS's workspaces (session 24: each mode pays its own), empty_cache and "
               "reset_peak_memory_stats, minus memory_allocated before; weights and inputs excluded; training: "
               "gradients and AdamW's state included in every mode. Inference: the bench keeps no output of "
               "its own in the window (until session 26 it kept a clone of the first call's and the third's: "
               "two extra logits for a language model), and peak_mb adds uncounted_output_mb, the bytes of "
               "the third call's output the allocator did not count (its storage less what dropping it "
               "freed): Inductor's cudagraph trees hand out a replay's outputs as storages made from pool "
               "pointers (torch._C._construct_storage_from_data_pointer), which max_memory_allocated never "
               "sees (GPT-2: its logits, 393 MiB); allocated_peak_mb is the allocator's number alone; "
               "reserved_mb (max_memory_reserved, same window) counts every mode's pools",
    "reserved_mb": "torch.cuda.max_memory_reserved over the same window, minus memory_reserved before: what "
                   "the allocator held from the device (its pools and cached free blocks); fxcc_vs_inductor_reserved "
                   "and the summary's reserved_* compare it",
    "inductor": "inference: inductor_ms is the faster of inductor_default_ms and inductor_reduce_overhead_ms "
                "(inductor_mode says which) and inductor_peak_mb that mode's; training: Inductor's default "
                "(fxcc replays static training plans as CUDA graphs unless FXCC_CUDA_GRAPHS_TRAINING=0)",
    "rel_err": "inference: ||out - eager|| / ||eager|| over the model's output, the worst of the first and "
               "the third call (a CUDA-graph replay); matches_eager: fxcc's <= OUTPUT_TOL[dtype] "
               f"{OUTPUT_TOL} and no graph fell back to eager",
    "loss": f"training: losses of {LOSS_STEPS} steps from the same weights and batch; loss_rel_diff: the "
            f"largest |loss - eager's| / |eager's|; matches_eager: fxcc's <= {LOSS_TOL}",
    "settings": "TF32 on (matmul and cuDNN), torch.no_grad and eval() for inference, train() with dropout 0 "
                "for training; random weights (torch.manual_seed(0)); one process per model",
}


# ---------------------------------------------------------------- one mode's measurements


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], Any], device: str) -> float:
    """Median time of one call: do_bench on a GPU, a few perf_counter calls on the CPU (smoke runs)."""
    if device == "cuda":
        from bench.measure import bench_ms

        return round(bench_ms(fn), 4)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(times), 4)


def profiled(fn: Callable[[], Any], steps: int) -> Any:
    """torch.profiler (CPU and CUDA) over `steps` calls of `fn`, after one call outside it."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    return prof


def profile_step(fn: Callable[[], Any], device: str, steps: int = 3) -> tuple[float | None, float | None]:
    """(device ms per step, kernel launches per step) from torch.profiler; (None, None) on the CPU."""
    if device != "cuda":
        return None, None
    from torch.autograd import DeviceType

    prof = profiled(fn, steps)
    busy_us, kernels = 0.0, 0
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        busy_us += e.time_range.elapsed_us()
        if not e.name.startswith(("Memcpy", "Memset")):
            kernels += 1
    return round(busy_us / 1000 / steps, 4), round(kernels / steps, 1)


class PeakWindow:
    """The most memory allocated from `start()` on beyond what was allocated then (CUDA only)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.base = 0
        self.base_reserved = 0

    def start(self) -> None:
        """Drop what the modes before held (Dynamo's caches, Inductor's cudagraph trees), then start."""
        torch._dynamo.reset()
        if self.device != "cuda":
            return
        gc.collect()
        torch.cuda.synchronize()
        # cuBLAS keeps a workspace per (handle, stream) once a matmul ran: a mode after another one
        # found the first mode's and never counted its own (Inductor's reduce-overhead after its
        # default mode, s19: ResNet-18 101.9 MB, 149.5 when run alone in s22). Every mode pays its own.
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.base = torch.cuda.memory_allocated()
        self.base_reserved = torch.cuda.memory_reserved()

    def peak_mb(self) -> tuple[float | None, float | None]:
        if self.device != "cuda":
            return None, None
        torch.cuda.synchronize()
        return (round((torch.cuda.max_memory_allocated() - self.base) / MB, 1),
                round((torch.cuda.max_memory_reserved() - self.base_reserved) / MB, 1))


def _uncounted_bytes(box: list[Any]) -> int:
    """Bytes of the output (the one tensor in `box`, which this empties) that the allocator does
    not count: its storages' bytes less what dropping it frees. A fresh output (eager's, fxcc's) is
    counted whole; a cudagraph tree's replay output is a storage made from a pool pointer, which
    max_memory_allocated never saw, though the memory holds the output all the same (CPU: 0)."""
    out = box.pop()
    if not isinstance(out, torch.Tensor) or not out.is_cuda:
        return 0
    size = out.untyped_storage().nbytes()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    del out
    gc.collect()
    return max(0, size - (held - torch.cuda.memory_allocated()))


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (got.double() - ref.double()).norm()
    return float(diff / ref.double().norm().clamp_min(1e-30))


def compiled(mode: str, module: torch.nn.Module) -> Callable[..., Any]:
    """`module` under one of the suite's modes (the caller has reset Dynamo: see PeakWindow.start)."""
    if mode == "eager":
        return module
    if mode == "inductor_default":
        return torch.compile(module)
    if mode == "inductor_reduce_overhead":
        return torch.compile(module, mode="reduce-overhead")
    from fxcc.client.backend import fxcc_backend

    return torch.compile(module, backend=fxcc_backend)


def training_step(fn: Callable[..., Any], opt: torch.optim.Optimizer, inputs: tuple[Any, ...]) -> Callable[[], Any]:
    """One training step of a zoo model's loss function: gradients dropped, forward, backward, the
    optimizer's step; returns the loss (bench.profile_kernels and bench.memory_peak time this)."""
    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = fn(*inputs)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def _caller(mode: str, fn: Callable[..., Any], inputs: tuple[Any, ...]) -> Callable[[], Any]:
    if mode == "inductor_reduce_overhead":
        def call() -> Any:
            torch.compiler.cudagraph_mark_step_begin()  # a new step: the last one's outputs may go
            return fn(*inputs)
        return call
    return lambda: fn(*inputs)


def _fxcc_facts(row: dict[str, Any]) -> None:
    """What fxcc's backend did with the model's graphs (sources, fallbacks, CUDA graphs)."""
    from fxcc.client import backend, cuda_graphs

    evs = backend.events()
    row["fxcc_graphs"] = len(evs)
    row["fxcc_fallbacks"] = sum(1 for e in evs if e.error)
    row["fxcc_errors"] = sorted({e.error for e in evs if e.error})[:3]
    row["fxcc_kernels_compiled"] = sum(e.stats.kernels for e in evs if e.stats)
    row["fxcc_extern_ops"] = sorted({o for e in evs if e.stats for o in e.stats.extern_ops})[:40]
    row["fxcc_runs_as"] = sorted({e.runs_as for e in evs if getattr(e, "runs_as", None)})[:6]
    row["fxcc_graph_captures"] = cuda_graphs.stats.captures
    row["fxcc_graph_replays"] = cuda_graphs.stats.replays
    row["fxcc_graph_step_by_step"] = cuda_graphs.stats.step_by_step
    row["fxcc_graph_disabled"] = sorted(set(cuda_graphs.stats.disabled))[:4]
    row["fxcc_graph_pool_mb"] = round(cuda_graphs.stats.pool_bytes / MB, 1)


# ---------------------------------------------------------------- inference and training rows


def run_inference(row: dict[str, Any], built: Built, device: str, modes: tuple[str, ...]) -> None:
    module = built.module.eval()
    tol = OUTPUT_TOL[row["dtype"]]
    with torch.no_grad():
        ref = module(*built.inputs).detach().clone()
        for mode in modes:
            if mode == "inductor_reduce_overhead" and device != "cuda":
                row[f"{mode}_ms"] = None
                continue
            window = PeakWindow(device)
            window.start()
            t0 = time.perf_counter()
            fn = compiled(mode, module)
            call = _caller(mode, fn, built.inputs)
            out = call()
            _sync(device)
            row[f"{mode}_first_call_s"] = round(time.perf_counter() - t0, 2)
            err = rel_error(out, ref)
            del out  # the bench holds no output of its own in the window (a clone was a second logits)
            call()  # fxcc captures its CUDA graphs on the second call, Inductor's trees record on it
            out = call()
            err = max(err, rel_error(out, ref))
            box = [out]
            del out  # `box` holds the only reference: _uncounted_bytes drops it
            uncounted = _uncounted_bytes(box)
            peak, row[f"{mode}_reserved_mb"] = window.peak_mb()
            row[f"{mode}_uncounted_output_mb"] = round(uncounted / MB, 1) if device == "cuda" else None
            row[f"{mode}_allocated_peak_mb"] = peak
            row[f"{mode}_peak_mb"] = None if peak is None else round(peak + uncounted / MB, 1)
            if mode != "eager":
                row[f"{mode}_rel_err"] = float(f"{err:.3g}")
            if mode == "fxcc":
                _fxcc_facts(row)
            row[f"{mode}_ms"] = median_ms(call, device)
            row[f"{mode}_device_ms"], row[f"{mode}_kernels"] = profile_step(call, device)
            del fn, call
    row["tolerance"] = tol
    row["matches_eager"] = _matches(row, "fxcc_rel_err", tol)


def run_training(row: dict[str, Any], built: Built, device: str, modes: tuple[str, ...]) -> None:
    module = built.module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    init = {k: v.detach().clone() for k, v in module.state_dict().items()}
    for mode in modes:
        module.load_state_dict(init)
        for p in params:
            p.grad = None
        window = PeakWindow(device)
        window.start()
        opt = torch.optim.AdamW(params, lr=1e-4, fused=device == "cuda")
        t0 = time.perf_counter()
        fn = compiled(mode, module)

        def step(fn: Callable[..., Any] = fn, opt: torch.optim.Optimizer = opt) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = fn(*built.inputs)
            loss.backward()
            opt.step()
            return loss.detach()

        losses = [float(step())]
        row[f"{mode}_first_call_s"] = round(time.perf_counter() - t0, 2)
        losses += [float(step()) for _ in range(LOSS_STEPS - 1)]
        row[f"{mode}_peak_mb"], row[f"{mode}_reserved_mb"] = window.peak_mb()
        row[f"{mode}_losses"] = [float(f"{x:.6g}") for x in losses]
        if mode != "eager" and "eager_losses" in row:
            ref = row["eager_losses"]
            row[f"{mode}_loss_rel_diff"] = float(f"{max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, ref)):.3g}")
        row[f"{mode}_ms"] = median_ms(step, device)
        row[f"{mode}_device_ms"], row[f"{mode}_kernels"] = profile_step(step, device)
        if mode == "fxcc":
            _fxcc_facts(row)  # after the timed steps: their replays and step-by-step calls counted
        del fn, step, opt
    row["tolerance"] = LOSS_TOL
    row["matches_eager"] = _matches(row, "fxcc_loss_rel_diff", LOSS_TOL)


def _matches(row: dict[str, Any], key: str, tol: float) -> bool | None:
    if row.get(key) is None:
        return None
    return bool(row[key] <= tol and not row.get("fxcc_fallbacks"))


def summarize_row(row: dict[str, Any]) -> None:
    """The headline fields: inductor_ms (the faster mode), ratios, the mode's peak."""
    default, ro = row.get("inductor_default_ms"), row.get("inductor_reduce_overhead_ms")
    mode = "inductor_default" if ro is None or (default is not None and default <= ro) else "inductor_reduce_overhead"
    row["inductor_mode"] = mode.removeprefix("inductor_") if row.get(f"{mode}_ms") is not None else None
    for field in ("ms", "peak_mb", "device_ms", "kernels"):
        row[f"inductor_{field}"] = row.get(f"{mode}_{field}")
    for field in ("fxcc_ms", "fxcc_peak_mb"):
        row.setdefault(field, None)
    if row.get("fxcc_ms") and row.get("inductor_ms"):
        row["fxcc_vs_inductor"] = round(row["fxcc_ms"] / row["inductor_ms"], 3)
    if row.get("fxcc_peak_mb") and row.get("inductor_peak_mb"):
        row["fxcc_vs_inductor_peak"] = round(row["fxcc_peak_mb"] / row["inductor_peak_mb"], 3)
    reserved = row.get(f"{mode}_reserved_mb")
    if row.get("fxcc_reserved_mb") and reserved:
        row["fxcc_vs_inductor_reserved"] = round(row["fxcc_reserved_mb"] / reserved, 3)


def measure_model(spec: ModelSpec, device: str, tiny: bool, modes: tuple[str, ...] | None) -> dict[str, Any]:
    """One row: the model measured in every mode, in this process."""
    row: dict[str, Any] = {"name": spec.name, "source": spec.source, "kind": spec.kind, "dtype": spec.dtype,
                           "config": spec.note + (" (tiny)" if tiny else "")}
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        row["gpu"] = torch.cuda.get_device_name()
    try:
        built = spec.build(device, tiny)
    except Skip as e:
        row["skipped"] = str(e)
        return row
    row["batch"] = built.batch
    row["params_m"] = round(sum(p.numel() for p in built.module.parameters()) / 1e6, 2)
    if spec.kind == "inference":
        run_inference(row, built, device, modes or INFERENCE_MODES)
    else:
        run_training(row, built, device, modes or TRAINING_MODES)
    for mode in ("eager", "inductor_default", "fxcc"):  # the names for them
        row.setdefault(f"{mode}_ms", None)
    summarize_row(row)
    return row


# ---------------------------------------------------------------- the suite: one process per model


def versions() -> dict[str, Any]:
    import importlib

    out: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__}
    for lib in ("triton", "transformers", "timm", "torchvision"):
        try:
            out[lib] = importlib.import_module(lib).__version__
        except Exception:  # noqa: BLE001
            out[lib] = None
    return out  # the GPU's name is each row's (the parent never starts CUDA)


def resolve(names: str) -> list[str]:
    """Model names and group names (all, inference, training, transformers, vision), in order."""
    out: list[str] = []
    for n in (x.strip() for x in names.split(",") if x.strip()):
        if n not in GROUPS and n not in ZOO:
            raise SystemExit(f"unknown model or group {n!r}; models: {', '.join(ZOO)}; groups: {', '.join(GROUPS)}")
        out += [m for m in (GROUPS.get(n) or (n,)) if m not in out]
    return out


def geomean(xs: list[float]) -> float | None:
    return round(math.exp(sum(math.log(x) for x in xs) / len(xs)), 3) if xs else None


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("inference", "training"):
        these = [r for r in rows if r.get("kind") == kind]
        ratios = [r["fxcc_vs_inductor"] for r in these if r.get("fxcc_vs_inductor")]
        peaks = [r["fxcc_vs_inductor_peak"] for r in these if r.get("fxcc_vs_inductor_peak")]
        reserved = [r["fxcc_vs_inductor_reserved"] for r in these if r.get("fxcc_vs_inductor_reserved")]
        out[kind] = {
            "rows": len(these), "measured": len(ratios), "fxcc_vs_inductor_geomean": geomean(ratios),
            "slower_than_inductor": sorted(r["name"] for r in these if (r.get("fxcc_vs_inductor") or 0) > 1.0),
            "peak_ratio_geomean": geomean(peaks),
            "peak_above_inductor_2pct": sorted(r["name"] for r in these
                                               if (r.get("fxcc_vs_inductor_peak") or 0) > 1.02),
            "reserved_ratio_geomean": geomean(reserved),
            "reserved_above_inductor_2pct": sorted(r["name"] for r in these
                                                   if (r.get("fxcc_vs_inductor_reserved") or 0) > 1.02),
            "not_matching_eager": sorted(r["name"] for r in these if r.get("matches_eager") is False),
            "failed": sorted(r["name"] for r in these if r.get("error")),
        }
    return out


def _child_env(run_dir: Path, name: str) -> dict[str, str]:
    env = dict(os.environ)
    env["FXCC_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"fxcc-{name}-", dir=run_dir)  # fxcc cold, per model
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(run_dir / "inductor"))
    env.setdefault("TRITON_CACHE_DIR", str(run_dir / "triton"))
    env.pop("FXCC_URL", None)  # the embedded in-process default
    root = str(Path(__file__).resolve().parent.parent)
    # bench/ importable, after what the caller's path has first (an installed fxcc, which root/fxcc
    # alone is not: its subpackages are mapped by pyproject's package-dir)
    env["PYTHONPATH"] = (env["PYTHONPATH"] + os.pathsep if env.get("PYTHONPATH") else "") + root
    return env


def run_one(name: str, args: argparse.Namespace, run_dir: Path, timeout_s: float) -> dict[str, Any]:
    """The row of one model, measured in a child process (its error if it failed or timed out)."""
    spec = ZOO[name]
    row_path = run_dir / f"{name}.row.json"
    cmd = [sys.executable, "-m", "bench.models", "--child", name, "--row", str(row_path), "--device", args.device]
    if args.tiny:
        cmd.append("--tiny")
    if args.modes:
        cmd += ["--modes", args.modes]
    t0 = time.perf_counter()
    log_path = Path(args.out) / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    error = None
    with log_path.open("w") as log:
        try:
            p = subprocess.run(cmd, env=_child_env(run_dir, name), stdout=log, stderr=subprocess.STDOUT,
                               timeout=timeout_s, check=False, cwd=Path(__file__).resolve().parent.parent)
            if p.returncode != 0:
                error = f"exit {p.returncode}"
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout_s:.0f} s"
    row: dict[str, Any] = {"name": name, "source": spec.source, "kind": spec.kind, "dtype": spec.dtype}
    if row_path.exists():
        row = json.loads(row_path.read_text())
    if error is not None:
        tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-3:]
        row["error"] = f"{error}: {' | '.join(tail)[-600:]}"
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    return row


def write_results(path: Path, rows: list[dict[str, Any]], not_reached: list[str], started: float) -> None:
    """Merge `rows` into `path` by name (rows measured before keep theirs unless measured again)."""
    old: dict[str, Any] = {}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = {}
    by_name = {r["name"]: r for r in old.get("rows", [])}
    by_name.update({r["name"]: r for r in rows})
    order = [n for n in ZOO if n in by_name] + [n for n in by_name if n not in ZOO]
    merged = [by_name[n] for n in order]
    doc = {"suite": "models", "notes": NOTES, "env": versions(), "summary": summary(merged), "rows": merged,
           "not_reached": not_reached, "run_s": round(time.perf_counter() - started, 1)}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="all", help="names or groups: " + ", ".join(GROUPS))
    p.add_argument("--out", default="bench/results", help="folder of h200-models.json (and logs/)")
    p.add_argument("--file", default="h200-models.json")
    p.add_argument("--time-budget-s", type=float, default=480.0, help="no model starts after this")
    p.add_argument("--model-timeout-s", type=float, default=240.0)
    p.add_argument("--grace-s", type=float, default=60.0, help="how long the last model may run past the budget")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny configs and inputs (CPU smoke runs)")
    p.add_argument("--modes", default=None, help="a subset of " + ", ".join(INFERENCE_MODES))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    modes = tuple(a.modes.split(",")) if a.modes else None
    if a.child is not None:  # one model, in this process
        row = measure_model(ZOO[a.child], a.device, a.tiny, modes)
        Path(a.row).write_text(json.dumps(row, indent=1))
        print(json.dumps(row), flush=True)
        return
    names = resolve(a.models)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fxcc-models-") as tmp:
        for i, name in enumerate(names):
            left = a.time_budget_s - (time.perf_counter() - started)
            if left <= 0:
                write_results(out / a.file, rows, names[i:], started)
                print(f"time budget spent: not reached {names[i:]}", flush=True)
                return
            row = run_one(name, a, Path(tmp), min(a.model_timeout_s, left + a.grace_s))
            rows.append(row)
            shown = {k: row.get(k) for k in ("name", "eager_ms", "inductor_ms", "fxcc_ms", "fxcc_vs_inductor",
                                             "fxcc_peak_mb", "inductor_peak_mb", "matches_eager", "error",
                                             "skipped", "wall_s")}
            print(json.dumps(shown), flush=True)
            write_results(out / a.file, rows, [], started)


if __name__ == "__main__":
    main()

"""Warm first calls in fresh processes: fxcc with the Dynamo skip, Dynamo alone, Inductor warm (issue 20).

    python -m bench.dynamo_skip --out $OUT                      # the H200: ResNet-50 and GPT-2
    TRITON_INTERPRET=1 python -m bench.dynamo_skip --out /tmp/ds --tiny   # CPU check, small models
    python -m bench.dynamo_skip --out /tmp/ds --device cpu --profile --fxcc-only   # CPU profile, deeper models

Per workload (torchvision ResNet-50, batch 32 at 224²; transformers GPT-2 small, batch 8 × 512
tokens, use_cache off; `--tiny`: fxcc's own Bottleneck and TransformerBlock at CPU sizes), every
run a fresh process:
- `fxcc serve` with its embedded default starts on a free port (fresh data dir);
- fxcc cold: an empty local cache; compiles through the service, which then holds the artifacts,
  the pre-AOT entries and the Dynamo package (signed by the principal's package key);
- fxcc warm: another empty local cache, the same principal's key file: the package, entries and
  artifacts come from the service (`fxcc_warm_s`; `warm_traced_frames` says whether Dynamo traced);
- fxcc warm2: a third machine, after the warm one (which saves again what it had to trace);
- Dynamo alone (`backend="eager"`, `dynamo_only_s`);
- Inductor cold (fills its own fresh cache dirs), then Inductor warm on them (`inductor_warm_s`).
Times run from torch.compile(...) (where a package loads) to the synchronized result; imports of
torch._dynamo, torch._dynamo.repro.after_dynamo (torch.compile imports it for every backend) and the
backend module, and model construction, come before the clock (`imports_s`); what the backend imports
when it first runs (fxcc's HTTP client and signature checks, as torch._inductor for Inductor) is inside.
Before the clock, in every mode, one `gc.collect()` settles the full collection that the imports and
the model's construction made due (`settle_gc_s`); `gc_s` and `gc_full_collections` are the cyclic
collector's time and full collections inside the timed window (what the compiler's own allocations cost).
`outputs_match`: the warm fxcc result against eager in full fp32 (TF32 off) in that process, within
twice eager-with-TF32's own error (or 1e-4 of the output's scale); `max_abs_err` against eager with TF32.
`--device cpu`: every run on the CPU with Triton's interpreter (TRITON_INTERPRET=1 set for the runs);
without `--tiny` the models are torchvision's and transformers' where installed, else deep stacks of
fxcc's own blocks at CPU sizes (16 Bottlenecks, 12 TransformerBlocks: many modules, so many guards,
as the real models have). `--profile`: each warm fxcc run's cProfile, as text
(logs/<workload>-<run>-profile.txt) and raw (logs/<workload>-<run>.prof, for pstats or snakeviz).
Writes OUT/h200-first-call.json (`--tag` renames it: OUT/<tag>-first-call.json) and logs to OUT/logs.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORKLOADS = ("resnet50", "gpt2")


def build(workload: str, tiny: bool, device: str) -> tuple[Any, tuple[Any, ...]]:
    """(model, inputs) on `device`, eval mode, seeded."""
    import torch

    torch.manual_seed(0)
    if tiny:
        from fxcc.client.examples import Bottleneck, TransformerBlock

        if workload == "resnet50":
            return Bottleneck(32, 8, 2).eval(), (torch.randn(2, 32, 8, 8),)
        return TransformerBlock(64, 4).eval(), (torch.randn(2, 16, 64),)
    if device == "cpu":
        return _cpu_model(workload)
    if workload == "resnet50":
        import torchvision

        return torchvision.models.resnet50().to(device).eval(), (torch.randn(32, 3, 224, 224, device=device),)
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(use_cache=False)).to(device).eval()
    return model, (torch.randint(0, 50257, (8, 512), device=device),)


def _cpu_model(workload: str) -> tuple[Any, tuple[Any, ...]]:
    """The workload at sizes Triton's interpreter runs in seconds: the real model where its package is
    installed (tiny inputs), else a deep stack of fxcc's own blocks (as many modules and guards)."""
    import importlib.util

    import torch
    from torch import nn

    if workload == "resnet50":
        if importlib.util.find_spec("torchvision") is not None:
            import torchvision

            return torchvision.models.resnet50().eval(), (torch.randn(1, 3, 32, 32),)
        from fxcc.client.examples import Bottleneck

        return nn.Sequential(*[Bottleneck(32, 8) for _ in range(16)]).eval(), \
            (torch.randn(1, 32, 8, 8),)
    if importlib.util.find_spec("transformers") is not None:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(use_cache=False, n_embd=64, n_head=4, n_positions=64, vocab_size=512)
        return GPT2LMHeadModel(config).eval(), (torch.randint(0, 512, (1, 16)),)
    from fxcc.client.examples import TransformerBlock

    return nn.Sequential(*[TransformerBlock(64, 4) for _ in range(12)]).eval(), (torch.randn(1, 16, 64),)


def _tensor(out: Any) -> Any:
    if hasattr(out, "logits"):
        return out.logits
    return out[0] if isinstance(out, (tuple, list)) else out


def run_one(workload: str, compiler: str, tiny: bool, device: str) -> dict[str, Any]:
    """One first call in this (fresh) process."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model, inputs = build(workload, tiny, device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    importlib.import_module("torch._dynamo")
    importlib.import_module("torch._dynamo.repro.after_dynamo")  # torch.compile imports it for every backend
    if compiler == "fxcc":
        # what torch.compile(backend="fxcc") imports; its HTTP client (fxcc.client.remote) is imported
        # on the warm path by a real user's first torch.compile, so inside the clock
        importlib.import_module("fxcc.client.backend")
    elif compiler == "eager":  # torch imports every backend module it ships to find "eager"
        importlib.import_module("torch._dynamo.backends.registry").lookup_backend("eager")
    imports_s = time.perf_counter() - t0
    import torch._dynamo.utils as dynamo_utils

    # The full collection the imports and the model's construction made due (transformers leaves
    # millions of objects that no collection has seen) lands in whichever timed window comes first,
    # whatever the compiler: settled here, before the clock, in every mode; its time is reported.
    t0 = time.perf_counter()
    gc.collect()
    settle_gc_s = time.perf_counter() - t0

    profile_to = os.environ.get("FXCC_BENCH_PROFILE")  # --profile: where this run's cProfile goes
    profiler = None
    if profile_to:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    gc_time = _GcTimer()
    t0 = time.perf_counter()
    compiled = torch.compile(model, backend={"fxcc": "fxcc", "eager": "eager", "inductor": "inductor"}[compiler])
    wrapped_s = time.perf_counter() - t0
    with torch.no_grad():
        out = _tensor(compiled(*inputs))
        sync()
        first_call_s = time.perf_counter() - t0
        gc_time.stop()
        if profiler is not None:
            profiler.disable()
            _write_profile(profiler, Path(profile_to))
        expected = _tensor(model(*inputs))
        # TF32 rounds eager's own matmuls and convolutions (a 0.03 difference in ResNet-50's logits,
        # Inductor's the same): both are judged against eager in full fp32.
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        reference = _tensor(model(*inputs)).float()
    err = float((out.float() - expected.float()).abs().max())
    err_ref = float((out.float() - reference).abs().max())
    eager_err_ref = float((expected.float() - reference).abs().max())
    matches = err_ref <= max(2 * eager_err_ref, 1e-4 * max(1.0, float(reference.abs().max())))
    res: dict[str, Any] = {"first_call_s": round(first_call_s, 4), "torch_compile_s": round(wrapped_s, 4),
                           "imports_s": round(imports_s, 3), "max_abs_err": err,
                           "max_abs_err_vs_fp32": err_ref, "eager_tf32_err_vs_fp32": eager_err_ref,
                           "outputs_match": bool(matches),
                           "traced_frames": dynamo_utils.counters["frames"]["ok"],
                           "gc_s": round(gc_time.seconds, 4), "gc_full_collections": gc_time.full,
                           "settle_gc_s": round(settle_gc_s, 4)}
    if compiler == "fxcc":
        from fxcc.client import backend, dynamo_cache

        res.update(sources=sorted({e.source for e in backend.events()}), graphs=len(backend.events()),
                   aot_runs=backend.aot_runs(), dynamo_cache=dynamo_cache.counters(),
                   package_load=dynamo_cache.load_timings(),
                   fxcc_own_s=round(sum(e.seconds for e in backend.events()), 4))
    return res


class _GcTimer:
    """Time the cyclic garbage collector spent from here to `stop` (gc's own callbacks)."""

    def __init__(self) -> None:
        import gc

        self.seconds, self.full, self._start = 0.0, 0, 0.0
        self._gc = gc
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._start
        self.full += info.get("generation") == 2

    def stop(self) -> None:
        self._gc.callbacks.remove(self._callback)


def _write_profile(profiler: Any, path: Path) -> None:
    """The profile's top functions by cumulative and by own time, and fxcc's own, as text at `path`;
    the raw profile beside it (`<workload>-<run>.prof`, for pstats or snakeviz)."""
    import io
    import pstats

    profiler.dump_stats(str(path.with_name(path.name.removesuffix("-profile.txt") + ".prof")))
    buf = io.StringIO()
    stats = pstats.Stats(profiler, stream=buf)
    stats.sort_stats("cumulative").print_stats(80)
    stats.sort_stats("tottime").print_stats(40)
    buf.write("fxcc's own functions (client/, compiler_core/), by cumulative time:\n")
    stats.sort_stats("cumulative").print_stats(r"/(client|compiler_core)/[a-z_]+\.py", 60)
    path.write_text(buf.getvalue())


def _child(args: list[str], env: dict[str, str], log: Path, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.dynamo_skip", "run", *args]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    with log.open("a") as f:
        f.write(f"=== {' '.join(cmd)} (exit {p.returncode})\n{p.stdout}\n{p.stderr[-20000:]}\n")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()
        return {"error": f"exit {p.returncode}: {tail[-1] if tail else 'no output'}"}
    return json.loads(lines[-1])


PASSED_SETTINGS = ("FXCC_PREWARM_THREADS",)


def bench_workload(workload: str, tiny: bool, device: str, root: Path, log: Path, timeout_s: float,
                   profile: bool = False, others: bool = True) -> dict[str, Any]:
    from fxcc.client.demo import free_port, stop, wait_healthy

    t = root / workload
    # the caller's fxcc settings stay out of the runs but for the ones a run is meant to vary
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("FXCC_", "TORCHINDUCTOR_", "TRITON_CACHE")) or k in PASSED_SETTINGS}
    base.update(PYTHONUNBUFFERED="1", FXCC_PACKAGE_KEY_FILE=str(t / "principal" / "package.key"))
    if tiny or device == "cpu":
        base["TRITON_INTERPRET"] = "1"
    args = ["--workload", workload, "--device", device, *(["--tiny"] if tiny else [])]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve_env = dict(base, FXCC_DATA_DIR=str(t / "service"), TRITON_CACHE_DIR=str(t / "service-triton"))
    row: dict[str, Any] = {"workload": workload, "tiny": tiny,
                           **{k: os.environ[k] for k in PASSED_SETTINGS if k in os.environ}}
    with (t.parent / f"{workload}-service.log").open("w") as slog:
        server = subprocess.Popen([sys.executable, "-m", "fxcc.client.cli", "serve", "--port", str(port)],
                                  env=serve_env, stdout=slog, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, server, timeout_s=120.0)
            for run in ("fxcc_cold", "fxcc_warm", "fxcc_warm2"):
                # clients trust the embedded service's own signing key (made under its data dir)
                env = dict(base, FXCC_URL=url, FXCC_FALLBACK="error", FXCC_DYNAMO_CACHE="1",
                           FXCC_CACHE_DIR=str(t / f"{run}-cache"),
                           FXCC_TRUSTED_KEYS=str(t / "service" / "keys" / "signing.pub"),
                           TRITON_CACHE_DIR=str(t / f"{run}-triton"), TORCHINDUCTOR_CACHE_DIR=str(t / f"{run}-ind"))
                if profile and run != "fxcc_cold":
                    env.update(FXCC_BENCH_PROFILE=str(log.parent / f"{workload}-{run}-profile.txt"), TORCH_LOGS="dynamo")
                row[run] = _child([*args, "--compiler", "fxcc"], env, log, timeout_s)
        finally:
            stop(server, 15)
    if not others:
        for run in ("fxcc_warm", "fxcc_warm2"):
            row[f"{run}_s"] = row[run].get("first_call_s")
        return row
    row["dynamo_only"] = _child([*args, "--compiler", "eager"],
                                dict(base, TORCHINDUCTOR_CACHE_DIR=str(t / "eager-ind")), log, timeout_s)
    ind = dict(base, TORCHINDUCTOR_CACHE_DIR=str(t / "inductor-cache"), TRITON_CACHE_DIR=str(t / "inductor-triton"))
    for run in ("inductor_cold", "inductor_warm"):
        row[run] = _child([*args, "--compiler", "inductor"], ind, log, timeout_s)
    for run in ("fxcc_cold", "fxcc_warm", "fxcc_warm2", "dynamo_only", "inductor_cold", "inductor_warm"):
        row[f"{run}_s"] = row[run].get("first_call_s")
    warm = row["fxcc_warm"]
    row["outputs_match"] = warm.get("outputs_match")
    row["max_abs_err"] = warm.get("max_abs_err")
    row["warm_traced_frames"] = warm.get("traced_frames")
    if row["fxcc_warm_s"] and row["inductor_warm_s"]:
        row["fxcc_over_inductor_warm"] = round(row["fxcc_warm_s"] / row["inductor_warm_s"], 4)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    r = sub.add_parser("run", help="one first call in this process (the parent runs these)")
    r.add_argument("--workload", choices=WORKLOADS, required=True)
    r.add_argument("--compiler", choices=("fxcc", "eager", "inductor"), required=True)
    r.add_argument("--tiny", action="store_true")
    r.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, help="where h200-first-call.json and logs/ go")
    p.add_argument("--tiny", action="store_true", help="small models on the CPU (set TRITON_INTERPRET=1)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu (Triton's interpreter; small models)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--tag", default="h200")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--fxcc-only", action="store_true", help="only fxcc's cold and warm runs (no Dynamo-alone, no Inductor)")
    p.add_argument("--profile", action="store_true",
                   help="cProfile the warm fxcc runs (logs/<workload>-<run>-profile.txt, raw: logs/<workload>-<run>.prof) "
                        "and log what Dynamo traces")
    a = p.parse_args()
    if a.cmd == "run":
        print(json.dumps(run_one(a.workload, a.compiler, a.tiny, "cpu" if a.tiny else a.device), default=str))
        return
    if a.out is None:
        p.error("--out is required")
    device = "cpu" if a.tiny else a.device
    (a.out / "logs").mkdir(parents=True, exist_ok=True)
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory(prefix="fxcc-bench-dynamo-skip-") as tmp:
        for workload in a.workloads.split(","):
            row = bench_workload(workload, a.tiny, device, Path(tmp), a.out / "logs" / f"{workload}.log",
                                 a.timeout_s, a.profile, not a.fxcc_only)
            rows.append(row)
            for name in ("service.log",):
                src = Path(tmp) / f"{workload}-{name}"
                if src.exists():
                    (a.out / "logs" / f"{workload}-{name}").write_text(src.read_text()[-200_000:])
            print(json.dumps({k: v for k, v in row.items() if not isinstance(v, dict)}), flush=True)
    path = a.out / f"{a.tag}-first-call.json"
    path.write_text(json.dumps({"bench": "dynamo_skip", "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Autotuning on a GPU: benchmark each kernel's candidate launch configs and keep the fastest
one that computes what the heuristic config computes.

A config is XBLOCK (and RBLOCK), num_warps, num_stages and, for a reduction, whether it runs
persistent (the whole row in registers) or looped (RBLOCK at a time). The heuristic config
(codegen.triton.launch_config) is always a candidate and the reference: every other candidate
runs once from the same random buffers and must leave them as the heuristic left them (within
float tolerance) before its time counts. Times are medians of `triton.testing.do_bench`.

Note: tuning runs before the build step, so cubins are built for the winning configs. A tuned
kernel keeps its name; when the other reduction form wins, its source blob is that form's
source with the function renamed to the kernel's name. Every launch of a kernel gets the
winner's config and a grid recomputed from its XBLOCK (`retile_step`).
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fxcc.compiler_core.artifact import Artifact, KernelInfo, KernelStep, Plan, TuningRecord, add_blob
from fxcc.compiler_core.codegen.attention import is_template_kernel
from fxcc.compiler_core.codegen.triton import RBLOCK_MAX, XBLOCK_MAX, launch_grid, next_pow2, render_kernel
from fxcc.compiler_core.errors import AutotuneError
from fxcc.compiler_core.scheduler import Kernel, loopable
from fxcc.compiler_core.tuning import (
    Timer,
    device_name,
    do_bench_ms,
    load_jit,
    mismatch,
    random_buffer,
    renamed,
    select_config,
    short_error,
)
from fxcc.compiler_core.wire import CompileRequest, IntArg, NodeRef

log = logging.getLogger("fxcc.autotune")

# Whole artifacts stop tuning after this long; the kernels left keep their heuristic config.
DEFAULT_BUDGET_S = 300.0
# Rows up to this long may also run persistent (the scheduler loops past PERSISTENT_RNUMEL_MAX).
PERSISTENT_CANDIDATE_MAX = {"default": 8192, "max-autotune": 16384}
# Rows at least this long may also run looped (short rows are always fastest in registers).
LOOPED_CANDIDATE_MIN = {"default": 1024, "max-autotune": 256}
# Elements one program holds per reduction tile (XBLOCK * RBLOCK), at most.
TILE_MAX = {"default": 8192, "max-autotune": 16384}


# ---------------------------------------------------------------- configs and candidates


@dataclass(frozen=True)
class Config:
    """One launch config. `rblock` 0 means a pointwise kernel (no RBLOCK parameter)."""

    xblock: int
    rblock: int = 0
    num_warps: int = 4
    num_stages: int = 1
    looped: bool = False

    @property
    def constexprs(self) -> dict[str, int]:
        return {"XBLOCK": self.xblock} | ({"RBLOCK": self.rblock} if self.rblock else {})

    @property
    def label(self) -> str:
        """A stable name: `x1024_w4_s1`, `x4_r2048_w8_s1_looped`, `x8_r512_w4_s1_persistent`."""
        text = f"x{self.xblock}" + (f"_r{self.rblock}" if self.rblock else "")
        text += f"_w{self.num_warps}_s{self.num_stages}"
        if self.rblock:
            text += "_looped" if self.looped else "_persistent"
        return text

    @classmethod
    def of(cls, info: KernelInfo, looped: bool) -> Config:
        """The config a KernelInfo launches with (its heuristic one, before tuning)."""
        c = info.constexprs
        return cls(c["XBLOCK"], c.get("RBLOCK", 0), info.num_warps, info.num_stages,
                   looped and "RBLOCK" in c)


@dataclass(frozen=True)
class KernelShape:
    """What candidate generation needs to know of a kernel (sizes are the largest launch's)."""

    xnumel: int
    rnumel: int = 1
    looped: bool = False  # the scheduler's choice, which the heuristic config uses
    column: bool = False  # a reduction along a strided dim (wide XBLOCK tiles, looped)
    can_loop: bool = False  # the kernel has a valid looped form
    can_persist: bool = True  # the kernel has a valid persistent form


def candidate_configs(shape: KernelShape, heuristic: Config, mode: str = "default") -> list[Config]:
    """The configs to benchmark, the heuristic one first; "max-autotune" widens every axis."""
    wide = mode == "max-autotune"
    if shape.rnumel <= 1:
        found = _pointwise(shape, wide)
    else:
        key = "max-autotune" if wide else "default"
        found = []
        if shape.can_persist and (not shape.looped or shape.rnumel <= PERSISTENT_CANDIDATE_MAX[key]):
            found += _persistent(shape, wide)
        if shape.can_loop and (shape.looped or shape.rnumel >= LOOPED_CANDIDATE_MIN[key]):
            found += _column(shape, wide) if shape.column else _looped(shape, wide)
    out = [heuristic]
    for c in found:
        if c not in out:
            out.append(c)
    return out


def _pointwise(shape: KernelShape, wide: bool) -> list[Config]:
    top = min(XBLOCK_MAX, max(16, next_pow2(shape.xnumel)))
    xblocks = (64, 128, 256, 512, 1024, 2048, 4096) if wide else (256, 512, 1024, 2048)
    warps = (1, 2, 4, 8, 16) if wide else (4, 8)
    return [Config(x, 0, w) for x in xblocks for w in warps if x <= top and x >= 32 * w]


def _persistent(shape: KernelShape, wide: bool) -> list[Config]:
    rblock = next_pow2(shape.rnumel)
    tile_max = TILE_MAX["max-autotune" if wide else "default"]
    xtop = next_pow2(shape.xnumel)
    out = []
    for x in (1, 2, 4, 8, 16, 32, 64):
        tile = x * rblock
        if x > xtop or tile > max(tile_max, rblock):
            continue
        for w in (2, 4, 8, 16):
            # Note: at least one element per thread and at most 64 (else registers spill); the
            # default search also keeps 8 or more per thread, as launch_config does.
            if 32 * w > max(tile, 32) or tile > 64 * 32 * w:
                continue
            if wide or w <= max(2, tile // 256):
                out.append(Config(x, rblock, w))
    return out


def _looped(shape: KernelShape, wide: bool) -> list[Config]:
    rtop = next_pow2(shape.rnumel)
    tile_max = TILE_MAX["max-autotune" if wide else "default"]
    rblocks = (512, 1024, 2048, 4096) if wide else (1024, 2048, 4096)
    xblocks = (1, 2, 4) if wide else (1, 2)
    warps = (4, 8, 16) if wide else (4, 8)
    stages = (1, 2) if wide else (1,)
    return [Config(x, r, w, s, True) for x in xblocks for r in rblocks for w in warps for s in stages
            if r <= min(rtop, RBLOCK_MAX) and x * r <= tile_max and x <= next_pow2(shape.xnumel)
            and 32 * w <= x * r]


def _column(shape: KernelShape, wide: bool) -> list[Config]:
    """Tiles wide along the contiguous outputs and shallow along the strided reduced elements
    (Inductor's outer-reduction shapes: 64 × 8 and the like), and the older narrow deep ones."""
    rtop = next_pow2(shape.rnumel)
    shapes = [(x, r) for x in (64, 128) for r in (8, 16, 32)] + [(32, 32), (16, 64), (8, 128)]
    if wide:
        shapes += [(256, 8), (32, 64), (16, 128), (8, 64), (64, 64)]
    warps = (4, 8)
    stages = (1, 2) if wide else (1,)
    return [Config(x, r, w, s, True) for x, r in shapes for w in warps for s in stages
            if r <= rtop and x * r <= 8192 and x <= next_pow2(shape.xnumel) and 32 * w <= x * r]


def retile_step(step: KernelStep, xblock: int) -> KernelStep:
    """The step with its grid recomputed for tiles of `xblock` rows (the only grid rule)."""
    xnumel, _ = step_sizes(step)
    return step.model_copy(update={"grid": launch_grid(xnumel, xblock)})


def step_sizes(step: KernelStep) -> tuple[int, int]:
    """(xnumel, rnumel) of a launch: the int arguments after the buffers, as plan.build_plan adds them."""
    ints = [a.value for a in step.args if isinstance(a, IntArg)]
    if not ints:
        raise AutotuneError(f"launch of {step.kernel} passes no xnumel", node=step.kernel)
    return ints[0], (ints[1] if len(ints) > 1 else 1)


# ---------------------------------------------------------------- choosing a winner


# ---------------------------------------------------------------- benchmarking with Triton


class TritonBench:
    """One kernel's launches over random buffers of its sizes, on `device`.

    `sources` maps the looped flag to that form's @triton.jit function. Every run starts from
    the same initial contents of every buffer (inputs and outputs alike), so a candidate that
    skips writing an element leaves that element's random start value, which the check catches.
    """

    def __init__(self, sources: dict[bool, Any], step: KernelStep, buffers: dict[str, Any],
                 device: str, timer: Timer = do_bench_ms) -> None:
        self.sources = sources
        self.xnumel, _ = step_sizes(step)
        self.timer = timer
        self.device = device
        self.args: list[Any] = []
        self.tensors: list[Any] = []
        for a in step.args:
            if isinstance(a, NodeRef):
                t = random_buffer(buffers[a.name], device)
                self.args.append(t)
                self.tensors.append(t)
            else:
                self.args.append(a.value)
        self.initial = [t.clone() for t in self.tensors]

    def launch(self, config: Config) -> None:
        fn = self.sources[config.looped]
        grid = tuple(launch_grid(self.xnumel, config.xblock))
        fn[grid](*self.args, **config.constexprs, num_warps=config.num_warps,
                 num_stages=config.num_stages)

    def run(self, config: Config) -> list[Any]:
        for t, start in zip(self.tensors, self.initial):
            t.copy_(start)
        self.launch(config)
        self._sync()
        return [t.clone() for t in self.tensors]

    def time_ms(self, config: Config) -> float:
        return self.timer(config, lambda: self.launch(config))

    def _sync(self) -> None:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)


# ---------------------------------------------------------------- whole artifacts


@dataclass(frozen=True)
class _Scheduled:
    """A kernel of the compile's schedule and the buffers its launches read and write."""

    kernel: Kernel
    buffers: dict[str, Any]
    target: str


# The compile's fused kernels by name, (scheduler Kernel, buffers, target) (pipeline.Compilation.scheduled).
ScheduledKernels = Mapping[str, tuple[Kernel, dict[str, Any], str]]


def autotune_artifact(artifact: Artifact, request: CompileRequest, device: str = "cuda", *,
                      scheduled: ScheduledKernels | Callable[[], ScheduledKernels] | None = None,
                      timer: Timer = do_bench_ms, budget_s: float = DEFAULT_BUDGET_S) -> Artifact:
    """The artifact with every kernel's config chosen by measurement on `device`, marked tuned.

    `scheduled`: the compile's fused kernels by name (or what gives them, asked once tuning
    starts: pipeline.Compilation.scheduled, which for a stored artifact runs its request's front
    stages); without them only template kernels are tuned. A kernel that cannot be tuned (no
    launch, not in the schedule, its reference config fails, the budget is spent) keeps its
    heuristic config and no TuningRecord; one tuned before keeps its config and record. If no
    kernel was tuned, the artifact comes back unchanged (and untuned).
    """
    manifest = artifact.manifest
    if not manifest.kernels:
        return artifact
    found_kernels = (scheduled() if callable(scheduled) else scheduled) or {}
    scheduled_by_name = {name: _Scheduled(*found) for name, found in found_kernels.items()}
    launches = launches_by_kernel(manifest.plan)
    blobs = dict(artifact.blobs)
    started = time.monotonic()
    deadline = started + budget_s
    kernels: list[KernelInfo] = []
    with tempfile.TemporaryDirectory(prefix="fxcc-tune-") as tmp:
        for info in manifest.kernels:
            if is_template_kernel(info.name) and not info.tuned and launches.get(info.name) \
                    and time.monotonic() <= deadline:
                kernels.append(_tune_template(info, launches[info.name], manifest.plan, blobs,
                                              request.options.mode, device, timer, Path(tmp)))
                continue
            found = scheduled_by_name.get(info.name)
            if info.tuned or time.monotonic() > deadline or found is None or not launches.get(info.name):
                why = ("tuned before" if info.tuned else "budget spent" if found is not None
                       else "not in the compile's schedule")
                log.info("kernel %s keeps its config: %s", info.name, why)
                kernels.append(info)
                continue
            try:
                kernels.append(tune_kernel(info, found, launches[info.name], blobs, request.options.mode,
                                           device, timer, Path(tmp)))
            except Exception as e:  # noqa: BLE001 - an untuned kernel is still a correct kernel
                log.warning("kernel %s keeps its heuristic config: %s", info.name, short_error(e))
                kernels.append(info)
    if all(new is old for new, old in zip(kernels, manifest.kernels)):
        return artifact  # nothing (newly) tuned
    tuned = {k.name: k for k in kernels if k.tuned}
    steps = [_regrid(s, tuned[s.kernel]) if isinstance(s, KernelStep) and s.kernel in tuned else s
             for s in manifest.plan.steps]
    plan = manifest.plan.model_copy(update={"steps": steps})
    stats = manifest.stats.model_copy(update={"tune_s": round(time.monotonic() - started, 3)})
    new = manifest.model_copy(update={"kernels": kernels, "plan": plan, "tuned": True, "stats": stats})
    used = {ref.digest for ref in new.blob_refs()}
    return Artifact(new, {d: b for d, b in blobs.items() if d in used})


def _regrid(step: KernelStep, info: KernelInfo) -> KernelStep:
    """A launch of a tuned kernel with the grid its config needs."""
    if is_template_kernel(info.name):
        from fxcc.compiler_core import autotune_attention

        return autotune_attention.retile_step(step, info.constexprs["BLOCK_M"])
    return retile_step(step, info.constexprs["XBLOCK"])


def _tune_template(info: KernelInfo, launches: Sequence[KernelStep], plan: Plan, blobs: dict[str, bytes],
                   mode: str, device: str, timer: Timer, tmp: Path) -> KernelInfo:
    """A template kernel tuned over its own candidates (compiler_core.autotune_attention), or
    `info` unchanged when that fails."""
    from fxcc.compiler_core import autotune_attention

    try:
        return autotune_attention.tune_template(info, launches, plan, blobs[info.source.digest].decode(), mode,
                                                device, timer, tmp)
    except Exception as e:  # noqa: BLE001 - an untuned kernel is still a correct kernel
        log.warning("kernel %s keeps its heuristic config: %s", info.name, short_error(e))
        return info


def tune_kernel(info: KernelInfo, found: _Scheduled, launches: Sequence[KernelStep], blobs: dict[str, bytes],
                mode: str, device: str, timer: Timer, tmp: Path) -> KernelInfo:
    """`info` with the winning config (and form's source) of its candidates, measured on the
    kernel's largest launch. Raises AutotuneError when its heuristic config cannot run."""
    kernel = found.kernel
    step = max(launches, key=lambda s: step_sizes(s)[0] * step_sizes(s)[1])
    xnumel, _ = step_sizes(step)
    rnumel = max(step_sizes(s)[1] for s in launches)
    shape = KernelShape(xnumel, rnumel, kernel.looped, kernel.column, can_loop(kernel),
                        not kernel.column)
    heuristic = Config.of(info, kernel.looped)
    candidates = candidate_configs(shape, heuristic, mode)
    texts = {kernel.looped: blobs[info.source.digest].decode()}
    if any(c.looped != kernel.looped for c in candidates):
        other = render_kernel(kernel, found.buffers, found.target, looped=not kernel.looped)
        texts[not kernel.looped] = renamed(other.source, other.name, info.name)
    interpret = found.target == "interpret"
    sources = {looped: load_jit(text, info.name, tmp, interpret) for looped, text in texts.items()}
    bench = TritonBench(sources, step, found.buffers, device, timer)
    winner, timings, rejected = select_config(candidates, bench)
    record = TuningRecord(device=device_name(device), heuristic=heuristic.label, winner=winner.label,
                          timings_ms={k: round(v, 5) for k, v in timings.items()}, rejected=rejected,
                          sizes=[xnumel] + ([rnumel] if rnumel > 1 else []))
    log.info("kernel %s: %s won over %d candidates (heuristic %s: %.4f ms, winner %.4f ms)", info.name,
             winner.label, len(candidates), heuristic.label, timings[heuristic.label], timings[winner.label])
    update: dict[str, Any] = {"tuning": record}
    if winner != heuristic:
        update |= {"constexprs": winner.constexprs, "num_warps": winner.num_warps,
                   "num_stages": winner.num_stages, "binaries": {}, "metadata": {}}
        if winner.looped != kernel.looped:
            update["source"] = add_blob(blobs, texts[winner.looped].encode())
    return info.model_copy(update=update)


def can_loop(kernel: Kernel) -> bool:
    """Whether a looped form of `kernel` is valid: its reductions first, sharing one r-loop, then
    only per-row work (the shape the scheduler gives looped kernels, see scheduler.loopable)."""
    return loopable(kernel)


def launches_by_kernel(plan: Plan) -> dict[str, list[KernelStep]]:
    out: dict[str, list[KernelStep]] = {}
    for step in plan.steps:
        if isinstance(step, KernelStep):
            out.setdefault(step.kernel, []).append(step)
    return out


# Note: one tuning at a time per process, so that consumers sharing a GPU do not time each other.
_gpu_lock = threading.Lock()


def autotune_for_target(artifact: Artifact, request: CompileRequest, device: str | None, *,
                        scheduled: ScheduledKernels | Callable[[], ScheduledKernels] | None = None) -> Artifact:
    """The pipeline's tune stage: `artifact` tuned on `device` when that is a GPU of the request's
    target arch, else unchanged (untuned); `scheduled` as autotune_artifact takes it. Never
    raises: tuning is an optimisation."""
    target = request.options.target
    if device is None or target.kind != "cuda" or not artifact.manifest.kernels:
        return artifact
    if artifact.manifest.plan.symbols:
        # Note: a plan with symbolic sizes serves many sizes; timings at one would not transfer.
        log.info("not tuning a plan with symbolic sizes (it keeps its heuristic configs)")
        return artifact
    gpu = tuning_device(target.arch, device)
    if gpu is None:
        log.info("not tuning for sm_%d on %s: no GPU of that arch here", target.arch, device)
        return artifact
    try:
        import torch

        with _gpu_lock, torch.cuda.device(torch.device(gpu)):
            return autotune_artifact(artifact, request, gpu, scheduled=scheduled)
    except Exception as e:  # noqa: BLE001 - the untuned artifact is correct
        log.warning("autotuning failed, the artifact keeps its heuristic configs: %s", short_error(e))
        return artifact


def tuning_device(target_arch: int, device: str) -> str | None:
    """`device` when it is a CUDA GPU of the target's arch (timings on another GPU would not
    transfer), else None."""
    return device if device_arch(device) == target_arch else None


def device_arch(device: str) -> int | None:
    """The SM arch of CUDA GPU `device` (90 for an H100/H200), or None when it is not a usable GPU."""
    if not device.startswith("cuda"):
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(device)
    except Exception:  # noqa: BLE001 - no usable GPU: no tuning
        return None
    return major * 10 + minor


__all__ = ["Config", "KernelShape", "autotune_artifact", "autotune_for_target", "candidate_configs", "device_arch",
           "mismatch", "retile_step", "select_config", "tuning_device"]

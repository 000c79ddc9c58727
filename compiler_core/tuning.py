"""Measuring kernels for autotuning: run a kernel under candidate configs, check each against the
heuristic reference, time it, pick the winner. Shared by the pointwise/reduction tuner
(compiler_core.autotune) and the attention template's (compiler_core.autotune_attention)."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from fxcc.compiler_core.errors import AutotuneError


class Bench(Protocol):
    """Runs one kernel under candidate configs over fixed buffers."""

    def run(self, config: Any) -> Sequence[Any]:
        """Launch once from the initial buffers; every buffer argument afterwards."""
        ...

    def time_ms(self, config: Any) -> float: ...


def select_config(candidates: Sequence[Any], bench: Bench,
                  check: Callable[[Sequence[Any], Sequence[Any]], str | None] | None = None,
                  ) -> tuple[Any, dict[str, float], dict[str, str]]:
    """(winner, times by label, rejected labels with why) over `candidates` (Configs, or any
    config with a `label`), the first of which is the heuristic reference. `check` compares a
    candidate's buffers with the reference's (default: `mismatch`). Raises AutotuneError when
    the reference itself cannot run."""
    check = check or mismatch
    reference = candidates[0]
    try:
        expected = bench.run(reference)
        timings = {reference.label: bench.time_ms(reference)}
    except Exception as e:  # reported as the kernel's tuning failure
        raise AutotuneError(f"the heuristic config {reference.label} failed: {short_error(e)}") from e
    rejected: dict[str, str] = {}
    for config in candidates[1:]:
        try:
            why = check(bench.run(config), expected)
            if why is None:
                timings[config.label] = bench.time_ms(config)
        except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or run loses
            why = short_error(e)
        if why is not None:
            rejected[config.label] = why
    by_label = {c.label: c for c in candidates}
    # Note: min keeps the first of equal times, and the heuristic is first: ties keep it.
    winner = by_label[min(timings, key=timings.__getitem__)]
    return winner, timings, rejected


# (rtol, atol as a fraction of the reference's largest finite magnitude) per float dtype name.
TOLERANCES = {"float64": (1e-7, 1e-7), "float32": (1e-4, 1e-5), "bfloat16": (1.6e-2, 1e-2),
              "float16": (1e-3, 1e-3)}


def mismatch(got: Sequence[Any], expected: Sequence[Any]) -> str | None:
    """Why `got` buffers differ from `expected` ones, or None when they agree.

    Floats may differ by reduction order (a looped sum adds in another order): they agree within
    TOLERANCES; NaN must meet NaN. Integers and bools must be equal.
    """
    import torch

    if len(got) != len(expected):
        return f"{len(got)} buffers, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        if g.dtype != e.dtype or g.shape != e.shape:
            return f"buffer {i}: {g.dtype}{list(g.shape)}, expected {e.dtype}{list(e.shape)}"
        tol = TOLERANCES.get(str(e.dtype).removeprefix("torch."))
        if tol is None:
            ok = torch.equal(g, e)
        else:
            finite = e[torch.isfinite(e)].abs()
            scale = max(1.0, float(finite.max())) if finite.numel() else 1.0
            ok = torch.allclose(g.double(), e.double(), rtol=tol[0], atol=tol[1] * scale, equal_nan=True)
        if not ok:
            return f"output differs from the heuristic config's (buffer {i})"
    return None


def short_error(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {' | '.join(lines[:1] + lines[-1:])}"[:300]


Timer = Callable[[Any, Callable[[], None]], float]


def do_bench_ms(config: Any, launch: Callable[[], None]) -> float:
    """The median time of `launch` in ms by triton.testing.do_bench (which flushes L2 between runs)."""
    from triton.testing import do_bench

    return float(do_bench(launch, warmup=10, rep=40, return_mode="median"))


def random_buffer(buf: Any, device: str) -> Any:
    """A tensor of `buf`'s dtype, sizes and strides (offset 0) filled with random values."""
    import torch

    span = 1 + sum((n - 1) * s for n, s in zip(buf.sizes, buf.strides)) if all(buf.sizes) else 0
    dtype = buf.dtype
    if dtype.is_floating_point:
        flat = torch.randn(span, device=device).to(dtype)
    elif dtype == torch.bool:
        flat = torch.rand(span, device=device) < 0.5
    else:
        low = 0 if dtype == torch.uint8 else -100
        flat = torch.randint(low, 100, (span,), device=device).to(dtype)
    return flat.as_strided(buf.sizes, buf.strides)


def load_jit(source: str, name: str, tmp: Path, interpret: bool) -> Any:
    """The @triton.jit function `name` of `source` (written to a file: triton.jit reads it)."""
    from triton.runtime.jit import JITFunction

    stem = f"fxcc_tune_{abs(hash(source)):x}_{name}"
    path = tmp / f"{stem}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(stem, path)
    if spec is None or spec.loader is None:
        raise AutotuneError(f"cannot load kernel source of {name}", node=name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = getattr(mod, name, None)
    raw = getattr(fn, "fn", None)
    if raw is None:
        raise AutotuneError(f"kernel {name} is not a @triton.jit function in its source", node=name)
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return fn if isinstance(fn, InterpretedFunction) else InterpretedFunction(raw)
    return fn if isinstance(fn, JITFunction) else JITFunction(raw)


def renamed(source: str, old: str, new: str) -> str:
    """`source` with its kernel function `old` called `new`."""
    return re.sub(rf"\bdef {re.escape(old)}\(", f"def {new}(", source, count=1)


def device_name(device: str) -> str:
    """The GPU's name for the record ("NVIDIA H200"), or the device string off CUDA."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return device

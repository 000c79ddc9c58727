"""OpInfo sweep: torch's op database through fxcc, each sample against eager, mismatches against float64.

    python -m bench.opinfo --device cuda --dtype float32,bfloat16,float16 --out DIR
    TRITON_INTERPRET=1 python -m bench.opinfo --device cpu --dtype bfloat16 --ops cross logit --out DIR

For every op of torch's `op_db` that supports the device and dtype, its first `--max-samples`
samples are traced to core aten (the backend's decompositions, as AOTAutograd traces them),
captured as a GraphSpec, compiled in-process (on cuda: cubins built by Triton for the GPU's arch,
compiler_core.build) and run by the client runtime, then compared with eager by
torch.testing.assert_close's defaults. A sample that eager rejects, that aot_eager cannot trace or
run, or that fxcc's client would run eagerly by design (a dtype the wire cannot carry, a
data-dependent output shape) is skipped, with its reason.

Note: a mismatch alone does not say that fxcc is wrong: in bf16/fp16 fxcc computes in fp32 where
eager rounds at each kernel's end. So for each mismatch the sample is also run upcast to float64
(same device, eagerly), and the errors of fxcc, eager, aot_eager and Inductor against it are
recorded. The mismatch is `wrong` when fxcc's error exceeds both eager's and Inductor's by more
than the dtype's tolerance (elementwise, atol + rtol * |float64 result|, torch.testing's
defaults), else `rounding`.

Ops run in worker processes (bench.opinfo_pool; `--workers`, default: CPU cores - 1; spawned,
each with its own CUDA context), one (op, dtype) task at a time, ops in name order with their
dtypes together: a
crash, a hang (`--task-timeout-s`) or a CUDA error costs that task only (the worker is replaced),
and DIR/h200-opinfo.json (cpu-opinfo.json on cpu) is rewritten as tasks end (at most every 2 s).
After `--time-budget-s` no task starts (those are listed as not_reached), and `--grace-s` later the
ones still running are stopped (listed as unfinished). Built cubins are shared by the workers
through Triton's cache (TRITON_CACHE_DIR).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Ops whose results are random or uninitialised: no eager result to compare against.
NONDETERMINISTIC = {
    "cauchy", "exponential", "geometric", "log_normal", "normal", "uniform", "randn", "randn_like",
    "rand_like", "randint", "randint_like", "bernoulli", "multinomial", "rrelu", "nn.functional.rrelu",
    "empty", "empty_like",
    "new_empty", "new_empty_strided", "empty_strided", "empty_permuted", "nn.functional.dropout",
    "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d", "svd_lowrank", "pca_lowrank", "item", "hash_tensor",
    "resize_", "resize_as_",
    # Their samples use dropout_p > 0: eager and compiled draw different random masks.
    "nn.functional.scaled_dot_product_attention", "nn.functional.multi_head_attention_forward",
    # The same, and their outputs include the RNG state drawn (philox seed and offset): on the H200
    # fxcc's and Inductor's differ from eager's alike (session 9).
    "torch.ops.aten._flash_attention_forward", "torch.ops.aten._efficient_attention_forward",
}

# torch.testing.assert_close's default (rtol, atol) per floating dtype; other dtypes compare exactly.
TOLERANCES = {"float32": (1.3e-6, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float16": (1e-3, 1e-5),
              "float64": (1e-7, 1e-7)}

log = logging.getLogger("fxcc.bench.opinfo")


@dataclass
class Outcome:
    """One sample's result. status: passed | mismatched | errored | skipped."""

    op: str
    dtype: str
    sample: int
    status: str
    detail: str = ""
    # For a mismatch, against float64, of fxcc, eager, aot_eager and Inductor (None where that one
    # failed): the max abs error (`fxcc`, ...) and the max error in units of the dtype's
    # elementwise tolerance (`fxcc_in_tol`, ...); the output compared; the verdict wrong | rounding.
    errors: dict[str, Any] | None = None
    verdict: str | None = None
    extern_ops: list[str] = field(default_factory=list)
    lowered: bool = False  # at least one node ran in a fxcc kernel
    notes: list[str] = field(default_factory=list)  # compiler warnings: a kernel without a cubin, ...


class _Skip(Exception):
    """The sample is not fxcc's to run (eager rejects it, aot_eager cannot, or fxcc runs it eagerly)."""


# ---------------------------------------------------------------- one sample


def sample_function(opinfo: Any, sample: Any) -> tuple[Callable[..., Any], list[Any]]:
    """`sample` as a function of its tensors only, and those tensors."""
    import torch
    import torch.utils._pytree as pytree

    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def fn(*xs: Any) -> Any:
        filled = list(leaves)
        for i, x in zip(positions, xs):
            filled[i] = x
        inp, args, kwargs = pytree.tree_unflatten(filled, spec)
        return opinfo.op(inp, *args, **kwargs)
    return fn, [leaves[i] for i in positions]


def _flat(fn: Callable[..., Any]) -> Callable[..., list[Any]]:
    """`fn` with its result flattened to the tensors in it (Dynamo keeps the rest out of the graph)."""
    import torch
    import torch.utils._pytree as pytree

    return lambda *xs: [x for x in pytree.tree_leaves(fn(*xs)) if isinstance(x, torch.Tensor)]


def _clones(tensors: list[Any]) -> list[Any]:
    return [t.clone() for t in tensors]


class AotGraph:
    """`fn` traced by AOTAutograd as fxcc's backend has it traced (its decompositions, inference,
    input mutations kept in the graph), callable with any compiled form of that graph.

    Note: AOTAutograd's runtime wrapper stays around the compiled graph (input mutations, outputs
    that alias inputs), as under torch.compile; `gm` and `example_inputs` are what a backend's
    compiler gets. Calling with `impl=None` runs the graph itself: aot_eager.
    """

    def __init__(self, fn: Callable[..., Any], tensors: list[Any]) -> None:
        import torch
        from torch._functorch.aot_autograd import aot_function, make_boxed_func

        from fxcc.client.backend import decomposition_table

        self.gm: Any = None
        self.example_inputs: list[Any] = []
        self._impl: Callable[[list[Any]], Any] | None = None

        def compiler(gm: Any, example_inputs: list[Any]) -> Callable[[list[Any]], Any]:
            self.gm, self.example_inputs = gm, list(example_inputs)
            return make_boxed_func(lambda *args: self._impl(list(args)) if self._impl else gm(*args))
        self._compiled = aot_function(_flat(fn), fw_compiler=compiler, decompositions=decomposition_table(),
                                      keep_inference_input_mutations=True)
        with torch.no_grad():
            self.aot_eager = list(self._compiled(*_clones(tensors)))  # traces, then runs the graph

    def run(self, impl: Callable[[list[Any]], Any], tensors: list[Any]) -> list[Any]:
        import torch

        self._impl = impl
        try:
            with torch.no_grad():
                return list(self._compiled(*_clones(tensors)))
        finally:
            self._impl = None


@contextlib.contextmanager
def _compiler_warnings() -> Iterator[list[str]]:
    """Warnings the compiler logs meanwhile (a graph that fell back to extern calls, a kernel that
    got no cubin): fxcc stays correct then, but each one is a compiler bug to see."""
    seen: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage()[:300])

    handler = Handler(logging.WARNING)
    logger = logging.getLogger("fxcc")
    logger.addHandler(handler)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)


def compile_with_fxcc(aot: AotGraph) -> tuple[Callable[[list[Any]], Any], Any, list[str]]:
    """fxcc's compiled form of `aot`'s graph for its inputs' device (on cuda with cubins), as a
    boxed callable, its stats and the compiler's warnings."""
    from fxcc.client.backend import target_for
    from fxcc.client.capture import capture_graph
    from fxcc.client.precision import matmul_allows_tf32
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.errors import InvalidGraph, UnsupportedOp
    from fxcc.compiler_core.pipeline import compile_and_build
    from fxcc.compiler_core.wire import CompileOptions, CompileRequest

    try:
        cap = capture_graph(aot.gm, aot.example_inputs)
    except UnsupportedOp as e:
        raise _Skip(f"fxcc runs it eagerly: {str(e)[:160]}") from None
    options = CompileOptions(target=target_for(aot.example_inputs, aot.gm), allow_tf32=matmul_allows_tf32())
    with _compiler_warnings() as notes:
        try:
            art = compile_and_build(CompileRequest(graph=cap.spec, options=options))
        except InvalidGraph as e:
            if "DynamicOutputShape" in str(e):
                # masked_select, nonzero: the worker cannot re-derive the shape; the client runs it eagerly
                raise _Skip("data-dependent output shape") from None
            raise
    plan = load_plan(art)
    return (lambda args: plan(args + cap.constants)), art.manifest.stats, notes


def inductor_result(fn: Callable[..., Any], tensors: list[Any]) -> list[Any]:
    """torch.compile(fn, backend="inductor")'s result, Dynamo included, in a fresh Dynamo."""
    import torch

    torch._dynamo.reset()  # every sample's fn shares one code object: no recompile limit
    with torch.no_grad():
        return _flat(torch.compile(fn, backend="inductor", fullgraph=False))(*_clones(tensors))


def float64_inputs(tensors: list[Any]) -> list[Any]:
    return [t.double() if t.is_floating_point() else t for t in tensors]


def max_error(got: Any, truth: Any) -> tuple[float, float]:
    """(max |got - truth|, max |got - truth| / (atol + rtol * |truth|)) over the elements, the
    second in units of the dtype's tolerance (torch.testing's, elementwise; 0.5 absolute for
    integers). nan/inf agree with themselves; any other disagreement with them is inf."""
    import torch

    g, t = got.double(), truth.double()
    if g.shape != t.shape:
        return math.inf, math.inf
    if g.numel() == 0:
        return 0.0, 0.0
    rtol, atol = TOLERANCES.get(str(got.dtype).removeprefix("torch."), (0.0, 0.5))
    same = (g == t) | (g.isnan() & t.isnan())
    diff = torch.where(same, torch.zeros_like(g), (g - t).abs().nan_to_num(nan=math.inf))
    scaled = diff / (atol + rtol * t.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0))
    return float(diff.max()), float(scaled.max())


def _first_mismatch(got: list[Any], expected: list[Any]) -> tuple[int, str] | None:
    """(output index, message) of the first output of fxcc that differs from eager's, or None."""
    import torch

    if len(got) != len(expected):
        return -1, f"{len(got)} outputs, eager has {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        if not isinstance(e, torch.Tensor):
            if g != e:
                return i, f"{g!r} != {e!r}"
            continue
        if not isinstance(g, torch.Tensor) or g.shape != e.shape or g.dtype != e.dtype:
            desc = f"{g.dtype}{list(g.shape)}" if isinstance(g, torch.Tensor) else type(g).__name__
            return i, f"{desc} vs eager's {e.dtype}{list(e.shape)}"
        try:
            torch.testing.assert_close(g, e, equal_nan=True)
        except AssertionError as err:
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
            return i, " ".join(lines[:3])[:200]
    return None


def judge_mismatch(fn: Callable[..., Any], tensors: list[Any], got: list[Any], expected: list[Any],
                   aot_eager: list[Any], index: int) -> tuple[dict[str, Any], str]:
    """For output `index`: each result's error against float64 (max abs, and in units of the
    dtype's tolerance), and the verdict: wrong when fxcc's exceeds both eager's and Inductor's by
    more than the tolerance, else rounding."""
    import torch

    e = expected[index] if index >= 0 else None
    g = got[index] if 0 <= index < len(got) else None
    if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor) or g.shape != e.shape \
            or g.dtype != e.dtype:
        return {"output": index}, "wrong"
    truth, reference = reference_result(fn, tensors, index, e)
    results: dict[str, Any] = {"fxcc": g, "eager": e, "aot_eager": aot_eager[index]}
    try:
        results["inductor"] = inductor_result(fn, tensors)[index]
    except Exception as err:  # noqa: BLE001 - Inductor failing leaves eager as the only yardstick
        log.info("inductor failed: %s", err)
        results["inductor"] = None
    errors: dict[str, Any] = {"output": index, "reference": reference}
    for name, r in results.items():
        abs_err, in_tol = max_error(r, truth) if r is not None else (None, None)
        errors[name], errors[f"{name}_in_tol"] = abs_err, in_tol
    yardsticks = [errors[f"{k}_in_tol"] for k in ("eager", "inductor") if errors[f"{k}_in_tol"] is not None]
    return errors, "wrong" if errors["fxcc_in_tol"] > max(yardsticks) + 1 else "rounding"


def reference_result(fn: Callable[..., Any], tensors: list[Any], index: int, eager: Any) -> tuple[Any, str]:
    """Output `index` computed as exactly as this op allows, and how: float64 on the sample's
    device; else float64 on the CPU (CUDA kernels without float64, or that check an argument's
    dtype that the upcast leaves, as _softmax_backward_data's input_dtype); else float32 on the
    device (kernels of half types and fp32 only); else eager's own result (flash attention: fp16
    and bf16 only), against which eager's error is 0 and fxcc's is judged by Inductor's."""
    import torch

    attempts = [("float64", torch.float64, None), ("float64 on cpu", torch.float64, "cpu"),
                ("float32", torch.float32, None)]
    for name, dtype, device in attempts:
        try:
            ins = [t.to(device=device or t.device, dtype=dtype if t.is_floating_point() else t.dtype)
                   for t in _clones(tensors)]
            with torch.no_grad():
                out = _flat(fn)(*ins)[index]
            return out.to(eager.device), name
        except Exception as err:  # noqa: BLE001 - the next way, or eager's result
            log.info("reference in %s failed: %s", name, str(err).splitlines()[0][:200] if str(err) else err)
    return eager, "eager"


def run_sample(op: str, dtype: str, index: int, fn: Callable[..., Any], tensors: list[Any]) -> Outcome:
    """fxcc against eager for one sample (see the module's docstring)."""
    import torch

    out = Outcome(op, dtype, index, "passed")
    try:
        with torch.no_grad():
            expected = _flat(fn)(*_clones(tensors))
    except Exception as e:  # noqa: BLE001
        return _skipped(out, f"eager: {type(e).__name__}")
    try:
        aot = AotGraph(fn, tensors)
    except Exception as e:  # noqa: BLE001
        return _skipped(out, f"aot_eager: {type(e).__name__}: {str(e)[:120]}")
    try:
        compiled, stats, notes = compile_with_fxcc(aot)
        got = aot.run(compiled, tensors)
        if tensors and tensors[0].is_cuda:
            torch.cuda.synchronize()
    except _Skip as e:
        return _skipped(out, str(e))
    except Exception as e:  # noqa: BLE001
        out.status, out.detail = "errored", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        return out
    out.extern_ops, out.lowered, out.notes = list(stats.extern_ops), stats.nodes_lowered > 0, notes
    if any("whole graph runs as extern calls" in n for n in notes):
        out.status, out.detail = "errored", next(n for n in notes if "extern calls" in n)
        return out
    mismatch = _first_mismatch(got, expected)
    if mismatch is not None:
        index, out.detail = mismatch
        out.status = "mismatched"
        out.errors, out.verdict = judge_mismatch(fn, tensors, got, expected, aot.aot_eager, index)
    return out


def _skipped(out: Outcome, why: str) -> Outcome:
    out.status, out.detail = "skipped", why
    return out


# ---------------------------------------------------------------- one (op, dtype)


def op_infos() -> dict[str, Any]:
    """op_db by full name: `name`, or `name.variant` for an entry with a variant_test_name."""
    from torch.testing._internal.common_methods_invocations import op_db

    return {full_name(info): info for info in op_db}


def full_name(info: Any) -> str:
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


def _test_fn_from_frames() -> Callable[..., Any] | None:
    """torch.testing's extract_test_fn (the unittest test method running, found on the stack) by
    walking the frames: the same answer without inspect.stack(), which reads every frame's source
    file (~0.1 s a call under pytest, and each sample_inputs calls it twice)."""
    import unittest

    try:
        frame = sys._getframe(1)
        while frame is not None:
            self_val = frame.f_locals.get("self")
            if isinstance(self_val, unittest.TestCase):
                *_, cls_name, test_name = self_val.id().rsplit(".", 2)
                if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                    return getattr(self_val, test_name).__func__
            frame = frame.f_back
    except Exception:  # noqa: BLE001 - as torch's: no test function found
        return None
    return None


@contextlib.contextmanager
def _test_fn_by_frame_walk() -> Iterator[None]:
    """torch.testing's extract_test_fn replaced by _test_fn_from_frames meanwhile (OpInfo's
    sample generation seeds its RNG by the test function it finds)."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    modules = [m for m in (common_utils, core) if hasattr(m, "extract_test_fn")]
    originals = [m.extract_test_fn for m in modules]
    for m in modules:
        m.extract_test_fn = _test_fn_from_frames
    try:
        yield
    finally:
        for m, original in zip(modules, originals):
            m.extract_test_fn = original


def sweep_op(opinfo: Any, dtype: str, device: str, max_samples: int) -> list[Outcome]:
    """The first `max_samples` samples of one op in one dtype on `device`."""
    import torch

    torch_dtype = getattr(torch, dtype)
    try:
        with _test_fn_by_frame_walk():
            samples = list(itertools.islice(opinfo.sample_inputs(device, torch_dtype, requires_grad=False),
                                            max_samples))
    except Exception as e:  # noqa: BLE001
        return [Outcome(full_name(opinfo), dtype, -1, "skipped", f"samples: {type(e).__name__}: {str(e)[:120]}")]
    outcomes = []
    for i, sample in enumerate(samples):
        torch.manual_seed(0)
        fn, tensors = sample_function(opinfo, sample)
        outcomes.append(run_sample(full_name(opinfo), dtype, i, fn, tensors))
        if device == "cuda" and outcomes[-1].status == "errored" and "CUDA" in outcomes[-1].detail:
            break  # the context may be lost: the worker checks it and is replaced if so
    return outcomes


def wanted_tasks(ops: list[str] | None, dtypes: list[str], device: str) -> list[tuple[str, str]]:
    """(op, dtype) for every op of op_db (or of `ops`) that supports the dtype on `device`."""
    import torch

    infos = op_infos()
    names = sorted(infos)
    if ops:  # a base name stands for all its variants
        unknown = [n for n in ops if not any(k == n or infos[k].name == n for k in infos)]
        if unknown:
            raise SystemExit(f"not in op_db: {unknown}")
        names = [k for k in names if k in ops or infos[k].name in ops]
    # Note: op-major, so that a run cut short by its time budget covers every dtype of the ops it reached.
    return [(name, dtype) for name in names for dtype in dtypes
            if infos[name].name not in NONDETERMINISTIC
            and getattr(torch, dtype) in infos[name].supported_dtypes(device)]


# ---------------------------------------------------------------- CLI


def ops_to_redo(path: Path) -> list[str]:
    """The ops an earlier run's JSON found failing, or did not reach or finish, in any dtype."""
    dtypes = json.loads(path.read_text())["dtypes"]
    keys = ("ops_failing", "not_reached", "unfinished")
    ops = sorted({op for d in dtypes.values() for k in keys for op in d.get(k, [])})
    if not ops:
        raise SystemExit(f"{path}: nothing failing, not reached or unfinished")
    return ops


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", default="float32,bfloat16,float16", help="comma-separated")
    p.add_argument("--ops", nargs="*", help="these op_db names only (default: all)")
    p.add_argument("--ops-from", help="an earlier run's JSON: only its failing, not reached and unfinished ops")
    p.add_argument("--max-samples", type=int, default=4, help="samples per (op, dtype)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: CPU cores - 1; 0: run in this process)")
    p.add_argument("--time-budget-s", type=float, default=None, help="start no task after this")
    p.add_argument("--task-timeout-s", type=float, default=120.0, help="a task running longer is killed")
    p.add_argument("--grace-s", type=float, default=60.0,
                   help="after the budget, how long tasks already running may take")
    p.add_argument("--out", required=True, help="directory for h200-opinfo.json and opinfo.log")
    a = p.parse_args(argv)

    if a.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported, here and in workers
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here")
    dtypes = [d.strip() for d in a.dtype.split(",") if d.strip()]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(out / "opinfo.log", "a", buffering=1)  # noqa: SIM115 - open for the whole run

    def progress(line: str) -> None:
        print(line, file=logf)
        print(line, file=sys.stderr, flush=True)

    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # the workers are the parallelism
    t0 = time.time()
    ops = list(a.ops or []) + (ops_to_redo(Path(a.ops_from)) if a.ops_from else [])
    tasks = wanted_tasks(ops or None, dtypes, a.device)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
    workers = a.workers if a.workers is not None else max(1, cores - 1)
    import triton

    meta = {"device": a.device, "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None,
            "torch": torch.__version__, "triton": triton.__version__, "max_samples": a.max_samples,
            "workers": workers, "tasks": len(tasks), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "tolerances": TOLERANCES,
            "verdict": "wrong: fxcc's max elementwise error against float64, in units of the dtype's "
                       "tolerance (atol + rtol * |float64 result|), exceeds eager's and Inductor's by more than 1"}
    from bench.opinfo_pool import Results, run_inline, run_pool

    results = Results(out / ("h200-opinfo.json" if a.device == "cuda" else "cpu-opinfo.json"), meta)
    progress(f"{len(tasks)} (op, dtype) tasks on {a.device}, {workers} workers, {a.max_samples} samples each")
    if workers == 0:
        run_inline(tasks, a.device, a.max_samples, results, a.time_budget_s, progress)
    else:
        run_pool(tasks, a.device, workers, a.max_samples, results, a.time_budget_s, a.task_timeout_s,
                 a.grace_s, progress)
    results.meta["seconds"] = round(time.time() - t0, 1)
    results.write()
    for dtype, d in results.report()["dtypes"].items():
        progress(f"{dtype}: {d.get('ops', 0)} ops, passed {d.get('passed', 0)}, rounding {d.get('rounding', 0)}, "
                 f"wrong {d.get('wrong', 0)}, errored {len(d.get('errored', []))}, skipped {d.get('skipped', 0)}, "
                 f"not reached {len(d.get('not_reached', []))}, unfinished {len(d.get('unfinished', []))}")
    failing = any(d.get("wrong") or d.get("errored") for d in results.report()["dtypes"].values())
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())

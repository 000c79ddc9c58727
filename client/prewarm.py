"""First calls of the vendor libraries a loaded plan uses, made on a side thread while Dynamo builds guards.

A plan's extern library calls (cuDNN convolutions, cuBLAS matmuls, SDPA) cost far more the first
time a process makes them than after: cuDNN picks an engine by heuristics and builds an execution
plan for each convolution's parameters (cached by torch per parameter set), the libraries create
their handles and load their kernels lazily. On the H200 that was 0.24 s of a torchvision
ResNet-50's first call from a warm Dynamo package, paid after torch had spent 0.35 s building the
package's guards in Python. A Dynamo package's plans are loaded before its guards are built
(client/dynamo_cache.py), so those first calls can be made then, on a thread of their own:
torch releases the GIL inside an aten call, and guard building needs only the GIL.

What runs: each distinct library call of the plan (the op, its arguments' sizes, strides and
dtypes, its constants), once, on uninitialized tensors of those layouts on the plan's device
(values do not matter to these ops; none of them reads an index from its data). Layouts come from
the graph's input layouts recorded with the package, the plan's own allocations, and the other
extern steps' results propagated on the meta device. Bounded: at most MAX_CALLS calls and
MAX_BYTES of arguments per call, skipped when the device lacks free memory for them. The first
call of the plan waits for the thread (so nothing else uses the GPU alongside it), as does a CUDA
graph capture (client/cuda_graphs.py). Whatever fails here is only a lost optimisation: the
thread stops, says so once at debug level, and the plan's first call makes the calls itself.
`FXCC_PREWARM=0` (ClientSettings.prewarm) turns it off.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fxcc.compiler_core.artifact import AllocStep, ExternStep, Plan
from fxcc.compiler_core.wire import resolve_target, torch_dtype

log = logging.getLogger("fxcc.prewarm")

# aten ops whose first call in a process costs library setup, and that read no index from data
LIBRARY_OPS = frozenset({
    "aten.convolution.default", "aten.mm.default", "aten.addmm.default", "aten.bmm.default",
    "aten.baddbmm.default", "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default", "aten._scaled_dot_product_cudnn_attention.default",
})
MAX_CALLS = 256
MAX_BYTES = 1 << 30  # of one call's tensor arguments

_threads: list[Any] = []  # threads (or waiters) a CUDA graph capture waits for
_lock = threading.Lock()
stats = {"started": 0, "calls": 0, "failed": 0}


def input_layouts(example_inputs: list[Any]) -> list[list[Any] | None] | None:
    """What a package records of its graph's inputs for this module: [dtype, sizes, strides] per tensor
    (None for another input); None when any size or stride is symbolic."""
    out: list[list[Any] | None] = []
    for x in example_inputs:
        if not isinstance(x, torch.Tensor):
            out.append(None)
            continue
        sizes, strides = list(x.shape), list(x.stride())
        if not all(type(v) is int for v in (*sizes, *strides)):
            return None
        out.append([str(x.dtype).removeprefix("torch."), sizes, strides])
    return out


def library_calls(plan: Plan, layouts: list[list[Any] | None]) -> list[tuple[Any, list[Any]]]:
    """The plan's distinct library calls as (op, arguments), tensors as meta tensors of their layouts.

    Values are propagated in step order: the inputs' recorded layouts, allocations' specs, each
    extern step's result as its meta kernel computes it (a step whose arguments are unknown, or
    whose op has no meta kernel, leaves its result unknown, and the calls that read it out)."""
    from fxcc.client.runtime import _REF, _arg_reader, _read

    if len(layouts) != len(plan.inputs):
        return []
    env: dict[str, Any] = {}
    for name, layout in zip(plan.inputs, layouts):
        if layout is not None:
            dtype, sizes, strides = layout
            env[name] = torch.empty_strided(sizes, strides, dtype=getattr(torch, dtype), device="meta")
    calls: list[tuple[Any, list[Any]]] = []
    seen: set[tuple] = set()
    for step in plan.steps:
        if isinstance(step, AllocStep):
            if not step.spec.symbolic:
                env[step.out] = torch.empty_strided(step.spec.sizes, step.spec.strides,
                                                    dtype=torch_dtype(step.spec.dtype), device="meta")
            continue
        if not isinstance(step, ExternStep) or step.opaque is not None or step.triton is not None or step.kwargs:
            continue
        readers = [_arg_reader(a) for a in step.args]
        if any(kind is _REF and x not in env for kind, x in readers):
            continue
        try:
            op = resolve_target(step.op, node=step.out)
            args = [_read(kind, x, env, None) for kind, x in readers]
            if step.op in LIBRARY_OPS and len(calls) < MAX_CALLS:
                sig = (step.op, *(_signature(a) for a in args))
                if sig not in seen:
                    seen.add(sig)
                    calls.append((op, args))
            value = op(*args)
        except Exception:  # noqa: BLE001 - unknown from here on (an op without a meta kernel, a symbol)
            value = None
        if isinstance(value, torch.Tensor):
            env[step.out] = value
    return calls


def _signature(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return ("t", str(a.dtype), tuple(a.shape), a.stride())
    if isinstance(a, list | tuple):
        return tuple(_signature(x) for x in a)
    return a


def _tensors(args: list[Any]) -> Iterator[torch.Tensor]:
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, list | tuple):
            yield from _tensors(list(a))


def _nbytes(t: torch.Tensor) -> int:
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
    return (extent if t.numel() else 0) * t.element_size()


def _on(device: torch.device, a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=device)
    if isinstance(a, list | tuple):
        return type(a)(_on(device, x) for x in a)
    return a


def run_calls(calls: list[tuple[Any, list[Any]]], device: torch.device) -> int:
    """Make each call once on `device` (uninitialized tensors of the calls' layouts); how many ran."""
    ran = 0
    with torch.no_grad():
        for op, args in calls:
            need = sum(_nbytes(t) for t in _tensors(args))
            if need > MAX_BYTES:
                continue
            if device.type == "cuda" and torch.cuda.mem_get_info(device)[0] < 2 * need + (256 << 20):
                continue
            op(*[_on(device, a) for a in args])
            ran += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return ran


def record(plan: Plan, layouts: list[list[Any] | None] | None) -> list[list[Any]]:
    """The plan's library calls as a package records them (JSON values), so that a process loading
    the package can make them before it has the plan: [op name, arguments] per call, a tensor as
    {"t": [dtype, sizes, strides]}, a list as {"l": [...]}; a call with an argument of another kind
    is left out. Never raises (nothing recorded: the loading process finds the calls in the plan)."""
    if not layouts:
        return []
    try:
        return [[str(op), [_encode(a) for a in args]] for op, args in library_calls(plan, layouts)
                if str(op) in LIBRARY_OPS and all(_encodable(a) for a in args)]
    except Exception as e:  # noqa: BLE001 - only an optimisation of the next process
        log.debug("fxcc: prewarm: no calls recorded (%s: %s)", type(e).__name__, e)
        return []


def recorded(entries: Any) -> list[tuple[Any, list[Any]]]:
    """The calls of `record`'s entries, as library_calls gives them (meta tensors). Entries of ops
    outside LIBRARY_OPS, of malformed arguments, or past MAX_CALLS are left out; never raises."""
    calls: list[tuple[Any, list[Any]]] = []
    if not isinstance(entries, list):
        return calls
    for entry in entries[:MAX_CALLS]:
        try:
            name, args = entry
            if name not in LIBRARY_OPS or not isinstance(args, list) or len(args) > _MAX_ARGS:
                continue
            calls.append((resolve_target(name, node="prewarm"), [_decode(a, 0) for a in args]))
        except Exception as e:  # noqa: BLE001 - a malformed entry is no call
            log.debug("fxcc: prewarm: a recorded call left out (%s: %s)", type(e).__name__, e)
    return calls


_MAX_ARGS = 16
_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool"})


def _encodable(a: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return str(a.dtype).removeprefix("torch.") in _DTYPES
    if isinstance(a, list | tuple):
        return all(_encodable(x) for x in a)
    return a is None or type(a) in (bool, int, float)


def _encode(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return {"t": [str(a.dtype).removeprefix("torch."), list(a.shape), list(a.stride())]}
    if isinstance(a, list | tuple):
        return {"l": [_encode(x) for x in a]}
    return a


def _decode(a: Any, depth: int) -> Any:
    if a is None or type(a) in (bool, int, float):
        return a
    if isinstance(a, dict) and len(a) == 1 and depth < 2:
        if isinstance(a.get("l"), list) and len(a["l"]) <= _MAX_ARGS:
            return [_decode(x, depth + 1) for x in a["l"]]
        dtype, sizes, strides = a["t"]
        dims = (*sizes, *strides)
        if (dtype in _DTYPES and isinstance(sizes, list) and isinstance(strides, list) and len(sizes) == len(strides)
                <= 8 and all(type(v) is int and 0 <= v < 1 << 40 for v in dims)):
            return torch.empty_strided(sizes, strides, dtype=getattr(torch, dtype), device="meta")
    raise ValueError("not an argument a package records")


def warm(plan: Plan, layouts: list[list[Any] | None] | None, device: torch.device, threads: int = 1) -> int:
    """Make the plan's library calls now, on this thread and `threads - 1` more (each on the device
    and stream current here, which the caller set); how many ran. Never raises: what fails is
    counted and said once at debug level.

    Note: a call's first-time cost is the library's own host work (cuDNN's engine heuristics and
    execution plan for each convolution's parameters: about 15 ms each on the H200's host), made
    without the GIL and with a cuDNN handle per thread, so distinct calls made on several threads
    overlap (ResNet-50: 24 distinct calls)."""
    if not layouts:
        return 0
    try:
        calls = library_calls(plan, layouts)
    except Exception as e:  # noqa: BLE001 - the first call makes them itself
        return _failed(e)
    return warm_calls(calls, device, threads)


def warm_calls(calls: list[tuple[Any, list[Any]]], device: torch.device, threads: int = 1) -> int:
    """`warm`'s work for calls already found (library_calls, or a package's `recorded` ones)."""
    groups = [calls[i::threads] for i in range(max(1, min(threads, len(calls))))]
    counts = [0] * len(groups)
    stream = torch.cuda.current_stream(device) if device.type == "cuda" and len(groups) > 1 else None

    def run(i: int) -> None:
        try:
            if stream is not None:
                with torch.cuda.device(device), torch.cuda.stream(stream):
                    counts[i] = run_calls(groups[i], device)
            else:
                counts[i] = run_calls(groups[i], device)
        except Exception as e:  # noqa: BLE001 - the first call makes them itself
            _failed(e)

    helpers = [threading.Thread(target=run, args=(i,), name=f"fxcc-prewarm-{i}", daemon=True)
               for i in range(1, len(groups))]
    for t in helpers:
        t.start()
    run(0)
    for t in helpers:
        t.join()
    with _lock:
        stats["calls"] += sum(counts)
    return sum(counts)


def _failed(e: BaseException) -> int:
    with _lock:
        stats["failed"] += 1
    log.debug("fxcc: prewarm stopped (%s: %s)", type(e).__name__, e)
    return 0


def start(plan: Plan, layouts: list[list[Any] | None] | None, device: torch.device) -> Callable[[], None] | None:
    """Start the plan's library calls on a daemon thread; the function that waits for it, or None
    when there is nothing to do (no layouts, no library call)."""
    if not layouts:
        return None
    try:
        calls = library_calls(plan, layouts)
    except Exception as e:  # noqa: BLE001 - only an optimisation
        log.debug("fxcc: prewarm: no calls (%s: %s)", type(e).__name__, e)
        return None
    if not calls:
        return None
    try:  # the caller's stream: the calls queue where its work does
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    except Exception:  # noqa: BLE001 - no such device here: nothing to warm
        return None

    def work() -> None:
        try:
            if stream is not None:
                with torch.cuda.device(device), torch.cuda.stream(stream):
                    n = run_calls(calls, device)
            else:
                n = run_calls(calls, device)
            with _lock:
                stats["calls"] += n
        except Exception as e:  # noqa: BLE001 - the first call makes them itself
            with _lock:
                stats["failed"] += 1
            log.debug("fxcc: prewarm stopped (%s: %s)", type(e).__name__, e)

    thread = threading.Thread(target=work, name="fxcc-prewarm", daemon=True)
    track(thread)
    with _lock:
        stats["started"] += 1
    thread.start()

    def wait() -> None:
        thread.join()
        with _lock:
            if thread in _threads:
                _threads.remove(thread)

    return wait


def track(work: Any) -> None:
    """Count `work` (anything with `join()`: a thread of fxcc's that allocates and launches on a GPU,
    or what waits for such a thread's GPU work) among what a CUDA graph capture waits for (`wait_all`)."""
    with _lock:
        _threads.append(work)


def untrack(work: Any) -> None:
    with _lock:
        if work in _threads:
            _threads.remove(work)


def wait_all() -> None:
    """Wait for every prewarm thread still running (before a CUDA graph capture: another thread's
    allocations and launches would invalidate it)."""
    with _lock:
        threads = list(_threads)
    for t in threads:
        t.join()
    with _lock:
        for t in threads:
            if t in _threads:
                _threads.remove(t)

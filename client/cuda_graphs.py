"""Replay a static inference plan as one CUDA graph: the host cost of a call drops from one Python
step per launch, allocation and free to a single graph launch.

A plan of many small steps (a conv net: ~300 launches, allocations and frees per call) is
host-bound in Python even when its kernels are as fast as Inductor's. Captured once, its whole
call is one `cudaGraphLaunch`.

Note: what a captured graph assumes, and how each assumption is kept:
- Addresses. The graph reads its inputs at the addresses they had when it was captured. Each
  graph is keyed by its inputs' data pointers; a call whose pointers match replays it, any other
  call runs the plan step by step. A set of pointers is captured the second time it is seen (the
  first call also warms cuDNN/cuBLAS, loads cubins), at most MAX_GRAPHS sets per plan.
- Library workspaces. cuBLAS keeps a workspace (32 MiB on Hopper, one for cuBLAS and one for
  cuBLASLt) per stream, made on the stream's first matmul and held for the process. A plan's first
  call runs step by step on the caller's stream, as eager and as training plans' first calls do
  (until session 24 it ran on fxcc's stream: its temporaries' blocks stayed cached for that
  stream alone and its outputs went back with record_stream); captures run on one fxcc stream
  per device. The workspaces are dropped (torch._C._cuda_clearCublasWorkspaces, as
  Inductor's cudagraph trees do) before and after each capture: a capture then makes its
  workspace inside the shared pool, where it is memory like a temporary (any later capture may take it once the call is over), and no
  workspace is held outside the pool for the graphs' sake (the 66 MB a conv net's peak was above
  Inductor's on the H200). Dropping one only frees it to the caching allocator; the stream's next
  matmul makes another. Nothing of fxcc's runs a library call on another thread meanwhile
  (prewarm.wait_all); a thread of the user's that does so at that moment has its workspace freed
  under it, the same race Inductor's cudagraph trees accept; so does a CUDA graph the user captured
  on their own whose matmuls used a workspace made before that capture (dropped, its memory goes
  back to the allocator). fxcc's training graphs drop them around their captures as well
  (client/training_graphs.py), so no graph of fxcc's uses a workspace outside its own pool.
- Outputs. The graph writes its outputs into its private memory pool, which the next replay
  overwrites, so each replay's outputs are copied out (fresh tensors with the same strides) and
  the caller owns them as it owns eager outputs. That copy is why only outputs small beside the
  memory the plan allocates are graphed (a classifier's logits, not an activation). A plan with
  larger outputs is cut: the graph replays every step before the first one that allocates (or
  aliases) storage of such an output, and the rest runs step by step, so those outputs are
  fresh tensors and cost no copy (a language model's logits: its last matmul runs after the
  replay). Tail outputs that share storage with the graph's pool are copied like the others.
- Static work. Only plans without size symbols, on CUDA, in inference graphs (no autograd saves
  the pool's tensors for a backward), whose extern ops are all known to be capture-safe (no host
  sync, no random numbers, no data-dependent sizes) are graphed; a capture that fails anyway is
  reported once and the plan runs step by step from then on.
- One pool. Every graph of the process on a device captures into one memory pool (a model's
  graphs between graph breaks, several models, each plan's pointer sets), as Inductor's cudagraph
  trees do: a capture takes the memory the captures before it freed (their temporaries), so the
  pools of a model of N graphs hold about its largest graph's temporaries, not the sum of N. This
  is safe because nothing a replay leaves in the pool outlives its call: outputs are copied out
  (or, behind a cut, consumed and copied) before the call returns, and no caller's tensor (a
  plan's input) is pool memory. So any graph may overwrite any other's temporaries and outputs
  once that graph's call is over, whatever order they replay in.
- Ordering. Captures and replays on one device hold the pool's lock, one at a time (a tail after
  a cut included); a replay on another stream than the pool's last one first waits for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fxcc.client import prewarm
from fxcc.compiler_core.artifact import AllocStep, ArtifactManifest, ExternStep, FreeStep, KernelStep, Plan
from fxcc.compiler_core.wire import NodeRef, _refs, torch_dtype

log = logging.getLogger("fxcc.cuda_graphs")

MAX_GRAPHS = 2  # pointer sets captured per plan (each adds little: the pool is shared)
MIN_LAUNCHES = 8  # kernels + extern calls below which a graph saves too little to matter
OUTPUT_SHARE = 50  # graphed only when the plan allocates ≥ this many times its outputs' bytes
_MAX_SEEN = 16


@dataclass
class GraphStats:
    """What this process's graphed plans have done (read by benchmarks and tests, never timed)."""

    captures: int = 0
    replays: int = 0
    step_by_step: int = 0  # calls of graphable plans that ran step by step (first sight, misses)
    pool_bytes: int = 0  # memory the shared pools reserved while capturing (held between calls)
    cut_plans: int = 0  # plans graphed up to a step, the rest step by step (outputs too large to copy)
    workspace_drops: int = 0  # times cuBLAS's workspaces were dropped around a capture
    copied_in: int = 0  # tensors a training graph copied into its buffers before its replays (moving inputs)
    copied_out: int = 0  # outputs replays copied out of their pool (a training graph's small outputs, an inference graph's)
    disabled: list[str] = field(default_factory=list)  # why a plan stopped trying
    # why graphable calls ran step by step (training plans), how many times each
    step_by_step_why: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def because(self, why: str) -> None:
        with self.lock:
            self.step_by_step_why[why] = self.step_by_step_why.get(why, 0) + 1


stats = GraphStats()

# Extern ops that run on the GPU without host synchronisation, random numbers or data-dependent
# output sizes (the overload name is ignored). Anything else keeps the plan step by step.
CAPTURE_SAFE = frozenset({
    "convolution", "mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_cudnn_attention",
    "max_pool2d_with_indices", "avg_pool2d", "_adaptive_avg_pool2d", "cat", "clone", "copy",
    "copy_", "_foreach_copy_", "view", "reshape", "_unsafe_view", "permute", "expand", "t", "transpose", "slice",
    "select", "squeeze", "unsqueeze", "as_strided", "alias", "embedding", "index_select",
    "gather", "_softmax", "_log_softmax", "native_layer_norm",
    "native_batch_norm", "_native_batch_norm_legit_no_training", "getitem",
})


# Backward and loss ops that a training graph's plan calls, as safe as the above (training_graphs.py).
TRAINING_SAFE = CAPTURE_SAFE | frozenset({
    "convolution_backward", "max_pool2d_with_indices_backward", "avg_pool2d_backward",
    "_adaptive_avg_pool2d_backward", "native_batch_norm_backward", "native_layer_norm_backward",
    "_softmax_backward_data", "_log_softmax_backward_data", "threshold_backward",
    "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward", "nll_loss_forward", "nll_loss_backward",
    "nll_loss2d_forward", "nll_loss2d_backward", "embedding_dense_backward", "index_put", "index_put_",
    "scatter", "scatter_add", "index_add", "new_zeros", "zeros", "zeros_like", "full", "full_like",
    "empty", "empty_like", "empty_strided", "fill_", "zero_", "sum", "mean",
    "_native_batch_norm_legit_functional", "_native_batch_norm_legit", "detach", "empty_permuted",
    # Random numbers of the default CUDA generator: a capture registers it and each replay moves
    # its Philox offset on, so every replay draws new numbers (torch.cuda.graph's RNG support).
    "bernoulli", "bernoulli_", "native_dropout", "native_dropout_backward", "rand", "randn", "rand_like",
    "randn_like", "uniform_", "normal_",
})


def _op_name(op: str) -> str:
    """'aten.addmm.default' → 'addmm'; 'getitem' → 'getitem'."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] in ("aten", "prims") else parts[-1]


def why_not_graphed(manifest: ArtifactManifest, inference: bool, training: bool = False) -> str | None:
    """Why this plan is run step by step rather than replayed as a CUDA graph (None: it may be).
    `training`: a training graph's plan may be (client/training_graphs.py)."""
    plan = manifest.plan
    if manifest.target.kind != "cuda":
        return f"target is {manifest.target.kind}"
    if not inference and not training:
        return "not an inference graph"
    if plan.symbols:
        return "sizes are symbolic"
    n = launches(plan)
    if n < MIN_LAUNCHES:
        return f"{n} launches"
    safe = CAPTURE_SAFE if inference else TRAINING_SAFE
    unsafe = sorted({_op_name(s.op) for s in plan.steps if isinstance(s, ExternStep)} - safe)
    if unsafe:
        return f"extern ops not known to be capture-safe: {', '.join(unsafe[:5])}"
    return None


# Extern ops whose result may share its first argument's storage (views, getitem of a tuple).
ALIASING = frozenset({
    "view", "reshape", "_unsafe_view", "permute", "expand", "t", "transpose", "slice", "select",
    "squeeze", "unsqueeze", "as_strided", "alias", "getitem", "detach", "unfold", "diagonal",
    "narrow", "split", "split_with_sizes", "unbind", "chunk",
})


def graph_cut(plan: Plan, large: list[str]) -> int | None:
    """Index of the first step that must run after the replay so that the outputs named `large`
    are not in the graph's pool: the earliest step defining their storage (their allocation, the
    buffer an allocation reuses, the base a view is taken of). None when one of them shares an
    input's storage or is not a plan value."""
    defined = {s.out: i for i, s in enumerate(plan.steps) if isinstance(s, (AllocStep, ExternStep))}

    def origin(name: str, depth: int = 0) -> int | None:
        i = defined.get(name)
        if i is None or depth > len(plan.steps):
            return None  # an input (the caller's storage) or not a value of the plan
        step = plan.steps[i]
        base: str | None = None
        if isinstance(step, AllocStep) and step.reuse is not None:
            base = step.reuse
        elif isinstance(step, ExternStep) and _op_name(step.op) in ALIASING and step.args \
                and isinstance(step.args[0], NodeRef):
            base = step.args[0].name
        if base is None:
            return i
        j = origin(base, depth + 1)
        return None if j is None else min(i, j)

    found = [origin(n) for n in large]
    return None if not found or any(j is None for j in found) else min(found)  # type: ignore[type-var]


def live_across(plan: Plan, cut: int) -> list[str]:
    """Values defined before step `cut` that a later step or the outputs read (the graph's outputs)."""
    before = {s.out for s in plan.steps[:cut] if isinstance(s, (AllocStep, ExternStep))}
    read: set[str] = set(_refs(list(plan.outputs)))
    for s in plan.steps[cut:]:
        if isinstance(s, (ExternStep, KernelStep)):
            read.update(_refs(list(s.args) + list(getattr(s, "kwargs", {}).values())))
        elif isinstance(s, AllocStep) and s.reuse is not None:
            read.add(s.reuse)
        elif isinstance(s, FreeStep):
            continue
    return sorted(before & read)


def launches(plan: Plan, stop: int | None = None) -> int:
    return sum(isinstance(s, (KernelStep, ExternStep)) for s in plan.steps[:stop])


def allocated_bytes(manifest: ArtifactManifest) -> int:
    """Bytes the plan's own allocations hold over a call (extern results not counted)."""
    total = 0
    for s in manifest.plan.steps:
        if isinstance(s, AllocStep) and s.reuse is None and not s.spec.symbolic:
            sizes, strides = s.spec.sizes, s.spec.strides
            span = 1 + sum((int(n) - 1) * int(st) for n, st in zip(sizes, strides)) if all(sizes) else 0
            total += span * torch_dtype(s.spec.dtype).itemsize
    return total


class _Captured:
    __slots__ = ("graph", "layouts", "live", "outputs", "pool_storages")

    def __init__(self, graph: Any, outputs: tuple[Any, ...], live: dict[str, Any] | None = None) -> None:
        self.graph = graph
        self.outputs = outputs  # the whole plan's outputs, or (cut) the values live across the cut
        self.live = live
        self.layouts = [_layout(o) for o in outputs]
        self.pool_storages = {t.untyped_storage().data_ptr() for t in flat_tensors(outputs)}


def _layout(o: Any) -> Any:
    return (o.shape, o.stride(), o.dtype, o.device) if isinstance(o, torch.Tensor) else None


def flat_tensors(values: Any) -> list[torch.Tensor]:
    """The tensors among `values`, those inside tuples and lists included (an extern's tuple result)."""
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            out.extend(flat_tensors(v))
    return out


class GraphedPlan:
    """A static plan that replays CUDA graphs for input pointers it has seen twice (see module)."""

    def __init__(self, runner: Callable[[list[Any]], tuple[Any, ...]], manifest: ArtifactManifest,
                 on_disable: Callable[[str], None] | None = None,
                 on_cut: Callable[[str], None] | None = None) -> None:
        self.runner = runner
        self.on_disable = on_disable  # told why, once the plan stops trying
        self.on_cut = on_cut  # told how, once the plan is cut (graph, then step by step)
        self.key = manifest.key
        self.plan = manifest.plan
        self.budget = allocated_bytes(manifest)  # and, once the warm-up call ran, its extern results
        self.cut: int | None = None  # steps from here on run after each replay, step by step
        self.live: list[str] = []  # values the graph leaves for those steps
        self.graphs: dict[tuple[Any, ...], _Captured] = {}
        self.seen: set[tuple[Any, ...]] = set()
        self.disabled: str | None = None
        self.device: torch.device | None = None
        self.shared: SharedPool | None = None  # the device's pool, its lock and last replay (see module)
        self.pool_bytes = 0  # bytes the shared pool grew by while this plan captured
        self.warmed = False  # whether the plan's first call (step by step, measured) ran

    def __call__(self, args: list[Any]) -> tuple[Any, ...]:
        if self.disabled is not None:
            return self.runner(args)
        key = _pointer_key(args)
        if key is None or torch.cuda.is_current_stream_capturing():
            return self.runner(args)  # not all on one GPU, or inside the caller's own capture
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        if self.device is None:
            self.device = device
            self.shared = shared_pool(device)
        elif device != self.device:
            return self.runner(args)  # graphs (and their pool) live on the first GPU seen
        assert self.shared is not None
        with self.shared.lock:  # every graph of the device shares one pool: one at a time
            captured = self.graphs.get(key)
            if captured is None and key in self.seen and len(self.graphs) < MAX_GRAPHS:
                captured = self._capture(args, key)
            elif captured is None:
                if len(self.seen) >= _MAX_SEEN:
                    self.seen.clear()
                self.seen.add(key)
            warm = captured is None and not self.warmed
            self.warmed = True
            if captured is not None:
                return self._replay(captured, args)
        stats.count("step_by_step")
        outputs = self._warm_up(args) if warm else self.runner(args)
        if not self.graphs and self.disabled is None and self.cut is None:
            reason = self._check_outputs(outputs, args)  # known before any capture
            if reason is not None:
                self._disable(reason, logging.INFO)
        return outputs

    def _warm_up(self, args: list[Any]) -> tuple[Any, ...]:
        """Run step by step on the caller's stream of the plan's device (its current device made
        that one, as the capture and replays do), measuring what the plan's extern results allocate."""
        with torch.cuda.device(self.device):
            if hasattr(self.runner, "call_measured"):
                # Extern results (mm, convolution, ...) are memory the plan allocates too: the
                # budget its outputs are weighed against counts them from this call on.
                outputs, extern_bytes = self.runner.call_measured(args)
                self.budget += extern_bytes
                return outputs
            return self.runner(args)

    def _check_outputs(self, outputs: Any, args: list[Any]) -> str | None:
        """Why these outputs keep the plan from replaying (None: it may, perhaps cut)."""
        reason = _unsafe_sharing(outputs, args)
        if reason is not None:
            return reason
        sizes = [o.numel() * o.element_size() if isinstance(o, torch.Tensor) else 0 for o in outputs]
        reason = _too_large(sum(sizes), self.budget)
        if reason is None:
            return None
        # The largest outputs move behind a cut until what the graph still returns is small.
        names = [a.name if isinstance(a, NodeRef) else None for a in self.plan.outputs]
        order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
        large: list[str] = []
        left = sum(sizes)
        for i in order:
            if _too_large(left, self.budget) is None:
                break
            if names[i] is None or not hasattr(self.runner, "run_steps"):
                return reason
            large.append(names[i])  # type: ignore[arg-type]
            left -= sizes[i]
        cut = graph_cut(self.plan, large)
        if cut is None or launches(self.plan, cut) < MIN_LAUNCHES:
            return reason
        self.cut, self.live = cut, live_across(self.plan, cut)
        tail = launches(self.plan) - launches(self.plan, cut)
        how = f"cuda graph for steps 1-{cut}, then {tail} launches step by step: {reason}"
        stats.count("cut_plans")
        log.info("fxcc: plan %s: %s", self.key[:12], how)
        if self.on_cut is not None:
            self.on_cut(how)
        return None

    def _capture(self, args: list[Any], key: tuple[Any, ...]) -> _Captured | None:
        assert self.shared is not None
        prewarm.wait_all()  # no other thread of fxcc's allocates or launches while this one captures
        clear_library_workspaces()  # this capture's workspace is made in the pool (see module Note)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.device(self.device), \
                    torch.cuda.graph(graph, pool=self.shared.handle(), stream=capture_stream(self.device),
                                     capture_error_mode="thread_local"):
                before = torch.cuda.memory_reserved(self.device)  # after the cache was emptied for the capture
                live = None
                if self.cut is None:
                    outputs = self.runner(list(args))
                else:
                    env = self.runner.begin(list(args))  # type: ignore[attr-defined]
                    self.runner.run_steps(env, 0, self.cut)  # type: ignore[attr-defined]
                    live = {n: env[n] for n in self.live}
                    outputs = tuple(live.values())
            clear_library_workspaces()  # freed into the pool, where the next capture may take it
            grown = max(0, torch.cuda.memory_reserved(self.device) - before)
            self.pool_bytes += grown
            with stats.lock:
                stats.pool_bytes += grown
        except Exception as e:  # noqa: BLE001 - the plan still runs step by step
            clear_library_workspaces()  # a workspace made by the failed capture is pool memory
            self._disable(f"its capture failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            return None
        reason = self._check_outputs(outputs, args) if self.cut is None else None
        if reason is not None or (self.cut is not None and live is None):
            self._disable(reason or "its cut changed while capturing")
            return None
        stats.count("captures")
        captured = self.graphs[key] = _Captured(graph, tuple(outputs), live)
        self.seen.discard(key)
        log.info("fxcc: plan %s replays as a CUDA graph (%d captured)", self.key[:12], len(self.graphs))
        return captured

    def _disable(self, reason: str, level: int = logging.WARNING) -> None:
        self.disabled = reason
        self.graphs.clear()
        self.seen.clear()
        with stats.lock:
            stats.disabled.append(reason)
        if self.on_disable is not None:
            self.on_disable(reason)
        log.log(level, "fxcc: plan %s runs step by step, not as a CUDA graph: %s", self.key[:12], reason)

    def _replay(self, captured: _Captured, args: list[Any]) -> tuple[Any, ...]:
        if self.device is not None and self.device.index != torch.cuda.current_device():
            with torch.cuda.device(self.device):
                return self._replay(captured, args)
        stream = torch.cuda.current_stream()
        shared = self.shared
        assert shared is not None
        if shared.done is not None and stream != shared.last_stream:
            stream.wait_event(shared.done)  # the pool's last user may still be running elsewhere
        captured.graph.replay()
        if captured.live is None:
            out = tuple(_copy_out(o, layout) for o, layout in zip(captured.outputs, captured.layouts))
            stats.count("copied_out", sum(layout is not None for layout in captured.layouts))
        else:  # the steps after the cut, on what the graph left; outputs in the pool are copied
            env = self.runner.begin(args)  # type: ignore[attr-defined]
            env.update(captured.live)
            self.runner.run_steps(env, self.cut)  # type: ignore[attr-defined]
            pool = captured.pool_storages
            finished = self.runner.finish(env)  # type: ignore[attr-defined]
            in_pool = [isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in pool for o in finished]
            out = tuple(_copy_out(o, _layout(o)) if copy else o for o, copy in zip(finished, in_pool))
            stats.count("copied_out", sum(in_pool))
        if shared.done is None:
            shared.done = torch.cuda.Event()
        shared.done.record(stream)
        shared.last_stream = stream
        stats.count("replays")
        return out


class SharedPool:
    """The CUDA graph memory pool every graphed plan of the process captures into on one device,
    the lock its captures and replays hold, and the event of its last replay (see module Note)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._handle: Any = None
        self.done: Any = None  # recorded after the last replay's copies, on `last_stream`
        self.last_stream: Any = None

    def handle(self) -> Any:
        if self._handle is None:
            self._handle = torch.cuda.graph_pool_handle()
        return self._handle


_pools: dict[int, SharedPool] = {}


def shared_pool(device: torch.device) -> SharedPool:
    """The process's graph pool on `device` (made on first use)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _streams_lock:
        if index not in _pools:
            _pools[index] = SharedPool()
        return _pools[index]


def clear_library_workspaces() -> None:
    """Drop cuBLAS's per-stream workspaces (every stream's; each is made again by its stream's next
    matmul). A torch without the call keeps them: the graphs then cost one more workspace."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
        stats.count("workspace_drops")


_streams: dict[int, Any] = {}
_streams_lock = threading.Lock()


def capture_stream(device: torch.device) -> Any:
    """The stream fxcc captures on for `device`: one per device and process (torch's
    default capture stream is one for all GPUs)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _streams_lock:
        if index not in _streams:
            _streams[index] = torch.cuda.Stream(device=index)
        return _streams[index]


def _pointer_key(args: list[Any]) -> tuple[Any, ...] | None:
    """The inputs' data pointers (and any non-tensor values), or None when a tensor is not on
    the first tensor's CUDA device."""
    key: list[Any] = []
    device = None
    for a in args:
        if isinstance(a, torch.Tensor):
            if device is None:
                device = a.device
                if device.type != "cuda":
                    return None
            elif a.device != device:
                return None
            key.append(a.data_ptr())
        elif a is None or isinstance(a, (bool, int, float)):
            key.append(a)
        else:
            return None  # nothing else is a plan input a graph could be keyed on
    return tuple(key) if device is not None else None


def _copy_out(o: Any, layout: Any) -> Any:
    if layout is None:
        return o
    shape, stride, dtype, device = layout
    return torch.empty_strided(shape, stride, dtype=dtype, device=device).copy_(o)


def _unsafe_outputs(outputs: Any, args: list[Any], budget: int) -> str | None:
    """Why these captured outputs cannot be copied out after each replay (None: they can)."""
    return _unsafe_sharing(outputs, args) or _too_large(
        sum(o.numel() * o.element_size() for o in outputs if isinstance(o, torch.Tensor)), budget)


def _unsafe_sharing(outputs: Any, args: list[Any]) -> str | None:
    """Why these outputs could not be copied apart (one aliases an input, another output, itself)."""
    inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    storages: set[int] = set()
    for o in outputs:
        if not isinstance(o, torch.Tensor):
            continue
        ptr = o.untyped_storage().data_ptr()
        if ptr in inputs:
            return "an output aliases an input"
        if ptr in storages:
            return "two outputs share memory"
        if _overlaps(o):
            return "an output overlaps itself"
        storages.add(ptr)
    return None


def _too_large(total: int, budget: int) -> str | None:
    if total * OUTPUT_SHARE > budget:
        return f"outputs ({total} B) are too large to copy out beside {budget} B allocated"
    return None


def _overlaps(t: torch.Tensor) -> bool:
    """Whether two of `t`'s elements share memory (an expanded dim): a copy with its strides could
    not hold them apart. Gaps are fine (a padded row is copied with its padding)."""
    span = 1
    for size, stride in sorted(((n, st) for n, st in zip(t.shape, t.stride()) if n > 1), key=lambda d: d[1]):
        if stride < span:
            return True
        span = stride * size
    return False

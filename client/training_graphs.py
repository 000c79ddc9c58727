"""Replay a training graph's static plan (a forward that saves tensors for its backward, or that
backward) as one CUDA graph: a host-bound training step drops from one Python step per launch,
allocation and free to a graph launch per plan.

Note: what differs from inference graphs (client/cuda_graphs.py), and how each is kept:
- Outputs live on. A forward's outputs are mostly tensors saved for the backward (activations,
  hundreds of MB) and a backward's are the parameters' gradients, which AccumulateGrad may keep
  as `.grad`: copying them out after each replay would cost a copy of every activation. So each
  replay hands out the graph's own outputs (aliases of its pool, `detach()`ed: same storage, no
  copy); only a forward's small outputs that share storage with nothing else and that autograd
  does not hold alone (a loss, which the caller's `loss` variable keeps until the next step's
  forward has run) are copied. A backward's gradients and a forward's saved tensors, however
  small, are aliased (GPT-2's training step copied 98 of them, a launch each). The next
  replay overwrites that pool, so it replays only once every aliased output of the last one is
  dead: each output's storage use count is back to what this class holds alone (measured right
  after the capture). A caller that keeps one past the next call (logits appended to a list,
  gradients that AccumulateGrad stole into `.grad` and that stay there over micro-batches or
  with zero_grad(set_to_none=False), a forward's saved tensors when it runs twice before one
  backward) makes the plan capture again with those outputs copied out (a copy each, into fresh
  memory) from then on, up to MAX_COPY_CAPTURES times, once a position has been found held on
  HELD_AGAIN calls without HELD_FORGET replays in a row between them: a caller that keeps them
  once (a validation loss kept over one training step) costs that call run step by step, not a
  copy of every saved activation on every step after it. Where a copy cannot serve (an
  output whose storage others share) that call runs step by step, whose outputs are fresh memory;
  fxcc says so once, and stops trying after MAX_BUSY such calls in a row (before session 26, a
  backward whose gradients a caller kept never replayed again).
- Large outputs of a forward's own. A forward's output that the backward does not save (a
  language model's logits: GPT-2's are 393 MB at batch 4 x 512) would be pool memory that the
  graph holds between steps, where eager and Inductor free it once the loss has read it (its
  backward then reuses that memory). So a forward whose own outputs hold TAIL_OUTPUT bytes or more
  is cut before the first step that makes their storage (client/cuda_graphs.py graph_cut, as
  inference plans are): the graph replays the steps before, leaving the values the rest reads,
  and those steps (the head's matmul) run after each replay, step by step, their outputs fresh
  memory of the call (at most MAX_TAIL_LAUNCHES launches; a longer tail keeps the whole plan in
  the graph). Outputs that view what the graph left are handed out as aliases, as below (small
  ones of their storage's own copied); values it left that view an input are made again from each
  call's input, so the graph keeps no caller's storage. Off by default
  (ClientSettings.cuda_graphs_training_tail) until tests/gpu and bench.models have run it.
- One pool per plan. A graph's outputs outlive its call, so no other plan's graph may capture
  into its pool: a later capture there could place its temporaries over the memory of a graph
  that still replays (the inference graphs share a pool only because nothing they leave outlives
  a call). A plan's graphs are captured into one pool: the first capture makes it, and each
  recapture (inputs moved, outputs copied out) takes it over from the graph it replaces, which
  never replays again; outputs of that graph a caller still holds are allocated blocks, which the
  allocator does not hand out, and its temporaries' blocks are reused (each recapture into a new
  pool left the old one's segments reserved while anything held a block of them).
- Inputs that move. Parameters, optimizer-updated in place, keep their addresses; a data batch
  or a backward's incoming gradient may not, and a backward's saved tensors move until its
  forward replays. The plan is captured once two pairs of consecutive calls show inputs moving
  that are few (MAX_MOVING) or hold a small share of the inputs' bytes (DYNAMIC_SHARE): those of
  both pairs are copied into buffers of the graph before each replay; the rest must keep their
  addresses. An input the graph writes (batch norm's running statistics) must keep its address.
  When more inputs move after the capture (a batch that takes turns at two addresses, every
  other step) and all of them still fit, the plan is captured again at once with those copied in
  too; when inputs settle at other addresses (a backward captured before its forward replayed,
  whose saved tensors then live in the forward's pool), it is captured again once they have. Up
  to MAX_CAPTURES captures; a call whose inputs fit neither runs step by step.
- Outputs that are inputs. An output that is an input or a view of one (a weight saved for the
  backward) is made from the call's own input, as a step-by-step call would return it, never
  from the tensor of the capture (whose storage the class would otherwise keep alive).
- Library workspaces. A capture drops cuBLAS's per-stream workspaces first (as inference
  captures do, client/cuda_graphs.py), so the one it makes is memory of its own pool, and drops
  them again after, which frees that workspace into the pool: no other capture allocates there,
  and the pool lives as long as the graph, so the graph's scratch stays its own whatever else
  clears the workspaces later (an inference capture of the same process does, around each of
  its own). A graph that used a workspace made outside its pool (a capture stream's, made by a
  warm-up call and kept) would have written over whatever took that memory once it was dropped.
  So the first call runs step by step on the caller's stream, as any step-by-step call: nothing
  is made for the capture stream ahead, and no output crosses streams (handed to the caller with
  record_stream, a forward's saved activations would have been held by the allocator until the
  GPU passed their free, while the backward's temporaries took new memory).
- Static work: the plan has no size symbols and every extern op is capture-safe (the inference
  list plus backward ops, cuda_graphs.TRAINING_SAFE); a capture that fails anyway is reported
  once and the plan runs step by step from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

from fxcc.client import prewarm
from fxcc.client.cuda_graphs import (
    MIN_LAUNCHES,
    _copy_out,
    _layout,
    _overlaps,
    _pointer_key,
    capture_stream,
    clear_library_workspaces,
    graph_cut,
    launches,
    live_across,
    shared_pool,
    stats,
)
from fxcc.compiler_core.artifact import ArtifactManifest

log = logging.getLogger("fxcc.cuda_graphs")

DYNAMIC_SHARE = 2  # captured only while the inputs that move hold at most 1/this of the inputs' bytes,
MAX_MOVING = 2  # or are this few (a batch and its labels)
MAX_OBSERVED = 16  # calls without such a pair of calls before the plan stops trying
MAX_CAPTURES = 3  # captures of a plan whose inputs settled at other addresses after its last one
MAX_BUSY = 8  # step-by-step calls in a row (outputs still held, inputs moved) before it stops trying
MAX_COPY_CAPTURES = 2  # captures that copy out outputs the caller was found to keep (see module Note)
HELD_AGAIN = 2  # calls that find an output position held before it is copied out (see module Note)
HELD_FORGET = 8  # replays in a row after which the positions found held are forgotten
MOVED = "an input is at another address than when the graph was captured"
HELD = "an output of its last replay is still held (its memory would be overwritten)"
SMALL_OUTPUT = 1 << 20  # bytes up to which an output of its own storage is copied out, not aliased
TAIL_OUTPUT = 16 << 20  # bytes from which a forward's own output is made after the replay (see module Note)
MAX_TAIL_LAUNCHES = 8  # launches the steps after such a cut may take, step by step


def written_inputs(spec: Any) -> frozenset[str]:
    """Names of the graph's placeholders that one of its nodes writes in place (AOTAutograd's
    write-backs: copy_ into a batch norm's running statistics)."""
    names = {p.name for p in spec.placeholders}
    written: set[str] = set()
    for node in spec.nodes:
        parts = node.target.split(".")
        op = parts[1] if len(parts) >= 2 else parts[0]
        if op.endswith("_") and node.args:
            written.update(n for n in _names(node.args[0]) if n in names)
    return frozenset(written)


def _names(arg: Any) -> Iterable[str]:
    if isinstance(arg, (list, tuple)):
        for a in arg:
            yield from _names(a)
    elif hasattr(arg, "name") and getattr(arg, "kind", "node") == "node":
        yield arg.name


class _Output:
    """How a replay hands out one output of the captured graph."""

    __slots__ = ("input", "kind", "layout", "rel", "tensor", "value")

    def __init__(self, kind: str, value: Any = None, tensor: Any = None, input: int = -1,
                 rel: int = 0, layout: Any = None) -> None:
        self.kind = kind  # "value" | "input" (a view of input `input`) | "copy" | "alias"
        self.value = value
        self.tensor = tensor
        self.input = input
        self.rel = rel  # storage offset from the input's own
        self.layout = layout


class _TrainingGraph:
    __slots__ = ("baseline", "buffers", "cut", "done", "graph", "last_stream", "live", "live_ids", "outputs", "owners",
                 "pool_ptrs", "small", "static", "storages", "views")

    def __init__(self) -> None:
        self.graph: Any = None
        self.static: dict[int, Any] = {}  # position → data pointer (or non-tensor value) it must have
        self.buffers: dict[int, torch.Tensor] = {}  # position → the graph's copy of a moving input
        self.outputs: list[_Output] = []
        self.storages: list[Any] = []  # the pool storages handed out, and their use counts alone
        self.baseline: list[int] = []
        self.owners: dict[int, int] = {}  # index into `storages` → the one output that views it whole
        self.done: Any = None  # event after the last replay, on `last_stream`
        self.last_stream: Any = None
        self.live: dict[str, Any] | None = None  # (a cut plan) the values the graph leaves for the tail
        self.cut: int | None = None  # (a cut plan) the first step of the tail
        self.live_ids: frozenset[int] = frozenset()  # (a cut plan) ids of the values in `live`
        self.pool_ptrs: frozenset[int] = frozenset()  # (a cut plan) their storages' data pointers
        self.views: list[tuple[str, int, Any, int]] = []  # (a cut plan) values left that view an input:
        # (name, input position, (shape, stride), offset from the input's), made from each call's input
        self.small: frozenset[int] | None = None  # (a cut plan) small outputs alone on their pool storage

    def free(self) -> bool:
        """Whether every output the last replay handed out is dead (nobody but us holds its storage)."""
        count = torch._C._storage_Use_Count
        return all(count(s._cdata) == n for s, n in zip(self.storages, self.baseline))

    def held_outputs(self) -> set[int]:
        """The positions of outputs still held from the last replay that a copy could serve (each
        the only output of its storage: a `.grad` kept across steps, a saved tensor of a forward
        whose backward has not run yet, logits kept in a list)."""
        count = torch._C._storage_Use_Count
        return {at for i, at in self.owners.items() if count(self.storages[i]._cdata) != self.baseline[i]}


class TrainingGraphedPlan:
    """A static plan of a training graph that replays one CUDA graph (see module Note)."""

    def __init__(self, runner: Callable[[list[Any]], tuple[Any, ...]], manifest: ArtifactManifest,
                 written: frozenset[str] = frozenset(), pool_outputs: frozenset[int] = frozenset(),
                 on_disable: Callable[[str], None] | None = None, tail: bool = False) -> None:
        self.runner = runner
        self.pool_outputs = pool_outputs  # positions handed out from the pool however small (see module Note)
        self.copy_out: set[int] = set()  # positions copied out whatever their size: the caller kept them
        self.held_seen: dict[int, int] = {}  # position -> calls that found it held (HELD_AGAIN, HELD_FORGET)
        self.replays_in_a_row = 0
        self.copy_captures = 0
        self.on_disable = on_disable
        self.key = manifest.key
        plan = manifest.plan
        self.written = frozenset(i for i, name in enumerate(plan.inputs) if name in written)
        self.captured: _TrainingGraph | None = None
        self.previous: tuple[Any, ...] | None = None  # the last call's input addresses (and values)
        self.moving: list[int] | None = None  # the inputs that moved between the last two calls
        self.observed = 0
        self.captures = 0
        self.busy = 0  # step-by-step calls in a row since the capture
        self.told_busy = False
        self.disabled: str | None = None
        self.device: torch.device | None = None
        self.plan = plan
        self.tail = tail  # large own outputs of a forward made after the replay (see module Note)
        self.cut: int | None = None  # steps from here on run after each replay, step by step
        self.live_names: list[str] = []  # the values the graph leaves for them

    def __call__(self, args: list[Any]) -> tuple[Any, ...]:
        if self.disabled is not None:
            return self.runner(args)
        addresses = _pointer_key(args)
        if addresses is None or torch.cuda.is_current_stream_capturing():
            return self.runner(args)
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        if self.device is None:
            self.device = device
        elif device != self.device:
            return self.runner(args)
        with shared_pool(device).lock:  # captures and replays of the device one at a time
            previous, self.previous = self.previous, addresses
            captured, why = self.captured, None
            if captured is not None:
                why = self._why_not_replay(captured, args, addresses)
                if why is None:
                    self.busy, self.moving = 0, None
                    self._replayed()
                    return self._replay(captured, args)
                held = captured.held_outputs() - self.copy_out if why is HELD else set()
                if self._keeps(held):
                    # The caller keeps these past the next call (gradients accumulated over steps or
                    # micro-batches, zero_grad(set_to_none=False)): from now on they are copied out.
                    self.copy_out |= held
                    self.copy_captures += 1
                    log.info("fxcc: training plan %s copies %d of its outputs out from now on: the caller keeps "
                             "them past the next call", self.key[:12], len(self.copy_out))
                    fresh = self._capture(args, sorted(captured.buffers), addresses, settles=False)
                    return self._after_failed_capture(args) if fresh is None else self._replay(fresh, args)
                if why is MOVED and self.captures < MAX_CAPTURES:
                    grown = self._grown(captured, args, addresses)
                    if grown is not None:  # a few more inputs move: copy them in too
                        fresh = self._capture(args, grown, addresses)
                        return self._after_failed_capture(args) if fresh is None else self._replay(fresh, args)
                if why is not MOVED or self.captures >= MAX_CAPTURES:
                    return self._step_by_step(args, why)
            elif previous is None:
                stats.count("step_by_step")
                stats.because("first call")
                inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
                outputs = self.runner(args)  # on the caller's stream, as eager (see module Note)
                if self.tail:
                    try:
                        self._choose_cut(outputs, inputs)
                    except Exception as e:  # noqa: BLE001 - only an optimisation: the whole plan is graphed
                        log.info("fxcc: training plan %s: no cut (%s: %s)", self.key[:12], type(e).__name__, e)
                        self.cut, self.live_names = None, []
                return outputs
            moved = None if previous is None else self._moved(args, previous, addresses)
            both = None if moved is None or self.moving is None else sorted({*moved, *self.moving})
            if both is not None and self._fits(args, both):
                fresh = self._capture(args, both, addresses)
                if fresh is not None:
                    return self._replay(fresh, args)
                return self._after_failed_capture(args)
            self.moving = moved
            if why is not None:
                return self._step_by_step(args, why)
            self.observed += 1
            if self.observed >= MAX_OBSERVED:
                self._disable(f"its inputs move between calls ({MAX_OBSERVED} calls seen)")
        stats.count("step_by_step")
        stats.because("inputs watched before a capture")
        return self.runner(args)

    def _choose_cut(self, outputs: Any, inputs: frozenset[int] | set[int] = frozenset()) -> None:
        """A forward whose own outputs (not saved for the backward: a language model's logits) are
        large makes them after each replay, step by step, from what its graph leaves (see module
        Note), where those steps are few. `inputs`: the call's inputs' data pointers (an output
        that is one, or views one, is the caller's memory already)."""
        if not hasattr(self.runner, "run_steps") or not isinstance(outputs, (tuple, list)) \
                or len(outputs) != len(self.plan.outputs) or any(isinstance(o, (tuple, list)) for o in outputs):
            return
        large = []
        for at, (o, ref) in enumerate(zip(outputs, self.plan.outputs)):
            if at in self.pool_outputs or not isinstance(o, torch.Tensor) or not o.is_cuda:
                continue
            st = o.untyped_storage()
            if st.nbytes() >= TAIL_OUTPUT and st.data_ptr() not in inputs and getattr(ref, "name", None):
                large.append(ref.name)
        if not large:
            return
        cut = graph_cut(self.plan, large)
        if cut is None or launches(self.plan, cut) < MIN_LAUNCHES \
                or launches(self.plan) - launches(self.plan, cut) > MAX_TAIL_LAUNCHES:
            return
        self.cut, self.live_names = cut, live_across(self.plan, cut)
        stats.count("cut_plans")
        log.info("fxcc: training plan %s: its graph runs steps 1-%d, the %d launches after them run step by step "
                 "(outputs of %d bytes or more are made after each replay)", self.key[:12], cut,
                 launches(self.plan) - launches(self.plan, cut), TAIL_OUTPUT)

    def _replayed(self) -> None:
        self.replays_in_a_row += 1
        if self.replays_in_a_row >= HELD_FORGET:
            self.held_seen.clear()

    def _keeps(self, held: set[int]) -> bool:
        """Whether to capture again with `held` (positions found held, not yet copied out) copied
        out: one of them has been found held on HELD_AGAIN calls with fewer than HELD_FORGET
        replays in a row between any two (else this call runs step by step)."""
        self.replays_in_a_row = 0
        for at in held:
            self.held_seen[at] = self.held_seen.get(at, 0) + 1
        return bool(held) and max(self.held_seen[at] for at in held) >= HELD_AGAIN and \
            self.copy_captures < MAX_COPY_CAPTURES

    def _moved(self, args: list[Any], previous: tuple[Any, ...], addresses: tuple[Any, ...]) -> list[int] | None:
        """The inputs that moved since the last call, when a graph could copy them in (None: it could not)."""
        moved = [i for i, (was, now) in enumerate(zip(previous, addresses)) if was != now]
        return moved if self._fits(args, moved) else None

    def _grown(self, g: _TrainingGraph, args: list[Any], addresses: tuple[Any, ...]) -> list[int] | None:
        """The inputs graph `g` copies in and those that have left the address it was captured at,
        when a graph could copy them all in (None: it could not). Inputs that take turns at a few
        addresses (a batch or an incoming gradient that moves every other step) are copied in after
        at most MAX_CAPTURES captures, rather than the plan running step by step."""
        moving = sorted({*g.buffers, *(i for i, want in g.static.items() if addresses[i] != want)})
        return moving if self._fits(args, moving) else None

    def _fits(self, args: list[Any], moving: list[int]) -> bool:
        """Whether a graph may copy the inputs at positions `moving` in before each replay: tensors
        the graph does not write, not expanded, and few (MAX_MOVING) or a small share of the bytes."""
        total = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
        moved_bytes = 0
        for i in moving:
            a = args[i]
            if not isinstance(a, torch.Tensor) or i in self.written or _overlaps(a):
                return False  # a value, a written input or an expanded tensor must stay as it is
            moved_bytes += a.numel() * a.element_size()
        return len(moving) <= MAX_MOVING or moved_bytes * DYNAMIC_SHARE <= total


    def _capture(self, args: list[Any], moved: list[int], addresses: tuple[Any, ...],
                 settles: bool = True) -> _TrainingGraph | None:
        """A graph of the plan at these addresses, `moved` inputs copied in; `settles`: it counts
        toward MAX_CAPTURES (a capture that only copies out kept outputs does not)."""
        prewarm.wait_all()  # no other thread of fxcc's allocates or launches while this one captures
        g = _TrainingGraph()
        call = list(args)
        for i in moved:
            a = args[i]
            g.buffers[i] = call[i] = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a)
        g.static = {i: addresses[i] for i in range(len(args)) if i not in g.buffers}
        clear_library_workspaces()  # the capture makes its own workspace, in its pool (see module Note)
        # A recapture takes the pool of the graph it replaces (which never replays again): its
        # temporaries' blocks are reused, the blocks of outputs still held are not handed out.
        old = self.captured
        pool = old.graph.pool() if old is not None else None
        if old is not None:  # its last replay may still run on another stream: the first replay waits
            g.done, g.last_stream = old.done, old.last_stream
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.device(self.device), \
                    torch.cuda.graph(graph, pool=pool, stream=capture_stream(self.device),
                                     capture_error_mode="thread_local"):
                if self.cut is None:
                    outputs = self.runner(call)
                else:
                    g.cut = self.cut
                    env = self.runner.begin(call)  # type: ignore[attr-defined]
                    self.runner.run_steps(env, 0, self.cut)  # type: ignore[attr-defined]
                    g.live = {n: env[n] for n in self.live_names}
                    outputs = None
                    del env
        except Exception as e:  # noqa: BLE001 - the plan still runs step by step
            clear_library_workspaces()
            self._disable(f"its capture failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            return None
        clear_library_workspaces()  # freed into this plan's pool, which no other plan's capture takes
        g.graph = graph
        if g.live is None:
            why = _describe_outputs(g, outputs, call, self.pool_outputs, frozenset(self.copy_out))
        else:
            why = _describe_live(g, call)
            if why is not None:  # later captures take the whole plan (a graph replaying keeps its own cut)
                log.info("fxcc: training plan %s: no cut (%s)", self.key[:12], why)
                self.cut, self.live_names, why = None, [], None
                return None
        del outputs, call
        if why is not None:
            self._disable(why)
            return None
        g.baseline = [torch._C._storage_Use_Count(s._cdata) for s in g.storages]
        self.captured = g  # one before it is dropped: its pool lives on while its outputs do
        self.captures += settles
        self.busy = 0
        stats.count("captures")
        log.info("fxcc: training plan %s replays as a CUDA graph (%d inputs copied in, %d outputs handed out "
                 "from its pool)", self.key[:12], len(g.buffers), len(g.storages))
        return g

    def _why_not_replay(self, g: _TrainingGraph, args: list[Any], addresses: tuple[Any, ...]) -> str | None:
        for i, want in g.static.items():
            if addresses[i] != want:
                return MOVED
        if not g.free():
            return HELD
        return None

    def _after_failed_capture(self, args: list[Any]) -> tuple[Any, ...]:
        stats.count("step_by_step")
        stats.because("no graph: its capture failed or was refused")
        return self.runner(args)

    def _step_by_step(self, args: list[Any], why: str) -> tuple[Any, ...]:
        stats.count("step_by_step")
        stats.because(why)
        self.busy += 1
        if not self.told_busy:
            self.told_busy = True
            log.info("fxcc: training plan %s ran step by step once: %s", self.key[:12], why)
        if self.busy >= MAX_BUSY:
            self._disable(f"{why}, {MAX_BUSY} calls in a row")
        return self.runner(args)

    def _replay(self, g: _TrainingGraph, args: list[Any]) -> tuple[Any, ...]:
        if self.device is not None and self.device.index != torch.cuda.current_device():
            with torch.cuda.device(self.device):
                return self._replay(g, args)
        stream = torch.cuda.current_stream()
        if g.done is not None and stream != g.last_stream:
            stream.wait_event(g.done)  # its last replay may still run on another stream
        for i, buffer in g.buffers.items():
            buffer.copy_(args[i])
        stats.count("copied_in", len(g.buffers))
        g.graph.replay()
        if g.live is not None:
            out, copied = self._tail(g, args)
        else:
            out, copied = self._handed_out(g, args)
        if g.done is None:
            g.done = torch.cuda.Event()
        g.done.record(stream)
        g.last_stream = stream
        stats.count("replays")
        stats.count("copied_out", copied)
        return tuple(out)

    def _tail(self, g: _TrainingGraph, args: list[Any]) -> tuple[list[Any], int]:
        """The steps after the cut, on what the graph left: outputs in its pool are handed out as
        aliases (copies where small and their storage's own, or kept by the caller), the others are
        the tail's own fresh tensors or the call's inputs."""
        assert g.live is not None
        env = self.runner.begin(list(args))  # type: ignore[attr-defined]
        env.update(g.live)
        for name, i, (shape, stride), rel in g.views:
            a = args[i]
            env[name] = a.as_strided(shape, stride, a.storage_offset() + rel)
        self.runner.run_steps(env, g.cut)  # type: ignore[attr-defined]
        finished = self.runner.finish(env)  # type: ignore[attr-defined]
        del env
        if g.small is None:  # from the first replay: which outputs alone hold a pool storage
            g.owners, g.small = _owners(g, finished, self.pool_outputs)
        out: list[Any] = []
        copied = 0
        for at, o in enumerate(finished):
            if not isinstance(o, torch.Tensor) or o.untyped_storage().nbytes() == 0 \
                    or o.untyped_storage().data_ptr() not in g.pool_ptrs:
                # the tail's own, or the call's input (or a view of it); an empty value the graph
                # left is a new tensor each call
                out.append(o.detach() if id(o) in g.live_ids else o)
            elif not o.is_cuda or at in self.copy_out or at in g.small:
                out.append(o.clone() if _overlaps(o) else _copy_out(o, _layout(o)))
                copied += o.is_cuda
            else:
                out.append(o.detach())
        return out, copied

    def _handed_out(self, g: _TrainingGraph, args: list[Any]) -> tuple[list[Any], int]:
        out: list[Any] = []
        copied = 0
        for o in g.outputs:
            if o.kind == "alias":
                out.append(o.tensor.detach())
            elif o.kind == "copy":
                out.append(_copy_out(o.tensor, o.layout))
                copied += o.tensor.is_cuda  # a host constant's copy is no launch
            elif o.kind == "input":
                out.append(_view_of(args[o.input], o))
            else:
                out.append(o.value)
        return out, copied

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        self.captured = None
        self.previous = None
        with stats.lock:
            stats.disabled.append(reason)
        if self.on_disable is not None:
            self.on_disable(reason)
        log.warning("fxcc: training plan %s runs step by step, not as a CUDA graph: %s", self.key[:12], reason)


def _describe_outputs(g: _TrainingGraph, outputs: Any, call: list[Any], pool_outputs: frozenset[int] = frozenset(),
                      copy_out: frozenset[int] = frozenset()) -> str | None:
    """Fill g.outputs and g.storages from the capture's outputs; why they cannot be replayed
    (None: they can). Outputs at `pool_outputs` are aliases of the pool whatever their size, those
    at `copy_out` copies whatever their size, where each is its storage's only output."""
    inputs: dict[int, int] = {}
    for i, a in enumerate(call):
        if isinstance(a, torch.Tensor):
            inputs.setdefault(a.untyped_storage().data_ptr(), i)
    shared: dict[int, int] = {}
    for o in outputs:
        if isinstance(o, torch.Tensor):
            ptr = o.untyped_storage().data_ptr()
            shared[ptr] = shared.get(ptr, 0) + 1
    held: dict[int, Any] = {}
    for at, o in enumerate(outputs):
        if isinstance(o, (tuple, list)):
            return "an output is a list of tensors"
        if not isinstance(o, torch.Tensor):
            g.outputs.append(_Output("value", value=o))
            continue
        if not o.is_cuda:  # made at capture time by a host op (attention's unused Philox seed): a constant
            g.outputs.append(_Output("copy", tensor=o, layout=_layout(o)))
            continue
        ptr = o.untyped_storage().data_ptr()
        if ptr in inputs:
            a = call[inputs[ptr]]
            if a.dtype != o.dtype:
                return "an output views an input as another dtype"
            g.outputs.append(_Output("input", input=inputs[ptr], rel=o.storage_offset() - a.storage_offset(),
                                     layout=(tuple(o.shape), o.stride())))
            continue
        own = shared[ptr] == 1 and not _overlaps(o)
        small = o.numel() * o.element_size() <= SMALL_OUTPUT
        if own and (at in copy_out or (small and at not in pool_outputs)):
            g.outputs.append(_Output("copy", tensor=o, layout=_layout(o)))
            continue
        g.outputs.append(_Output("alias", tensor=o))
        if ptr not in held:
            held[ptr] = o.untyped_storage()
            if own:
                g.owners[len(held) - 1] = at
    g.storages = list(held.values())
    return None


def _describe_live(g: _TrainingGraph, call: list[Any]) -> str | None:
    """A cut plan's graph: the storages of what it leaves for the tail, which its outputs alias and
    whose use counts say when the last replay's outputs are dead (None: it may replay; else why it
    cannot be cut). A value that views an input (a weight's transpose, a copied-in batch) is not
    kept: each call makes it again from its own input (g.views), as the step-by-step plan would,
    so the graph holds no caller's storage between calls."""
    assert g.live is not None
    inputs: dict[int, int] = {}
    for i, a in enumerate(call):
        if isinstance(a, torch.Tensor) and a.untyped_storage().nbytes():
            inputs.setdefault(a.untyped_storage().data_ptr(), i)
    held: dict[int, Any] = {}
    for name, v in list(g.live.items()):
        if isinstance(v, (tuple, list)):
            return f"a value left for the steps after the cut is a list ({name})"
        if not isinstance(v, torch.Tensor) or not v.untyped_storage().nbytes():
            continue
        ptr = v.untyped_storage().data_ptr()
        if ptr in inputs:
            a = call[inputs[ptr]]
            if a.dtype != v.dtype:
                return f"a value left for the steps after the cut views an input as another dtype ({name})"
            g.views.append((name, inputs[ptr], (tuple(v.shape), v.stride()), v.storage_offset() - a.storage_offset()))
            del g.live[name]
        elif v.is_cuda:
            held.setdefault(ptr, v.untyped_storage())
        else:  # made at capture time by a host op: a constant, copied out when handed out
            held.setdefault(ptr, None)
    g.storages = [st for st in held.values() if st is not None]
    g.pool_ptrs = frozenset(held)
    g.live_ids = frozenset(id(v) for v in g.live.values())
    return None


def _owners(g: _TrainingGraph, outputs: Any, pool_outputs: frozenset[int]) -> tuple[dict[int, int], frozenset[int]]:
    """Index into g.storages -> the one output that holds that storage alone (held_outputs), and
    the outputs among those that are copied out at each replay, as _describe_outputs copies them:
    small and not handed out from the pool whatever their size."""
    index = {st.data_ptr(): i for i, st in enumerate(g.storages)}
    seen: dict[int, list[int]] = {}
    for at, o in enumerate(outputs):
        if isinstance(o, torch.Tensor) and o.untyped_storage().nbytes():
            seen.setdefault(o.untyped_storage().data_ptr(), []).append(at)
    owners = {index[ptr]: ats[0] for ptr, ats in seen.items()
              if ptr in index and len(ats) == 1 and not _overlaps(outputs[ats[0]])}
    small = frozenset(at for at in owners.values() if at not in pool_outputs
                      and outputs[at].numel() * outputs[at].element_size() <= SMALL_OUTPUT)
    return {i: at for i, at in owners.items() if at not in small}, small


def _view_of(a: torch.Tensor, o: _Output) -> torch.Tensor:
    """The output that is input `a` or a view of it, as the capture saw it."""
    shape, stride = o.layout
    if o.rel == 0 and tuple(a.shape) == shape and a.stride() == stride:
        return a
    return a.as_strided(shape, stride, a.storage_offset() + o.rel)

"""One aten graph through fxcc: `GraphCompiler` captures it, keys it, and serves it from the local
cache, the service's shared cache, a remote compile, or — with no FXCC_URL — an in-process compile;
the compile events, warnings said once, and the helpers the Dynamo backend (client/backend.py), the
pre-AOT cache and the Dynamo package cache share.

Note: the user's program never dies because of fxcc. Whatever fails (capture, service,
compile, loading, a first run), the graph runs eagerly and fxcc warns once per cause.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from fxcc.client.cache import LocalCache
from fxcc.client.capture import capture_graph
from fxcc.client.process_groups import hand_on
from fxcc.client.runtime import GuardFailed, load_plan
from fxcc.client.settings import ClientSettings
from fxcc.compiler_core.artifact import Artifact, CompileStats
from fxcc.compiler_core.keys import compile_key
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target

log = logging.getLogger("fxcc.client")


@dataclass
class CompileEvent:
    """What happened to one graph: where its artifact came from and what it holds."""

    key: str
    # local-hit | remote-hit | remote-compiled | compiled-in-process | fallback | precompile-*
    source: str
    seconds: float
    stats: CompileStats | None = None
    error: str | None = None
    graph_nodes: int = 0
    job_id: str | None = None
    # how the plan runs: "cuda graph" (replayed once its inputs' addresses repeat), or
    # "step by step: <why not a CUDA graph>"; None for no plan (fallback, precompile)
    runs_as: str | None = None
    # AOTAutograd and the pre-AOT cache (client/pre_aot.py): "skipped: pre-AOT cache hit",
    # "skipped: pre-AOT cache hit from the service", "ran; stored for the next process",
    # "ran; not cached: <why>"; None when not looked at
    pre_aot: str | None = None
    # Whether AOTAutograd's runtime wrapper runs around each call. False for a plain inference
    # graph (client/pre_aot.py): fxcc calls its plan directly, as on a pre-AOT cache hit.
    aot_wrapper: bool | None = None


@dataclass
class _Log:
    events: list[CompileEvent] = field(default_factory=list)
    warned: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    aot_runs: int = 0  # Dynamo graphs handed to AOTAutograd (a pre-AOT cache hit skips it)


_log = _Log()


def events() -> list[CompileEvent]:
    """Every graph this process has handed to fxcc, in order."""
    with _log.lock:
        return list(_log.events)


def clear_events() -> None:
    with _log.lock:
        _log.events.clear()


def reset() -> None:
    """Forget recorded events and which causes were already warned about."""
    with _log.lock:
        _log.events.clear()
        _log.warned.clear()
        _log.aot_runs = 0


def aot_runs() -> int:
    """How many Dynamo graphs this process has run through AOTAutograd."""
    with _log.lock:
        return _log.aot_runs


def _record(event: CompileEvent) -> None:
    with _log.lock:
        _log.events.append(event)


def warn_once(cause: str, message: str) -> None:
    with _log.lock:
        if cause in _log.warned:
            return
        _log.warned.add(cause)
    warnings.warn(f"fxcc: {message}", RuntimeWarning, stacklevel=3)
    log.warning("fxcc: %s", message)


def target_for(example_inputs: list[Any], gm: fx.GraphModule | None = None) -> Target:
    """Where the graph's kernels will run, from the devices of its inputs; for a graph without a
    CUDA input (factory ops alone: torch.arange(n, device="cuda")), from the tensors it makes."""
    made = (n.meta.get("val", n.meta.get("example_value")) for n in gm.graph.nodes) if gm is not None else ()
    for t in itertools.chain(example_inputs, made):
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(t.device)
            return Target(kind="cuda", arch=major * 10 + minor)
    return Target(kind="interpret")


def _can_run(example_inputs: list[Any], gm: fx.GraphModule) -> bool:
    """Whether this process can run kernels built for the graph's target: CUDA, or the CPU with
    Triton's interpreter on (TRITON_INTERPRET=1, as tests run); without it kernels cannot run on
    the CPU at all, so the graph runs as it is, said once."""
    if target_for(example_inputs, gm).kind == "cuda" or \
            os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes"):
        return True
    warn_once("cpu-without-interpreter", "this graph runs on the CPU, where fxcc's Triton kernels run only in "
              "Triton's interpreter (TRITON_INTERPRET=1, for tests: slow); its ops run as they are, uncompiled. "
              "fxcc compiles for CUDA GPUs")
    return False


class GraphCompiler:
    """AOTAutograd's fw/bw compiler: aten GraphModule + example inputs → a boxed callable."""

    # Called with (event, artifact, capture, request) once a plan is ready (client/pre_aot.py).
    on_ready: Callable[[CompileEvent, Artifact, Any, CompileRequest | None], None] | None = None

    def __init__(self, settings: ClientSettings, inference: bool = False) -> None:
        self.settings = settings
        self.inference = inference  # AOTAutograd's inference graphs: nothing saved for a backward
        self.cache = LocalCache(settings.cache_dir)

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[[list[Any]], Any]:
        t0 = time.perf_counter()
        eager = _boxed(gm)
        if not _can_run(example_inputs, gm):
            return eager
        try:
            capture = capture_graph(gm, example_inputs)
            from fxcc.client.precision import matmul_allows_tf32  # the flag as it is now: Dynamo guards it

            strides = None if self.inference else _forward_strides(gm)
            graph = capture.spec
            if strides is not None:
                graph = graph.model_copy(update={"free_layout_outputs": saved_outputs(capture)})
            if not self.inference:
                capture.pool_outputs = pool_outputs(gm, capture)
            request = CompileRequest(
                graph=graph,
                options=CompileOptions(mode=self.settings.mode, target=target_for(example_inputs, gm),
                                       allow_tf32=matmul_allows_tf32()),
                priority="precompile" if self.settings.precompile else "interactive",
                hints=capture.hints,
            )
            key = compile_key(request)
            art = self.cache.get(key)
            if art is not None:
                if self.settings.url and not art.manifest.tuned and art.manifest.target.kind == "cuda":
                    _executor().submit(self.refresh_tuned, key)
                return _report_strides(self._ready(art, "local-hit", capture, eager, t0, request), art, strides)
            if self.settings.precompile:
                return self._precompile(request, key, eager, t0)
            if not self.settings.blocking:
                return self._background(request, key, capture, eager, t0)
            art, source = self.fetch(request, key)
            return _report_strides(self._ready(art, source, capture, eager, t0, request), art, strides)
        except Exception as e:  # noqa: BLE001 - the user's program must keep running
            return self._fallback(gm, example_inputs, eager, e, t0)

    def fetch(self, request: CompileRequest, key: str) -> tuple[Artifact, str]:
        """The artifact for `key` from the service (or an in-process compile), stored locally."""
        if self.settings.url:
            from fxcc.client.remote import RemoteService

            remote = RemoteService.for_settings(self.settings)
            try:
                art, source = remote.compile(request, key, self.settings.compile_timeout_s)
            finally:
                remote.close()
        else:
            from fxcc.compiler_core.pipeline import compile_and_build

            # Note: in-process compiles tune only in max-autotune mode (on a GPU of the target's
            # arch): tuning takes seconds per kernel, which a default-mode first call should not.
            tune = "cuda" if request.options.mode == "max-autotune" else None
            art, source = compile_and_build(request, tune_device=tune), "compiled-in-process"
        self.cache.put(art)
        return art, source

    def refresh_tuned(self, key: str) -> bool:
        """Replace an untuned local copy of `key` by the service's tuned one, if it has one by now
        (a GPU worker tuned it after this machine cached it). The process that started the
        refresh keeps its plan; the next one loads the tuned artifact. Never raises."""
        from fxcc.client.remote import RemoteService

        try:
            remote = RemoteService.for_settings(self.settings)
            try:
                art = remote.get_artifact(key)
            finally:
                remote.close()
        except Exception as e:  # noqa: BLE001 - only an optimisation
            log.info("fxcc: no tuned artifact for %s from the service: %s", key[:12], _cause_text(e))
            return False
        if art is None or not art.manifest.tuned:
            return False
        self.cache.put(art)
        log.info("fxcc: the service has a tuned artifact for %s; the next process loads it", key[:12])
        return True

    def _ready(self, art: Artifact, source: str, capture: Any, eager: Callable, t0: float,
               request: CompileRequest | None = None, graph_nodes: int = 0,
               pre_aot: str | None = None) -> Callable:
        """The plan of `art`, ready to run. `capture` is None for a pre-AOT cache hit (a plan with
        no constants and no size symbols, whose graph has `graph_nodes` nodes)."""
        runner: Callable = load_plan(art, () if capture is None else capture.bindings.groups)
        key = art.manifest.key
        training = not self.inference and capture is not None and self.settings.cuda_graphs_training
        if request is not None and request.graph.symbols:
            runner, runs_as = Variants(runner, lambda args: self._variant(request, capture, args)), \
                "step by step: sizes are symbolic"
        elif not self.settings.cuda_graphs:
            runs_as = "step by step: cuda_graphs is off"
        elif not self.inference and capture is None:
            runs_as = "step by step: not an inference graph"
        else:
            from fxcc.client.cuda_graphs import why_not_graphed

            why = why_not_graphed(art.manifest, self.inference, training)
            runs_as = "cuda graph, once its inputs' addresses repeat" if why is None else f"step by step: {why}"
        nodes = graph_nodes if capture is None else len(capture.spec.nodes)
        event = CompileEvent(key=key, source=source, seconds=time.perf_counter() - t0,
                             stats=art.manifest.stats, graph_nodes=nodes, runs_as=runs_as, pre_aot=pre_aot,
                             aot_wrapper=False if capture is None else None if self.inference else True)
        if runs_as.startswith("cuda graph") and self.inference:
            from fxcc.client.cuda_graphs import GraphedPlan

            runner = GraphedPlan(runner, art.manifest,
                                 on_disable=lambda why: setattr(event, "runs_as", f"step by step: {why}"),
                                 on_cut=lambda how: setattr(event, "runs_as", how))
        elif runs_as.startswith("cuda graph"):
            from fxcc.client.training_graphs import TrainingGraphedPlan, written_inputs

            runner = TrainingGraphedPlan(runner, art.manifest, written_inputs(capture.spec), capture.pool_outputs,
                                         on_disable=lambda why: setattr(event, "runs_as", f"step by step: {why}"),
                                         tail=self.settings.cuda_graphs_training_tail)
        if not self.inference and capture is not None:
            runner = layout_guard(runner, capture.spec)  # its copies reach a graph as inputs that move
        _record(event)
        log.info("fxcc: graph %s from %s (%d kernels; %s)%s", key[:12], source, art.manifest.stats.kernels,
                 runs_as, "; AOTAutograd skipped (pre-AOT cache)" if capture is None else "")
        if self.on_ready is not None:
            try:
                self.on_ready(event, art, capture, request)
            except Exception as e:  # noqa: BLE001 - an observer never costs the plan
                log.info("fxcc: on_ready hook failed (%s)", _cause_text(e))
        if capture is not None:
            runner = hand_on(runner, capture.bindings)
        return _guarded(runner, [] if capture is None else capture.constants, eager, key)

    def _variant(self, request: CompileRequest, capture: Any, args: list[Any]) -> Callable:
        """A plan for sizes that every known plan's guards reject: compiled with the call's sizes
        as hints, under its own key (local cache first, then the service or in-process)."""
        t0 = time.perf_counter()
        hints = read_symbols(request, args)
        variant = request.model_copy(update={"hints": hints, "variant": True})
        key = compile_key(variant)
        art = self.cache.get(key)
        source = "local-hit"
        if art is None:
            art, source = self.fetch(variant, key)
        _record(CompileEvent(key=key, source="variant", seconds=time.perf_counter() - t0,
                             stats=art.manifest.stats, graph_nodes=len(capture.spec.nodes)))
        log.info("fxcc: variant %s of a dynamic graph for %s (%s)", key[:12], hints, source)
        return load_plan(art, capture.bindings.groups)

    def _precompile(self, request: CompileRequest, key: str, eager: Callable, t0: float) -> Callable:
        """Submit without waiting (or, with no service, compile now into the local cache)."""
        if self.settings.url:
            from fxcc.client.remote import RemoteService

            remote = RemoteService.for_settings(self.settings)
            try:
                answer = remote.submit(request)
            finally:
                remote.close()
            source = "precompile-cached" if answer["status"] == "done" else "precompile-submitted"
            job = answer.get("job_id")
        else:
            self.fetch(request, key)
            source, job = "precompile-compiled", None
        _record(CompileEvent(key=key, source=source, seconds=time.perf_counter() - t0,
                             graph_nodes=len(request.graph.nodes), job_id=job))
        return eager

    def _background(self, request: CompileRequest, key: str, capture: Any, eager: Callable,
                    t0: float) -> Callable:
        """Run eagerly while the compile is in flight; switch to the artifact once it arrives."""
        future = _executor().submit(self.fetch, request, key)
        state: dict[str, Callable] = {}

        def run(args: list[Any]) -> Any:
            fn = state.get("fn")
            if fn is None:
                if not future.done():
                    return eager(args)
                try:
                    art, source = future.result()
                    fn = self._ready(art, source, capture, eager, t0, request)
                except Exception as e:  # noqa: BLE001
                    warn_once(_cause(e), f"running a graph eagerly: {_cause_text(e)}")
                    fn = eager
                state["fn"] = fn
            return fn(args)
        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def _fallback(self, gm: fx.GraphModule, example_inputs: list[Any], eager: Callable,
                  e: Exception, t0: float) -> Callable:
        if self.settings.fallback == "error":
            raise e
        fn, how = eager, "eagerly"
        if self.settings.fallback == "inductor":
            try:
                from torch._inductor.compile_fx import compile_fx_inner

                fn, how = compile_fx_inner(gm, example_inputs), "with Inductor"
            except Exception as inductor_error:  # noqa: BLE001
                log.warning("fxcc: Inductor fallback failed too (%s); running eagerly",
                            _cause_text(inductor_error))
        warn_once(f"{how}:{_cause(e)}", f"running a graph {how}: {_cause_text(e)}")
        _record(CompileEvent(key="", source="fallback", seconds=time.perf_counter() - t0,
                             error=_cause_text(e), graph_nodes=sum(1 for _ in gm.graph.nodes)))
        return fn


def _forward_strides(gm: fx.GraphModule) -> list | None:
    """Where AOTAutograd collects a training forward's output strides (TracingContext's list,
    only while it compiles a forward, and only for conv nets: their saved activations may come
    out channels-last), else None."""
    if not any(n.op == "call_function" and n.target is torch.ops.aten.convolution.default for n in gm.graph.nodes):
        return None
    from torch._guards import TracingContext

    tc = TracingContext.try_get()
    strides = getattr(tc, "output_strides", None) if tc is not None else None
    if strides is None or getattr(tc, "fw_metadata", None) is None:
        return None
    return strides


def saved_outputs(capture: Any) -> list[int]:
    """Positions of the forward's outputs that are tensors saved for the backward (AOTAutograd's
    metadata says which), whose layout the compiler may choose; none where that is unclear."""
    from torch._guards import TracingContext

    spec = capture.spec
    if capture.bindings.outputs:
        return []  # outputs the plan does not make: positions would not match AOTAutograd's
    try:
        saved = range(len(spec.outputs))[TracingContext.get().fw_metadata.tensors_saved_for_backwards_slice]
    except Exception as e:  # noqa: BLE001 - only an optimisation
        log.debug("fxcc: no saved-tensor positions (%s)", _cause_text(e))
        return []
    return [i for i in saved if spec.outputs[i].kind == "node"]


def pool_outputs(gm: fx.GraphModule, capture: Any) -> frozenset[int]:
    """A training graph's outputs that only autograd holds, which its CUDA graph hands out from its
    pool however small (client/training_graphs.py): a backward's (gradients) and a forward's tensors
    saved for the backward. A forward's other outputs (the loss) may outlive the next step.

    Note: AOTAutograd names a backward's incoming gradients tangents_N, a forward's inputs primals_N."""
    if any(n.op == "placeholder" and n.name.startswith("tangents") for n in gm.graph.nodes):
        return frozenset(range(len(capture.spec.outputs)))
    return frozenset(saved_outputs(capture))


def _report_strides(fn: Callable, art: Artifact, strides: list | None) -> Callable:
    """Tell AOTAutograd the strides of the forward's outputs (its backward's saved inputs are laid
    out so); nothing where the plan has none to report (no output of free layout)."""
    reported = art.manifest.plan.output_strides
    if strides is not None and not strides and reported:
        strides.extend(None if s is None else tuple(s) for s in reported)
    return fn


def layout_guard(runner: Callable, spec: Any) -> Callable:
    """`runner`, with each 4-D or 5-D input (a conv net's activation) copied into the layout the
    plan reads it in when it comes otherwise: a backward compiled for the channels-last activations
    its forward plan reported, while that forward ran eagerly after all (its plan failed at run
    time); or compiled for eager's layout while its forward plan, arriving later (a compile that
    did not block, a precompile), writes them channels-last."""
    checks = []
    for i, p in enumerate(spec.placeholders):
        s = p.spec
        if s is None or not all(isinstance(x, int) for x in (*s.sizes, *s.strides)) or len(s.sizes) not in (4, 5):
            continue
        checks.append((i, tuple(s.sizes), tuple(s.strides)))
    if not checks:
        return runner

    def laid_out(args: list[Any]) -> list[Any]:
        copied = False
        for i, sizes, strides in checks:
            t = args[i]
            # the common case, one tuple comparison (a ResNet-18 backward checks 100 inputs a call)
            if not isinstance(t, torch.Tensor) or t.stride() == strides or _strides_match(t.stride(), strides, sizes):
                continue
            if not copied:
                args, copied = list(args), True
            args[i] = torch.empty_strided(sizes, strides, dtype=t.dtype, device=t.device).copy_(t)
        return args

    def run(args: list[Any]) -> Any:
        return runner(laid_out(args))

    if hasattr(runner, "steal"):
        # Note: a call that copied an input hands the copies' list on; the caller's list keeps the
        # originals until the call returns (rare: a forward that ran otherwise than planned).
        run.steal = lambda args: runner.steal(laid_out(args))  # type: ignore[attr-defined]
    return run


def _strides_match(a: tuple[int, ...], b: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    return all(n == 1 or x == y for n, x, y in zip(sizes, a, b))


_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _log.lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fxcc-compile")
        return _pool


def _cause(e: Exception) -> str:
    """What counts as 'the same cause' for warn-once: the error class and its first words."""
    return f"{type(e).__name__}:{str(e)[:40]}"


def _cause_text(e: Exception) -> str:
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}"


def _boxed(gm: fx.GraphModule) -> Callable[[list[Any]], Any]:
    def run(args: list[Any]) -> Any:
        return gm(*args)
    run._boxed_call = True  # type: ignore[attr-defined]
    return run


MAX_VARIANTS = 8
VARIANT_RETRY_S = 60.0  # after a variant's compile failed, sizes it would serve run eagerly this long


class Variants:
    """The plans of one dynamic graph: the first whose guards hold runs; when none holds, one
    more variant is compiled for the call's sizes (at most MAX_VARIANTS; then GuardFailed).

    Note: a variant whose compile fails (the service unreachable, a compile error) raises
    GuardFailed too, so that only that call runs eagerly, not every later call of the graph; for
    VARIANT_RETRY_S no compile is tried again (a service outage does not cost each call a timeout).
    """

    def __init__(self, first: Callable, compile_variant: Callable[[list[Any]], Callable]) -> None:
        self.plans = [first]
        self.compile_variant = compile_variant
        self.lock = threading.Lock()
        self.failed_at: float | None = None
        self.failure = ""

    def __call__(self, args: list[Any]) -> Any:
        return self._call(args, False)

    def steal(self, args: list[Any]) -> Any:
        """A call that takes `args` over (PlanRunner.steal): the plan whose guards hold lets them go
        if it has run before; guards that fail leave the list whole."""
        return self._call(args, True)

    def _call(self, args: list[Any], steal: bool) -> Any:
        for plan in list(self.plans):
            try:
                return plan.steal(args) if steal else plan(args)
            except GuardFailed:
                continue
        with self.lock:
            if len(self.plans) >= MAX_VARIANTS:
                raise GuardFailed(f"{len(self.plans)} variants and none serves these sizes")
            if self.failed_at is not None and time.monotonic() - self.failed_at < VARIANT_RETRY_S:
                raise GuardFailed(f"no variant serves these sizes; the last compile failed ({self.failure})")
            try:
                plan = self.compile_variant(args)
            except Exception as e:  # the graph's other plans still serve their sizes
                self.failed_at, self.failure = time.monotonic(), _cause_text(e)
                raise GuardFailed(f"a variant for these sizes failed to compile ({self.failure})") from e
            self.failed_at = None
            self.plans.append(plan)
        return plan.steal(args) if steal else plan(args)


def read_symbols(request: CompileRequest, args: list[Any]) -> dict[str, int]:
    """The size symbols' values in a call (each read where the graph's inputs define it)."""
    out: dict[str, int] = {}
    for p, a in zip(request.graph.placeholders, args):
        if p.symbol is not None:
            out.setdefault(p.symbol, int(a))
        elif p.spec is not None:
            for size, actual in zip(p.spec.sizes, a.shape):
                if isinstance(size, str) and size in {s.name for s in request.graph.symbols}:
                    out.setdefault(size, int(actual))
    return out


class PlanRunError(RuntimeError):
    """A plan failed at run time after it had let its inputs go, so that the call cannot run eagerly."""


def _guarded(runner: Callable, constants: list[torch.Tensor], eager: Callable, key: str) -> Callable:
    """The artifact's runner; if it fails at run time, this graph switches to eager for good.

    A runner that can take its inputs over (`steal`: a plan run step by step) is handed a list of its
    own and the caller's list is emptied, as AOTAutograd's boxed calling convention asks: a
    backward's saved activations are then freed as its steps consume them. A plan lets the inputs go
    only once it has run through once, so a first call that fails still runs eagerly; a later call
    that fails after its inputs were let go raises (PlanRunError), and the graph's next calls run
    eagerly."""
    state = {"runner": runner}
    stealing = hasattr(runner, "steal")

    def run(args: list[Any]) -> Any:
        fn = state["runner"]
        if fn is eager:
            return eager(args)
        if stealing:
            return run_stealing(args)
        try:
            return fn(list(args) + constants)
        except GuardFailed as e:
            # Sizes no variant serves (or one more variant would be too many): this call only.
            warn_once(f"guard:{key}", f"a dynamic graph runs eagerly for some sizes: {e}")
            return eager(args)
        except Exception as e:  # noqa: BLE001
            warn_once(f"run:{key}", f"artifact {key[:12]} failed to run ({type(e).__name__}: {e}); "
                      "running this graph eagerly from now on")
            state["runner"] = eager
            return eager(args)

    def run_stealing(args: list[Any]) -> Any:
        n = len(args)
        call = list(args)
        call.extend(constants)
        args.clear()
        try:
            return runner.steal(call)
        except GuardFailed as e:  # guards are read before any input is let go
            warn_once(f"guard:{key}", f"a dynamic graph runs eagerly for some sizes: {e}")
            return eager(call[:n])
        except Exception as e:
            state["runner"] = eager
            if len(call) == n + len(constants):
                warn_once(f"run:{key}", f"artifact {key[:12]} failed to run ({type(e).__name__}: {e}); "
                          "running this graph eagerly from now on")
                return eager(call[:n])
            warn_once(f"run:{key}", f"artifact {key[:12]} failed to run after its inputs were let go "
                      f"({type(e).__name__}: {e}); this call raises, and the graph runs eagerly from now on")
            raise PlanRunError(f"fxcc: artifact {key[:12]} failed to run after its inputs were let go "
                                f"({type(e).__name__}: {e}); the graph runs eagerly from its next call") from e
    run._boxed_call = True  # type: ignore[attr-defined]
    return run

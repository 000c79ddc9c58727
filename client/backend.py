"""The Dynamo backend: torch.compile(model, backend="fxcc").

Dynamo's graph goes through AOTAutograd (core-aten decompositions); each aten graph (forward,
backward or inference) is captured as a GraphSpec, keyed, and served from the local cache, the
service's shared cache, a remote compile, or — with no FXCC_URL — an in-process compile.

Note: the user's program never dies because of fxcc. Whatever fails (capture, service,
compile, loading, a first run), the graph runs eagerly and fxcc warns once per cause.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from client.cache import LocalCache
from client.capture import capture_graph
from client.runtime import load_plan
from client.settings import ClientSettings
from compiler_core.artifact import Artifact, CompileStats
from compiler_core.keys import compile_key
from compiler_core.wire import CompileOptions, CompileRequest, Target

log = logging.getLogger("fxcc.client")


@dataclass
class CompileEvent:
    """What happened to one graph: where its artifact came from and what it holds."""

    key: str
    source: str  # local-hit | remote-hit | remote-compiled | compiled-in-process | fallback
    seconds: float
    stats: CompileStats | None = None
    error: str | None = None
    graph_nodes: int = 0


@dataclass
class _Log:
    events: list[CompileEvent] = field(default_factory=list)
    warned: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


_log = _Log()


def events() -> list[CompileEvent]:
    """Every graph this process has handed to fxcc, in order."""
    with _log.lock:
        return list(_log.events)


def clear_events() -> None:
    with _log.lock:
        _log.events.clear()


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


def target_for(example_inputs: list[Any]) -> Target:
    """Where the graph's kernels will run, from the devices of its inputs."""
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(t.device)
            return Target(kind="cuda", arch=major * 10 + minor)
    return Target(kind="interpret")


class GraphCompiler:
    """AOTAutograd's fw/bw compiler: aten GraphModule + example inputs → a boxed callable."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.cache = LocalCache(settings.cache_dir)

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[[list[Any]], Any]:
        t0 = time.perf_counter()
        eager = _boxed(gm)
        try:
            capture = capture_graph(gm, example_inputs)
            request = CompileRequest(
                graph=capture.spec,
                options=CompileOptions(mode=self.settings.mode, target=target_for(example_inputs)),
            )
            key = compile_key(request)
            artifact, source = self.fetch(request, key)
            runner = load_plan(artifact)
        except Exception as e:  # noqa: BLE001 - the user's program must keep running
            return self._fallback(gm, eager, e, t0)
        _record(CompileEvent(key=key, source=source, seconds=time.perf_counter() - t0,
                             stats=artifact.manifest.stats, graph_nodes=len(capture.spec.nodes)))
        log.info("fxcc: graph %s from %s (%d kernels)", key[:12], source,
                 artifact.manifest.stats.kernels)
        return _guarded(runner, capture.constants, eager, key)

    def fetch(self, request: CompileRequest, key: str) -> tuple[Artifact, str]:
        """The artifact for `key`: local cache, then the service (or an in-process compile)."""
        art = self.cache.get(key)
        if art is not None:
            return art, "local-hit"
        if self.settings.url:
            from client.remote import RemoteService

            remote = RemoteService(self.settings.url, self.settings.token,
                                   self.settings.request_timeout_s)
            try:
                art, source = remote.compile(request, key, self.settings.compile_timeout_s)
            finally:
                remote.close()
        else:
            from compiler_core.compile import compile_request

            art, source = compile_request(request), "compiled-in-process"
        self.cache.put(art)
        return art, source

    def _fallback(self, gm: fx.GraphModule, eager: Callable, e: Exception, t0: float) -> Callable:
        if self.settings.fallback == "error":
            raise e
        cause = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        warn_once(type(e).__name__ + (str(e)[:60]), f"running a graph eagerly: {cause}")
        _record(CompileEvent(key="", source="fallback", seconds=time.perf_counter() - t0,
                             error=cause, graph_nodes=sum(1 for _ in gm.graph.nodes)))
        return eager


def _boxed(gm: fx.GraphModule) -> Callable[[list[Any]], Any]:
    def run(args: list[Any]) -> Any:
        return gm(*args)
    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _guarded(runner: Callable, constants: list[torch.Tensor], eager: Callable, key: str) -> Callable:
    """The artifact's runner; if it fails at run time, this graph switches to eager for good."""
    state = {"runner": runner}

    def run(args: list[Any]) -> Any:
        fn = state["runner"]
        if fn is eager:
            return eager(args)
        try:
            return fn(list(args) + constants)
        except Exception as e:  # noqa: BLE001
            warn_once(f"run:{key}", f"artifact {key[:12]} failed to run ({type(e).__name__}: {e}); "
                      "running this graph eagerly from now on")
            state["runner"] = eager
            return eager(args)
    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def fxcc_backend(gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
    """The `fxcc` backend for torch.compile (registered as a torch_dynamo_backends entry point)."""
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    try:
        settings = ClientSettings.from_env().with_options(kwargs.get("options"))
    except ValueError as e:
        raise ValueError(f"fxcc: {e}") from None
    compiler = GraphCompiler(settings)
    backend = aot_autograd(fw_compiler=compiler, bw_compiler=compiler,
                           decompositions=core_aten_decompositions(),
                           keep_inference_input_mutations=True)
    return backend(gm, example_inputs)

"""A Dynamo package's load (`PackageLoad`): its artifacts fetched, its plans built and its first
library calls made on a side thread while torch installs its guards (client/dynamo_cache.py finds,
verifies and unpickles the package; this module makes its graphs ready)."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fxcc.client import dynamo_state, prewarm
from fxcc.client.dynamo_state import (
    _first_line,
    _local_path,
    _state,
    _write_local,
    count,
    join_loads,
    log,
    log_once,
)

if TYPE_CHECKING:
    from fxcc.client.dynamo_cache import BackendArtifact
    from fxcc.compiler_core.artifact import Artifact



class PackageLoad:
    """A verified package whose graphs are made ready on a side thread (`start`) while torch builds
    and installs its guards on the caller's: the artifacts fetched (local cache, else the service),
    each graph's plan built, then on a GPU each kernel's cubin loaded into the device's context,
    while a helper thread makes the plans' first library calls (client/prewarm.py): from the start,
    those the package recorded when it was saved, else from the moment the artifacts are there; `finish` gives the installed callables their plans, and the first call
    of each waits for the rest of the work.

    Note: the fetch is what `load_plan_for` does on its own (the local cache, then the service with
    the workers' signatures and the digests checked), for all the package's graphs at once (a bundle
    when there are several); nothing of an artifact runs before `finish`, and an artifact that is
    refused or missing, or a plan that fails to build, makes `finish` raise: the package is
    uninstalled and traced, as before. Whatever fails in the warm-up only costs the first call the
    work. The thread runs on the caller's current CUDA device and stream. What the load writes to
    the local cache (the artifacts fetched from the service, the package itself) is written by the
    thread once every graph's first call returned (or at exit), never on the way to the first result.

    Note (timings, `timings()`): `fetch_s`, `plans_s`, `preload_s` (the cubins), `warm_s` (from the
    plans to the end of the warm-up) and `ready_s` (from the start of the load to the end of the
    warm-up) are the side thread's, `library_calls_s` its helper's (the recorded calls start with the
    fetch; a package without them starts its calls once the artifacts are fetched, beside the plans'
    build); `plans_wait_s` what torch.compile still
    waited for the plans after installing the guards, `ready_wait_s` what the first call waited for
    the warm-up; `cubins` the modules preloaded, `library_calls` the calls made, `recorded_calls` those
    the package held (started before the fetch)."""

    def __init__(self, entry: Any, settings: Any, key: str, data: bytes, payload: bytes) -> None:
        self.entry, self.settings, self.key, self.data, self.payload = entry, settings, key, data, payload
        self.times: dict[str, float] = {}
        self.counts = {"cubins": 0, "library_calls": 0, "recorded_calls": 0}
        self.thread: threading.Thread | None = None
        self.called = threading.Event()  # every graph's first call returned, or the process exits
        self._planned = threading.Event()  # the plans built, or the error why not
        self._ready = threading.Event()  # the warm-up done too
        self._finished = threading.Event()  # finish ran (or the install failed): `_kept` says which
        self._kept = False
        self._waiting: set[str] = set()  # graphs whose first call has not returned
        self._fetched: dict[str, tuple[Artifact, str]] = {}
        self._plans: dict[str, Callable] = {}
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    @property
    def dynamo(self) -> Any:
        return self.entry.dynamo

    @property
    def backends(self) -> dict[str, BackendArtifact]:
        return self.entry.backends

    def start(self) -> None:
        for backend in self.backends.values():
            backend.hold()
        self._waiting = set(self.backends)
        keys = [k for k in (b.artifact_key() for b in self.backends.values()) if k is not None]
        device, stream = self._caller_device()
        self.thread = threading.Thread(target=self._work, args=(keys, device, stream), name="fxcc-package-load",
                                       daemon=True)
        if device is not None:
            prewarm.track(self)  # a CUDA graph capture waits for the warm-up's launches
        with _state.lock:
            _state.loads.append(self)
        _exit_flush.register()
        self.thread.start()

    def _caller_device(self) -> tuple[torch.device | None, Any]:
        """The caller's current CUDA device and stream, where the package's graphs run on CUDA."""
        if not any(b.pending is not None and b.pending.state.get("target", {}).get("kind") == "cuda"
                   for b in self.backends.values()):
            return None, None
        try:
            if not torch.cuda.is_available():
                return None, None  # the plans say why they cannot load
            device = torch.device("cuda", torch.cuda.current_device())
            return device, torch.cuda.current_stream(device)
        except Exception:  # noqa: BLE001 - the plans say why they cannot load
            return None, None

    def _work(self, keys: list[str], device: torch.device | None, stream: Any) -> None:
        try:
            if device is None:
                self._prepare(keys, None)
            else:
                with torch.cuda.device(device), torch.cuda.stream(stream):
                    recorded, calls = self._start_recorded_calls(device, stream)
                    found = self._prepare(keys, None if recorded else (device, stream))
                    self._warm(device, calls or found)
        except BaseException as e:  # noqa: BLE001 - a side thread's error is the loading thread's
            if not self._planned.is_set():
                self._error = e
            log.debug("fxcc: Dynamo package cache: side thread: %s", _first_line(e))
        finally:
            self.times["ready"] = time.perf_counter()
            self._planned.set()
            self._ready.set()
            prewarm.untrack(self)
        try:
            self._store()
        except Exception as e:  # noqa: BLE001 - only the next process's optimisation
            log_once(f"store:{type(e).__name__}", "could not keep a package's artifacts locally (%s)", _first_line(e))

    def _prepare(self, keys: list[str], cuda: tuple[torch.device, Any] | None) -> threading.Thread | None:
        """Fetch the artifacts and build every graph's plan; an error is kept for `finish`. On a GPU
        (`cuda`: the caller's device and stream), the plans' library calls start as soon as the
        artifacts are there, on a thread of their own (returned): they wait mostly in cuDNN and cuBLAS,
        without the GIL, while the plans are built and the guards too."""
        t0 = time.perf_counter()
        calls = None
        try:
            self._fetched = fetch_artifacts(self.settings, keys, store=False)
            t1 = time.perf_counter()
            self.times["fetch_s"] = t1 - t0
            if cuda is not None and self.settings.prewarm:
                calls = self._start_library_calls(*cuda)
            for bid, backend in self.backends.items():
                if self._finished.is_set():  # cancelled: the package did not install
                    raise RuntimeError("the package did not install")
                self._plans[bid] = backend.plan(self.settings, self._fetched.get(backend.artifact_key() or ""))
            self.times["plans_s"] = time.perf_counter() - t1
        except BaseException as e:  # noqa: BLE001 - raised again by finish, on the loading thread
            self._error = e
        finally:
            self._planned.set()
        return calls

    def _start_recorded_calls(self, device: torch.device, stream: Any) -> tuple[bool, threading.Thread | None]:
        """(whether every CUDA graph of the package recorded its library calls, the thread making
        them), started before the artifacts are fetched: the calls come from the package
        (prewarm.record, when it was saved), not from the plans. A package saved without them (an
        older fxcc) has its calls found in its plans once they are fetched (`_start_library_calls`).

        Note: on the H200 the fetch took 0.05-0.11 s of a ResNet-50 package's 0.27 s load, and its
        24 cuDNN calls 0.13-0.17 s more after it; the calls and the fetch now overlap."""
        if not self.settings.prewarm:
            return True, None
        calls: list[tuple[Any, list[Any]]] = []
        for backend in self.backends.values():
            state = backend.pending.state if backend.pending is not None else {}
            if state.get("target", {}).get("kind") != "cuda":
                continue
            if "library_calls" not in state:
                return False, None
            calls += prewarm.recorded(state["library_calls"])
        self.counts["recorded_calls"] = len(calls)
        return True, self._calls_thread(device, stream, calls)

    def _start_library_calls(self, device: torch.device, stream: Any) -> threading.Thread | None:
        """The thread that makes each fetched plan's first library calls (client/prewarm.py).

        Note: the calls read only the plan's steps (aten ops, allow-listed, on uninitialized tensors
        of bounded sizes), never the artifact's kernels, so they need not wait for the plans' load."""
        calls: list[tuple[Any, list[Any]]] = []
        for backend in self.backends.values():
            fetched = self._fetched.get(backend.artifact_key() or "")
            if fetched is not None and backend.pending is not None and fetched[0].manifest.target.kind == "cuda":
                layouts = backend.pending.state.get("input_layouts")
                try:
                    calls += prewarm.library_calls(fetched[0].manifest.plan, layouts) if layouts else []
                except Exception as e:  # noqa: BLE001 - only an optimisation: the first call makes them
                    log.debug("fxcc: Dynamo package cache: no library calls found (%s)", _first_line(e))
        return self._calls_thread(device, stream, calls)

    def _calls_thread(self, device: torch.device, stream: Any,
                      calls: list[tuple[Any, list[Any]]]) -> threading.Thread | None:
        if not calls:
            return None

        def run() -> None:
            t0 = time.perf_counter()
            with torch.cuda.device(device), torch.cuda.stream(stream):
                self.counts["library_calls"] += prewarm.warm_calls(calls, device, self.settings.prewarm_threads)
            self.times["library_calls_s"] = time.perf_counter() - t0

        thread = threading.Thread(target=run, name="fxcc-package-prewarm", daemon=True)
        thread.start()
        return thread

    def _warm(self, device: torch.device, calls: threading.Thread | None) -> None:
        """Each artifact's cubins loaded on `device`; then the library calls waited for."""
        t0 = time.perf_counter()
        if self._error is None and self.settings.prewarm:
            from fxcc.client import cuda_loader
            from fxcc.client.runtime import plan_cubins

            for art, _ in self._fetched.values():
                try:
                    self.counts["cubins"] += cuda_loader.preload(plan_cubins(art), device.index)
                except Exception as e:  # noqa: BLE001 - the first launch loads it (and says why not)
                    log.debug("fxcc: Dynamo package cache: no cubin preload (%s)", _first_line(e))
        self.times["preload_s"] = time.perf_counter() - t0
        if calls is not None:
            calls.join()
        self.times["warm_s"] = time.perf_counter() - t0

    def join(self, timeout: float | None = None) -> None:
        """Wait for the warm-up (what a CUDA graph capture waits for: client/prewarm.py)."""
        self._ready.wait(timeout)

    def wait_ready(self) -> None:
        """What a graph's first call waits for: the side thread's warm-up (timed, `ready_wait_s`)."""
        if self._ready.is_set():
            return
        t0 = time.perf_counter()
        self._ready.wait()
        with self._lock:
            self.times["ready_wait_s"] = self.times.get("ready_wait_s", 0.0) + time.perf_counter() - t0

    def first_call_returned(self, backend_id: str) -> None:
        with self._lock:
            self._waiting.discard(backend_id)
            if not self._waiting:
                self.called.set()

    def flush(self) -> None:
        """Let the thread write what it keeps now, first calls or not (at exit)."""
        self._finished.set()
        self.called.set()

    def cancel(self) -> None:
        """The package did not install: the thread keeps none of it but the verified artifacts,
        and builds no plan from here on. Waits for the plan it may be building, so that nothing of
        the package (a plan's compile event) lands during the trace that follows."""
        self._finished.set()
        self._planned.wait()

    def finish(self) -> None:
        """Each graph's installed callable given its plan; raises when one cannot be loaded."""
        t0 = time.perf_counter()
        self._planned.wait()
        t_planned = time.perf_counter()
        if self._error is not None:
            self._finished.set()
            raise self._error
        loaded = {bid: backend.adopt(self._plans[bid], self.settings, self, bid)
                  for bid, backend in self.backends.items()}
        with _state.lock:  # a trace after a failing guard saves the package again, these graphs in it
            _state.compiled.update(loaded)
            _state.saved[self.key] = hashlib.sha256(self.payload).hexdigest()
            _state.last_load = self
        count("hits")
        self._kept = True
        self._finished.set()
        self.times.update(plans_wait_s=t_planned - t0, end=time.perf_counter())
        log.info("fxcc: Dynamo package %s loaded (%d graphs): the first call skips tracing", self.key[:12],
                 len(self.backends))

    def _store(self) -> None:
        """After every first call (or at exit): the artifacts fetched from the service, and the
        package when it was kept and is not there yet, into the local cache for the next process."""
        self._finished.wait()
        if self._kept:
            self.called.wait()
        store_fetched(self.settings, self._fetched)
        if self._kept and not _local_path(self.settings, self.key).exists():
            _write_local(self.settings, self.key, self.data)

    def timings(self) -> dict[str, float]:
        t0 = self.times.get("t0", 0.0)
        out = {"read_s": self.times.get("read", t0) - t0,
               "verify_s": self.times.get("verify", t0) - self.times.get("read", t0),
               "unpickle_s": self.times.get("unpickle", t0) - self.times.get("verify", t0)}
        for name in ("fetch_s", "plans_s", "preload_s", "library_calls_s", "warm_s", "plans_wait_s", "ready_wait_s"):
            out[name] = self.times.get(name, 0.0)
        out["ready_s"] = self.times["ready"] - t0 if "ready" in self.times else 0.0
        out["total_s"] = self.times["end"] - t0 if "end" in self.times else 0.0
        out.update(cubins=float(self.counts["cubins"]), library_calls=float(self.counts["library_calls"]),
                   recorded_calls=float(self.counts["recorded_calls"]), bytes=float(len(self.data)))
        return out


class _ExitFlush:
    """At exit, a package load's deferred writes are not lost: its side thread is let go on and
    waited for (bounded)."""

    TIMEOUT_S = 10.0

    def __init__(self) -> None:
        self.registered = False

    def register(self) -> None:
        if not self.registered:
            import atexit

            self.registered = True
            atexit.register(join_loads, self.TIMEOUT_S, True)


_exit_flush = _ExitFlush()


def fetch_artifacts(settings: Any, keys: list[str], store: bool = True) -> dict[str, tuple[Artifact, str]]:
    """The artifacts of `keys` with where each came from: the local cache's, then the rest from
    the service (verified as RemoteService verifies every artifact; several in one request, a
    bundle), put into the local cache (`store`; else later, by `store_fetched`). A key found nowhere
    is absent; a refused artifact raises."""
    from fxcc.client.cache import LocalCache

    cache = LocalCache(settings.cache_dir)
    found: dict[str, tuple[Artifact, str]] = {}
    for key in dict.fromkeys(keys):
        art = cache.get(key)
        if art is not None:
            found[key] = (art, "local-hit")
    wanted = [k for k in dict.fromkeys(keys) if k not in found]
    if not wanted or not settings.url:
        return found
    remote = dynamo_state._remote(settings)
    fetched = remote.fetch_many(wanted) if len(wanted) > 1 else {}
    for key in wanted:
        art = fetched.get(key)
        if art is None:
            art = remote.get_artifact(key)
        if art is not None:
            found[key] = (art, "remote-hit")
    if store:
        store_fetched(settings, found)
    return found


def store_fetched(settings: Any, fetched: dict[str, tuple[Artifact, str]]) -> int:
    """Put what `fetch_artifacts(store=False)` fetched from the service into the local cache; how many."""
    from fxcc.client.cache import LocalCache

    cache = LocalCache(settings.cache_dir)
    remote = [art for art, source in fetched.values() if source == "remote-hit"]
    for art in remote:
        cache.put(art)
    return len(remote)

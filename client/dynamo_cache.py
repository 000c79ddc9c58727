"""The Dynamo-skip cache: a new process runs a compiled function's first call from a signed package.

What is left of a warm start once every graph is cached is Dynamo tracing the model again. torch's
caching precompile (torch._dynamo.package: CompilePackage, DynamoCache) saves what tracing made —
the transformed bytecode, its guards and the backend's compiled callables — and installs it on the
function's code object when torch.compile wraps the function, so the first call checks the guards
and runs without tracing. A guard that fails (another shape, dtype, device, grad mode, module
attribute, global) traces and compiles as usual, and the retraced entry joins the package.

fxcc's part:
- `FxccCompiled` (what fxcc's backend returns for a plain inference graph, client/pre_aot.py)
  implements torch's SerializableCallable: its bytes name the fxcc artifact by key, with the
  graph's arity and Dynamo's own graph (the eager fallback); loading them fetches the artifact as
  any artifact is fetched (local cache, or the service with the workers' signature checked).
  So `torch.compile(f, backend="fxcc", fullgraph=True).aot_compile(...)` saves and loads too.
- `PackageStore` replaces torch's DiskDynamoCache: a package is saved after each frame Dynamo
  compiled for fxcc (only when every graph in it is an FxccCompiled), signed with the principal's
  package key, under FXCC_CACHE_DIR/dynamo and (with FXCC_URL) PUT to the service, per principal;
  a torch.compile(..., backend="fxcc") looks it up (local, then the service) by a key of the
  function's code, fxcc's keyed settings and the torch, Python and fxcc versions.
- A package found and verified here is made ready by client/package_load.py (`PackageLoad`: its
  artifacts fetched and its plans built on a side thread while torch installs its guards); what
  the process keeps across loads (counters, the service client, said-once causes) is in
  client/dynamo_state.py.

Note (trust): a package is a pickle (bytecode, guards): code. It is unpickled only after its
signature verifies with the principal's package key (FXCC_PACKAGE_KEY_FILE; held by that
principal's clients, never by the service or workers) or one of FXCC_PACKAGE_TRUSTED_KEYS; anything
else is a miss, counted and logged once. The service stores the bytes opaquely, bounded in size.

Note (safety): a package leaves out the guards on object identity (ID_MATCH, CLOSURE_MATCH,
WEAKREF_ALIVE, DICT_VERSION), as torch's caching precompile does: ids do not survive a process.
Values, tensors, shapes, dtypes, devices, grad mode, module attributes and globals' values stay
guarded; an object replaced by another after the first call (a reassigned global function) is not
seen, said once; FXCC_DYNAMO_CACHE=0 keeps every guard. Only frames of fxcc's torch.compile calls
are affected: torch's process-wide flag stays off, on only while such a frame compiles (so other
backends' frames keep all their guards).

Note (failure): whatever fails while loading or saving a package is a miss (Dynamo traces) or
a package not saved, logged once; the user's program never stops because of it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fxcc.client import prewarm
from fxcc.client.dynamo_state import (
    _first_line,
    _local_path,
    _remote,
    _state,
    _write_local,
    count,
    counters,
    join_loads,
    load_timings,
    log_once,
)
from fxcc.client.package_load import PackageLoad, fetch_artifacts, store_fetched

if TYPE_CHECKING:
    from fxcc.compiler_core.artifact import Artifact

log = logging.getLogger("fxcc.dynamo_cache")

SCHEMA = 1
MAGIC = b"FXCCPKG1\n"
MAX_PACKAGE_BYTES = 64 * 1024 * 1024  # the service's bound too (service/routes/packages.py)
SERVICE_TIMEOUT_S = 2.0  # a slow service costs only this optimisation
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


# ---------------------------------------------------------------- torch's SerializableCallable


def _serializable_base() -> type:
    try:
        from torch._dynamo.aot_compile_types import SerializableCallable

        return SerializableCallable
    except ImportError:  # a torch without aot_compile: the protocol is duck-typed
        return object


class FxccCompiled(_serializable_base()):  # type: ignore[misc]
    """fxcc's compiled callable of a plain inference graph, serializable by reference.

    `state`: the artifact's key, the graph's arity and node count and the target it was built for;
    `graph`: Dynamo's graph module (torch-level code), the fallback should the plan fail."""

    def __init__(self, fn: Callable, state: dict[str, Any], graph: torch.fx.GraphModule | LazyGraph,
                 settings: Any = None) -> None:
        self.fn = fn
        self.state = state
        self.graph = graph
        self.settings = settings  # where a package holding it is saved (not serialized)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @classmethod
    def serialize_compile_artifacts(cls, fn: FxccCompiled) -> bytes:
        """The state (with, for a CUDA plan, its library calls: a loading process makes them before
        it has fetched the artifact, client/package_load.py), then Dynamo's graph module pickled."""
        state = fn.state
        if "input_layouts" in state and "library_calls" not in state:
            plan = _plan_of(fn)
            if plan is not None:
                state = {**state, "library_calls": prewarm.record(plan, state["input_layouts"])}
        buf = io.BytesIO()
        buf.write(json.dumps(state, sort_keys=True).encode() + b"\n")
        if isinstance(fn.graph, LazyGraph):
            buf.write(fn.graph.data)
        else:
            pickle.dump(fn.graph, buf)
        return buf.getvalue()

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> FxccCompiled:
        """The callable again, its artifact fetched and loaded; raises when it cannot be."""
        return cls.loaded_from(data, None)

    @classmethod
    def loaded_from(cls, data: bytes, fetched: tuple[Artifact, str] | None,
                    into: FxccCompiled | None = None) -> FxccCompiled:
        """The callable of serialized `data` (`into`, when given, made so), its plan that of the
        artifact `fetched` (verified by the caller; with where it came from) or, when None, of the
        one fetched now; raises when it cannot be loaded."""
        from fxcc.client.settings import ClientSettings

        head, _, rest = data.partition(b"\n")
        state = json.loads(head)
        graph = LazyGraph(rest)
        settings = ClientSettings.from_env()
        fn = load_plan_for(state, graph, settings, fetched)
        compiled = cls(fn, state, graph, settings) if into is None else into
        compiled.fn, compiled.state, compiled.graph, compiled.settings = fn, state, graph, settings
        wait = _prewarm(fn, state, settings)
        if wait is not None:
            def first_call(*args: Any, **kwargs: Any) -> Any:
                wait()  # the library calls made on the side thread are done: nothing else uses the GPU now
                compiled.fn = fn
                return fn(*args, **kwargs)

            compiled.fn = first_call
        return compiled


def _plan_of(fn: FxccCompiled) -> Any:
    """The plan `fn` runs: a loaded package's, or its artifact's in the local cache (None if neither)."""
    plan = getattr(fn.fn, "fxcc_plan", None)
    if plan is None and fn.settings is not None:
        from fxcc.client.cache import LocalCache

        try:
            art = LocalCache(fn.settings.cache_dir).get(fn.state["artifact_key"])
        except Exception as e:  # noqa: BLE001 - only the next process's prewarm
            log.debug("fxcc: Dynamo package cache: no plan to record calls of (%s)", _first_line(e))
            return None
        plan = art.manifest.plan if art is not None else None
    return plan


class LazyGraph:
    """Dynamo's graph module of a loaded FxccCompiled, unpickled only if the eager fallback runs
    (unpickling regenerates its code: 0.09 s for ResNet-50's graph on the H200)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._module: torch.fx.GraphModule | None = None

    def module(self) -> torch.fx.GraphModule:
        if self._module is None:
            self._module = pickle.loads(self.data)  # a verified package's own bytes
        return self._module

    def __call__(self, *args: Any) -> Any:
        return self.module()(*args)


def wrap(fn: Callable, entry: Any, gm: torch.fx.GraphModule, example_inputs: list[Any],
         settings: Any) -> Callable:
    """What fxcc's backend returns for a plain inference graph served as `entry` (a pre-AOT
    entry): `fn` as an FxccCompiled, recorded by Dynamo's backend id for this process's package."""
    from fxcc.client.graphs import target_for

    target = target_for(example_inputs, gm)
    state = {"schema": SCHEMA, "artifact_key": entry.artifact_key, "inputs": entry.inputs,
             "outputs": entry.outputs, "graph_nodes": entry.graph_nodes,
             "target": target.model_dump(), "settings": settings_key(settings)}
    if target.kind == "cuda":  # what the loading process's prewarm needs (client/prewarm.py)
        state["input_layouts"] = prewarm.input_layouts(example_inputs)
    compiled = FxccCompiled(fn, state, gm, settings)
    backend_id = getattr(gm, "_backend_id", None)
    if isinstance(backend_id, str):
        with _state.lock:
            _state.compiled[backend_id] = compiled
    return compiled


def _prewarm(fn: Callable, state: dict[str, Any], settings: Any) -> Callable[[], None] | None:
    """Start the loaded plan's first library calls on a side thread (client/prewarm.py): the
    function that waits for them, or None."""
    plan = getattr(fn, "fxcc_plan", None)
    if not settings.prewarm or plan is None or state["target"].get("kind") != "cuda":
        return None
    return prewarm.start(plan, state.get("input_layouts"), torch.device("cuda", torch.cuda.current_device()))


def load_plan_for(state: dict[str, Any], graph: Callable, settings: Any,
                  fetched: tuple[Artifact, str] | None = None) -> Callable:
    """The runnable plan of a serialized FxccCompiled: its artifact (`fetched` with where it came
    from, or now from the local cache or the service: verified and signed as every artifact is),
    run as a pre-AOT hit runs it."""
    from fxcc.client.graphs import GraphCompiler, _boxed
    from fxcc.client.pre_aot import as_aot_runtime
    from fxcc.compiler_core.wire import Target

    t0 = time.perf_counter()
    if state.get("schema") != SCHEMA or not _HEX64.match(str(state.get("artifact_key", ""))):
        raise ValueError("not an fxcc compiled-callable state of this schema")
    key = state["artifact_key"]
    target = Target.model_validate(state["target"])
    if target.kind == "cuda":  # built for this GPU's arch only
        if not torch.cuda.is_available():
            raise ValueError("the package's graph was built for CUDA; no GPU here")
        major, minor = torch.cuda.get_device_capability()
        if target.arch != major * 10 + minor:
            raise ValueError(f"the package's graph was built for sm_{target.arch}")
    compiler = GraphCompiler(settings, inference=True)
    art, source = fetched if fetched is not None else (compiler.cache.get(key), "local-hit")
    if art is None and settings.url:
        art, source = _remote(settings).get_artifact(key), "remote-hit"
        if art is not None:
            compiler.cache.put(art)
    if art is None:
        raise LookupError(f"artifact {key[:12]} is neither in the local cache nor on the service")
    plan = art.manifest.plan
    if (art.manifest.key != key or len(plan.inputs) != state["inputs"] or len(plan.outputs) != state["outputs"]
            or plan.symbols or art.manifest.target != target):
        raise ValueError(f"artifact {key[:12]} does not fit the package")
    runner = compiler._ready(art, source, None, _boxed(graph), t0, None, graph_nodes=state["graph_nodes"],
                             pre_aot="skipped: Dynamo package")
    fn = as_aot_runtime(runner, state["outputs"])
    fn.fxcc_plan = plan  # type: ignore[attr-defined]
    return fn


class BackendArtifact:
    """One FxccCompiled inside a package, as torch's package install expects a backend entry.

    Note: a package loaded by `_load` has its artifacts fetched and its plans built on a side
    thread while torch installs its guards (`PackageLoad`). Install takes each graph's callable
    (`after_deserialization`) before it builds the guards: that callable is made first, without a
    plan (`pending`), and given its plan (`adopt`) once the side thread built it (`PackageLoad.finish`,
    before torch.compile returns)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.loaded: FxccCompiled | None = None
        self.pending: FxccCompiled | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"data": self.data}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.data, self.loaded, self.pending = d["data"], None, None

    def artifact_key(self) -> str | None:
        """The key of the artifact this graph runs, as its state names it (None when malformed:
        `plan` says what is wrong)."""
        try:
            key = json.loads(self.data.partition(b"\n")[0]).get("artifact_key")
        except (ValueError, AttributeError):
            return None
        return key if isinstance(key, str) and _HEX64.match(key) else None

    def hold(self) -> None:
        """Make the callable install takes now; its plan comes with `adopt` (or `prepare`)."""
        head, _, rest = self.data.partition(b"\n")
        self.pending = FxccCompiled(_not_loaded, json.loads(head), LazyGraph(rest))

    def prepare(self, fetched: tuple[Artifact, str] | None = None) -> None:
        """Load the artifact's plan (`fetched`, or fetched now), so that a failure is a miss."""
        self.loaded = FxccCompiled.loaded_from(self.data, fetched, self.pending)

    def plan(self, settings: Any, fetched: tuple[Artifact, str] | None) -> Callable:
        """This graph's runnable plan, of the artifact `fetched` (or fetched now); raises when it
        cannot be loaded. Made on the package's side thread: touches nothing install reads."""
        if self.pending is None:
            self.hold()
        assert self.pending is not None
        return load_plan_for(self.pending.state, self.pending.graph, settings, fetched)

    def adopt(self, fn: Callable, settings: Any, load: PackageLoad, backend_id: str) -> FxccCompiled:
        """The installed callable runs `fn` from now on; its first call waits for the side thread's
        warm-up first (`PackageLoad.wait_ready`) and tells `load` when it returned."""
        if self.pending is None:
            self.hold()
        compiled = self.pending
        assert compiled is not None

        def first_call(*args: Any, **kwargs: Any) -> Any:
            load.wait_ready()  # the side thread's GPU work is done: nothing else uses the GPU now
            compiled.fn = fn
            try:
                return fn(*args, **kwargs)
            finally:
                load.first_call_returned(backend_id)

        compiled.settings, compiled.fn = settings, first_call
        self.loaded = compiled
        return compiled

    def after_deserialization(self) -> FxccCompiled:
        if self.loaded is None:
            if self.pending is not None:
                return self.pending
            self.prepare()
        return self.loaded  # type: ignore[return-value]


def _not_loaded(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("fxcc: a package's graph ran before its plan was loaded")


# ---------------------------------------------------------------- keys and signatures


def settings_key(settings: Any) -> str:
    """The settings that decide what compiles (the pre-AOT key's), hashed."""
    from dataclasses import fields

    from fxcc.client.pre_aot import _SETTINGS_NOT_KEYED

    keyed = {f.name: str(getattr(settings, f.name)) for f in fields(settings) if f.name not in _SETTINGS_NOT_KEYED}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()


def _code_digest(code: Any, h: Any) -> None:
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_argcount)).encode())
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            _code_digest(c, h)
        else:
            h.update(repr(c).encode())


def package_key(fn: Any, settings_digest: str) -> str:
    """A package's key: the function's qualified name, module and code; fxcc's keyed settings; the
    torch, Python and fxcc versions. Nothing machine-local: every machine of a cluster computes it."""
    import platform

    from fxcc import version
    from fxcc.client.pre_aot import _versions

    h = hashlib.sha256()
    h.update(json.dumps({"schema": SCHEMA, "qualname": getattr(fn, "__qualname__", ""),
                         "module": getattr(fn, "__module__", ""), "settings": settings_digest,
                         "python": platform.python_version(), "fxcc": version.__version__,
                         "versions": _versions()}, sort_keys=True).encode())
    _code_digest(fn.__code__, h)
    return h.hexdigest()


class PackageKeys:
    """The principal's package key pair (signs what this client saves) and the keys it accepts."""

    def __init__(self, settings: Any) -> None:
        from fxcc.compiler_core.signing import TrustedKeys, load_or_create, read_public_keys

        private = Path(settings.package_key_file or Path(settings.cache_dir) / "keys" / "package.key").expanduser()
        if private.exists():
            st = private.stat()
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise PermissionError(f"{private} must be owned by this user and readable by no one else")
        self.signer = load_or_create(private, private.with_name(private.name + ".pub"))
        keys = [self.signer.public]
        for entry in settings.package_trusted_keys:
            keys += read_public_keys(entry)
        self.trusted = TrustedKeys(keys)

    def seal(self, key: str, payload: bytes) -> bytes:
        header = {"schema": SCHEMA, "key": key, "sha256": hashlib.sha256(payload).hexdigest()}
        signed = {**header, "signature": self.signer.sign_json(header)}
        return MAGIC + json.dumps(signed, sort_keys=True).encode() + b"\n" + payload

    def open(self, key: str, data: bytes) -> bytes:
        """The payload of a sealed package for `key`; raises PermissionError when it is not signed
        by a trusted key, ValueError when it is not a package of this schema."""
        if not data.startswith(MAGIC):
            raise ValueError("not an fxcc package")
        head, _, payload = data[len(MAGIC):].partition(b"\n")
        signed = json.loads(head)
        header = {"schema": signed.get("schema"), "key": signed.get("key"), "sha256": signed.get("sha256")}
        why = self.trusted.check(header, signed.get("signature"))
        if why is not None:
            raise PermissionError(f"package refused: {why}")
        if header["schema"] != SCHEMA or header["key"] != key:
            raise ValueError("the package is for another key or schema")
        if hashlib.sha256(payload).hexdigest() != header["sha256"]:
            raise PermissionError("package refused: its bytes do not match its signed digest")
        return payload


# ---------------------------------------------------------------- the service


def _service_get(settings: Any, key: str) -> bytes | None:
    r = _remote(settings)._request("GET", f"/v1/packages/{key}",
                                   timeout=min(SERVICE_TIMEOUT_S, settings.request_timeout_s))
    if r.status_code == 404:
        return None
    r.raise_for_status()
    if len(r.content) > MAX_PACKAGE_BYTES:
        raise ValueError("the service's package is over the size bound")
    return r.content


def _service_put(settings: Any, key: str, data: bytes) -> None:
    try:
        r = _remote(settings)._request("PUT", f"/v1/packages/{key}", content=data,
                                       headers={"Content-Type": "application/octet-stream"},
                                       timeout=min(SERVICE_TIMEOUT_S, settings.request_timeout_s))
        r.raise_for_status()
        count("shared")
    except Exception as e:  # noqa: BLE001 - only an optimisation: the next machine traces
        log_once(f"put:{type(e).__name__}", "could not share a package through the service (%s)", _first_line(e))


def _settings(options: dict[str, Any] | None) -> Any:
    from fxcc.client.settings import ClientSettings

    return ClientSettings.from_env().with_options(options)


def _load(fn: Any, options: dict[str, Any] | None) -> PackageLoad | None:
    """The package of `fn` (local, else the service), verified and unpickled, its artifacts being
    fetched; None on a miss (counted)."""
    from torch._dynamo import package as pk
    from torch._dynamo.eval_frame import innermost_fn

    t0 = time.perf_counter()
    settings = _settings(options)
    if not settings.dynamo_cache:
        return None
    fn = innermost_fn(fn)
    key = package_key(fn, settings_key(settings))
    try:
        data: bytes | None = _local_path(settings, key).read_bytes()
    except FileNotFoundError:
        data = None
    if data is None and settings.url:
        try:
            data = _service_get(settings, key)
        except Exception as e:  # noqa: BLE001
            log_once(f"get:{type(e).__name__}", "no package from the service (%s)", _first_line(e))
    if data is None:
        count("misses")
        return None
    t_read = time.perf_counter()
    try:
        payload = PackageKeys(settings).open(key, data)
    except PermissionError as e:
        count("refused")
        log_once(f"refused:{str(e)[:40]}", "%s; tracing as usual", e)
        return None
    t_verify = time.perf_counter()
    entry = pickle.loads(payload)  # a pickle: code, unpickled only now that its signature verified
    t_unpickle = time.perf_counter()
    if not isinstance(entry, pk.PrecompileCacheEntry):
        raise TypeError("the package holds no Dynamo cache entry")
    entry.dynamo.check_versions()
    for inlined in entry.dynamo.source_info.inlined_sources:  # torch checks these again, raising
        module = sys.modules.get(inlined.module)
        if module is None or pk._hash_sourcelines(module, inlined.firstlineno, inlined.lastlineno) != inlined.checksum:
            count("misses")
            log_once("source-changed", "source code changed since %s was saved; tracing", inlined.module)
            return None
    for backend in entry.backends.values():
        if not isinstance(backend, BackendArtifact):
            raise TypeError("the package holds another backend's graph")
    load = PackageLoad(entry, settings, key, data, payload)
    load.times.update(t0=t0, read=t_read, verify=t_verify, unpickle=t_unpickle)
    load.start()
    return load


def _fix_main_module(entry: Any, fn: Any) -> None:
    """The compiled function's code entry under the module whose globals its code runs with.

    Note: torch records the function's `__module__`, which functools.wraps copies from the
    wrapped function: transformers' `forward`, wrapped by a decorator of transformers.utils, names
    the model's module, where its globals are not. Loaded so, its frame's global guards read the
    wrong module (they fail, and the model is traced on every warm start) and its compiled graphs
    are installed where its bytecode does not look."""
    scope = getattr(getattr(fn, "__func__", fn), "__globals__", None)
    name = scope.get("__name__") if isinstance(scope, dict) else None
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is not None and module.__dict__ is scope and entry.codes and entry.codes[0].python_module != name:
        entry.codes[0].python_module = name


def _save(package: Any) -> None:
    from torch._dynamo import package as pk

    from fxcc.client.graphs import _executor

    entry = package.cache_entry()
    _fix_main_module(entry, package._innermost_fn)
    ids = list(entry.backend_ids)
    with _state.lock:
        compiled = {bid: _state.compiled.get(bid) for bid in ids}
    if not ids or any(c is None for c in compiled.values()) or any(code.bypassed for code in entry.codes):
        count("not_saved")
        log.debug("fxcc: Dynamo package cache: not saving %s (a graph fxcc did not serve as a plain "
                  "inference graph)", getattr(package, "_innermost_fn", None))
        return
    digests = {c.state["settings"] for c in compiled.values()}  # type: ignore[union-attr]
    if len(digests) != 1:
        return
    settings = next(iter(compiled.values())).settings  # type: ignore[union-attr]
    if settings is None or not settings.dynamo_cache:
        return
    backends = {bid: BackendArtifact(FxccCompiled.serialize_compile_artifacts(c))  # type: ignore[arg-type]
                for bid, c in compiled.items()}
    payload = pickle.dumps(pk.PrecompileCacheEntry(dynamo=entry, backends=backends))
    key = package_key(package._innermost_fn, digests.pop())
    digest = hashlib.sha256(payload).hexdigest()
    with _state.lock:
        if _state.saved.get(key) == digest:
            return
        _state.saved[key] = digest
    if len(payload) > MAX_PACKAGE_BYTES:
        log_once("too-large", "a package of %d bytes is over %d; not saved", len(payload), MAX_PACKAGE_BYTES)
        return
    data = PackageKeys(settings).seal(key, payload)
    _write_local(settings, key, data)
    count("saved")
    if settings.url:
        _executor().submit(_service_put, settings, key, data)


__all__ = ["BackendArtifact", "FxccCompiled", "PackageKeys", "PackageLoad", "counters", "fetch_artifacts",
           "join_loads", "load_plan_for", "load_timings", "package_key", "settings_key", "store_fetched", "wrap"]

"""The pre-AOT cache: a warm process serves a Dynamo graph's artifact without running AOTAutograd.

A Dynamo graph whose AOTAutograd run showed the plain inference case (below) gets an entry under
FXCC_CACHE_DIR/pre_aot, keyed by what AOTAutograd's result depends on: the Dynamo graph's code,
each input's metadata, grad mode and the global state tracing reads, and the versions of torch,
fxcc's client (which holds the decompositions and the compile options) and compiler. The entry
names the artifact the graph compiled to. A later process with the same key loads that artifact
from the local cache and runs it as AOTAutograd's runtime wrapper would, skipping AOTAutograd's
tracing (a few seconds for a ResNet-50 or a GPT-2).

Note: the plain case, where AOTAutograd's runtime wrapper adds nothing but turning grad mode off
around the call and returning the outputs as a list: an inference graph (no input requires grad,
or grad mode is off) of plain tensors with static shapes; no input mutated; every output a fresh
tensor (no alias of an input or of another output, no intermediate base); no effect tokens, RNG
state, tensor subclass, duplicate inputs or synthetic bases; the aten graph's inputs are the Dynamo
graph's inputs one to one (same specs) and its outputs are Dynamo's, in order (same dtypes and
shapes); no constants in the aten graph; no autocast, no torch function or
dispatch mode, no functorch transform around the compile. The run decides this from AOTAutograd's
ViewAndMutationMeta and the graphs themselves; anything else, or anything unsure, is not stored.
Entries are written only by this client, after a local AOTAutograd run; an entry that does not
parse, or whose artifact is missing or does not fit, is a miss.

With FXCC_URL set, entries are also shared through the service, per principal (the token's name):
a local miss asks the service (GET /v1/pre-aot/{key}) and loads the artifact it names from the local
cache or the service, as any artifact is loaded; an entry stored after AOTAutograd ran is also PUT
there (`Shared`). So a new machine of the cluster skips AOTAutograd for what another one compiled.
The key holds nothing machine-local (no service URL, no cache dir), only what decides the compile.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import fx

from fxcc.client.precision import matmul_allows_tf32
from fxcc.compiler_core.artifact import atomic_write
from fxcc.compiler_core.keys import compiler_fingerprint
from fxcc.compiler_core.wire import CompileOptions

log = logging.getLogger("fxcc.pre_aot")

SCHEMA = 1
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# Settings that say how to reach the service or how long to wait: not part of what compiles.
# Nor where the artifacts are kept locally: entries are shared by machines (through the service).
_SETTINGS_NOT_KEYED = {"url", "token", "trusted_keys", "allow_unsigned", "cache_dir", "compile_timeout_s",
                       "request_timeout_s", "blocking", "precompile", "fallback", "cuda_graphs", "pre_aot_cache",
                       "dynamo_cache", "prewarm", "prewarm_threads", "package_key_file", "package_trusted_keys"}
# How long a pre-AOT look-up or PUT at the service may take (capped by request_timeout_s): a slow
# answer costs more than the AOTAutograd run it would save.
SERVICE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Entry:
    """What the pre-AOT cache holds for one key: the artifact and the graph's arity."""

    artifact_key: str
    inputs: int
    outputs: int
    graph_nodes: int


class Once:
    """The causes already logged in this process: each is logged once (the pre-AOT and the Dynamo
    package caches: a miss is normal, a broken entry worth one line)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.logged: set[str] = set()

    def first(self, cause: str) -> bool:
        """True the first time `cause` is asked for."""
        with self.lock:
            if cause in self.logged:
                return False
            self.logged.add(cause)
            return True


_once = Once()


def log_once(cause: str, message: str, *args: Any) -> None:
    """Log at INFO once per cause."""
    if _once.first(cause):
        log.info("fxcc: pre-AOT cache: " + message, *args)


# ---------------------------------------------------------------- the key


class Ineligible(Exception):
    """The graph is not one the pre-AOT cache may serve (the message says why)."""


def graph_key(gm: fx.GraphModule, example_inputs: list[Any], settings: Any) -> str:
    """The pre-AOT key of a Dynamo graph and its inputs; raises Ineligible."""
    from fxcc.client.graphs import target_for

    _check_global_state(example_inputs)
    payload = {
        "schema": SCHEMA,
        "code": gm.code,
        "graph": _graph_shape(gm),
        "inputs": _input_metas(gm, example_inputs),
        "state": _global_state(),
        "settings": {f.name: str(getattr(settings, f.name)) for f in fields(settings)
                     if f.name not in _SETTINGS_NOT_KEYED},
        "target": target_for(example_inputs, gm).model_dump(),
        "runtime": CompileOptions().runtime.model_dump(),
        "versions": _versions(),
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def _check_global_state(example_inputs: list[Any]) -> None:
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in example_inputs):
        raise Ineligible("an input requires grad (a training graph)")
    if torch._C._is_any_autocast_enabled():
        raise Ineligible("autocast is on")
    if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
        raise Ineligible("a torch function or dispatch mode is active")
    if torch._C._functorch.peek_interpreter_stack() is not None:
        raise Ineligible("inside a functorch transform")
    if getattr(torch._guards.TracingContext.try_get(), "fakify_first_call", False):
        raise Ineligible("the first call returns fake outputs")


def _global_state() -> dict[str, Any]:
    """The process state AOTAutograd's tracing reads (Dynamo guards on these too)."""
    import torch._functorch.config as functorch_config

    return {
        "grad": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        # CompileOptions.allow_tf32 (fxcc's attention kernel rounds to TF32 only where eager would)
        "tf32": matmul_allows_tf32(),
        # which attention kernel and convolution path tracing picks
        "backends": [torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
                     torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled(),
                     torch.backends.cudnn.enabled, torch.backends.cudnn.deterministic,
                     torch.backends.mkldnn.enabled],
        "functorch_config": sorted((k, repr(v)) for k, v in functorch_config.save_config_portable().items()),
        "decompositions": _decomposition_fingerprint(),
    }


def _decomposition_fingerprint() -> str:
    """Which function decomposes which op in torch's table (a user may register their own)."""
    from torch._decomp import global_decomposition_table

    h = hashlib.sha256()
    for op, fn in sorted(global_decomposition_table["post_autograd"].items(), key=lambda kv: str(kv[0])):
        h.update(f"{op}={getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')};".encode())
    return h.hexdigest()


@functools.cache
def _versions() -> dict[str, str]:
    """torch's version, fxcc's compiler and the client's own sources (decompositions, compile
    options and AOTAutograd's arguments live there: any edit invalidates every entry)."""
    client = Path(__file__).parent
    h = hashlib.sha256()
    for name in ("backend.py", "graphs.py", "capture.py", "pre_aot.py", "settings.py"):
        h.update(name.encode())
        h.update((client / name).read_bytes())
    return {"torch": torch.__version__, "torch_git": str(torch.version.git_version),
            "compiler": compiler_fingerprint(), "client": h.hexdigest()}


def _trusted_target(target: Any) -> bool:
    """A call the graph's code names unambiguously: an aten/prims op, an operator or builtin, or
    a function of torch itself (its behaviour is fixed by torch's version, which is keyed)."""
    if isinstance(target, torch._ops.HigherOrderOperator):
        return False
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return target.namespace in ("aten", "prims")
    module = getattr(target, "__module__", None) or ""
    return module in ("_operator", "operator", "builtins", "math", "torch") or module.startswith("torch.")


def _graph_shape(gm: fx.GraphModule) -> list[str]:
    """Checks the Dynamo graph's nodes; returns its outputs' metadata (also what is checked
    against the aten graph's outputs after AOTAutograd ran)."""
    if next(gm.parameters(), None) is not None or next(gm.buffers(), None) is not None:
        raise Ineligible("the graph holds parameters or buffers")
    outputs: list[str] = []
    inputs = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "call_method"):
            continue
        if n.op == "call_function":
            if not _trusted_target(n.target):
                raise Ineligible(f"call of {n.target}")
            if getattr(n.target, "__module__", "").startswith("torch.distributed"):
                # its plan binds process groups from a capture, which a pre-AOT hit skips
                raise Ineligible(f"a collective ({n.target.__name__})")
        elif n.op == "output":
            result = n.args[0]
            if not isinstance(result, (tuple, list)):
                raise Ineligible("the graph does not return a tuple")
            values = [o.meta.get("example_value") if isinstance(o, fx.Node) else None for o in result]
            outputs = [_tensor_meta(v, "an output") for v in values]
            if _aliased(values, inputs):
                raise Ineligible("an output aliases an input or another output")
        else:
            raise Ineligible(f"a {n.op} node")
    return outputs


def _aliased(outputs: list[Any], inputs: list[Any]) -> bool:
    """Whether an output shares memory with another output or an input (fake tensors keep
    their real counterparts' storage sharing). AOTAutograd calls a view of an intermediate that
    is also returned "non_alias" in an inference graph; fxcc does not serve those either."""
    def storage(t: Any) -> int:
        return t.untyped_storage()._cdata

    seen = {storage(t) for t in inputs if isinstance(t, torch.Tensor)}
    for t in outputs:
        s = storage(t)
        if s in seen:
            return True
        seen.add(s)
    return False


def _tensor_meta(t: Any, what: str) -> str:
    if not isinstance(t, torch.Tensor):
        raise Ineligible(f"{what} is a {type(t).__name__}, not a tensor")
    if t.layout != torch.strided:
        raise Ineligible(f"{what} is a {t.layout} tensor")
    values = (*t.shape, *t.stride(), t.storage_offset())
    if any(isinstance(v, torch.SymInt) for v in values):
        raise Ineligible(f"{what} has symbolic sizes")
    return (f"{t.dtype}|{t.device}|{tuple(t.shape)}|{tuple(t.stride())}|{t.storage_offset()}|"
            f"{t.is_conj()}|{t.is_neg()}")


def _input_metas(gm: fx.GraphModule, example_inputs: list[Any]) -> list[str]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise Ineligible("placeholders and inputs differ in number")
    metas: list[str] = []
    storages: dict[int, int] = {}
    for i, (n, x) in enumerate(zip(placeholders, example_inputs)):
        if type(x) not in (torch.Tensor, torch.nn.Parameter):
            raise Ineligible(f"input {i} is a {type(x).__name__}")
        fake = n.meta.get("example_value")
        meta = _tensor_meta(fake, f"input {i}")
        if _tensor_meta(x, f"input {i}") != meta:
            raise Ineligible(f"input {i} differs from Dynamo's example value")
        # Inputs sharing memory: which earlier input shares input i's storage, if any.
        shares = storages.setdefault(x.untyped_storage()._cdata, i)
        metas.append(f"{meta}|{type(x).__name__}|{x.requires_grad}|{x.is_leaf}|{shares}")
    return metas


# ---------------------------------------------------------------- the store


class Store:
    """Entries on local disk, one small JSON file per key, written atomically."""

    def __init__(self, cache_dir: Path) -> None:
        self.root = Path(cache_dir) / "pre_aot"

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, key: str) -> Entry | None:
        """The entry for `key`; None when there is none or it does not parse (logged once)."""
        try:
            raw = self.path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            log_once(f"read:{type(e).__name__}", "cannot read %s: %s", self.path(key), e)
            return None
        try:
            return entry_from(json.loads(raw), key)
        except (ValueError, TypeError, KeyError) as e:  # a torn, truncated or foreign file
            log_once("corrupt", "ignoring the unreadable entry %s (%s)", self.path(key), e)
            return None

    def put(self, key: str, entry: Entry) -> None:
        try:
            atomic_write(self.path(key), json.dumps(entry_json(key, entry)).encode())
        except OSError as e:  # a read-only or full disk: only an optimisation is lost
            log_once(f"write:{type(e).__name__}", "cannot write %s: %s", self.root, e)


def entry_json(key: str, entry: Entry) -> dict[str, Any]:
    """An entry as stored on disk and as the service answers it."""
    return {"schema": SCHEMA, "key": key, "artifact_key": entry.artifact_key, "inputs": entry.inputs,
            "outputs": entry.outputs, "graph_nodes": entry.graph_nodes}


def entry_from(d: Any, key: str) -> Entry:
    """The Entry that `d` (entry_json's shape) holds for `key`; raises ValueError, TypeError or KeyError."""
    entry = Entry(artifact_key=d["artifact_key"], inputs=d["inputs"], outputs=d["outputs"],
                  graph_nodes=d["graph_nodes"])
    if (d["schema"] != SCHEMA or d["key"] != key or not isinstance(entry.artifact_key, str)
            or not _HEX64.match(entry.artifact_key)
            or not all(type(v) is int and v >= 0 for v in (entry.inputs, entry.outputs, entry.graph_nodes))):
        raise ValueError("fields out of range")
    return entry


class Shared(Store):
    """The local store, backed by the service's entries of this client's principal (FXCC_URL).

    `serve` answers a local miss from the service: its entry, and the artifact from the local cache
    or the service (verified, and signed by a trusted key, as every artifact from a service is).
    `put` (after AOTAutograd ran) writes the entry locally, then PUTs it to the service. Both wait
    at most SERVICE_TIMEOUT_S for the service; whatever goes wrong there is a miss, logged once.
    """

    def __init__(self, cache_dir: Path, settings: Any) -> None:
        super().__init__(cache_dir)
        self.settings = settings
        self.timeout_s = min(SERVICE_TIMEOUT_S, settings.request_timeout_s)

    def _remote(self, timeout_s: float) -> Any:
        from fxcc.client.remote import RemoteService

        return RemoteService.for_settings(self.settings, timeout_s)

    def fetch(self, key: str) -> Entry | None:
        """The service's entry for `key`; None when it has none, or on any error."""
        try:
            remote = self._remote(self.timeout_s)
            try:
                found = remote.get_pre_aot(key)
            finally:
                remote.close()
            return None if found is None else entry_from(found, key)
        except Exception as e:  # noqa: BLE001 - only an optimisation: AOTAutograd runs
            log_once(f"service-get:{type(e).__name__}", "no entry from the service (%s: %s)",
                     type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            return None

    def put(self, key: str, entry: Entry) -> None:
        super().put(key, entry)
        try:
            remote = self._remote(self.timeout_s)
            try:
                stored = remote.put_pre_aot(key, {k: v for k, v in entry_json(key, entry).items() if k != "key"})
            finally:
                remote.close()
            if not stored:
                log.debug("fxcc: pre-AOT cache: the service does not hold artifact %s; entry not shared",
                          entry.artifact_key[:12])
        except Exception as e:  # noqa: BLE001 - only an optimisation: the next machine runs AOTAutograd
            log_once(f"service-put:{type(e).__name__}", "could not share an entry through the service (%s: %s)",
                     type(e).__name__, str(e).splitlines()[0] if str(e) else "")

    def serve(self, key: str, gm: fx.GraphModule, example_inputs: list[Any], compiler: Any,
              t0: float) -> Callable | None:
        """The callable for a hit of the service's entry (also written locally then); None for a miss."""
        entry = self.fetch(key)
        if entry is None:
            return None
        art, source = compiler.cache.get(entry.artifact_key), "local-hit"
        if art is None:
            art, source = self._artifact(entry.artifact_key), "remote-hit"
            if art is None:
                return None
            compiler.cache.put(art)
        served = serve(entry, gm, example_inputs, compiler, t0, art=art, source=source,
                       how="skipped: pre-AOT cache hit from the service")
        if served is not None:
            super().put(key, entry)  # the next process here needs no service
            self.served_entry = entry
        return served

    def _artifact(self, artifact_key: str) -> Any:
        """The artifact from the service (as GraphCompiler fetches it); None when gone or on any error."""
        try:
            remote = self._remote(self.settings.request_timeout_s)
            try:
                art = remote.get_artifact(artifact_key)
            finally:
                remote.close()
        except Exception as e:  # noqa: BLE001 - only an optimisation: AOTAutograd runs
            log_once(f"service-artifact:{type(e).__name__}", "no artifact from the service for an entry (%s: %s)",
                     type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            return None
        if art is None:
            log_once("service-no-artifact", "the artifact %s of the service's entry is gone", artifact_key[:12])
        return art


# ---------------------------------------------------------------- after AOTAutograd: record


class Recorder:
    """Watches one Dynamo graph's AOTAutograd run and stores an entry if it was the plain case.

    `inference_compiler` wraps fxcc's inference compiler (it sees the aten graph and AOTAutograd's
    metadata); `ready` is the compiler's on_ready hook (it sees the artifact); `store` runs once
    AOTAutograd returned. Whatever does not fit leaves `why_not` set and nothing is stored.
    """

    def __init__(self, key: str, gm: fx.GraphModule, example_inputs: list[Any], store: Store) -> None:
        from fxcc.client.capture import tensor_spec

        self.key = key
        self.store_ = store
        self.inputs = [tensor_spec(x) for x in example_inputs]
        self.outputs = _graph_shape(gm)
        self.why_not: str | None = "AOTAutograd did not compile an inference graph"
        self.calls = 0
        self.entry: Entry | None = None
        self.event: Any = None
        self.compiled: Callable | None = None  # what fxcc's inference compiler returned

    def inference_compiler(self, inner: Callable) -> Callable:
        def compile_inference(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable:
            self.calls += 1
            try:
                self.why_not = _not_plain(gm, example_inputs, self.outputs)
            except Exception as e:  # noqa: BLE001 - only an optimisation
                self.why_not = f"check failed: {type(e).__name__}: {e}"
            self.compiled = inner(gm, example_inputs)
            return self.compiled
        return compile_inference

    def ready(self, event: Any, artifact: Any, capture: Any, request: Any) -> None:
        """GraphCompiler's on_ready hook: the artifact the aten graph was served."""
        self.event = event
        if self.why_not is not None:
            return
        if capture is None or request is None:
            self.why_not = "no capture"
        elif capture.constants or capture.spec.symbols:
            self.why_not = "the aten graph has constants or size symbols"
        elif [p.spec for p in capture.spec.placeholders] != self.inputs:
            self.why_not = "the aten graph's inputs are not the Dynamo graph's"
        elif len(capture.spec.outputs) != len(self.outputs):
            self.why_not = "the aten graph's outputs are not the Dynamo graph's"
        elif event.source not in ("local-hit", "remote-hit", "remote-compiled", "compiled-in-process"):
            self.why_not = f"the artifact came as {event.source}"
        else:
            self.entry = Entry(artifact_key=event.key, inputs=len(self.inputs), outputs=len(self.outputs),
                               graph_nodes=event.graph_nodes)

    def plain(self) -> bool:
        """Whether AOTAutograd's run showed the plain case (its runtime wrapper adds nothing)."""
        return self.why_not is None and self.entry is not None

    def store(self) -> None:
        """After AOTAutograd returned: write the entry if everything showed the plain case."""
        if self.calls != 1 and self.why_not is None:
            self.why_not = f"the inference compiler ran {self.calls} times"
        if self.why_not is None and self.entry is not None:
            self.store_.put(self.key, self.entry)
            status = "ran; stored for the next process"
        else:
            status = f"ran; not cached: {self.why_not}"
            log.debug("fxcc: pre-AOT cache: not storing %s: %s", self.key[:12], self.why_not)
        if self.event is not None:
            self.event.pre_aot = status


def _not_plain(gm: fx.GraphModule, example_inputs: list[Any], dynamo_outputs: list[str]) -> str | None:
    """Why AOTAutograd's inference graph is not the plain case; None when it is."""
    from torch._functorch._aot_autograd.schemas import MutationType, OutputType

    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None:
        return "no AOTAutograd metadata"
    # Note: a field an older torch lacks stands for a feature it does not have (getattr defaults).
    if any(i.mutates_data or i.mutates_metadata or i.mutates_storage_metadata
           or getattr(i, "mutation_inductor_storage_resize", False)
           or getattr(i, "mutation_type", MutationType.NOT_MUTATED) != MutationType.NOT_MUTATED
           for i in meta.input_info):
        return "an input is mutated"
    if meta.mutated_inp_runtime_indices or meta.num_mutated_inp_runtime_indices:
        return "an input is mutated"
    if any(o.output_type != OutputType.non_alias for o in meta.output_info) or meta.num_outputs_aliased:
        return "an output aliases an input or another output"
    if meta.num_intermediate_bases or meta.dynamic_outputs or meta.grad_enabled_mutation is not None:
        return "outputs need AOTAutograd's epilogue"
    # Note: random ops themselves are fine. Only functionalized RNG (seed and offset passed in and
    # out by AOTAutograd's wrappers) differs from running the plan's ops, which draw from torch's
    # generator exactly as the plan does when AOTAutograd ran.
    if (meta.tokens or meta.is_rng_op_functionalized or meta.num_outputs_rng_offset
            or getattr(meta, "num_graphsafe_rng_states", 0)):
        return "effect tokens or functionalized RNG state"
    if getattr(meta, "act_input_indices", None) or any(
            not isinstance(m, int) and type(m).__name__ != "PlainTensorMeta" for m in meta.subclass_inp_meta):
        return "a tensor subclass"
    if getattr(meta, "is_train", False):
        return "a training graph"
    if len(meta.input_info) != len(example_inputs) or meta.num_outputs != len(dynamo_outputs):
        return "AOTAutograd changed the graph's arity (duplicate inputs or synthetic bases)"
    aten_outputs: list[str] = []
    outs: list[Any] = []
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            return "the aten graph holds constants"
        if n.op == "output":
            result = n.args[0]
            outs = result if isinstance(result, (tuple, list)) else [result]
            try:
                aten_outputs = [_tensor_meta(o.meta.get("val") if isinstance(o, fx.Node) else o, "an output")
                                for o in outs]
            except Ineligible as e:
                return str(e)
    # dtype, device and sizes in order (strides may differ: the aten graph's are what fxcc serves)
    if [m.split("|")[:3] for m in aten_outputs] != [m.split("|")[:3] for m in dynamo_outputs]:
        return "the aten graph's outputs are not the Dynamo graph's, in order"
    placeholders = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    if len({id(o) for o in outs}) != len(outs) or _aliased([o.meta.get("val") for o in outs], placeholders):
        return "an output aliases an input or another output"
    return None


# ---------------------------------------------------------------- on a hit: serve


def serve(entry: Entry, gm: fx.GraphModule, example_inputs: list[Any], compiler: Any, t0: float, *,
          art: Any = None, source: str = "local-hit", how: str = "skipped: pre-AOT cache hit") -> Callable | None:
    """The callable Dynamo gets for a hit: the cached artifact (`art`, else the local cache's) run as
    AOTAutograd's runtime wrapper runs an inference graph in the plain case; None (a miss) when the
    artifact is gone or does not fit the entry. `source` and `how` go into the CompileEvent."""
    from fxcc.client.graphs import _boxed, _executor, target_for

    art = art if art is not None else compiler.cache.get(entry.artifact_key)
    if art is None:
        log_once("no-artifact", "the artifact %s of an entry is not in the local cache", entry.artifact_key[:12])
        return None
    plan = art.manifest.plan
    if (art.manifest.key != entry.artifact_key or len(plan.inputs) != entry.inputs
            or len(example_inputs) != entry.inputs or len(plan.outputs) != entry.outputs
            or plan.symbols or art.manifest.target != target_for(example_inputs, gm)):
        log_once("mismatch", "the artifact %s does not fit its entry", entry.artifact_key[:12])
        return None
    settings = compiler.settings
    if settings.url and not art.manifest.tuned and art.manifest.target.kind == "cuda":
        _executor().submit(compiler.refresh_tuned, entry.artifact_key)
    # Eager fallback, should the plan fail when it runs: Dynamo's own graph (torch-level code).
    runner = compiler._ready(art, source, None, _boxed(gm), t0, None, graph_nodes=entry.graph_nodes, pre_aot=how)
    return as_aot_runtime(runner, entry.outputs)


def as_aot_runtime(runner: Callable[[list[Any]], Any], outputs: int) -> Callable:
    """`runner` called as AOTAutograd's runtime wrapper calls an inference graph's compiled
    function when nothing is mutated or aliased (torch 2.11–2.13, _create_runtime_wrapper with
    trace_joint=False): positional inputs in a list, grad mode off around the call (restored even
    on error), the outputs as a list of the expected length; Dynamo never traces into it."""

    def forward(*args: Any) -> list[Any]:
        grad_enabled = torch.is_grad_enabled()
        try:
            if grad_enabled:
                torch._C._set_grad_enabled(False)
            out = runner(list(args))
        finally:
            if grad_enabled:
                torch._C._set_grad_enabled(True)
        outs = list(out) if isinstance(out, tuple) else out if isinstance(out, list) else [out]
        if len(outs) != outputs:
            raise AssertionError(f"expected {outputs} outputs, got {len(outs)}")
        return outs

    return torch._dynamo.disable(forward, reason="do not trace an fxcc compiled graph")


__all__ = ["Entry", "Ineligible", "Recorder", "Shared", "Store", "as_aot_runtime", "entry_from", "entry_json",
           "graph_key", "log_once", "serve"]

"""Torch's caching precompile, turned to fxcc's packages: only fxcc's torch.compile calls get one.

client/dynamo_cache.py is the package (what it holds, its key and signature, where it is stored,
loading and saving it); this module is where torch's Dynamo is hooked to use it, one function per
hook, each with the torch issue it works around (README, "Skipping Dynamo on a warm start"):
- `_patch_optimize`: a package for fxcc's torch.compile calls, loaded when the function is wrapped;
- `_patch_convert`, `_patch_guards`: caching precompile on only while such a frame compiles; its
  guards built once, whole, for this process, and serialized less the identity guards (carried in
  fxcc's form) for the package;
- `_patch_pickler`, `_patch_globals`: what a decorated `forward`'s frame needs restored;
- `_patch_install`, `_patch_guard_loading`, `_patch_tensor_unpickling`: install safe to fail and
  to trace after, identity guards back on loaded frames, guards built once with one FakeTensorMode;
- `_patch_source_info`: each inlined function's source recorded once, not once per inlining.
Every hook checks that the torch piece it wraps exists; where one is missing the cache is off, said
once (`enable`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import itertools
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fxcc.client.dynamo_cache import _first_line, _load, _save, _settings, _state, count, log, log_once

# ---------------------------------------------------------------- torch's DynamoCache, replaced


def _fxcc_backend_options(backend: Any) -> tuple[bool, dict[str, Any] | None]:
    """(whether `backend`, as torch.compile hands it to Dynamo's `_optimize`, is fxcc's, its options)."""
    from fxcc.client.settings import compile_options

    is_fxcc, options = False, None
    for _ in range(8):  # _TorchCompileWrapper -> WrapBackendDebug -> ... -> fxcc_backend
        if backend is None:
            break
        is_fxcc = is_fxcc or getattr(backend, "_is_fxcc_backend", False) is True or backend == "fxcc" \
            or getattr(backend, "compiler_name", None) == "fxcc"
        kwargs = getattr(backend, "kwargs", None)
        if options is None and isinstance(kwargs, dict):
            options = compile_options(kwargs)
        backend = getattr(backend, "_torchdynamo_orig_backend", None) or getattr(backend, "compiler_fn", None)
    return is_fxcc, options if is_fxcc else None


def _store_class() -> type:
    from torch._dynamo import package as pk

    class PackageStore(pk.DiskDynamoCache):  # type: ignore[misc, valid-type]
        """torch's DynamoCache for this process: saves fxcc's packages, signed, local and shared.

        fxcc's packages are loaded by the torch.compile that made them (`_load_into`), before torch
        would ask this store; what torch asks it to load is another backend's: never a hit."""

        def load(self, fn: Callable[..., Any]) -> Any:
            return None

        def record_package(self, package: Any) -> None:
            if not getattr(package, "_fxcc", False):
                return  # another backend's package (torch's caching precompile turned on by the user)
            try:
                _save(package)
            except Exception as e:  # noqa: BLE001 - only the next process's optimisation
                count("errors")
                log_once(f"save:{type(e).__name__}", "a package was not saved (%s)", _first_line(e))

        def save(self, package: Any) -> None:
            self.record_package(package)

    return PackageStore


@contextlib.contextmanager
def _quick_load() -> Iterator[None]:
    """What a package's load does not need, off while it runs (restored after, whatever happens).

    Note: loading a package unpickles its guard states and builds thousands of guards (ResNet-50:
    3250), allocating enough for the cyclic garbage collector to run collections over the whole
    heap of a process that imported transformers (a profile of GPT-2's warm start on the H200 put
    0.25 s of 0.77 s in trivial allocations, which is where collections land); what the load
    allocates is kept, so collecting during it finds nothing to free. Each guard's description
    names the user's source line, shortened against torch's folder: the same few files, so
    shortened once each."""
    from torch.utils import _traceback

    was_enabled = gc.isenabled()
    shorten = _traceback.shorten_filename
    gc.disable()
    _traceback.shorten_filename = functools.lru_cache(maxsize=4096)(shorten)
    try:
        yield
    finally:
        _traceback.shorten_filename = shorten
        if was_enabled:
            gc.enable()


def _load_into(package: Any, fn: Any) -> None:
    """Initialize the fxcc package of a torch.compile that wraps `fn`: from a saved package (its
    frames installed, so the first call skips tracing) or empty (tracing fills it)."""
    with _quick_load():
        _load_package_into(package, fn)


def _load_package_into(package: Any, fn: Any) -> None:
    import torch._dynamo.config as dynamo_config

    fn_key = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        result = _load(fn_key, package._fxcc_options)
    except Exception as e:  # noqa: BLE001 - a miss: Dynamo traces
        count("errors")
        log_once(f"load:{type(e).__name__}", "tracing as usual (%s)", _first_line(e))
        result = None
    if result is not None:
        try:
            package.initialize(fn_key, result.dynamo, ignore_inlined_sources=False)
            # The saved guards were filtered when they were made: built once here, unfiltered.
            with dynamo_config.patch(caching_precompile=False):
                package.install(result.backends)
        except RuntimeError:  # said once by the patched install
            result.cancel()
            package._initialized, package._codes = False, {}  # what a failed install left, dropped
        except BaseException:
            result.cancel()
            raise
        else:
            try:
                result.finish()  # the plans the side thread built meanwhile
                return
            except Exception as e:  # noqa: BLE001 - a miss: uninstalled, Dynamo traces
                count("errors")
                log_once(f"load:{type(e).__name__}", "tracing as usual (%s)", _first_line(e))
                with contextlib.suppress(Exception):  # the trace that follows installs anew
                    package.uninstall()
                package._initialized, package._codes = False, {}
    package.initialize(fn_key, None, ignore_inlined_sources=False)


# ---------------------------------------------------------------- turning it on


class _DroppedGuardFilter(logging.Filter):
    """torch warns of every identity guard a package leaves out; fxcc's packages carry them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is dropped with caching_precompile" not in record.getMessage()  # kept: dynamo_identity


def _patch_install(pk: Any) -> None:
    """Package install, made safe to fail and to trace after (torch 2.11–2.13).

    Note: a package's guards install `__builtins_dict___<n>` (and other unique names) into the
    module's globals; Dynamo's own counter starts at 0 in a new process, so a trace after a
    failing guard would pick a name that exists and assert. The counter is moved past every such
    name. Any failure of install becomes the RuntimeError torch's caller turns into a fresh trace."""
    from torch._dynamo import bytecode_transformation as bt

    original = pk.CompilePackage.install
    if getattr(original, "_fxcc", False):
        return

    def move_counter(package: Any) -> None:
        top = -1
        for entry in package._codes.values():
            module = sys.modules.get(entry.python_module)
            for name in list(getattr(module, "__dict__", {})):
                m = re.match(r"^__\w*?_(\d+)$", name)
                if m:
                    top = max(top, int(m.group(1)))
        current = next(bt._unique_id_counter)
        bt._unique_id_counter = itertools.count(max(current, top + 1))

    def install(self: Any, backends: Any) -> None:
        try:
            original(self, backends)
        except Exception as e:
            count("errors")
            log_once(f"install:{type(e).__name__}", "a package did not install (%s); tracing", _first_line(e))
            try:
                self.uninstall()
            except Exception:  # noqa: BLE001, S110 - the trace that follows does not need it
                pass
            # what uninstall leaves: the builtins dict torch's install puts into the module's globals
            # itself (`__builtins_dict___0`), which the trace that follows would pick again
            with contextlib.suppress(Exception):
                move_counter(self)
            raise RuntimeError(f"fxcc: package install failed: {e}") from e
        move_counter(self)

    install._fxcc = True  # type: ignore[attr-defined]
    pk.CompilePackage.install = install
    _patch_guard_loading(pk)


def _patch_guard_loading(pk: Any) -> None:
    """A package's frames get back the identity guards it carries (client/dynamo_identity.py):
    install reads each guarded entry's guards state, then builds its guard manager."""
    from fxcc.client import dynamo_identity

    load_state, load_manager = pk.load_guards_state, pk.load_guard_manager
    if getattr(load_state, "_fxcc", False):
        return
    pending = threading.local()

    def load_guards_state(guards_state: bytes) -> Any:
        pending.identities, rest = dynamo_identity.split(guards_state)
        pending.loading, pending.fake_mode, pending.converter = True, None, None
        try:
            return load_state(rest)
        finally:
            pending.loading, pending.fake_mode, pending.converter = False, None, None

    def load_guard_manager(guards_state: Any, target_code: Any, runtime_global_scope: Any) -> Any:
        manager = load_manager(guards_state, target_code, runtime_global_scope)
        identities, pending.identities = getattr(pending, "identities", []), []
        if identities:
            dynamo_identity.add_guard(manager, identities, target_code, runtime_global_scope)
        return manager

    load_guards_state._fxcc = True  # type: ignore[attr-defined]
    pk.load_guards_state, pk.load_guard_manager = load_guards_state, load_guard_manager
    _patch_tensor_unpickling(pending)


def _patch_tensor_unpickling(pending: Any) -> None:
    """A guard state's tensors unpickled under one FakeTensorMode per state, not one each.

    Note: torch makes a FakeTensorMode and a FakeTensorConverter for every tensor of a guard state
    (each mode records a stack trace, each converter makes weak dictionaries): 268 of them for
    ResNet-50's parameters and buffers, 0.08 s of a warm start on the H200. The tensors only carry
    metadata for the guards to be rebuilt from, which one mode and one converter serve."""
    from torch._dynamo import guards
    from torch._subclasses import fake_tensor

    cls = getattr(guards, "GuardsStatePickler", None)
    original = getattr(cls, "_unpickle_tensor", None)
    if original is None or getattr(original, "_fxcc", False) or not hasattr(fake_tensor, "FakeTensorConverter"):
        return

    def _unpickle_tensor(klass: Any, meta_tensor: Any, device: Any, pytype: Any, dispatch_keys_raw: int,
                         grad: Any) -> Any:
        if not getattr(pending, "loading", False):  # not inside fxcc's load: torch's own way
            return original.__func__(klass, meta_tensor, device, pytype, dispatch_keys_raw, grad)
        if pending.fake_mode is None:
            pending.fake_mode, pending.converter = fake_tensor.FakeTensorMode(), fake_tensor.FakeTensorConverter()
        tensor = pending.converter.from_meta_and_device(
            pending.fake_mode, meta_tensor, device, pytype, torch._C.DispatchKeySet.from_raw_repr(dispatch_keys_raw))
        tensor.grad = grad
        return tensor

    _unpickle_tensor._fxcc = True  # type: ignore[attr-defined]
    cls._unpickle_tensor = classmethod(_unpickle_tensor)


def _patch_optimize(ef: Any, pk: Any) -> None:
    """Give every torch.compile with fxcc's backend (and only those) a package of its own.

    Note: torch's caching precompile is one process-wide flag (torch._dynamo.config.caching_precompile)
    that gives every torch.compile a package and drops identity guards from every frame's guards,
    whatever its backend. fxcc leaves the flag off: its torch.compile calls get a package here (a
    `package` torch's `_optimize` takes as it is), that torch.compile's context loads it
    (`_load_into`, when the function is wrapped), and the flag is on only while a frame of such a
    package compiles (`_patch_convert`). Other backends' frames keep every guard."""
    original = ef._optimize
    if getattr(original, "_fxcc", False):
        return
    contexts: dict[type, type] = {}

    def context_class(base: type) -> type:
        if base not in contexts:
            def __call__(self: Any, fn: Any) -> Any:
                package = getattr(self, "_package", None)
                if package is not None and getattr(package, "_fxcc", False) and not package.is_initialized():
                    _load_into(package, fn)
                return base.__call__(self, fn)

            contexts[base] = type(base.__name__, (base,), {"__call__": __call__, "__module__": base.__module__})
        return contexts[base]

    def _optimize(rebuild_ctx: Any, *args: Any, **kwargs: Any) -> Any:
        backend = args[0] if args else kwargs.get("backend", "inductor")
        try:
            is_fxcc, options = _fxcc_backend_options(backend)
            on = is_fxcc and kwargs.get("package") is None and _settings(options).dynamo_cache
        except Exception:  # noqa: BLE001 - torch.compile goes on without a package
            on = False
        if not on:
            return original(rebuild_ctx, *args, **kwargs)
        package = pk.CompilePackage(fn=None, dynamo=None, ignore_inlined_sources=False)
        package._fxcc, package._fxcc_options = True, options
        ctx = original(rebuild_ctx, *args, **{**kwargs, "package": package})
        if getattr(ctx, "_package", None) is package:
            ctx.__class__ = context_class(type(ctx))
        return ctx

    _optimize._fxcc = True  # type: ignore[attr-defined]
    ef._optimize = _optimize


def _patch_convert(cf: Any) -> None:
    """Torch's caching precompile on while a frame of an fxcc package compiles (its guards made
    serializable, the package recorded after the frame), under Dynamo's compile lock so that no
    other thread's frame compiles meanwhile; the frame's guards built once (`_patch_guards`)."""
    import torch._dynamo.config as dynamo_config

    cls = cf.ConvertFrameAssert
    original = cls.__call__
    if getattr(original, "_fxcc", False):
        return

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        package = getattr(self, "_package", None)
        if package is None or not getattr(package, "_fxcc", False) or dynamo_config.caching_precompile:
            return original(self, *args, **kwargs)
        code = getattr(args[0] if args else kwargs.get("frame"), "f_code", None)
        if code is not None and not _nameable(package, code):
            # torch's package raises (PackageError) for a frame it cannot name: the frame
            # compiles outside the package, as without one; the other frames stay in it.
            log_once("unnameable", "a frame (%s) cannot be named in a package; it compiles outside it",
                     getattr(code, "co_qualname", code.co_name))
            with cf.compile_lock:
                self._package = None
                try:
                    return original(self, *args, **kwargs)
                finally:
                    self._package = package
        with cf.compile_lock, dynamo_config.patch(caching_precompile=True):
            _state.compiling.active = True
            try:
                return original(self, *args, **kwargs)
            finally:
                _state.compiling.active = False

    __call__._fxcc = True  # type: ignore[attr-defined]
    cls.__call__ = __call__
    _patch_guards(cf)


def _nameable(package: Any, code: Any) -> bool:
    """Whether torch's package can name `code` by module and qualified name (a property's getter
    that Dynamo compiles as a frame of its own, after a graph break in it, it cannot)."""
    if code in getattr(package, "_codes", {}):
        return True
    from torch._dynamo import package as pk

    find = getattr(pk, "_get_code_source", None)
    if find is None:
        return True  # a torch without it names codes its own way: let it
    try:
        find(code)
    except Exception:  # noqa: BLE001 - PackageError, or whatever the lookup met
        return False
    return inspect.getmodule(code) is not None


def _patch_guards(cf: Any) -> None:
    """In the process that traces, an fxcc frame keeps every guard; only its package leaves out
    the identity guards; the frame's guards are built once, as without a package.

    Note: with caching precompile on, torch builds a frame's guards twice for a package (whole, to
    filter them; filtered, to install and serialize), and this process needs them whole (its frame
    then notices a reassigned global function as tracing does), which was a third build: at 12
    layers of GPT-2, 1700 guards, most of what recording a package added to a cold first call.
    Now the guards are built once, whole, with caching precompile off for the build and saving on
    (`_PackagedGuards`), and what is serialized is that builder's guards less the identity ones:
    the same filter over the same builder's values that torch's first build gave it. Where this
    torch lacks the pieces, or that build fails, the guards are built as before (`_guards_twice`)."""
    import torch._dynamo.config as dynamo_config
    from torch._dynamo import guards as torch_guards

    original = cf.CheckFunctionManager
    if getattr(original, "_fxcc", False):
        return
    signature = inspect.signature(original)
    packaged = _packaged_guards_class(original, torch_guards)

    def check_function_manager(*args: Any, **kwargs: Any) -> Any:
        if not (kwargs.get("save_guards") and getattr(_state.compiling, "active", False)
                and dynamo_config.caching_precompile):
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs).arguments
        if packaged is None:
            return _guards_twice(original, bound)
        try:
            with dynamo_config.patch(caching_precompile=False):
                manager = packaged(**bound)
        except Exception as e:  # noqa: BLE001 - what the one build met, the builds apart may not
            log_once(f"guards-once:{type(e).__name__}", "a frame's guards are built apart (%s)", _first_line(e))
            return _guards_twice(original, bound)
        manager.guards_state = _with_identities(manager.guards_state, getattr(manager, "_fxcc_identities", []))
        return manager

    check_function_manager._fxcc = True  # type: ignore[attr-defined]
    cf.CheckFunctionManager = check_function_manager
    _patch_pickler()
    _patch_globals()


def _with_identities(state: bytes | None, identities: list[Any]) -> bytes:
    """What torch keeps as a packaged frame's guards state: its own, the identity guards fxcc
    carries before it.

    Note: a frame kept out of the package still hands torch a guards state, which it then ignores;
    so does one whose guards torch could not serialize itself (it bypassed the package, left the
    state None and would then assert on it: a CLASS_MATCH guard, in transformers' T5)."""
    from fxcc.client import dynamo_identity

    return b"" if state is None else dynamo_identity.attach(state, identities)  # type: ignore[return-value]


def _packaged_guards_class(base: type, torch_guards: Any) -> type | None:
    """torch's CheckFunctionManager that builds a frame's guards whole and serializes them less the
    identity guards (recorded for fxcc's package); None when this torch lacks what it overrides
    (`serialize_guards(builder, sorted_guards, output_graph)`, `make_guard_filter_entry`: torch
    2.11–2.13 have both)."""
    from fxcc.client import dynamo_identity

    entry_of = getattr(torch_guards, "make_guard_filter_entry", None)
    serialize = getattr(base, "serialize_guards", None)
    if not isinstance(base, type) or entry_of is None or serialize is None:
        return None
    if list(inspect.signature(serialize).parameters) != ["self", "builder", "sorted_guards", "output_graph"]:
        return None

    class _PackagedGuards(base):  # type: ignore[misc, valid-type]
        """Note: torch's __init__ builds the guards it was given (whole: caching precompile is off)
        and installs them; then, saving, hands this the builder and the guards to serialize."""

        def serialize_guards(self, builder: Any, sorted_guards: list[Any], output_graph: Any) -> bytes | None:
            self._fxcc_identities = []
            try:
                dropped = [dynamo_identity.is_identity_guard(guard) for guard in sorted_guards]
                # only the dropped guards' values are described (a filter entry reads its guard's value)
                dynamo_identity.observe([entry_of(g, builder) for g, d in zip(sorted_guards, dropped) if d], None,
                                        self._fxcc_identities)
                kept = [g for g, d in zip(sorted_guards, dropped) if not d]
                return super().serialize_guards(builder, kept, output_graph)
            except Exception as e:  # noqa: BLE001 - torch lets more than PackageError out (an op it cannot pickle)
                log_once(f"guards:{type(e).__name__}", "a frame's guards cannot be saved (%s); it stays out of "
                         "the package", _first_line(e))
                _bypass_quietly(output_graph, f"fxcc: guards not serializable: {_first_line(e)}")
                return None

    _PackagedGuards.__name__ = _PackagedGuards.__qualname__ = base.__name__
    _PackagedGuards.__module__ = base.__module__
    return _PackagedGuards


class _NoBypassWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Detected a package bypass")


def _bypass_quietly(output_graph: Any, reason: str) -> None:
    """Keep a frame out of torch's package without torch's warning for it: fxcc has said so once
    (log_once, at INFO), where torch warns for every frame and compile (transformers' LLaMA: each
    compile printed "Detected a package bypass"); the frame compiles as it would without the cache."""
    import torch._dynamo.config as dynamo_config

    torch_log = logging.getLogger("torch._dynamo.output_graph")
    quiet = _NoBypassWarning()
    torch_log.addFilter(quiet)
    try:
        if getattr(dynamo_config, "strict_precompile", False):
            output_graph.bypass_package(reason)  # torch raises PackageError: strict mode asked for it
        else:
            with contextlib.suppress(Exception):  # nothing to keep out
                output_graph.bypass_package(reason)
    finally:
        torch_log.removeFilter(quiet)


def _guards_twice(original: Any, bound: dict[str, Any]) -> Any:
    """A packaged frame's guards built by torch's caching precompile (filtered, serialized), then
    whole for this process (caching precompile off, nothing serialized)."""
    import torch._dynamo.config as dynamo_config

    from fxcc.client import dynamo_identity

    user_filter = bound.get("guard_filter_fn")
    identities: list[Any] = []
    try:
        saved = original(**{**bound, "guard_filter_fn": lambda entries: dynamo_identity.observe(
            entries, user_filter, identities)})
    except Exception as e:  # noqa: BLE001 - torch lets more than PackageError out (an op it cannot pickle)
        saved = None
        log_once(f"guards:{type(e).__name__}", "a frame's guards cannot be saved (%s); it stays out of "
                 "the package", _first_line(e))
        _bypass_quietly(bound["output_graph"], f"fxcc: guards not serializable: {_first_line(e)}")
    with dynamo_config.patch(caching_precompile=False):
        whole = original(**{**bound, "save_guards": False})
    whole.guards_state = _with_identities(None if saved is None else saved.guards_state, identities)
    return whole


# What torch itself restores of the globals a frame's bytecode reads: its compiled graphs, resume
# functions, builtins dict and imports (torch._dynamo.package).
_RESTORED_GLOBALS = ("__compiled_fn", "__resume_at", "__builtins_dict__", "__import_")


def _patch_globals() -> None:
    """Every global a package's bytecode reads is restored in the next process, or the frame stays
    out of the package.

    Note: Dynamo installs some globals by a name that holds an id (a module its bytecode loads
    that the frame's globals lack by name: `___module_collections_<id>_c0`) and torch's package
    does not record them: loaded, such bytecode raised NameError in the user's program. A module
    is recorded as an import of the frame; any other global torch does not restore keeps the
    frame out of the package (it is traced in the next process)."""
    import types

    from torch._dynamo import output_graph

    cls = output_graph.OutputGraph
    original = cls.install_global_unsafe
    if getattr(original, "_fxcc", False):
        return

    def install_global_unsafe(self: Any, name: str, value: Any) -> None:
        original(self, name, value)
        package = getattr(self, "package", None)
        if package is None or not getattr(package, "_fxcc", False) or name.startswith(_RESTORED_GLOBALS):
            return
        try:
            if isinstance(value, types.ModuleType):
                package.add_import_source(name, value.__name__)
            else:
                log.debug("fxcc: Dynamo package cache: a frame's global %s is not restored; not packaged", name)
                package.bypass_current_entry()
        except Exception as e:  # noqa: BLE001 - this frame's entry stays out of the package
            log.debug("fxcc: Dynamo package cache: global %s: %s", name, _first_line(e))
            try:
                package.bypass_current_entry()
            except Exception:  # noqa: BLE001, S110 - no entry being compiled: nothing to keep out
                pass

    install_global_unsafe._fxcc = True  # type: ignore[attr-defined]
    cls.install_global_unsafe = install_global_unsafe


def _patch_pickler() -> None:
    """A decorated function's inner function (a frame's closure variable, as transformers'
    `check_model_inputs` holds `forward`) travels in a package by its code and closure.

    Note: torch pickles a function in a package's guard state by module and qualified name, and
    one whose name leads to another object (the decorator's wrapper has taken the name) becomes
    `_Missing`: then a guard on what its closure holds cannot be rebuilt in the next process, the
    package does not install, and the model is traced on every warm start (transformers' GPT-2).
    Only while a frame of an fxcc package compiles; its identity is checked by fxcc's identity
    guard (client/dynamo_identity.py)."""
    import inspect

    from torch._dynamo import guards

    from fxcc.client import dynamo_identity

    cls = getattr(guards, "GuardsStatePickler", None)
    original = getattr(cls, "reducer_override", None)
    if original is None or getattr(original, "_fxcc", False) or not hasattr(guards, "_Missing"):
        return

    def reducer_override(self: Any, obj: Any) -> Any:
        reduced = original(self, obj)
        if (getattr(_state.compiling, "active", False) and inspect.isfunction(obj) and isinstance(reduced, tuple)
                and reduced[0] is guards._Missing and reduced[1] == ("fqn mismatch",)):
            return dynamo_identity.reduce_function(obj)
        return reduced

    reducer_override._fxcc = True  # type: ignore[attr-defined]
    cls.reducer_override = reducer_override


def _patch_source_info(pk: Any) -> None:
    """A package records each function Dynamo inlined once per function, not once per inlining.

    Note: torch records the source of every inlined function (to check on load that it did not
    change), re-reading it (`inspect.getsourcelines`) at each inlining: a deep network inlines its
    block's functions once per layer (a 12-layer GPT-2: 726 calls for 75 functions, 0.9 s of a cold
    first call). What a function's record is does not change within the process (torch reads the
    module's source once too), and the records are a set, so each is made once and added again.
    A function whose record fails (its source changed) fails each time, as before.
    """
    import dataclasses
    import functools

    cls = getattr(pk, "SourceInfo", None)
    original = getattr(cls, "add_code", None)
    if original is None or getattr(original, "_fxcc", False) or not dataclasses.is_dataclass(cls) or \
            [f.name for f in dataclasses.fields(cls)] != ["inlined_sources"]:
        return  # another torch's SourceInfo: left as it is

    @functools.lru_cache(maxsize=4096)
    def records(code: Any) -> frozenset[Any]:
        scratch = cls(inlined_sources=set())
        original(scratch, code)
        return frozenset(scratch.inlined_sources)

    def add_code(self: Any, code: Any) -> None:
        self.inlined_sources.update(records(code))

    add_code._fxcc = True  # type: ignore[attr-defined]
    cls.add_code = add_code


def enable() -> bool:
    """Packages for fxcc's torch.compile calls, in fxcc's package store (once per process); False
    when this torch lacks the pieces (said once)."""
    import inspect

    with _state.lock:
        if _state.enabled:
            return True
    try:
        import torch._dynamo.config as dynamo_config
        from torch._dynamo import convert_frame as cf
        from torch._dynamo import eval_frame as ef
        from torch._dynamo import package as pk

        for name in ("DiskDynamoCache", "CompilePackage", "PrecompileCacheEntry", "_hash_sourcelines",
                     "load_guards_state", "load_guard_manager"):
            if not hasattr(pk, name):
                raise AttributeError(f"torch._dynamo.package has no {name}")
        if not hasattr(dynamo_config, "caching_precompile"):
            raise AttributeError("torch._dynamo.config has no caching_precompile")
        if "package" not in inspect.signature(ef._optimize).parameters:
            raise AttributeError("torch._dynamo.eval_frame._optimize takes no package")
        for module, name in ((cf, "ConvertFrameAssert"), (cf, "compile_lock")):
            if not hasattr(module, name):
                raise AttributeError(f"{module.__name__} has no {name}")
        pk.DynamoCache = _store_class()()
        _patch_install(pk)
        _patch_convert(cf)
        _patch_optimize(ef, pk)
        _patch_source_info(pk)
        logging.getLogger("torch._dynamo.guards").addFilter(_DroppedGuardFilter())
    except Exception as e:  # noqa: BLE001
        log_once("enable", "off: this torch (%s) lacks what fxcc's packages need (%s)", torch.__version__,
                 _first_line(e))
        return False
    with _state.lock:
        _state.enabled = True
    return True


__all__ = ["enable"]

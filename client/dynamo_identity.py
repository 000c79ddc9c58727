"""Identity guards that travel with a Dynamo package, so that a loaded frame is as safe as a traced one.

Dynamo guards some objects by identity (ID_MATCH, CLOSURE_MATCH, WEAKREF_ALIVE, DICT_VERSION): a
global function, a function held by a module attribute, a closure cell, torch's modules. Ids do not
survive a process, so torch's caching precompile drops those guards from a package, and a package
saved while `self.act` was `F.gelu` would run for a model whose `self.act` is `F.relu`.

fxcc keeps them in another form. When a frame of an fxcc package compiles (client/dynamo_cache.py):
- this process installs the frame's whole guards (identity included), and only the package's copy
  leaves them out;
- the package's copy carries, beside torch's guards state, each dropped guard's source (`G['g']`,
  `L['self'].act`: sources rooted in the frame's locals or globals) and a description of the object
  it found: a module by name; a function by
  module, qualified name and a digest of its code; a class or builtin by module and qualified name;
  anything else by its type.
When a process installs the package, each of its frames gets one more guard: on the first call the
objects at those sources must match the descriptions (another function, another class: the guard
fails and Dynamo traces as usual); the objects that matched are then pinned, and every later call
requires the very same objects, as Dynamo's own identity guards do.

Note: an object described only by its type (an arbitrary instance whose id Dynamo guarded) is
checked by type on the first call and by identity after it.
"""

from __future__ import annotations

import hashlib
import json
import types
from typing import Any

MAGIC = b"FXCCIDS1\n"
IDENTITY_GUARDS = ("ID_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE", "DICT_VERSION")


def is_identity(entry: Any) -> bool:
    """Whether torch's caching precompile drops this guard-filter entry."""
    derived = getattr(entry, "derived_guard_types", ()) or ()
    return entry.guard_type in IDENTITY_GUARDS or "ID_MATCH" in derived or "DICT_VERSION" in derived


def is_identity_guard(guard: Any) -> bool:
    """Whether torch's caching precompile drops this guard (`is_identity` of its filter entry)."""
    derived = tuple(guard.guard_types) if guard.guard_types else ()
    return guard.create_fn_name() in IDENTITY_GUARDS or "ID_MATCH" in derived or "DICT_VERSION" in derived


def _code_digest(code: types.CodeType) -> str:
    h = hashlib.sha256(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars)).encode())
    for c in code.co_consts:
        h.update(_code_digest(c).encode() if isinstance(c, types.CodeType) else repr(c).encode())
    return h.hexdigest()[:32]


def describe(obj: Any) -> list[str]:
    """What a new process can check of `obj` without its id."""
    if isinstance(obj, types.ModuleType):
        return ["module", obj.__name__]
    if isinstance(obj, types.FunctionType):
        return ["function", str(obj.__module__), obj.__qualname__, _code_digest(obj.__code__)]
    if isinstance(obj, types.MethodType):
        return ["method", *describe(obj.__func__)[1:], *describe(obj.__self__)]
    if isinstance(obj, type):
        return ["class", str(obj.__module__), obj.__qualname__]
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return ["builtin", str(getattr(obj, "__module__", "")), getattr(obj, "__qualname__", repr(obj))]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return ["value", repr(obj)]
    kind = type(obj)
    return ["object", str(kind.__module__), kind.__qualname__]


def observe(entries: list[Any], user_filter: Any, into: list[tuple[str, list[str]]]) -> list[bool]:
    """The user's guard filter (or keep-all), recording into `into` the identity guards it keeps."""
    keep = list(user_filter(entries)) if user_filter is not None else [True] * len(entries)
    for kept, entry in zip(keep, entries):
        name = _source_name(entry)
        if kept and is_identity(entry) and getattr(entry, "has_value", False) and name.startswith(("L[", "G[")):
            into.append((name, describe(entry.value)))
    return keep


def _source_name(entry: Any) -> str:
    """The guard's source as Dynamo's guard code reads it (`L['self'].act`; the entry's own `name`
    is the user's spelling, `self.act`)."""
    guard = getattr(entry, "orig_guard", None)
    try:
        return str(guard.name) if guard is not None else str(entry.name)
    except Exception:  # noqa: BLE001 - a guard without a source: not recorded
        return ""


def rebuild_function(code: types.CodeType, module: str, name: str, qualname: str, defaults: Any,
                     kwdefaults: Any, closure: Any) -> types.FunctionType:
    """A function again from a package's guard state (see dynamo_cache._patch_pickler): its name
    and qualified name as they were, since guards read them (torch's own nested-function
    unpickler gives it the qualified name as its name)."""
    import importlib

    fn = types.FunctionType(code, importlib.import_module(module).__dict__, name, defaults, closure)
    fn.__qualname__, fn.__kwdefaults__ = qualname, kwdefaults
    return fn


def reduce_function(fn: types.FunctionType) -> tuple[Any, tuple[Any, ...]]:
    """How a package's guard state pickles a function that its module and name do not lead to."""
    return rebuild_function, (fn.__code__, fn.__module__, fn.__name__, fn.__qualname__, fn.__defaults__,
                              fn.__kwdefaults__, fn.__closure__)


def attach(guards_state: bytes | None, identities: list[tuple[str, list[str]]]) -> bytes | None:
    """Torch's guards state with the dropped identity guards' sources and descriptions before it."""
    if guards_state is None or not identities:
        return guards_state
    unique = sorted({(name, json.dumps(d)) for name, d in identities})
    head = json.dumps([[name, json.loads(d)] for name, d in unique]).encode()
    return MAGIC + head + b"\n" + guards_state


def split(guards_state: bytes) -> tuple[list[tuple[str, list[str]]], bytes]:
    """(the identities, torch's guards state) of what `attach` wrote; no identities for torch's own."""
    if not guards_state.startswith(MAGIC):
        return [], guards_state
    head, _, rest = guards_state[len(MAGIC):].partition(b"\n")
    return [(str(name), [str(x) for x in d]) for name, d in json.loads(head)], rest


class IdentityGuard:
    """A loaded frame's guard over the objects its package's identity guards named."""

    def __init__(self, identities: list[tuple[str, list[str]]], scope: Any) -> None:
        from torch._dynamo.guards import _get_closure_vars

        self.sources = [(name, compile(name, "<fxcc identity guard>", "eval"), d) for name, d in identities]
        self.scope = scope
        self.helpers = dict(_get_closure_vars())
        self.pinned: list[Any] | None = None

    def verbose(self) -> list[str]:
        return [f"fxcc: {name} is {' '.join(d)}" for name, _, d in self.sources]

    def __call__(self, f_locals: Any) -> bool:
        try:
            env = {**self.helpers, "L": f_locals, "G": self.scope}
            found = [eval(code, env) for _, code, _ in self.sources]  # a signed package's own sources
        except Exception:  # noqa: BLE001 - a source that does not resolve: the guard fails, Dynamo traces
            return False
        if self.pinned is None:
            if any(describe(obj) != d for obj, (_, _, d) in zip(found, self.sources)):
                return False
            self.pinned = found
            return True
        return all(obj is pinned for obj, pinned in zip(found, self.pinned))


def module_of(code: types.CodeType, scope: Any = None) -> types.ModuleType | None:
    """The module that defines `code`: the module whose globals are `scope` when its file is the
    code's (a package's frames are installed into the globals of the module that defines them),
    else what `inspect.getmodule` finds.

    Note: `inspect.getmodule` of a code object, the first time it meets the code's file, reads the
    file name of every module imported (thousands once transformers is): about 7 ms with 2100
    modules on this CPU, paid on a loaded package's way to its first call."""
    import inspect
    import os
    import sys

    name = scope.get("__name__") if isinstance(scope, dict) else None
    module = sys.modules.get(name) if isinstance(name, str) else None
    path = getattr(module, "__file__", None)
    if module is not None and module.__dict__ is scope and isinstance(path, str) and \
            (path == code.co_filename or os.path.realpath(path) == os.path.realpath(code.co_filename)):
        return module
    return inspect.getmodule(code)


def add_guard(guard_manager: Any, identities: list[tuple[str, list[str]]], code: types.CodeType,
              scope: dict[str, Any]) -> None:
    """The identity guard on a loaded frame's guard manager (its root sees the frame's locals; `G`
    is the globals of the module that defines `code`, which a decorator's wrapper does not share
    with the function it wraps, then the scope torch installs the package's globals into)."""
    import collections

    module = module_of(code, scope)
    own = module.__dict__ if module is not None else {}
    guard = IdentityGuard(identities, collections.ChainMap(own, scope))  # type: ignore[arg-type]
    guard_manager.root.add_lambda_guard(guard, guard.verbose(), None)

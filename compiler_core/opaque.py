"""Opaque ops: nodes of ops outside aten/prims (torch.library custom ops) that the client runs by name.

Note: the service and the worker never look such an op up, import it or call it. A node of one
carries the op's schema text and its outputs' specs as the client's fake kernel computed them
(wire.OpaqueOp); here the schema is parsed by fxcc's own bounded grammar (data only: it is never
handed to torch's parser or registry), checked against the node, and the outputs become the node's
FakeTensors, so that the lowering sizes and places buffers around an extern step. The client
resolves the op from its own registry when it runs a signed plan, refuses one whose schema differs,
and checks each result against these specs (client/opaque_ops.py).

The forms an opaque node takes:
- plain: the op is functional (no argument written); its result(s) are the node's value.
- functional (`OpaqueOp.functional`): AOTAutograd's auto_functionalized form of an op that writes
  arguments (torch.library `mutates_args`): the client clones each written argument, calls the op
  on the clones and the node's value is `(*results, *clones)`, the layout auto_functionalized
  gives (an op returning nothing counts as one None result).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fxcc.compiler_core.errors import InvalidGraph

MAX_SCHEMA = 4096
MAX_ARGS = 64
MAX_RETURNS = 16
NAMESPACES_NOT_OPAQUE = frozenset({"aten", "prims", "fxcc", "higher_order"})

_IDENT = r"[A-Za-z_][A-Za-z0-9_]{0,127}"
_QUALNAME_RE = re.compile(rf"({_IDENT})::({_IDENT})(?:\.({_IDENT}))?")
# Wire target of an opaque node: namespace.op.overload (as wire.target_name writes an OpOverload).
OPAQUE_TARGET_RE = re.compile(rf"({_IDENT})\.({_IDENT})\.({_IDENT})")
# A type: a name, an alias annotation `(a)` / `(a!)` / `(a -> *)`, an optional list suffix `[]` /
# `[2]` and an optional `?` (torch's schema grammar, in the forms torch.library schemas use).
_TYPE_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]{0,31})(\?)?(?:\(([a-z][a-z0-9]{0,7})(!)?(?:\s*->\s*\*)?\))?"
                      r"(\[[0-9]{0,4}\])?(\?)?")
_DEFAULT_RE = re.compile(r"[A-Za-z0-9_.+\-\[\], \"']{0,64}")


@dataclass(frozen=True)
class SchemaArg:
    name: str
    type: str  # the base type name (Tensor, int, SymInt, str, ...)
    is_list: bool
    optional: bool
    alias: str | None
    written: bool
    kwarg_only: bool


@dataclass(frozen=True)
class SchemaReturn:
    type: str
    is_list: bool
    alias: str | None


@dataclass(frozen=True)
class OpSchema:
    """A parsed `ns::op.overload(args) -> returns` schema (fxcc's grammar, never torch's parser)."""

    namespace: str
    name: str
    overload: str
    args: tuple[SchemaArg, ...]
    returns: tuple[SchemaReturn, ...]

    @property
    def wire_name(self) -> str:
        return f"{self.namespace}.{self.name}.{self.overload}"

    @property
    def written(self) -> tuple[SchemaArg, ...]:
        return tuple(a for a in self.args if a.written)


def parse_schema(text: str) -> OpSchema:
    """`text` as an OpSchema; ValueError naming what is wrong for anything outside the grammar."""
    if len(text) > MAX_SCHEMA:
        raise ValueError(f"schema of {len(text)} characters exceeds {MAX_SCHEMA}")
    head, sep, rest = text.partition("(")
    m = _QUALNAME_RE.fullmatch(head)
    if not sep or m is None:
        raise ValueError(f"schema {_shown(text)} does not start with ns::op[.overload](")
    namespace, name, overload = m.group(1), m.group(2), m.group(3) or "default"
    args_text, arrow, returns_text = rest.rpartition(") -> ")
    if not arrow:
        raise ValueError(f"schema {_shown(text)} has no ') -> ' before its returns")
    args = _parse_args(args_text)
    returns = _parse_returns(returns_text)
    names = [a.name for a in args]
    if len(set(names)) != len(names):
        raise ValueError(f"schema {_shown(text)} names an argument twice")
    return OpSchema(namespace, name, overload, tuple(args), tuple(returns))


def _parse_args(text: str) -> list[SchemaArg]:
    parts = _split_top(text) if text.strip() else []
    if len(parts) > MAX_ARGS + 1:
        raise ValueError(f"schema has more than {MAX_ARGS} arguments")
    out: list[SchemaArg] = []
    kwarg_only = False
    for part in parts:
        part = part.strip()
        if part == "*":
            kwarg_only = True
            continue
        decl, eq, default = part.partition("=")
        if eq and _DEFAULT_RE.fullmatch(default) is None:
            raise ValueError(f"argument {_shown(part)} has a default outside the grammar")
        type_text, _, arg_name = decl.strip().rpartition(" ")
        if re.fullmatch(_IDENT, arg_name) is None:
            raise ValueError(f"argument {_shown(part)} has no valid name")
        t = _parse_type(type_text.strip())
        out.append(SchemaArg(arg_name, t[0], t[1], t[2], t[3], t[4], kwarg_only))
    return out


def _parse_returns(text: str) -> list[SchemaReturn]:
    text = text.strip()
    if text.startswith("(") and text.endswith(")"):
        parts = _split_top(text[1:-1]) if text[1:-1].strip() else []
    else:
        parts = [text]
    if len(parts) > MAX_RETURNS:
        raise ValueError(f"schema has more than {MAX_RETURNS} returns")
    out: list[SchemaReturn] = []
    for part in parts:
        type_text, _, ret_name = part.strip().partition(" ")
        if ret_name and re.fullmatch(_IDENT, ret_name) is None:
            raise ValueError(f"return {_shown(part)} has no valid name")
        base, is_list, _, alias, _ = _parse_type(type_text)
        out.append(SchemaReturn(base, is_list, alias))
    return out


def _parse_type(text: str) -> tuple[str, bool, bool, str | None, bool]:
    m = _TYPE_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"type {_shown(text)} is outside the grammar")
    base, opt1, alias, bang, lst, opt2 = m.groups()
    return base, lst is not None, bool(opt1 or opt2), alias, bool(bang)


def _split_top(text: str) -> list[str]:
    """`text` split at its commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


# ---------------------------------------------------------------- checks of a node


def check_opaque_node(target: str, schema_text: str, functional: bool, n_outputs: int,
                      tensor_outputs: list[bool]) -> OpSchema:
    """The node's parsed schema, if the node is one the plan can run (see the module's forms);
    else ValueError naming the reason (the wire's validators turn it into a 422)."""
    m = OPAQUE_TARGET_RE.fullmatch(target)
    if m is None:
        raise ValueError(f"opaque target {target!r} is not of the form ns.op.overload")
    if m.group(1) in NAMESPACES_NOT_OPAQUE:
        raise ValueError(f"{m.group(1)} ops are not opaque: name them as graph ops")
    if any(part.startswith("__") for part in m.groups()):
        raise ValueError(f"opaque target {target!r} names a private attribute")
    schema = parse_schema(schema_text)
    if schema.wire_name != target:
        raise ValueError(f"schema {schema.namespace}::{schema.name}.{schema.overload} is not node target {target}")
    if any(r.type != "Tensor" for r in schema.returns):
        raise ValueError(f"{target} returns a non-tensor")
    lists = [r for r in schema.returns if r.is_list]
    if lists and (len(schema.returns) != 1 or functional):
        raise ValueError(f"{target}: a Tensor[] return must be the op's only one, of a functional op")
    if functional:
        if not schema.written:
            raise ValueError(f"{target} is marked functionalized but writes no argument")
        if any(a.type != "Tensor" or a.is_list for a in schema.written):
            raise ValueError(f"{target} writes an argument that is not one tensor")
        want = max(len(schema.returns), 1) + len(schema.written)
    else:
        if schema.written:
            raise ValueError(f"{target} writes its argument {schema.written[0].name} in place and is not functionalized")
        if not schema.returns:
            raise ValueError(f"{target} returns nothing, so it exists only for a side effect")
        want = n_outputs if lists else len(schema.returns)
    if n_outputs != want:
        raise ValueError(f"{target} has {n_outputs} output specs, its schema gives {want}")
    none_ok = functional and not schema.returns
    if not all(tensor_outputs[i] or (none_ok and i == 0) for i in range(n_outputs)):
        raise ValueError(f"{target}: an output spec is missing")
    return schema


USER_KERNEL_TARGET_RE = re.compile(rf"triton_kernel\.({_IDENT})")


def check_user_kernel(target: str, cloned: list[str], n_outputs: int, kwargs: list[str], args: list[Any]) -> None:
    """ValueError unless a user Triton kernel's node is one the plan can run: named
    `triton_kernel.<function name>`, its arguments all by name, one output spec per cloned one."""
    if USER_KERNEL_TARGET_RE.fullmatch(target) is None:
        raise ValueError(f"Triton kernel target {target!r} is not of the form triton_kernel.<name>")
    if args:
        raise ValueError(f"{target}: a Triton kernel takes its arguments by name")
    if len(set(cloned)) != len(cloned) or not set(cloned) <= set(kwargs):
        raise ValueError(f"{target}: its cloned tensors {cloned} are not distinct arguments of it")
    if n_outputs != len(cloned):
        raise ValueError(f"{target} has {n_outputs} output specs for {len(cloned)} cloned tensors")


def value_form(schema: OpSchema, functional: bool) -> str:
    """How an opaque node's results make its value: "one" tensor, a "tuple" or a "list" of them."""
    if schema.returns and schema.returns[0].is_list:
        return "list"
    return "tuple" if functional or len(schema.returns) != 1 else "one"


# ---------------------------------------------------------------- the worker's FX target


class OpaqueTarget:
    """The FX target of an opaque node or a user Triton kernel in a rebuilt graph: called on
    FakeTensors it gives the node's fakes, made from the client's specs by `make_outputs`, in
    `form` ("one", "tuple" or "list"); it never computes (the op or kernel is the client's).
    `wire_name` is the node's target on the wire (wire.target_name returns it)."""

    def __init__(self, wire_name: str, make_outputs: Callable[[], list[Any]], form: str) -> None:
        self.wire_name = wire_name
        self.form = form
        self._make_outputs = make_outputs
        self.__name__ = "opaque_" + re.sub(r"\W", "_", wire_name)

    def __repr__(self) -> str:
        return f"opaque[{self.wire_name}]"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch._subclasses.fake_tensor import FakeTensor

        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if any(not isinstance(t, FakeTensor) for t in tensors):
            raise InvalidGraph(f"{self.wire_name} runs only on the client", op=self.wire_name)
        vals = self._make_outputs()
        return vals[0] if self.form == "one" else list(vals) if self.form == "list" else tuple(vals)

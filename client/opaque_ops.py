"""Ops outside aten/prims (torch.library custom ops) on the client: which may travel, and running them.

Note: the worker only sizes and places buffers around such an op (compiler_core.opaque). Here,
at capture, an op qualifies when it has a fake kernel and fxcc's schema grammar reads its
schema; AOTAutograd's auto_functionalized nodes (ops with `mutates_args`) travel as the op with
its written arguments bound to their bases. At run time, from a verified plan only, the op is
resolved from this process's registry by attribute lookup, its schema must equal the plan's, and
every result is checked against the specs the fake kernel gave at capture: dtype, device, sizes
and strides. A mismatch raises OpaqueMismatch, and the backend runs that graph eagerly from then
on, saying so once (client/backend._guarded).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch._prims_common import clone_preserve_strides

from fxcc.compiler_core.errors import ArtifactError, UnsupportedOp
from fxcc.compiler_core.opaque import NAMESPACES_NOT_OPAQUE, OPAQUE_TARGET_RE, parse_schema, value_form
from fxcc.compiler_core.symexpr import compile_exprs
from fxcc.compiler_core.wire import torch_dtype

FUNCTIONALIZED = ("auto_functionalized", "auto_functionalized_v2")
# auto_functionalized_v2's keys for a written argument that is a view of its base (not a base).
_VIEW_KEYS = ("size", "stride", "storage_offset", "slice_dim", "slice_start", "slice_end", "alias")


class OpaqueMismatch(ArtifactError):
    """An opaque op's result differs from what its fake kernel said at capture."""


# ---------------------------------------------------------------- capture


def is_opaque(n: fx.Node) -> bool:
    """Whether FX node `n` calls an op outside aten/prims (or an auto_functionalized one)."""
    t = n.target
    if isinstance(t, torch._ops.HigherOrderOperator):
        return t.name() in FUNCTIONALIZED
    return isinstance(t, torch._ops.OpOverload) and t.namespace not in ("aten", "prims")


def opaque_refusal(op: Any) -> str | None:
    """Why OpOverload `op` cannot be an opaque step, or None when it can."""
    if not isinstance(op, torch._ops.OpOverload):
        return f"{op} is not an op overload"
    if op.namespace in NAMESPACES_NOT_OPAQUE:
        return f"{op.namespace} ops are compiled, not opaque"
    try:
        parse_schema(str(op._schema))
    except ValueError as e:
        return f"its schema is outside fxcc's grammar ({e})"
    has_fake = getattr(torch._library.utils, "has_fake_kernel", None)
    if has_fake is not None and not has_fake(op):
        return "it has no fake kernel"
    out_tag = getattr(torch.Tag, "out", None)  # torch 2.11 has no Tag.out: its schema says it
    if (out_tag is not None and out_tag in op.tags) or any(a.is_out for a in op._schema.arguments):
        return "it is an out= op"
    return None


def unfunctionalized(n: fx.Node) -> tuple[Any, tuple[Any, ...], dict[str, Any], bool]:
    """(op, args, kwargs, functional) of an opaque FX node: for auto_functionalized, the op with
    its arguments by name, each written one bound to its base (functional=True)."""
    if not isinstance(n.target, torch._ops.HigherOrderOperator):
        return n.target, tuple(n.args), dict(n.kwargs), False
    op = n.args[0]
    if not isinstance(op, torch._ops.OpOverload):
        raise UnsupportedOp(f"{n.target.name()} of {op}, not of an op overload", node=n.name)
    given = dict(n.kwargs)
    if n.target.name() == "auto_functionalized":
        kwargs = {k: v for k, v in given.items() if not k.startswith("_")}
        if any(kwargs.get(a.name) is None for a in op._schema.arguments if _written(a)):
            raise UnsupportedOp(f"{op} writes an argument given as None", op=str(op), node=n.name)
        return op, (), kwargs, True
    bases = list(given.pop("_all_bases", []))
    kwargs = {}
    taken: list[int] = []
    for a in op._schema.arguments:
        if not _written(a):
            if a.name in given:
                kwargs[a.name] = given.pop(a.name)
            continue
        index = given.pop(f"_{a.name}_base_index", None)
        if index is None or any(f"_{a.name}_{k}" in given for k in _VIEW_KEYS):
            raise UnsupportedOp(f"{op} writes {a.name}, which is not a whole tensor", op=str(op), node=n.name)
        kwargs[a.name] = bases[index]
        taken.append(index)
    if taken != list(range(len(bases))) or given:
        raise UnsupportedOp(f"auto_functionalized_v2 of {op} in a form fxcc does not read", op=str(op), node=n.name)
    return op, (), kwargs, True


def _written(a: Any) -> bool:
    return a.alias_info is not None and a.alias_info.is_write


# ---------------------------------------------------------------- run time


def resolve_opaque(name: str, schema: str) -> Any:
    """The OpOverload `name` (ns.op.overload) of this process, if its schema is `schema`."""
    m = OPAQUE_TARGET_RE.fullmatch(name)
    if m is None or m.group(1) in NAMESPACES_NOT_OPAQUE or any(p.startswith("__") for p in m.groups()):
        raise ArtifactError(f"plan names {name!r}, which is not an opaque op", op=name)
    ns, op_name, overload = m.groups()
    try:
        op = getattr(getattr(getattr(torch.ops, ns), op_name), overload)
    except (AttributeError, RuntimeError):
        raise ArtifactError(f"op {name} is not registered in this process (import the module that "
                            "defines it before running the model)", op=name) from None
    if not isinstance(op, torch._ops.OpOverload):
        raise ArtifactError(f"{name} is not an op overload", op=name)
    if str(op._schema) != schema:
        raise ArtifactError(f"op {name} here has schema {op._schema}, the plan was compiled for {schema}", op=name)
    return op


def opaque_call(name: str, opaque: Any) -> Callable[[list[Any], dict[str, Any], Any], Any]:
    """A call of the plan's opaque op `name` (an OpaqueOp's schema and outputs) over decoded
    arguments and the call's size symbols, its results checked against the plan's specs."""
    op = resolve_opaque(name, opaque.op_schema)
    written = [a.name for a in op._schema.arguments if _written(a)] if opaque.functional else []
    check = result_check(name, opaque.outputs)
    single = value_form(parse_schema(opaque.op_schema), opaque.functional) == "one"

    def call(args: list[Any], kwargs: dict[str, Any], syms: Any) -> Any:
        if written:
            clones = [clone_preserve_strides(kwargs[w]) for w in written]  # as auto_functionalized's
            kwargs = {**kwargs, **dict(zip(written, clones))}
            out = op(*args, **kwargs)
            value: Any = (*out, *clones) if isinstance(out, tuple) else (out, *clones)
        else:
            value = op(*args, **kwargs)
        check([value] if single else list(value), syms)
        return value
    return call


def result_check(name: str, specs: list[Any], source: str = "its fake kernel") -> Callable[[list[Any], Any], None]:
    """A check of an opaque op's results against the plan's specs (sizes and strides may be
    size expressions, evaluated with the call's symbols)."""
    texts = [str(x) for s in specs if s is not None for x in (*s.sizes, *s.strides)]
    symbolic = any(isinstance(x, str) for s in specs if s is not None for x in (*s.sizes, *s.strides))
    evaluate = compile_exprs(texts) if symbolic else None
    fixed = [int(x) for x in texts] if not symbolic else None
    dtypes = [None if s is None else torch_dtype(s.dtype) for s in specs]

    def check(values: list[Any], syms: Any) -> None:
        if len(values) != len(specs):
            raise OpaqueMismatch(f"op {name} returned {len(values)} results, {source} {len(specs)}", op=name)
        numbers = iter(fixed if evaluate is None else evaluate(syms))
        for i, (v, spec, dtype) in enumerate(zip(values, specs, dtypes)):
            if spec is None:
                if v is not None:
                    raise OpaqueMismatch(f"op {name} result {i} is a tensor, {source} said None", op=name)
                continue
            sizes = [next(numbers) for _ in spec.sizes]
            strides = [next(numbers) for _ in spec.strides]
            if not isinstance(v, torch.Tensor):
                raise OpaqueMismatch(f"op {name} result {i} is a {type(v).__name__}, not a tensor", op=name)
            if v.dtype != dtype or v.device.type != spec.device or list(v.shape) != sizes or \
                    any(n > 1 and a != b for n, a, b in zip(sizes, v.stride(), strides)):
                raise OpaqueMismatch(
                    f"op {name} result {i} is {v.dtype} {v.device.type} {list(v.shape)} strides "
                    f"{list(v.stride())}; {source} said {dtype} {spec.device} {sizes} strides {strides}",
                    op=name)
    return check

"""The wire format: versioned pydantic models for graphs and compile requests sent over the network.

Note: nothing here is ever unpickled, eval'd, exec'd or sympified. Node targets resolve only to
`torch.ops.aten` / `torch.ops.prims` overloads (plus `getitem` for tuple outputs) by attribute
lookup on those namespaces, after the name has been checked against a strict grammar.
"""

from __future__ import annotations

import math
import operator
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from compiler_core.errors import InvalidGraph

SCHEMA_VERSION = 1

MAX_NODES = 20_000
MAX_RANK = 12
MAX_DIM = 1 << 40
MAX_LIST = 4096

_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,127}"
_NAME_RE = re.compile(_NAME)
_TARGET_RE = re.compile(r"(aten|prims)\.([A-Za-z_][A-Za-z0-9_]{0,127})\.([A-Za-z_][A-Za-z0-9_]{0,63})")

# dtype names that travel, and the torch dtype each one means.
DTYPES: dict[str, str] = {
    "float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
    "bool": "bool", "complex64": "complex64",
}
DEVICE_TYPES = ("cpu", "cuda")
LAYOUTS = ("strided",)
MEMORY_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")

Name = Annotated[str, Field(pattern=f"^{_NAME}$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- arguments


class NodeRef(_Model):
    kind: Literal["node"] = "node"
    name: Name


class IntArg(_Model):
    kind: Literal["int"] = "int"
    value: int = Field(ge=-(1 << 63), lt=1 << 64)


class FloatArg(_Model):
    """A float; inf and nan travel as strings because JSON has no spelling for them."""

    kind: Literal["float"] = "float"
    value: float | Literal["inf", "-inf", "nan"]

    def to_python(self) -> float:
        return float(self.value)


class BoolArg(_Model):
    kind: Literal["bool"] = "bool"
    value: bool


class NoneArg(_Model):
    kind: Literal["none"] = "none"


class StrArg(_Model):
    """Short enum-like strings some aten ops take (gelu's approximate='tanh', an api_name such as
    'linalg.solve'). Only ever passed to an op as a value, never interpreted."""

    kind: Literal["str"] = "str"
    value: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_.\-]*$")


class DtypeArg(_Model):
    kind: Literal["dtype"] = "dtype"
    value: str

    @field_validator("value")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in DTYPES:
            raise ValueError(f"unknown dtype {v!r}")
        return v


class DeviceArg(_Model):
    kind: Literal["device"] = "device"
    value: Literal["cpu", "cuda"]


class LayoutArg(_Model):
    kind: Literal["layout"] = "layout"
    value: Literal["strided"]


class MemoryFormatArg(_Model):
    kind: Literal["memory_format"] = "memory_format"
    value: Literal["contiguous_format", "channels_last", "channels_last_3d", "preserve_format"]


class ListArg(_Model):
    kind: Literal["list"] = "list"
    items: list[Arg] = Field(max_length=MAX_LIST)


Arg = Annotated[
    NodeRef | IntArg | FloatArg | BoolArg | NoneArg | StrArg | DtypeArg | DeviceArg | LayoutArg | MemoryFormatArg | ListArg,
    Field(discriminator="kind"),
]
ListArg.model_rebuild()


# ---------------------------------------------------------------- tensors and graphs


class TensorSpec(_Model):
    """What a tensor input looks like. The worker re-derives everything downstream of these."""

    dtype: str
    sizes: list[int] = Field(max_length=MAX_RANK)
    strides: list[int] = Field(max_length=MAX_RANK)
    storage_offset: int = Field(default=0, ge=0, le=MAX_DIM)
    device: Literal["cpu", "cuda"] = "cpu"

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str) -> str:
        if v not in DTYPES:
            raise ValueError(f"unknown dtype {v!r}")
        return v

    @field_validator("sizes")
    @classmethod
    def _sizes(cls, v: list[int]) -> list[int]:
        if any(s < 0 or s > MAX_DIM for s in v):
            raise ValueError(f"sizes must lie in [0, 2**40]: {v}")
        if math.prod(v) > MAX_DIM:
            raise ValueError(f"tensor of {math.prod(v)} elements exceeds the limit of 2**40")
        return v

    @field_validator("strides")
    @classmethod
    def _strides(cls, v: list[int]) -> list[int]:
        if any(abs(s) > MAX_DIM for s in v):
            raise ValueError(f"strides must lie in [-2**40, 2**40]: {v}")
        return v

    @model_validator(mode="after")
    def _rank(self) -> TensorSpec:
        if len(self.sizes) != len(self.strides):
            raise ValueError(f"{len(self.sizes)} sizes but {len(self.strides)} strides")
        return self


class Placeholder(_Model):
    name: Name
    spec: TensorSpec


class Node(_Model):
    name: Name
    target: str = Field(max_length=200)
    args: list[Arg] = Field(default_factory=list, max_length=64)
    kwargs: dict[Name, Arg] = Field(default_factory=dict)


class GraphSpec(_Model):
    """An aten-level graph: inputs with their specs, nodes in topological order, outputs."""

    schema_version: Literal[1] = SCHEMA_VERSION
    placeholders: list[Placeholder] = Field(max_length=MAX_NODES)
    nodes: list[Node] = Field(max_length=MAX_NODES)
    outputs: list[Arg] = Field(max_length=MAX_NODES)

    @model_validator(mode="after")
    def _references(self) -> GraphSpec:
        """Every name is defined once and every reference points to an earlier definition."""
        seen: set[str] = set()
        for p in self.placeholders:
            if p.name in seen:
                raise ValueError(f"placeholder {p.name!r} is defined twice")
            seen.add(p.name)
        for n in self.nodes:
            for ref in _refs(list(n.args) + list(n.kwargs.values())):
                if ref not in seen:
                    raise ValueError(f"node {n.name!r} uses {ref!r}, which is not defined before it")
            if n.name in seen:
                raise ValueError(f"node {n.name!r} is defined twice")
            seen.add(n.name)
        for ref in _refs(self.outputs):
            if ref not in seen:
                raise ValueError(f"output uses undefined {ref!r}")
        return self


def _refs(args: list[Any]) -> list[str]:
    out: list[str] = []
    for a in args:
        if isinstance(a, NodeRef):
            out.append(a.name)
        elif isinstance(a, ListArg):
            out.extend(_refs(a.items))
    return out


# ---------------------------------------------------------------- requests


class Target(_Model):
    """Where kernels will run: `cuda` with an SM arch (90 = sm_90), or `interpret` (Triton's CPU
    interpreter, used for CPU tensors)."""

    kind: Literal["cuda", "interpret"] = "interpret"
    arch: int = Field(default=0, ge=0, le=200)
    warp_size: int = Field(default=32, ge=1, le=64)


def _local_version(module: str) -> str:
    import importlib.metadata

    v = importlib.metadata.version(module)
    return ".".join(v.split(".")[:2])


class RuntimeVersions(_Model):
    """major.minor of the torch and triton that will run the artifact (part of the key)."""

    torch: str = Field(default_factory=lambda: _local_version("torch"), pattern=r"^\d+\.\d+$")
    triton: str = Field(default_factory=lambda: _local_version("triton"), pattern=r"^\d+\.\d+$")


class CompileOptions(_Model):
    mode: Literal["default", "max-autotune"] = "default"
    target: Target = Field(default_factory=Target)
    runtime: RuntimeVersions = Field(default_factory=RuntimeVersions)


class CompileRequest(_Model):
    schema_version: Literal[1] = SCHEMA_VERSION
    graph: GraphSpec
    options: CompileOptions = Field(default_factory=CompileOptions)
    priority: Literal["interactive", "precompile"] = "interactive"


# ---------------------------------------------------------------- target resolution


def resolve_target(target: str, node: str | None = None) -> Any:
    """The callable a node's target names: an aten/prims OpOverload, or operator.getitem.

    Raises InvalidGraph for anything else. Resolution is attribute lookup on torch.ops.aten /
    torch.ops.prims after a strict grammar check, so no text reaches an interpreter.
    """
    import torch

    if target == "getitem":
        return operator.getitem
    m = _TARGET_RE.fullmatch(target)
    if m is None:
        raise InvalidGraph(f"target {target!r} is not of the form aten.<op>.<overload> or "
                           "prims.<op>.<overload>", op=target, node=node)
    ns, op, overload = m.groups()
    if op.startswith("__") or overload.startswith("__"):
        raise InvalidGraph(f"target {target!r} names a private attribute", op=target, node=node)
    namespace = torch.ops.aten if ns == "aten" else torch.ops.prims
    try:
        packet = getattr(namespace, op)
        fn = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        raise InvalidGraph(f"unknown op {target!r}", op=target, node=node) from None
    if not isinstance(fn, torch._ops.OpOverload):
        raise InvalidGraph(f"{target!r} is not an op overload", op=target, node=node)
    return fn


def target_name(fn: Any) -> str:
    """The wire name of an OpOverload (inverse of resolve_target)."""
    if fn is operator.getitem:
        return "getitem"
    ns = fn.namespace
    return f"{ns}.{fn._opname}.{fn._overloadname}"


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, DTYPES[name])


def dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise InvalidGraph(f"dtype {name} cannot travel")
    return name

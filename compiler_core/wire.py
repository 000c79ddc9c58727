"""The wire format: versioned pydantic models for graphs and compile requests sent over the network.

Note: nothing here is ever unpickled, eval'd, exec'd or sympified. Node targets resolve only to
`torch.ops.aten` / `torch.ops.prims` overloads (plus `getitem` for tuple outputs) by attribute
lookup on those namespaces, after the name has been checked against a strict grammar, and only
to the functional ones compiler_core.op_policy allows. A node of an op outside them (`opaque`,
a torch.library custom op) resolves to nothing here: it is data, checked by compiler_core.opaque.
"""

from __future__ import annotations

import math
import operator
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from fxcc.compiler_core.errors import InvalidGraph
from fxcc.compiler_core.op_policy import refusal

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
_SYMBOL = r"^s[0-9]{1,4}$"


def _size_value(v: int | str) -> int | str:
    return check_size_expr(v) if isinstance(v, str) else v


SizeText = Annotated[str, Field(max_length=1024), AfterValidator(_size_value)]
# Note: one validator on the union (not `int | Annotated[str, ...]`), so that a bad expression gets
# one error naming it rather than a first error saying that it is not an int.
SizeValue = Annotated[int | Annotated[str, Field(max_length=1024)], AfterValidator(_size_value)]


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


class SymArg(_Model):
    """An integer given by a size expression over the graph's size symbols (`s0*64`).

    The text is parsed by compiler_core.symexpr (fxcc's own grammar; never eval'd or sympified).
    """

    kind: Literal["sym"] = "sym"
    expr: str = Field(max_length=1024)

    @field_validator("expr")
    @classmethod
    def _grammar(cls, v: str) -> str:
        return check_size_expr(v)


class ListArg(_Model):
    kind: Literal["list"] = "list"
    items: list[Arg] = Field(max_length=MAX_LIST)


Arg = Annotated[
    NodeRef | IntArg | SymArg | FloatArg | BoolArg | NoneArg | StrArg | DtypeArg | DeviceArg | LayoutArg
    | MemoryFormatArg | ListArg,
    Field(discriminator="kind"),
]
ListArg.model_rebuild()


# ---------------------------------------------------------------- tensors and graphs


class TensorSpec(_Model):
    """What a tensor input looks like. The worker re-derives everything downstream of these."""

    dtype: str
    sizes: list[SizeValue] = Field(max_length=MAX_RANK)
    strides: list[SizeValue] = Field(max_length=MAX_RANK)
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
    def _sizes(cls, v: list[int | str]) -> list[int | str]:
        ints = [s for s in v if isinstance(s, int)]
        if any(s < 0 or s > MAX_DIM for s in ints):
            raise ValueError(f"sizes must lie in [0, 2**40]: {v}")
        if math.prod(ints) > MAX_DIM:
            raise ValueError(f"tensor of {math.prod(ints)} elements exceeds the limit of 2**40")
        return v

    @field_validator("strides")
    @classmethod
    def _strides(cls, v: list[int | str]) -> list[int | str]:
        if any(abs(s) > MAX_DIM for s in v if isinstance(s, int)):
            raise ValueError(f"strides must lie in [-2**40, 2**40]: {v}")
        return v

    @model_validator(mode="after")
    def _rank(self) -> TensorSpec:
        if len(self.sizes) != len(self.strides):
            raise ValueError(f"{len(self.sizes)} sizes but {len(self.strides)} strides")
        return self


    @property
    def symbolic(self) -> bool:
        return any(isinstance(s, str) for s in (*self.sizes, *self.strides))


class Placeholder(_Model):
    """A graph input: a tensor (`spec`) or an integer size (`symbol`, a SymInt input)."""

    name: Name
    spec: TensorSpec | None = None
    symbol: str | None = Field(default=None, pattern=_SYMBOL)

    @model_validator(mode="after")
    def _one_kind(self) -> Placeholder:
        if (self.spec is None) == (self.symbol is None):
            raise ValueError(f"placeholder {self.name!r} needs exactly one of spec and symbol")
        return self


class SymbolSpec(_Model):
    """A size symbol of the graph and the range Dynamo allows it (hi None: unbounded)."""

    name: str = Field(pattern=_SYMBOL)
    lo: int = Field(default=2, ge=0, le=MAX_DIM)
    hi: int | None = Field(default=None, ge=0, le=MAX_DIM)


class OpaqueOp(_Model):
    """What the worker knows of an op outside aten/prims (a torch.library custom op), which only
    the client runs (compiler_core.opaque): its schema text, parsed by fxcc's grammar and never
    looked up, and its outputs' specs as the client's fake kernel made them (None: no tensor)."""

    op_schema: str = Field(max_length=4096)
    functional: bool = False  # AOTAutograd's auto_functionalized form of an op that writes arguments
    outputs: list[TensorSpec | None] = Field(max_length=MAX_LIST)


class UserKernel(_Model):
    """A user's @triton.jit kernel (Dynamo's triton_kernel_wrapper_functional), which only the client
    launches: named by a stable identity, never shipped as code (compiler_core.opaque). The node's
    kwargs are the kernel's arguments; its value is the tuple of the `cloned` ones after the launch,
    whose specs `outputs` gives (as their inputs are laid out)."""

    module: str = Field(max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")
    qualname: str = Field(max_length=256, pattern=r"^[A-Za-z_<>][A-Za-z0-9_.<>]*$")
    source_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    grid: list[SizeValue] = Field(min_length=1, max_length=3)
    cloned: list[Name] = Field(max_length=64)
    outputs: list[TensorSpec] = Field(max_length=64)


MAX_DEPTH = 4  # graphs nested in control flow, the outer one included
MAX_MOD_NODES = 256  # nodes of one flex_attention score_mod / mask_mod / joint graph


class FlexAttention(_Model):
    """torch's flex_attention (`forward`) or its backward (`backward`), which AOTAutograd emits for
    training (compiler_core.flex). Its score_mod, mask_mod and (backward) joint graph travel as
    restricted graphs of allow-listed aten ops over 0-dim tensors (score, b, h, q_idx, kv_idx, ...)
    and the captured tensors, never as code. The node's args: forward [q, k, v, block, scale,
    score_buffers, mask_buffers]; backward [q, k, v, out, lse, grad_out, grad_lse, block, scale,
    score_buffers, mask_buffers], where `block` is the BlockMask's tuple without its mask_mod
    (Q_LEN, KV_LEN, its eight block tensors or None, None fields, Q_BLOCK_SIZE, KV_BLOCK_SIZE).
    The worker derives every output's spec itself (compiler_core.flex.FlexTarget)."""

    kind: Literal["forward", "backward"]
    score_mod: GraphSpec
    mask_mod: GraphSpec
    joint: GraphSpec | None = None  # backward only: d score_mod, inputs [score, b, h, m, n, grad, *buffers]
    n_outputs: int = Field(default=3, ge=2, le=3)  # forward: (out, lse) or (out, lse, max_scores)
    kernel_options: dict[Name, bool | int | float | Annotated[str, Field(max_length=32, pattern=r"^[A-Za-z0-9_]*$")]] = \
        Field(default_factory=dict, max_length=32)

    def check(self, target: str, n_args: int) -> None:
        """ValueError unless the node's target and arguments fit this kind and its graphs are small."""
        want = {"forward": ("higher_order.flex_attention", 7), "backward": ("higher_order.flex_attention_backward", 11)}
        name, args = want[self.kind]
        if target != name or n_args != args:
            raise ValueError(f"flex_attention {self.kind} node is {target} with {n_args} args, not {name} with {args}")
        if (self.joint is None) != (self.kind == "forward"):
            raise ValueError("a flex_attention backward, and only it, carries a joint graph")
        for g in (self.score_mod, self.mask_mod, self.joint):
            if g is None:
                continue
            if len(g.nodes) > MAX_MOD_NODES:
                raise ValueError(f"a flex_attention subgraph holds more than {MAX_MOD_NODES} nodes")
            if g.symbols or any(n.opaque or n.triton or n.control or n.flex for n in g.nodes):
                raise ValueError("a flex_attention subgraph holds sizes symbols or nodes other than aten ops")


class ControlFlow(_Model):
    """torch.cond or while_loop: its subgraphs, compiled as graphs of their own, which the plan picks
    or loops over at run time. cond: args [pred, *operands], graphs [true, false]; while_loop: args
    [*carried, *additional], graphs [cond, body], the first `carried` args carried. `outputs`: the
    specs of the node's results (each subgraph's outputs match them; the client checks)."""

    kind: Literal["cond", "while_loop"]
    graphs: list[GraphSpec] = Field(min_length=2, max_length=2)
    # Per graph, its size symbols' example values (for the compiler's heuristics; not in the key).
    hints: list[dict[str, int]] = Field(default_factory=list, max_length=2)
    carried: int = Field(default=0, ge=0, le=MAX_LIST)
    outputs: list[TensorSpec] = Field(max_length=MAX_LIST)

    def check(self, target: str, n_args: int) -> None:
        """ValueError unless the node's target, arguments and subgraphs fit together."""
        if target != f"control.{self.kind}":
            raise ValueError(f"control flow target {target!r} is not control.{self.kind}")
        first, second = self.graphs
        if self.kind == "cond":
            if n_args < 1 or any(len(g.placeholders) != n_args - 1 for g in self.graphs):
                raise ValueError("cond's branches take other inputs than its operands")
            if any(len(g.outputs) != len(self.outputs) for g in self.graphs):
                raise ValueError("cond's branches give other outputs than the node")
        else:
            if any(len(g.placeholders) != n_args for g in self.graphs) or not 0 < self.carried <= n_args:
                raise ValueError("while_loop's graphs take other inputs than its carried and additional ones")
            if len(first.outputs) != 1 or len(second.outputs) != self.carried or len(self.outputs) != self.carried:
                raise ValueError("while_loop's cond must give one value and its body the carried ones")
        depth, nodes = nested_size(first)
        depth2, nodes2 = nested_size(second)
        if 1 + max(depth, depth2) > MAX_DEPTH:
            raise ValueError(f"control flow nested deeper than {MAX_DEPTH} graphs")
        if nodes + nodes2 > MAX_NODES:
            raise ValueError(f"control flow subgraphs hold more than {MAX_NODES} nodes")


def nested_size(graph: GraphSpec) -> tuple[int, int]:
    """(depth, nodes) of `graph` with the subgraphs of its control flow nodes (and flex_attention's mods)."""
    depth, nodes = 1, len(graph.nodes)
    for n in graph.nodes:
        if n.flex is not None:
            nodes += sum(len(g.nodes) for g in (n.flex.score_mod, n.flex.mask_mod, n.flex.joint) if g is not None)
        if n.control is not None:
            for g in n.control.graphs:
                d, k = nested_size(g)
                depth, nodes = max(depth, 1 + d), nodes + k
    return depth, nodes


class Node(_Model):
    name: Name
    target: str = Field(max_length=200)
    args: list[Arg] = Field(default_factory=list, max_length=64)
    kwargs: dict[Name, Arg] = Field(default_factory=dict)
    opaque: OpaqueOp | None = None  # set for (and only for) an op outside aten/prims
    triton: UserKernel | None = None  # set for (and only for) a user's Triton kernel
    control: ControlFlow | None = None  # set for (and only for) torch.cond / while_loop
    flex: FlexAttention | None = None  # set for (and only for) flex_attention and its backward

    @model_validator(mode="after")
    def _opaque(self) -> Node:
        from fxcc.compiler_core.opaque import check_opaque_node, check_user_kernel

        if sum(x is not None for x in (self.opaque, self.triton, self.control, self.flex)) > 1:
            raise ValueError(f"node {self.name} is more than one of an opaque op, a Triton kernel, control flow, "
                             "flex_attention")
        if self.flex is not None:
            self.flex.check(self.target, len(self.args))
        if self.control is not None:
            self.control.check(self.target, len(self.args))
        if self.opaque is not None:
            check_opaque_node(self.target, self.opaque.op_schema, self.opaque.functional, len(self.opaque.outputs),
                              [o is not None for o in self.opaque.outputs])
        if self.triton is not None:
            check_user_kernel(self.target, self.triton.cloned, len(self.triton.outputs), list(self.kwargs), self.args)
        return self


class GraphSpec(_Model):
    """An aten-level graph: inputs with their specs, nodes in topological order, outputs."""

    schema_version: Literal[1] = SCHEMA_VERSION
    symbols: list[SymbolSpec] = Field(default_factory=list, max_length=256)
    placeholders: list[Placeholder] = Field(max_length=MAX_NODES)
    nodes: list[Node] = Field(max_length=MAX_NODES)
    outputs: list[Arg] = Field(max_length=MAX_NODES)
    # Outputs whose memory layout the compiler may choose (a training forward's tensors saved for
    # its backward: AOTAutograd lays the backward's inputs out as the plan reports, Plan.output_strides).
    free_layout_outputs: list[int] = Field(default_factory=list, max_length=MAX_NODES)

    @model_validator(mode="after")
    def _references(self) -> GraphSpec:
        """Every name is defined once and every reference points to an earlier definition;
        every size symbol used is declared."""
        _check_symbols(self)
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
        free = self.free_layout_outputs
        if len(set(free)) != len(free) or any(not 0 <= i < len(self.outputs) for i in free):
            raise ValueError("free_layout_outputs must name distinct outputs by position")
        return self


ControlFlow.model_rebuild()
FlexAttention.model_rebuild()
Node.model_rebuild()


def check_size_expr(text: str) -> str:
    """`text` if it is a size expression in fxcc's grammar (no relation), else ValueError."""
    from fxcc.compiler_core.symexpr import Rel, SymExprError, parse

    try:
        expr = parse(text)
    except SymExprError as e:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ValueError(f"bad size expression {shown!r}: {e}") from None
    if isinstance(expr, Rel):
        raise ValueError(f"size expression {text!r} is a relation")  # noqa: TRY004 - pydantic wants ValueError
    return text


def size_symbols(text: str) -> frozenset[str]:
    from fxcc.compiler_core.symexpr import parse

    return parse(text).symbols


def _check_symbols(graph: GraphSpec) -> None:
    declared = [s.name for s in graph.symbols]
    if len(set(declared)) != len(declared):
        raise ValueError("a size symbol is declared twice")
    for s in graph.symbols:
        if s.hi is not None and s.hi < s.lo:
            raise ValueError(f"symbol {s.name} has an empty range [{s.lo}, {s.hi}]")
    known = set(declared)
    texts: list[str] = []
    for p in graph.placeholders:
        if p.symbol is not None:
            texts.append(p.symbol)
        elif p.spec is not None:
            texts += [x for x in (*p.spec.sizes, *p.spec.strides) if isinstance(x, str)]
    for n in graph.nodes:
        texts += _sym_texts([*n.args, *n.kwargs.values()])
        outs = n.opaque.outputs if n.opaque else n.triton.outputs if n.triton else n.control.outputs if n.control else []
        texts += [x for o in outs if o is not None for x in (*o.sizes, *o.strides) if isinstance(x, str)]
        if n.triton is not None:
            texts += [x for x in n.triton.grid if isinstance(x, str)]
    texts += _sym_texts(graph.outputs)
    for t in texts:
        unknown = size_symbols(check_size_expr(t)) - known
        if unknown:
            raise ValueError(f"size expression {t!r} uses undeclared symbols {sorted(unknown)}")
    bound = {p.symbol for p in graph.placeholders if p.symbol is not None}
    bound |= {s for p in graph.placeholders if p.spec is not None for s in p.spec.sizes if isinstance(s, str)}
    unbound = known - bound
    if unbound:
        raise ValueError(f"size symbols {sorted(unbound)} are neither an input nor an input's size")


def _sym_texts(args: list[Any]) -> list[str]:
    """Every size expression in `args`, lists included."""
    return [a.expr for a in _leaves(args) if isinstance(a, SymArg)]


def _refs(args: list[Any]) -> list[str]:
    """Every node name `args` refer to, lists included."""
    return [a.name for a in _leaves(args) if isinstance(a, NodeRef)]


def _leaves(args: list[Any]) -> list[Any]:
    out: list[Any] = []
    for a in args:
        out.extend(_leaves(a.items) if isinstance(a, ListArg) else [a])
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
    # The client's fp32 matmul precision (torch.backends.cuda.matmul.allow_tf32, or fp32_precision
    # == "tf32") when it compiled: fxcc's own fp32 kernels may round matmul inputs to TF32 only
    # when eager would. Part of the key, so flipping the flag never reuses the other artifact.
    allow_tf32: bool = False


class CompileRequest(_Model):
    schema_version: Literal[1] = SCHEMA_VERSION
    graph: GraphSpec
    options: CompileOptions = Field(default_factory=CompileOptions)
    priority: Literal["interactive", "precompile"] = "interactive"
    # Note: the example's size values, for the compiler's heuristics; not part of the key (one
    # artifact serves every size its guards admit), so a compile never depends on them for
    # correctness.
    hints: dict[str, int] = Field(default_factory=dict, max_length=256)
    # A variant: compiled for sizes the first artifact's guards rejected; its key covers `hints`.
    variant: bool = False

    @model_validator(mode="after")
    def _hints(self) -> CompileRequest:
        declared = {s.name for s in self.graph.symbols}
        if set(self.hints) - declared:
            raise ValueError(f"hints for undeclared symbols {sorted(set(self.hints) - declared)}")
        for name, v in self.hints.items():
            if not 0 <= v <= MAX_DIM:
                raise ValueError(f"hint {name}={v} out of range")
        return self


# ---------------------------------------------------------------- target resolution


def resolve_target(target: str, node: str | None = None) -> Any:
    """The callable a node's target names: an aten/prims OpOverload that compiler_core.op_policy
    allows (functional ops), one of fxcc's own ops (compiler_core.fxcc_ops.OPS, an explicit
    list), or operator.getitem.

    Raises InvalidGraph (a 422 in the service) naming the op for anything else. Resolution is attribute lookup on torch.ops.aten /
    torch.ops.prims after a strict grammar check, so no text reaches an interpreter.
    """
    import torch

    if target == "getitem":
        return operator.getitem
    if target.startswith("fxcc."):
        from fxcc.compiler_core import fxcc_ops

        if target not in fxcc_ops.OPS:
            raise InvalidGraph(f"unknown fxcc op {target!r}", op=target, node=node)
        _, op_name, overload_name = target.split(".")
        return getattr(getattr(torch.ops.fxcc, op_name), overload_name)
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
    reason = refusal(fn)
    if reason is not None:
        raise InvalidGraph(f"op {target} is not allowed in a graph: {reason} (compiler_core.op_policy)",
                           op=target, node=node)
    return fn


def target_name(fn: Any) -> str:
    """The wire name of an OpOverload (inverse of resolve_target)."""
    if fn is operator.getitem:
        return "getitem"
    wire = getattr(fn, "wire_name", None)  # compiler_core.opaque.OpaqueTarget
    if isinstance(wire, str):
        return wire
    ns = fn.namespace
    return f"{ns}.{fn._opname}.{fn._overloadname}"


def plain_arg(a: Any) -> Arg | None:
    """A plain Python value an aten op takes (a number, None, a short string, a dtype, a device,
    the strided layout, a memory format) as a wire argument; None for any other value."""
    import torch

    if isinstance(a, bool):
        return BoolArg(value=a)
    if isinstance(a, int):
        return IntArg(value=a)
    if isinstance(a, float):
        return FloatArg(value=a if math.isfinite(a) else "nan" if math.isnan(a) else "inf" if a > 0 else "-inf")
    if a is None:
        return NoneArg()
    if isinstance(a, str):
        return StrArg(value=a)
    if isinstance(a, torch.dtype):
        return DtypeArg(value=dtype_name(a))
    if isinstance(a, torch.device):
        return DeviceArg(value=a.type)
    if isinstance(a, torch.layout) and a == torch.strided:
        return LayoutArg(value="strided")
    if isinstance(a, torch.memory_format):
        return MemoryFormatArg(value=str(a).removeprefix("torch."))
    return None


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, DTYPES[name])


def dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise InvalidGraph(f"dtype {name} cannot travel")
    return name

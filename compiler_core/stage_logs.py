"""Every stage of a compile, printable: `FXCC_LOGS=graph,ir,schedule,kernels,plan,guards` (any
subset, or `all`) prints them per graph through the loggers `fxcc.logs.<stage>`, as TORCH_LOGS does
for Inductor (`output_code`, `schedule`, ...).

- graph: the aten graph after fxcc's passes, one node a line with its result's dtype and sizes.
- ir: the loop IR, each computed buffer with its body rendered op by op (PrintingHandler).
- schedule: which nodes fused into which kernel, what each stores, and why each kernel ended
  where it did (the next node's refusal, in words); the extern calls between them.
- kernels: each kernel's Triton source.
- plan: the plan's steps, one a line.
- guards: the size symbols' bindings and the guards the client checks before each run.

The compile runs where the request goes (the worker's compile process, or in-process with no
service): set FXCC_LOGS there. Without it nothing is formatted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import sympy

from fxcc.compiler_core.ir.nodes import ComputedBuffer, Reduction, index_vars
from fxcc.compiler_core.ir.ops import OpsHandler, use_handler

STAGES = ("graph", "ir", "schedule", "kernels", "plan", "guards")


def logger(stage: str) -> logging.Logger:
    return logging.getLogger(f"fxcc.logs.{stage}")


def configure(spec: str | None = None) -> set[str]:
    """Turn on the stages `spec` names (default: FXCC_LOGS), each logger at INFO with a stderr
    handler of its own unless logging elsewhere already reaches it; the stages turned on. An
    unknown name is a ValueError naming the known ones."""
    spec = os.environ.get("FXCC_LOGS", "") if spec is None else spec
    names = {n.strip() for n in spec.split(",") if n.strip()}
    if "all" in names:
        names = (names - {"all"}) | set(STAGES)
    unknown = sorted(names - set(STAGES))
    if unknown:
        raise ValueError(f"FXCC_LOGS names unknown stages {unknown}; known: {', '.join(STAGES)}, all")
    for stage in set(STAGES) - names:
        # Note: off unless named (or given a level of their own by the process's logging setup),
        # whatever the root logger's level: a service logging at INFO (`fxcc serve`) formatted
        # every stage of every compile, the loop IR included.
        if logger(stage).level == logging.NOTSET:
            logger(stage).setLevel(logging.WARNING)
    for stage in names:
        log = logger(stage)
        log.setLevel(logging.INFO)
        if not log.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("[fxcc %(name)s] %(message)s"))
            log.addHandler(handler)
            log.propagate = False
    return names


_configured = False


# ---------------------------------------------------------------- the artifact's stage log

# What an artifact keeps of its compile for the service to show (the compile explorer): the aten
# graph, the schedule with its fusion decisions, the plan and the guards; the loop IR and the
# kernels' sources are not kept (the sources are blobs of their own). Each stage's text is cut at
# RECORD_MAX_CHARS, saying so: the log stays small next to the kernels it describes.
RECORDED = ("graph", "schedule", "plan", "guards")
RECORD_MAX_CHARS = 32_768
_RECORDING: ContextVar[list[dict[str, str]] | None] = ContextVar("fxcc_stage_record", default=None)


@contextlib.contextmanager
def recording() -> Iterator[list[dict[str, str]]]:
    """Record the RECORDED stages of the compiles inside (each {"stage", "title", "text"}), whether
    or not FXCC_LOGS prints them."""
    entries: list[dict[str, str]] = []
    token = _RECORDING.set(entries)
    try:
        yield entries
    finally:
        _RECORDING.reset(token)


def stage_log_json(entries: list[dict[str, str]]) -> bytes:
    """The stage log as an artifact stores it (a blob the manifest names)."""
    return json.dumps({"schema": 1, "stages": entries}, sort_keys=True, separators=(",", ":")).encode()


_BUDGET: ContextVar[int | None] = ContextVar("fxcc_stage_budget", default=None)


def _cut(text: str) -> str:
    if len(text) <= RECORD_MAX_CHARS:
        return text
    return text[:RECORD_MAX_CHARS] + f"\n... ({len(text) - RECORD_MAX_CHARS} more characters not kept)"


def _joined(lines: Iterable[str], total: int) -> str:
    """`lines` joined, stopping once past the budget of a recording-only emit (of `total` lines):
    a big graph's stage log costs no more to make than the part of it that is kept."""
    budget, out, size = _BUDGET.get(), [], 0
    for line in lines:
        out.append(line)
        size += len(line) + 1
        if budget is not None and size > budget:
            out.append(f"... ({total - len(out)} more lines not kept)")
            break
    return "\n".join(out)


def emit(stage: str, title: str, text: Callable[[], str]) -> None:
    """Log `text()` (formatted only when `stage` is on, or is recorded) under a title naming the graph."""
    global _configured
    if not _configured:
        _configured = True
        try:
            configure()
        except ValueError as e:
            logging.getLogger("fxcc.compile").warning("%s", e)
    log = logger(stage)
    entries = _RECORDING.get() if stage in RECORDED else None
    if not log.isEnabledFor(logging.INFO) and entries is None:
        return
    printing = log.isEnabledFor(logging.INFO)
    token = _BUDGET.set(None if printing else RECORD_MAX_CHARS - 256)
    try:
        body = text()
    finally:
        _BUDGET.reset(token)
    if printing:
        log.info("===== %s: %s =====\n%s", stage, title, body)
    if entries is not None:
        entries.append({"stage": stage, "title": title, "text": _cut(body)})


# ---------------------------------------------------------------- the formats


def format_graph(gm: Any) -> str:
    """The FX graph: `name = target(args)  # dtype[sizes]` a node."""
    def lines() -> Iterator[str]:
        for node in gm.graph.nodes:
            val = node.meta.get("val")
            shape = f"  # {_describe(val)}" if val is not None else ""
            if node.op == "placeholder":
                yield f"{node.name}: input{shape}"
            elif node.op == "output":
                yield f"return {_args(node.args[0])}"
            else:
                yield f"{node.name} = {_target(node.target)}({_args(node.args, node.kwargs)}){shape}"
    return _joined(lines(), len(gm.graph.nodes))


def format_ir(lowered: Any) -> str:
    """The loop IR's program in order: computed buffers with their bodies, extern calls."""
    out = []
    for item in lowered.program:
        if isinstance(item, ComputedBuffer):
            out.append(format_node(item))
        else:
            out.append(f"{item.out} = extern {item.op}({_args(item.args, item.kwargs)})")
    return "\n".join(out)


def format_node(node: ComputedBuffer) -> str:
    """One computed buffer: its kind, dtype, ranges and its body, one op a line."""
    data, b = node.data, node.buffer
    printer = PrintingHandler()
    with use_handler(printer):
        if isinstance(data, Reduction):
            index, rindex = index_vars("i", data.ranges), index_vars("r", data.reduction_ranges)
            value = data.inner_fn(index, rindex)
            head = (f"{node.name}: Reduction {data.reduction_type} {_dtype(data.dtype)} ranges={list(data.ranges)} "
                    f"reduction_ranges={list(data.reduction_ranges)}")
            last = f"{data.reduction_type} over {', '.join(map(str, rindex)) or '()'}: {value}"
        else:
            index = index_vars("i", data.ranges)
            value = data.inner_fn(index)
            head = f"{node.name}: Pointwise {_dtype(data.dtype)} ranges={list(data.ranges)}"
            last = f"store {value}"
    where = f"  -> {_dtype(b.dtype)}{list(b.sizes)} strides={list(b.strides)}"
    body = "\n".join(f"    {line}" for line in [*printer.lines, last])
    return f"{head}{where}\n{body}"


def format_schedule(items: Sequence[Any]) -> str:
    """Kernels and extern calls in launch order; for each kernel its nodes, stores and why it ended."""
    from fxcc.compiler_core.scheduler import Kernel

    def lines() -> Iterator[str]:
        for i, item in enumerate(items):
            if isinstance(item, Kernel):
                kind = "looped" if item.looped else "persistent" if item.rnumel != 1 else "pointwise"
                yield (f"[{i}] kernel ({kind}, x={item.xnumel}, r={item.rnumel}): "
                       f"{', '.join(n.name for n in item.nodes)}\n"
                       f"      stores: {', '.join(sorted(item.stored)) or 'nothing'}"
                       + (f"\n      into inputs: {', '.join(f'{b} -> {i}' for b, i in sorted(item.into_inputs.items()))}"
                          if item.into_inputs else "")
                       + (f"\n      ended: {item.closed_by}" if item.closed_by else ""))
            else:
                yield f"[{i}] extern {item.op} -> {item.out}"
    return _joined(lines(), len(items))


def format_kernels(rendered: dict[int, Any]) -> str:
    return "\n\n".join(f"# kernel {rk.name} (num_warps={rk.num_warps}, num_stages={rk.num_stages})\n{rk.source}"
                       for _, rk in sorted(rendered.items()))


def format_plan(plan: Any) -> str:
    """The plan's steps, one a line."""
    def lines() -> Iterator[str]:
        yield f"inputs: {', '.join(plan.inputs)}"
        for step in plan.steps:
            fields = step.model_dump(exclude={"kind"}, exclude_defaults=True, mode="json")
            yield f"{step.kind:7s} {fields}"
        yield f"outputs: {[a.model_dump(mode='json') for a in plan.outputs]}"
    return _joined(lines(), len(plan.steps) + 2)


def format_guards(plan: Any) -> str:
    if not plan.symbols and not plan.guards:
        return "static sizes: the plan runs for exactly the example's sizes (the client's key says so)"
    out = [f"{s.name}: input {s.input}" + (f" dim {s.dim}" if s.dim is not None else "") + f", [{s.lo}, {s.hi}]"
           for s in plan.symbols]
    return "\n".join([*out, *plan.guards])


# ---------------------------------------------------------------- rendering a body


class PrintingHandler(OpsHandler):
    """Renders a loop body as lines of `tmpN = op(...)`; values are the names of temporaries."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._count = 0
        self._indirect = 0

    def _emit(self, text: str) -> str:
        name = f"tmp{self._count}"
        self._count += 1
        self.lines.append(f"{name} = {text}")
        return name

    def load(self, name: str, index: sympy.Expr) -> Any:
        return self._emit(f"load({name}, {index})")

    def constant(self, value: bool | float, dtype: Any) -> Any:
        return self._emit(f"constant({value}, {_dtype(dtype)})")

    def index_expr(self, expr: sympy.Expr, dtype: Any) -> Any:
        return self._emit(f"index_expr({expr}, {_dtype(dtype)})")

    def to_dtype(self, x: Any, dtype: Any) -> Any:
        return self._emit(f"to_dtype({x}, {_dtype(dtype)})")

    def unary(self, op: str, x: Any) -> Any:
        return self._emit(f"{op}({x})")

    def binary(self, op: str, a: Any, b: Any) -> Any:
        return self._emit(f"{op}({a}, {b})")

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return self._emit(f"where({cond}, {a}, {b})")

    def indirect_indexing(self, x: Any, size: int) -> sympy.Symbol:
        sym = sympy.Symbol(f"ind{self._indirect}", integer=True, nonnegative=True)
        self._indirect += 1
        self.lines.append(f"{sym} = indirect({x}, size={size})")
        return sym

    def masked(self, mask: Any, body: Callable[[], Any], other: bool | float) -> Any:
        self.lines.append(f"masked by {mask} (else {other}):")
        start = len(self.lines)
        value = body()
        self.lines[start:] = [f"  {line}" for line in self.lines[start:]]
        return self._emit(f"masked_value({value}, else={other})")


def _dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _describe(val: Any) -> str:
    if hasattr(val, "dtype") and hasattr(val, "shape"):
        return f"{_dtype(val.dtype)}{list(val.shape)}"
    if isinstance(val, (list, tuple)):
        return "(" + ", ".join(_describe(v) for v in val) + ")"
    return type(val).__name__


def _target(target: Any) -> str:
    return str(getattr(target, "__name__", target)) if not hasattr(target, "_opname") else str(target)


def _args(args: Any, kwargs: dict[str, Any] | None = None) -> str:
    parts = [_arg(a) for a in (args if isinstance(args, (list, tuple)) else [args])]
    parts += [f"{k}={_arg(v)}" for k, v in (kwargs or {}).items()]
    return ", ".join(parts)


def _arg(a: Any) -> str:
    if hasattr(a, "kind") and hasattr(a, "model_dump"):  # a wire Arg
        d = a.model_dump()
        if d.get("kind") == "node":
            return str(d["name"])
        if d.get("kind") == "list":
            return "[" + ", ".join(_arg(x) for x in a.items) + "]"
        return str(d.get("value", d.get("expr", d)))
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_arg(x) for x in a) + "]"
    return str(getattr(a, "name", a))

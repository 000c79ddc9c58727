"""Runs an artifact's plan: extern aten calls and Triton kernels, over the caller's tensors.

Note: the plan is data. Extern steps resolve their op exactly as the worker resolves graph
nodes (aten/prims overloads only). Kernel code is loaded only from blobs whose sha256 matches
the manifest (Artifact.verify runs before anything is loaded).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fxcc.client.process_groups import bind_group
from fxcc.compiler_core.artifact import (
    AllocStep,
    Artifact,
    ExternStep,
    FreeStep,
    KernelInfo,
    KernelStep,
    Plan,
    atomic_write,
)
from fxcc.compiler_core.collectives import group_slot
from fxcc.compiler_core.errors import ArtifactError
from fxcc.compiler_core.graph import decode_arg
from fxcc.compiler_core.symexpr import compile_exprs, parse
from fxcc.compiler_core.triton_lock import TRITON_LOCK, repair_interpreter
from fxcc.compiler_core.wire import IntArg, ListArg, NodeRef, SymArg, resolve_target, torch_dtype

log = logging.getLogger("fxcc.runtime")

_module_lock = threading.Lock()
_modules: dict[str, Any] = {}


def kernel_dir() -> Path:
    """Where verified kernel sources are written so that triton.jit can read them back."""
    root = os.environ.get("FXCC_CACHE_DIR") or os.path.join(Path.home(), ".cache", "fxcc")
    return Path(root) / "kernels"


def load_kernel(info: KernelInfo, source: bytes, interpret: bool = False) -> Any:
    """The @triton.jit function `info.name` from a verified source blob (cached per digest).

    triton.jit needs the function's source file (it reads it with inspect), so the blob is
    written to a file named by its digest and imported from there.
    """
    digest = info.source.digest
    key = f"{digest}:{info.name}"
    with _module_lock:
        mod = _modules.get(digest)
        if mod is None:
            path = kernel_dir() / f"fxcc_{digest[:32]}.py"
            if not path.exists() or path.read_bytes() != source:
                atomic_write(path, source)
            spec = importlib.util.spec_from_file_location(f"fxcc_kernels_{digest[:32]}", path)
            if spec is None or spec.loader is None:
                raise ArtifactError(f"cannot load kernel module {path}")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            with TRITON_LOCK:
                spec.loader.exec_module(mod)
            _modules[digest] = mod
    fn = getattr(mod, info.name, None)
    if fn is None:
        raise ArtifactError(f"kernel {info.name} is not in its source blob", node=key)
    if interpret:
        # Triton's CPU interpreter, whatever TRITON_INTERPRET said when the module was imported.
        from triton.runtime.interpreter import InterpretedFunction

        repair_interpreter()

        if not isinstance(fn, InterpretedFunction):
            fn = InterpretedFunction(fn.fn)
    return fn


class PlanRunner:
    """A callable over input tensors that runs one artifact's plan and returns its outputs."""

    def __init__(self, artifact: Artifact, plan: Plan | None = None, groups: tuple[str, ...] = ()) -> None:
        """`plan`: one of the artifact's control flow subplans (else its plan; verified once, here);
        `groups`: the caller's process groups that the plan's collectives bind (group0, ...)."""
        if plan is None:
            artifact.verify()
        self.manifest = artifact.manifest
        plan = plan or self.manifest.plan
        self.inputs = plan.inputs
        infos = {k.name: k for k in self.manifest.kernels}
        interpret = self.manifest.target.kind == "interpret"
        arch = cuda_arch_key() if self.manifest.target.kind == "cuda" else None
        cubins: dict[str, Any] = {}
        self._steps: list[Callable[[dict[str, Any]], None]] = []
        self._symbols = SymbolReader(plan) if plan.symbols else None
        for step in plan.steps:
            if isinstance(step, ExternStep) and step.control is not None:
                from fxcc.client.control_flow import control_step

                self._steps.append(control_step(step, lambda sub: PlanRunner(artifact, sub, groups), SYMS))
            elif isinstance(step, ExternStep) and step.flex is not None:
                from fxcc.client.flex_attention import flex_step

                self._steps.append(flex_step(step, SYMS))
            elif isinstance(step, ExternStep):
                self._steps.append(self._extern(step, groups))
            elif isinstance(step, KernelStep):
                info = infos.get(step.kernel)
                if info is None:
                    raise ArtifactError(f"plan launches unknown kernel {step.kernel}")
                run = _cubin_step(step, info, artifact, arch, cubins) if arch else None
                if run is None:
                    fn = load_kernel(info, artifact.blobs[info.source.digest], interpret)
                    run = self._kernel(step, info, fn)
                self._steps.append(run)
            elif isinstance(step, AllocStep):
                self._steps.append(self._alloc(step))
            elif isinstance(step, FreeStep):
                self._steps.append(self._free(step))
        self._outputs = plan.outputs
        # names and constants (a backward's None gradients) read as extern arguments are: decoded once
        self._output_readers = [_arg_reader(a) for a in plan.outputs]
        # the common case, outputs that are all plan values: read by name, no decoding per call
        self._output_names = ([a.name for a in plan.outputs]
                              if all(isinstance(a, NodeRef) for a in plan.outputs) else None)
        self._first_tensor = 0  # where the device is read from (the first tensor input seen)
        self.proven = False  # a call ran to its end: `steal` lets its inputs go from the next call on
        # (step index, result name) of each extern step: what `call_measured` weighs
        self._extern_outs = [(i, step.out) for i, step in enumerate(plan.steps) if isinstance(step, ExternStep)]

    @staticmethod
    def _extern(step: ExternStep, groups: tuple[str, ...] = ()) -> Callable[[dict[str, Any]], None]:
        if step.opaque is not None or step.triton is not None:
            return _opaque_step(step, groups)
        target = resolve_target(step.op, node=step.out)
        op = _direct(target)
        if not step.kwargs:
            op = VIEW_METHODS.get(step.op, op)
        out = step.out
        expect = _expected_strides(step)
        args = [_arg_reader(a) for a in step.args]
        if op is not target:  # a C++ binding: it reads a constant list, never keeps or changes it
            args = [(kind, tuple(x)) if kind is _CONST and isinstance(x, list) else (kind, x) for kind, x in args]
        kwargs = {k: _arg_reader(v) for k, v in step.kwargs.items()}
        if expect is None and not kwargs and all(kind is _REF for kind, _ in args):
            names = [x for _, x in args]

            def run_refs(env: dict[str, Any]) -> None:  # the common case: tensors only
                env[out] = op(*[env[n] for n in names])
            return run_refs

        if not kwargs and all(kind is not _DYNAMIC for kind, _ in args):
            # Tensors and constants only (a convolution: input, weight, then its ints): the
            # constants sit in a template once; each call fills in the tensors. Constant lists
            # are copied per call for a Python op (it never shares ours); a C++ binding's are
            # tuples, shared.
            template = [None if kind is _REF else x for kind, x in args]
            refs = [(i, x) for i, (kind, x) in enumerate(args) if kind is _REF]
            lists = [i for i, (kind, x) in enumerate(args) if kind is _CONST and isinstance(x, list)]
            fixed = expect(None) if expect is not None and not step_symbolic(step) else None

            if fixed is not None and not lists:
                def run_laid_out(env: dict[str, Any]) -> None:  # the common case: mm, addmm, convolution
                    call = template.copy()
                    for i, n in refs:
                        call[i] = env[n]
                    value = op(*call)
                    if type(value) is not torch.Tensor or value.stride() != fixed:
                        value = _in_layout(value, fixed, step)
                    env[out] = value
                return run_laid_out

            def run_template(env: dict[str, Any]) -> None:
                call = template.copy()
                for i, n in refs:
                    call[i] = env[n]
                for i in lists:
                    call[i] = list(call[i])
                value = op(*call)
                if fixed is not None:
                    value = _in_layout(value, fixed, step)
                elif expect is not None:
                    value = _in_layout(value, expect(env.get(SYMS)), step)
                env[out] = value
            return run_template

        def run(env: dict[str, Any]) -> None:
            syms = env.get(SYMS)
            value = op(*[_read(kind, x, env, syms) for kind, x in args],
                       **{k: _read(kind, x, env, syms) for k, (kind, x) in kwargs.items()})
            env[out] = value if expect is None else _in_layout(value, expect(syms), step)
        return run

    @staticmethod
    def _kernel(step: KernelStep, info: KernelInfo, fn: Any) -> Callable[[dict[str, Any]], None]:
        launch_kw = dict(info.constexprs, num_warps=info.num_warps, num_stages=info.num_stages)
        if _symbolic_step(step):
            return _symbolic_kernel(step, fn, launch_kw)
        grid = tuple(step.grid)
        names = [(a.name if isinstance(a, NodeRef) else None, a.value if isinstance(a, IntArg) else None)
                 for a in step.args]
        launch = fn[grid]
        if not _is_interpreted(fn):
            def run(env: dict[str, Any]) -> None:
                launch(*(env[n] if n is not None else v for n, v in names), **launch_kw)
            return run

        repair_interpreter()

        def run_interpreted(env: dict[str, Any]) -> None:
            with TRITON_LOCK:  # the interpreter patches triton.language module-wide
                launch(*(env[n] if n is not None else v for n, v in names), **launch_kw)
        return run_interpreted

    @staticmethod
    def _alloc(step: AllocStep) -> Callable[[dict[str, Any]], None]:
        spec = step.spec
        dtype = torch_dtype(spec.dtype)
        out, reuse = step.out, step.reuse
        if spec.symbolic:
            evaluate = compile_exprs([str(x) for x in (*spec.sizes, *spec.strides)])
            rank = len(spec.sizes)

            def shape(env: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
                vals = evaluate(env[SYMS])
                return tuple(vals[:rank]), tuple(vals[rank:])
        else:
            fixed = (tuple(spec.sizes), tuple(spec.strides))

            def shape(env: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
                return fixed

        if reuse is not None:
            def take(env: dict[str, Any]) -> None:
                sizes, strides = shape(env)
                env[out] = _take_storage(env.pop(reuse), sizes, strides, dtype, env["__device__"], step)
            return take

        if not spec.symbolic:  # sizes known at load: nothing to work out per call
            sizes, strides = fixed

            def run_fixed(env: dict[str, Any]) -> None:
                env[out] = env[ALLOC](sizes, strides, dtype)
            return run_fixed

        def run(env: dict[str, Any]) -> None:
            sizes, strides = shape(env)
            env[out] = torch.empty_strided(sizes, strides, dtype=dtype, device=env["__device__"])
        return run

    @staticmethod
    def _free(step: FreeStep) -> Callable[[dict[str, Any]], None]:
        names = step.names
        if len(names) == 1:
            (name,) = names

            def run_one(env: dict[str, Any]) -> None:
                env.pop(name, None)
            return run_one

        def run(env: dict[str, Any]) -> None:
            for n in names:
                env.pop(n, None)
        return run

    def __call__(self, args: list[Any]) -> tuple[Any, ...]:
        env = self.begin(args)
        for run in self._steps:
            run(env)
        return self.finish(env)

    def steal(self, args: list[Any]) -> tuple[Any, ...]:
        """A call that takes `args` over, as AOTAutograd hands a compiled graph its only list of a
        backward's inputs (steal_args): once the plan has run once, the list is emptied as soon as
        the call's values are read from it, so that each input (a saved activation) is let go after
        the last step that reads it rather than when the backward returns. Until then the list is
        left whole: the caller can still run the graph otherwise should the plan fail."""
        env = self.begin(args)
        if self.proven:
            args.clear()
        for run in self._steps:
            run(env)
        out = self.finish(env)
        self.proven = True
        return out

    def begin(self, args: list[Any]) -> dict[str, Any]:
        """The values a call starts from: its inputs by name (and its device and size symbols)."""
        if len(args) != len(self.inputs):
            raise ArtifactError(f"plan takes {len(self.inputs)} inputs, got {len(args)}")
        env: dict[str, Any] = dict(zip(self.inputs, args))
        first = args[self._first_tensor] if args else None
        if isinstance(first, torch.Tensor):
            env["__device__"] = first.device
        else:
            i = next((i for i, a in enumerate(args) if isinstance(a, torch.Tensor)), None)
            if i is not None:
                self._first_tensor = i
            env["__device__"] = self._no_input_device() if i is None else args[i].device
        env[ALLOC] = _allocator(env["__device__"])
        if self._symbols is not None:
            env[SYMS] = self._symbols(args)
        return env

    def _no_input_device(self) -> torch.device:
        """Where a plan without tensor inputs (factory ops alone) allocates: the current CUDA
        device for a CUDA artifact, else the CPU."""
        if self.manifest.target.kind == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def run_steps(self, env: dict[str, Any], start: int, stop: int | None = None) -> None:
        """Run the plan's steps [start, stop) over `env` (a CUDA graph runs a prefix, then the rest)."""
        for run in self._steps[start:stop]:
            run(env)

    def call_measured(self, args: list[Any]) -> tuple[tuple[Any, ...], int]:
        """A call, and the bytes of the fresh storages its extern steps' results took (views of
        an input or of an earlier value counted once, or not at all): the memory torch allocated
        for the plan beside its own buffers (cuda_graphs.GraphedPlan weighs its outputs by both)."""
        env = self.begin(args)
        seen = {t.untyped_storage().data_ptr() for t in args if isinstance(t, torch.Tensor)}
        fresh, at = 0, 0
        for i, out in self._extern_outs:
            self.run_steps(env, at, i + 1)
            at = i + 1
            value = env.get(out)
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    if storage.data_ptr() not in seen:
                        seen.add(storage.data_ptr())
                        fresh += storage.nbytes()
        self.run_steps(env, at)
        return self.finish(env), fresh

    def finish(self, env: dict[str, Any]) -> tuple[Any, ...]:
        """The call's outputs, read from `env` once every step has run."""
        if self._output_names is not None:
            return tuple([env[n] for n in self._output_names])
        syms = env.get(SYMS)
        return tuple([env[x] if kind is _REF else _read(kind, x, env, syms) for kind, x in self._output_readers])


def _opaque_step(step: ExternStep, groups: tuple[str, ...] = ()) -> Callable[[dict[str, Any]], None]:
    """An op outside aten/prims, from this process's registry, its results checked (client/opaque_ops.py),
    or a user's Triton kernel of this process (client/user_kernels.py)."""
    if step.triton is not None:
        from fxcc.client.user_kernels import kernel_call

        call = kernel_call(step.triton)
    else:
        from fxcc.client.opaque_ops import opaque_call

        call = opaque_call(step.op, step.opaque)
    out = step.out
    args = [_arg_reader(a) for a in step.args]
    if (slot := group_slot(step.op)) is not None:  # a collective, on the caller's process group
        args[slot] = (_CONST, bind_group(step.args, slot, groups, step.op))
    kwargs = {k: _arg_reader(v) for k, v in step.kwargs.items()}

    def run(env: dict[str, Any]) -> None:
        syms = env.get(SYMS)
        env[out] = call([_read(kind, x, env, syms) for kind, x in args],
                        {k: _read(kind, x, env, syms) for k, (kind, x) in kwargs.items()}, syms)
    return run


# Note: the same aten view ops through the Tensor method binding, which parses its arguments
# several µs faster than an OpOverload call (GPT-2 small's plan runs about 100 views per call:
# permuted weights and the heads' as_strided). Only ops whose method takes the schema's
# positional arguments in the same order; tests check each against its op.
VIEW_METHODS: dict[str, Callable[..., Any]] = {
    "aten.permute.default": torch.Tensor.permute,
    "aten.as_strided.default": torch.Tensor.as_strided,
    "aten.view.default": torch.Tensor.view,
    "aten.reshape.default": torch.Tensor.reshape,
    "aten.t.default": torch.Tensor.t,
    "aten.transpose.int": torch.Tensor.transpose,
    "aten.unsqueeze.default": torch.Tensor.unsqueeze,
    "aten.squeeze.dim": torch.Tensor.squeeze,
    "aten.select.int": torch.Tensor.select,
}


def _direct(op: Any) -> Any:
    """The C++ callable behind an aten/prims OpOverload: OpOverload.__call__ is a Python frame that
    only forwards to it (one frame fewer for each extern call). Other callables as they are."""
    if type(op) is torch._ops.OpOverload and type(op).__call__ is _OVERLOAD_CALL:
        return getattr(op, "_op", op)
    return op


_OVERLOAD_CALL = torch._ops.OpOverload.__call__


# How an extern argument is read per call: a plan name, a constant decoded once, or (size
# expressions, lists holding names) decoded each call.
_REF, _CONST, _DYNAMIC = object(), object(), object()


def _arg_reader(a: Any) -> tuple[object, Any]:
    if isinstance(a, NodeRef):
        return _REF, a.name
    if _is_constant(a):
        return _CONST, decode_arg(a, {}, None)
    return _DYNAMIC, a


def _is_constant(a: Any) -> bool:
    if isinstance(a, (NodeRef, SymArg)):
        return False
    if isinstance(a, ListArg):
        return all(_is_constant(x) for x in a.items)
    return True


def _read(kind: object, x: Any, env: dict[str, Any], syms: Any) -> Any:
    if kind is _REF:
        return env[x]
    if kind is _CONST:
        return list(x) if isinstance(x, list) else x  # a fresh list: an op never shares ours
    return decode_arg(x, env, syms)


def step_symbolic(step: ExternStep) -> bool:
    """Whether the step's expected strides are size expressions (evaluated per call)."""
    return step.expect_strides is not None and any(isinstance(x, str) for x in step.expect_strides)


def _expected_strides(step: ExternStep) -> Callable[[Any], tuple[int, ...]] | None:
    if step.expect_strides is None:
        return None
    if any(isinstance(x, str) for x in step.expect_strides):
        evaluate = compile_exprs([str(x) for x in step.expect_strides])
        return lambda syms: tuple(evaluate(syms))
    fixed = tuple(step.expect_strides)
    return lambda syms: fixed


def _in_layout(value: Any, strides: tuple[int, ...], step: ExternStep) -> Any:
    """`value` with `strides` (a copy only when the op laid it out otherwise; dims of size 1
    have no meaningful stride)."""
    if not isinstance(value, torch.Tensor) or value.dim() != len(strides):
        return value
    if value.stride() == strides:  # the common case, one tuple comparison
        return value
    if all(n <= 1 or a == b for n, a, b in zip(value.shape, value.stride(), strides)):
        return value
    if step.out not in _relaid:
        _relaid.add(step.out)
        log.info("fxcc: %s returned strides %s, the plan assumes %s: copying", step.op,
                 tuple(value.stride()), strides)
    return torch.empty_strided(value.shape, strides, dtype=value.dtype, device=value.device).copy_(value)


_relaid: set[str] = set()


def _take_storage(old: Any, sizes: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype,
                  device: torch.device, step: AllocStep) -> torch.Tensor:
    """A tensor of `sizes`/`strides` at `old`'s data pointer, in its storage (AllocStep.reuse).

    Note: the plan names in `reuse` a buffer of its own or a fresh extern result whose dtype,
    device and layout it knows. Should torch have handed back something else (another dtype or
    device, a storage too small from that pointer on), the step gets fresh memory instead,
    holding `old`'s values when the shapes agree: a kernel writing in place reads there what it
    would have read from `old`, so the plan stays right, only without the saving.
    """
    if isinstance(old, torch.Tensor) and old.dtype == dtype and old.device == device:
        if old.shape == sizes and old.stride() == strides:  # written in place: the tensor itself
            return old
        span = 1 + sum((n - 1) * st for n, st in zip(sizes, strides)) if all(sizes) else 0
        if (old.storage_offset() + span) * dtype.itemsize <= old.untyped_storage().nbytes():
            return old.as_strided(sizes, strides, old.storage_offset())
    if step.out not in _untaken:
        _untaken.add(step.out)
        log.info("fxcc: %s cannot take the storage of %s: allocating", step.out, step.reuse)
    fresh = torch.empty_strided(sizes, strides, dtype=dtype, device=device)
    if isinstance(old, torch.Tensor) and list(old.shape) == list(sizes):
        fresh.copy_(old)
    return fresh


_untaken: set[str] = set()


# ---------------------------------------------------------------- symbolic sizes

SYMS = "__syms__"  # env key of the size symbols' values (never a plan name: names are identifiers)
ALLOC = "__alloc__"  # env key of the call's allocator: (sizes, strides, dtype) -> an empty tensor


def _allocator(device: torch.device) -> Callable[[Any, Any, torch.dtype], torch.Tensor]:
    """torch.empty_strided on `device`, by the C++ entry points Inductor's generated code calls
    (torch._C._dynamo.guards._empty_strided_cuda / _cpu) where they apply: no dispatcher and no
    Python argument parsing (a ResNet-18 training step allocates ~390 buffers; on the H200 the
    dispatcher's path cost 1.35 ms of host time a step). The CUDA one allocates on the current
    device, so it serves a plan whose inputs are there; elsewhere the general call."""
    if device.type == "cuda" and _EMPTY_CUDA is not None and device.index == torch.cuda.current_device():
        return _EMPTY_CUDA
    if device.type == "cpu" and _EMPTY_CPU is not None:
        return _EMPTY_CPU

    def empty(sizes: Any, strides: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(sizes, strides, dtype=dtype, device=device)
    return empty


def _fast_empty(name: str) -> Callable[..., torch.Tensor] | None:
    try:
        from torch._C._dynamo import guards
    except ImportError:
        return None
    return getattr(guards, name, None)


_EMPTY_CUDA = _fast_empty("_empty_strided_cuda")
_EMPTY_CPU = _fast_empty("_empty_strided_cpu")


class GuardFailed(ArtifactError):
    """The call's sizes are outside what the plan was compiled for (another variant is needed)."""


class SymbolReader:
    """Reads a plan's size symbols from a call's inputs and checks the plan's guards on them."""

    def __init__(self, plan: Any) -> None:
        self.bindings = [(b.name, b.input, b.dim) for b in plan.symbols]
        self.guard_texts = list(plan.guards)
        self.check = compile_exprs(self.guard_texts) if self.guard_texts else None
        # (input, dim) of every stride the plan assumes, and one evaluator for all of them
        self.stride_slots = [(i, d) for i, st in enumerate(plan.input_strides) if st is not None
                             for d in range(len(st))]
        texts = [str(x) for st in plan.input_strides if st is not None for x in st]
        self.strides = compile_exprs(texts) if texts else None

    def __call__(self, args: list[Any]) -> SizeEnv:
        syms = SizeEnv()
        for name, i, dim in self.bindings:
            a = args[i]
            syms[name] = int(a) if dim is None else int(a.shape[dim])
        if self.check is not None:
            for text, ok in zip(self.guard_texts, self.check(syms)):
                if not ok:
                    raise GuardFailed(f"guard {text} fails for {syms}")
        if self.strides is not None:
            for (i, d), want in zip(self.stride_slots, self.strides(syms)):
                t = args[i]
                if t.shape[d] > 1 and t.stride(d) != want:
                    raise GuardFailed(f"input {i} has stride {t.stride(d)} in dim {d}, the plan assumes {want}")
        return syms


class SizeEnv(dict):
    """The size symbols' values for one call; `value` evaluates a SymArg's text (decode_arg)."""

    def value(self, text: str) -> int:
        return int(_parsed(text).evaluate(self))


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> Any:
    return parse(text)


def _symbolic_step(step: KernelStep) -> bool:
    return any(isinstance(g, str) for g in step.grid) or any(isinstance(a, SymArg) for a in step.args)


def _symbolic_kernel(step: KernelStep, fn: Any, launch_kw: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """A launch whose grid and integer arguments are size expressions, evaluated per call."""
    sizes = _symbolic_sizes(step)
    slots = [a.name if isinstance(a, NodeRef) else None for a in step.args]
    interpreted = _is_interpreted(fn)

    def run(env: dict[str, Any]) -> None:
        ints, grid = sizes(env[SYMS])
        if min(grid) <= 0:
            return  # nothing to launch over (an empty dimension)
        values = iter(ints)
        call = [env[n] if n is not None else next(values) for n in slots]
        if interpreted:
            with TRITON_LOCK:
                fn[grid](*call, **launch_kw)
        else:
            fn[grid](*call, **launch_kw)
    return run


# ---------------------------------------------------------------- CUDA: prebuilt cubins


def cuda_arch_key() -> str | None:
    """The binaries key of the current CUDA device ("sm_90"), or None without a usable GPU."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def plan_cubins(artifact: Artifact) -> list[Any]:
    """The process-wide CubinKernels (client/cuda_loader.py) of a verified artifact's kernels for
    this GPU's arch, the very ones its plans launch; none without a usable GPU or cubins."""
    arch = cuda_arch_key() if artifact.manifest.target.kind == "cuda" else None
    if arch is None:
        return []
    try:
        from fxcc.client.cuda_loader import LaunchMeta, cubin_kernel
    except ImportError:
        return []
    kernels = []
    for info in artifact.manifest.kernels:
        ref = info.binaries.get(arch)
        if ref is None or ref.digest not in artifact.blobs:
            continue
        try:
            meta = LaunchMeta.from_metadata(info.metadata, arch)
        except ArtifactError:
            continue  # the plan runs it from source
        kernels.append(cubin_kernel(ref.digest, artifact.blobs[ref.digest], meta))
    return kernels


def _cubin_step(step: KernelStep, info: KernelInfo, artifact: Artifact, arch: str,
                cubins: dict[str, Any]) -> Callable[[dict[str, Any]], None] | None:
    """A step that launches the kernel's cubin for `arch`; None when there is none to use.

    When a launch-time guard fails (an unaligned pointer), that launch and the ones after it
    that fail too run the kernel from source through Triton's JIT, loaded on first need.
    """
    ref = info.binaries.get(arch)
    if ref is None:
        return None
    symbolic = _symbolic_step(step)
    # Note: a symbolic step's ints and grid are evaluated per call; 0 holds their slots until then.
    args: list[str | int] = [a.name if isinstance(a, NodeRef) else a.value if isinstance(a, IntArg) else 0
                             for a in step.args]
    try:
        from fxcc.client.cuda_loader import LaunchMeta, StepLauncher, cubin_kernel

        kernel = cubins.get(info.name)
        if kernel is None:
            meta = LaunchMeta.from_metadata(info.metadata, arch)
            kernel = cubins[info.name] = cubin_kernel(ref.digest, artifact.blobs[ref.digest], meta)
        launcher = StepLauncher(kernel, [1] if symbolic else step.grid, args)
    except (ImportError, ArtifactError) as e:
        log.warning("fxcc: kernel %s runs from source, not its %s cubin: %s", info.name, arch, e)
        return None
    if not symbolic and not launcher.static_guards_hold(args):
        return None
    sizes = _symbolic_sizes(step) if symbolic else None
    source = artifact.blobs[info.source.digest]
    buffers = launcher.buffers
    jit: list[Callable[[dict[str, Any]], None]] = []

    def run(env: dict[str, Any]) -> None:
        device = env["__device__"]
        ints, grid = sizes(env[SYMS]) if sizes is not None else (None, None)
        if device.type == "cuda" and launcher([env[n] for n in buffers], device.index, ints, grid):
            return
        if not jit:
            from fxcc.client.cuda_loader import record_fallback

            record_fallback()
            log.info("fxcc: a launch guard of %s failed; running it from source", info.name)
            jit.append(PlanRunner._kernel(step, info, load_kernel(info, source)))
        jit[0](env)
    return run


def _symbolic_sizes(step: KernelStep) -> Callable[[dict[str, int]], tuple[list[int], tuple[int, ...]]]:
    """(int arguments, grid) of a symbolic step for one call's size symbols."""
    grid_eval = compile_exprs([str(g) for g in step.grid])
    ints = [a.expr if isinstance(a, SymArg) else str(a.value) for a in step.args if not isinstance(a, NodeRef)]
    int_eval = compile_exprs(ints) if ints else None

    def sizes(syms: dict[str, int]) -> tuple[list[int], tuple[int, ...]]:
        return (list(int_eval(syms)) if int_eval else []), tuple(grid_eval(syms))
    return sizes


def _is_interpreted(fn: Any) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(fn, InterpretedFunction)


def load_plan(artifact: Artifact, groups: tuple[str, ...] = ()) -> PlanRunner:
    """Verify `artifact` and prepare its plan to run (kernels loaded once, here); its collectives'
    `group<i>` run on the process group named `groups[i]`."""
    return PlanRunner(artifact, groups=groups)

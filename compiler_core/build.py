"""Build: cross-compile each generated Triton kernel to a cubin for a named GPU arch (no GPU needed).

The argument signature of a kernel comes from the plan: a KernelStep's buffer arguments get
their dtype from the AllocStep, placeholder or graph node that defines them, and its int
arguments are i32 when they fit (else i64), as Triton's JIT would choose.

Note: the cubin is specialised the way Triton's JIT specialises a launch: every pointer is
assumed 16-byte aligned and every int that is a multiple of 16 (in all steps that launch the
kernel) is declared divisible by 16, so that loads and stores vectorise. These facts are
recorded as guards in `KernelInfo.metadata`; the client checks them (pointer alignment at each
launch, the ints once at load) and runs the kernel from source, never a wrong binary, when
one fails. Metadata keys are `<arch key>.<field>`, e.g. `sm_90.shared`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fxcc.compiler_core.artifact import (
    AllocStep,
    Artifact,
    BlobRef,
    ExternStep,
    KernelInfo,
    KernelStep,
    Plan,
    add_blob,
)
from fxcc.compiler_core.build_tasks import BuildTask, BuiltKernel
from fxcc.compiler_core.errors import BuildError
from fxcc.compiler_core.triton_lock import TRITON_LOCK
from fxcc.compiler_core.wire import CompileRequest, IntArg, NodeRef, SymArg

log = logging.getLogger("fxcc.build")

# torch dtype name (wire form) -> Triton pointer element type, as triton.jit names them.
POINTER_TYPES: dict[str, str] = {
    "float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "bf16",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "bool": "i1",
}
# Hidden trailing pointer parameters of kernels from this Triton (global and profile scratch).
SCRATCH_PARAMS = ("global_scratch", "profile_scratch")
_METADATA_INTS = ("num_warps", "num_stages", "shared", "global_scratch_size", "global_scratch_align",
                  "profile_scratch_size", "profile_scratch_align")


def arch_key(arch: int) -> str:
    """The key of an SM arch in `KernelInfo.binaries` (90 -> "sm_90")."""
    return f"sm_{arch}"


@dataclass(frozen=True)
class KernelSignature:
    """What every launch of one kernel passes: Triton type strings and the facts that hold for all."""

    types: tuple[str, ...]  # one per positional argument: "*fp32", "i32", ...
    divisible16: frozenset[int]  # argument positions declared divisible by 16

    @property
    def pointers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.types) if t.startswith("*"))


def build_artifact(artifact: Artifact, request: CompileRequest, arch: int,
                   value_dtypes: dict[str, str] | None = None) -> Artifact:
    """The artifact with a cubin for sm_`arch` added to each kernel that can be built, one after
    another in this process (a worker spreads the same tasks over its build processes and the
    cluster: worker/builds.py).

    Binaries are additive: existing ones (other archs) stay. A kernel that fails to build keeps
    no binary for this arch (the client JITs its source) and says why in `<arch>.error`.
    Raises BuildError when Triton here cannot target CUDA at all.
    """
    reason = cuda_build_unavailable()
    if reason:
        raise BuildError(reason)
    tasks = build_tasks(artifact, request, arch, value_dtypes)
    return apply_builds(artifact, arch, {t.name: build_kernel(t) for t in tasks})


def build_tasks(artifact: Artifact, request: CompileRequest, arch: int,
                value_dtypes: dict[str, str] | None = None) -> list[BuildTask]:
    """One task per kernel of the artifact that has no sm_`arch` binary yet and that the plan
    launches with a consistent signature (apply_builds says why the others get none).
    `value_dtypes`: the dtypes of the compiled graph's values (pipeline.Compilation.value_dtypes),
    else derived again."""
    if not artifact.manifest.kernels:
        return []
    import triton

    signatures = kernel_signatures(artifact.manifest.plan, request, value_dtypes)
    tasks = []
    for info in artifact.manifest.kernels:
        sig = signatures.get(info.name)
        if arch_key(arch) in info.binaries or sig is None:
            continue
        tasks.append(BuildTask(name=info.name, source=artifact.blobs[info.source.digest].decode(), arch=arch,
                               num_warps=info.num_warps, num_stages=info.num_stages, constexprs=info.constexprs,
                               types=sig.types, divisible16=tuple(sorted(sig.divisible16)),
                               triton=triton.__version__))
    return tasks


def _task_kernel(task: BuildTask) -> tuple[KernelInfo, KernelSignature]:
    info = KernelInfo(name=task.name, source=BlobRef(digest="0" * 64, size=len(task.source)),
                      num_warps=task.num_warps, num_stages=task.num_stages, constexprs=task.constexprs)
    return info, KernelSignature(task.types, frozenset(task.divisible16))


def build_kernel(task: BuildTask) -> BuiltKernel:
    """Build one task here (a temporary folder holds its source: triton.jit reads the file). A
    kernel that Triton cannot build gives a BuiltKernel with the reason, not an exception."""
    info, sig = _task_kernel(task)
    try:
        with tempfile.TemporaryDirectory(prefix="fxcc-build-") as tmp:
            fn = _jit_function(info, task.source.encode(), Path(tmp))
            cubin, built = compile_cubin(fn, info, sig, task.arch)
    except Exception as e:  # noqa: BLE001 - a kernel without a binary still runs from source
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        msg = f"{type(e).__name__}: {' | '.join(lines[:1] + lines[-2:])}"[:400]
        log.warning("fxcc: no %s binary for kernel %s: %s", arch_key(task.arch), task.name, msg)
        return BuiltKernel(error=msg)
    return BuiltKernel(metadata=built, cubin=cubin)


def apply_builds(artifact: Artifact, arch: int, built: dict[str, BuiltKernel]) -> Artifact:
    """The artifact with each kernel's build for sm_`arch` (by kernel name) recorded: its cubin as
    a blob and its metadata as `sm_<arch>.<field>`, or `sm_<arch>.error`. A kernel that has a
    binary for the arch already is kept as it is; one with no build says why it has none."""
    key = arch_key(arch)
    blobs = dict(artifact.blobs)
    kernels: list[KernelInfo] = []
    for info in artifact.manifest.kernels:
        if key in info.binaries:
            kernels.append(info)  # built before (binaries are additive and content-addressed)
            continue
        meta = {k: v for k, v in info.metadata.items() if not k.startswith(f"{key}.")}
        result = built.get(info.name)
        if result is None:
            meta[f"{key}.error"] = "no step launches this kernel with a consistent signature"
        elif result.error is not None or not result.cubin:
            meta[f"{key}.error"] = result.error or "the build gave no binary"
        else:
            meta.update({f"{key}.{k}": v for k, v in result.metadata.items()})
            kernels.append(info.model_copy(update={
                "binaries": dict(info.binaries, **{key: add_blob(blobs, result.cubin)}), "metadata": meta}))
            continue
        kernels.append(info.model_copy(update={"metadata": meta}))
    return Artifact(artifact.manifest.model_copy(update={"kernels": kernels}), blobs)


def compile_task(task: BuildTask) -> Any:
    """Triton's compiled kernel of one task, whose `asm` holds every stage (ttir, ttgir, ptx, cubin):
    a look at what a build makes (tests check the pipelining of templates in its ttgir)."""
    info, sig = _task_kernel(task)
    with tempfile.TemporaryDirectory(prefix="fxcc-build-") as tmp:
        return compile_triton(_jit_function(info, task.source.encode(), Path(tmp)), info, sig, task.arch)


def compile_triton(fn: Any, info: KernelInfo, sig: KernelSignature, arch: int) -> Any:
    """Triton's compiled kernel of the @triton.jit `fn` for sm_`arch`, specialised as `sig` says."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    params = list(fn.arg_names)
    nargs = len(sig.types)
    if nargs > len(params):
        raise BuildError(f"kernel takes {len(params)} parameters, plan passes {nargs}",
                         node=info.name)
    signature: dict[str, str] = dict(zip(params, sig.types))
    constexprs: dict[tuple[int, ...], int] = {}
    for i, name in enumerate(params[nargs:], start=nargs):
        if name not in info.constexprs:
            raise BuildError(f"parameter {name} is neither passed nor a constexpr", node=info.name)
        signature[name] = "constexpr"
        constexprs[(i,)] = info.constexprs[name]
    attrs = {(i,): [["tt.divisibility", 16]] for i in sorted(sig.divisible16)}
    src = ASTSource(fn, signature, constexprs, attrs)
    with TRITON_LOCK, _library_jitted(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # knob-default notices from newer Tritons
        return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": info.num_warps, "num_stages": info.num_stages})


def compile_cubin(fn: Any, info: KernelInfo, sig: KernelSignature, arch: int) -> tuple[bytes, dict[str, int | str]]:
    """Compile the @triton.jit `fn` for sm_`arch`; the cubin and its launch metadata."""
    import triton

    params = list(fn.arg_names)
    nargs = len(sig.types)
    t0 = time.perf_counter()
    compiled = compile_triton(fn, info, sig, arch)
    md = compiled.metadata._asdict()
    _check_launchable(md, info.name)
    built: dict[str, int | str] = {k: int(md.get(k) or 0) for k in _METADATA_INTS}
    built.update({
        "name": str(md["name"]),
        "params": ",".join(params[:nargs]),
        "signature": ",".join(sig.types),
        "scratch_params": sum(1 for p in SCRATCH_PARAMS if f"{p}_size" in md),
        "guard_align16": ",".join(map(str, sig.pointers)),
        "guard_div16": ",".join(str(i) for i in sorted(sig.divisible16) if i not in sig.pointers),
        "triton": triton.__version__,
        "build_ms": round((time.perf_counter() - t0) * 1000),
    })
    return bytes(compiled.asm["cubin"]), built


def _check_launchable(md: dict[str, Any], name: str) -> None:
    """Refuse what the client's plain cuLaunchKernel cannot launch faithfully."""
    if int(md.get("num_ctas") or 1) != 1:
        raise BuildError(f"num_ctas={md['num_ctas']} needs a cluster launch", node=name)
    for flag in ("launch_cooperative_grid", "launch_pdl"):
        if md.get(flag):
            raise BuildError(f"{flag} needs a launch attribute", node=name)
    if md.get("tensordesc_meta"):
        raise BuildError("tensor descriptors need host-side TMA setup", node=name)


# ---------------------------------------------------------------- signatures from the plan


def kernel_signatures(plan: Plan, request: CompileRequest,
                      value_dtypes: dict[str, str] | None = None) -> dict[str, KernelSignature]:
    """For each kernel that the plan launches consistently: its argument types and div-16 facts.

    A kernel launched with different argument types by different steps gets no entry (no
    binary can serve all of them). `value_dtypes`: the compiled graph's value dtypes where the
    compile that made the plan gave them (pipeline.Compilation.value_dtypes), else they are derived again.
    """
    found: dict[str, KernelSignature | None] = {}
    for step, dtypes in _kernel_steps(plan, request, value_dtypes):
        sig = _step_signature(step, dtypes)
        if step.kernel not in found:
            found[step.kernel] = sig
            continue
        prev = found[step.kernel]
        if prev is None or sig is None or prev.types != sig.types:
            found[step.kernel] = None
        else:
            found[step.kernel] = KernelSignature(sig.types, prev.divisible16 & sig.divisible16)
    return {k: s for k, s in found.items() if s is not None}


def _kernel_steps(plan: Plan, request: CompileRequest,
                  value_dtypes: dict[str, str] | None = None) -> Iterator[tuple[KernelStep, _BufferDtypes]]:
    """Every KernelStep of the plan and of its control flow steps' plans, with its plan's dtypes
    (`value_dtypes` are the plan's graph's, its subgraphs' under their place; where they are not
    given, derived again)."""
    dtypes = _BufferDtypes(plan, request, value_dtypes)
    subgraphs = {n.name: n.control for n in request.graph.nodes if n.control is not None}
    for step in plan.steps:
        if isinstance(step, KernelStep):
            yield step, dtypes
        elif isinstance(step, ExternStep) and step.control is not None and step.out in subgraphs:
            flow = subgraphs[step.out]
            for i, (sub_plan, graph) in enumerate(zip(step.control.plans, flow.graphs)):
                hints = flow.hints[i] if i < len(flow.hints) else {}
                yield from _kernel_steps(sub_plan, request.model_copy(update={"graph": graph, "hints": hints}),
                                         subgraph_dtypes(value_dtypes, f"{step.out}[{i}]"))


def subgraph_dtypes(value_dtypes: dict[str, str] | None, where: str) -> dict[str, str] | None:
    """The value dtypes of the control flow subgraph at `where` ("cond_1[0]": the first subgraph of
    node cond_1) among a graph's (pipeline.Compilation.value_dtypes keeps them as `cond_1[0]/add`;
    node names have neither brackets nor slashes), or None when they are not there."""
    prefix = f"{where}/"
    found = {k[len(prefix):]: v for k, v in (value_dtypes or {}).items() if k.startswith(prefix)}
    return found or None


def _step_signature(step: KernelStep, dtypes: _BufferDtypes) -> KernelSignature | None:
    types: list[str] = []
    div16: set[int] = set()
    for i, arg in enumerate(step.args):
        if isinstance(arg, NodeRef):
            elem = POINTER_TYPES.get(dtypes.get(arg.name) or "")
            if elem is None:
                return None
            types.append(f"*{elem}")
            div16.add(i)  # a guard: checked at every launch
        elif isinstance(arg, IntArg):
            types.append(int_type(arg.value))
            if arg.value % 16 == 0:
                div16.add(i)
        elif isinstance(arg, SymArg):
            types.append("i64")  # a size evaluated per call: any value, no divisibility fact
    return KernelSignature(tuple(types), frozenset(div16))


def int_type(value: int) -> str:
    """Triton's type for an int argument (the JIT's rule: i32 if it fits, else i64, else u64)."""
    if -(1 << 31) <= value < (1 << 31):
        return "i32"
    if -(1 << 63) <= value < (1 << 63):
        return "i64"
    return "u64"


class _BufferDtypes:
    """dtype names of plan buffers: allocations, placeholders, then (lazily) graph node values."""

    def __init__(self, plan: Plan, request: CompileRequest, value_dtypes: dict[str, str] | None = None) -> None:
        self._known = {p.name: p.spec.dtype for p in request.graph.placeholders if p.spec is not None}
        self._known.update({s.out: s.spec.dtype for s in plan.steps if isinstance(s, AllocStep)})
        self._request = request
        self._graph_dtypes: dict[str, str] | None = value_dtypes

    def get(self, name: str) -> str | None:
        if name in self._known:
            return self._known[name]
        if self._graph_dtypes is None:
            self._graph_dtypes = _node_dtypes(self._request)
        return self._graph_dtypes.get(name)


def _node_dtypes(request: CompileRequest) -> dict[str, str]:
    import torch

    from fxcc.compiler_core.graph import rebuild_graph
    from fxcc.compiler_core.passes import run_passes

    # Note: the same graph the compile lowered (passes included), so extern results the passes
    # made (an SDPA call) have their dtypes too.
    gm = rebuild_graph(request.graph, request.hints)
    run_passes(gm, request.options.target.kind, request.options.allow_tf32)
    out: dict[str, str] = {}
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            out[node.name] = str(val.dtype).removeprefix("torch.")
    return out


# ---------------------------------------------------------------- loading kernel source


def _jit_function(info: KernelInfo, source: bytes, tmp: Path) -> Any:
    """The @triton.jit function `info.name` from its source (triton.jit reads the file)."""
    stem = f"fxcc_build_{hashlib.sha256(source).hexdigest()[:32]}"
    path = tmp / f"{stem}.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location(stem, path)
    if spec is None or spec.loader is None:
        raise BuildError(f"cannot load kernel source {stem}", node=info.name)
    mod = importlib.util.module_from_spec(spec)
    with _jit_not_interpreted():
        spec.loader.exec_module(mod)
    fn = getattr(mod, info.name, None)
    raw = getattr(fn, "fn", None)  # the Python function under a JITFunction / InterpretedFunction
    if raw is None:
        raise BuildError(f"kernel {info.name} is not a @triton.jit function in its source",
                         node=info.name)
    from triton.runtime.jit import JITFunction

    # With TRITON_INTERPRET=1 triton.jit gave an interpreter wrapper; the compiler needs the JIT one.
    return fn if isinstance(fn, JITFunction) else JITFunction(raw)


@contextlib.contextmanager
def _jit_not_interpreted() -> Iterator[None]:
    """triton.jit as the compiler needs it, also under TRITON_INTERPRET=1 (helpers included)."""
    from triton import knobs

    with TRITON_LOCK:
        saved = knobs.runtime.interpret
        knobs.runtime.interpret = False
        try:
            yield
        finally:
            knobs.runtime.interpret = saved


_jitted: dict[int, Any] = {}  # id(InterpretedFunction) -> its JITFunction twin (made once)


@contextlib.contextmanager
def _library_jitted() -> Iterator[None]:
    """Triton's own @jit library functions (tl.sum's combine, tl.softmax, ...) as the compiler
    needs them, also under TRITON_INTERPRET=1.

    Note: with the interpreter on when triton.language is imported, its @jit helpers are
    InterpretedFunctions; Triton >= 3.9's code generator cannot inline those ("'value' object
    has no attribute 'data'" on tl.sum). For the length of one cross-compile (under TRITON_LOCK,
    so no interpreted launch runs meanwhile) they are swapped for JITFunction twins, then put back.
    """
    import sys

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    swapped: list[tuple[dict[str, Any], str, Any]] = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("triton.language"):
            continue
        namespace = vars(module)
        for attr, value in list(namespace.items()):
            if isinstance(value, InterpretedFunction):
                twin = _jitted.get(id(value))
                if twin is None:
                    twin = _jitted[id(value)] = JITFunction(value.fn)
                swapped.append((namespace, attr, value))
                namespace[attr] = twin
    try:
        yield
    finally:
        for namespace, attr, value in swapped:
            namespace[attr] = value


def cuda_build_unavailable() -> str | None:
    """Why this process cannot cross-compile for CUDA, or None when it can."""
    try:
        import triton  # noqa: F401
        from triton.backends import backends
    except ImportError as e:
        return f"triton is not importable: {e}"
    if "nvidia" not in backends:
        return "triton here has no nvidia backend"
    return None

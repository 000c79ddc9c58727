"""A user's @triton.jit kernels in compiled graphs: named at capture, launched by the client at run time.

Note: Dynamo records a user kernel as triton_kernel_wrapper_functional, holding the function in a
process-local side table. The wire carries no code: the node names the kernel by a stable identity
(its module, qualname and the sha256 of its source) and the worker sizes buffers around it from its
outputs' specs (compiler_core.opaque). At run time the client launches its own function of that
identity: the one capture saw in this process, else (a plan served without capture) the object at
module.qualname of an already-imported module, never importing one; a function whose source hash
differs is refused. On CPU tensors the kernel runs in Triton's interpreter, on CUDA through Triton's
own launcher, as eager would run it.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch._prims_common import clone_preserve_strides

from fxcc.compiler_core.errors import ArtifactError, UnsupportedOp
from fxcc.compiler_core.symexpr import compile_exprs

WRAPPER = "triton_kernel_wrapper_functional"

_kernels: dict[tuple[str, str, str], Any] = {}  # identity -> the JITFunction capture saw


def is_user_kernel(n: fx.Node) -> bool:
    return isinstance(n.target, torch._ops.HigherOrderOperator) and n.target.name() == WRAPPER


def kernel_of(n: fx.Node) -> tuple[Any, dict[str, Any]]:
    """(the JITFunction, its constant arguments) of a triton_kernel_wrapper_functional node."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    kw = n.kwargs
    if kw.get("tma_descriptor_metadata"):
        raise UnsupportedOp("a Triton kernel with TMA descriptors", node=n.name)
    if len(kw["grid"]) != 1:
        raise UnsupportedOp("a Triton kernel launched over several grids (autotuned)", node=n.name)
    jit = jit_function(kernel_side_table.get_kernel(kw["kernel_idx"]))
    return jit, dict(kernel_side_table.get_constant_args(kw["constant_args_idx"]))


def jit_function(kernel: Any) -> Any:
    from triton.runtime.jit import JITFunction

    if not isinstance(kernel, JITFunction):
        raise UnsupportedOp(f"Triton kernel {type(kernel).__name__} (autotuned or heuristic kernels are not "
                            "supported yet)")
    return kernel


def identity(jit: Any) -> tuple[str, str, str]:
    """(module, qualname, sha256 of the source) of a JITFunction."""
    fn = jit.fn
    return fn.__module__, fn.__qualname__, hashlib.sha256(jit.src.encode()).hexdigest()


def remember(jit: Any) -> tuple[str, str, str]:
    """The identity of `jit`, which this process's plans may launch from now on."""
    key = identity(jit)
    _kernels[key] = jit
    return key


def resolve_kernel(module: str, qualname: str, source_sha256: str) -> Any:
    """This process's JITFunction of that identity; ArtifactError when it has none."""
    key = (module, qualname, source_sha256)
    jit = _kernels.get(key)
    if jit is not None:
        return jit
    obj: Any = sys.modules.get(module)  # never imported on a plan's word
    for part in qualname.split("."):
        if obj is None or part.startswith("__") or part == "<locals>":
            obj = None
            break
        obj = getattr(obj, part, None)
    try:
        jit = jit_function(obj)
    except UnsupportedOp:
        raise ArtifactError(f"Triton kernel {module}.{qualname} is not in this process", op=qualname) from None
    if identity(jit) != key:
        raise ArtifactError(f"Triton kernel {module}.{qualname} here is not the one the plan was compiled for "
                            "(its source differs)", op=qualname)
    _kernels[key] = jit
    return jit


def kernel_call(kernel: Any) -> Callable[[list[Any], dict[str, Any], Any], Any]:
    """A launch of the plan's user kernel (a wire.UserKernel) over decoded arguments and the call's
    size symbols; its value is the tuple of the cloned tensors, written by the kernel."""
    jit = resolve_kernel(kernel.module, kernel.qualname, kernel.source_sha256)
    cloned = list(kernel.cloned)
    grid_texts = [str(g) for g in kernel.grid]
    symbolic = any(isinstance(g, str) for g in kernel.grid)
    grid_eval = compile_exprs(grid_texts) if symbolic else None
    fixed = tuple(int(g) for g in kernel.grid) if not symbolic else None
    interpreted: list[Any] = []

    def call(args: list[Any], kwargs: dict[str, Any], syms: Any) -> Any:
        kwargs = {k: clone_preserve_strides(v) if k in cloned else v for k, v in kwargs.items()}
        grid = fixed if grid_eval is None else tuple(grid_eval(syms))
        device = next((v.device for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
        if device is not None and device.type == "cpu":
            _interpret(jit, interpreted, grid, kwargs)
        else:
            jit[grid](**kwargs)
        return tuple(kwargs[k] for k in cloned)
    return call


def _interpret(jit: Any, cache: list[Any], grid: tuple[int, ...], kwargs: dict[str, Any]) -> None:
    """`jit` over CPU tensors in Triton's interpreter (as TRITON_INTERPRET=1 runs it)."""
    from triton.runtime.interpreter import InterpretedFunction

    from fxcc.compiler_core.triton_lock import TRITON_LOCK, repair_interpreter

    if not cache:
        repair_interpreter()
        cache.append(InterpretedFunction(jit.fn))
    with TRITON_LOCK:
        cache[0][grid](**kwargs)

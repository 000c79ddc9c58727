"""A user's @triton.jit kernel in a compiled graph (in-process): the client launches its own function
(named by module, qualname and source hash; no code on the wire) and the rest of the graph fuses.

Note: on a CPU-only torch Dynamo treats Triton kernels as user kernels only when torch reports a
Triton device (torch.utils._triton.has_triton, true on the GPU machine), and `@triton.jit` under
TRITON_INTERPRET=1 makes an interpreted function Dynamo would trace through. So these tests build
the JITFunction themselves and say that Triton has a device, as the H200 does; the kernel runs in
Triton's interpreter on CPU tensors, for fxcc and for the eager reference alike.
"""

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from fxcc.client import backend, user_kernels
from fxcc.client.runtime import load_plan
from fxcc.compiler_core.artifact import ExternStep
from fxcc.compiler_core.errors import ArtifactError


def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2 + tl.load(y_ptr + offs, mask=m), mask=m)


add_kernel = JITFunction(add_kernel)
EAGER = {"kernel": add_kernel}


def launch(a, b):
    out = torch.empty_like(a)
    n = a.numel()
    EAGER["kernel"][(triton.cdiv(n, 16),)](a, b, out, n, BLOCK=16)
    return out


def f(x):
    return launch(x.sin(), x.cos()).exp() - x


def eager(fn, *args):
    EAGER["kernel"] = InterpretedFunction(add_kernel.fn)
    try:
        return fn(*args)
    finally:
        EAGER["kernel"] = add_kernel


@pytest.fixture(autouse=True)
def _isolated(fresh_compiles, monkeypatch):
    import torch.utils._triton

    monkeypatch.setattr(torch.utils._triton, "has_triton", lambda: True)
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    yield


def _plans():
    return [e for e in backend.events() if e.source != "fallback"]


def test_user_kernel_is_launched_by_the_client_and_the_rest_fuses():
    x = torch.randn(50)
    with torch.no_grad():
        got = torch.compile(f, backend="fxcc")(x)
    torch.testing.assert_close(got, eager(f, x))
    (event,) = _plans()
    assert event.source == "compiled-in-process"
    assert "triton_kernel.add_kernel" in event.stats.extern_ops
    assert event.stats.kernels == 2  # sin and cos in one kernel before it, exp-x after it


def test_symbolic_grid():
    fn = torch.compile(f, backend="fxcc", dynamic=True)
    with torch.no_grad():
        for n in (20, 33, 70):
            x = torch.randn(n)
            torch.testing.assert_close(fn(x), eager(f, x))
    (event,) = _plans()
    assert event.runs_as == "step by step: sizes are symbolic"


def _artifact():
    captured = []
    GraphCompiler = backend.GraphCompiler

    def grab(self, gm, example_inputs):
        art = original(self, gm, example_inputs)
        captured.append(self.cache)
        return art

    original = GraphCompiler.__call__
    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(GraphCompiler, "__call__", grab)
        torch.compile(f, backend="fxcc")(torch.randn(50))
    (event,) = _plans()
    return captured[0].get(event.key)


def test_no_source_travels_and_the_plan_names_the_kernel_by_identity():
    art = _artifact()
    (step,) = [s for s in art.manifest.plan.steps if isinstance(s, ExternStep) and s.triton is not None]
    assert (step.triton.module, step.triton.qualname) == (__name__, "add_kernel")
    assert step.triton.source_sha256 == user_kernels.identity(add_kernel)[2]
    assert "tl.load" not in art.manifest_json().decode()  # the kernel's code is not in the artifact


def test_a_new_process_finds_the_kernel_by_module_and_qualname(monkeypatch):
    art = _artifact()
    monkeypatch.setattr(user_kernels, "_kernels", {})  # as a process that never captured it
    x = torch.randn(50)
    torch.testing.assert_close(load_plan(art)([x])[0], eager(f, x))


def test_a_kernel_of_another_source_is_refused(monkeypatch):
    art = _artifact()
    steps = [s.model_copy(update={"triton": s.triton.model_copy(update={"source_sha256": "0" * 64})})
             if isinstance(s, ExternStep) and s.triton is not None else s for s in art.manifest.plan.steps]
    forged = type(art)(art.manifest.model_copy(update={"plan": art.manifest.plan.model_copy(
        update={"steps": steps})}), art.blobs)
    monkeypatch.setattr(user_kernels, "_kernels", {})
    with pytest.raises(ArtifactError, match="not the one the plan was compiled for"):
        load_plan(forged)


def test_unknown_or_unreachable_kernels_are_refused():
    with pytest.raises(ArtifactError, match="not in this process"):
        user_kernels.resolve_kernel("no_such_module", "kernel", "0" * 64)
    with pytest.raises(ArtifactError, match="not in this process"):
        user_kernels.resolve_kernel(__name__, "f.<locals>.kernel", "0" * 64)
    with pytest.raises(ArtifactError, match="not in this process"):
        user_kernels.resolve_kernel("os", "system", "0" * 64)

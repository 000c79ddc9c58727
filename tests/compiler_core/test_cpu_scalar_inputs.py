"""A CPU scalar input of a GPU graph (a module's float attribute that Dynamo made an input: a 0-d
float64 CPU tensor, which eager lets a CUDA op take as an operand) is copied to the GPU before any
kernel reads it: a kernel launched on the GPU cannot read host memory (on the H200 the plan's
kernel read the CPU tensor's address: an illegal memory access). Compiled for a CUDA target on
FakeTensors (no GPU needed); on a CPU target the input is read where it is."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.backend import decomposition_table
from fxcc.client.capture import capture_graph
from fxcc.compiler_core.artifact import ExternStep, KernelStep
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, GraphSpec, NodeRef, Target


def scaled(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return torch.sin(x + 1) * s


def converted(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """As AOTAutograd leaves Dynamo's `x * float_attribute`: the scalar converted on the CPU first."""
    return torch.sin(x + 1) * s.to(torch.float32)


def _spec(fn, device: str) -> GraphSpec:
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(4, 8, device=device)
        s = torch.empty((), dtype=torch.float64)  # on the CPU, as Dynamo wraps a float
        gm = make_fx(fn, decomposition_table=decomposition_table())(x, s)
    return capture_graph(gm, [x, s]).spec


def _compiled(spec: GraphSpec, target: Target):
    return compile_request(CompileRequest(graph=spec, options=CompileOptions(target=target)))


def _reads(step) -> set[str]:
    return {a.name for a in step.args if isinstance(a, NodeRef)}


@pytest.mark.parametrize("fn", [scaled, converted], ids=["read_on_the_gpu", "converted_on_the_cpu_first"])
def test_a_cuda_graph_copies_its_cpu_scalar_input_to_the_gpu_before_a_kernel_reads_it(fn):
    spec = _spec(fn, "cuda")
    scalar = spec.placeholders[1].name
    plan = _compiled(spec, Target(kind="cuda", arch=90)).manifest.plan
    copies = [s for s in plan.steps if isinstance(s, ExternStep) and s.op == "aten._to_copy.default"]
    assert len(copies) == 1 and _reads(copies[0]) == {scalar}
    assert copies[0].kwargs["device"].value == "cuda"
    kernels = [s for s in plan.steps if isinstance(s, KernelStep)]
    assert kernels and all(scalar not in _reads(k) for k in kernels)
    assert any(copies[0].out in _reads(k) for k in kernels)


@pytest.mark.parametrize("fn", [scaled, converted], ids=["read_on_the_gpu", "converted_on_the_cpu_first"])
def test_a_cpu_graph_reads_its_scalar_input_where_it_is(fn):
    spec = _spec(fn, "cpu")
    plan = _compiled(spec, Target()).manifest.plan
    assert not [s for s in plan.steps if isinstance(s, ExternStep) and s.op == "aten._to_copy.default"]
    assert any(spec.placeholders[1].name in _reads(k) for k in plan.steps if isinstance(k, KernelStep))


def test_a_cpu_scalar_read_on_both_devices_leaves_the_graph_to_aten_calls():
    def both(x, s):
        return torch.sin(x) * s, s * 2  # the second product stays on the CPU in eager

    plan = _compiled(_spec(both, "cuda"), Target(kind="cuda", arch=90)).manifest.plan
    assert not [s for s in plan.steps if isinstance(s, KernelStep)]
    assert [s.op for s in plan.steps if isinstance(s, ExternStep)] == [
        "aten.sin.default", "aten.mul.Tensor", "aten.mul.Tensor"]

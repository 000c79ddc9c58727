"""Which plans replay as CUDA graphs, and what a graphed plan refuses to copy out (no GPU needed;
the replays themselves are checked on a GPU in tests/gpu/test_cuda_graphs_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from client import cuda_graphs
from client.cuda_graphs import GraphedPlan, allocated_bytes, why_not_graphed
from client.settings import ClientSettings
from compiler_core.artifact import ExternStep
from compiler_core.compile import compile_request
from compiler_core.wire import CompileOptions, CompileRequest, Target
from tests.compiler_core.test_passes_layout import cuda_spec, small_resnet


@pytest.fixture(scope="module")
def resnet_manifest():
    """A small conv net's plan for sm_90, compiled on this CPU (nothing is launched)."""
    model = small_resnet()
    spec, _ = cuda_spec(model, torch.randn(2, 3, 32, 32))
    request = CompileRequest(graph=spec, options=CompileOptions(target=Target(kind="cuda", arch=90)))
    return compile_request(request).manifest


def test_a_static_conv_net_inference_plan_is_graphed_and_a_training_one_is_not(resnet_manifest):
    assert why_not_graphed(resnet_manifest, inference=True) is None
    assert why_not_graphed(resnet_manifest, inference=False) == "not an inference graph"
    interp = resnet_manifest.model_copy(update={"target": Target(kind="interpret")})
    assert why_not_graphed(interp, inference=True) == "target is interpret"


def test_an_extern_op_not_known_to_be_capture_safe_keeps_the_plan_step_by_step(resnet_manifest):
    plan = resnet_manifest.plan
    conv = next(i for i, s in enumerate(plan.steps) if isinstance(s, ExternStep))
    steps = list(plan.steps)
    steps[conv] = steps[conv].model_copy(update={"op": "aten.nonzero.default"})
    manifest = resnet_manifest.model_copy(update={"plan": plan.model_copy(update={"steps": steps})})
    assert why_not_graphed(manifest, inference=True) == "extern ops not known to be capture-safe: nonzero"


def test_few_launches_or_symbolic_sizes_are_not_graphed(resnet_manifest):
    plan = resnet_manifest.plan
    small = resnet_manifest.model_copy(update={"plan": plan.model_copy(update={"steps": plan.steps[:3]})})
    assert why_not_graphed(small, inference=True).endswith("launches")

    from compiler_core.artifact import SymbolBinding

    symbolic = plan.model_copy(update={"symbols": [SymbolBinding(name="s0", input=0, dim=0)]})
    assert why_not_graphed(resnet_manifest.model_copy(update={"plan": symbolic}), inference=True) \
        == "sizes are symbolic"


def test_allocated_bytes_counts_the_plans_own_buffers(resnet_manifest):
    from compiler_core.artifact import AllocStep

    allocs = [s for s in resnet_manifest.plan.steps if isinstance(s, AllocStep) and s.reuse is None]
    assert allocs
    # at least the largest fresh buffer, which is a (2, C, H, W) float tensor
    largest = max(s.spec.sizes[0] * s.spec.strides[0] * 4 for s in allocs if s.spec.sizes)
    assert allocated_bytes(resnet_manifest) >= largest


def test_outputs_that_alias_inputs_share_memory_or_are_large_are_never_copied_out():
    x = torch.randn(64, 64)
    assert cuda_graphs._unsafe_outputs((x[0],), [x], 10**9) == "an output aliases an input"
    y = torch.randn(8, 8)
    assert cuda_graphs._unsafe_outputs((y, y[1]), [x], 10**9) == "two outputs share memory"
    assert cuda_graphs._unsafe_outputs((y.expand(3, 8, 8),), [x], 10**9) == "an output overlaps itself"
    padded = torch.randn(8, 10)[:, :7]  # rows with gaps (a padded matmul's result) copy out fine
    assert cuda_graphs._unsafe_outputs((padded, y.t()), [x], 10**9) is None
    assert "too large" in cuda_graphs._unsafe_outputs((y,), [x], 49 * y.nbytes)
    assert cuda_graphs._unsafe_outputs((y, 3), [x], 50 * y.nbytes) is None


def test_a_graphed_plan_on_cpu_tensors_runs_step_by_step_and_captures_nothing(resnet_manifest):
    calls = []

    def runner(args):
        calls.append(args)
        return (args[0] + 1,)

    plan = GraphedPlan(runner, resnet_manifest)
    x = torch.zeros(3)
    before = cuda_graphs.stats.captures
    for _ in range(3):
        (y,) = plan([x])
        assert torch.equal(y, torch.ones(3))
    assert len(calls) == 3 and cuda_graphs.stats.captures == before and not plan.graphs


def test_graphs_are_keyed_on_tensor_pointers_and_plain_values_only():
    cpu = torch.zeros(2)
    assert cuda_graphs._pointer_key([cpu, 3]) is None  # CPU tensors are never graphed
    assert cuda_graphs._pointer_key([3, None]) is None  # no tensor at all
    if torch.cuda.is_available():
        g = torch.zeros(2, device="cuda")
        assert cuda_graphs._pointer_key([g, 3, None]) == (g.data_ptr(), 3, None)
        assert cuda_graphs._pointer_key([g, [1, 2]]) is None


def test_fxcc_cuda_graphs_setting():
    assert ClientSettings.from_env({}).cuda_graphs is True
    assert ClientSettings.from_env({"FXCC_CUDA_GRAPHS": "0"}).cuda_graphs is False
    assert ClientSettings().with_options({"cuda_graphs": False}).cuda_graphs is False
    with pytest.raises(ValueError, match="FXCC_CUDA_GRAPHS must be 0 or 1"):
        ClientSettings.from_env({"FXCC_CUDA_GRAPHS": "maybe"})

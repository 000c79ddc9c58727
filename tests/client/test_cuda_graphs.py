"""Which plans replay as CUDA graphs, and what a graphed plan refuses to copy out (no GPU needed;
the replays themselves are checked on a GPU in tests/gpu/test_cuda_graphs_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from fxcc.client import cuda_graphs
from fxcc.client.cuda_graphs import GraphedPlan, allocated_bytes, why_not_graphed
from fxcc.client.settings import ClientSettings
from fxcc.compiler_core.artifact import ExternStep
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target
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

    from fxcc.compiler_core.artifact import SymbolBinding

    symbolic = plan.model_copy(update={"symbols": [SymbolBinding(name="s0", input=0, dim=0)]})
    assert why_not_graphed(resnet_manifest.model_copy(update={"plan": symbolic}), inference=True) \
        == "sizes are symbolic"


def test_allocated_bytes_counts_the_plans_own_buffers(resnet_manifest):
    from fxcc.compiler_core.artifact import AllocStep

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


# ---------------------------------------------------------------- plans cut before large outputs


@pytest.fixture(scope="module")
def lm_manifest():
    """A small language-model head's plan for sm_90: its logits (vocab 4096) dwarf what the plan
    allocates."""
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64))
              for _ in range(4)]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(64, 4096, bias=False)).eval()
    spec, _ = cuda_spec(model, torch.randn(2, 32, 64))
    request = CompileRequest(graph=spec, options=CompileOptions(target=Target(kind="cuda", arch=90)))
    return compile_request(request).manifest


class _Runner:
    """Stands in for a PlanRunner: _check_outputs only asks whether it can run step ranges."""

    def __call__(self, args):  # pragma: no cover - never called here
        raise AssertionError

    def run_steps(self, env, start, stop=None):  # pragma: no cover
        raise AssertionError


def _fake_outputs(manifest, sizes):
    return tuple(torch.empty(n, dtype=torch.uint8) for n in sizes)


def test_large_outputs_move_behind_a_cut_at_the_step_that_allocates_them(lm_manifest):
    from fxcc.client.cuda_graphs import graph_cut, launches, live_across

    plan = lm_manifest.plan
    (logits,) = [o.name for o in plan.outputs]
    cut = graph_cut(plan, [logits])
    assert cut is not None and launches(plan, cut) >= cuda_graphs.MIN_LAUNCHES
    tail = plan.steps[cut:]
    # the tail begins where the logits' storage comes from and holds the LM head's matmul
    assert getattr(tail[0], "out", None) is not None
    assert any(isinstance(s, ExternStep) and s.op.split(".")[1] in ("mm", "addmm") for s in tail)
    live = live_across(plan, cut)
    assert live and logits not in live
    defined_before = {getattr(s, "out", None) for s in plan.steps[:cut]}
    assert set(live) <= defined_before

    told = []
    graphed = GraphedPlan(_Runner(), lm_manifest, on_cut=told.append)
    logits_bytes = 2 * 32 * 4096 * 4
    reason = graphed._check_outputs(_fake_outputs(lm_manifest, [logits_bytes]), [torch.zeros(1)])
    assert reason is None and graphed.cut == cut and graphed.live == live
    assert told and told[0].startswith(f"cuda graph for steps 1-{cut}, then ")


def test_a_cut_needs_a_prefix_worth_graphing_and_a_runner_that_runs_ranges(lm_manifest):
    logits_bytes = 2 * 32 * 4096 * 4
    assert logits_bytes * cuda_graphs.OUTPUT_SHARE > allocated_bytes(lm_manifest)
    plain = GraphedPlan(lambda args: (), lm_manifest)  # no run_steps: cannot cut
    assert "too large" in plain._check_outputs(_fake_outputs(lm_manifest, [logits_bytes]), [torch.zeros(1)])
    assert plain.cut is None

    plan = lm_manifest.plan
    from fxcc.client.cuda_graphs import graph_cut

    cut = graph_cut(plan, [plan.outputs[0].name])
    # the same plan with the large output's storage coming from its first step: nothing to graph
    short = plan.model_copy(update={"steps": plan.steps[cut:]})
    manifest = lm_manifest.model_copy(update={"plan": short})
    graphed = GraphedPlan(_Runner(), manifest)
    assert graphed._check_outputs(_fake_outputs(manifest, [10**9]), [torch.zeros(1)]) is not None
    assert graphed.cut is None


def test_an_output_reusing_or_viewing_earlier_storage_cuts_at_that_storages_origin():
    from fxcc.client.cuda_graphs import graph_cut, live_across
    from fxcc.compiler_core.artifact import AllocStep, FreeStep, KernelStep, Plan
    from fxcc.compiler_core.wire import IntArg, ListArg, NodeRef, TensorSpec

    spec = TensorSpec(dtype="float32", sizes=[4], strides=[1], device="cuda")
    k = [KernelStep(kernel="k", args=[NodeRef(name="x")], grid=[1]) for _ in range(3)]
    steps = [
        *k,                                                                      # 0-2
        AllocStep(out="a", spec=spec),                                           # 3
        KernelStep(kernel="k", args=[NodeRef(name="x"), NodeRef(name="a")], grid=[1]),
        ExternStep(op="aten.relu.default", args=[NodeRef(name="a")], out="h"),  # 5
        FreeStep(names=["a"]),
        AllocStep(out="b", spec=spec, reuse="h"),                                # 7: h's storage
        KernelStep(kernel="k", args=[NodeRef(name="b")], grid=[1]),
        ExternStep(op="aten.mm.default", args=[NodeRef(name="b"), NodeRef(name="w")], out="big"),  # 9
        ExternStep(op="aten.as_strided.default",
                   args=[NodeRef(name="big"), ListArg(items=[IntArg(value=2)]), ListArg(items=[IntArg(value=1)])],
                   out="v"),                                                     # 10
    ]
    plan = Plan(inputs=["x", "w"], steps=steps, outputs=[NodeRef(name="v"), NodeRef(name="b")])
    assert graph_cut(plan, ["v"]) == 9  # a view: where its base was made
    assert graph_cut(plan, ["b"]) == 5  # a reused buffer: where the storage it took was made
    assert graph_cut(plan, ["v", "b"]) == 5
    assert graph_cut(plan, ["x"]) is None  # an input's storage is the caller's
    assert live_across(plan, 9) == ["b"]
    assert live_across(plan, 5) == ["a"]  # "a" is read by relu at the cut; "h" is made after it


def test_the_steps_after_a_cut_need_only_the_live_values_and_give_the_whole_plans_outputs():
    """A replay's tail starts from a fresh call's inputs plus what the graph left (live_across):
    run that way on the CPU, the plan gives what it gives in one piece."""
    from fxcc.client.cuda_graphs import graph_cut, live_across
    from fxcc.client.runtime import load_plan

    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64))
              for _ in range(4)]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(64, 512, bias=False)).eval()
    from tests.compiler_core.test_passes_layout import capture

    x = torch.randn(2, 8, 64)
    cap = capture(model, x)
    art = compile_request(CompileRequest(graph=cap.spec))
    runner = load_plan(art)
    args = [x, *cap.constants]
    (whole,) = runner(args)
    plan = art.manifest.plan
    cut = graph_cut(plan, [plan.outputs[0].name])
    assert cut is not None and 0 < cut < len(plan.steps)
    env = runner.begin(args)
    runner.run_steps(env, 0, cut)
    live = {n: env[n] for n in live_across(plan, cut)}
    tail = runner.begin(args)
    tail.update(live)
    runner.run_steps(tail, cut)
    (got,) = runner.finish(tail)
    torch.testing.assert_close(got, whole, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)


def test_a_measured_call_weighs_the_fresh_storages_of_its_extern_results_once():
    """What a graphed plan's warm-up call adds to the budget its outputs are weighed against: the
    extern results' fresh storages (an MLP whose activations are all addmm results, written in
    place by its pointwise kernels, allocates almost nothing of its own), views of an input or of
    an earlier result not counted again."""
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.artifact import Artifact, ArtifactManifest, CompileStats, FreeStep, Plan
    from fxcc.compiler_core.compile import local_versions
    from fxcc.compiler_core.wire import IntArg, ListArg, NodeRef, Target

    def ints(*v):
        return ListArg(items=[IntArg(value=i) for i in v])

    x, w = torch.randn(64, 32), torch.randn(48, 32)
    steps = [
        ExternStep(op="aten.t.default", args=[NodeRef(name="w")], out="wt"),        # a view of an input
        ExternStep(op="aten.mm.default", args=[NodeRef(name="x"), NodeRef(name="wt")], out="h"),  # 64x48
        ExternStep(op="aten.view.default", args=[NodeRef(name="h"), ints(48, 64)], out="hv"),  # a view of h
        ExternStep(op="aten.sum.dim_IntList", args=[NodeRef(name="hv"), ints(1)], out="s"),  # 48 floats
        FreeStep(names=["wt", "h", "hv"]),
    ]
    plan = Plan(inputs=["x", "w"], steps=steps, outputs=[NodeRef(name="s")])
    manifest = ArtifactManifest(key="0" * 64, versions=local_versions(), target=Target(), plan=plan, kernels=[],
                                stats=CompileStats())
    runner = load_plan(Artifact(manifest, {}))
    (got,), fresh = runner.call_measured([x, w])
    torch.testing.assert_close(got, (x @ w.t()).view(48, 64).sum(1))
    assert fresh == (64 * 48 + 48) * 4
    (again,) = runner([x, w])
    torch.testing.assert_close(again, got, rtol=0, atol=0)

"""The channels-last pass: CUDA conv nets get NHWC convolutions, the same values and output strides."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client import runtime
from fxcc.client.backend import decomposition_table
from fxcc.client.capture import Capture, capture_graph
from fxcc.client.examples import Bottleneck, ResNet50
from fxcc.client.runtime import load_plan
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.build import cuda_build_unavailable
from fxcc.compiler_core.graph import rebuild_graph, wire_graph
from fxcc.compiler_core.passes import run_passes
from fxcc.compiler_core.passes.layout import (
    MAX_RESTORED_OUTPUTS,
    channels_last_convs,
    conv_class,
    cudnn_layout,
    cudnn_vals,
)
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, GraphSpec, Target
from tests.compiler_core.helpers import build_for_sm90, run_pass

aten = torch.ops.aten
CUDA = CompileOptions(target=Target(kind="cuda", arch=90))


def small_resnet(seed: int = 0) -> nn.Module:
    """A stem, a bottleneck with an identity shortcut, a strided one with a downsample, a head."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
        Bottleneck(16, 4, 1), Bottleneck(16, 8, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()
    for m in model.modules():  # running stats that are not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
    return model


def capture(fn: Any, *inputs: torch.Tensor) -> Capture:
    """`fn` traced to core aten in inference, as the backend captures it (parameters as constants)."""
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    return capture_graph(gm, list(inputs))


def on_device(spec: GraphSpec, device: str) -> GraphSpec:
    placeholders = [p.model_copy(update={"spec": p.spec.model_copy(update={"device": device})})
                    for p in spec.placeholders]
    return spec.model_copy(update={"placeholders": placeholders})


def cuda_spec(fn: Any, *inputs: torch.Tensor) -> tuple[GraphSpec, list[torch.Tensor]]:
    """The graph with its inputs on a (fake) CUDA device, and every input's CPU value."""
    cap = capture(fn, *inputs)
    return on_device(cap.spec, "cuda"), list(inputs) + cap.constants


def nodes(gm: torch.fx.GraphModule, target: Any) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


def is_cl(node: torch.fx.Node) -> bool:
    return node.meta["val"].is_contiguous(memory_format=torch.channels_last)


def outputs(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(gm(*inputs))


def assert_same_outputs(gm: torch.fx.GraphModule, new_gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> None:
    """Both graphs run eagerly (aten on CPU): the same values, and the same strides."""
    for old, new in zip(outputs(gm, inputs), outputs(new_gm, inputs), strict=True):
        torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-5)
        assert [s for s, n in zip(new.stride(), new.shape) if n > 1] == \
            [s for s, n in zip(old.stride(), old.shape) if n > 1]


# ---------------------------------------------------------------- the rewritten graph


def test_conv_net_gets_channels_last_convs_and_keeps_its_results():
    x = torch.randn(2, 3, 32, 32)
    spec, inputs = cuda_spec(small_resnet(), x)
    gm = rebuild_graph(spec)
    new_gm, new_spec = run_pass(channels_last_convs, spec, "cuda")
    convs = nodes(new_gm, aten.convolution.default)
    assert len(convs) == len(nodes(gm, aten.convolution.default)) == 8
    for conv in convs:
        assert is_cl(conv.args[0]) and is_cl(conv.args[1]) and is_cl(conv), conv.name
    # The only copies are the one-time conversions of graph inputs: the image and each k×k weight
    # (1×1 weights are channels-last already); each intermediate is written channels-last.
    copies = nodes(new_gm, aten.clone.default)
    assert copies and all(c.args[0].op == "placeholder" for c in copies)
    assert sorted(tuple(c.args[0].meta["val"].shape) for c in copies) == \
        sorted([(2, 3, 32, 32), (16, 3, 3, 3), (4, 4, 3, 3), (8, 8, 3, 3)])
    assert all(is_cl(n) for n in nodes(new_gm, aten.relu.default))
    assert len({c.args[0] for c in copies}) == len(copies)
    assert [n.name for n in new_gm.graph.nodes if n.op == "call_function"] == [n.name for n in new_spec.nodes]
    assert_same_outputs(gm, new_gm, inputs)


@pytest.mark.parametrize("stride", [1, 2], ids=["identity_shortcut", "downsample"])
def test_a_block_input_read_twice_is_copied_once(stride):
    """The block's input feeds conv1 and the shortcut (the residual add, or the downsample conv)."""
    torch.manual_seed(0)
    block = Bottleneck(16, 4 if stride == 1 else 8, stride).eval()
    x = torch.randn(2, 16, 8, 8)
    spec, inputs = cuda_spec(block, x)
    gm = rebuild_graph(spec)
    new_gm, _ = run_pass(channels_last_convs, spec, "cuda")
    image = next(n for n in new_gm.graph.nodes if n.op == "placeholder" and n.meta["val"].shape == x.shape)
    copies = [u for u in image.users if u.target is aten.clone.default]
    assert len(copies) == 1 and all(c.args[0] is copies[0] for c in nodes(new_gm, aten.convolution.default)
                                    if c.args[0].op == "call_function" and c.args[0].args[0] is image)
    assert all(is_cl(c.args[0]) for c in nodes(new_gm, aten.convolution.default))
    assert_same_outputs(gm, new_gm, inputs)


def test_a_4d_output_keeps_eagers_strides():
    """A conv net whose output is a feature map: it comes back contiguous, as without the pass."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1)).eval()
    x = torch.randn(2, 3, 16, 16)
    spec, inputs = cuda_spec(model, x)
    gm = rebuild_graph(spec)
    new_gm, new_spec = run_pass(channels_last_convs, spec, "cuda")
    assert new_spec is not spec
    (out,) = next(iter(reversed(new_gm.graph.nodes))).args[0]
    assert out.target is aten.clone.default and is_cl(out.args[0])
    assert out.meta["val"].is_contiguous()
    assert_same_outputs(gm, new_gm, inputs)


@pytest.mark.parametrize("maps", [2, MAX_RESTORED_OUTPUTS + 1])
def test_feature_maps_returned_are_copied_back_up_to_a_limit(maps):
    """A net returning several feature maps (a detection backbone): each comes back contiguous
    through one copy; past MAX_RESTORED_OUTPUTS copies the pass does not pay and stays out."""
    torch.manual_seed(0)
    convs = nn.ModuleList(nn.Conv2d(8, 8, 3, padding=1) for _ in range(maps))

    def backbone(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feats = []
        for conv in convs:
            x = conv(x).relu()
            feats.append(x * 2)
        return tuple(feats)
    spec, inputs = cuda_spec(backbone, torch.randn(2, 8, 8, 8))
    gm = rebuild_graph(spec)
    new_gm, new_spec = run_pass(channels_last_convs, spec, "cuda")
    if maps > MAX_RESTORED_OUTPUTS:
        assert new_spec is spec
        return
    assert sum(n.name.endswith("_fxout") for n in new_spec.nodes) == maps
    assert all(is_cl(c) for c in nodes(new_gm, aten.convolution.default))
    assert_same_outputs(gm, new_gm, inputs)


def test_a_flattening_view_reads_a_contiguous_copy():
    """`view` needs strides that fit its sizes: the flatten of a channels-last map reads NCHW."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 4)).eval()
    x = torch.randn(2, 3, 8, 8)
    spec, inputs = cuda_spec(model, x)
    gm = rebuild_graph(spec)
    new_gm, new_spec = run_pass(channels_last_convs, spec, "cuda")
    assert new_spec is not spec
    (view,) = nodes(new_gm, aten.view.default)
    assert view.args[0].target is aten.clone.default and view.args[0].meta["val"].is_contiguous()
    assert is_cl(view.args[0].args[0])
    assert_same_outputs(gm, new_gm, inputs)


@pytest.mark.parametrize("case", ["interpret", "grouped", "transposed", "matmul_bound", "conv1d", "float64",
                                  "mutation"])
def test_left_alone(case):
    x = torch.randn(2, 8, 8, 8)
    model: nn.Module = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
    if case == "grouped":
        model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.ReLU())
    elif case == "transposed":
        model = nn.Sequential(nn.ConvTranspose2d(8, 8, 3, padding=1), nn.ReLU())
    elif case == "matmul_bound":
        model = nn.Sequential(nn.Conv2d(8, 8, 1), nn.Flatten(), nn.Linear(512, 4096), nn.Linear(4096, 4096))
    elif case == "conv1d":
        model, x = nn.Sequential(nn.Conv1d(8, 8, 3), nn.ReLU()), torch.randn(2, 8, 16)
    elif case == "float64":
        model, x = model.double(), x.double()
    elif case == "mutation":
        model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=True))
    spec, _ = cuda_spec(model.eval(), x)
    gm = rebuild_graph(spec)
    if case == "mutation":
        assert any(n.target is aten.relu_.default for n in gm.graph.nodes)
    assert not channels_last_convs(gm, "interpret" if case == "interpret" else "cuda")


def _training_specs() -> list[GraphSpec]:
    """The forward and backward graphs of a bottleneck's training step as the backend captures
    them: the forward's saved activations of free layout, its pass's output strides reported to
    AOTAutograd, which lays the backward's inputs out so."""
    from bench.reduction_shapes import training_specs

    return training_specs(small_resnet()[5].train(), torch.randn(2, 16, 8, 8))


def test_training_graphs_go_channels_last_across_forward_and_backward():
    """The forward's convs read channels-last operands and its saved activations leave as they are
    (no copy back); the backward gets them channels-last (AOTAutograd restrides its inputs as the
    forward reported), and its conv backwards read channels-last gradients, inputs and weights."""
    fw, bw = _training_specs()
    assert fw.free_layout_outputs and not bw.free_layout_outputs
    fw_gm, fw_spec = run_pass(channels_last_convs, fw, "cuda")
    convs = nodes(fw_gm, aten.convolution.default)
    assert len(convs) == 4 and all(is_cl(c.args[0]) and is_cl(c.args[1]) and is_cl(c) for c in convs)
    # Only the block's own output (the user's, not saved) is copied back to eager's layout.
    restored = [i for i, o in enumerate(fw_spec.outputs) if o.kind == "node" and o.name.endswith("_fxout")]
    assert len(restored) == 1 and restored[0] not in fw.free_layout_outputs
    copies = [c for c in nodes(fw_gm, aten.clone.default) if not c.name.endswith("_fxout")]
    assert copies and all(c.args[0].op == "placeholder" for c in copies)  # the input and k×k weights
    saved = [p for p in bw.placeholders if len(p.spec.sizes) == 4 and p.spec.sizes[1] > 1
             and p.spec.sizes[2] > 1]
    assert any(channels_last(p.spec.sizes, p.spec.strides) for p in saved)
    bw_gm, _ = run_pass(channels_last_convs, bw, "cuda")
    backs = nodes(bw_gm, aten.convolution_backward.default)
    assert len(backs) == 4
    for b in backs:
        assert all(is_cl(a) for a in b.args[:3]), b.name
        grads = b.meta["val"]
        assert all(g is None or g.is_contiguous(memory_format=torch.channels_last) for g in grads[:2])
    # The 3×3 weight's gradient leaves in its parameter's layout (contiguous): a copy of cuDNN's
    # channels-last result, so AccumulateGrad copies none (1×1 ones are both layouts at once).
    out = next(n for n in bw_gm.graph.nodes if n.op == "output").args[0]
    grads = [o for o in out if isinstance(o, torch.fx.Node) and o.name.endswith("_fxgrad")]
    assert [list(g.meta["val"].shape[2:]) for g in grads] == [[3, 3]]
    assert all(g.meta["val"].is_contiguous() for g in grads)
    assert all(c.args[0].op == "placeholder" or c.name.endswith("_fxgrad") for c in nodes(bw_gm, aten.clone.default))


def test_cuda_convs_are_laid_out_as_cudnn_lays_them_out():
    """A CPU-only torch fakes a CUDA conv of channels-last operands as contiguous; cuDNN (and the
    FakeTensors of a CUDA torch) give channels-last. The pass derives cuDNN's layout, and what
    follows from it, so a CPU worker's plan is a GPU worker's. Here the operands are channels-last
    already (a model the user converted): no copy, and the output stays channels-last as in eager."""
    x = torch.randn(2, 4, 8, 8).to(memory_format=torch.channels_last)
    w = torch.randn(4, 4, 3, 3).to(memory_format=torch.channels_last)
    spec = on_device(capture(lambda a, b: aten.convolution(a, b, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
                             .relu(), x, w).spec, "cuda")
    gm = rebuild_graph(spec)
    assert not is_cl(nodes(gm, aten.convolution.default)[0])  # this CPU-only torch's answer
    before = cudnn_vals(gm)
    assert all(before[n].is_contiguous(memory_format=torch.channels_last) for n in gm.graph.nodes
               if n.op == "call_function")
    new_gm, new_spec = run_pass(channels_last_convs, spec, "cuda")
    assert new_spec.nodes == spec.nodes and new_spec.outputs == spec.outputs
    (conv,) = nodes(new_gm, aten.convolution.default)
    (relu,) = nodes(new_gm, aten.relu.default)
    assert is_cl(conv) and is_cl(relu) and conv.meta["val"].device.type == "cuda"
    assert cudnn_layout(x, w) == "channels_last"
    assert cudnn_layout(x.contiguous(), w.contiguous()) == "contiguous_format"
    assert cudnn_layout(x.contiguous(), w) == "channels_last"  # either operand decides
    assert cudnn_layout(x.double(), w.double()) == "contiguous_format"


def test_the_builds_dtype_lookup_sees_the_pass():
    """fxcc.compiler_core.build looks dtypes up in run_passes' graph: the copies are in it."""
    spec, _ = cuda_spec(small_resnet(), torch.randn(2, 3, 32, 32))
    gm = rebuild_graph(spec)
    assert run_passes(gm, "cuda")
    new_spec = wire_graph(gm, spec)
    assert any(n.name.endswith("_fxcl") for n in gm.graph.nodes)
    assert [n.name for n in gm.graph.nodes if n.op == "call_function"] == [n.name for n in new_spec.nodes]


# ---------------------------------------------------------------- the compiled plan


def plan_layouts(art: Artifact, spec: GraphSpec) -> dict[str, tuple[list[Any], list[Any]]]:
    """(sizes, strides) of every plan name whose layout the plan fixes: inputs, allocations,
    extern results (their expected strides), views."""
    out = {p.name: (list(p.spec.sizes), list(p.spec.strides)) for p in spec.placeholders}
    for s in art.manifest.plan.steps:
        if s.kind == "alloc":
            out[s.out] = (list(s.spec.sizes), list(s.spec.strides))
        elif s.kind == "extern" and s.op == "aten.as_strided.default":
            out[s.out] = ([a.value for a in s.args[1].items], [a.value for a in s.args[2].items])
        elif s.kind == "extern" and s.expect_strides is not None:
            out[s.out] = (None, list(s.expect_strides))
    return out


def channels_last(sizes: list[int], strides: list[int]) -> bool:
    _, c, h, w = sizes
    return all(sz == 1 or a == b for sz, a, b in zip(sizes, strides, [h * w * c, 1, w * c, c]))


def conversion_kernels(art: Artifact) -> int:
    """Kernels that read nothing but graph inputs (the one-time layout conversions)."""
    inputs, count = set(art.manifest.plan.inputs), 0
    fresh: set[str] = set()  # allocated since the last kernel: what the next kernel writes
    for s in art.manifest.plan.steps:
        if s.kind == "alloc":
            fresh.add(s.out)
        elif s.kind == "kernel":
            names = [a.name for a in s.args if a.kind == "node"]
            in_place = len(names) != len(set(names))  # reads a buffer and writes over it: no conversion
            count += not in_place and set(names) <= inputs | fresh
            fresh = set()
    return count


def compile_cuda(spec: GraphSpec, layout_pass: bool = True) -> Artifact:
    with pytest.MonkeyPatch.context() as mp:
        if not layout_pass:
            mp.setattr("fxcc.compiler_core.passes.layout.channels_last_convs", lambda gm, target: False)
        return compile_request(CompileRequest(graph=spec, options=CUDA))


@pytest.fixture(scope="module")
def compiled() -> dict[str, Any]:
    x = torch.randn(2, 3, 32, 32)
    spec, inputs = cuda_spec(small_resnet(), x)
    return {"spec": spec, "inputs": inputs, "x": x, "art": compile_cuda(spec),
            "baseline": compile_cuda(spec, layout_pass=False)}


@pytest.fixture(scope="module")
def resnet50() -> dict[str, Any]:
    """The benchmark's ResNet-50 (client.examples) at a CPU size: the same graph as at 224² but for sizes."""
    torch.manual_seed(0)
    spec, _ = cuda_spec(ResNet50().eval(), torch.randn(2, 3, 64, 64))
    return {"spec": spec, "art": compile_cuda(spec), "baseline": compile_cuda(spec, layout_pass=False)}


def check_conv_plan(plans: dict[str, Any], convs: int, conversions: int) -> None:
    """Every conv extern reads channels-last operands and is expected to return channels-last (as
    cuDNN does); against the plan without the pass: the same extern calls, and the same kernels
    but for at most `conversions` one-time conversions of graph inputs (equal-shaped weights
    share one kernel); no other copy anywhere."""
    art, baseline, spec = plans["art"], plans["baseline"], plans["spec"]
    layouts = plan_layouts(art, spec)
    new_gm, _ = run_pass(run_passes, spec, "cuda")  # the names of every pass's nodes (a peeled conv bias's)
    sizes = {n.name: list(n.meta["val"].shape) for n in new_gm.graph.nodes
             if isinstance(n.meta.get("val"), torch.Tensor)}
    sizes |= {s.out: list(s.spec.sizes) for s in art.manifest.plan.steps if s.kind == "alloc"}
    steps = [s for s in art.manifest.plan.steps if s.kind == "extern" and s.op == "aten.convolution.default"]
    assert len(steps) == convs
    for conv in steps:
        for a in conv.args[:2]:
            assert channels_last(sizes[a.name], layouts[a.name][1]), (conv.out, a.name, layouts[a.name])
        assert channels_last(sizes[conv.out], conv.expect_strides)  # read as NHWC, as cuDNN writes it
    before = [s for s in baseline.manifest.plan.steps if s.kind == "extern" and s.op == "aten.convolution.default"]
    assert not any(channels_last(sizes[c.out], c.expect_strides) for c in before)
    assert conversion_kernels(baseline) == 0
    assert 1 <= conversion_kernels(art) <= conversions
    assert art.manifest.stats.kernels - conversion_kernels(art) <= baseline.manifest.stats.kernels
    assert [s.op for s in art.manifest.plan.steps if s.kind == "extern"] == \
        [s.op for s in baseline.manifest.plan.steps if s.kind == "extern"]


def test_compiled_plan_calls_convs_on_channels_last_tensors(compiled):
    check_conv_plan(compiled, convs=8, conversions=4)  # image, the stem's, the 4×4 and 8×8 3×3 weights


def test_compiled_resnet50_plan_calls_convs_on_channels_last_tensors(resnet50):
    check_conv_plan(resnet50, convs=53, conversions=6)  # image, the 7×7 stem, the 3×3 weights of 4 widths


def test_transformed_graph_compiled_for_the_cpu_matches_eager(compiled):
    """The rewritten graph, compiled for the interpreter and run on CPU tensors: eager's values
    and strides, and no extern result needed re-laying."""
    spec, inputs = compiled["spec"], compiled["inputs"]
    _, new_spec = run_pass(channels_last_convs, spec, "cuda")
    art = compile_request(CompileRequest(graph=on_device(new_spec, "cpu")))
    runtime._relaid.clear()
    (got,) = load_plan(art)(inputs)
    with torch.no_grad():
        want = small_resnet()(compiled["x"])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got.stride() == want.stride()
    assert not runtime._relaid


@pytest.mark.skipif(cuda_build_unavailable() is not None, reason="cannot cross-compile for CUDA here")
def test_channels_last_kernels_build_for_sm90(compiled, tmp_path):
    """Every kernel of the plan (those that read and write NHWC, and the conversions) cross-compiles
    to an sm_90 cubin, as on a CPU worker.

    Note: built in a fresh process without TRITON_INTERPRET, as a CPU worker builds (that a
    cross-compile after interpreted launches in one process works is test_interpreter_leak's).
    """
    kernels = build_for_sm90(CompileRequest(graph=compiled["spec"], options=CUDA), tmp_path)
    assert len(kernels) >= 6 and any(name.startswith("fxcc_red_") for name, _, _ in kernels)
    for name, error, built in kernels:
        assert error is None and built, (name, error)


def test_depthwise_separable_convs_go_channels_last():
    """An EfficientNet-style block (1x1 expand, depthwise 3x3, 1x1 project): every conv, the
    depthwise one included, reads channels-last operands, and no copy sits between them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 32, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU(),
                          nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False), nn.BatchNorm2d(32), nn.SiLU(),
                          nn.Conv2d(32, 8, 1, bias=False), nn.BatchNorm2d(8)).eval()
    x = torch.randn(2, 8, 16, 16)
    spec, inputs = cuda_spec(model, x)
    gm = rebuild_graph(spec)
    new_gm, _ = run_pass(channels_last_convs, spec, "cuda")
    convs = nodes(new_gm, aten.convolution.default)
    assert len(convs) == 3 and convs[1].args[8] == 32
    for conv in convs:
        assert is_cl(conv.args[0]) and is_cl(conv.args[1]) and is_cl(conv), conv.name
    assert all(c.args[0].op == "placeholder" for c in nodes(new_gm, aten.clone.default)
               if not c.name.endswith("_fxout"))
    assert_same_outputs(gm, new_gm, inputs)


def test_grouped_convs_with_wide_groups_stay_nchw():
    """Grouped convs of several input channels per group are slower channels-last (Inductor's
    ratios): a net made of them keeps NCHW."""
    model = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, groups=2), nn.ReLU()).eval()
    spec, _ = cuda_spec(model, torch.randn(2, 64, 8, 8))
    gm = rebuild_graph(spec)
    assert conv_class(nodes(gm, aten.convolution.default)[0]) == "grouped"
    assert not channels_last_convs(gm, "cuda")


class _ConvNeXtBlock(nn.Module):
    """torchvision's ConvNeXt block: depthwise 7x7, to NHWC, LayerNorm, an MLP (4x), layer scale,
    back to NCHW, residual. Its matmuls do most of the work."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.rand(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        y = self.down(nn.functional.gelu(self.up(y))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


def _convnext_like(pool_view: bool) -> nn.Module:
    """A stem, two blocks, a downsampling conv; the head's global pool (restrided by as_strided,
    as ConvNeXt's head is in AOTAutograd's graph, where `pool_view`), a Linear."""

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pooled = x.mean((2, 3), keepdim=True)
            if pool_view:
                pooled = pooled.as_strided(pooled.shape, (pooled.shape[1], 1, pooled.shape[1], pooled.shape[1]))
            return self.fc(pooled.flatten(1))

    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 32, 4, 4), _ConvNeXtBlock(32), _ConvNeXtBlock(32),
                         nn.Conv2d(32, 64, 2, 2), _ConvNeXtBlock(64), Head()).eval()


@pytest.mark.parametrize("pool_view", [False, True], ids=["head", "head_as_strided"])
def test_a_convnext_goes_channels_last_though_its_matmuls_do_most_of_the_work(pool_view: bool) -> None:
    """Several convs between MLPs (as Inductor decides: no matmul rule): every conv reads and gives
    NHWC, each block's permute to [N, H, W, C] is then a view of contiguous rows (the LayerNorm
    reads them whole, the Linear as they are), and an as_strided of the [N, C, 1, 1] pool, which
    lies alike in either layout, does not stop it."""
    model = _convnext_like(pool_view)
    x = torch.randn(2, 3, 32, 32)
    spec, inputs = cuda_spec(model, x)
    gm = rebuild_graph(spec)
    new_gm, _ = run_pass(channels_last_convs, spec, "cuda")
    convs = nodes(new_gm, aten.convolution.default)
    assert len(convs) == 5
    for conv in convs:
        assert is_cl(conv.args[0]) and is_cl(conv), conv.name
    rows = [p for p in nodes(new_gm, aten.permute.default) if p.args[1] == [0, 2, 3, 1]]
    assert len(rows) == 3 and all(p.meta["val"].is_contiguous() for p in rows)
    assert_same_outputs(gm, new_gm, inputs)


@pytest.mark.parametrize("view", ["map", "corner", "inner_pixel"])
def test_an_as_strided_view_of_a_feature_map_still_stops_the_pass(view: str) -> None:
    """as_strided reads memory by strides: of a spatial map, or of a [N, C, 1, 1] slice of one
    (which lies in the map's storage), the pass would change what it reads."""

    def fn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.conv2d(torch.nn.functional.conv2d(x, w1, padding=1).relu(), w2, padding=1)
        if view == "map":
            return y.as_strided((2, 8, 4, 4), (512, 64, 8, 1))
        p = y[:, :, :1, :1] if view == "corner" else y[:, :, 1:2, 1:2]
        return p.as_strided(p.shape, (512, 64, 8, 1)) * 2

    spec, _ = cuda_spec(fn, torch.randn(2, 8, 8, 8), torch.randn(8, 8, 3, 3), torch.randn(8, 8, 3, 3))
    assert not channels_last_convs(rebuild_graph(spec), "cuda")


def test_a_convnext_plan_runs_channels_last_with_no_conversion_inside() -> None:
    """The rewritten ConvNeXt-like graph, compiled for the interpreter and run: eager's values and
    strides, no extern result re-laid; compiled for sm_90, every conv reads NHWC and the kernels
    are those of the plan without the pass but for the one-time conversions of graph inputs."""
    model = _convnext_like(pool_view=True)
    x = torch.randn(2, 3, 32, 32)
    spec, inputs = cuda_spec(model, x)
    _, new_spec = run_pass(channels_last_convs, spec, "cuda")
    art = compile_request(CompileRequest(graph=on_device(new_spec, "cpu")))
    runtime._relaid.clear()
    (got,) = load_plan(art)(inputs)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not runtime._relaid
    plans = {"spec": spec, "art": compile_cuda(spec), "baseline": compile_cuda(spec, layout_pass=False)}
    check_conv_plan(plans, convs=5, conversions=4)  # image, the stem's and the downsampler's weights


def test_a_wide_convnext_block_normalizes_rows_in_one_kernel() -> None:
    """ConvNeXt-T's third stage (384 channels): NCHW, its LayerNorm reduced along columns in two
    stages plus a normalizing pass (three kernels, torchvision's model on the H200: 146 against
    Inductor's 128); channels-last, one persistent row reduction that normalizes too."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(384, 384, 1), _ConvNeXtBlock(384)).eval()
    spec, _ = cuda_spec(model, torch.randn(2, 384, 14, 14))
    art, baseline = compile_cuda(spec), compile_cuda(spec, layout_pass=False)

    def reductions(a: Artifact) -> int:
        return sum(1 for s in a.manifest.plan.steps if s.kind == "kernel" and s.kernel.startswith("fxcc_red_"))

    assert reductions(baseline) == 2 and reductions(art) == 1
    assert art.manifest.stats.kernels - conversion_kernels(art) < baseline.manifest.stats.kernels

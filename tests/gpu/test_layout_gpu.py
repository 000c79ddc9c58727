"""On a GPU: conv nets compiled with the channels-last pass match eager, and cuDNN lays its results
out as the plan expects (no extern result re-laid at run time). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]


def _channels_last(sizes: list[int], strides: list[int]) -> bool:
    _, c, h, w = sizes
    return all(sz == 1 or a == b for sz, a, b in zip(sizes, strides, [h * w * c, 1, w * c, c]))


@pytest.mark.usefixtures("no_tf32")
def test_small_resnet_runs_its_convs_channels_last_and_matches_eager():
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client import runtime
    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_and_build
    from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target
    from tests.compiler_core.test_passes_layout import small_resnet

    model = small_resnet().cuda()
    x = torch.randn(4, 3, 64, 64, device="cuda")
    with torch.no_grad():
        gm = make_fx(model, decomposition_table=decomposition_table())(x)
        expected = model(x)
    cap = capture_graph(gm, [x])
    major, minor = torch.cuda.get_device_capability()
    target = Target(kind="cuda", arch=major * 10 + minor)
    art = compile_and_build(CompileRequest(graph=cap.spec, options=CompileOptions(target=target)))
    convs = [s for s in art.manifest.plan.steps if s.kind == "extern" and s.op == "aten.convolution.default"]
    assert len(convs) == 8
    runtime._relaid.clear()
    with torch.no_grad():
        (got,) = load_plan(art)([x, *cap.constants])
        torch.cuda.synchronize()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert got.stride() == expected.stride()
    # cuDNN returned every conv channels-last, as the plan reads it: nothing was copied
    sizes = {n.name: list(n.meta["val"].shape) for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    assert all(_channels_last(sizes[c.out], c.expect_strides) for c in convs)
    assert not runtime._relaid, sorted(runtime._relaid)


@pytest.mark.usefixtures("no_tf32", "fresh_compiles")
@pytest.mark.parametrize("stride", [1, 2], ids=["identity_shortcut", "downsample"])
def test_bottleneck_through_torch_compile_matches_eager(stride, monkeypatch):
    from fxcc.client import runtime
    from fxcc.client.backend import fxcc_backend
    from fxcc.client.examples import Bottleneck

    monkeypatch.setenv("FXCC_FALLBACK", "error")
    torch.manual_seed(0)
    model = Bottleneck(32, 8 if stride == 1 else 16, stride).cuda().eval()
    x = torch.randn(8, 32, 28, 28, device="cuda")
    runtime._relaid.clear()
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend=fxcc_backend)(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert got.stride() == expected.stride()
    assert not runtime._relaid, sorted(runtime._relaid)


@pytest.mark.usefixtures("no_tf32", "fresh_compiles")
def test_resnet_training_step_runs_channels_last_forward_and_backward(monkeypatch):
    """A ResNet-style training step (tests/models/test_conv_training_plans.py's, on CUDA): eager's
    losses, gradients and running statistics (stored in place by the forward's kernels); every
    convolution and conv backward called with channels-last operands; cuDNN's results laid out as
    the plans expect (nothing re-laid); gradients in their parameters' layout."""
    import copy

    from fxcc.client import runtime
    from fxcc.client.backend import fxcc_backend
    from tests.models.test_conv_training_plans import TinyResNet, record_conv_layouts

    monkeypatch.setenv("FXCC_FALLBACK", "error")
    seen = record_conv_layouts(monkeypatch)
    runtime._relaid.clear()
    torch.manual_seed(0)
    eager = TinyResNet().cuda()
    fx = copy.deepcopy(eager)
    relaid = []  # gradients AccumulateGrad would copy into their parameter's layout
    for name, p in fx.named_parameters():
        p.register_hook(lambda g, p=p, n=name: relaid.append(n) if any(
            k != 1 and a != b for k, a, b in zip(p.shape, g.stride(), p.stride())) else None)
    compiled = torch.compile(fx, backend=fxcc_backend)
    x = torch.randn(8, 3, 64, 64, device="cuda")
    for _ in range(2):
        got = compiled(x)
        got.backward()
        want = eager(x)
        want.backward()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for p, q in zip(eager.parameters(), fx.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-4)
    for b, c in zip(eager.buffers(), fx.buffers()):
        torch.testing.assert_close(c, b, rtol=1e-4, atol=1e-4)
    assert seen == {"convolution": [True] * 12, "convolution_backward": [True] * 12}
    assert not runtime._relaid, sorted(runtime._relaid)
    assert not relaid, relaid  # weight gradients come out in their parameters' layout


@pytest.mark.usefixtures("no_tf32", "fresh_compiles")
@pytest.mark.parametrize("size", [64, 160], ids=["persistent_stats", "looped_stats"])
def test_resnet_training_forward_stores_running_stats_in_place_with_no_view_chains(size, monkeypatch):
    """The CUDA forward of a ResNet-style training step (batch norm as CUDA traces it: cudnn_batch_norm,
    decomposed): every running statistic stored by the kernel that computes it (no copy_ or
    _foreach_copy_ step), and no view step for the saved statistics; eager's running statistics."""
    import copy

    from fxcc.client import backend
    from fxcc.client.backend import fxcc_backend
    from fxcc.client.cache import LocalCache
    from fxcc.client.settings import ClientSettings
    from tests.models.test_conv_training_plans import TinyResNet

    monkeypatch.setenv("FXCC_FALLBACK", "error")
    torch.manual_seed(0)
    eager = TinyResNet().cuda()
    fx = copy.deepcopy(eager)
    x = torch.randn(8, 3, size, size, device="cuda")
    torch.compile(fx, backend=fxcc_backend)(x).backward()
    eager(x).backward()
    for b, c in zip(eager.buffers(), fx.buffers()):
        torch.testing.assert_close(c, b, rtol=1e-4, atol=1e-4)
    events = [e for e in backend.events() if e.stats is not None]
    fw = LocalCache(ClientSettings.from_env().cache_dir).get(events[0].key)
    ops = [s.op for s in fw.manifest.plan.steps if s.kind == "extern"]
    assert not [op for op in ops if op in ("aten.copy_.default", "aten._foreach_copy_.default")], ops
    assert not [op for op in ops if op in ("aten.unsqueeze.default", "aten.squeeze.dims")], ops

"""A ResNet-style training step through fxcc (stem conv-bn-relu-maxpool, basic blocks with an
identity and a downsampling shortcut, global pool): results equal eager's, the forward and backward
plans run everything but the convolutions (and their backward) as fxcc kernels, and with the
channels-last decision on, every convolution, forward and backward, reads channels-last operands
with no layout conversion between them.

Note: the layout pass lays out for CUDA; here it is let run for the CPU interpreter (TARGETS,
DEVICES) so that the plans it makes run, on CPU tensors, against eager.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.conv_plan_counts import BasicBlock
from fxcc.client import backend
from fxcc.client.cache import LocalCache
from fxcc.client.settings import ClientSettings
from tests.compiler_core.test_passes_layout import conversion_kernels

# Extern steps that launch nothing (views and tuple items), and the write-backs of running stats.
NO_KERNEL = {"getitem", "aten.view.default", "aten.unsqueeze.default", "aten.permute.default",
             "aten.squeeze.dim", "aten.squeeze.dims", "aten.alias.default", "aten.expand.default",
             "aten.as_strided.default", "aten.t.default", "aten.reshape.default", "aten._unsafe_view.default"}


class TinyResNet(nn.Module):
    """ResNet-18's structure at CPU size (one block per stage, two stages); no head, so its
    backward holds nothing but conv, batch norm, ReLU, pooling and their gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.l1, self.l2 = BasicBlock(8, 8, 1), BasicBlock(8, 16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.l2(self.l1(self.stem(x))), 1).flatten(1).square().sum()


def train_both(steps: int = 2, relaid: list | None = None):
    """Train eager and fxcc alike; with `relaid`, each gradient the backward hands a parameter is
    recorded as (name, whether AccumulateGrad must copy it into the parameter's layout)."""
    torch.manual_seed(0)
    eager = TinyResNet()
    fx = copy.deepcopy(eager)
    if relaid is not None:
        for name, p in fx.named_parameters():
            p.register_hook(lambda g, p=p, n=name: relaid.append(
                (n, any(k != 1 and a != b for k, a, b in zip(p.shape, g.stride(), p.stride())))))
    compiled = torch.compile(fx, backend="fxcc")
    x = torch.randn(2, 3, 16, 16)  # batch-norm rows of at most 128: persistent reductions in both layouts
    for _ in range(steps):
        got = compiled(x)
        got.backward()
        want = eager(x)
        want.backward()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), fx.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5, msg=lambda m, n=name: f"grad {n}: {m}")
    for (name, b), c in zip(eager.named_buffers(), fx.buffers()):
        torch.testing.assert_close(c, b, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"buffer {n}: {m}")
    events = [e for e in backend.events() if e.stats is not None]
    assert len(events) == 2, [e.source for e in backend.events()]  # one forward, one backward
    cache = LocalCache(ClientSettings.from_env().cache_dir)
    return [cache.get(e.key) for e in events]


def externs(art) -> list[str]:
    return [s.op for s in art.manifest.plan.steps if s.kind == "extern" and s.op not in NO_KERNEL]


@pytest.fixture
def _isolated(fresh_compiles, monkeypatch):
    monkeypatch.setenv("FXCC_FALLBACK", "error")


def record_conv_layouts(monkeypatch) -> dict[str, list[bool]]:
    """For each convolution and convolution backward the plan runtime calls from now on, whether all
    its tensor operands were channels-last (a list per op, in call order)."""
    from fxcc.client import runtime

    seen: dict[str, list[bool]] = {"convolution": [], "convolution_backward": []}
    resolve = runtime.resolve_target

    def recording(op: str, **kw):
        fn = resolve(op, **kw)
        name = (op.split(".") + [""])[1]
        if name not in seen:
            return fn

        def call(*args):
            operands = args[:3] if name == "convolution_backward" else args[:2]
            seen[name].append(all(t.is_contiguous(memory_format=torch.channels_last) for t in operands))
            return fn(*args)
        return call
    monkeypatch.setattr(runtime, "resolve_target", recording)
    return seen


@pytest.mark.usefixtures("_isolated")
def test_training_step_runs_all_but_convolutions_as_fxcc_kernels():
    fw, bw = train_both()
    assert externs(fw).count("aten.convolution.default") == 6
    # 6 batch norms' running mean, variance and step count (train_both checked them against eager's)
    # go into their inputs from the kernels that compute them: no write-back step.
    assert externs(fw) == ["aten.convolution.default"] * 6
    plan = fw.manifest.plan
    written = {a.name for s in plan.steps if s.kind == "kernel" for a in s.args
               if a.kind == "node" and a.name in plan.inputs and
               [b.name for b in s.args if b.kind == "node"].count(a.name) == 2}
    assert len(written) == 18
    assert externs(bw) == ["aten.convolution_backward.default"] * 6
    assert fw.manifest.stats.kernels >= 1 and bw.manifest.stats.kernels >= 1


@pytest.mark.usefixtures("_isolated")
def test_channels_last_training_step_has_no_layout_conversion_between_convolutions(monkeypatch, tmp_path):
    from fxcc.client import runtime
    from fxcc.compiler_core.passes import layout

    base_fw, base_bw = train_both()
    torch._dynamo.reset()
    backend.reset()
    monkeypatch.setenv("FXCC_CACHE_DIR", str(tmp_path / "channels-last"))  # the pass is not in the key
    monkeypatch.setattr(layout, "TARGETS", layout.TARGETS | {"interpret"})
    monkeypatch.setattr(layout, "DEVICES", layout.DEVICES | {"cpu"})
    seen = record_conv_layouts(monkeypatch)
    runtime._relaid.clear()
    relaid: list = []
    fw, bw = train_both(relaid=relaid)
    assert not runtime._relaid  # every extern result came out as the plan expected it
    # The conv weights' gradients leave the backward in their parameters' (NCHW) layout, not
    # cuDNN's channels-last: AccumulateGrad copies none of them.
    assert len(relaid) == 2 * len(list(TinyResNet().parameters())) and not any(r for _, r in relaid), relaid
    assert fw.manifest.plan.output_strides  # the saved activations' layout, reported to AOTAutograd
    # Two steps of 6 convs: each call, forward and backward, had channels-last operands only.
    assert seen == {"convolution": [True] * 12, "convolution_backward": [True] * 12}
    for art in (fw, bw):
        assert not any(s.kind == "extern" and s.op == "aten.clone.default" for s in art.manifest.plan.steps)
    # Against the plans without the pass: the same extern calls, and no kernel more than the
    # conversions of graph inputs, the image and the five k×k weights (1×1 ones need none), in the
    # forward and again in the backward (its conv backwards read the primals), and in the backward
    # the five k×k weights' gradients copied back to their parameters' layout.
    assert externs(fw) == externs(base_fw) and externs(bw) == externs(base_bw)
    assert 1 <= conversion_kernels(fw) <= 1 + 5
    assert fw.manifest.stats.kernels <= base_fw.manifest.stats.kernels + 1 + 5
    assert bw.manifest.stats.kernels <= base_bw.manifest.stats.kernels + 1 + 5 + 5


def test_a_backward_expecting_channels_last_inputs_gets_them_from_an_eager_forward():
    """A forward plan that failed at run time runs eagerly and hands its backward NCHW activations;
    the backward's plan, compiled for the channels-last ones its forward plan reported, gets each
    such input copied into the layout it reads (and the other way round: a backward compiled for
    eager's layout before its forward's plan arrived)."""
    from fxcc.client.capture import capture_graph
    from fxcc.client.graphs import layout_guard

    x = torch.randn(2, 4, 3, 3).to(memory_format=torch.channels_last)
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda t, u: t + u)(x, x)
    spec = capture_graph(gm, [x, torch.randn(2, 4, 3, 3)]).spec
    seen = []
    guarded = layout_guard(lambda args: seen.append([a.stride() for a in args]) or args, spec)
    plain = torch.randn(2, 4, 3, 3)
    out = guarded([plain, plain])
    assert seen == [[x.stride(), plain.stride()]]  # the first copied channels-last, the second as is
    torch.testing.assert_close(out[0], plain)
    seen.clear()
    guarded = layout_guard(lambda args: seen.append([a.stride() for a in args]) or args,
                           capture_graph(gm, [plain, plain]).spec)
    guarded([x, plain])  # the other way round: a plan for NCHW activations given channels-last ones
    assert seen == [[plain.stride(), plain.stride()]]
    flat = make_fx(lambda t: t * 2)(torch.randn(6))
    assert layout_guard(print, capture_graph(flat, [torch.randn(6)]).spec) is print  # nothing to check

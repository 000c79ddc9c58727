"""The whole pipeline under AOTAutograd: a transformer block, inference and training, matches eager."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch._functorch.aot_autograd import aot_module_simplified

from fxcc.client.backend import decomposition_table
from fxcc.client.capture import capture_graph
from fxcc.client.runtime import load_plan
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int = 32, nhead: int = 4) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, nhead, batch_first=True)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_model * 4), nn.GELU(), nn.Linear(d_model * 4, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn_out, _ = self.attn(x, x, x)
        x = self.norm1(x + attn_out)
        return self.norm2(x + self.mlp(x))


def compiled_one_graph(model: Any, x: torch.Tensor) -> Artifact:
    """`model` compiled through fxcc in inference: it matches eager, and it was one graph."""
    arts: list[Artifact] = []
    with torch.no_grad():
        got = torch.compile(model, backend=fxcc_backend(arts))(x)
        torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)
    (art,) = arts
    return art


def fxcc_backend(artifacts: list[Artifact]) -> Any:
    """A minimal torch.compile backend: AOTAutograd, then compile_request and the client runtime."""
    def compiler(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        cap = capture_graph(gm, inputs)
        target = Target()
        if any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs):
            major, minor = torch.cuda.get_device_capability()
            target = Target(kind="cuda", arch=major * 10 + minor)
        art = compile_request(CompileRequest(graph=cap.spec, options=CompileOptions(target=target)))
        artifacts.append(art)
        runner = load_plan(art)

        def run(*args: Any) -> Any:
            return runner(list(args) + cap.constants)
        return run

    def backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        return aot_module_simplified(gm, inputs, fw_compiler=compiler, bw_compiler=compiler,
                                     decompositions=decomposition_table())
    return backend


def test_transformer_block_inference() -> None:
    torch.manual_seed(0)
    art = compiled_one_graph(TransformerBlock().eval(), torch.randn(2, 8, 32))
    stats = art.manifest.stats
    assert stats.kernels <= 8
    # The attention chain is one SDPA call (compiler_core/passes/attention.py): no bmm is left.
    assert set(stats.extern_ops) <= {"aten.addmm.default", "aten.mm.default",
                                     "aten._scaled_dot_product_flash_attention_for_cpu.default"}


def test_transformer_block_training_gradients() -> None:
    torch.manual_seed(0)
    model = TransformerBlock().train()
    x = torch.randn(2, 8, 32, requires_grad=True)
    arts: list[Artifact] = []
    torch.compile(model, backend=fxcc_backend(arts))(x).square().sum().backward()
    got_x = x.grad.clone()
    got_w = {n: p.grad.clone() for n, p in model.named_parameters()}
    x.grad = None
    model.zero_grad()
    model(x).square().sum().backward()
    torch.testing.assert_close(got_x, x.grad, atol=1e-4, rtol=1e-4)
    for n, p in model.named_parameters():
        torch.testing.assert_close(got_w[n], p.grad, atol=1e-4, rtol=1e-4, msg=n)
    assert len(arts) == 2 and all(a.manifest.stats.kernels > 0 for a in arts)


def test_a_compiler_bug_degrades_to_an_all_extern_plan(monkeypatch) -> None:
    from fxcc.compiler_core import pipeline
    from tests.compiler_core.helpers import check

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("simulated codegen bug")
    monkeypatch.setattr(pipeline, "render_kernels", broken)
    art = check(lambda a: a.sin().cos(), torch.randn(4, 4))
    assert art.manifest.stats.kernels == 0 and art.manifest.stats.nodes_extern == 2

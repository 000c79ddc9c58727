"""On a GPU: kernels are autotuned for real (triton.testing.do_bench over every candidate), the
tuned artifact records winners and timings, its grids follow the winning blocks, its cubins are
built for the winners, and it runs from those cubins and matches eager. Skipped without CUDA."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from fxcc.client import cuda_loader
from fxcc.client.runtime import cuda_arch_key, load_plan
from fxcc.compiler_core.artifact import Artifact, KernelStep
from fxcc.compiler_core.autotune import step_sizes
from fxcc.compiler_core.pipeline import compile_and_build
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(torch.nn.functional.gelu(x + b), (x.shape[-1],), w, b)


# name -> (fn, input factory); each kind of kernel: pointwise, persistent rows (one that has a
# looped form, one that has not), rows longer than a persistent tile, and a column reduction.
CASES: dict[str, tuple[Callable[..., Any], Callable[[], list[torch.Tensor]]]] = {
    "pointwise": (lambda x: torch.cos(torch.sin(x)), lambda: [torch.randn(1 << 22, device="cuda")]),
    "softmax": (lambda x: torch.softmax(x, -1), lambda: [torch.randn(2048, 1024, device="cuda")]),
    "row_sum": (lambda x: x.sum(-1) * 2, lambda: [torch.randn(1024, 2048, device="cuda")]),
    "long_rows": (lambda x: x.amax(-1), lambda: [torch.randn(256, 6000, device="cuda")]),
    "column_sum": (lambda x: x.sum(0), lambda: [torch.randn(4096, 512, device="cuda")]),
    "bias_gelu_ln_bf16": (_layer_norm, lambda: [torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16),
                                                torch.randn(1024, device="cuda", dtype=torch.bfloat16),
                                                torch.randn(1024, device="cuda", dtype=torch.bfloat16)]),
}


def _request(fn: Callable[..., Any], inputs: list[torch.Tensor], mode: str = "default") -> CompileRequest:
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph

    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    cap = capture_graph(gm, inputs)
    assert not cap.constants
    major, minor = torch.cuda.get_device_capability()
    options = CompileOptions(mode=mode, target=Target(kind="cuda", arch=major * 10 + minor))
    return CompileRequest(graph=cap.spec, options=options)


def _check_tuned(art: Artifact) -> None:
    m = art.manifest
    assert m.tuned and m.kernels
    arch = cuda_arch_key()
    for k in m.kernels:
        rec = k.tuning
        assert rec is not None, k.name
        assert rec.device == torch.cuda.get_device_name()
        assert rec.heuristic in rec.timings_ms and rec.winner in rec.timings_ms
        assert rec.winner == min(rec.timings_ms, key=rec.timings_ms.__getitem__)
        assert len(rec.timings_ms) >= 2, rec  # something was compared
        assert all(t > 0 for t in rec.timings_ms.values())
        assert arch in k.binaries, k.metadata  # the cubin is built for the winning config
        assert k.metadata[f"{arch}.num_warps"] == k.num_warps
    for step in m.plan.steps:
        if isinstance(step, KernelStep):
            info = next(k for k in m.kernels if k.name == step.kernel)
            assert step.grid == [-(-step_sizes(step)[0] // info.constexprs["XBLOCK"])]


@pytest.mark.parametrize("name", list(CASES))
def test_tuned_artifact_runs_from_cubins_and_matches_eager(name: str) -> None:
    torch.manual_seed(0)
    fn, make = CASES[name]
    inputs = make()
    art = compile_and_build(_request(fn, inputs), tune_device="cuda")
    _check_tuned(art)
    fallbacks = cuda_loader.stats.jit_fallbacks
    (got,) = load_plan(art)(inputs)
    torch.cuda.synchronize()
    want = fn(*inputs)
    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2}[want.dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    for k in art.manifest.kernels:
        assert cuda_loader.is_loaded(k.binaries[cuda_arch_key()].digest, inputs[0].device.index)
    assert cuda_loader.stats.jit_fallbacks == fallbacks


def test_max_autotune_searches_wider() -> None:
    torch.manual_seed(0)
    fn, make = CASES["row_sum"]
    inputs = make()
    default = compile_and_build(_request(fn, inputs), tune_device="cuda")
    wide = compile_and_build(_request(fn, inputs, "max-autotune"), tune_device="cuda")
    _check_tuned(wide)
    tried = {k.name: len(k.tuning.timings_ms) + len(k.tuning.rejected) for k in default.manifest.kernels}
    for k in wide.manifest.kernels:
        assert len(k.tuning.timings_ms) + len(k.tuning.rejected) > max(tried.values())
        assert any(label.endswith("_looped") for label in k.tuning.timings_ms)
        assert any(label.endswith("_persistent") for label in k.tuning.timings_ms)
    (got,) = load_plan(wide)(inputs)
    torch.testing.assert_close(got, fn(*inputs), rtol=1e-4, atol=1e-4)

"""On a GPU: a graph without tensor inputs (factory ops alone) compiles for the GPU and its outputs
live there, as eager's do (the H200 OpInfo sweep found them on the CPU, or failing). Also batch
norm's inference statistics, which on CUDA are the running ones. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
    pytest.mark.usefixtures("fresh_compiles"),
]


def test_factory_graphs_run_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FXCC_FALLBACK", "error")

    def f(n: int) -> torch.Tensor:
        return torch.arange(n, device="cuda", dtype=torch.float32) * 2 + torch.ones(n, device="cuda")

    got = torch.compile(f, backend="fxcc")(7)
    assert got.device.type == "cuda"
    torch.testing.assert_close(got, f(7))


def test_batch_norm_inference_statistics_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    x, w, b = (torch.randn(4, 3, 5, 5, device="cuda"), torch.randn(3, device="cuda"), torch.randn(3, device="cuda"))
    rm, rv = torch.randn(3, device="cuda"), torch.rand(3, device="cuda") + 0.5

    def f(x, w, b, rm, rv):
        return torch.ops.aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5)

    for g, e in zip(torch.compile(f, backend="fxcc")(x, w, b, rm, rv), f(x, w, b, rm, rv)):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)

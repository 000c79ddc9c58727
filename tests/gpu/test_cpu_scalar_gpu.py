"""On a GPU: a module's float attribute that changes becomes a graph input (a 0-d float64 CPU
tensor, Dynamo's wrapped float); the plan copies it to the GPU before its kernel reads it, so the
output matches eager for each value (the kernel had read the host address: an illegal memory access
on the H200, found by tests/gpu/test_dynamo_guards_once_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxcc.client.backend import fxcc_backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 8)
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.lin(x) + 1) * self.scale


@pytest.mark.usefixtures("no_tf32", "fresh_compiles")
def test_a_float_attribute_made_an_input_is_read_on_the_gpu_for_each_value(monkeypatch):
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    torch.manual_seed(0)
    net = Scaled().cuda().eval()
    compiled = torch.compile(net, backend=fxcc_backend)
    with torch.no_grad():
        for scale, n in ((2.0, 4), (2.0, 6), (3.0, 4), (-0.5, 5)):
            net.scale = scale
            x = torch.randn(n, 16, device="cuda")
            torch.testing.assert_close(compiled(x), net(x))
    torch.cuda.synchronize()

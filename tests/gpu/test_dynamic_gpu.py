"""On a GPU: a dynamic-shape graph runs from its cubins for every size, compiled once."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxcc.client import cuda_loader
from fxcc.client.backend import events, fxcc_backend
from fxcc.client.examples import GPT2Block

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]


@pytest.fixture(autouse=True)
def _fresh(fresh_compiles):
    yield


@pytest.mark.parametrize("which", ["mlp", "gpt2"])
def test_dynamic_sizes_run_from_cubins_and_match_eager(which, no_tf32):
    torch.manual_seed(0)
    if which == "mlp":
        model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 64))
        make = lambda n: torch.randn(n, 64, device="cuda")
        sizes = [3, 5, 17, 64, 200, 1000]
    else:
        model = GPT2Block(128, 4)
        make = lambda n: torch.randn(2, n, 128, device="cuda")
        sizes = [8, 9, 16, 33, 100]
    model = model.cuda().eval()
    compiled = torch.compile(model, backend=fxcc_backend)  # no entry point needed (not pip-installed there)
    before, launchers = cuda_loader.stats.jit_fallbacks, cuda_loader.stats.launchers
    with torch.no_grad():
        for n in sizes:
            x = make(n)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    compiles = [e for e in events() if e.source != "fallback"]
    assert len(compiles) == 2 and all(e.error is None for e in events())
    assert compiles[-1].stats.kernels >= 1
    assert cuda_loader.stats.launchers > launchers, "kernels were loaded from cubins"
    assert cuda_loader.stats.jit_fallbacks == before, "every launch ran from a cubin"

"""Real model blocks compiled by fxcc match eager (inference and one training step)."""

import pytest
import torch

from fxcc.client import backend
from fxcc.client.examples import model_blocks


@pytest.fixture(autouse=True)
def _isolated(fresh_compiles, monkeypatch):
    monkeypatch.setenv("FXCC_FALLBACK", "error")  # a block that falls back is a failure here
    yield


@pytest.mark.parametrize("name", ["transformer", "gpt2", "llama", "bottleneck"])
def test_inference_matches_eager(name):
    model, x = model_blocks()[name]
    model.eval()
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend="fxcc")(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    evs = backend.events()
    assert evs and all(e.source == "compiled-in-process" for e in evs)
    stats = [e.stats for e in evs]
    print(f"{name}: kernels={sum(s.kernels for s in stats)} extern={sum(s.nodes_extern for s in stats)} "
          f"lowered={sum(s.nodes_lowered for s in stats)} extern_ops={sorted({o for s in stats for o in s.extern_ops})}")


@pytest.mark.parametrize("name", ["gpt2", "llama", "bottleneck"])
def test_training_step_matches_eager(name):
    model, x = model_blocks()[name]
    ref, _ = model_blocks()[name]
    model.train()
    ref.train()
    compiled = torch.compile(model, backend="fxcc")
    loss = compiled(x).square().mean()
    loss.backward()
    ref_loss = ref(x).square().mean()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
    for (pname, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5, msg=lambda m, n=pname: f"{n}: {m}")

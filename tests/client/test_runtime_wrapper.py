"""Which wrapper runs around each call of a compiled graph: for a plain inference graph fxcc calls
its plan directly (as a pre-AOT cache hit does); anything AOTAutograd's runtime wrapper has work
for (mutated inputs, aliased outputs, training) keeps that wrapper, and eager semantics hold."""

import pytest
import torch
from torch import nn

from fxcc.client import backend
from fxcc.client.explain import explain


@pytest.fixture(autouse=True)
def _isolated(fresh_compiles):
    yield


def _events() -> list[backend.CompileEvent]:
    return [e for e in backend.events() if e.source != "fallback"]


def test_a_plain_inference_graph_is_called_directly_and_matches_eager():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32)).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        compiled = torch.compile(model, backend="fxcc")
        outs = [compiled(x) for _ in range(3)]
        expected = model(x)
    (event,) = _events()
    assert event.aot_wrapper is False
    for got in outs:
        torch.testing.assert_close(got, expected)
        assert type(got) is torch.Tensor and not got.requires_grad


def test_grad_mode_is_off_inside_and_restored_after():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval().requires_grad_(False)
    x = torch.randn(2, 8)
    got = torch.compile(model, backend="fxcc")(x)  # grad mode on; nothing needs grad
    (event,) = _events()
    assert event.aot_wrapper is False
    assert torch.is_grad_enabled() and not got.requires_grad
    torch.testing.assert_close(got, model(x))


def test_a_failing_plan_still_runs_eagerly_and_restores_grad_mode(monkeypatch):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval().requires_grad_(False)
    x = torch.randn(2, 8)
    compiled = torch.compile(model, backend="fxcc")
    compiled(x)
    from fxcc.client.runtime import PlanRunner

    def broken(self, args):
        raise RuntimeError("plan broke")

    monkeypatch.setattr(PlanRunner, "__call__", broken)
    monkeypatch.setattr(PlanRunner, "steal", broken)  # how a guarded graph calls its plan
    with pytest.warns(RuntimeWarning, match="failed to run"):
        got = compiled(x)
    assert torch.is_grad_enabled()
    torch.testing.assert_close(got, model(x))


def _in_place_on_input(x):
    x.add_(1)
    return x * 2


def _view_of_input(x):
    return x.t(), x + 1


@pytest.mark.parametrize("fn", [_in_place_on_input, _view_of_input], ids=["mutation", "alias"])
def test_graphs_with_epilogues_keep_aot_autograds_wrapper(fn):
    x = torch.randn(3, 4)
    with torch.no_grad():
        a, b = x.clone(), x.clone()
        expected = fn(a)
        got = torch.compile(fn, backend="fxcc")(b)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(b, a)  # the input mutated as eager mutates it
    assert [e.aot_wrapper for e in _events()] == [True]
    if fn is _view_of_input:
        assert got[0]._base is b or got[0].untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_training_graphs_keep_aot_autograds_wrapper():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    x = torch.randn(2, 8)
    torch.compile(model, backend="fxcc")(x).sum().backward()
    events = _events()
    assert len(events) == 2 and all(e.aot_wrapper is True for e in events)
    assert model[0].weight.grad is not None


def test_with_the_pre_aot_cache_off_aot_autograds_wrapper_runs(monkeypatch):
    monkeypatch.setenv("FXCC_PRE_AOT_CACHE", "0")
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    with torch.no_grad():
        torch.compile(model, backend="fxcc")(torch.randn(2, 8))
    assert [e.aot_wrapper for e in _events()] == [True]


def test_explain_says_the_plan_is_called_directly():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    with torch.no_grad():
        text = str(explain(model)(torch.randn(2, 8)))
    assert "the plan directly" in text

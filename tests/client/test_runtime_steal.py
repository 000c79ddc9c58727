"""A plan run step by step takes its inputs over (AOTAutograd's boxed convention, steal_args): from
its second call on, each input is let go after the last step that reads it, so that a backward's
saved activations are freed while it runs rather than when it returns. A first call that fails
still runs eagerly; a later failure after the inputs were let go raises and the graph goes eager."""

from __future__ import annotations

import copy
import weakref

import pytest
import torch

from fxcc.client import backend
from fxcc.client.graphs import PlanRunError, _guarded
from fxcc.client.runtime import PlanRunner, load_plan
from tests.compiler_core.helpers import compile_fn


@pytest.fixture(autouse=True)
def _isolated(fresh_compiles):
    yield


def sin_then_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a.sin() * 2, b) + 1  # `a` is read by the first kernel only


def eager_of(fn):
    def run(args):
        return (fn(*args),)
    return run


class Probe:
    """A step appended to a plan: whether the weakly held tensor was already freed when it ran;
    it raises on the calls listed in `fail_on` (1-based)."""

    def __init__(self, fail_on: tuple[int, ...] = ()) -> None:
        self.ref: weakref.ref | None = None
        self.freed: list[bool] = []
        self.fail_on = fail_on

    def __call__(self, env: dict) -> None:
        self.freed.append(self.ref() is None)
        if len(self.freed) in self.fail_on:
            raise RuntimeError("probe says no")


def guarded_with_probe(probe: Probe):
    runner = load_plan(compile_fn(sin_then_mm, torch.randn(8, 8), torch.randn(8, 8)))
    assert isinstance(runner, PlanRunner) and hasattr(runner, "steal")
    runner._steps.append(probe)
    return _guarded(runner, [], eager_of(sin_then_mm), "k" * 64)


def call(run, probe: Probe, planned: bool = True):
    args = [torch.randn(8, 8), torch.randn(8, 8)]
    want = sin_then_mm(*args)
    probe.ref = weakref.ref(args[0])
    out = run(args)
    if planned:
        assert args == []  # the caller's list was taken over, as AOTAutograd expects
    torch.testing.assert_close(out[0], want)


def test_from_its_second_call_a_plan_frees_an_input_after_its_last_read():
    probe = Probe()
    run = guarded_with_probe(probe)
    for _ in range(3):
        call(run, probe)
    # the first call keeps its inputs (it may still fall back); the later ones let `a` go
    assert probe.freed == [False, True, True]


def test_a_first_call_that_fails_runs_eagerly_with_its_inputs_kept():
    probe = Probe(fail_on=(1,))
    run = guarded_with_probe(probe)
    with pytest.warns(RuntimeWarning, match="failed to run"):
        call(run, probe)
    call(run, probe, planned=False)  # eager from now on: the probe no longer runs
    assert probe.freed == [False]


def test_a_later_call_that_fails_after_letting_go_raises_and_the_graph_goes_eager():
    probe = Probe(fail_on=(2,))
    run = guarded_with_probe(probe)
    call(run, probe)
    with pytest.warns(RuntimeWarning, match="after its inputs were let go"), \
            pytest.raises(PlanRunError, match="runs eagerly from its next call"):
        run([torch.randn(8, 8), torch.randn(8, 8)])
    call(run, probe, planned=False)
    assert probe.freed == [False, True]


def test_a_training_backward_frees_the_saved_activations_before_it_returns(monkeypatch):
    """Through torch.compile on the CPU: when the backward's last step has run (before it returns),
    the activations its forward saved are gone, from the second training step on; grads equal eager's."""
    monkeypatch.setenv("FXCC_FALLBACK", "error")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16), torch.nn.Tanh())
    twin = copy.deepcopy(model)
    compiled = torch.compile(model, backend="fxcc")
    refs: list[weakref.ref] = []
    alive_at_end: list[int] = []
    steal, finish = PlanRunner.steal, PlanRunner.finish

    def spy_steal(self, args):  # the backward's plan is the one handed the saved activations
        self.spied_backward = any(a is r() for a in args for r in refs)
        return steal(self, args)

    def spy_finish(self, env):
        if getattr(self, "spied_backward", False):
            alive_at_end.append(sum(r() is not None for r in refs))
        return finish(self, env)

    monkeypatch.setattr(PlanRunner, "steal", spy_steal)
    monkeypatch.setattr(PlanRunner, "finish", spy_finish)
    for _ in range(3):
        x = torch.randn(32, 16)
        out = compiled(x)
        held = [x, *model.parameters()]  # saved too, but the caller holds them
        refs[:] = [weakref.ref(t) for t in out.grad_fn.saved_tensors if not any(t is h for h in held)]
        assert refs, "the forward saved no activation"
        out.sum().backward()
        twin(x).sum().backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = q.grad = None
    assert backend.events() and all(e.error is None for e in backend.events())
    assert len(alive_at_end) == 3, alive_at_end
    assert alive_at_end[0] > 0  # the first backward keeps its inputs (it could still fall back)
    assert alive_at_end[1:] == [0, 0]

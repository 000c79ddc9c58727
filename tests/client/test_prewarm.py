"""client/prewarm.py: the library calls a loaded plan makes, found from the plan and the recorded input
layouts, are exactly the distinct convolutions and matmuls the plan's run makes (same op, sizes,
strides, dtypes, constants), each once; they run on a side thread, and whatever fails there is a
lost optimisation, never an error."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fxcc.client import prewarm
from fxcc.client.examples import Bottleneck
from fxcc.client.runtime import load_plan
from fxcc.compiler_core.artifact import ExternStep
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest
from tests.compiler_core.test_passes_layout import capture

aten = torch.ops.aten
LIBRARY = {aten.convolution.default, aten.addmm.default, aten.mm.default}


def _sig(op, args):
    return prewarm._signature([str(op)] + list(args))


class Calls(TorchDispatchMode):
    """The library calls a run makes, by signature."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in LIBRARY:
            self.seen.append(_sig(func, args))
        return func(*args, **(kwargs or {}))


def conv_net() -> nn.Module:
    torch.manual_seed(0)
    # two blocks of the same shapes: their convolutions repeat, and are warmed once
    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         Bottleneck(16, 4, 1), Bottleneck(16, 4, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()


def compiled_plan():
    x = torch.randn(2, 3, 16, 16)
    cap = capture(conv_net(), x)
    art = compile_request(CompileRequest(graph=cap.spec))
    return art, [x, *cap.constants]


def test_the_calls_found_are_the_distinct_calls_the_plan_makes():
    art, inputs = compiled_plan()
    plan = art.manifest.plan
    layouts = prewarm.input_layouts(inputs)
    calls = prewarm.library_calls(plan, layouts)
    with Calls() as mode, torch.no_grad():
        load_plan(art)(list(inputs))
    made = mode.seen
    assert len(made) > len(set(made)), "the net repeats a convolution"
    assert [_sig(op, args) for op, args in calls] == list(dict.fromkeys(made))
    assert all(t.device.type == "meta" for _, args in calls for t in args if isinstance(t, torch.Tensor))
    assert {str(op) for op, _ in calls} >= {"aten.convolution.default", "aten.addmm.default"}
    # each found call runs on a device of uninitialized tensors of those layouts
    assert prewarm.run_calls(calls, torch.device("cpu")) == len(calls)


def test_unknown_layouts_and_other_arity_find_nothing():
    art, inputs = compiled_plan()
    plan = art.manifest.plan
    assert prewarm.library_calls(plan, prewarm.input_layouts(inputs)[:-1]) == []
    # an input whose layout is not recorded: the calls reading it (and what follows from it) drop out
    layouts = prewarm.input_layouts(inputs)
    image = plan.inputs.index(next(s.args[0].name for s in plan.steps
                                   if isinstance(s, ExternStep) and s.op == "aten.convolution.default"))
    layouts[image] = None
    calls = prewarm.library_calls(plan, layouts)
    assert len(calls) < len(prewarm.library_calls(plan, prewarm.input_layouts(inputs)))
    assert prewarm.input_layouts([torch.empty(2, 3), 4]) == [["float32", [2, 3], [3, 1]], None]


def test_start_runs_the_calls_on_a_thread_and_failures_only_count(monkeypatch):
    art, inputs = compiled_plan()
    plan = art.manifest.plan
    layouts = prewarm.input_layouts(inputs)
    before = dict(prewarm.stats)
    wait = prewarm.start(plan, layouts, torch.device("cpu"))
    assert wait is not None
    wait()
    prewarm.wait_all()
    assert prewarm.stats["calls"] - before["calls"] == len(prewarm.library_calls(plan, layouts))
    assert prewarm.start(plan, None, torch.device("cpu")) is None

    def broken(calls, device):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(prewarm, "run_calls", broken)
    wait = prewarm.start(plan, layouts, torch.device("cpu"))
    wait()  # the thread stopped: counted, nothing raised here
    assert prewarm.stats["failed"] == before["failed"] + 1


def test_warm_splits_the_calls_over_threads_and_makes_each_once(monkeypatch):
    import threading

    art, inputs = compiled_plan()
    plan = art.manifest.plan
    layouts = prewarm.input_layouts(inputs)
    expected = prewarm.library_calls(plan, layouts)
    made: list[tuple[str, int]] = []
    run_calls = prewarm.run_calls

    def recording(calls, device):
        made.extend((threading.current_thread().name, id(op)) for op, _ in calls)
        return run_calls(calls, device)

    monkeypatch.setattr(prewarm, "run_calls", recording)
    assert prewarm.warm(plan, layouts, torch.device("cpu"), threads=3) == len(expected)
    assert len(made) == len(expected)  # each distinct call once, across the threads
    assert len({name for name, _ in made}) == min(3, len(expected))
    assert prewarm.warm(plan, None, torch.device("cpu"), threads=3) == 0

"""client/prewarm.py: the library calls a loaded plan makes, found from the plan and the recorded input
layouts, are exactly the distinct convolutions and matmuls the plan's run makes (same op, sizes,
strides, dtypes, constants), each once; they run on a side thread, and whatever fails there is a
lost optimisation, never an error."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fxcc.client import prewarm
from fxcc.client.examples import Bottleneck
from fxcc.client.runtime import load_plan
from fxcc.client.settings import ClientSettings
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


def test_a_package_records_the_calls_as_json_and_a_loader_gets_the_same_calls_back():
    """prewarm.record: the calls as JSON values a package holds, so that a loading process starts
    them before it has fetched the plan; prewarm.recorded gives back the calls library_calls finds
    (same ops and layouts, meta tensors) and they run."""
    art, inputs = compiled_plan()
    plan = art.manifest.plan
    layouts = prewarm.input_layouts(inputs)
    calls = prewarm.library_calls(plan, layouts)
    entries = json.loads(json.dumps(prewarm.record(plan, layouts)))
    back = prewarm.recorded(entries)
    assert [_sig(op, args) for op, args in back] == [_sig(op, args) for op, args in calls]
    assert all(t.device.type == "meta" for _, args in back for t in args if isinstance(t, torch.Tensor))
    assert prewarm.run_calls(back, torch.device("cpu")) == len(calls) > 0
    assert prewarm.record(plan, None) == []


def test_recorded_calls_outside_the_library_ops_or_malformed_are_left_out():
    """A package's recorded calls are only ever the allow-listed library ops on uninitialized tensors
    of bounded layouts: anything else in the entries is dropped, one entry at a time, never raised."""
    mm = ["aten.mm.default", [{"t": ["float32", [4, 8], [8, 1]]}, {"t": ["float32", [8, 2], [2, 1]]}]]
    bad = [
        ["aten.copy_.default", mm[1]],  # not a library op
        ["builtins.eval", ["1"]],
        ["aten.mm.default", [{"t": ["float32", [4, 8], [8]]}, mm[1][1]]],  # sizes and strides differ in rank
        ["aten.mm.default", [{"t": ["complex128", [4, 8], [8, 1]]}, mm[1][1]]],  # a dtype not recorded
        ["aten.mm.default", [{"t": ["float32", [-4, 8], [8, 1]]}, mm[1][1]]],
        ["aten.mm.default", [{"x": 1}, mm[1][1]]],
        ["aten.mm.default", "ab"],
        "aten.mm.default",
        None,
    ]
    back = prewarm.recorded([*bad, mm])
    assert [str(op) for op, _ in back] == ["aten.mm.default"]
    assert [tuple(t.shape) for t in back[0][1]] == [(4, 8), (8, 2)]
    assert prewarm.recorded({"not": "a list"}) == [] and prewarm.recorded(None) == []


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


def test_the_thread_count_is_a_setting_with_a_clear_error():
    """FXCC_PREWARM_THREADS sets how many threads a loaded package's first library calls use (4 by
    default); a value that is no whole number from 1 to 64 is refused by name."""
    assert ClientSettings.from_env({}).prewarm_threads == 4
    assert ClientSettings.from_env({"FXCC_PREWARM_THREADS": "8"}).prewarm_threads == 8
    for bad in ("0", "65", "four"):
        with pytest.raises(ValueError, match="FXCC_PREWARM_THREADS"):
            ClientSettings.from_env({"FXCC_PREWARM_THREADS": bad})
    # it decides nothing a compile makes: packages and pre-AOT entries of either count are the same
    from fxcc.client.dynamo_cache import settings_key

    assert settings_key(ClientSettings.from_env({"FXCC_PREWARM_THREADS": "8"})) == settings_key(ClientSettings())

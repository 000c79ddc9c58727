"""The runtime honours AllocStep.reuse: the new buffer is the dead one's storage, re-shaped."""

from __future__ import annotations

import torch

from fxcc.client import runtime
from fxcc.client.runtime import PlanRunner
from fxcc.compiler_core.artifact import AllocStep
from fxcc.compiler_core.wire import TensorSpec
from tests.compiler_core.helpers import alloc_steps, check


def test_reusing_alloc_takes_the_storage_and_drops_the_old_name():
    old = torch.empty(64)
    env = {"__device__": torch.device("cpu"), "a": old}
    spec = TensorSpec(dtype="float32", sizes=[4, 8], strides=[1, 4])
    PlanRunner._alloc(AllocStep(out="b", spec=spec, reuse="a"))(env)
    b = env["b"]
    assert "a" not in env
    assert b.data_ptr() == old.data_ptr() and b.storage_offset() == 0
    assert b.shape == (4, 8) and b.stride() == (1, 4) and b.dtype == torch.float32


def test_reusing_alloc_never_reinterprets_another_dtype():
    old = torch.arange(8, dtype=torch.float16)
    env = {"__device__": torch.device("cpu"), "a": old}
    step = AllocStep(out="b", spec=TensorSpec(dtype="float32", sizes=[8], strides=[1]), reuse="a")
    PlanRunner._alloc(step)(env)
    b = env["b"]
    assert "a" not in env and b.dtype == torch.float32 and b.data_ptr() != old.data_ptr()
    assert torch.equal(b, old.float())  # a kernel writing in place still reads a's values


def test_reusing_alloc_takes_an_extern_result_at_its_data_pointer():
    # A fresh extern result need not start its storage (torch's choice): the buffer written in
    # place of it must start where it does, or the kernel reads the wrong elements.
    base = torch.arange(40.0)
    old = base[8:].view(4, 8)
    env = {"__device__": torch.device("cpu"), "mm": old}
    spec = TensorSpec(dtype="float32", sizes=[4, 8], strides=[8, 1])
    PlanRunner._alloc(AllocStep(out="b", spec=spec, reuse="mm"))(env)
    assert env["b"].data_ptr() == old.data_ptr() and torch.equal(env["b"], old)


def test_reusing_alloc_allocates_when_the_storage_is_too_small():
    old = torch.arange(8.0)
    env = {"__device__": torch.device("cpu"), "a": old}
    spec = TensorSpec(dtype="float32", sizes=[4, 4], strides=[4, 1])
    PlanRunner._alloc(AllocStep(out="b", spec=spec, reuse="a"))(env)
    assert env["b"].shape == (4, 4) and env["b"].untyped_storage().nbytes() >= 64
    assert env["b"].data_ptr() != old.data_ptr()


def test_manifest_without_reuse_still_loads():
    step = AllocStep.model_validate({"kind": "alloc", "out": "a",
                                     "spec": {"dtype": "float32", "sizes": [2], "strides": [1]}})
    assert step.reuse is None


def test_plan_with_reuse_allocates_less_and_matches_eager(monkeypatch):
    x, w = torch.randn(32, 32), torch.randn(32, 32) / 8

    def fn(x, w):
        a = torch.relu(x * 2)
        b = torch.sigmoid(a @ w + 1)
        c = torch.tanh(b @ w - 1)
        return torch.sin(c @ w)

    art = check(fn, x, w)
    allocs = alloc_steps(art)
    assert any(s.reuse is not None for s in allocs)
    calls = []
    empty_strided, fast = torch.empty_strided, runtime._EMPTY_CPU

    def counting(*args, **kwargs):
        calls.append(args)
        return empty_strided(*args, **kwargs)

    def counting_fast(*args):  # the C++ entry point the runner allocates through
        calls.append(args)
        return fast(*args)

    monkeypatch.setattr(torch, "empty_strided", counting)
    monkeypatch.setattr(runtime, "_EMPTY_CPU", counting_fast)
    (got,) = PlanRunner(art)([x, w])
    assert len(calls) == sum(s.reuse is None for s in allocs)
    torch.testing.assert_close(got, fn(x, w))

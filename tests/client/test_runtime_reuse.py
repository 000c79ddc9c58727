"""The runtime honours AllocStep.reuse: the new buffer is the dead one's storage, re-shaped."""

from __future__ import annotations

import pytest
import torch

from client.runtime import PlanRunner
from compiler_core.artifact import AllocStep
from compiler_core.errors import ArtifactError
from compiler_core.wire import TensorSpec
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


def test_reusing_alloc_refuses_another_dtype():
    env = {"__device__": torch.device("cpu"), "a": torch.empty(64, dtype=torch.float16)}
    step = AllocStep(out="b", spec=TensorSpec(dtype="float32", sizes=[8], strides=[1]), reuse="a")
    with pytest.raises(ArtifactError):
        PlanRunner._alloc(step)(env)


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
    empty_strided = torch.empty_strided

    def counting(*args, **kwargs):
        calls.append(args)
        return empty_strided(*args, **kwargs)

    monkeypatch.setattr(torch, "empty_strided", counting)
    (got,) = PlanRunner(art)([x, w])
    assert len(calls) == sum(s.reuse is None for s in allocs)
    torch.testing.assert_close(got, fn(x, w))

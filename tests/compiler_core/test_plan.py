"""Plan building: storages of dead kernel buffers are reused, never those of outputs or live aliases."""

from __future__ import annotations

import pytest
import torch

import fxcc.compiler_core.plan as plan_mod
from fxcc.compiler_core.artifact import AllocStep, ExternStep, FreeStep, KernelStep
from fxcc.compiler_core.plan import _may_alias, live_bytes, peak_alloc_bytes, reuse_buffers, spec_nbytes
from fxcc.compiler_core.wire import IntArg, ListArg, NodeRef, TensorSpec
from tests.compiler_core.helpers import alloc_steps, check

torch.manual_seed(0)
SPEC = TensorSpec(dtype="float32", sizes=[16, 16], strides=[16, 1])


def _chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """kernel → mm → kernel → mm → kernel → mm → kernel, every buffer the same size."""
    a = torch.relu(x * 2)
    b = torch.sigmoid(a @ w + 1)
    c = torch.tanh(b @ w - 1)
    return torch.sin(c @ w)


def _fresh_bytes(steps) -> int:
    return sum(spec_nbytes(s.spec) for s in steps if isinstance(s, AllocStep) and s.reuse is None)


def _without_reuse(monkeypatch, fn, *inputs):
    with monkeypatch.context() as m:
        m.setattr(plan_mod, "reuse_buffers", lambda steps, outputs: list(steps))
        m.setattr(plan_mod, "write_in_place", lambda steps, candidates, outputs: list(steps))
        return check(fn, *inputs).manifest.plan


def test_chain_of_kernels_and_mms_reuses_storage(monkeypatch):
    x, w = torch.randn(32, 32), torch.randn(32, 32) / 8
    before = _without_reuse(monkeypatch, _chain, x, w)
    art = check(_chain, x, w)  # results match eager
    plan = art.manifest.plan
    reused = [s for s in alloc_steps(art) if s.reuse is not None]
    assert len(reused) >= 2
    assert _fresh_bytes(plan.steps) <= _fresh_bytes(before.steps) - 2 * 32 * 32 * 4
    assert peak_alloc_bytes(plan.steps, plan.outputs) <= peak_alloc_bytes(before.steps, before.outputs)
    # A reused owner is dropped by the AllocStep that takes it, never by a FreeStep too.
    freed = {n for s in plan.steps if isinstance(s, FreeStep) for n in s.names}
    assert not freed & {s.reuse for s in reused}


def test_outputs_are_never_reused_nor_reuse():
    x, w = torch.randn(32, 32), torch.randn(32, 32) / 8

    def fn(x, w):
        a = torch.relu(x * 2)  # returned: its storage must outlive the call
        b = torch.sigmoid(a @ w)
        c = torch.tanh(b @ w)
        return a, torch.sin(c @ w)

    art = check(fn, x, w)
    outs = {o.name for o in art.manifest.plan.outputs}
    allocs = alloc_steps(art)
    assert all(s.reuse not in outs for s in allocs)
    assert all(s.reuse is None for s in allocs if s.out in outs)


def _kernel(*names: str) -> KernelStep:
    return KernelStep(kernel="k", args=[NodeRef(name=n) for n in names] + [IntArg(value=256)], grid=[1])


def _view(out: str, of: str) -> ExternStep:
    return ExternStep(op="aten.view.default", args=[NodeRef(name=of), ListArg(items=[IntArg(value=256)])],
                      out=out)


def test_buffer_with_a_live_alias_is_not_reused():
    steps = [
        AllocStep(out="a", spec=SPEC), _kernel("a"),
        _view("v", "a"), FreeStep(names=["a"]),  # a's name is dead, its storage lives on in v
        AllocStep(out="b", spec=SPEC), _kernel("v", "b"), FreeStep(names=["v"]),
        AllocStep(out="c", spec=SPEC), _kernel("b", "c"), FreeStep(names=["b"]),
        AllocStep(out="d", spec=SPEC), _kernel("c", "d"), FreeStep(names=["c"]),
    ]
    outputs = [NodeRef(name="d")]
    got = {s.out: s.reuse for s in reuse_buffers(steps, outputs) if isinstance(s, AllocStep)}
    assert got == {"a": None, "b": None, "c": "a", "d": None}
    new = reuse_buffers(steps, outputs)
    assert max(live_bytes(new, outputs)) == max(live_bytes(steps, outputs)) == 2 * spec_nbytes(SPEC)
    assert all("a" not in s.names for s in new if isinstance(s, FreeStep))


def test_alias_of_an_output_pins_its_buffer():
    steps = [
        AllocStep(out="a", spec=SPEC), _kernel("a"), _view("v", "a"), FreeStep(names=["a"]),
        AllocStep(out="b", spec=SPEC), _kernel("b"), FreeStep(names=["b"]),
        AllocStep(out="c", spec=SPEC), _kernel("c"),
    ]
    outputs = [NodeRef(name="v"), NodeRef(name="c")]
    got = {s.out: s.reuse for s in reuse_buffers(steps, outputs) if isinstance(s, AllocStep)}
    assert got == {"a": None, "b": None, "c": None}


def test_reuse_needs_same_dtype_and_enough_bytes():
    big = TensorSpec(dtype="float32", sizes=[32, 16], strides=[16, 1])
    half = TensorSpec(dtype="float16", sizes=[16, 16], strides=[16, 1])
    steps = [
        AllocStep(out="a", spec=SPEC), _kernel("a"),
        AllocStep(out="b", spec=big), _kernel("a", "b"), FreeStep(names=["a"]),
        AllocStep(out="c", spec=half), _kernel("b", "c"),  # a is dead, but of another dtype
        AllocStep(out="d", spec=big), _kernel("c", "d"), FreeStep(names=["b", "c"]),
        AllocStep(out="e", spec=SPEC), _kernel("d", "e"), FreeStep(names=["d"]),
    ]
    got = {s.out: s.reuse for s in reuse_buffers(steps, [NodeRef(name="e")]) if isinstance(s, AllocStep)}
    assert got["c"] is None and got["d"] is None  # a is too small for d
    assert got["e"] is None  # an output


@pytest.mark.parametrize("op, aliases", [
    ("aten.view.default", True), ("aten.permute.default", True), ("getitem", True),
    ("aten._unsafe_view.default", True), ("aten.split.Tensor", True), ("aten.add_.Tensor", True),
    ("aten.type_as.default", True),  # CompositeImplicit: may return its input as is
    ("aten.mm.default", False), ("aten.addmm.default", False), ("aten.convolution.default", False),
    ("aten.native_layer_norm.default", False),
])
def test_which_externs_may_alias(op, aliases):
    assert _may_alias(op) is aliases

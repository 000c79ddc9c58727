"""The plan runner's fast view calls (client.runtime.VIEW_METHODS) give what their aten ops give."""

from __future__ import annotations

import pytest
import torch

from fxcc.client.runtime import VIEW_METHODS, load_plan
from fxcc.compiler_core.artifact import Artifact, ArtifactManifest, CompileStats, ExternStep, Plan
from fxcc.compiler_core.compile import local_versions
from fxcc.compiler_core.wire import IntArg, ListArg, NodeRef, Target, resolve_target

BASE = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)[:, 1:]  # offset, strided

CASES = {
    "aten.permute.default": (BASE, [3, 0, 2, 1]),
    "aten.as_strided.default": (BASE, [2, 5, 3], [60, 1, 5], 7),
    "aten.view.default": (BASE.contiguous(), [4, 5, 2, 2]),
    "aten.reshape.default": (BASE, [2, -1]),
    "aten.t.default": (BASE[0, 0],),
    "aten.transpose.int": (BASE, 1, -1),
    "aten.unsqueeze.default": (BASE, 2),
    "aten.squeeze.dim": (BASE[:, :1], 1),
    "aten.select.int": (BASE, 2, 3),
}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and torch.equal(a, b))


def test_every_fast_view_has_a_case():
    assert set(CASES) == set(VIEW_METHODS)


@pytest.mark.parametrize("op", sorted(CASES))
def test_fast_view_is_its_op(op):
    args = CASES[op]
    assert _same(VIEW_METHODS[op](*args), resolve_target(op)(*args))


def test_as_strided_offset_is_absolute_like_the_op():
    # BASE starts at storage offset 20: as_strided's offset counts from the storage, not the view
    assert BASE.storage_offset() == 20
    got = VIEW_METHODS["aten.as_strided.default"](BASE, [2], [1], 3)
    assert got.storage_offset() == 3 and got.tolist() == [3.0, 4.0]


def test_a_plan_of_views_runs_them_and_matches_eager():
    x = torch.randn(4, 6)
    steps = [
        ExternStep(op="aten.permute.default", args=[NodeRef(name="x"), ListArg(items=[IntArg(value=1), IntArg(value=0)])],
                   out="p"),
        ExternStep(op="aten.as_strided.default",
                   args=[NodeRef(name="p"), ListArg(items=[IntArg(value=3), IntArg(value=2)]),
                         ListArg(items=[IntArg(value=1), IntArg(value=6)]), IntArg(value=1)], out="a"),
    ]
    plan = Plan(inputs=["x"], steps=steps, outputs=[NodeRef(name="p"), NodeRef(name="a")])
    manifest = ArtifactManifest(key="0" * 64, versions=local_versions(), target=Target(), plan=plan, kernels=[],
                                stats=CompileStats())
    p, a = load_plan(Artifact(manifest, {}))([x])
    assert _same(p, x.permute(1, 0)) and _same(a, torch.as_strided(x, (3, 2), (1, 6), 1))

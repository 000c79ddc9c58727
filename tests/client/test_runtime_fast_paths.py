"""The plan runner's per-call shortcuts (client/runtime.py, issue 19 item 3): extern ops called
through the C++ callable behind their OpOverload, extern results checked against the plan's
strides inline (a result laid out otherwise is still copied), static allocations without a shape
evaluation, one-name frees. Each gives what the general path gives."""

from __future__ import annotations

import torch

from fxcc.client.runtime import _direct, load_plan
from fxcc.compiler_core.artifact import (
    AllocStep,
    Artifact,
    ArtifactManifest,
    CompileStats,
    ExternStep,
    FreeStep,
    Plan,
)
from fxcc.compiler_core.compile import local_versions
from fxcc.compiler_core.wire import ListArg, NodeRef, Target, TensorSpec, plain_arg, resolve_target


def _run(plan: Plan, args: list[torch.Tensor]) -> tuple:
    manifest = ArtifactManifest(key="0" * 64, versions=local_versions(), target=Target(), plan=plan, kernels=[],
                                stats=CompileStats())
    return load_plan(Artifact(manifest, {}))(args)


def test_an_overload_is_called_through_its_cxx_callable_with_the_same_result():
    mm = resolve_target("aten.mm.default")
    direct = _direct(mm)
    assert direct is not mm and direct is mm._op
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(direct(a, b), mm(a, b), rtol=0, atol=0)
    # what is not a plain aten overload stays as it is
    assert _direct(torch.Tensor.permute) is torch.Tensor.permute


def test_a_result_in_another_layout_is_copied_to_the_plans_strides():
    x = torch.randn(4, 6)
    steps = [
        # t's view has strides (1, 6); the plan says (4, 1): the runner copies it so
        ExternStep(op="aten.t.default", args=[NodeRef(name="x")], out="p", expect_strides=[4, 1]),
        # clone keeps a contiguous input's layout: as planned, no copy
        ExternStep(op="aten.clone.default", args=[NodeRef(name="x")], out="c", expect_strides=[6, 1]),
    ]
    p, c = _run(Plan(inputs=["x"], steps=steps, outputs=[NodeRef(name="p"), NodeRef(name="c")]), [x])
    assert p.stride() == (4, 1) and torch.equal(p, x.t())
    assert c.stride() == (6, 1) and torch.equal(c, x) and c.data_ptr() != x.data_ptr()


def test_static_allocations_and_one_name_frees():
    x = torch.randn(2, 3)
    spec = TensorSpec(dtype="float32", sizes=[3, 2], strides=[1, 3])
    steps = [
        AllocStep(out="buf", spec=spec),
        ExternStep(op="aten.neg.default", args=[NodeRef(name="x")], out="n"),
        ExternStep(op="aten.add.Tensor", args=[NodeRef(name="n"), NodeRef(name="x")], out="z"),
        FreeStep(names=["n"]),
    ]
    buf, z = _run(Plan(inputs=["x"], steps=steps, outputs=[NodeRef(name="buf"), NodeRef(name="z")]), [x])
    assert buf.shape == (3, 2) and buf.stride() == (1, 3) and buf.dtype == torch.float32
    assert torch.equal(z, torch.zeros(2, 3))


def test_a_cxx_ops_constant_lists_serve_every_call_and_a_python_op_gets_fresh_ones(monkeypatch):
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    args = [NodeRef(name="x"), NodeRef(name="w"), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1]
    conv = ExternStep(op="aten.convolution.default", args=[a if isinstance(a, NodeRef) else _wire(a) for a in args],
                      out="y", expect_strides=[256, 64, 8, 1])
    plan = Plan(inputs=["x", "w"], steps=[conv], outputs=[NodeRef(name="y")])
    want = torch.nn.functional.conv2d(x, w, padding=1)
    for _ in range(2):  # the second call reads the same constants
        (y,) = _run(plan, [x, w])
        torch.testing.assert_close(y, want)
    # a Python callable (no C++ binding behind it) gets a fresh list each call, which it may change
    from fxcc.client import runtime

    seen = []

    def grow(t: torch.Tensor, dims: list) -> torch.Tensor:
        seen.append(type(dims))
        dims.append(0)
        return t

    step = ExternStep(op="aten.sum.dim_IntList", args=[NodeRef(name="x"), _wire([1, 2])], out="s")
    monkeypatch.setattr(runtime, "resolve_target", lambda op, node=None: grow)
    run = runtime.PlanRunner._extern(step)
    for _ in range(2):
        run({"x": x})
    assert seen == [list, list]


def _wire(a: object) -> object:
    return ListArg(items=[plain_arg(x) for x in a]) if isinstance(a, list) else plain_arg(a)

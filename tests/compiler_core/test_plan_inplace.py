"""Writing in place: a kernel stores a buffer into the memory of an input that dies with it, only
where it reads that input at exactly the addresses it writes; results match eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

import fxcc.compiler_core.plan as plan_mod
from bench.plan_memory import peak_live_bytes
from fxcc.client.capture import capture_graph
from fxcc.client.runtime import load_plan
from fxcc.compiler_core.artifact import (
    MANIFEST_VERSION,
    AllocStep,
    ArtifactManifest,
    ExternStep,
    FreeStep,
    KernelStep,
)
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest, IntArg, ListArg, NodeRef, TensorSpec
from tests.compiler_core.helpers import check

torch.manual_seed(0)


def _compile(fn, *inputs, monkeypatch=None, in_place: bool = True):
    """(artifact, graph spec) of `fn`; `in_place=False` compiles it without write_in_place."""
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=core_aten_decompositions())(*inputs)
    spec = capture_graph(gm, list(inputs)).spec
    if in_place:
        return compile_request(CompileRequest(graph=spec)), spec
    with monkeypatch.context() as m:
        m.setattr(plan_mod, "write_in_place", lambda steps, candidates, outputs: list(steps))
        return compile_request(CompileRequest(graph=spec)), spec


def _in_place(art) -> dict[str, str]:
    """{buffer: the input it is written over} for every kernel that writes in place."""
    steps = art.manifest.plan.steps
    found = {}
    for at, step in enumerate(steps):
        if isinstance(step, AllocStep) and step.reuse is not None:
            kernel = next(s for s in steps[at:] if isinstance(s, KernelStep))
            if [a.name for a in kernel.args if isinstance(a, NodeRef)].count(step.out) > 1:
                found[step.out] = step.reuse
    return found


def _extern_outs(art, op: str) -> set[str]:
    return {s.out for s in art.manifest.plan.steps if isinstance(s, ExternStep) and s.op == op}


def _mlp(x, w1, b1, w2):
    return F.gelu(F.linear(x, w1, b1)) @ w2


MLP_INPUTS = (torch.randn(8, 16), torch.randn(256, 16) / 4, torch.randn(256), torch.randn(256, 4) / 16)


def test_bias_gelu_writes_over_the_matmul_result_and_peaks_at_one_hidden_buffer(monkeypatch):
    art = check(_mlp, *MLP_INPUTS)
    (written,) = _in_place(art).values()
    assert written in _extern_outs(art, "aten.addmm.default")  # torch's tensor, taken by the kernel
    freed = {n for s in art.manifest.plan.steps if isinstance(s, FreeStep) for n in s.names}
    assert written not in freed  # its AllocStep drops it, no FreeStep

    hidden = 8 * 256 * 4
    out = 8 * 4 * 4
    art, spec = _compile(_mlp, *MLP_INPUTS)
    assert peak_live_bytes(art.manifest.plan, spec) == hidden + out
    before, spec = _compile(_mlp, *MLP_INPUTS, monkeypatch=monkeypatch, in_place=False)
    assert peak_live_bytes(before.manifest.plan, spec) == 2 * hidden  # GELU's buffer next to addmm's


def test_kernel_buffers_chain_in_place_and_match_eager():
    def fn(x, w):
        a = torch.sigmoid(x @ w) * 3  # written over mm's result
        c = a @ w
        b = torch.relu(a - c).sigmoid()  # written over a's memory (mm's), or over c
        return torch.sin(b @ w)

    x, w = torch.randn(16, 32), torch.randn(32, 32) / 6
    art = check(fn, x, w)
    assert len(_in_place(art)) >= 2


def test_layer_norm_over_a_residual_writes_over_the_matmul_result():
    # A persistent reduction: the kernel reads a row of mm's result, reduces it, and only then
    # stores the normalized row where it read it.
    def fn(x, w, lw, lb, w2):
        return F.layer_norm(x @ w + x, (32,), lw, lb) @ w2

    inputs = (torch.randn(16, 32), torch.randn(32, 32) / 6, torch.randn(32), torch.randn(32), torch.randn(32, 8))
    art = check(fn, *inputs, atol=1e-5, rtol=1e-5)
    assert set(_in_place(art).values()) & _extern_outs(art, "aten.mm.default")


def _never_over_mm(fn, *inputs):
    art = check(fn, *inputs)
    assert not set(_in_place(art).values()) & _extern_outs(art, "aten.mm.default")
    assert all(s.reuse not in _extern_outs(art, "aten.mm.default")
               for s in art.manifest.plan.steps if isinstance(s, AllocStep))


def _transposed(x, w):
    y = x @ w
    return (y + y.t()) @ w  # laid out like y: only the index tells them apart


def _broadcast_column(x, w):
    y = x @ w
    return (y * y[:, :1]) @ w


def _neighbour(x, w):
    y = x @ w
    return (torch.roll(y, 1, 0) + y) @ w


def _transposed_row_sums(x, w):
    y = x @ w
    return (y + y.t().sum(1, keepdim=True)) @ w


def test_a_transposed_read_is_never_written_in_place():
    _never_over_mm(_transposed, torch.randn(24, 24), torch.randn(24, 24) / 5)


def test_a_read_of_another_element_is_never_written_in_place():
    _never_over_mm(_broadcast_column, torch.randn(24, 24), torch.randn(24, 24) / 5)
    _never_over_mm(_neighbour, torch.randn(24, 24), torch.randn(24, 24) / 5)


def test_a_reduction_reading_other_rows_is_never_written_over():
    # Row i adds the sum of column i, reduced in the same kernel that writes row i: other rows'
    # programs read what this one would overwrite.
    _never_over_mm(_transposed_row_sums, torch.randn(24, 24), torch.randn(24, 24) / 5)


def _two_readers(x, w):
    y = x @ w
    a = torch.sigmoid(y) * 3
    b = torch.relu(a - 1).sigmoid()  # recomputes a from y: both load y, neither reads the other
    return torch.sin(b @ w), torch.atan2(a, b)


def test_a_load_by_a_node_the_output_does_not_depend_on_keeps_the_memory():
    # Nothing orders that node's load before the other node's store (another thread may do it).
    _never_over_mm(_two_readers, torch.randn(16, 24), torch.randn(24, 24) / 5)


def test_the_same_pointwise_reads_are_written_in_place():
    # The control for the three above: reading y only where it writes, the kernel takes mm's memory.
    def fn(x, w):
        y = x @ w
        return (y * 2 + y.sigmoid()) @ w

    art = check(fn, torch.randn(24, 24), torch.randn(24, 24) / 5)
    assert set(_in_place(art).values()) & _extern_outs(art, "aten.mm.default")


def test_an_input_read_later_or_through_a_view_keeps_its_memory():
    def later(x, w):
        y = x @ w
        return torch.tanh(y) @ w + y  # y is read again after tanh's kernel

    def viewed(x, w):
        y = x @ w
        v = y.view(-1)  # a view that lives on after tanh's kernel
        return torch.tanh(y) @ w, v.sum()

    w = torch.randn(24, 24) / 5
    for fn in (later, viewed):
        art = check(fn, torch.randn(24, 24), w)
        assert not set(_in_place(art).values()) & _extern_outs(art, "aten.mm.default")


SPEC = TensorSpec(dtype="float32", sizes=[16, 16], strides=[16, 1])


def _mm(out: str) -> ExternStep:
    return ExternStep(op="aten.mm.default", args=[NodeRef(name="x"), NodeRef(name="w")], out=out,
                      expect_strides=[16, 1])


def _kernel(*names: str) -> KernelStep:
    return KernelStep(kernel="k", args=[NodeRef(name=n) for n in names] + [IntArg(value=256)], grid=[1])


def test_write_in_place_takes_a_dying_extern_result_and_renames_the_kernels_read():
    steps = [_mm("y"), AllocStep(out="o", spec=SPEC), _kernel("y", "o"), FreeStep(names=["y"]),
             AllocStep(out="z", spec=SPEC), _kernel("o", "z"), FreeStep(names=["o"])]
    got = plan_mod.write_in_place(steps, [{"o": ["y"]}, {}], [NodeRef(name="z")])
    assert got[1] == AllocStep(out="o", spec=SPEC, reuse="y")
    assert got[2] == _kernel("o", "o")
    assert not any(isinstance(s, FreeStep) and "y" in s.names for s in got)


def test_write_in_place_leaves_a_storage_that_an_alias_still_holds():
    view = ExternStep(op="aten.view.default", args=[NodeRef(name="y"), ListArg(items=[IntArg(value=256)])],
                      out="v")
    steps = [_mm("y"), view, AllocStep(out="o", spec=SPEC), _kernel("y", "o"), FreeStep(names=["y"]),
             ExternStep(op="aten.sum.default", args=[NodeRef(name="v")], out="s"), FreeStep(names=["v"]),
             AllocStep(out="z", spec=SPEC), _kernel("o", "z"), FreeStep(names=["o"])]
    got = plan_mod.write_in_place(steps, [{"o": ["y"]}, {}], [NodeRef(name="z"), NodeRef(name="s")])
    assert got == steps  # v still reads y's memory after the kernel


def test_write_in_place_never_takes_a_graph_input_nor_gives_an_output_taken_memory():
    steps = [AllocStep(out="o", spec=SPEC), _kernel("x", "o"), FreeStep(names=["x"]),
             _mm("y"), AllocStep(out="z", spec=SPEC), _kernel("y", "z"), FreeStep(names=["y"])]
    assert plan_mod.write_in_place(steps, [{"o": ["x"]}, {"z": ["y"]}], [NodeRef(name="z")]) == steps


def test_graph_outputs_and_inputs_are_never_written_in_place():
    def fn(x, w):
        y = x @ w
        return torch.relu(y), torch.sigmoid(x) @ w  # relu(y) is an output; sigmoid reads input x

    art = check(fn, torch.randn(8, 8), torch.randn(8, 8))
    assert not _in_place(art)


def test_a_value_an_extern_reads_is_loaded_not_recomputed_later():
    # Once realized for the mm, relu(x * 2) is read from its buffer by the residual's kernel,
    # so x need not stay alive for it (a ResNet's block outputs held every conv result alive).
    def fn(x, w):
        y = torch.relu(x * 2)
        return torch.tanh(y @ w + y)

    art = check(fn, torch.randn(8, 8), torch.randn(8, 8))
    x = art.manifest.plan.inputs[0]
    last = [s for s in art.manifest.plan.steps if isinstance(s, KernelStep)][-1]
    assert x not in {a.name for a in last.args if isinstance(a, NodeRef)}


def test_in_place_plans_run_the_same_with_every_launch():
    runner = load_plan(check(_mlp, *MLP_INPUTS))
    first = runner(list(MLP_INPUTS))[0].clone()
    torch.testing.assert_close(runner(list(MLP_INPUTS))[0], first, rtol=0, atol=0)


def test_manifest_versions_old_plans_load_and_new_ones_say_so():
    art = check(_mlp, *MLP_INPUTS)
    assert art.manifest.schema_version == MANIFEST_VERSION == 2
    old = art.manifest.model_dump(mode="json") | {"schema_version": 1}
    assert ArtifactManifest.model_validate(old).schema_version == 1
    future = old | {"schema_version": 3}
    try:
        ArtifactManifest.model_validate(future)
    except ValueError:
        pass
    else:
        raise AssertionError("a manifest of an unknown version must be rejected")


def test_planned_peak_counts_a_let_go_input_only_until_its_last_read():
    """bench.plan_memory's accounting of a backward's inputs (PlanRunner.steal): an input that only
    the call holds counts for the whole call when held, until the step after its last read when let go."""
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    art, spec = _compile(lambda a, b: torch.mm(a.sin(), b).cos(), a, b)
    (name, _) = [p.name for p in spec.placeholders]
    plan, size = art.manifest.plan, a.numel() * a.element_size()
    alone = peak_live_bytes(plan, spec)  # sin's result beside the mm's: a is the caller's
    held = peak_live_bytes(plan, spec, frozenset({name}))
    let_go = peak_live_bytes(plan, spec, frozenset({name}), let_go=True)
    assert alone == 2 * size
    assert held == alone + size
    assert let_go == alone  # a is gone before the mm's result exists

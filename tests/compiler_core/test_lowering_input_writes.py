"""Graphs ending with write-backs into their inputs (AOTAutograd's copy_ of batch norm's running
statistics): lowered and fused; a value goes straight into its input from the kernel that computes
it where nothing reads the input after that kernel (scheduler.store_into_inputs), the others stay
copies as the plan's last steps (small ones together, one _foreach_copy_ per dtype); other mutations
run as extern calls. Results, and the inputs written, match eager."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.client.runtime import load_plan
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest


def _compile(fn, *inputs):
    gm = make_fx(fn)(*[t.clone() for t in inputs])
    return compile_request(CompileRequest(graph=capture_graph(gm, list(inputs)).spec))


def _running_stats(x, rm, rv, n):
    """Two write-backs, each value reading the other's input: both must see the old values."""
    mean = x.mean(dim=0)
    new_rm = rm * 0.9 + mean * 0.1 + rv * 0.01
    new_rv = rv * 0.9 + x.var(dim=0) * 0.1 + rm * 0.01
    y = (x - mean) * rm
    rm.copy_(new_rm)
    rv.copy_(new_rv)
    n.copy_(n + 1)
    return (y.relu(),)


def _writers(art, name: str) -> list[int]:
    """Positions of the kernel steps that pass input `name` twice (read, and stored into)."""
    return [i for i, s in enumerate(art.manifest.plan.steps) if s.kind == "kernel"
            and [a.name for a in s.args if a.kind == "node"].count(name) == 2]


def test_write_backs_are_lowered_and_run_last() -> None:
    """rm's and rv's new values each read the other's input, so neither may land early: they stay
    copies, together, after every kernel. The count's goes into n from its kernel: no copy, no buffer."""
    torch.manual_seed(0)
    x, rm, rv, n = torch.randn(8, 5), torch.randn(5), torch.rand(5), torch.tensor(3)
    art = _compile(_running_stats, x, rm, rv, n)
    plan = art.manifest.plan
    steps = plan.steps
    externs = [s for s in steps if s.kind == "extern"]
    # small tensors: one launch per dtype (torch's multi-tensor copy takes one dtype a list; a mixed
    # list would run as a copy per tensor)
    assert [s.op for s in externs] == ["aten._foreach_copy_.default"]
    (together,) = externs
    assert [a.name for a in together.args[0].items] == [plan.inputs[i] for i in (1, 2)]
    assert art.manifest.stats.kernels >= 1
    assert min(steps.index(e) for e in externs) > max(i for i, s in enumerate(steps) if s.kind == "kernel")
    assert len(_writers(art, plan.inputs[3])) == 1 and not _writers(art, plan.inputs[1])
    assert sum(s.kind == "alloc" and s.spec.sizes == [] for s in steps) == 0  # n's new value: no buffer
    want_inputs = [t.clone() for t in (x, rm, rv, n)]
    want = _running_stats(*want_inputs)
    got_inputs = [t.clone() for t in (x, rm, rv, n)]
    got = load_plan(art)(got_inputs)
    torch.testing.assert_close(got[0], want[0])
    for g, w in zip(got_inputs, want_inputs):
        torch.testing.assert_close(g, w)


def test_a_read_after_a_write_keeps_the_graph_extern() -> None:
    def f(x, rm):
        rm.copy_(rm + x)
        return (rm * 2,)
    x, rm = torch.randn(4), torch.randn(4)
    art = _compile(f, x, rm)
    assert art.manifest.stats.kernels == 0
    got_rm = rm.clone()
    got = load_plan(art)([x, got_rm])
    torch.testing.assert_close(got[0], (rm + x) * 2)
    torch.testing.assert_close(got_rm, rm + x)


def test_a_large_write_back_is_a_copy_of_its_own():
    """A KV cache's write-back (larger than SMALL_WRITE_MAX) that cannot go in place (its value reads
    the cache at other elements) is its own copy_; the count beside it goes into its input."""
    from fxcc.compiler_core.lowering.core import SMALL_WRITE_MAX

    def f(x, cache, n):
        cache.copy_(cache.flip(0) * 0.5 + x)
        n.copy_(n + 1)
        return (x.sum(),)
    x, cache, n = torch.randn(SMALL_WRITE_MAX + 1), torch.randn(SMALL_WRITE_MAX + 1), torch.tensor(2)
    art = _compile(f, x, cache, n)
    assert [s.op for s in art.manifest.plan.steps if s.kind == "extern"] == ["aten.copy_.default"]
    assert len(_writers(art, art.manifest.plan.inputs[2])) == 1
    got_cache, got_n = cache.clone(), n.clone()
    got = load_plan(art)([x, got_cache, got_n])
    torch.testing.assert_close(got[0], x.sum())
    torch.testing.assert_close(got_cache, cache.flip(0) * 0.5 + x)
    assert int(got_n) == 3


def _blend(x, rm, rv, n):
    """Batch norm's update: each new statistic reads only its own input, at its own element."""
    mean = x.mean(dim=0)
    rm.copy_(rm * 0.9 + mean * 0.1)
    rv.copy_(rv * 0.9 + x.var(dim=0) * 0.1)
    n.copy_(n + 1)
    return ((x - mean).relu(),)


def test_statistics_go_into_their_inputs_from_the_kernels_that_compute_them() -> None:
    torch.manual_seed(0)
    x, rm, rv, n = torch.randn(8, 5), torch.randn(5), torch.rand(5), torch.tensor(3)
    art = _compile(_blend, x, rm, rv, n)
    plan = art.manifest.plan
    assert not [s.op for s in plan.steps if s.kind == "extern"]  # no write-back step at all
    for i in (1, 2, 3):
        assert len(_writers(art, plan.inputs[i])) == 1, plan.inputs[i]
    # no buffer for the new values: the [5] allocations left are the kernels' own results, if any
    allocs = [s for s in plan.steps if s.kind == "alloc"]
    assert not any(s.spec.sizes in ([], [5]) for s in allocs), allocs
    want_inputs = [t.clone() for t in (x, rm, rv, n)]
    want = _blend(*want_inputs)
    got_inputs = [t.clone() for t in (x, rm, rv, n)]
    got = load_plan(art)(got_inputs)
    torch.testing.assert_close(got[0], want[0])
    for g, w in zip(got_inputs, want_inputs):
        torch.testing.assert_close(g, w)
    # again: the plan reads the statistics it wrote the first time (the state of a second step)
    got = load_plan(art)(got_inputs)
    want = _blend(*want_inputs)
    torch.testing.assert_close(got[0], want[0])
    for g, w in zip(got_inputs, want_inputs):
        torch.testing.assert_close(g, w)


def _read_late(x, w, rm):
    """rm's new value joins the first kernel (horizontal fusion: w * 2, of its size), which comes
    before a matmul that reads the old rm."""
    h = torch.mm(x, (w * 2).unsqueeze(1))
    out = torch.mm(h, rm.unsqueeze(0))
    rm.copy_(rm + 1)
    return (out,)


def test_a_value_whose_input_is_read_later_stays_a_copy() -> None:
    """Storing rm from the first kernel would hand the matmul after it the new rm: where anything
    after the value's kernel reads the input, the write-back stays a copy after everything."""
    torch.manual_seed(0)
    x, w, rm = torch.randn(6, 4), torch.randn(4), torch.randn(4)
    art = _compile(_read_late, x, w, rm)
    plan = art.manifest.plan
    kernels = [s for s in plan.steps if s.kind == "kernel"]
    assert len(kernels) == 1  # w * 2 and rm + 1 together, before both matmuls
    assert [s.op for s in plan.steps if s.kind == "extern" and s.op != "aten.unsqueeze.default"] == \
        ["aten.mm.default"] * 2 + ["aten.copy_.default"]
    assert not _writers(art, plan.inputs[2])
    got_rm = rm.clone()
    (got,) = load_plan(art)([x, w, got_rm])
    torch.testing.assert_close(got, torch.mm(torch.mm(x, (w * 2).unsqueeze(1)), rm.unsqueeze(0)))
    torch.testing.assert_close(got_rm, rm + 1)

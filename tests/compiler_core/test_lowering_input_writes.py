"""Graphs ending with write-backs into their inputs (AOTAutograd's copy_ of batch norm's running
statistics): lowered and fused, with the copies as the plan's last steps (small ones together, one
_foreach_copy_ per dtype); other mutations run as
extern calls. Results, and the inputs written, match eager."""

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


def test_write_backs_are_lowered_and_run_last() -> None:
    torch.manual_seed(0)
    x, rm, rv, n = torch.randn(8, 5), torch.randn(5), torch.rand(5), torch.tensor(3)
    art = _compile(_running_stats, x, rm, rv, n)
    steps = art.manifest.plan.steps
    externs = [s for s in steps if s.kind == "extern"]
    # small tensors: one launch per dtype (torch's multi-tensor copy takes one dtype a list; a mixed
    # list would run as a copy per tensor), the lone int64 count a copy_ of its own
    assert sorted(s.op for s in externs) == ["aten._foreach_copy_.default", "aten.copy_.default"]
    (together,) = [s for s in externs if s.op == "aten._foreach_copy_.default"]
    assert [a.name for a in together.args[0].items] == [art.manifest.plan.inputs[i] for i in (1, 2)]
    assert art.manifest.stats.kernels >= 1
    assert min(steps.index(e) for e in externs) > max(i for i, s in enumerate(steps) if s.kind == "kernel")
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
    """A KV cache's write-back (larger than SMALL_WRITE_MAX) is its own copy_; the small one beside
    it too (one small copy has nothing to go together with)."""
    from fxcc.compiler_core.lowering.core import SMALL_WRITE_MAX

    def f(x, cache, n):
        cache.copy_(cache * 0.5 + x)
        n.copy_(n + 1)
        return (x.sum(),)
    x, cache, n = torch.randn(SMALL_WRITE_MAX + 1), torch.randn(SMALL_WRITE_MAX + 1), torch.tensor(2)
    art = _compile(f, x, cache, n)
    assert [s.op for s in art.manifest.plan.steps if s.kind == "extern"] == ["aten.copy_.default"] * 2
    got_cache, got_n = cache.clone(), n.clone()
    got = load_plan(art)([x, got_cache, got_n])
    torch.testing.assert_close(got[0], x.sum())
    torch.testing.assert_close(got_cache, cache * 0.5 + x)
    assert int(got_n) == 3

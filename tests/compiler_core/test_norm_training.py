"""Normalizations through AOTAutograd with fxcc's decompositions, forward and backward, against eager:
batch norm (training, eval, without running statistics, and the entry points CUDA and newer torch
trace: cudnn_, miopen_, native_, _batch_norm_with_update), instance norm, group norm; fp32 and bf16.
Every graph is lowered whole: no extern call but the running statistics' write-backs (copy_, or
one _foreach_copy_ per dtype), and batch norm's go into the running statistics straight from the
kernels that compute them (no write-back step at all)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import aot_function

from fxcc.client.backend import decomposition_table, partition_joint_graph
from fxcc.client.capture import capture_graph
from fxcc.client.runtime import load_plan
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest

aten = torch.ops.aten
TOL = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}}


def fxcc_aot(fn, stats: list):
    """`fn` through AOTAutograd as fxcc's backend runs it, each graph compiled and run by fxcc;
    the stats of each compiled graph are appended to `stats`."""
    def compiler(gm, inputs):
        cap = capture_graph(gm, list(inputs))
        art = compile_request(CompileRequest(graph=cap.spec))
        stats.append(art.manifest.stats)
        runner = load_plan(art)

        def run(args):
            return runner(list(args) + cap.constants)
        run._boxed_call = True
        return run
    return aot_function(fn, fw_compiler=compiler, bw_compiler=compiler, decompositions=decomposition_table(),
                        partition_fn=partition_joint_graph, keep_inference_input_mutations=True)


def _bn(op):
    return lambda x, w, b, rm, rv: op(x, w, b, rm, rv, True, 0.1, 1e-5)[0]


CASES = {
    "batch_norm_train": lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, True),
    "batch_norm_eval": lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, False),
    "batch_norm_no_stats": lambda x, w, b, rm, rv: F.batch_norm(x, None, None, w, b, True),
    "instance_norm": lambda x, w, b, rm, rv: F.instance_norm(x, None, None, w, b),
    "instance_norm_running": lambda x, w, b, rm, rv: F.instance_norm(x, rm, rv, w, b, use_input_stats=True),
    "group_norm": lambda x, w, b, rm, rv: F.group_norm(x, 3, w, b),
    "cudnn_batch_norm": _bn(aten.cudnn_batch_norm),
    "miopen_batch_norm": _bn(aten.miopen_batch_norm),
    "native_batch_norm": _bn(aten.native_batch_norm),
    "batch_norm_with_update": lambda x, w, b, rm, rv: aten._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5)[0],
    "batch_norm_no_update": lambda x, w, b, rm, rv: aten._batch_norm_no_update(x, w, b, rm, rv, 0.1, 1e-5)[0],
}
# Batch norms in training that update running statistics: every update stored by its kernel.
UPDATES_IN_PLACE = {"batch_norm_train", "cudnn_batch_norm", "miopen_batch_norm", "native_batch_norm",
                    "batch_norm_with_update"}
# CPU has no cuDNN or MIOpen kernels: eager's answer for those is the batch norm they implement.
EAGER = {"cudnn_batch_norm": CASES["batch_norm_train"], "miopen_batch_norm": CASES["batch_norm_train"]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_norm_forward_and_backward_match_eager_with_no_extern(case: str, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and case.startswith(("cudnn", "miopen")):
        pytest.skip("cuDNN / MIOpen batch norm take fp32 statistics with low-precision inputs")
    fn = CASES[case]
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5, 7, dtype=dtype) * 2 + 1
    w, b = torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype)
    rm, rv = torch.randn(6, dtype=dtype), torch.rand(6, dtype=dtype) + 0.5
    g = torch.randn(4, 6, 5, 7, dtype=dtype)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    ref_leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    running, ref_running = [rm.clone(), rv.clone()], [rm.clone(), rv.clone()]
    stats: list = []
    out = fxcc_aot(fn, stats)(*leaves, *running)
    out.backward(g)
    want = EAGER.get(case, fn)(*ref_leaves, *ref_running)
    want.backward(g)
    torch.testing.assert_close(out, want, **TOL[dtype])
    for got, ref, name in zip(leaves, ref_leaves, "xwb"):
        torch.testing.assert_close(got.grad, ref.grad, **TOL[dtype], msg=lambda m, n=name: f"grad {n}: {m}")
    for got, ref in zip(running, ref_running):
        torch.testing.assert_close(got, ref, **TOL[dtype])
    assert len(stats) == 2  # forward and backward
    for s in stats:
        assert set(s.extern_ops) <= {"aten.copy_.default", "aten._foreach_copy_.default"}, s.extern_ops
        assert s.kernels >= 1
    if case in UPDATES_IN_PLACE:
        assert not stats[0].extern_ops, stats[0].extern_ops


@pytest.mark.usefixtures("fresh_compiles")
def test_batch_norm_with_a_symbolic_batch_is_lowered_and_updates_its_statistics(monkeypatch):
    """Batch norm in training over batches of 2, 3 and 5: the second size compiles a symbolic
    graph, whose counts (n, n - 1 for the unbiased variance) are size expressions. It lowers whole
    (the running statistics stored by their kernels, no extern call), and outputs and running
    statistics match eager's at every size. (No backward here: AOTAutograd's batch-norm backward
    computes 1 / n as a SymFloat, which cannot travel yet.)"""
    import copy

    from torch import nn

    from fxcc.client import backend

    monkeypatch.setenv("FXCC_FALLBACK", "error")
    torch.manual_seed(0)
    eager = nn.Sequential(nn.BatchNorm2d(4), nn.ReLU(), nn.BatchNorm2d(4))
    fx = copy.deepcopy(eager)
    compiled = torch.compile(fx, backend="fxcc")
    with torch.no_grad():
        for batch in (2, 3, 5):
            x = torch.randn(batch, 4, 3, 5) * 2 + 1
            torch.testing.assert_close(compiled(x), eager(x), **TOL[torch.float32])
    for got, want in zip(fx.buffers(), eager.buffers()):
        torch.testing.assert_close(got, want, **TOL[torch.float32])
    events = [e for e in backend.events() if e.stats is not None]
    assert len(events) == 2, [e.source for e in backend.events()]  # static, then symbolic
    assert all(not e.stats.extern_ops and e.stats.kernels >= 1 for e in events), [e.stats for e in events]

"""Which training plans replay as CUDA graphs and which of their inputs must keep their addresses
(no GPU needed; the replays themselves are checked on a GPU in tests/gpu/test_training_graphs_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from fxcc.client.cuda_graphs import why_not_graphed
from fxcc.client.settings import ClientSettings
from fxcc.client.training_graphs import written_inputs
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target
from tests.compiler_core.test_passes_layout import small_resnet


@pytest.fixture(scope="module")
def training_step():
    """A small conv net's training forward and backward specs and their sm_90 plans, compiled on
    this CPU (nothing is launched)."""
    from bench.reduction_shapes import training_specs

    specs = training_specs(small_resnet().train(), torch.randn(2, 3, 32, 32), keep_input_mutations=True)
    options = CompileOptions(target=Target(kind="cuda", arch=90))
    return [(spec, compile_request(CompileRequest(graph=spec, options=options)).manifest) for spec in specs]


def test_the_forward_writes_exactly_its_batch_norm_statistics(training_step):
    (fw, _), (bw, _) = training_step
    model = small_resnet()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    written = written_inputs(fw)
    assert len(written) == 3 * len(norms)  # running mean, variance and num_batches_tracked each
    shapes = sorted(tuple(p.spec.sizes) for p in fw.placeholders if p.name in written)
    want = sorted([(m.num_features,) for m in norms] * 2 + [()] * len(norms))
    assert shapes == want
    assert written_inputs(bw) == frozenset()  # a backward writes none of its inputs


def test_static_training_plans_may_replay_only_when_training_graphs_are_on(training_step):
    for _, manifest in training_step:
        assert why_not_graphed(manifest, inference=False, training=True) is None
        assert why_not_graphed(manifest, inference=False) == "not an inference graph"
    # an inference plan is still held to the inference list, which has no backward ops
    _, bw = training_step[1]
    assert why_not_graphed(bw, inference=True).startswith("extern ops not known to be capture-safe")


def test_training_graphs_follow_their_setting():
    assert ClientSettings.from_env({}).cuda_graphs_training
    assert not ClientSettings.from_env({"FXCC_CUDA_GRAPHS_TRAINING": "0"}).cuda_graphs_training


def test_gradients_and_saved_tensors_are_handed_out_from_the_pool_and_the_output_is_not(monkeypatch):
    """What a training graph's replay hands out of its pool however small (client/graphs.py
    pool_outputs): all of a backward's outputs and a forward's saved tensors, never the model's
    own output (the caller may keep it past the next step)."""
    from fxcc.client import graphs

    seen = []

    def recording(gm, capture):
        got = real(gm, capture)
        seen.append((len(capture.spec.outputs), got))
        return got

    real = graphs.pool_outputs
    monkeypatch.setattr(graphs, "pool_outputs", recording)
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    out = torch.compile(model, backend="fxcc")(torch.randn(3, 8))
    out.sum().backward()
    (fw_outputs, fw), (bw_outputs, bw) = seen
    assert 0 not in fw and fw == frozenset(range(1, fw_outputs))  # the output first, then what is saved
    assert bw == frozenset(range(bw_outputs)) and bw_outputs >= 6  # each parameter's gradient (and None for x)


def test_outputs_a_caller_keeps_are_found_by_their_storage_counts():
    """After a replay, the outputs still held past the next call (a `.grad` AccumulateGrad stole)
    are found by their storages' use counts, by position; only outputs that own their storage
    (a copy could serve them) are named."""
    from fxcc.client.training_graphs import _TrainingGraph

    g = _TrainingGraph()
    grad, saved, shared = torch.zeros(4), torch.zeros(8), torch.zeros(6)
    g.storages = [grad.untyped_storage(), saved.untyped_storage(), shared.untyped_storage()]
    g.owners = {0: 3, 1: 5}  # the third storage is viewed by two outputs: no copy serves it
    g.baseline = [torch._C._storage_Use_Count(s._cdata) for s in g.storages]
    assert g.free() and g.held_outputs() == set()
    kept_grad = grad.detach()  # the caller's `.grad`: an alias of the pool's storage
    kept_view = shared[2:].detach()
    assert not g.free() and g.held_outputs() == {3}
    del kept_grad
    assert not g.free() and g.held_outputs() == set()  # held, but no copy could serve it
    del kept_view
    assert g.free()


def test_outputs_are_copied_out_only_once_a_caller_keeps_them_on_more_than_one_call():
    """A position found held once (a validation loss kept over one training step) runs that call
    step by step; found held again before HELD_FORGET replays in a row, it is copied out from then on."""
    from fxcc.client.training_graphs import HELD_AGAIN, HELD_FORGET, MAX_COPY_CAPTURES, TrainingGraphedPlan

    class Manifest:
        key = "k" * 64

        class plan:
            inputs = ()

    plan = TrainingGraphedPlan(lambda args: (), Manifest())
    assert HELD_AGAIN == 2
    assert not plan._keeps({3, 4})  # held once
    for _ in range(HELD_FORGET - 1):
        plan._replayed()
    assert plan._keeps({4})  # again, fewer than HELD_FORGET replays since
    plan.copy_out |= {3, 4}
    plan.copy_captures += 1

    assert not plan._keeps({7})
    for _ in range(HELD_FORGET):
        plan._replayed()
    assert not plan._keeps({7})  # forgotten after HELD_FORGET replays in a row: once more is once
    assert not plan._keeps(set())  # nothing held: nothing to copy
    assert plan._keeps({7})  # held on two calls with no replay between (micro-batches accumulating)
    plan.copy_captures = MAX_COPY_CAPTURES
    assert not plan._keeps({7})  # no more copy captures

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
    assert not ClientSettings.from_env({}).cuda_graphs_training_tail  # until it has run on a GPU
    assert ClientSettings.from_env({"FXCC_CUDA_GRAPHS_TRAINING_TAIL": "1"}).cuda_graphs_training_tail


def test_what_a_cut_graph_leaves_is_pool_memory_or_made_again_from_the_call(monkeypatch):
    """A cut plan's graph keeps the values the steps after it read: those that view an input (a
    weight's transpose) are made again from each call's input, never kept; the rest are its pool
    memory, whose outputs are aliases (small ones alone on their storage copied out)."""
    from fxcc.client import training_graphs as tg

    weight, batch = torch.randn(8, 4), torch.randn(3, 4)
    hidden, logits_base = torch.randn(3, 8), torch.randn(64, 1024)
    loss = torch.zeros(())
    g = tg._TrainingGraph()
    g.live = {"t": weight.t(), "h": hidden, "lb": logits_base, "loss": loss}
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # what a GPU's values say
    assert tg._describe_live(g, [weight, batch]) is None
    assert set(g.live) == {"h", "lb", "loss"}  # the transpose is not kept
    assert g.views == [("t", 0, ((4, 8), (1, 4)), 0)]
    assert g.pool_ptrs == {t.untyped_storage().data_ptr() for t in (hidden, logits_base, loss)}
    outputs = (loss, hidden, logits_base[:2], logits_base[2:])
    owners, small = tg._owners(g, outputs, pool_outputs=frozenset({1}))
    assert small == {0}  # the loss: copied; the saved hidden state is handed out however small
    assert sorted(owners.values()) == [1]  # two outputs share the logits' storage: no one owner
    g2 = tg._TrainingGraph()
    g2.live = {"pair": [hidden, hidden]}
    assert "list" in tg._describe_live(g2, [weight])


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


def test_a_forward_with_a_large_output_of_its_own_makes_it_after_the_replay(monkeypatch):
    """A forward whose own output (a language model's logits, not saved for the backward) is large
    is cut before the steps that make it: the graph replays the rest, leaves the values those steps
    read, and the output is fresh memory of each call (never the pool's, held between steps). A
    small output, or one the backward saves, keeps the whole plan in the graph."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from bench.reduction_shapes import training_specs
    from fxcc.client import training_graphs
    from fxcc.client.cuda_graphs import launches
    from fxcc.compiler_core.artifact import ExternStep, KernelStep
    from fxcc.compiler_core.graph import rebuild_graph

    torch.manual_seed(0)
    blocks = [m for _ in range(4) for m in (torch.nn.Linear(32, 32), torch.nn.LayerNorm(32), torch.nn.GELU())]
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), *blocks, torch.nn.Linear(32, 4096, bias=False))
    fw, _ = training_specs(model.train(), torch.randn(64, 16))
    options = CompileOptions(target=Target(kind="cuda", arch=90))
    manifest = compile_request(CompileRequest(graph=fw, options=options)).manifest
    plan = manifest.plan

    class Runner:  # what TrainingGraphedPlan needs of client/runtime.py's PlanRunner to cut
        def run_steps(self, env, start, stop=None):
            raise AssertionError("nothing runs here")

    gm = rebuild_graph(fw)
    vals = [n.meta["val"] for n in gm.graph.output_node().args[0]]

    def outputs():  # the forward's outputs as a call on the GPU returns them (fake CUDA tensors)
        with FakeTensorMode(allow_non_fake_inputs=True):
            return tuple(torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda") for v in vals)

    saved = frozenset(range(1, len(fw.outputs)))  # the forward's output first, then what it saves
    logits = outputs()[0]
    assert tuple(logits.shape) == (64, 4096) and logits.untyped_storage().nbytes() == 1 << 20

    monkeypatch.setattr(training_graphs, "TAIL_OUTPUT", 1 << 20)
    runner = training_graphs.TrainingGraphedPlan(Runner(), manifest, pool_outputs=saved)
    runner._choose_cut(outputs())
    assert runner.cut is not None and 0 < runner.cut < len(plan.steps)
    tail = plan.steps[runner.cut:]
    assert launches(plan) - launches(plan, runner.cut) == 1  # the last matmul alone, step by step
    assert [s.op for s in tail if isinstance(s, ExternStep)] == ["aten.mm.default"]
    assert not any(isinstance(s, KernelStep) for s in tail)
    mm = next(s for s in tail if isinstance(s, ExternStep))
    read = {a.name for a in mm.args if hasattr(a, "name")}
    assert read & set(runner.live_names)  # the GELU's output, which the graph leaves for the tail
    assert plan.outputs[0].name not in runner.live_names  # the logits are no pool memory

    for pool_outputs, tail_bytes in ((saved, 2 << 20), (frozenset(range(len(fw.outputs))), 1 << 20)):
        monkeypatch.setattr(training_graphs, "TAIL_OUTPUT", tail_bytes)
        whole = training_graphs.TrainingGraphedPlan(Runner(), manifest, pool_outputs=pool_outputs)
        whole._choose_cut(outputs())
        assert whole.cut is None and whole.live_names == []

"""On a GPU: training plans replay CUDA graphs (client/training_graphs.py). A training loop's losses,
parameters and batch-norm statistics equal the step-by-step run's; a caller that keeps an output
of one step gets a step-by-step call rather than that output overwritten; a data batch that moves
every step is copied in. Skipped without CUDA."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from torch import nn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
    pytest.mark.usefixtures("no_tf32", "fresh_compiles"),
]


def fxcc_backend(gm, example_inputs, **kwargs):
    from fxcc.client.backend import fxcc_backend as backend

    return backend(gm, example_inputs, **kwargs)


def _convnet(classes: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes),
    ).cuda().train()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.LayerNorm(512), nn.GELU(),
                         nn.Linear(512, 4096)).cuda().train()


def _train(model: nn.Module, batches, steps: int, compiled: bool, keep: bool = False,
           set_to_none: bool = True, micro: int = 1):
    """Losses (and, with keep, each step's model output as returned) of `steps` SGD steps, each over
    `micro` micro-batches whose gradients accumulate in `.grad`."""
    fn = torch.compile(model, backend=fxcc_backend) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
    losses, kept = [], []
    for i in range(steps):
        x, y = batches(i)
        opt.zero_grad(set_to_none=set_to_none)
        for _ in range(micro):
            out = fn(x)
            loss = nn.functional.cross_entropy(out, y) / micro
            loss.backward()
            if keep:
                kept.append(out.detach())
            del out  # not held while the next forward runs
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses).cpu(), kept


def _runs():
    from fxcc.client.cuda_graphs import stats

    return stats.captures, stats.replays, stats.step_by_step


def test_a_conv_net_training_loop_replays_graphs_and_matches_step_by_step(monkeypatch):
    """Graphs on and off run the same kernels: with cuDNN's deterministic algorithms both loops
    give the same losses, weights and running statistics."""
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=False):
        _conv_net_loops(monkeypatch)


def _conv_net_loops(monkeypatch) -> None:
    from fxcc.client import backend

    x = torch.randn(8, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (8,), device="cuda")
    base = _convnet(10)

    monkeypatch.setenv("FXCC_CUDA_GRAPHS_TRAINING", "0")
    plain = copy.deepcopy(base)
    captures = _runs()[0]
    want, _ = _train(plain, lambda i: (x, y), 10, compiled=True)
    assert _runs()[0] == captures  # off: nothing captured

    monkeypatch.setenv("FXCC_CUDA_GRAPHS_TRAINING", "1")
    torch._dynamo.reset()
    backend.reset()
    graphed = copy.deepcopy(base)
    captures, replays, _ = _runs()
    got, _ = _train(graphed, lambda i: (x, y), 10, compiled=True)
    captures, replays = _runs()[0] - captures, _runs()[1] - replays
    assert captures >= 2, captures  # the forward and the backward
    assert replays >= 8, replays
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(graphed.state_dict().values(), plain.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # weights and running statistics


def test_replays_hand_out_gradients_and_saved_tensors_without_copies():
    """A backward's gradients and a forward's saved tensors, small ones too (biases' and a layer
    norm's gradients, its saved mean and rstd), come out of the pool as they are: no copy a step."""
    from fxcc.client.cuda_graphs import stats

    x = torch.randn(128, 256, device="cuda")  # logits of 2 MiB: aliased as ever (1 MiB and less are copied)
    y = torch.randint(0, 4096, (128,), device="cuda")
    base = _mlp()
    want, _ = _train(copy.deepcopy(base), lambda i: (x, y), 8, compiled=False)
    replays, copied = stats.replays, stats.copied_out
    got, _ = _train(copy.deepcopy(base), lambda i: (x, y), 8, compiled=True)
    # 16 calls (a forward and a backward a step): the first of each runs step by step, the next
    # ones are watched until two pairs show what moves, then each replays
    assert stats.replays - replays >= 10, stats
    assert stats.copied_out == copied, stats  # the loss is computed outside the compiled model
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("how", ["set_to_none_false", "micro_batches"])
def test_gradients_kept_across_calls_are_copied_out_and_the_plan_replays(how):
    """A caller that keeps the backward's gradients past its next call (AccumulateGrad stole them
    into `.grad`, where zero_grad(set_to_none=False) or micro-batches keep them) makes the plan
    capture once more with those gradients copied out, and it replays from then on; `.grad` is
    never overwritten by a later replay (the losses and weights equal eager's)."""
    from fxcc.client.cuda_graphs import stats

    x = torch.randn(128, 256, device="cuda")
    y = torch.randint(0, 4096, (128,), device="cuda")
    base = _mlp()
    kwargs = {"set_to_none": False} if how == "set_to_none_false" else {"micro": 3}
    want, _ = _train(copy.deepcopy(base), lambda i: (x, y), 8, compiled=False, **kwargs)
    replays, disabled = _runs()[1], len(stats.disabled)
    got, _ = _train(copy.deepcopy(base), lambda i: (x, y), 8, compiled=True, **kwargs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    calls = 2 * 8 * kwargs.get("micro", 1)
    assert _runs()[1] - replays >= calls - 8, (stats, calls)  # all but the first few calls replay
    assert len(stats.disabled) == disabled, stats.disabled


def test_an_output_kept_past_its_step_is_never_overwritten():
    """Each step's (large, pool-aliased) logits are kept: the next forward must not replay over
    them; each kept tensor still equals what eager computed at its step."""
    x = torch.randn(512, 256, device="cuda")
    y = torch.randint(0, 4096, (512,), device="cuda")
    base = _mlp()
    eager = copy.deepcopy(base)
    want, want_kept = _train(eager, lambda i: (x, y), 5, compiled=False, keep=True)
    _, _, step_by_step = _runs()
    got, got_kept = _train(copy.deepcopy(base), lambda i: (x, y), 5, compiled=True, keep=True)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(got_kept, want_kept):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert _runs()[2] > step_by_step


def test_a_batch_that_moves_every_step_is_copied_in():
    from fxcc.client.cuda_graphs import stats

    data = [(torch.randn(8, 3, 32, 32, device="cuda"), torch.randint(0, 10, (8,), device="cuda")) for _ in range(8)]
    base = _convnet(10)
    want, _ = _train(copy.deepcopy(base), lambda i: (data[i][0].clone(), data[i][1]), 8, compiled=False)
    captures, replays, _ = _runs()
    copied, first = stats.copied_in, stats.step_by_step_why.get("first call", 0)
    got, _ = _train(copy.deepcopy(base), lambda i: (data[i][0].clone(), data[i][1]), 8, compiled=True)
    assert _runs()[0] > captures and _runs()[1] > replays
    assert stats.copied_in > copied and stats.step_by_step_why["first call"] > first  # the counters bench reads
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_batch_that_takes_turns_at_two_addresses_is_copied_in():
    """A batch that moves every other step (A A B B C C ...): consecutive calls show it moving and
    not moving by turns, so no two pairs agree; the capture copies in what either pair moved."""
    from fxcc.client.cuda_graphs import stats

    data = [(torch.randn(8, 3, 32, 32, device="cuda"), torch.randint(0, 10, (8,), device="cuda")) for _ in range(6)]
    base = _convnet(10)
    want, _ = _train(copy.deepcopy(base), lambda i: data[i // 2], 12, compiled=False)
    captures, replays, _ = _runs()
    disabled = len(stats.disabled)
    got, _ = _train(copy.deepcopy(base), lambda i: data[i // 2], 12, compiled=True)
    assert stats.disabled[disabled:] == []
    assert _runs()[0] > captures and _runs()[1] - replays >= 8, (_runs(), captures, replays)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_dropout_draws_new_numbers_at_every_replay():
    """Random ops replay with the generator's offset moved on: each step's mask is new."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Dropout(0.5), nn.Linear(1024, 256),
                          nn.Dropout(0.5), nn.Linear(256, 256)).cuda().train()
    fn = torch.compile(model, backend=fxcc_backend)
    x = torch.randn(256, 256, device="cuda")
    captures, replays, _ = _runs()
    outs = []
    for _ in range(8):
        out = fn(x)
        out.sum().backward()  # weights unchanged (no step): only the masks differ
        outs.append(out.detach().clone())
    assert _runs()[0] > captures and _runs()[1] > replays
    for a, b in itertools.pairwise(outs):
        assert not torch.equal(a, b)


def test_training_graphs_and_eval_graphs_of_one_process_keep_each_others_results():
    """Training steps that replay graphs, then an eval pass under no_grad whose plan is graphable
    (static sizes, enough launches: its capture, on the second call, drops cuBLAS's workspaces
    before and after), its outputs (4 MiB each) kept, then more training steps: the kept
    eval outputs and the losses equal eager's. A training graph's matmul scratch is its own pool's
    memory (client/training_graphs.py, "Library workspaces"), never a workspace that the eval
    pass's drop handed back to the allocator, where those outputs may now live."""
    from fxcc.client.cuda_graphs import stats

    x = torch.randn(512, 256, device="cuda")
    y = torch.randint(0, 4096, (512,), device="cuda")
    xe = torch.randn(256, 256, device="cuda")
    torch.manual_seed(0)
    base = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(256, 256), nn.GELU())], nn.LayerNorm(256),
                         nn.Linear(256, 4096)).cuda().train()

    def loop(model: nn.Module, compiled: bool):
        step_fn = torch.compile(model, backend=fxcc_backend, dynamic=False) if compiled else model
        eval_fn = torch.compile(lambda t: model(t), backend=fxcc_backend, dynamic=False) if compiled else model
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
        losses, evals, drops = [], [], []
        for step in range(12):
            if step in (5, 8):
                with torch.no_grad():
                    model.eval()
                    before = stats.workspace_drops
                    evals += [eval_fn(xe) for _ in range(2)]
                    drops.append(stats.workspace_drops - before)
                    model.train()
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(step_fn(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return torch.stack(losses).cpu(), [e.clone() for e in evals], evals, drops

    want, want_evals, _, _ = loop(copy.deepcopy(base), compiled=False)
    captures, replays, _ = _runs()
    got, _, kept, drops = loop(copy.deepcopy(base), compiled=True)
    assert _runs()[0] - captures >= 2 and _runs()[1] - replays >= 8, (_runs(), captures, replays)
    assert drops[0] >= 2, (drops, stats.disabled)  # the eval plan's capture dropped them (before and after)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(kept, want_evals):  # held across later training replays
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_a_large_output_of_the_forward_is_made_after_the_replay_and_kept_outputs_stay_intact(monkeypatch):
    """A forward whose own output is large (logits over a wide vocabulary: 32 MB here) replays its
    graph up to the last matmul, which runs after it, step by step: the logits are fresh memory of
    each call, not the pool's, so a caller that keeps each step's logits neither waits for them nor
    finds them overwritten, and every call but the first few replays."""
    from fxcc.client.cuda_graphs import stats

    monkeypatch.setenv("FXCC_CUDA_GRAPHS_TRAINING_TAIL", "1")  # off by default until this has run
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.LayerNorm(512), nn.GELU(),
                         nn.Linear(512, 512), nn.LayerNorm(512), nn.GELU(), nn.Linear(512, 16384)).cuda().train()
    x = torch.randn(512, 256, device="cuda")
    y = torch.randint(0, 16384, (512,), device="cuda")
    want, want_kept = _train(copy.deepcopy(base), lambda i: (x, y), 6, compiled=False, keep=True)
    captures, replays, _ = _runs()
    cut, held = stats.cut_plans, stats.step_by_step_why.get("an output of its last replay is still held "
                                                            "(its memory would be overwritten)", 0)
    got, got_kept = _train(copy.deepcopy(base), lambda i: (x, y), 6, compiled=True, keep=True)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(got_kept, want_kept):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert len({t.data_ptr() for t in got_kept}) == 6  # each step's logits its own memory
    assert stats.cut_plans == cut + 1  # the forward (the backward's outputs all stay in its pool)
    assert _runs()[0] > captures and _runs()[1] - replays >= 5, stats  # forward: calls 3-6; backward: some
    assert stats.step_by_step_why.get("an output of its last replay is still held "
                                      "(its memory would be overwritten)", 0) == held

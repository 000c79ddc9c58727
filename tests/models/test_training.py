"""Training through fxcc matches eager: MLP, GPT-2 block and ResNet bottleneck, SGD and AdamW.

The same loop as bench/training_table.py (which runs 20 steps and writes docs/training.md); CI runs
fewer steps to stay cheap on a CPU with Triton's interpreter.
"""

import pytest
import torch

from bench.training_table import GRAD_TOL, LOSS_TOL, MODELS, OPTIMIZERS, PARAM_TOL, train_both

CI_STEPS = 5


@pytest.fixture(autouse=True)
def _isolated(fresh_compiles, monkeypatch):
    monkeypatch.setenv("FXCC_FALLBACK", "error")  # a graph that falls back is a failure here
    yield


def assert_runs_match(where: str, eager, fx, param_tol: dict) -> None:
    """Losses and gradients at every step, and the final parameters and buffers, within tolerance."""
    torch.testing.assert_close(torch.tensor(fx.losses), torch.tensor(eager.losses), **LOSS_TOL,
                               msg=lambda m: f"{where} losses: {m}")
    for step, (g, h) in enumerate(zip(fx.grads, eager.grads), start=1):
        for name in h:
            torch.testing.assert_close(g[name], h[name], **GRAD_TOL,
                                       msg=lambda m, n=name, s=step: f"{where} step {s} grad {n}: {m}")
    for name in eager.state:
        torch.testing.assert_close(fx.state[name], eager.state[name], **param_tol,
                                   msg=lambda m, n=name: f"{where} final {n}: {m}")


@pytest.mark.parametrize("model", MODELS)
def test_training_matches_eager(model):
    for i, opt in enumerate(OPTIMIZERS):
        eager, fx = train_both(model, opt, CI_STEPS)
        assert len(fx.losses) == CI_STEPS
        assert_runs_match(f"{model}/{opt}", eager, fx, PARAM_TOL[opt])
        # One forward and one backward graph, compiled once: no recompiles over the steps. The
        # second optimizer trains the same graphs, which come from the local cache.
        assert (fx.fw_graphs, fx.bw_graphs) == (1, 1), opt
        expected = "compiled-in-process" if i == 0 else "local-hit"
        assert fx.sources == [expected, expected], opt

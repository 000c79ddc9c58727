"""Batch norm lowerings vs eager: inference with running statistics, functional training with updates."""

from __future__ import annotations

import pytest
import torch

from tests.compiler_core.helpers import check, compile_fn, run

aten = torch.ops.aten
torch.manual_seed(0)
X = torch.randn(4, 3, 5, 6)
W, B = torch.randn(3), torch.randn(3)
RM, RV = torch.randn(3), torch.rand(3) + 0.5


def test_batch_norm_inference() -> None:
    art = check(lambda x, w, b, rm, rv: aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5)[0]
                .relu(), X, W, B, RM, RV, decompose=False)
    assert art.manifest.stats.kernels == 1
    check(lambda x, rm, rv: aten._native_batch_norm_legit_no_training(x, None, None, rm, rv, 0.1, 1e-5)[0],
          X, RM, RV, decompose=False)


def test_batch_norm_inference_all_outputs():
    def f(x, w, b, rm, rv):
        return aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5)
    art = compile_fn(f, X, W, B, RM, RV, decompose=False)
    for g, e in zip(run(art, X, W, B, RM, RV), f(X, W, B, RM, RV)):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batch_norm_training_functional(dtype: torch.dtype) -> None:
    x, w, b, rm, rv = (t.to(dtype) for t in (X, W, B, RM, RV))

    def f(x, w, b, rm, rv):
        return aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)
    art = compile_fn(f, x, w, b, rm, rv, decompose=False)
    assert art.manifest.stats.nodes_extern == 0
    for g, e in zip(run(art, x, w, b, rm, rv), f(x, w, b, rm, rv)):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_batch_norm_training_normalizes_in_the_statistics_kernel():
    def f(x, w, b, rm, rv):
        return aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)[0]
    art = check(f, X, W, B, RM, RV, decompose=False)
    assert art.manifest.stats.kernels == 1

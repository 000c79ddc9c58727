"""On a GPU: a language model's training step whose backward goes through the vocabulary-sized passes
(an embedding's accumulating index_put as index_add, the head's backward matmuls reading the logits'
gradient with aligned rows, the cross-entropy's one-hot scatter fused) matches eager's losses and
gradients. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

VOCAB = 1001  # rows of 1001 floats: no leading dimension of the head's matmuls is 16-byte aligned


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 64, padding_idx=0)
        self.mix = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, VOCAB)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.mix(self.embed(ids)))
        logits = self.head(h).view(-1, VOCAB)
        return torch.nn.functional.cross_entropy(logits, labels.view(-1))


@pytest.mark.usefixtures("no_tf32", "fresh_compiles")
def test_a_language_models_backward_through_the_vocabulary_passes_matches_eager(monkeypatch):
    from fxcc.client import backend
    from fxcc.client.backend import fxcc_backend
    from fxcc.compiler_core.passes import pad_mm

    monkeypatch.setenv("FXCC_FALLBACK", "error")
    monkeypatch.setattr(pad_mm, "MIN_FLOPS", 1)  # this small head is re-strided as a big one is
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (8, 64), device="cuda")
    ids[0, :4] = 0  # the padding index gets no gradient
    ids[1, :8] = 7  # repeated rows accumulate
    labels = torch.randint(0, VOCAB, (8, 64), device="cuda")
    runs = []
    for compiled in (False, True):
        torch.manual_seed(1)
        model = TinyLM().cuda()
        step = torch.compile(model, backend=fxcc_backend) if compiled else model
        losses = []
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            loss = step(ids, labels)
            loss.backward()
            losses.append(loss.detach())
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
        runs.append((torch.stack(losses), {n: p.grad for n, p in model.named_parameters()}))
    (want_losses, want_grads), (got_losses, got_grads) = runs
    torch.testing.assert_close(got_losses, want_losses, rtol=1e-5, atol=1e-5)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    extern = {op for e in backend.events() if e.stats for op in e.stats.extern_ops}
    assert "aten.index_add.default" in extern and "aten.index_put.default" not in extern, extern
    assert "aten.scatter.value" not in extern and not any("aligned_rows" in op for op in extern), extern

"""On a GPU: flex_attention's forward and backward through torch.compile(backend="fxcc") run fxcc's
templates from cubins (no extern step) and match eager within bf16's tolerance, for causal and
sliding-window BlockMasks, a captured alibi tensor, head dims 64 and 128, GQA, and lengths that are
no multiple of the tiles.

Skipped where torch sees no CUDA device. bf16: fxcc's and eager's results are each held to their
distance from an fp32 run of eager.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from fxcc.client import backend
from tests.client.flex_cases import assert_as_close_as_eager

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
    pytest.mark.usefixtures("fresh_compiles"),
]


@pytest.fixture(autouse=True)
def _errors_show(monkeypatch):
    monkeypatch.setenv("FXCC_FALLBACK", "error")


def causal(b, h, q, kv):
    return q >= kv


def sliding(b, h, q, kv):
    return (q >= kv) & (q - kv <= 100)


@pytest.mark.parametrize(("b", "h", "hkv", "s", "d", "mask_fn", "alibi"), [
    (2, 8, 8, 512, 64, causal, False),
    (1, 8, 8, 1000, 128, sliding, True),
    (2, 8, 2, 384, 64, causal, True),
])
def test_flex_attention_forward_and_backward_match_eager(b, h, hkv, s, d, mask_fn, alibi):
    slopes = torch.rand(h, device="cuda") + 0.1

    def score_mod(score, bi, hi, m, n):
        return score + slopes[hi] * (n - m)

    mask = create_block_mask(mask_fn, b, h, s, s, device="cuda")

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod if alibi else None, block_mask=mask,
                              enable_gqa=hkv != h) * 2

    g = torch.Generator(device="cuda").manual_seed(0)
    base = [torch.randn(b, n, s, d, device="cuda", generator=g) for n in (h, hkv, hkv)]
    dout = torch.randn(b, h, s, d, device="cuda", generator=g)

    assert_as_close_as_eager(fn, torch.compile(fn, backend="fxcc"), base, dout, torch.bfloat16, torch.float32,
                             factor=2, floor=1e-2)
    events = [e for e in backend.events() if e.source != "fallback"]
    assert len(events) == 2 and all(e.stats.extern_ops == [] for e in events)

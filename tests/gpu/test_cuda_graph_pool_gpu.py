"""On a GPU: every CUDA graph of the process captures into one memory pool per device
(client/cuda_graphs.py, "One pool"): a second model's capture takes the memory the first one's
temporaries left, and replays of graphs sharing the pool, interleaved in any order, hand each
caller its own results. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
    pytest.mark.usefixtures("no_tf32", "fresh_compiles"),
]

MB = 1 << 20


def fxcc_backend(gm, example_inputs, **kwargs):
    from fxcc.client.backend import fxcc_backend as backend

    return backend(gm, example_inputs, **kwargs)


def _mlp(seed: int) -> nn.Module:
    """Activations of 16 MB (4096 x 1024 floats) around a small output: graphed whole, not cut."""
    torch.manual_seed(seed)
    layers = [m for _ in range(6) for m in (nn.Linear(1024, 1024), nn.GELU())]
    return nn.Sequential(*layers, nn.Linear(1024, 8)).cuda().eval()


def _pool_segments() -> list[str]:
    """The shared pool's segments, each as its size and its blocks (MB, allocated or free): what an
    assertion on the pool's growth prints, so that a failure on the card says where memory went."""
    from fxcc.client.cuda_graphs import shared_pool

    try:
        pool = tuple(shared_pool(torch.device("cuda")).handle())
        out = []
        for seg in torch.cuda.memory_snapshot():
            if tuple(seg.get("segment_pool_id", ())) != pool:
                continue
            blocks = ", ".join(f"{b['size'] / MB:.2f}{'a' if b['state'] == 'active_allocated' else 'f'}"
                               for b in seg.get("blocks", []))
            out.append(f"{seg['total_size'] / MB:.2f} MB stream {seg.get('stream')}: [{blocks}]")
        return out
    except Exception as e:  # noqa: BLE001 - a diagnostic only: never the test's failure
        return [f"no snapshot ({type(e).__name__}: {e})"]


def _pool_growth(compiled, x) -> int:
    from fxcc.client.cuda_graphs import stats

    before, captures = stats.pool_bytes, stats.captures
    compiled(x)  # step by step
    compiled(x)  # captured into the shared pool, replayed
    assert stats.captures == captures + 1
    return stats.pool_bytes - before


def test_a_second_models_graph_takes_the_memory_of_the_firsts_temporaries():
    from fxcc.client.cuda_graphs import stats

    a, b = _mlp(0), _mlp(1)
    fa, fb = torch.compile(a, backend=fxcc_backend), torch.compile(b, backend=fxcc_backend)
    xa = torch.randn(4096, 1024, device="cuda")
    xb = torch.randn(4096, 1024, device="cuda")
    with torch.no_grad():
        grown_a = _pool_growth(fa, xa)
        after_a = _pool_segments()
        grown_b = _pool_growth(fb, xb)
        seen = (grown_a, grown_b, after_a, _pool_segments())
        assert grown_a >= 16 * MB, seen  # at least one activation lives in the pool
        assert grown_b <= grown_a // 4, seen  # b's temporaries fit in what a freed

        # interleaved replays: each overwrites the other's temporaries, never a caller's output
        replays = stats.replays
        ya = fa(xa)
        yb = fb(xb)
        xa.copy_(torch.randn_like(xa))
        ya2 = fa(xa)
        yb2 = fb(xb)
        torch.cuda.synchronize()
        assert stats.replays == replays + 4
        ref_a, ref_b = a(xa), b(xb)
    torch.testing.assert_close(ya2, ref_a, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(yb, ref_b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(yb2, ref_b, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(ya, ya2)  # the first call's output stayed the first input's


class Broken(nn.Module):
    """Two graphs (a graph break between two MLPs), each graphed, one pool."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = _mlp(2)[:-1], _mlp(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        torch._dynamo.graph_break()
        return self.second(h)


def test_the_graphs_of_a_model_with_a_graph_break_share_the_pool_and_match_eager():
    from fxcc.client.backend import events
    from fxcc.client.cuda_graphs import stats

    model = Broken().cuda().eval()
    compiled = torch.compile(model, backend=fxcc_backend)
    x = torch.randn(4096, 1024, device="cuda")
    captures = stats.captures
    with torch.no_grad():
        outs, refs = [], []
        for _ in range(4):
            x.copy_(torch.randn_like(x))
            outs.append(compiled(x))
            refs.append(model(x))
        torch.cuda.synchronize()
    assert len(events()) == 2
    # the first graph's output is an activation: that plan is cut or stays step by step; the
    # second graph (a small output) is captured
    assert stats.captures >= captures + 1
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)

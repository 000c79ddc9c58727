"""A value read by several consumers is written once when recomputing it would re-read many buffers.

The residual stream of a transformer (x + attn + mlp + ..., read by each layer's LayerNorm and by
the next add) must not stay lazy through the network: each LayerNorm kernel would re-read every
earlier layer's output (and keep all of them alive to the end).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from compiler_core.lowering import REALIZE_READS_SHARED
from tests.compiler_core.helpers import alloc_steps, check, kernel_steps


def _residual_net(x: torch.Tensor, *ws: torch.Tensor) -> tuple[torch.Tensor, ...]:
    r, outs = x, []
    for w in ws:
        r = r + torch.mm(F.layer_norm(r, (r.shape[-1],)), w)  # mm: an extern result per layer
        outs.append(r.sum(-1))
    return (F.layer_norm(r, (r.shape[-1],)), *outs)


def test_a_residual_stream_is_realized_not_recomputed_in_every_layer():
    torch.manual_seed(0)
    x, ws = torch.randn(8, 16), [torch.randn(16, 16) * 0.1 for _ in range(8)]
    art = check(_residual_net, x, *ws, atol=1e-4, rtol=1e-4)
    # Loads of whole rows (the residual's terms); the per-row sums copied out are not counted.
    loads = [sum("tl.load(" in line and "rindex" in line for line in art.blobs[k.source.digest].decode().splitlines())
             for k in art.manifest.kernels]
    # The stream is written once its recomputation would read more than REALIZE_READS_SHARED
    # buffers; kept lazy, the last LayerNorm would re-read x and all 8 mm results.
    assert loads and max(loads) <= REALIZE_READS_SHARED + 1, loads


def test_a_reduction_returned_by_the_graph_is_written_by_its_own_kernel():
    # Each layer's per-row sum is a graph output: the kernel that reduces it stores it into the
    # output buffer. No later kernel loads the sums to store them again.
    torch.manual_seed(0)
    x, ws = torch.randn(8, 16), [torch.randn(16, 16) * 0.1 for _ in range(8)]
    art = check(_residual_net, x, *ws, atol=1e-4, rtol=1e-4)
    sums = [o.name for o in art.manifest.plan.outputs[1:]]
    per_row = [a.out for a in alloc_steps(art) if a.spec.sizes == [8]]
    assert sorted(per_row) == sorted(sums), (per_row, sums)
    writers = [[k for k in kernel_steps(art) if name in _buffers_of(k)] for name in sums]
    assert all(len(w) == 1 for w in writers), writers  # written, never read back
    assert len({id(w[0]) for w in writers}) == len(sums)  # each by its own layer's kernel


def _buffers_of(step) -> set[str]:
    """The buffers a kernel step takes (read or written)."""
    return {a.name for a in step.args if a.kind == "node"}


"""A value read by several consumers is written once when recomputing it would re-read many buffers.

The residual stream of a transformer (x + attn + mlp + ..., read by each layer's LayerNorm and by
the next add) must not stay lazy through the network: each LayerNorm kernel would re-read every
earlier layer's output (and keep all of them alive to the end).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fxcc.compiler_core.lowering import REALIZE_READS_SHARED
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileRequest
from tests.compiler_core.helpers import alloc_steps, check, kernel_steps, run


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


def _norm_linear_residual(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = F.layer_norm(x, (x.shape[-1],))
    h = torch.mm(y.view(-1, y.shape[-1]), w).view(y.shape)  # the extern reads y through a view
    return F.layer_norm(y + h, (x.shape[-1],))


def test_a_value_written_for_an_extern_through_a_view_is_loaded_by_later_kernels():
    # y is written once for the mm (through its view); the residual add must load it, not
    # recompute the first LayerNorm from x in the last kernel.
    torch.manual_seed(0)
    x, w = torch.randn(2, 8, 16), torch.randn(16, 16) * 0.1
    art = check(_norm_linear_residual, x, w, atol=1e-5, rtol=1e-5)
    last = kernel_steps(art)[-1]
    assert art.manifest.plan.inputs[0] not in _buffers_of(last)
    assert len(kernel_steps(art)) == 2


def test_the_transformer_blocks_last_kernel_loads_the_first_layer_norm():
    from tests.compiler_core.test_scheduler import _transformer_block_graph

    spec, inputs, want = _transformer_block_graph()
    art = compile_request(CompileRequest(graph=spec))
    (got,) = run(art, *inputs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Its inputs: x, then the parameters; the last kernel (second LayerNorm over x1 + mlp(x1))
    # reads x1 = norm1(x + attn) as written for the first Linear, not x and the attention output.
    last = kernel_steps(art)[-1]
    x_name = art.manifest.plan.inputs[0]
    assert x_name not in _buffers_of(last)
    reads = [s for s in kernel_steps(art) if x_name in _buffers_of(s)]
    assert len(reads) == 2, reads  # the attention's input copy and the first LayerNorm


def _broadcast_bias_bmm(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    bias = torch.where(mask, 0.0, -1.0)  # [1, S, S]: an attention mask's additive bias
    return torch.bmm(bias.expand(x.shape[0], -1, -1), x)  # an extern reads it broadcast over the batch


def test_an_extern_reads_an_expanded_value_as_a_broadcast_view_of_its_base():
    # The base is written once ([1, S, S]) and the extern gets eager's view of it (batch stride
    # 0), not a [B, S, S] buffer holding B copies (transformers' GPT-2 wrote its mask bias once
    # per head: a 50-MB kernel on the H200).
    torch.manual_seed(0)
    b, s = 6, 16
    x, mask = torch.randn(b, s, 8), torch.rand(1, s, s) > 0.5
    art = check(_broadcast_bias_bmm, x, mask)
    written = [a.spec.sizes for a in alloc_steps(art) if a.spec.dtype == "float32" and a.spec.sizes != [b, s, 8]]
    assert written == [[1, s, s]], written
    views = [st for st in art.manifest.plan.steps if st.kind == "extern" and st.op == "aten.as_strided.default"]
    assert [[a.value for a in v.args[2].items] for v in views] == [[0, s, 1]], views


def _sliced_then_expanded(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    bias = torch.where(mask, 0.0, -1.0)[:, :16]  # [1, 16, 16] of a [1, 32, 16] value
    return torch.bmm(bias.expand(x.shape[0], -1, -1), x)


def _expanded_then_flattened(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    bias = torch.where(mask, 0.0, -1.0).expand(x.shape[0], -1, -1)  # [B, S, S]
    return torch.mm(bias.reshape(-1, bias.shape[-1]), x[0])  # no strided view of [B * S, S]


def test_views_around_an_expand_read_by_an_extern_match_eager():
    torch.manual_seed(0)
    x = torch.randn(6, 16, 8)
    art = check(_sliced_then_expanded, x, torch.rand(1, 32, 16) > 0.5)
    assert [a.spec.sizes for a in alloc_steps(art) if a.spec.sizes != [6, 16, 8]] == [[1, 32, 16]]
    check(_expanded_then_flattened, x, torch.rand(1, 16, 16) > 0.5)

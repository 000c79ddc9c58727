"""The attention pass: bmm → scale → softmax → bmm becomes one SDPA extern call, only where that is exact."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from fxcc.client.capture import capture_graph
from fxcc.client.examples import TransformerBlock
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.compile import shape_env_guards
from fxcc.compiler_core.graph import rebuild_graph, wire_graph
from fxcc.compiler_core.passes.attention import CPU_OP, CUDA_OP, MAX_HEADS, find_attention, fuse_attention
from fxcc.compiler_core.wire import GraphSpec
from tests.compiler_core.helpers import check, compile_fn, run, run_pass
from tests.compiler_core.test_compile import compiled_one_graph, fxcc_backend

SDPA_OPS = {CPU_OP, CUDA_OP}


def qkv(*shape: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for _ in range(3))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-2, -1) * 0.25, -1) @ v


def scores_shaped(art: Artifact, shape: tuple[int, ...]) -> list[Any]:
    """Plan steps that allocate a tensor of the scores' shape (in any split of the batch dims)."""
    n, rows, cols = shape
    return [s for s in art.manifest.plan.steps if s.kind == "alloc" and s.spec.sizes[-2:] == [rows, cols]
            and math.prod(s.spec.sizes[:-2]) == n]


def fired(art: Artifact) -> bool:
    ops = set(art.manifest.stats.extern_ops)
    return bool(ops & SDPA_OPS)


def test_fires_on_the_transformer_block_and_matches_eager() -> None:
    torch.manual_seed(0)
    # the seed block: head dim 16, here seq 32 (scores 8 × 32 × 32)
    art = compiled_one_graph(TransformerBlock(64, 4).eval(), torch.randn(2, 32, 64))
    stats = art.manifest.stats
    assert CPU_OP in stats.extern_ops and "aten.bmm.default" not in stats.extern_ops
    assert not scores_shaped(art, (2 * 4, 32, 32))
    assert stats.kernels <= 7


@pytest.mark.parametrize("variant", ["div_sqrt", "mul", "unscaled", "scaled_q", "3d"])
def test_fires_on_plain_attention_and_matches_eager(variant: str) -> None:
    fns = {
        "div_sqrt": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v,
        "mul": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) * 0.3, dim=-1) @ v,
        "unscaled": lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v,
        "scaled_q": lambda q, k, v: torch.softmax((q * 0.7) @ k.transpose(-2, -1) * 0.5, dim=-1) @ v,
        "3d": lambda q, k, v: torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.25, -1), v),
    }
    shape = (6, 24, 16) if variant == "3d" else (2, 3, 24, 16)
    art = check(fns[variant], *qkv(*shape), atol=1e-5, rtol=1e-5)
    assert fired(art) and "aten.bmm.default" not in art.manifest.stats.extern_ops
    assert not scores_shaped(art, (6, 24, 24))


def test_self_attention_on_one_tensor_in_float64() -> None:
    x = torch.randn(3, 20, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    art = check(lambda x: attention(x, x, x), x)
    assert fired(art)


def test_other_value_dims_and_key_lengths() -> None:
    """L ≠ S works on both kernels; Ev ≠ E only where the target's kernel takes it (not on CPU)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 10, 8, generator=g), torch.randn(2, 12, 8, generator=g), torch.randn(2, 12, 8, generator=g)
    assert fired(check(attention, q, k, v, atol=1e-5, rtol=1e-5))
    art = check(attention, q, k, torch.randn(2, 12, 4, generator=g))
    assert not fired(art)


@pytest.mark.parametrize("case", ["softmax_returned", "softmax_read_again", "scores_returned", "mask", "causal",
                                  "softmax_not_last_dim"])
def test_leaves_the_graph_alone_where_sdpa_would_differ(case: str) -> None:
    def softmax_returned(q, k, v):
        p = torch.softmax(q @ k.transpose(-2, -1) * 0.25, -1)
        return p @ v, p

    def softmax_read_again(q, k, v):
        p = torch.softmax(q @ k.transpose(-2, -1) * 0.25, -1)
        return (p @ v) + p.amax(-1, keepdim=True)

    def scores_returned(q, k, v):
        s = q @ k.transpose(-2, -1)
        return torch.softmax(s * 0.25, -1) @ v, s

    def mask(q, k, v):
        m = torch.where(k[..., :1].transpose(-2, -1) > 0, 0.0, float("-inf"))  # keys with k[0] > 0
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25 + m, -1) @ v

    def causal(q, k, v):
        s = q @ k.transpose(-2, -1) * 0.25
        keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v

    def softmax_not_last_dim(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25, -2) @ v

    fn = locals()[case]
    inputs = qkv(2, 3, 12, 8)
    assert find_attention(rebuild_graph(_traced_spec(fn, *inputs)), "interpret") == []
    art = check(fn, *inputs, atol=1e-5, rtol=1e-5)
    assert not fired(art)


def test_training_graphs_keep_their_softmax() -> None:
    """AOTAutograd's forward saves the softmax for the backward, so neither graph is rewritten."""
    q, k, v = (t.requires_grad_() for t in qkv(2, 3, 12, 8))
    arts: list[Artifact] = []
    out = torch.compile(attention, backend=fxcc_backend(arts))(q, k, v)
    out.sum().backward()
    assert len(arts) == 2 and not any(fired(a) for a in arts)
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    attention(q, k, v).sum().backward()
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad, atol=1e-5, rtol=1e-5)


def _on_cuda(spec: GraphSpec) -> GraphSpec:
    """The same graph with its inputs on a (fake) CUDA device."""
    placeholders = [p.model_copy(update={"spec": p.spec.model_copy(update={"device": "cuda"})})
                    for p in spec.placeholders]
    return spec.model_copy(update={"placeholders": placeholders})


def _traced_spec(fn: Any, *inputs: torch.Tensor) -> GraphSpec:
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxcc.client.backend import decomposition_table

    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    return capture_graph(gm, list(inputs)).spec


@pytest.mark.parametrize(("head_dim", "dtype", "fires"), [(64, torch.float32, True), (16, torch.float16, True),
                                                          (12, torch.float32, False), (64, torch.float64, False),
                                                          (64, torch.bfloat16, False)])
def test_cuda_target_uses_efficient_attention_where_it_applies(head_dim: int, dtype: torch.dtype, fires: bool) -> None:
    """On a CPU-only worker the CUDA graph is rewritten on FakeTensors; the SDPA's layout comes from its meta."""
    spec = _on_cuda(_traced_spec(attention, *(t.to(dtype) for t in qkv(2, 4, 32, head_dim))))
    gm, new_spec = run_pass(fuse_attention, spec, "cuda")
    targets = {n.target for n in new_spec.nodes}
    assert (CUDA_OP in targets) == fires and (("aten.bmm.default" in targets) != fires)
    (out,) = gm.graph.output_node().args[0]
    assert tuple(out.meta["val"].shape) == (2, 4, 32, head_dim) and out.meta["val"].device.type == "cuda"


def test_no_match_leaves_the_spec_untouched() -> None:
    spec = _traced_spec(lambda x: torch.softmax(x, -1) @ x, torch.randn(4, 4))
    gm = rebuild_graph(spec)
    assert find_attention(gm, "interpret") == []
    assert not fuse_attention(gm, "interpret")


def test_a_shared_transposed_key_is_kept() -> None:
    """A view the scores read that something else reads too stays in the graph."""
    def fn(q, k, v):
        kt = k.transpose(-2, -1)
        return torch.softmax(q @ kt * 0.25, -1) @ v, kt.sum(-1)
    art = check(fn, *qkv(2, 12, 8), atol=1e-5, rtol=1e-5)
    assert fired(art)


def test_half_precision_on_cpu() -> None:
    """fp16 attention on CPU: fires, and stays as close to float64 as eager's fp16 result."""
    q, k, v = (t.half() for t in qkv(2, 16, 8))
    art = compile_fn(attention, q, k, v)
    assert fired(art)
    (got,) = run(art, q, k, v)
    ref = attention(*(t.double() for t in (q, k, v)))
    assert (got.double() - ref).abs().max() <= 2 * (attention(q, k, v).double() - ref).abs().max() + 1e-3



def _symbolic_capture(fn: Any, inputs: tuple[torch.Tensor, ...], dims: dict[int, list[int]] | None) -> Any:
    """The capture of `fn`'s graph with symbolic sizes: `dims` (input → dims) marked dynamic, or
    every size when None."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from fxcc.client.backend import decomposition_table

    caps: list[Any] = []

    def fw(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        caps.append(capture_graph(gm, example))
        return make_boxed_func(gm)

    torch._dynamo.reset()
    for i, ds in (dims or {}).items():
        torch._dynamo.mark_dynamic(inputs[i], ds)
    backend = aot_autograd(fw_compiler=fw, decompositions=decomposition_table())
    try:
        with torch.no_grad():
            torch.compile(fn, dynamic=True if dims is None else None, backend=backend)(*inputs)
    finally:
        torch._dynamo.reset()
    (cap,) = caps
    assert cap.spec.symbols
    return cap


def test_fires_on_a_symbolic_sequence_length() -> None:
    """A graph with a symbolic sequence length is rewritten in place, in its own ShapeEnv: the
    wire form keeps its size symbols, and matching asks nothing of the sizes (no guard, so every
    length runs fused)."""
    q, k, v = qkv(6, 12, 8)
    cap = _symbolic_capture(attention, (q, k, v), {0: [1], 1: [1], 2: [1]})
    gm = rebuild_graph(cap.spec, cap.hints)
    syms = gm.meta["fxcc_syms"]
    assert fuse_attention(gm, "interpret")
    new_spec = wire_graph(gm, cap.spec)
    targets = {n.target for n in new_spec.nodes}
    assert CPU_OP in targets and "aten.bmm.default" not in targets
    assert new_spec.symbols == cap.spec.symbols
    assert gm.meta["fxcc_syms"] is syms and not syms.shape_env.guards
    sdpa = next(n for n in gm.graph.nodes if n.name.endswith("_sdpa"))
    assert sdpa.meta["val"][0].shape[2].node.shape_env is syms.shape_env  # the graph's one ShapeEnv


def test_symbolic_heads_fire_under_the_guard_their_match_needs() -> None:
    """With batch × heads symbolic, the match holds only while it is at most MAX_HEADS: the pass
    fires, and the graph's ShapeEnv keeps that guard for the plan."""
    cap = _symbolic_capture(attention, qkv(2, 3, 12, 8), None)
    gm = rebuild_graph(cap.spec, cap.hints)
    assert fuse_attention(gm, "interpret")
    assert CPU_OP in {n.target for n in wire_graph(gm, cap.spec).nodes}
    guards = shape_env_guards(gm.meta["fxcc_syms"])
    assert any(str(MAX_HEADS) in g for g in guards), guards

"""Attention through fxcc's own kernel: where the attention pass and direct SDPA calls use it, and
where they keep aten's (no TF32, other dtypes and head dims, masks, dropout, training)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.backend import decomposition_table
from fxcc.client.capture import capture_graph
from fxcc.client.runtime import load_plan
from fxcc.compiler_core.artifact import Artifact
from fxcc.compiler_core.build import build_artifact, build_tasks, compile_task, cuda_build_unavailable
from fxcc.compiler_core.codegen.attention import int_args, is_template_kernel, source_facts
from fxcc.compiler_core.errors import InvalidGraph
from fxcc.compiler_core.passes.attention import CPU_OP, CUDA_OP, TEMPLATE_OP
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, GraphSpec, Target, resolve_target

aten = torch.ops.aten


def traced(fn: Any, *inputs: torch.Tensor, mode: str = "real") -> GraphSpec:
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode=mode)(*inputs)
    return capture_graph(gm, list(inputs)).spec


def compiled(spec: GraphSpec, tf32: bool, target: Target | None = None) -> Artifact:
    return compile_request(CompileRequest(graph=spec, options=CompileOptions(allow_tf32=tf32, target=target or Target())))


def templates(art: Artifact) -> list[str]:
    return [k.name for k in art.manifest.kernels if is_template_kernel(k.name)]


def qkv(*shape: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for _ in range(3))


def chain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-2, -1) * 0.25, -1) @ v


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("fn", [chain, causal_sdpa], ids=["bmm_softmax_bmm", "direct_sdpa"])
def test_tf32_allowed_runs_the_template_and_matches_eager(fn: Any) -> None:
    inputs = qkv(2, 3, 37, 16)
    spec = traced(fn, *inputs)
    art = compiled(spec, tf32=True)
    assert len(templates(art)) == 1
    assert not {CPU_OP, CUDA_OP, "aten.bmm.default"} & set(art.manifest.stats.extern_ops)
    (got,) = load_plan(art)(list(inputs))
    want = fn(*inputs)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got.stride() == want.stride()


@pytest.mark.parametrize("fn", [chain, causal_sdpa], ids=["bmm_softmax_bmm", "direct_sdpa"])
def test_without_tf32_the_extern_stays(fn: Any) -> None:
    inputs = qkv(2, 3, 20, 16)
    art = compiled(traced(fn, *inputs), tf32=False)
    assert not templates(art) and CPU_OP in art.manifest.stats.extern_ops


@pytest.mark.parametrize("case", ["float64", "head_dim_8", "head_dim_24", "dropout", "lse_used",
                                  "masked_chain"])
def test_the_template_is_not_used_where_it_does_not_apply(case: str) -> None:
    q, k, v = qkv(2, 2, 16, 8 if case == "head_dim_8" else 24 if case == "head_dim_24" else 16)
    mask = torch.rand(16, 16, generator=torch.Generator().manual_seed(1)) > 0.3
    fns = {
        "float64": causal_sdpa, "head_dim_8": causal_sdpa, "head_dim_24": chain,
        "dropout": lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.5)[0],
        "lse_used": lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[1] + 1,
        # eager's softmax gives NaN where a whole row is masked, the template zeros: left alone
        "masked_chain": lambda q, k, v, m: torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~m, float("-inf")),
                                                         -1) @ v,
    }
    inputs = [q.double(), k.double(), v.double()] if case == "float64" else [q, k, v]
    inputs += [mask] if case == "masked_chain" else []
    # (the CPU kernel refuses dropout: traced on FakeTensors, never run)
    art = compiled(traced(fns[case], *inputs, mode="fake" if case == "dropout" else "real"), tf32=True)
    assert not templates(art)
    if case != "dropout":
        (got,) = load_plan(art)(inputs)
        torch.testing.assert_close(got, fns[case](*inputs), atol=1e-5, rtol=1e-5)


def test_views_of_a_fused_projection_are_read_in_place() -> None:
    """GPT-2's q, k, v: split views of one projection, no copy kernel before the template."""
    b, s, h, d = 2, 24, 4, 16

    def fn(x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(b, s, h, d).transpose(1, 2) for t in x.split(h * d, dim=2))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h * d)

    x = torch.randn(b, s, 3 * h * d, generator=torch.Generator().manual_seed(2))
    art = compiled(traced(fn, x), tf32=True)
    steps = [st for st in art.manifest.plan.steps if st.kind == "kernel"]
    (launch,) = [st for st in steps if is_template_kernel(st.kernel)]
    assert [a.name for a in launch.args[:3]] == [art.manifest.plan.inputs[0]] * 3
    assert [a.value for a in launch.args[4:5]] + [launch.args[8].value, launch.args[12].value] == [0, h * d, 2 * h * d]
    (got,) = load_plan(art)([x])
    torch.testing.assert_close(got, fn(x), atol=1e-5, rtol=1e-5)


def _keep(z: int, rows: int, cols: int) -> torch.Tensor:
    """A boolean mask [Z, 1, L, S] with row 5 of batch 0 masked whole."""
    keep = torch.rand(z, 1, rows, cols, generator=torch.Generator().manual_seed(3)) > 0.3
    keep[0, 0, 5] = False
    return keep


MASKED = {
    "bool_4d": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
    "bool_2d": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m[1, 0]),
    # transformers' float masks: finfo.min where masked, expanded over the heads
    "finfo_min_expanded": lambda q, k, v, m: F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.where(m, 0.0, torch.finfo(torch.float32).min).expand(-1, q.shape[1], -1, -1)),
    # BERT's padding mask: one row of keys per batch
    "per_key": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=(m[:, :, :1] - 1.0) * 1e4),
    "and_causal": lambda q, k, v, m: aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=True, attn_mask=torch.where(m, 0.0, float("-inf")))[0],
}


@pytest.mark.parametrize("case", list(MASKED))
def test_masked_sdpa_runs_the_template_with_its_mask_written_once(case: str) -> None:
    z, h, rows = 2, 3, 37
    q, k, v = qkv(z, h, rows, 16)
    keep = _keep(z, rows, rows)
    inputs = [q, k, v, keep.float() if case == "per_key" else keep]
    fn = MASKED[case]
    art = compiled(traced(fn, *inputs), tf32=True)
    assert len(templates(art)) == 1 and CPU_OP not in art.manifest.stats.extern_ops
    steps = art.manifest.plan.steps
    (launch,) = [st for st in steps if st.kind == "kernel" and is_template_kernel(st.kernel)]
    assert len([a for a in launch.args if a.kind == "node"]) == 5  # q, k, v, the mask, out
    # the mask is never written once per head: no buffer holds more than its [Z, 1, L, S]
    allocs = {st.out: st.spec for st in steps if st.kind == "alloc"}
    mask_elems = [math.prod(int(x) for x in spec.sizes) for name, spec in allocs.items()
                  if name == launch.args[3].name]
    assert all(n <= z * rows * rows for n in mask_elems)
    assert int_args(launch.args)["b_sh"] == 0
    (got,) = load_plan(art)(inputs)
    want = fn(*inputs)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got.stride() == want.stride()
    if case in ("bool_4d", "and_causal"):
        assert torch.equal(got[0, :, 5], torch.zeros_like(got[0, :, 5]))  # a row masked whole: zeros


def math_traced(fn: Any, *inputs: torch.Tensor) -> GraphSpec:
    """`fn` traced as AOTAutograd traces an SDPA call for which no fused kernel was chosen (transformers'
    BERT on CUDA): torch's math path, `_safe_softmax` decomposed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        return traced(fn, *inputs)


MATH_MASKED = {
    "bool_4d": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
    "float_per_key": lambda q, k, v, m: F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.where(m[:, :, :1], 0.0, float("-inf"))),
    "scaled": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3),
}


@pytest.mark.parametrize("case", list(MATH_MASKED))
def test_torch_math_sdpa_with_a_mask_runs_the_template(case: str) -> None:
    z, h, rows = 2, 3, 37
    q, k, v = qkv(z, h, rows, 16)
    keep = _keep(z, rows, rows)
    keep[1, 0, :, 3] = False  # a key masked for every query (a padded token)
    fn = MATH_MASKED[case]
    spec = math_traced(fn, q, k, v, keep)
    assert {"aten._softmax.default", "aten.bmm.default", "aten.any.dim"} <= {n.target for n in spec.nodes}
    art = compiled(spec, tf32=True)
    assert len(templates(art)) == 1 and not art.manifest.stats.extern_ops  # no bmm left, no scores written
    scores = z * h * rows * rows
    assert all(math.prod(int(x) for x in st.spec.sizes) < scores for st in art.manifest.plan.steps if st.kind == "alloc")
    (got,) = load_plan(art)([q, k, v, keep])
    want = fn(q, k, v, keep)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got.stride() == want.stride()
    if case != "float_per_key":
        assert torch.equal(got[0, :, 5], torch.zeros_like(got[0, :, 5]))  # a row masked whole: zeros, as eager


def test_math_sdpa_layers_share_one_mask_buffer() -> None:
    """Each math SDPA call turns the boolean mask into a float one; the graph's equal nodes are
    merged (passes/cse.py), so every layer's template reads one mask buffer, written once."""
    z, h, rows = 2, 2, 24
    q, k, v = qkv(z, h, rows, 16)
    keep = _keep(z, rows, rows)

    def layers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        x = q
        for _ in range(3):
            x = F.scaled_dot_product_attention(x, k, v, attn_mask=m) + x
        return x

    art = compiled(math_traced(layers, q, k, v, keep), tf32=True)
    launches = [st for st in art.manifest.plan.steps if st.kind == "kernel" and is_template_kernel(st.kernel)]
    assert len(launches) == 3 and len({st.args[3].name for st in launches}) == 1
    (got,) = load_plan(art)([q, k, v, keep])
    torch.testing.assert_close(got, layers(q, k, v, keep), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["softmax_read_twice", "plain_softmax", "scaled_v"])
def test_masked_chains_the_template_would_change_are_left_alone(case: str) -> None:
    q, k, v = qkv(2, 2, 16, 16)
    keep = _keep(2, 16, 16)

    def softmax_read_twice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> Any:
        s = torch.where(m, q @ k.transpose(-2, -1), float("-inf"))
        p = aten._safe_softmax(s, -1)
        return p @ v, p.sum()

    fns = {
        "softmax_read_twice": softmax_read_twice,
        # eager's plain softmax gives NaN for a row masked whole; the template would give zeros
        "plain_softmax": lambda q, k, v, m: torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~m, float("-inf")),
                                                          -1) @ v,
        "scaled_v": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v * 2, attn_mask=m),
    }
    art = compiled(math_traced(fns[case], q, k, v, keep), tf32=True)
    if case == "scaled_v":  # a scale on v is its own kernel; the attention still fuses
        assert len(templates(art)) == 1
    else:
        assert not templates(art)
    got = load_plan(art)([q, k, v, keep])
    want = fns[case](q, k, v, keep)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, equal_nan=True)


def test_a_failing_template_lowering_runs_the_op_as_an_extern_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fxcc op's eager kernel (aten SDPA) is the fallback: the plan stays correct."""
    from fxcc.compiler_core import lowering

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("template lowering bug")

    op = resolve_target(TEMPLATE_OP)
    monkeypatch.setitem(lowering.LOWERINGS, op, broken)
    inputs = qkv(2, 2, 20, 16)
    art = compiled(traced(causal_sdpa, *inputs), tf32=True)
    assert not templates(art) and TEMPLATE_OP in art.manifest.stats.extern_ops
    (got,) = load_plan(art)(list(inputs))
    torch.testing.assert_close(got, causal_sdpa(*inputs), atol=1e-5, rtol=1e-5)


def test_only_listed_fxcc_ops_resolve() -> None:
    assert resolve_target(TEMPLATE_OP) is torch.ops.fxcc.flash_attention.default
    for bad in ("fxcc.flash_attention.out", "fxcc.__class__.default", "fxcc.other.default"):
        with pytest.raises(InvalidGraph):
            resolve_target(bad)


def test_tf32_is_part_of_the_key() -> None:
    from fxcc.compiler_core.keys import compile_key

    spec = traced(chain, *qkv(2, 3, 8, 16))
    keys = {compile_key(CompileRequest(graph=spec, options=CompileOptions(allow_tf32=tf))) for tf in (False, True)}
    assert len(keys) == 2


# ---------------------------------------------------------------- CUDA targets (FakeTensors; no GPU needed)


def _cuda_spec(dtype: torch.dtype = torch.float32, head_dim: int = 16, mask: bool = False, seq: int = 40) -> GraphSpec:
    """GPT-2's attention as AOTAutograd leaves it on a GPU: aten's memory-efficient op on views of
    the fused projection (a CPU-only torch decomposes SDPA on fake CUDA tensors, so it is called here);
    with `mask`, as transformers' GPT-2 runs under torch.compile: a [B, 1, S, S] boolean mask made
    0 / -inf and expanded over the heads as the op's bias."""
    h = 4
    width = h * head_dim

    def fn(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, h, head_dim).transpose(1, 2) for t in x.split(width, dim=2))
        if mask:
            bias = torch.where(keep, 0.0, float("-inf")).to(dtype).expand(b, h, s, s)
            out = aten._scaled_dot_product_efficient_attention(q, k, v, bias, False)[0]
        else:
            out = aten._scaled_dot_product_efficient_attention(q, k, v, None, False, is_causal=True)[0]
        return out.transpose(1, 2).reshape(b, s, width) * 2

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(2, seq, 3 * width, device="cuda", dtype=dtype)
        keep = torch.empty(2, 1, seq, seq, device="cuda", dtype=torch.bool)
        gm = make_fx(fn)(x, keep)
    return capture_graph(gm, [x, keep]).spec


@pytest.mark.parametrize(("dtype", "head_dim", "tf32", "fires"), [
    (torch.float32, 16, True, True), (torch.float32, 64, True, True), (torch.float32, 16, False, False),
    (torch.float16, 16, True, False), (torch.float32, 8, True, False)])
def test_cuda_direct_sdpa(dtype: torch.dtype, head_dim: int, tf32: bool, fires: bool) -> None:
    art = compiled(_cuda_spec(dtype, head_dim), tf32, Target(kind="cuda", arch=90))
    assert bool(templates(art)) == fires
    assert (CUDA_OP in art.manifest.stats.extern_ops) != fires


def test_cuda_masked_sdpa_reads_the_mask_once_for_every_head() -> None:
    """transformers' GPT-2 under torch.compile on a GPU: its mask's bias goes to fxcc's kernel,
    read at stride 0 over the heads from a [B, 1, S, S] buffer written once."""
    art = compiled(_cuda_spec(head_dim=64, mask=True), True, Target(kind="cuda", arch=90))
    assert len(templates(art)) == 1 and CUDA_OP not in art.manifest.stats.extern_ops
    steps = art.manifest.plan.steps
    (launch,) = [st for st in steps if st.kind == "kernel" and is_template_kernel(st.kernel)]
    ints = int_args(launch.args)
    assert (ints["b_sz"], ints["b_sh"], ints["b_sm"], ints["b_sn"]) == (40 * 40, 0, 40, 1)
    source = art.blobs[next(k for k in art.manifest.kernels if k.name == launch.kernel).source.digest].decode()
    assert source_facts(source)["bias_dense"] == "1" and "* b_sn" not in source  # key stride 1 in the source
    (alloc,) = [st for st in steps if st.kind == "alloc" and st.out == launch.args[3].name]
    assert [int(x) for x in alloc.spec.sizes] == [2, 1, 40, 40]
    assert not art.manifest.stats.extern_ops  # nothing else left to aten


@pytest.mark.skipif(cuda_build_unavailable() is not None, reason="cannot cross-compile for CUDA")
@pytest.mark.parametrize("mask", [False, True], ids=["causal", "mask"])
def test_cuda_template_builds_a_cubin(mask: bool) -> None:
    spec = _cuda_spec(head_dim=64, mask=mask, seq=64)  # rows of 64 keys: 16-divisible strides, as GPT-2's 512
    request = CompileRequest(graph=spec, options=CompileOptions(allow_tf32=True, target=Target(kind="cuda", arch=90)))
    art = build_artifact(compile_request(request), request, 90)
    (info,) = [k for k in art.manifest.kernels if is_template_kernel(k.name)]
    assert "sm_90" in info.binaries, info.metadata
    assert info.metadata["sm_90.num_warps"] == info.num_warps and info.num_stages >= 2
    assert info.metadata["sm_90.signature"].startswith("*fp32,*fp32,*fp32,*fp32,")
    if mask:  # the mask's rows load as vectors (its key stride is 1 in the source, not an argument)
        (task,) = [t for t in build_tasks(compile_request(request), request, 90) if t.name == info.name]
        ptx = compile_task(task).asm["ptx"]
        assert "ld.global.v4.b32" in ptx and "ld.global.b32" not in ptx


def _t5_layers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor, pb: torch.Tensor) -> torch.Tensor:
    """T5's attention bias: its position bias where the padding mask keeps a key, else finfo.min,
    [Z, H, L, S], read by every layer."""
    bias = torch.where(pad[:, None, None, :], pb, torch.finfo(q.dtype).min)
    x = q
    for _ in range(2):
        x = F.scaled_dot_product_attention(x, k, v, attn_mask=bias) + x
    return x


def _t5_inputs(z: int = 4, h: int = 3, rows: int = 37) -> tuple[torch.Tensor, ...]:
    q, k, v = qkv(z, h, rows, 16)
    pad = torch.ones(z, rows, dtype=torch.bool)
    pad[1, 30:] = False
    pb = torch.randn(1, h, rows, rows, generator=torch.Generator().manual_seed(3))
    return q, k, v, pad, pb


def _allocs(art: Artifact) -> list[int]:
    return [math.prod(int(x) for x in st.spec.sizes) for st in art.manifest.plan.steps if st.kind == "alloc"]


def test_a_bias_built_by_one_op_from_smaller_tensors_is_computed_per_tile() -> None:
    """T5's [Z, H, L, S] bias (a [1, H, L, S] position bias where a [Z, S] mask keeps a key) is never
    written: each layer's template reads the position bias and the mask and computes it per tile."""
    inputs = _t5_inputs()
    z, h, rows = inputs[0].shape[:3]
    art = compiled(math_traced(_t5_layers, *inputs), tf32=True)
    sources = {k.name: art.blobs[k.source.digest].decode() for k in art.manifest.kernels if is_template_kernel(k.name)}
    assert len(sources) == 1
    facts = source_facts(next(iter(sources.values())))
    assert facts["bias"] == "1" and sorted(x.split(":")[0] for x in facts["bias_buffers"].split(",")) == ["bool", "float32"]
    launches = [st for st in art.manifest.plan.steps if st.kind == "kernel" and st.kernel in sources]
    assert len(launches) == 2 and not art.manifest.stats.extern_ops
    assert all("b_sh" not in int_args(st.args) for st in launches)  # no bias strides: read per tile
    assert max(_allocs(art)) < z * h * rows * rows  # neither the bias nor the scores written
    (got,) = load_plan(art)(list(inputs))
    torch.testing.assert_close(got, _t5_layers(*inputs), atol=1e-5, rtol=1e-5)


def test_a_computed_position_bias_is_written_once_row_major_for_the_tiles() -> None:
    """Where the position bias is itself computed (T5's bucket lookup: a permuted view of an
    embedding), it is written once, [1, H, L, S] in row-major order, and read by every layer."""
    q, k, v, pad, _ = _t5_inputs()
    z, h, rows = q.shape[:3]
    table = torch.randn(2 * rows, h, generator=torch.Generator().manual_seed(5))

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        rel = torch.arange(rows)[None, :] - torch.arange(rows)[:, None] + rows  # [L, S] buckets
        pb = F.embedding(rel, table).permute(2, 0, 1).unsqueeze(0)  # [1, H, L, S]
        return _t5_layers(q, k, v, pad, pb)

    inputs = (q, k, v, pad, table)
    art = compiled(math_traced(fn, *inputs), tf32=True)
    (template,) = templates(art)
    assert "bias_buffers" in source_facts(art.blobs[next(k for k in art.manifest.kernels if k.name == template).source.digest].decode())
    written = [st for st in art.manifest.plan.steps if st.kind == "alloc" and list(st.spec.sizes) == [1, h, rows, rows]]
    assert len(written) == 1 and [int(s) for s in written[0].spec.strides] == [h * rows * rows, rows * rows, rows, 1]
    assert max(_allocs(art)) < z * h * rows * rows
    (got,) = load_plan(art)(list(inputs))
    torch.testing.assert_close(got, fn(*inputs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["also_returned", "inputs_as_large"])
def test_a_bias_is_read_whole_where_tiles_would_not_save_memory(case: str) -> None:
    inputs = _t5_inputs()

    def also_returned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor, pb: torch.Tensor) -> Any:
        bias = torch.where(pad[:, None, None, :], pb, torch.finfo(q.dtype).min)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias), bias

    def inputs_as_large(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor, pb: torch.Tensor) -> Any:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=(q @ k.transpose(-2, -1)).tanh() + pb)

    fn = {"also_returned": also_returned, "inputs_as_large": inputs_as_large}[case]
    art = compiled(math_traced(fn, *inputs), tf32=True)
    (template,) = templates(art)
    source = art.blobs[next(k for k in art.manifest.kernels if k.name == template).source.digest].decode()
    assert "bias_buffers" not in source_facts(source) and source_facts(source)["bias"] == "1"
    got = load_plan(art)(list(inputs))
    want = fn(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_a_bias_whose_tile_expression_cannot_be_written_is_read_whole(monkeypatch) -> None:
    """Where the template's codegen has no spelling of a tile bias for the target, the lowering
    finds it out by rendering it first and reads the bias whole: the compile does not fail."""
    from fxcc.compiler_core.codegen import flex_mods
    from fxcc.compiler_core.errors import CodegenError

    real = flex_mods.render_tile
    refused = []

    def no_spelling(*args: Any, **kwargs: Any) -> Any:
        refused.append(1)
        raise CodegenError("no spelling of this tile expression (test)")

    monkeypatch.setattr(flex_mods, "render_tile", no_spelling)
    inputs = _t5_inputs()
    art = compiled(math_traced(_t5_layers, *inputs), tf32=True)
    monkeypatch.setattr(flex_mods, "render_tile", real)
    assert refused  # the lowering asked
    for template in templates(art):
        source = art.blobs[next(k for k in art.manifest.kernels if k.name == template).source.digest].decode()
        assert "bias_buffers" not in source_facts(source) and source_facts(source)["bias"] == "1"
    (got,) = load_plan(art)(list(inputs))
    torch.testing.assert_close(got, _t5_layers(*inputs), atol=1e-5, rtol=1e-5)

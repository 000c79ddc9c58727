"""fxcc's flash-attention template (compiler_core/codegen/attention.py) against a float64 reference."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from fxcc.compiler_core.autotune import load_jit
from fxcc.compiler_core.codegen.attention import (
    AttentionConfig,
    AttentionParams,
    heuristic_config,
    launch_grid,
    render_attention,
)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    scores = q.double() @ k.double().transpose(-2, -1) * scale
    if bias is not None:
        scores = scores + bias.double()
    if causal:
        rows, cols = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(rows, cols, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(scores, -1) @ v.double()
    return out.nan_to_num(0.0)  # a row with no finite score: zeros, as aten's fused kernels give


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, causal: bool, precision: str,
           tmp: Path, config: AttentionConfig | None = None, heads_outer: bool = False,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """The template run by the interpreter on [Z, H, ·, ·] views, as a plan would launch it (a
    bias: [Z, H, L, S] by its strides, an expanded one's 0 as they are)."""
    z, h, rows, e = q.shape
    cols, ev = k.shape[2], v.shape[3]
    params = AttentionParams(e, ev, causal, scale, q.dtype, precision, bias is not None,
                             bias is not None and bias.stride(3) == 1)  # as the lowering says
    config = config or heuristic_config(params, rows, cols, "interpret")
    r = render_attention(params, config)
    fn = load_jit(r.source, r.name, tmp, interpret=True)
    out = (torch.empty(z, h, rows, ev, dtype=q.dtype) if heads_outer
           else torch.empty(z, rows, h, ev, dtype=q.dtype).transpose(1, 2))
    ints: list[Any] = []
    for t in (q, k, v):
        base = t._base if t._base is not None else t
        ints += [t.storage_offset() - base.storage_offset(), *t.stride()[:3]]
        assert t.stride(3) == 1
    bases = [t._base if t._base is not None else t for t in (q, k, v)]
    if bias is not None:
        assert bias.dim() == 4
        ints += [0, *bias.stride()]  # the kernel gets the view's own data pointer
        bases.append(bias)
    ints += [*out.stride()[:3], z, h, rows, cols]
    grid = tuple(launch_grid(rows, z * h, config.block_m))
    fn[grid](*bases, out, *ints, **config.constexprs, num_warps=config.num_warps, num_stages=config.num_stages)
    return out


def qkv(z: int, h: int, rows: int, cols: int, e: int, ev: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(z, h, rows, e, generator=g), torch.randn(z, h, cols, e, generator=g),
            torch.randn(z, h, cols, ev, generator=g))


SMALL_TILES = AttentionConfig(16, 16, 4, 2)  # several key tiles per row: the online softmax's rescaling runs


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("rows", "cols"), [(32, 32), (37, 45), (45, 37), (1, 19)], ids=str)
def test_matches_float64_on_ragged_lengths(causal: bool, rows: int, cols: int, tmp_path: Path) -> None:
    q, k, v = qkv(2, 3, rows, cols, 16, 16)
    scale = 1 / math.sqrt(16)
    got = attend(q, k, v, scale=scale, causal=causal, precision="ieee", tmp=tmp_path, config=SMALL_TILES)
    want = reference(q, k, v, scale, causal)
    assert (got.double() - want).abs().max() < 2e-6


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_heuristic_tiles_and_other_value_dim(causal: bool, tmp_path: Path) -> None:
    q, k, v = qkv(1, 2, 70, 70, 32, 64, seed=1)
    got = attend(q, k, v, scale=0.3, causal=causal, precision="ieee", tmp=tmp_path, heads_outer=True)
    assert (got.double() - reference(q, k, v, 0.3, causal)).abs().max() < 2e-6


def test_strided_views_of_a_fused_projection_are_read_in_place(tmp_path: Path) -> None:
    """q, k, v as GPT-2 makes them: [B, S, 3·H·D] split, viewed [B, S, H, D], transposed to [B, H, S, D]."""
    b, s, heads, d = 2, 40, 4, 16
    x = torch.randn(b, s, 3 * heads * d, generator=torch.Generator().manual_seed(3))
    q, k, v = (t.view(b, s, heads, d).transpose(1, 2) for t in x.split(heads * d, dim=2))
    assert k.storage_offset() == heads * d and not q.is_contiguous()
    got = attend(q, k, v, scale=1 / math.sqrt(d), causal=True, precision="ieee", tmp=tmp_path, config=SMALL_TILES)
    want = reference(q, k, v, 1 / math.sqrt(d), True)
    assert (got.double() - want).abs().max() < 2e-6
    torch.testing.assert_close(got, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                               atol=1e-5, rtol=1e-5)


def _mask_bias(z: int, rows: int, cols: int, fill: float) -> torch.Tensor:
    """A [Z, 1, L, S] additive mask: 0 where kept, `fill` elsewhere; row 3 of batch 0 masked whole."""
    keep = torch.rand(z, 1, rows, cols, generator=torch.Generator().manual_seed(7)) > 0.4
    keep[0, 0, 3] = False
    return torch.zeros(z, 1, rows, cols).masked_fill(~keep, fill)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("fill", [float("-inf"), torch.finfo(torch.float32).min], ids=["neg_inf", "finfo_min"])
def test_an_additive_mask_broadcast_over_heads(fill: float, causal: bool, tmp_path: Path) -> None:
    """A boolean mask as AOTAutograd hands it to SDPA (0 / -inf), or a model's own finfo.min mask,
    read at stride 0 over the heads, over several key tiles (the online rescaling with a mask)."""
    q, k, v = qkv(2, 3, 37, 45, 16, 16, seed=6)
    bias = _mask_bias(2, 37, 45, fill).expand(2, 3, 37, 45)
    assert bias.stride(1) == 0
    got = attend(q, k, v, scale=0.25, causal=causal, precision="ieee", tmp=tmp_path, config=SMALL_TILES, bias=bias)
    want = reference(q, k, v, 0.25, causal, bias)
    assert (got.double() - want).abs().max() < 2e-6
    row = got[0, :, 3]
    if fill == float("-inf"):
        assert torch.equal(row, torch.zeros_like(row))  # every score -inf: zeros, not NaN
    else:  # every score finfo.min: eager's softmax spreads evenly (no -inf from the log2 scaling)
        assert torch.allclose(row.double(), v[0].double().mean(1) if not causal else want[0, :, 3], atol=1e-5)
        assert row.abs().max() > 0


@pytest.mark.parametrize("mask", ["causal", "padding", "window", "dead_rows"])
def test_key_tiles_masked_whole_by_the_bias_are_skipped(mask: str, tmp_path: Path) -> None:
    """A boolean mask's bias (0 / -inf) that masks whole key tiles: a causal one (as transformers'
    GPT-2 passes it: a bias, not is_causal), padded keys, a sliding window, a query tile masked whole.
    The loop runs from the first tile with a kept key to the last: the result is float64's, and
    values of keys in tiles past every query's last kept one are never read (NaN there stays out)."""
    z, rows, cols = 2, 64, 80  # 16-row, 16-key tiles: 4 query tiles, 5 key tiles
    i, j = torch.arange(rows)[:, None], torch.arange(cols)[None, :]
    keep = {"causal": j <= i, "padding": j < 40, "window": (j <= i + 8) & (j > i - 24),
            "dead_rows": (j >= 0) & ((i < 16) | (i >= 32))}[mask].expand(z, 1, rows, cols).clone()
    if mask == "padding":
        keep[1] = j < 75  # another length in batch 1
    bias = torch.zeros(z, 1, rows, cols).masked_fill(~keep, float("-inf")).expand(z, 3, rows, cols)
    q, k, v = qkv(z, 3, rows, cols, 16, 16, seed=11)
    v_read = v.clone()
    unread = {"causal": slice(64, 80), "padding": slice(48, 80)}.get(mask)  # whole tiles of batch 0
    if unread is not None:
        v_read[0, :, unread] = float("nan")
    got = attend(q, k, v_read, scale=0.25, causal=False, precision="ieee", tmp=tmp_path, config=SMALL_TILES,
                 bias=bias)
    want = reference(q, k, v, 0.25, False, bias)
    assert torch.isfinite(got).all()
    assert (got.double() - want).abs().max() < 2e-6
    if mask == "dead_rows":
        assert torch.equal(got[:, :, 16:32], torch.zeros_like(got[:, :, 16:32]))


def test_a_nan_in_a_tile_otherwise_masked_still_comes_out(tmp_path: Path) -> None:
    """A NaN bias counts as a kept key: its tile is computed and the row is NaN, as eager's is."""
    q, k, v = qkv(1, 1, 16, 64, 16, 16, seed=12)
    bias = torch.zeros(1, 1, 16, 64)
    bias[..., 32:] = float("-inf")
    bias[0, 0, 5, 60] = float("nan")
    got = attend(q, k, v, scale=0.25, causal=False, precision="ieee", tmp=tmp_path, config=SMALL_TILES, bias=bias)
    eager = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.25)
    assert torch.isnan(got[0, 0, 5]).all() and torch.isnan(eager[0, 0, 5]).all()
    others = [r for r in range(16) if r != 5]
    torch.testing.assert_close(got[0, 0, others], eager[0, 0, others], atol=1e-5, rtol=1e-5)


def test_a_real_valued_bias_of_its_own_strides(tmp_path: Path) -> None:
    """A T5-style bias, one per head and position pair, laid out transposed (any strides)."""
    q, k, v = qkv(1, 2, 20, 33, 32, 16, seed=8)
    bias = torch.randn(1, 33, 2, 20, generator=torch.Generator().manual_seed(9)).permute(0, 2, 3, 1)
    assert not bias.is_contiguous()
    got = attend(q, k, v, scale=0.2, causal=False, precision="ieee", tmp=tmp_path, config=SMALL_TILES, bias=bias)
    assert (got.double() - reference(q, k, v, 0.2, False, bias)).abs().max() < 2e-6


def test_tf32_source_and_a_loose_tolerance(tmp_path: Path) -> None:
    """With TF32 the dots say so (the interpreter computes them exactly; a GPU rounds inputs to
    10 mantissa bits, so the GPU tests hold it to about 1e-3 relative); without, they say ieee."""
    params = AttentionParams(64, 64, False, 0.125, torch.float32, "tf32")
    source = render_attention(params, AttentionConfig(64, 32, 4, 2)).source
    assert source.count('input_precision="tf32"') == 2 and "ieee" not in source
    exact = render_attention(params.__class__(64, 64, False, 0.125, torch.float32, "ieee"), AttentionConfig(64, 32, 4, 2))
    assert exact.source.count('input_precision="ieee"') == 2
    q, k, v = qkv(2, 2, 33, 50, 64, 64, seed=4)
    got = attend(q, k, v, scale=0.125, causal=False, precision="tf32", tmp=tmp_path)
    assert (got.double() - reference(q, k, v, 0.125, False)).abs().max() < 2e-2


def test_half_precision_inputs(tmp_path: Path) -> None:
    q, k, v = (t.half() for t in qkv(1, 2, 24, 24, 16, 16, seed=5))
    got = attend(q, k, v, scale=0.25, causal=True, precision="tf32", tmp=tmp_path, config=SMALL_TILES)
    assert got.dtype == torch.float16
    assert (got.double() - reference(q, k, v, 0.25, True)).abs().max() < 5e-3


def test_names_follow_source_and_config() -> None:
    params = AttentionParams(64, 64, True, 0.125, torch.float32, "tf32")
    a, b = render_attention(params, AttentionConfig(128, 64, 8, 2)), render_attention(params, AttentionConfig(64, 64, 8, 2))
    assert a.name != b.name and a.name == render_attention(params, AttentionConfig(128, 64, 8, 2)).name
    assert a.name != render_attention(params.__class__(64, 64, False, 0.125, torch.float32, "tf32"),
                                      AttentionConfig(128, 64, 8, 2)).name


@pytest.mark.parametrize("head_dim", [8, 24, 256])
def test_other_head_dims_are_refused(head_dim: int) -> None:
    with pytest.raises(ValueError, match="head dims"):
        render_attention(AttentionParams(head_dim, head_dim, False, 0.1, torch.float32, "tf32"),
                         AttentionConfig(64, 64, 4, 2))


def test_heuristic_for_hopper_head_dim_64() -> None:
    params = AttentionParams(64, 64, False, 0.125, torch.float32, "tf32")
    assert heuristic_config(params, 512, 512, "cuda") == AttentionConfig(128, 64, 4, 2)
    small = heuristic_config(params, 20, 9, "cuda")
    assert (small.block_m, small.block_n) == (32, 16)
    masked = AttentionParams(64, 64, False, 0.125, torch.float32, "tf32", True)  # the sweep's best with a bias
    assert heuristic_config(masked, 512, 512, "cuda") == AttentionConfig(128, 64, 8, 3)
    assert heuristic_config(masked, 512, 512, "cuda", 8 * 12) == AttentionConfig(128, 64, 8, 3)  # 384 programs
    assert heuristic_config(masked, 512, 512, "cuda", 4 * 12) == AttentionConfig(64, 32, 4, 2)  # 192: under 2 waves
    assert heuristic_config(masked, 40, 40, "cuda") == AttentionConfig(64, 64, 4, 2)  # 8 warps over 128 rows only
    wide = AttentionParams(128, 128, False, 0.125, torch.float32, "tf32", True)
    assert heuristic_config(wide, 512, 512, "cuda") == AttentionConfig(64, 32, 4, 2)

"""Autotuning the attention template: its candidates, regridding, and whole artifacts (interpreter, fake timer)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.backend import decomposition_table
from fxcc.client.capture import capture_graph
from fxcc.client.runtime import load_plan
from fxcc.compiler_core import pipeline
from fxcc.compiler_core.autotune import autotune_artifact
from fxcc.compiler_core.autotune_attention import STAGE_SMEM_MAX, candidate_configs, retile_step
from fxcc.compiler_core.codegen.attention import AttentionConfig, int_args, is_template_kernel
from fxcc.compiler_core.pipeline import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest

HOPPER_64 = AttentionConfig(128, 64, 4, 2)


def test_candidates_start_with_the_heuristic_and_fit_shared_memory() -> None:
    found = candidate_configs(HOPPER_64, 512, 512, 128, 4)
    assert found[0] == HOPPER_64 and len(set(found)) == len(found)
    assert {c.block_m for c in found} == {64, 128} and {c.block_n for c in found} == {32, 64, 128}
    assert {c.num_warps for c in found} == {4, 8} and {c.num_stages for c in found} == {2, 3}
    assert all(c.num_stages * c.block_n * 128 * 4 <= STAGE_SMEM_MAX for c in found)
    assert AttentionConfig(64, 64, 8, 2) not in found  # 64 rows on two warp groups
    assert 12 <= len(found) <= 20


def test_max_autotune_widens_the_default() -> None:
    default = set(candidate_configs(HOPPER_64, 512, 512, 128, 4))
    wide = set(candidate_configs(HOPPER_64, 512, 512, 128, 4, "max-autotune"))
    assert default < wide and any(c.num_stages == 1 for c in wide)


def test_short_sequences_get_no_tiles_longer_than_they_are() -> None:
    found = candidate_configs(AttentionConfig(32, 16, 4, 2), 20, 9, 32, 4, "max-autotune")
    assert all(c.block_m <= 32 and c.block_n <= 16 for c in found[1:])


def test_half_precision_fits_longer_key_tiles() -> None:
    assert AttentionConfig(128, 128, 8, 3) in candidate_configs(HOPPER_64, 512, 512, 128, 2)
    assert AttentionConfig(128, 128, 8, 3) not in candidate_configs(HOPPER_64, 512, 512, 128, 4)


def _request(seq: int) -> tuple[CompileRequest, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randn(1, 2, seq, 16, generator=g) for _ in range(3))

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sin()

    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    spec = capture_graph(gm, list(inputs)).spec
    return CompileRequest(graph=spec, options=CompileOptions(allow_tf32=True)), inputs


def test_retile_step_follows_block_m() -> None:
    request, _ = _request(130)
    art = compile_request(request)
    (step,) = [s for s in art.manifest.plan.steps if s.kind == "kernel" and is_template_kernel(s.kernel)]
    sizes = int_args(step.args)
    assert (sizes["batch"], sizes["heads"], sizes["q_len"], sizes["kv_len"]) == (1, 2, 130, 130)
    assert retile_step(step, 64).grid == [3 * 2] and retile_step(step, 16).grid == [9 * 2]


def _timer(calls: list[str]) -> Callable[[Any, Callable[[], None]], float]:
    """Prefers 64-row, 32-key tiles on 4 warps, 3 stages (never the heuristic) and small pointwise tiles."""

    def timer(config: Any, launch: Callable[[], None]) -> float:
        calls.append(config.label)
        if isinstance(config, AttentionConfig):
            return (abs(config.block_m - 64) + abs(config.block_n - 32) + config.num_warps
                    + abs(config.num_stages - 3)) / 10
        return config.xblock / 1000
    return timer


@pytest.fixture(scope="module")
def tuned() -> tuple[Any, Any, tuple[torch.Tensor, ...], list[str]]:
    request, inputs = _request(130)
    c = pipeline.run(pipeline.Compilation(request))
    calls: list[str] = []
    return c.artifact, autotune_artifact(c.artifact, request, "cpu", scheduled=c.scheduled,
                                         timer=_timer(calls)), inputs, calls


def test_the_template_is_tuned_over_its_own_candidates(tuned: Any) -> None:
    before, after, _, calls = tuned
    assert after.manifest.tuned
    (info,) = [k for k in after.manifest.kernels if is_template_kernel(k.name)]
    (old,) = [k for k in before.manifest.kernels if is_template_kernel(k.name)]
    assert info.name == old.name and info.tuning is not None
    assert info.tuning.winner == "m64_n32_w4_s3" and info.tuning.heuristic == "m128_n64_w4_s2"
    assert (info.constexprs, info.num_warps, info.num_stages) == ({"BLOCK_M": 64, "BLOCK_N": 32}, 4, 3)
    assert len(info.tuning.timings_ms) >= 10 and info.tuning.sizes == [2, 130, 130]
    assert any(label.startswith("x") for label in calls), "the pointwise kernel is tuned too"
    (step,) = [s for s in after.manifest.plan.steps if s.kind == "kernel" and s.kernel == info.name]
    assert step.grid == [math.ceil(130 / 64) * 2]


def test_the_tuned_plan_matches_eager(tuned: Any) -> None:
    _, after, inputs, _ = tuned
    (got,) = load_plan(after)(list(inputs))
    torch.testing.assert_close(got, F.scaled_dot_product_attention(*inputs, is_causal=True).sin(),
                               atol=1e-5, rtol=1e-5)


def test_a_wrong_candidate_never_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate whose output differs (here: it writes nothing) loses, whatever its time."""
    from fxcc.compiler_core import autotune_attention

    request, _ = _request(40)
    art = compile_request(request)
    launch = autotune_attention.AttentionBench.launch

    def skipping(self: Any, config: AttentionConfig) -> None:
        if config.block_n != 32:
            launch(self, config)

    monkeypatch.setattr(autotune_attention.AttentionBench, "launch", skipping)
    out = autotune_artifact(art, request, "cpu", timer=lambda c, f: 0.0 if getattr(c, "block_n", 0) == 32 else 1.0)
    (info,) = [k for k in out.manifest.kernels if is_template_kernel(k.name)]
    assert info.tuning is not None and "n32" not in info.tuning.winner
    assert any("n32" in label for label in info.tuning.rejected)


def test_a_masked_template_is_tuned_with_its_mask_and_matches_eager() -> None:
    """The bench of a biased kernel gives it a bias of the launch's strides (0 over the heads)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 40, 16, generator=g) for _ in range(3))
    keep = torch.rand(2, 1, 40, 40, generator=g) > 0.3

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep).cos()

    inputs = (q, k, v, keep)
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    request = CompileRequest(graph=capture_graph(gm, list(inputs)).spec, options=CompileOptions(allow_tf32=True))
    art = compile_request(request)
    out = autotune_artifact(art, request, "cpu", timer=lambda c, f: 0.0 if getattr(c, "block_n", 0) == 32 else 1.0)
    (info,) = [k for k in out.manifest.kernels if is_template_kernel(k.name)]
    assert info.tuning is not None and info.tuning.heuristic == "m64_n64_w4_s2" and not info.tuning.rejected
    assert info.constexprs["BLOCK_N"] == 32
    assert len(info.tuning.timings_ms) >= 4
    (step,) = [s for s in out.manifest.plan.steps if s.kind == "kernel" and s.kernel == info.name]
    assert int_args(step.args)["b_sh"] == 0
    (got,) = load_plan(out)(list(inputs))
    torch.testing.assert_close(got, fn(*inputs), atol=1e-5, rtol=1e-5)


def test_a_template_computing_its_bias_per_tile_is_tuned_with_the_tensors_it_reads() -> None:
    """The bench gives a bias computed per tile (T5's: a position bias where a mask keeps a key)
    random tensors of the dtypes and spans the source names: a boolean mask, a float bias."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(4, 2, 40, 16, generator=g) for _ in range(3))
    pad = torch.rand(4, 40, generator=g) > 0.2
    pb = torch.randn(1, 2, 40, 40, generator=g)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor, pb: torch.Tensor) -> torch.Tensor:
        bias = torch.where(pad[:, None, None, :], pb, torch.finfo(q.dtype).min)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).cos()

    inputs = (q, k, v, pad, pb)
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    request = CompileRequest(graph=capture_graph(gm, list(inputs)).spec, options=CompileOptions(allow_tf32=True))
    art = compile_request(request)
    out = autotune_artifact(art, request, "cpu", timer=lambda c, f: 0.0 if getattr(c, "block_n", 0) == 32 else 1.0)
    (info,) = [k for k in out.manifest.kernels if is_template_kernel(k.name)]
    assert "bias_buffers=bool:" in out.blobs[info.source.digest].decode()
    assert info.tuning is not None and not info.tuning.rejected and info.constexprs["BLOCK_N"] == 32
    (got,) = load_plan(out)(list(inputs))
    torch.testing.assert_close(got, fn(*inputs), atol=1e-5, rtol=1e-5)

"""Pooling lowerings vs eager: max_pool2d_with_indices (values and indices), its backward, avg_pool2d
and its backward; fp32 and bf16; no extern call for any of them."""

from __future__ import annotations

import pytest
import torch

from tests.compiler_core.helpers import check

aten = torch.ops.aten

# (kernel, stride, padding, ceil_mode): ResNet's stem pool, a plain 2x2, overlapping windows
# with ceil_mode, a non-square window.
GEOMETRIES = [((3, 3), (2, 2), (1, 1), False), ((2, 2), (2, 2), (0, 0), False),
              ((3, 3), (2, 2), (0, 0), True), ((3, 2), (1, 2), (1, 0), False)]


def _x(dtype: torch.dtype, shape=(2, 3, 9, 8)) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k,s,p,ceil", GEOMETRIES)
def test_max_pool2d_with_indices_matches_eager(k, s, p, ceil, dtype) -> None:
    x = _x(dtype)
    art = check(lambda t: aten.max_pool2d_with_indices(t, k, s, p, 1, ceil), x, decompose=False)
    assert art.manifest.stats.nodes_extern == 0
    assert art.manifest.stats.kernels == 1  # values and indices from one kernel


def test_max_pool2d_indices_on_ties_nans_and_3d_inputs() -> None:
    x = torch.zeros(2, 6, 6)
    x[0, 1, 1] = float("nan")
    x[1] = float("-inf")
    x[1, 4, 5] = 1.0
    art = check(lambda t: aten.max_pool2d_with_indices(t, [3, 3], [2, 2], [1, 1]), x, decompose=False)
    assert art.manifest.stats.nodes_extern == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k,s,p,ceil", GEOMETRIES)
def test_max_pool2d_backward_matches_eager(k, s, p, ceil, dtype) -> None:
    x = _x(dtype)
    out, idx = aten.max_pool2d_with_indices(x, k, s, p, 1, ceil)
    g = torch.randn(out.shape).to(dtype)
    art = check(lambda gg, t, i: aten.max_pool2d_with_indices_backward(gg, t, k, s, p, [1, 1], ceil, i),
                g, x, idx, decompose=False, **({} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}))
    assert art.manifest.stats.nodes_extern == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k,s,p,ceil", GEOMETRIES)
@pytest.mark.parametrize("count_include_pad,divisor", [(True, None), (False, None), (True, 5)])
def test_avg_pool2d_and_backward_match_eager(k, s, p, ceil, count_include_pad, divisor, dtype) -> None:
    x = _x(dtype)
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    art = check(lambda t: aten.avg_pool2d(t, k, s, p, ceil, count_include_pad, divisor), x, decompose=False, **tol)
    assert art.manifest.stats.nodes_extern == 0
    out = aten.avg_pool2d(x, k, s, p, ceil, count_include_pad, divisor)
    g = torch.randn(out.shape).to(dtype)
    art = check(lambda gg, t: aten.avg_pool2d_backward(gg, t, k, s, p, ceil, count_include_pad, divisor),
                g, x, decompose=False, **tol)
    assert art.manifest.stats.nodes_extern == 0


def test_max_pool2d_backward_of_channels_last_gradients() -> None:
    """A channels-last input (a conv net's layout decision) gives a channels-last input gradient."""
    x = _x(torch.float32, (2, 4, 8, 8)).to(memory_format=torch.channels_last)
    out, idx = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    g = torch.randn(out.shape).to(memory_format=torch.channels_last)
    art = check(lambda gg, t, i: aten.max_pool2d_with_indices_backward(gg, t, [3, 3], [2, 2], [1, 1], [1, 1],
                                                                       False, i), g, x, idx, decompose=False)
    assert art.manifest.stats.nodes_extern == 0


def test_a_channels_last_avg_pool_walks_its_output_in_memory_order() -> None:
    """timm's ResNet-50d shortcut pool (2x2, ceil_mode, no padding counted) of a channels-last map:
    an unrolled pointwise kernel that stores at its flat index (as a window reduction it walked
    its outputs in NCHW order, each thread reading and writing a channel apart); a window larger
    than the unrolling bound is still a reduction, and both match eager."""
    x = _x(torch.bfloat16, (2, 16, 9, 8)).to(memory_format=torch.channels_last)
    art = check(lambda t: aten.avg_pool2d(t, [2, 2], [2, 2], [0, 0], True, False), x, decompose=False,
                atol=2e-2, rtol=2e-2)
    (info,) = art.manifest.kernels
    source = art.blobs[info.source.digest].decode()
    assert info.name.startswith("fxcc_pw_") and "tl.store(out_ptr0 + (xindex)" in source
    big = check(lambda t: aten.avg_pool2d(t.float(), [6, 5], [1, 1]), x, decompose=False)
    assert [k.name[:9] for k in big.manifest.kernels].count("fxcc_red_") == 1

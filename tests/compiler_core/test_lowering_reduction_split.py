"""Split reductions (lowering/reduction.py's occupancy rule): the two stages match eager in the
interpreter, and at ResNet-18's batch-norm sizes a CUDA target's stages fill the GPU with
coalesced loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.compiler_core import target
from fxcc.compiler_core.build import cuda_build_unavailable
from fxcc.compiler_core.lowering.reduction import COLUMN_CHUNK_MIN, ROW_CHUNK_MIN, _split_factor
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, GraphSpec, Target
from tests.compiler_core.helpers import build_for_sm90, check, kernel_steps

# The interpreter's reductions split as a 2-SM GPU's would: a few programs fill it, so rows of a
# few thousand elements split (the interpreter has no occupancy model of its own).
TINY_GPU_SMS = 2


@pytest.fixture
def tiny_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    caps = target.capabilities("interpret")
    monkeypatch.setitem(target._CAPABILITIES, "interpret", dataclasses.replace(caps, sm_count=TINY_GPU_SMS))


def channels_last(*sizes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*sizes).to(dtype).contiguous(memory_format=torch.channels_last)


# (name, reduction, input): columns read a channels-last tensor over (N, H, W), rows a contiguous
# one over its last dim; 1103 and 9001 are prime, so no split divides them (the last chunk is short).
CASES = {
    "column_sum": (lambda x: x.sum((0, 2, 3)), lambda dt: channels_last(1, 24, 1103, 1, dtype=dt)),
    "column_mean": (lambda x: x.mean((0, 2, 3), keepdim=True), lambda dt: channels_last(3, 16, 23, 17, dtype=dt)),
    "column_var": (lambda x: x.var((0, 2, 3)), lambda dt: channels_last(1, 16, 1103, 1, dtype=dt)),
    "column_max": (lambda x: x.amax((0, 2, 3)), lambda dt: channels_last(1, 8, 1103, 1, dtype=dt)),
    "column_min": (lambda x: x.amin((0, 2, 3)), lambda dt: channels_last(1, 8, 1103, 1, dtype=dt)),
    "row_sum": (lambda x: x.sum(-1), lambda dt: torch.randn(3, 9001).to(dt)),
    "row_mean": (lambda x: x.mean(-1), lambda dt: torch.randn(2, 8192).to(dt)),
    "row_var": (lambda x: torch.var_mean(x, -1), lambda dt: torch.randn(2, 9001).to(dt)),
    "row_max": (lambda x: x.amax(-1), lambda dt: torch.randn(3, 9001).to(dt)),
    "row_min": (lambda x: x.amin(-1), lambda dt: torch.randn(3, 9001).to(dt)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_split_reductions_match_eager(tiny_gpu: None, name: str, dtype: torch.dtype) -> None:
    fn, make = CASES[name]
    torch.manual_seed(0)
    x = make(dtype)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    art = check(fn, x, **tol)
    reductions = [s for s in kernel_steps(art) if len([a for a in s.args if a.kind == "int"]) > 1]
    assert len(reductions) >= 2  # both stages of each split reduction


def test_a_batch_norm_training_step_matches_eager_when_split(tiny_gpu: None) -> None:
    """Forward and backward of a channels-last batch norm (statistics and the backward's sums split)."""
    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph
    from fxcc.client.runtime import load_plan
    from fxcc.compiler_core.pipeline import compile_request
    from fxcc.compiler_core.wire import CompileRequest

    torch.manual_seed(0)
    x, w, b = channels_last(4, 16, 19, 17), torch.rand(16) + 0.5, torch.randn(16)
    grad = channels_last(4, 16, 19, 17)
    inputs = [x, w, b, grad]
    with torch.enable_grad():
        gm = make_fx(bn_step, decomposition_table=decomposition_table())(*inputs)
    art = compile_request(CompileRequest(graph=capture_graph(gm, inputs).spec))
    got = load_plan(art)(inputs)
    for g, want in zip(got, bn_step(*inputs), strict=True):
        torch.testing.assert_close(g, want, atol=1e-4, rtol=1e-4)
    assert len(kernel_steps(art)) >= 6


def bn_step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    with torch.enable_grad():
        y = F.relu(F.batch_norm(x, None, None, w, b, training=True))
        return (y.detach(), *torch.autograd.grad(y, (x, w, b), grad))


def test_the_interpreter_keeps_the_few_outputs_rule() -> None:
    """No occupancy model: rows split only when a few outputs reduce very long rows."""
    x = channels_last(1, 24, 1103, 1)
    art = check(lambda a: a.sum((0, 2, 3)), x, atol=1e-4, rtol=1e-4)
    assert len(kernel_steps(art)) == 1


@pytest.mark.parametrize("outputs,rnumel,column,want", [
    (128, 32 * 28 * 28, True, "split"),  # ResNet-18 layer2's batch norm: 2 column programs
    (64, 32 * 112 * 112, True, "split"),  # the stem's
    (512, 32 * 7 * 7, True, "split"),  # layer4's
    (128 * 512, 32 * 28 * 28, True, None),  # enough column programs already (1024)
    (512, 2 * COLUMN_CHUNK_MIN - 1, True, None),  # rows too short to split
    (8, 256, True, None),  # rows a persistent tile holds (and fuses the work around)
    (4, 1 << 20, False, "split"),  # a few long rows
    (1000, 1 << 20, False, None),  # a row per program fills the GPU
    (4, 2 * ROW_CHUNK_MIN - 1, False, None),
])
def test_split_factor_fills_the_gpu(outputs: int, rnumel: int, column: bool, want: str | None) -> None:
    split = _split_factor(outputs, rnumel, column, 132)
    if want is None:
        assert split is None
        return
    assert split is not None and 2 <= split <= 256
    assert -(-rnumel // split) >= (COLUMN_CHUNK_MIN if column else ROW_CHUNK_MIN)


@pytest.fixture(scope="module")
def layer2_bn_spec() -> GraphSpec:
    """A channels-last batch norm's training step (forward and backward) at ResNet-18 layer2's
    sizes (batch 32, 128 channels, 28×28), its inputs on a (fake) CUDA device."""
    from bench.reduction_shapes import on_cuda
    from fxcc.client.backend import decomposition_table
    from fxcc.client.capture import capture_graph

    torch.manual_seed(0)
    inputs = [channels_last(32, 128, 28, 28), torch.rand(128) + 0.5, torch.randn(128), channels_last(32, 128, 28, 28)]
    with torch.enable_grad():
        gm = make_fx(bn_step, decomposition_table=decomposition_table())(*inputs)
    return on_cuda(capture_graph(gm, inputs).spec)


@pytest.fixture(scope="module")
def resnet_layer2_bn(layer2_bn_spec: GraphSpec) -> list[dict]:
    """The reduction launches of that step compiled for sm_90 (bench.reduction_shapes' rows)."""
    from bench.reduction_shapes import reduction_rows

    return reduction_rows(layer2_bn_spec)


def test_batch_norm_reductions_fill_the_gpu_with_coalesced_loads(resnet_layer2_bn: list[dict]) -> None:
    """Every launch reducing the 32×28×28 rows of a channels-last activation is split into at least
    a wave of programs on the H200's 132 SMs (column tiles), each tile row reading 256 contiguous bytes with
    adjacent lanes 4 bytes apart; the second stages reduce at most 256 partials per channel.
    Before: 16 programs of an 8×128 tile (32 contiguous bytes a row) looping 196 times; and four
    first stages (sum, squared deviations, the backward's two sums) where two read x and dy once."""
    rows = resnet_layer2_bn
    first = [r for r in rows if r["xnumel"] > 128]  # (chunk, channel) programs over the activation
    second = [r for r in rows if r["xnumel"] == 128]  # per channel
    # the forward's statistics (one Welford reduction) and the backward's two sums (siblings, one kernel)
    assert len(first) == 2
    for r in first:
        assert r["xnumel"] % 128 == 0 and r["xnumel"] * r["rnumel"] >= 32 * 128 * 28 * 28, r
        assert r["column"] and r["programs"] >= 132, r
        assert r["lane_bytes"] == 4 and r["run_bytes"] >= 256, r
    assert second and all(r["rnumel"] <= 256 for r in second)


@pytest.mark.skipif(cuda_build_unavailable() is not None, reason="cannot cross-compile for CUDA here")
def test_split_kernels_build_for_sm90(layer2_bn_spec: GraphSpec, tmp_path: Path) -> None:
    """Both stages (the first with its short last chunk masked) cross-compile to sm_90 cubins, in a
    fresh process without TRITON_INTERPRET, as a CPU worker builds."""
    cuda = CompileOptions(target=Target(kind="cuda", arch=90), allow_tf32=True)
    kernels = build_for_sm90(CompileRequest(graph=layer2_bn_spec, options=cuda), tmp_path)
    assert sum(name.startswith("fxcc_red_") for name, _, _ in kernels) >= 4
    for name, error, built in kernels:
        assert error is None and built, (name, error)


def test_sibling_split_reductions_share_their_stages(tiny_gpu: None) -> None:
    """A batch-norm backward's two sums over one channels-last activation: both first stages in one
    kernel (g loaded once), both second stages in another."""
    torch.manual_seed(0)
    g, x = channels_last(1, 16, 1103, 1), channels_last(1, 16, 1103, 1)
    art = check(lambda a, b: (a.sum((0, 2, 3)), (a * b).sum((0, 2, 3))), g, x, atol=1e-4, rtol=1e-4)
    assert len(kernel_steps(art)) == 2
    first = next(art.blobs[k.source.digest].decode() for k in art.manifest.kernels
                 if "for roffset" in art.blobs[k.source.digest].decode())
    assert first.count("tl.load(") == 2 and first.count("tl.store(") == 2

"""The cuda target's source for masked and indirect loads and the newer pointwise/reduction
lowerings cross-compiles to sm_90 cubins (no GPU needed; the GPU tests check the numbers)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.compiler_core.build import build_artifact, cuda_build_unavailable
from fxcc.compiler_core.compile import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target

_reason = cuda_build_unavailable()
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"cannot cross-compile for CUDA: {_reason}")

X = torch.randn(6, 8)
CASES = {
    "cat_pad": (lambda p: torch.cat([F.pad(p, (1, 2)), p[:, :3].sin()], 1), [X]),
    "index": (lambda p, q: p[q] + p[:, q].sum(), [X, torch.tensor([0, 3, -1])]),
    "gather_embedding": (lambda p, q: torch.gather(p, 1, q) + F.embedding(q, p.t()).sum(-1),
                         [X, torch.randint(0, 8, (6, 4))]),
    "pointwise": (lambda p: torch.remainder(p, 1.5) + torch.div(p, 0.7, rounding_mode="floor") + p.sign()
                  + p.isnan() + torch.fmax(p, p.flip(0)) + p.abs() ** p + torch.round(p), [X]),
    "reductions": (lambda p: (p.argmax(1), p.max(0), (p > 0).any(1), p.cumsum(1),
                              torch.linalg.vector_norm(p, 3, dim=1)), [X]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_new_lowerings_build_for_sm90(name):
    fn, inputs = CASES[name]
    gm = make_fx(fn, decomposition_table=core_aten_decompositions())(*inputs)
    request = CompileRequest(graph=capture_graph(gm, inputs).spec,
                             options=CompileOptions(target=Target(kind="cuda", arch=90)))
    art = compile_request(request)
    assert art.manifest.stats.nodes_extern == 0 and art.manifest.kernels
    built = build_artifact(art, request, 90)
    for k in built.manifest.kernels:
        assert "sm_90.error" not in k.metadata, k.metadata["sm_90.error"]
        assert "sm_90" in k.binaries

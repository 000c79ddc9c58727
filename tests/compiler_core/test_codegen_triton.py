"""Triton codegen: deterministic source, simple index math, per-target spellings."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxcc.client.capture import capture_graph
from fxcc.compiler_core.compile import compile_request
from fxcc.compiler_core.wire import CompileOptions, CompileRequest, Target
from tests.compiler_core.helpers import compile_fn


def sources(art) -> list[str]:
    return [art.blobs[k.source.digest].decode() for k in art.manifest.kernels]


def test_same_graph_gives_byte_identical_source():
    x = torch.randn(16, 8)
    a = compile_fn(lambda x: torch.cos(torch.sin(x)) + 1, x)
    b = compile_fn(lambda x: torch.cos(torch.sin(x)) + 1, x)
    assert sources(a) == sources(b)
    assert [k.source.digest for k in a.manifest.kernels] == [k.source.digest for k in b.manifest.kernels]
    assert a.manifest.plan == b.manifest.plan


def test_contiguous_loads_index_by_xindex():
    (src,) = sources(compile_fn(lambda x: torch.cos(torch.sin(x)), torch.randn(64, 32)))
    assert "tl.load(in_ptr0 + (xindex), xmask)" in src
    assert "tl.store(out_ptr0 + (xindex), " in src
    assert src.count("@triton.jit\ndef fxcc_pw_") == 1
    assert "import triton\nimport triton.language as tl\n" in src


def test_broadcast_and_transpose_index_math():
    (src,) = sources(compile_fn(lambda x, b: x.t().contiguous() + b, torch.randn(8, 4), torch.randn(8)))
    assert "(xindex % 8)" in src and "(xindex // 8)" in src
    # eager keeps x.t()'s layout for x.t() + b: walk memory order, broadcast b along it
    (src,) = sources(compile_fn(lambda x, b: x.t() + b, torch.randn(8, 4), torch.randn(8)))
    assert "tl.load(in_ptr1 + ((xindex // 4)), xmask)" in src


def test_low_precision_computes_in_fp32_and_casts_on_store():
    (src,) = sources(compile_fn(lambda x: x.sin() * 2, torch.randn(8, 4).half()))
    assert ".to(tl.float32)" in src and ".to(tl.float16)" in src


def test_cuda_target_uses_libdevice():
    x = torch.randn(8, 4)
    gm = make_fx(lambda x: torch.tanh(x).log1p())(x)
    req = CompileRequest(graph=capture_graph(gm, [x]).spec,
                         options=CompileOptions(target=Target(kind="cuda", arch=90)))
    art = compile_request(req)
    (src,) = sources(art)
    assert "libdevice.tanh(" in src and "libdevice.log1p(" in src
    assert "from triton.language.extra import libdevice" in src


def test_transposed_outputs_are_written_in_memory_order():
    x = torch.randn(16, 8).t()  # eager keeps this layout for pointwise results
    (src,) = sources(compile_fn(lambda a: a.sin() * 2, x))
    assert "tl.load(in_ptr0 + (xindex), xmask)" in src
    assert "tl.store(out_ptr0 + (xindex), " in src


def test_masks_of_sizes_every_tile_covers_are_constants_others_compare():
    from tests.compiler_core.helpers import check

    def ln(x):
        return torch.nn.functional.layer_norm(torch.nn.functional.gelu(x), x.shape[-1:])

    even = torch.randn(4096, 64)  # rows a multiple of the widest XBLOCK, a power-of-two row
    (src,) = sources(check(ln, even))
    assert "xmask = tl.full([XBLOCK, 1], True, tl.int1)" in src
    assert "rmask = tl.full([1, RBLOCK], True, tl.int1)" in src
    assert "< xnumel" not in src and "< rnumel" not in src
    (src,) = sources(check(lambda x: x.sin() * 2, torch.randn(8192)))
    assert "xmask = tl.full([XBLOCK], True, tl.int1)" in src and "< xnumel" not in src

    # rows and lengths some config's tile overhangs keep their compares, and still match eager
    for shape in ((4095, 64), (4096, 48), (2048, 64)):
        (src,) = sources(check(ln, torch.randn(*shape)))
        assert ("xmask = xindex < xnumel" in src) == (shape[0] % 4096 != 0), shape
        assert ("rmask = rindex < rnumel" in src) == (shape[1] != 64), shape
    (src,) = sources(check(lambda x: x.sin() * 2, torch.randn(100)))
    assert "xmask = xindex < xnumel" in src

"""Indexing lowerings vs eager: constant_pad_nd and cat (masked loads), index_select, gather,
embedding and index.Tensor (indirect loads), with negative indices, empty dims, non-contiguous
inputs and bf16; out-of-range indices never read outside the buffer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fxcc.compiler_core.codegen.triton import TritonHandler
from fxcc.compiler_core.ir.ops import ops, use_handler
from fxcc.compiler_core.scheduler import Kernel
from tests.compiler_core.helpers import check, kernel_steps

torch.manual_seed(0)
DTYPES = [torch.float32, torch.bfloat16]


def native(art) -> bool:
    return art.manifest.stats.nodes_extern == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_pad_nd(dtype):
    x = torch.randn(3, 4, 5, dtype=dtype)
    assert native(check(lambda p: F.pad(p, (1, 2)), x))
    assert native(check(lambda p: F.pad(p, (2, 0, 0, 3, 1, 1), value=-1.5), x))
    assert native(check(lambda p: F.pad(p, (-1, 2, 1, -2)) * 2, x))  # negative pads crop
    assert native(check(lambda p: F.pad(p.transpose(0, 2), (1, 1)), x))  # non-contiguous
    assert native(check(lambda p: F.pad(p.sin(), (3, 3)) + 1, x))  # fused producer, read masked
    assert native(check(lambda p: F.pad(p, (1, 1)), torch.randn(2, 0, dtype=dtype)))
    assert native(check(lambda p: F.pad(p, (1, 1), value=1.0), torch.randint(0, 9, (3, 4))))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat(dtype):
    a, b = torch.randn(2, 5, dtype=dtype), torch.randn(3, 5, dtype=dtype)
    assert native(check(lambda p, q: torch.cat([p, q, p]), a, b))
    assert native(check(lambda p, q: torch.cat([p.t(), q.t().cos()], 1) * 2, a, b))
    empty = torch.randn(0, dtype=dtype)
    assert native(check(lambda p, e: torch.cat([p, p[:, :0], e], 1), a, empty))  # empty inputs
    assert native(check(lambda p: torch.stack([p, p * 2, p + 1], -1), a))
    assert native(check(lambda p, q: torch.cat([p, q.to(torch.int32)]), a, torch.randint(0, 5, (1, 5))))
    # one kernel: each input is read through its own masked load
    art = check(lambda p, q: torch.cat([p + 1, q * 2]).relu(), a, b)
    assert native(art) and len(kernel_steps(art)) == 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select_gather_embedding(dtype):
    x = torch.randn(5, 6, dtype=dtype)
    i = torch.tensor([0, 5, 3, 3])
    assert native(check(lambda p, q: torch.index_select(p, 1, q) * 2, x, i))
    assert native(check(lambda p, q: torch.index_select(p.t(), 0, q), x, i))
    assert native(check(lambda p, q: torch.index_select(p, 0, q), x, torch.tensor(2)))  # 0-d index
    assert native(check(lambda p, q: torch.index_select(p, 0, q), x, torch.tensor([], dtype=torch.int64)))
    g = torch.randint(0, 6, (5, 4))
    assert native(check(lambda p, q: torch.gather(p, 1, q), x, g))
    assert native(check(lambda p, q: torch.gather(p, 0, q), x, torch.randint(0, 5, (2, 6), dtype=torch.int32)))
    w, ids = torch.randn(10, 3, dtype=dtype), torch.tensor([[0, 9, 4], [2, 2, 1]])
    assert native(check(lambda p, q: F.embedding(q, p) + 1, w, ids))
    assert native(check(lambda p, q: F.embedding(q, p, padding_idx=0), w, ids))


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_tensor(dtype):
    x = torch.randn(5, 3, 6, dtype=dtype)
    i, j = torch.tensor([0, -1, 3, -5]), torch.tensor([[1], [-6]])
    assert native(check(lambda p, q: p[q], x, i))  # negative indices wrap
    assert native(check(lambda p, q: p[:, :, q], x, i))
    assert native(check(lambda p, q, r: p[q, :, r], x, i, j))  # not adjacent: index dims lead
    assert native(check(lambda p, q, r: p[:, q.clamp(0, 2), r], x, i, j))  # adjacent: in place
    assert native(check(lambda p, q: p.transpose(0, 2)[q] * 2, x, i))
    assert native(check(lambda p: F.interpolate(p, scale_factor=2, mode="nearest"), x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_hot_scatter_fuses_with_its_reader(dtype):
    x = torch.randn(6, 7, dtype=dtype)
    target = torch.tensor([0, 6, 3, 3, 1, 5])
    # a cross-entropy's backward: scatter(zeros, 1, target[:, None], -1) times a weight, one kernel
    art = check(lambda p, t: torch.zeros_like(p).scatter(1, t[:, None], -1.0) * p.exp(), x, target)
    assert native(art) and len(kernel_steps(art)) == 1
    assert native(check(lambda p, t: p.scatter(0, t[None, :6].clamp(0, 5), 2.5), x[:, :6], target))  # dim 0
    assert native(check(lambda p, t: p.t().scatter(-1, t[:, None].int(), 0), x.t(), target))  # int32, strided
    # several elements per slice: aten's scatter, same values
    art = check(lambda p, t: p.scatter(1, t.view(3, 2), 1.0), x[:3], target)
    assert not native(art)


def test_boolean_and_float_indices_are_not_lowered():
    from fxcc.compiler_core.errors import UnsupportedOp
    from fxcc.compiler_core.ir.nodes import Buffer, StridedView
    from fxcc.compiler_core.lowering.indexing import _index_loader
    for dtype in (torch.bool, torch.uint8, torch.float32):
        mask = StridedView(Buffer("m", dtype, (5,), (1,), "input"), (5,), (1,))
        with pytest.raises(UnsupportedOp):
            _index_loader(mask, (5,))


def test_an_empty_result_reads_no_index():
    art = check(lambda p, q: torch.index_select(p, 1, q), torch.randn(2, 0), torch.tensor([], dtype=torch.int64))
    assert native(art)  # an empty result reads nothing
    with pytest.raises((IndexError, RuntimeError)):
        torch.index_select(torch.randn(2, 0), 1, torch.tensor([0]))  # eager rejects it


def test_out_of_range_indices_are_masked_in_the_generated_load():
    kernel = Kernel(16, 1)
    h = TritonHandler("interpret", kernel, {"idx": "in_ptr0", "x": "in_ptr1"},
                      {"idx": torch.int64, "x": torch.float32})
    import sympy

    from fxcc.compiler_core.sizevars import XINDEX
    with use_handler(h):
        sym = ops.indirect_indexing(ops.load("idx", XINDEX), 7)
        ops.load("x", sym * 3 + 1)
    load = next(line for line in h.lines if "in_ptr1" in line)
    mask = h.indirect_masks[sym]
    assert mask in load and "xmask" in load
    assert isinstance(sym, sympy.Symbol)


def test_an_out_of_range_index_reads_zero_not_memory():
    from tests.compiler_core.helpers import compile_fn, run
    x = torch.randn(4, 3)
    art = compile_fn(lambda p, q: p[q] + 1, x, torch.tensor([0, 1]))
    assert native(art)
    (got,) = run(art, x, torch.tensor([-1, 4]))  # eager raises on 4; the kernel masks it
    torch.testing.assert_close(got[0], x[-1] + 1)
    torch.testing.assert_close(got[1], torch.ones(3))


def test_masked_loads_carry_the_mask():
    kernel = Kernel(16, 1)
    h = TritonHandler("interpret", kernel, {"x": "in_ptr0"}, {"x": torch.float32})
    from fxcc.compiler_core.sizevars import XINDEX
    with use_handler(h):
        cond = ops.lt(ops.index_expr(XINDEX, torch.int64), ops.constant(4, torch.int64))
        ops.masked(cond, lambda: ops.load("x", XINDEX - 4), 0.0)
    load = next(line for line in h.lines if "in_ptr0" in line)
    assert cond.text in load


def test_costly_cat_inputs_are_computed_once_not_per_piece():
    def heavy(p):
        for _ in range(6):
            p = (p * 1.1).sin()
        return p
    x = torch.randn(4, 5)
    art = check(lambda p: torch.cat([heavy(p), p, heavy(p * 2)], 1), x)
    assert native(art)
    sources = [art.blobs[k.source.digest].decode().split("def fxcc")[-1] for k in art.manifest.kernels]
    cat = [src for src in sources if "tl.where" in src]
    assert len(cat) == 1 and "tl.sin(" not in cat[0]  # the cat reads the sines from memory
    assert sum(src.count("tl.sin(") for src in sources) == 12  # each sine once

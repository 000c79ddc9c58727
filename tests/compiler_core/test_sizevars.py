"""sizevars: index simplification folds contiguous chains and range-redundant wraps, and renders them."""

import sympy

from fxcc.compiler_core.sizevars import (
    RINDEX,
    XINDEX,
    FloorDiv,
    ModularIndexing,
    contiguous_strides,
    flatten,
    linear_index,
    render_index,
    simplify_index,
    unflatten,
)
from fxcc.compiler_core.symbolic import dense_strides_like


def test_contiguous_load_is_xindex():
    sizes = (3, 4, 5)
    expr = linear_index(unflatten(XINDEX, sizes), contiguous_strides(sizes))
    assert simplify_index(expr, {XINDEX: 60}) == XINDEX


def test_transposed_load_keeps_div_mod():
    expr = simplify_index(linear_index(unflatten(XINDEX, (4, 3)), (1, 4)), {XINDEX: 12})
    assert render_index(expr) == "(xindex // 3) + 4*(xindex % 3)"


def test_broadcast_row():
    idx = unflatten(XINDEX, (6, 7))
    assert simplify_index(linear_index([idx[1]], (1,)), {XINDEX: 42}) == ModularIndexing(XINDEX, 1, 7)


def test_reshape_roundtrip_is_identity():
    sizes_a, sizes_b = (4, 6), (2, 12)
    idx_b = unflatten(XINDEX, sizes_b)
    idx_a = unflatten(flatten(idx_b, sizes_b), sizes_a)
    expr = linear_index(idx_a, contiguous_strides(sizes_a))
    assert simplify_index(expr, {XINDEX: 24}) == XINDEX


def test_row_of_reduction_kernel():
    assert simplify_index(FloorDiv(XINDEX * 64 + RINDEX, 64), {XINDEX: 8, RINDEX: 64}) == XINDEX
    assert FloorDiv(sympy.Integer(17), 4) == 4


def test_dense_strides():
    assert dense_strides_like((3, 4), (1, 3)) == (1, 3)
    assert dense_strides_like((3, 4), (0, 1)) is None
    assert dense_strides_like((3, 4), (8, 1)) is None


def test_floordiv_drops_a_bounded_remainder():
    # (x + 3072*r) // 24576 == r // 8 when x < 3072
    expr = FloorDiv(XINDEX + 3072 * RINDEX, 24576)
    assert simplify_index(expr, {XINDEX: 3072, RINDEX: 4096}) == FloorDiv(RINDEX, 8)
    expr = ModularIndexing(XINDEX + 64 * RINDEX, 64, 5)
    assert simplify_index(expr, {XINDEX: 64, RINDEX: 100}) == ModularIndexing(RINDEX, 1, 5)

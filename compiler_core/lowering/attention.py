"""Lowering of `fxcc.flash_attention`: a template kernel that reads q, k, v where they lie and writes a new buffer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from fxcc.compiler_core.errors import CodegenError, UnsupportedOp
from fxcc.compiler_core.ir.nodes import Buffer, Lazy, StridedView, TensorValue, count_ops, make_loader
from fxcc.compiler_core.ir.ops import CountingHandler, use_handler
from fxcc.compiler_core.ir.templates import AttentionParams, TileBias, tile_symbols
from fxcc.compiler_core.lowering.core import (
    KEEP_LAZY,
    LOWERINGS,
    TemplateKernel,
    current_graph,
    current_node,
    is_view,
    lowering_context,
    node_val,
    realize_for_reading,
    register_lowering,
)
from fxcc.compiler_core.sizevars import contiguous_strides
from fxcc.compiler_core.symbolic import is_symbolic, sizes_of, strides_of
from fxcc.compiler_core.target import ATTENTION_HEAD_DIMS
from fxcc.compiler_core.wire import NodeRef, target_name


def _flash_attention_op() -> Any:
    from fxcc.compiler_core import fxcc_ops

    return fxcc_ops.flash_attention._opoverload


@register_lowering(_flash_attention_op())
def flash_attention(q: TensorValue, k: TensorValue, v: TensorValue, scale: float, is_causal: bool,
                    allow_tf32: bool, heads_outer: bool, bias: TensorValue | None = None) -> StridedView:
    """The template kernel writing a new buffer in the layout the op's fake kernel gives (`heads_outer`).
    A bias is read where it lies, broadcast dims at stride 0 (an expanded mask's base written once)."""
    del heads_outer  # in the node's value's strides
    g = current_graph()
    val = node_val()
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise UnsupportedOp(f"attention template takes no {q.dtype}")
    z, h, q_len, head_dim = q.sizes
    kv_len, value_dim = k.sizes[2], v.sizes[3]
    if is_symbolic(head_dim) or is_symbolic(value_dim) or head_dim not in ATTENTION_HEAD_DIMS or value_dim not in ATTENTION_HEAD_DIMS:
        raise UnsupportedOp(f"attention template takes no head dims {head_dim}, {value_dim}")
    views = [_dense_last(g, t) for t in (q, k, v)]
    out = g.add_buffer(Buffer(g.new_name("attn"), val.dtype, sizes_of(val), strides_of(val), "computed"))
    ints: list[Any] = []
    for t in views:
        ints += [t.offset, *t.strides[:3]]
    bias_dense = False
    tile = _tile_bias(g, (z, h, q_len, kv_len)) if bias is not None else None
    if tile is not None:
        views += tile[1]
    elif bias is not None:
        b = _broadcast_view(g, bias, 7)
        views.append(b)
        b_strides = _broadcast_strides(b, (z, h, q_len, kv_len))
        ints += [b.offset, *b_strides]
        bias_dense = not is_symbolic(b_strides[3]) and int(b_strides[3]) == 1
    ints += [*out.strides[:3], z, h, q_len, kv_len]
    precision = "tf32" if allow_tf32 else "ieee"
    params = AttentionParams(int(head_dim), int(value_dim), bool(is_causal), float(scale), q.dtype, precision,
                             bias is not None, bias_dense)
    if tile is not None:
        params = dataclasses.replace(params, bias_mod=tile[0], bias_buffers=tuple(
            (str(r.dtype).removeprefix("torch."), _span(r)) for r in tile[1]))
    g.program.append(TemplateKernel(
        out.buffer.name, target_name(_flash_attention_op()), [NodeRef(name=t.buffer.name) for t in views],
        params=params, int_args=tuple(ints), sizes={"q_len": q_len, "kv_len": kv_len, "batch_heads": z * h}))
    return out


def _dense_last(g: Any, value: TensorValue) -> StridedView:
    """`value` in memory with a dense innermost dim: where it lies if it has one, else a contiguous copy."""
    if isinstance(value, StridedView) and value.strides[-1] == 1:
        return value
    if isinstance(value, StridedView):
        value = Lazy(value.dtype, value.sizes, make_loader(value))
    return g.realize(value, contiguous_strides(value.sizes))


def _broadcast_view(g: Any, value: TensorValue, position: int) -> StridedView:
    """The bias (argument `position` of the node being lowered) in memory: where it lies, or its
    view's base written once (an expanded mask keeps its stride 0), or written whole."""
    if not value.dtype.is_floating_point:
        raise UnsupportedOp(f"attention template takes no {value.dtype} bias")
    if isinstance(value, StridedView):
        return value
    return realize_for_reading(g, current_node().args[position])


def _broadcast_strides(b: StridedView, full: tuple[Any, ...]) -> list[Any]:
    """The bias's strides over [Z, H, L, S] (it may have fewer dims: aligned right, as broadcasting
    aligns them), 0 where it has size 1 (broadcast, whatever stride its size-1 dim has)."""
    if len(b.sizes) > 4:
        raise UnsupportedOp(f"attention bias of {len(b.sizes)} dims")
    pad = 4 - len(b.sizes)
    sizes, strides = [1] * pad + list(b.sizes), [0] * pad + list(b.strides)
    out: list[Any] = []
    for size, stride, want in zip(sizes, strides, full):
        if isinstance(size, int) and size == 1:
            out.append(0)
        elif size is want or (not is_symbolic(size) and not is_symbolic(want) and int(size) == int(want)) or \
                str(size) == str(want):
            out.append(stride)
        else:
            raise UnsupportedOp(f"attention bias of sizes {list(b.sizes)} does not broadcast to {list(full)}")
    return out


# Note: a bias of [Z, H, L, S] built by one pointwise op from smaller tensors (T5's position bias
# [1, H, L, S] where its padding mask [B, 1, 1, S] keeps a key, else finfo.min; a relative bias
# plus a mask) is computed per tile by the template from those tensors, not written whole: T5's
# encoder at batch 8 wrote a 64-MB mask once for its 6 layers, 8 MB of position bias and 4 KB of
# mask being what it holds. One op only, so a tile costs a few loads and one op per score; the
# tensors it reads are written first where they are computations (the position bias's bucket
# arithmetic, its logarithm included, runs once per element of [1, H, L, S], not per score).
TILE_OPS = frozenset({torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor, torch.ops.aten.mul.Tensor,
                      torch.ops.aten.where.self})
TILE_SHARE = 2  # the tensors a tile reads hold at most 1 / TILE_SHARE of the bias's elements


def bias_on_tiles(node: fx.Node) -> bool:
    """Whether `node` is a bias that every reader computes per tile: one TILE_OPS op of static
    sizes over floating or boolean tensors whose storages hold at most 1 / TILE_SHARE of its
    elements, read only by fxcc's attention templates, as their bias alone."""
    if node.op != "call_function" or node.target not in TILE_OPS or node.kwargs:
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point or val.dim() > 4 \
            or is_symbolic(*sizes_of(val)):
        return False
    stored = 0
    for arg in node.args:
        if isinstance(arg, fx.Node):
            a = arg.meta.get("val")
            if not isinstance(a, torch.Tensor) or not (a.dtype.is_floating_point or a.dtype == torch.bool):
                return False
            stored += _stored_elements(arg)
    if stored * TILE_SHARE > val.numel():
        return False
    op = _flash_attention_op()
    return bool(node.users) and all(
        u.op == "call_function" and u.target is op and len(u.args) == 8 and u.args[7] is node
        and not u.kwargs and node not in u.args[:7] for u in node.users)


def _stored_elements(node: fx.Node) -> int:
    """The elements of the storage `node` views (its base's, through view ops: an expanded mask's
    own), as a static count (a symbolic one counts as too many)."""
    while is_view(node):
        node = node.args[0]
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or is_symbolic(*sizes_of(val)):
        return 1 << 62
    return val.numel()


KEEP_LAZY.append(bias_on_tiles)


def _tile_bias(g: Any, full: tuple[Any, ...]) -> tuple[TileBias, list[StridedView]] | None:
    """The bias of the template being lowered as a per-tile expression and the buffers it reads, or
    None where it is read whole (not bias_on_tiles, symbolic sizes, written already, or an
    expression a tile cannot compute: a load at another index than the tile's, an indirect one)."""
    node = current_node().args[7]
    if not isinstance(node, fx.Node) or not bias_on_tiles(node) or is_symbolic(*full) \
            or isinstance(g.env.get(node), StridedView):
        return None
    args: list[Any] = []
    for arg in node.args:
        if not isinstance(arg, fx.Node):
            args.append(arg)
            continue
        value = g.env[arg]
        if isinstance(value, Lazy) and (value.sizes or count_ops(value).loads):
            value = _written(g, arg, value)
        if isinstance(value, StridedView) and is_symbolic(value.offset, *value.sizes, *value.strides):
            return None
        args.append(value)
    with lowering_context(g, node):
        try:
            value = LOWERINGS[node.target](*args)
        except UnsupportedOp:
            return None
    if not isinstance(value, Lazy) or tuple(value.sizes) != sizes_of(node.meta["val"]):
        return None
    reads = [a for a in args if isinstance(a, StridedView)]
    names = list(dict.fromkeys(r.buffer.name for r in reads))
    views = [max((r for r in reads if r.buffer.name == n), key=_span) for n in names]
    if any(_span(v) >= 1 << 31 for v in views):  # the tile's row and key indices are int32
        return None
    pad = 4 - len(value.sizes)
    symbols = tile_symbols()
    index = tuple(0 if int(size) == 1 else symbols[pad + d] for d, size in enumerate(value.sizes))
    counter = CountingHandler()
    with use_handler(counter):
        value.loader(list(index))
    if counter.indirect or any(name not in names or not index_at.free_symbols <= set(symbols)
                               for name, index_at in counter.loads):
        return None
    tile = TileBias(value.loader, index, tuple((n, g.buffers[n].dtype) for n in names))
    if not _renders(tile, g.target):
        return None
    return tile, views


# Checks that the template's codegen can write a tile bias for a target (it raises CodegenError for an
# op it has no spelling of for a tile): codegen.flex_mods registers its renderer here on import, as
# lowering never imports codegen (tests/test_import_graph.py).
TILE_RENDERERS: list[Callable[[TileBias, str], object]] = []


def _renders(tile: TileBias, target: str) -> bool:
    """Whether the template's codegen can write `tile` for `target`, rendered here as it will be
    there (codegen.attention): where it cannot, the template reads the bias whole rather than the
    compile failing at codegen."""
    try:
        for render in TILE_RENDERERS:
            render(tile, target)
    except CodegenError:
        return False
    return True


def _written(g: Any, node: fx.Node, value: Lazy) -> StridedView:
    """A tensor a tile bias reads, written once for every layer's template: row-major where the
    bias alone reads it (the tile's loads then walk its keys in memory order; T5's position bias,
    a permuted view of its bucket embedding, is [1, H, L, S]), else as realize_for_reading writes
    it (an expanded mask's base, with stride 0 where it broadcasts)."""
    val = node.meta["val"]
    if len(node.users) == 1 and val.numel() == _stored_elements(node):
        g.env[node] = g.realize(value, contiguous_strides(value.sizes))
        return g.env[node]
    return realize_for_reading(g, node)


def _span(view: StridedView) -> int:
    """Elements of the view's storage from its start to its last element, inclusive."""
    return int(view.offset) + sum((int(s) - 1) * int(t) for s, t in zip(view.sizes, view.strides)) + 1

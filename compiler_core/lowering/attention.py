"""Lowering of `fxcc.flash_attention`: a template kernel that reads q, k, v where they lie and writes a new buffer."""

from __future__ import annotations

from typing import Any

import torch

from fxcc.compiler_core.errors import UnsupportedOp
from fxcc.compiler_core.ir.nodes import Buffer, Lazy, StridedView, TensorValue, make_loader
from fxcc.compiler_core.ir.templates import AttentionParams
from fxcc.compiler_core.lowering.core import (
    TemplateKernel,
    current_graph,
    current_node,
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
    if bias is not None:
        b = _broadcast_view(g, bias, 7)
        views.append(b)
        b_strides = _broadcast_strides(b, (z, h, q_len, kv_len))
        ints += [b.offset, *b_strides]
        bias_dense = not is_symbolic(b_strides[3]) and int(b_strides[3]) == 1
    ints += [*out.strides[:3], z, h, q_len, kv_len]
    precision = "tf32" if allow_tf32 else "ieee"
    params = AttentionParams(int(head_dim), int(value_dim), bool(is_causal), float(scale), q.dtype, precision,
                             bias is not None, bias_dense)
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

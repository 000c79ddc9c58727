"""Biases peeled off convolutions and fp32 addmms (CUDA targets): the add fuses into a Triton kernel.

A convolution with a bias runs on cuDNN as the convolution and then aten's own broadcast add over
the whole output (torchvision's ConvNeXt-T on the H200, session 24: 22 `CUDAFunctor_add` launches,
0.25 of its 4.08 ms of device time). An fp32 addmm whose readers are pointwise puts the bias in
cuBLASLt's epilogue, whose kernels ran 5-10% slower than the plain GEMM's (transformers' GPT-2:
2.01 against 1.90 ms of GEMMs, same shapes). As Inductor does (torch/_inductor/kernel/conv.py
"peel off the bias"; fx_passes/post_grad.py `unfuse_bias_add_to_pointwise`):

    convolution(x, w, b, ...)         ->  convolution(x, w, None, ...) + b.view(C, 1, ..., 1)
    addmm(b, m1, m2)  (readers pointwise)  ->  mm(m1, m2) + b

and the add is a pointwise value fused into the kernel that reads the result (a layer norm, a
GELU, a residual add), or a Triton kernel of its own where an extern reads it.

Note: half-precision addmms keep their epilogue (the sum of bias and product rounded once, as
Inductor keeps them); an addmm with alpha or beta other than 1 is left alone; never on the
interpreter target (its convolutions and matmuls are the same aten calls either way).
"""

from __future__ import annotations

import logging

import torch
from torch import fx

from fxcc.compiler_core.passes.edit import GraphEdit, rewrite_each

log = logging.getLogger("fxcc.passes.bias")
aten = torch.ops.aten

_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})


def peel_biases(gm: fx.GraphModule, target: str) -> bool:
    """Every conv bias, and every fp32 addmm bias read only pointwise, as an add after the product; whether any."""
    if target != "cuda":
        return False
    found = [n for n in gm.graph.nodes if peelable_conv(n) or peelable_addmm(n)]
    if not found:
        return False
    peeled = rewrite_each(gm, found, _peeled, log, "a bias")
    log.info("%d bias(es) peeled off convolutions and matmuls", peeled)
    return peeled > 0


def _tensor(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def peelable_conv(node: fx.Node) -> bool:
    """convolution(x, w, b, ...) with a bias of its output's dtype and at least one output channel."""
    if node.op != "call_function" or node.target is not aten.convolution.default or len(node.args) < 3:
        return False
    bias, out = _tensor(node.args[2]), _tensor(node)
    return (bias is not None and out is not None and out.dim() >= 3 and bias.dim() == 1
            and bias.dtype == out.dtype and out.is_floating_point() and isinstance(out.shape[1], int)
            and out.shape[1] > 0 and bias.shape[0] == out.shape[1])


def peelable_addmm(node: fx.Node) -> bool:
    """addmm(b, m1, m2) in fp32, alpha and beta 1, whose readers (through views) are all pointwise."""
    if node.op != "call_function" or node.target is not aten.addmm.default or len(node.args) != 3:
        return False
    if node.kwargs.get("alpha", 1) != 1 or node.kwargs.get("beta", 1) != 1:
        return False
    bias, out = _tensor(node.args[0]), _tensor(node)
    if bias is None or out is None or out.dtype != torch.float32 or bias.dtype != torch.float32:
        return False
    return bool(node.users) and all(_pointwise_use(u) for u in node.users)


def _pointwise_use(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target in _VIEWS:
        return bool(node.users) and all(_pointwise_use(u) for u in node.users)
    tags = getattr(node.target, "tags", ())
    return torch.Tag.pointwise in tags


def _peeled(edit: GraphEdit, node: fx.Node) -> fx.Node:
    return _conv_then_add(edit, node) if node.target is aten.convolution.default else _mm_then_add(edit, node)


def _conv_then_add(edit: GraphEdit, node: fx.Node) -> fx.Node:
    args = list(node.args)
    bias = args[2]
    args[2] = None
    conv = edit.add(node, aten.convolution.default, tuple(args), dict(node.kwargs), name=f"{node.name}_nobias")
    channels = int(_tensor(node).shape[1])
    shape = [channels] + [1] * (_tensor(node).dim() - 2)
    view = edit.add(node, aten.view.default, (bias, shape), name=f"{node.name}_bias")
    return edit.add(node, aten.add.Tensor, (conv, view), name=node.name)


def _mm_then_add(edit: GraphEdit, node: fx.Node) -> fx.Node:
    bias, m1, m2 = node.args
    mm = edit.add(node, aten.mm.default, (m1, m2), name=f"{node.name}_mm")
    return edit.add(node, aten.add.Tensor, (mm, bias), name=node.name)

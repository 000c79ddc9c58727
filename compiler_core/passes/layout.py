"""Channels-last convolutions (CUDA targets), forward and backward: conv operands in NHWC, graph outputs as before.

cuDNN's fast convolution kernels on sm80+ work in NHWC. Given NCHW tensors, cuDNN transposes the
input to NHWC and the result back around every call (ResNet-50 at batch 32 on the H200: about
0.6 ms of 3.9 ms in `nchwToNhwc` / `nhwcToNchw` kernels). This pass rewrites the graph so that
every convolution reads channels-last operands:

    x_cl = clone(x, memory_format=channels_last)     # once per tensor, however many convs read it
    y = convolution(x_cl, w_cl, ...)                 # cuDNN returns y channels-last too

and lets the layout flow as eager's would: BatchNorm, ReLU and residual adds of channels-last
tensors give channels-last results (TensorIterator keeps its operands' layout), so the next
conv's input is already channels-last and its copy is dropped. What is left are the one-time
conversions of the graph inputs and weights (a 1×1 weight is already channels-last).

Note: fxcc writes every value in eager's layout as the FakeTensors give it (a realized buffer,
an extern call's operand, a graph output), and fuses a copy into the kernel that computes its
input. So the pass only has to make the FakeTensor strides what it wants: the producers of a
conv input then write NHWC directly, in the kernel they were fused into anyway.

Note: a CPU-only torch fakes a CUDA convolution as contiguous whatever its operands' layout (its
conv backend choice sees no cuDNN), while cuDNN returns channels-last. The plan reads an extern
result with its FakeTensor's strides (the runtime re-lays a result that differs, at the cost of
a copy), so the pass re-derives each convolution's layout as cuDNN picks it
(`cudnn_layout`), and every node after it: a CPU worker and a GPU worker give one plan.

Note: the graph's outputs keep the strides they had without the pass (a copy back where they
changed), except those the spec marks of free layout (`free_layout_outputs`): a training
forward's tensors saved for its backward; and a backward's conv weight gradients, which leave in
their parameter's layout (`WEIGHT_GRADIENTS_AS_PARAMETERS`) whatever cuDNN gave. The client reports the plan's strides for them
(Plan.output_strides) to AOTAutograd, which lays the backward's inputs out so: the saved
activations cross from forward to backward channels-last, and the backward's conv backwards
(convolution_backward, re-derived as cuDNN lays out its gradients) read channels-last
gradients, inputs and weights. Whether a graph goes channels-last follows Inductor's
`decide_layout_opt`: by measured ratios per conv class in inference, and in training unless a
conv is grouped (more than one channel per group) or has many more input than output channels.
"""


from __future__ import annotations

import logging
import math
import operator
from typing import Any

import torch
from torch import fx
from torch._prims_common import suggest_memory_format

from fxcc.compiler_core.graph import keep_wire
from fxcc.compiler_core.passes.edit import fresh_name

log = logging.getLogger("fxcc.passes.layout")
aten = torch.ops.aten

CHANNELS_LAST = "channels_last"
CONTIGUOUS = "contiguous_format"
_FORMATS = {CHANNELS_LAST: torch.channels_last, CONTIGUOUS: torch.contiguous_format}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Outputs copied back into their old layout: an inference graph has one or a few (a detection
# net's feature maps).
MAX_RESTORED_OUTPUTS = 4
# Ops whose values depend on their input's memory layout, not only on its elements.
LAYOUT_READERS = frozenset({aten.as_strided.default, aten.as_strided_scatter.default, aten.view.dtype})
CONV_BACKWARD = aten.convolution_backward.default
# Targets and devices the pass lays out for (tests add the CPU interpreter's, to run the result).
TARGETS = frozenset({"cuda"})
DEVICES = frozenset({"cuda"})
# A backward returns each conv weight's gradient in its parameter's layout (a copy of cuDNN's
# channels-last result, in a kernel of the plan), so AccumulateGrad, which copies a gradient laid
# out unlike its parameter (one launch more each on the host), takes it as it is.
WEIGHT_GRADIENTS_AS_PARAMETERS = True
# Views that need strides compatible with their sizes: their 4-D inputs stay contiguous.
STRICT_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default})
MATMULS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default})


def channels_last_convs(gm: fx.GraphModule, target: str) -> bool:
    """`gm` with convolutions on channels-last operands, where that pays; whether it was rewritten.

    Static shapes only: a layout picked for one size is not known to pay for another."""
    if target not in TARGETS or gm.meta.get("fxcc_syms") is not None:
        return False
    free = gm.meta.get("fxcc_free_outputs", frozenset())  # the spec's free_layout_outputs
    before = len(gm.graph.nodes)
    try:
        graph = lay_out(gm, free) if wants_channels_last(gm, free) else None
    except Exception as e:  # noqa: BLE001 - an unsure rewrite is no rewrite
        log.warning("channels-last pass skipped: %s: %s", type(e).__name__, e)
        return False
    if graph is None:
        return False
    gm.graph = graph  # the module's code made again when something calls it
    log.info("channels-last pass: %d conv(s), %d copy node(s) added",
             sum(1 for n in graph.nodes if _is_conv(n) or _is_conv_backward(n)), len(graph.nodes) - before)
    return True


# ---------------------------------------------------------------- when


def wants_channels_last(gm: fx.GraphModule, free: frozenset[int] = frozenset()) -> bool:
    """Whether the graph is a CUDA conv net whose convs (forward or backward) cuDNN runs faster
    channels-last: every conv a plain 2-D one (float, not transposed), channels-last paying by
    Inductor's measured ratios (`pays_channels_last`), no op that reads memory layout or writes
    a tensor (but AOTAutograd's write-backs into inputs), no conv operand returned except as an
    output of `free` layout (a training forward's saved activations, which its backward then
    reads channels-last), and, with a single conv, most of the matmul work in it."""
    convs = [n for n in gm.graph.nodes if _is_conv(n) or _is_conv_backward(n)]
    training = bool(free) or any(_is_conv_backward(n) for n in convs)
    if not convs or not all(_plain_conv(n) for n in convs) or not pays_channels_last(convs, training):
        return False
    if len(gm.graph.nodes) >= MAX_NODES_PER_CONV * len(convs):
        return False  # a few convs in a large graph (a vision transformer's patch embedding)
    if any(_reads_layout(n) or (_mutates(n) and not _input_write(n)) for n in _calls(gm)):
        return False  # other bytes under a new layout; a copy read after its source is written
    operands = {a for n in convs for a in _operands(n)}
    if operands.intersection(a for i, a in enumerate(_output_args(gm)) if i not in free):
        return False  # a forward returning its convs' operands for a backward that reads them as traced
    if len({_conv_of(n) for n in convs}) > 1:
        # Note: as Inductor decides (no matmul rule): in a net of convs and matmuls (ConvNeXt's
        # depthwise convs between MLPs, a tenth of its FLOPs) NHWC is also the layout the
        # matmuls read ([N·H·W, C] rows), so the permutes around them cost nothing, its layer
        # norms reduce along rows, and a depthwise conv goes to cuDNN's NHWC kernels.
        return True
    conv_flops = sum(_conv_flops(n) for n in convs)
    mm_flops = sum(_mm_flops(n) for n in _calls(gm) if n.target in MATMULS)
    return conv_flops >= mm_flops  # one conv (a stem, a patch embedding): when it is most of the work


# Time channels-last over NCHW per class of conv, as Inductor measured it over torchbench's convs
# (torch/_inductor/graph.py decide_layout_opt): grouped convs with more than one input channel per
# group are slower channels-last, every other class faster (depthwise ones too: channels-last
# sends them to cuDNN instead of aten's NCHW depthwise kernel, 0.79 against 1.84 ms in timm's
# EfficientNet-B0 on the H200).
CHANNELS_LAST_RATIO = {"grouped": 1.358, "small": 0.783, "in_out": 0.725, "default": 0.823}
MAX_NODES_PER_CONV = 300


def conv_class(node: fx.Node) -> str:
    """grouped (more than one input channel per group), small (≤ 64 channels in and out),
    in_out (at least twice as many input as output channels, k > 1), or default."""
    w = _operands(node)[-1].meta["val"]
    if _groups(node) > 1 and w.shape[1] > 1:
        return "grouped"
    if w.shape[0] <= 64 and w.shape[1] <= 64:
        return "small"
    if w.shape[0] * 2 <= w.shape[1] and w.shape[2] > 1:
        return "in_out"
    return "default"


def pays_channels_last(convs: list[fx.Node], training: bool = False) -> bool:
    """In inference, whether the convs' FLOPs weighted by CHANNELS_LAST_RATIO come to no more than
    unweighted; in training (Inductor's rule there), whether no conv is grouped or in_out."""
    if training:
        return not any(conv_class(n) in ("grouped", "in_out") for n in convs)
    flops = [(_conv_flops(n), CHANNELS_LAST_RATIO[conv_class(n)]) for n in convs]
    return sum(f * r for f, r in flops) <= sum(f for f, _ in flops)


def _reads_layout(node: fx.Node) -> bool:
    """Whether `node` reads its input's memory by a layout the pass may change.

    Note: a [N, C, 1, 1] value of its own storage (not a view: a slice of a feature map lies in
    that map's storage, which the pass re-lays) lies at n·C + c in either layout (a global
    pool's result, which ConvNeXt's head restrides with as_strided); graph inputs keep theirs.
    """
    if node.target not in LAYOUT_READERS:
        return False
    src = node.args[0] if node.args else None
    if not isinstance(src, fx.Node):
        return True
    if src.op == "placeholder":
        return False
    val = src.meta.get("val")
    own = (isinstance(val, torch.Tensor) and src.op == "call_function" and not _is_view_op(src)
           and not val._is_view() and val.storage_offset() == 0)
    return not (own and val.dim() == 4 and val.shape[2] == 1 and val.shape[3] == 1)


def _is_view_op(node: fx.Node) -> bool:
    """Whether `node`'s op returns a view of an input (its schema's result aliases one)."""
    schema = getattr(node.target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def _conv_of(node: fx.Node) -> Any:
    """The weight a conv or conv backward uses: one conv's forward and backward count once."""
    return _operands(node)[-1]


def _operands(node: fx.Node) -> tuple[Any, ...]:
    """The tensors a conv reads: (input, weight); a conv backward's (grad_output, input, weight)."""
    return tuple(node.args[:3]) if _is_conv_backward(node) else tuple(node.args[:2])


def _groups(node: fx.Node) -> int:
    return node.args[9] if _is_conv_backward(node) else node.args[8]


def _plain_conv(node: fx.Node) -> bool:
    """A conv (or conv backward) cuDNN takes in NHWC: 4-D, float, on CUDA, not transposed (grouped
    and depthwise ones included: with a channels-last operand aten sends a depthwise conv to
    cuDNN, which returns channels-last as for any other)."""
    if len(node.args) != (11 if _is_conv_backward(node) else 9) or node.kwargs:
        return False
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in _operands(node)]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return False
    x, w = vals[-2], vals[-1]
    transposed = node.args[7] if _is_conv_backward(node) else node.args[6]
    return (all(v.dim() == 4 and v.dtype == x.dtype for v in vals) and x.dtype in DTYPES
            and x.device.type in DEVICES and w.device.type == x.device.type and not transposed)


def _conv_flops(node: fx.Node) -> int:
    """A conv's multiply-adds ×2; a conv backward's for its input and weight gradients."""
    if _is_conv_backward(node):
        grad, w = node.args[0].meta["val"], node.args[2].meta["val"]
        return 4 * grad.numel() * math.prod(w.shape[1:])
    out, w = node.meta["val"], node.args[1].meta["val"]
    return 2 * out.numel() * math.prod(w.shape[1:])


def _mm_flops(node: fx.Node) -> int:
    out = node.meta.get("val")
    a = node.args[1] if node.target in (aten.addmm.default, aten.baddbmm.default) else node.args[0]
    av = a.meta.get("val") if isinstance(a, fx.Node) else None
    if not isinstance(out, torch.Tensor) or not isinstance(av, torch.Tensor):
        return 0
    return 2 * out.numel() * av.shape[-1]


# ---------------------------------------------------------------- how


def lay_out(gm: fx.GraphModule, free: frozenset[int] = frozenset()) -> fx.Graph | None:
    """The rewritten graph, or None where the outputs would need too many copies back.

    One walk in graph order, re-deriving each node's FakeTensor on the way: a conv operand not
    channels-last by then is read through a copy (one per tensor), a strict view's 4-D input not
    contiguous likewise; at the end, each output whose strides changed is copied back, but those
    of `free` layout (returned as they come). The new graph shares the old one's FakeTensorMode,
    and a node the walk left as it was keeps its wire form (graph.keep_wire)."""
    before = cudnn_vals(gm)
    walk = Rewrite(gm)
    for node in _calls(gm):
        walk.add(node)
    outputs: list[Any] = []
    restored = 0
    for i, arg in enumerate(_output_args(gm)):
        old = before.get(arg) if isinstance(arg, fx.Node) else None
        if not isinstance(old, torch.Tensor) or i in free:
            outputs.append(walk.env[arg] if isinstance(arg, fx.Node) else arg)
            continue
        new = walk.env[arg]
        weight = weight_of_gradient(arg) if WEIGHT_GRADIENTS_AS_PARAMETERS else None
        if weight is not None:
            # Note: not counted against MAX_RESTORED_OUTPUTS: AccumulateGrad would copy it anyway.
            want = weight.meta["val"]
            if not _same_strides(want, new.meta["val"]):
                new = walk.copy(new, _format_of(want), "fxgrad")
            outputs.append(new)
            continue
        if not _same_strides(old, new.meta["val"]):  # strides of size-1 dims aside (a 1×1 weight's gradient)
            fmt = _format_of(old)
            if fmt is None:
                return None  # an output in a layout no clone gives back
            new = walk.copy(new, fmt, "fxout")
            restored += 1
        if not _same_strides(old, new.meta["val"]):
            raise RuntimeError(f"output {arg.name} would come out with strides "
                               f"{tuple(new.meta['val'].stride())}, not {tuple(old.stride())}")
        outputs.append(new)
    if restored > MAX_RESTORED_OUTPUTS:
        log.debug("channels-last pass skipped: %d outputs would need copying back", restored)
        return None
    return walk.finish(outputs)


def weight_of_gradient(node: fx.Node) -> fx.Node | None:
    """The graph input (a parameter) whose gradient output `node` is, where it is a conv backward's
    weight gradient of a weight the graph takes as it is, laid out as a clone can give back."""
    if node.op != "call_function" or node.target is not operator.getitem or node.args[1] != 1:
        return None
    conv = node.args[0]
    if not (isinstance(conv, fx.Node) and _is_conv_backward(conv)):
        return None
    weight = conv.args[2]
    if not isinstance(weight, fx.Node) or weight.op != "placeholder":
        return None
    val = weight.meta.get("val")
    return weight if isinstance(val, torch.Tensor) and _format_of(val) is not None else None


class Rewrite:
    """The new graph, built node by node: each original node (its operands swapped for their
    copies where it needs them) after those copies. Nodes keep their names."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.mode = _fake_mode(gm)
        self.graph = fx.Graph()
        self.env: dict[fx.Node, fx.Node] = {}
        self.made: dict[tuple[fx.Node, str], fx.Node] = {}
        self.taken = {n.name for n in gm.graph.nodes}
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                new = self.graph.placeholder(node.name)
                new.meta["val"] = node.meta["val"]
                self.env[node] = new

    def add(self, node: fx.Node) -> None:
        args = list(fx.node.map_arg(node.args, self.env.__getitem__))
        mapped = list(args)
        if _is_conv(node) or _is_conv_backward(node):
            for i in range(len(_operands(node))):
                args[i] = self.operand(args[i], CHANNELS_LAST, "fxcl")
        elif node.target in STRICT_VIEWS and _is_4d_intermediate(node.args[0]):
            args[0] = self.operand(args[0], CONTIGUOUS, "fxnchw")
        kwargs = fx.node.map_arg(node.kwargs, self.env.__getitem__)
        new = self.env[node] = self.call(node.target, tuple(args), kwargs, node.name)
        if all(a is b for a, b in zip(args, mapped)):
            keep_wire(new, node)

    def operand(self, arg: Any, fmt: str, stem: str) -> Any:
        """`arg` (a node of the new graph) as a reader gets it: itself where it is laid out as
        `fmt`, else its copy."""
        if not isinstance(arg, fx.Node) or _has_format(arg.meta["val"], fmt):
            return arg
        return self.copy(arg, fmt, stem)

    def copy(self, node: fx.Node, fmt: str, stem: str) -> fx.Node:
        """A clone of `node` (of the new graph) in memory format `fmt`: one per node and format."""
        key = (node, fmt)
        if key not in self.made:
            name = fresh_name(self.taken, f"{node.name}_{stem}")
            self.made[key] = self.call(aten.clone.default, (node,), {"memory_format": _FORMATS[fmt]}, name)
        return self.made[key]

    def call(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> fx.Node:
        """A node of the new graph with its FakeTensor (a conv's in cuDNN's layout)."""
        new = self.graph.call_function(target, args, kwargs)
        new.name = name
        vals = fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
        new.meta["val"] = _fake_run(self.mode, target, *vals)
        return new

    def finish(self, outputs: list[Any]) -> fx.Graph:
        self.graph.output(tuple(outputs))
        return self.graph


def cudnn_vals(gm: fx.GraphModule) -> dict[fx.Node, Any]:
    """Each node's FakeTensor as eager on a CUDA device gives it: convs in cuDNN's layout, and the
    nodes after a conv re-derived where its layout changed (only on a CPU-only torch, and only
    where a conv operand is channels-last: then eager's output strides are these)."""
    mode = _fake_mode(gm)
    vals: dict[fx.Node, Any] = {n: n.meta.get("val") for n in gm.graph.nodes}
    changed: set[fx.Node] = set()
    for node in _calls(gm):
        val = vals[node]
        if changed.intersection(node.all_input_nodes):
            val = _fake_run(mode, node.target, *fx.node.map_arg((node.args, node.kwargs), vals.__getitem__))
        elif _is_conv(node) or _is_conv_backward(node):
            val = _cudnn_result(mode, node.target, val, fx.node.map_arg(node.args, vals.__getitem__))
        if not _same_meta(val, vals[node]):
            vals[node] = val
            changed.add(node)
    return vals


def _fake_run(mode: Any, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`target` on FakeTensors; a conv's result in the layout cuDNN gives it."""
    with mode:
        val = target(*args, **kwargs)
    return _cudnn_result(mode, target, val, args)


def _cudnn_result(mode: Any, target: Any, val: Any, args: Any) -> Any:
    """A conv's result, or a conv backward's input and weight gradients, in cuDNN's layout."""
    if target is aten.convolution.default:
        return _in_cudnn_layout(mode, val, args[0], args[1])
    if target is CONV_BACKWARD:
        x, w = args[1], args[2]
        return tuple(_in_cudnn_layout(mode, v, x, w) if k < 2 and isinstance(v, torch.Tensor) else v
                     for k, v in enumerate(val))
    return val


def _in_cudnn_layout(mode: Any, val: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    fmt = _FORMATS[cudnn_layout(x, w)]
    if val.is_contiguous(memory_format=fmt) and suggest_memory_format(val) == fmt:
        return val
    with mode:
        return aten.clone.default(val, memory_format=fmt)


def cudnn_layout(x: torch.Tensor, w: torch.Tensor) -> str:
    """The memory format cuDNN gives a 2-D conv's result: channels-last when either operand
    suggests it (aten's `cudnn_conv_suggest_memory_format`), except in float64."""
    if x.dtype == torch.float64 or w.dim() != 4:
        return CONTIGUOUS
    cl = suggest_memory_format(x) == torch.channels_last or suggest_memory_format(w) == torch.channels_last
    return CHANNELS_LAST if cl else CONTIGUOUS


# ---------------------------------------------------------------- helpers


def _calls(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def _output_args(gm: fx.GraphModule) -> tuple[Any, ...]:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return tuple(out.args[0])


def _fake_mode(gm: fx.GraphModule) -> Any:
    for n in gm.graph.nodes:
        mode = getattr(n.meta.get("val"), "fake_mode", None)
        if mode is not None:
            return mode
    raise ValueError("no FakeTensor in the graph")


def _mutates(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def _is_conv(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is aten.convolution.default


def _is_conv_backward(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is CONV_BACKWARD


def _input_write(node: fx.Node) -> bool:
    """AOTAutograd's write-back of a mutated input: copy_(placeholder, value), read by nothing."""
    dst = node.args[0] if node.args else None
    return (node.target is aten.copy_.default and isinstance(dst, fx.Node) and dst.op == "placeholder"
            and not node.users)


def _is_4d_intermediate(arg: Any) -> bool:
    if not isinstance(arg, fx.Node) or arg.op == "placeholder":
        return False
    val = arg.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() == 4


def _has_format(val: Any, fmt: str) -> bool:
    """Whether `val` is laid out as `fmt` lays out its sizes (strides of size-1 dims aside)."""
    return isinstance(val, torch.Tensor) and val.is_contiguous(memory_format=_FORMATS[fmt])


def _format_of(val: torch.Tensor) -> str | None:
    """The memory format a clone gives `val`'s layout back with, if any."""
    if _has_format(val, CONTIGUOUS):
        return CONTIGUOUS
    if val.dim() == 4 and _has_format(val, CHANNELS_LAST):
        return CHANNELS_LAST
    return None


def _same_strides(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and all(n == 1 or x == y for n, x, y in zip(a.shape, a.stride(), b.stride()))


def _same_meta(a: Any, b: Any) -> bool:
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_meta(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
                and a.storage_offset() == b.storage_offset())
    return a is b or a == b

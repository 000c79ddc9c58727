"""Channels-last convolutions (CUDA targets): conv inputs and weights in NHWC, graph outputs as before.

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
changed). Training graphs are left alone: a backward has convolution_backward, and a forward
returns its convs' operands (saved for the backward), whose copies back would cost more than
the pass gains. Channels-last training would need the saved tensors to cross from forward to
backward in NHWC, which the backward's captured input strides do not allow.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch._prims_common import suggest_memory_format

from compiler_core.graph import rebuild_graph
from compiler_core.wire import Arg, GraphSpec, ListArg, MemoryFormatArg, Node, NodeRef

log = logging.getLogger("fxcc.passes.layout")
aten = torch.ops.aten

CHANNELS_LAST = "channels_last"
CONTIGUOUS = "contiguous_format"
_FORMATS = {CHANNELS_LAST: torch.channels_last, CONTIGUOUS: torch.contiguous_format}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Outputs copied back into their old layout: an inference graph has one or a few (a detection
# net's feature maps); a training forward returns every saved activation.
MAX_RESTORED_OUTPUTS = 4
# Ops whose values depend on their input's memory layout, not only on its elements.
LAYOUT_READERS = frozenset({aten.as_strided.default, aten.as_strided_scatter.default,
                            aten.view.dtype, aten.convolution_backward.default})
# Views that need strides compatible with their sizes: their 4-D inputs stay contiguous.
STRICT_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default})
MATMULS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default})


def channels_last_convs(gm: fx.GraphModule, spec: GraphSpec, target: str) -> tuple[fx.GraphModule, GraphSpec]:
    """`gm` and `spec` with convolutions on channels-last operands, where that pays (else unchanged)."""
    if target != "cuda" or spec.symbols:
        return gm, spec
    try:
        found = lay_out(gm, spec) if wants_channels_last(gm) else None
    except Exception as e:  # noqa: BLE001 - an unsure rewrite is no rewrite
        log.warning("channels-last pass skipped: %s: %s", type(e).__name__, e)
        return gm, spec
    if found is None:
        return gm, spec
    new_gm, new_spec = found
    log.info("channels-last pass: %d conv(s), %d copy node(s) added", _count(new_gm, _is_conv),
             len(new_spec.nodes) - len(spec.nodes))
    return new_gm, new_spec


# ---------------------------------------------------------------- when


def wants_channels_last(gm: fx.GraphModule) -> bool:
    """Whether the graph is a CUDA conv net in inference whose convs cuDNN runs channels-last:
    every conv a plain 2-D one (float, not transposed, not grouped), most of the matmul work in
    convs, no op that reads memory layout or belongs to a backward, no conv operand returned."""
    convs = [n for n in gm.graph.nodes if _is_conv(n)]
    if not convs or not all(_plain_conv(n) for n in convs):
        return False
    if any(n.op == "call_function" and n.target in LAYOUT_READERS for n in gm.graph.nodes):
        return False
    operands = {a for n in convs for a in n.args[:2]}
    if operands.intersection(_output_nodes(gm)):
        return False  # a training forward: it returns its convs' operands for the backward
    conv_flops = sum(_conv_flops(n) for n in convs)
    mm_flops = sum(_mm_flops(n) for n in gm.graph.nodes if n.op == "call_function" and n.target in MATMULS)
    return conv_flops >= mm_flops


def _output_nodes(gm: fx.GraphModule) -> set[fx.Node]:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return set(out.all_input_nodes)


def _is_conv(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is aten.convolution.default


def _plain_conv(node: fx.Node) -> bool:
    """A conv cuDNN takes in NHWC: 4-D, float, on CUDA, static sizes, not transposed, one group.

    Note: grouped and depthwise convs go to other kernels on some shapes (and are slower
    channels-last in cuDNN); a graph with one is left as it is, so that no conv meets an
    operand laid out otherwise than the plan's FakeTensors say."""
    x, w = (a.meta.get("val") if isinstance(a, fx.Node) else None for a in node.args[:2])
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        return False
    transposed, groups = node.args[6], node.args[8]
    return (x.dim() == 4 and w.dim() == 4 and x.dtype in DTYPES and w.dtype == x.dtype
            and x.device.type == "cuda" and not transposed and groups == 1
            and all(isinstance(s, int) for s in (*x.shape, *w.shape)))


def _conv_flops(node: fx.Node) -> int:
    out, w = node.meta["val"], node.args[1].meta["val"]
    return 2 * out.numel() * math.prod(w.shape[1:])


def _mm_flops(node: fx.Node) -> int:
    out = node.meta.get("val")
    a = node.args[1] if node.target in (aten.addmm.default, aten.baddbmm.default) else node.args[0]
    av = a.meta.get("val") if isinstance(a, fx.Node) else None
    if not isinstance(out, torch.Tensor) or not isinstance(av, torch.Tensor):
        return 0
    try:
        return 2 * int(out.numel()) * int(av.shape[-1])
    except TypeError:  # a symbolic size
        return 0


# ---------------------------------------------------------------- how


@dataclass
class Copies:
    """The copy nodes the pass adds: name → (source name, memory format)."""

    nodes: dict[str, tuple[str, str]] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)

    def name(self, stem: str) -> str:
        base, i = stem[:120], 0
        new = base
        while new in self.taken:
            i += 1
            new = f"{base}{i}"
        self.taken.add(new)
        return new


def lay_out(gm: fx.GraphModule, spec: GraphSpec) -> tuple[fx.GraphModule, GraphSpec] | None:
    """The rewritten graph, or None where it would need too many copies back to the old layout.

    Three steps: a copy before every conv operand (and a contiguous one before each strict 4-D
    view); then, with the layouts that gives, drop the copies whose input is laid out that way
    already and copy back the outputs whose strides changed; then check the outputs."""
    copies = Copies(taken={p.name for p in spec.placeholders} | {n.name for n in spec.nodes})
    first = insert_copies(spec, gm, copies)
    derived = derive(first)
    needless = {c for c, (src, fmt) in copies.nodes.items() if _has_format(_val(derived, src), fmt)}
    restored = {}
    for out in _refs(spec.outputs):
        old, new = _val(gm, out), _val(derived, out)
        if isinstance(old, torch.Tensor) and tuple(old.stride()) != tuple(new.stride()):
            fmt = _format_of(old)
            if fmt is None:
                return None  # an output in a layout a clone cannot give back
            restored[out] = fmt
    if len(restored) > MAX_RESTORED_OUTPUTS:
        log.debug("channels-last pass skipped: %d outputs would need copying back", len(restored))
        return None
    final = finish(first, copies, needless, restored)
    new_gm = derive(final)
    for out_old, out_new in zip(_refs(spec.outputs), _refs(final.outputs)):
        old, new = _val(gm, out_old), _val(new_gm, out_new)
        if isinstance(old, torch.Tensor) and not _same_strides(old, new):
            raise RuntimeError(f"output {out_old} comes out with strides {tuple(new.stride())}, "
                               f"not {tuple(old.stride())}")
    return new_gm, final


def insert_copies(spec: GraphSpec, gm: fx.GraphModule, copies: Copies) -> GraphSpec:
    """`spec` with each conv's input and weight read through one channels-last copy per tensor,
    and each strict view of a 4-D intermediate through a contiguous copy."""
    fx_nodes = {n.name: n for n in gm.graph.nodes}
    made: dict[tuple[str, str], str] = {}
    nodes: list[Node] = []

    def through(arg: Arg, fmt: str, stem: str) -> Arg:
        if not isinstance(arg, NodeRef):
            return arg
        key = (arg.name, fmt)
        if key not in made:
            made[key] = copies.name(f"{arg.name}_{stem}")
            copies.nodes[made[key]] = key
            nodes.append(_clone(made[key], arg.name, fmt))
        return NodeRef(name=made[key])

    for w in spec.nodes:
        node = fx_nodes[w.name]
        args = list(w.args)
        if _is_conv(node):
            args[0] = through(args[0], CHANNELS_LAST, "fxcl")
            args[1] = through(args[1], CHANNELS_LAST, "fxcl")
        elif node.target in STRICT_VIEWS and _is_4d_intermediate(node.args[0]):
            args[0] = through(args[0], CONTIGUOUS, "fxnchw")
        nodes.append(w.model_copy(update={"args": args}) if args != list(w.args) else w)
    return spec.model_copy(update={"nodes": nodes})


def finish(spec: GraphSpec, copies: Copies, needless: set[str], restored: dict[str, str]) -> GraphSpec:
    """`spec` without the needless copies (their readers read the source) and with the changed
    outputs copied back to their old layout."""
    swap = {c: copies.nodes[c][0] for c in needless}
    nodes = [_swap_refs(w, swap) for w in spec.nodes if w.name not in needless]
    back: dict[str, str] = {}
    for out, fmt in restored.items():
        back[out] = copies.name(f"{out}_fxout")
        nodes.append(_clone(back[out], out, fmt))
    outputs = [NodeRef(name=back.get(a.name, a.name)) if isinstance(a, NodeRef) else a for a in spec.outputs]
    return spec.model_copy(update={"nodes": nodes, "outputs": outputs})


def derive(spec: GraphSpec) -> fx.GraphModule:
    """`spec` rebuilt (FakeTensors for every node), convolutions laid out as cuDNN lays them out."""
    gm = rebuild_graph(spec)
    relayout_convs(gm)
    return gm


def relayout_convs(gm: fx.GraphModule) -> None:
    """Each conv's FakeTensor in the layout cuDNN gives it, and the nodes after it re-derived."""
    changed: set[fx.Node] = set()
    mode = None
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        val = node.meta["val"]
        if changed.intersection(node.all_input_nodes):
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
            with mode:
                val = node.target(*args, **kwargs)
        if _is_conv(node):
            mode = mode or val.fake_mode
            fmt = cudnn_layout(node.args[0].meta["val"], node.args[1].meta["val"])
            if not _has_format(val, fmt):
                with mode:
                    val = aten.clone.default(val, memory_format=_FORMATS[fmt])
        if val is not node.meta["val"] and not _same_meta(val, node.meta["val"]):
            node.meta["val"] = val
            changed.add(node)


def cudnn_layout(x: torch.Tensor, w: torch.Tensor) -> str:
    """The memory format cuDNN gives a 2-D conv's result: channels-last when either operand
    suggests it (aten's `cudnn_conv_suggest_memory_format`), except in float64."""
    if x.dtype == torch.float64 or w.dim() != 4:
        return CONTIGUOUS
    cl = suggest_memory_format(x) == torch.channels_last or suggest_memory_format(w) == torch.channels_last
    return CHANNELS_LAST if cl else CONTIGUOUS


# ---------------------------------------------------------------- helpers


def _clone(name: str, src: str, fmt: str) -> Node:
    return Node(name=name, target="aten.clone.default", args=[NodeRef(name=src)],
                kwargs={"memory_format": MemoryFormatArg(value=fmt)})


def _swap_refs(w: Node, swap: dict[str, str]) -> Node:
    def fix(a: Arg) -> Arg:
        if isinstance(a, NodeRef) and a.name in swap:
            return NodeRef(name=swap[a.name])
        if isinstance(a, ListArg):
            return ListArg(items=[fix(x) for x in a.items])
        return a
    args, kwargs = [fix(a) for a in w.args], {k: fix(v) for k, v in w.kwargs.items()}
    if args == list(w.args) and kwargs == dict(w.kwargs):
        return w
    return w.model_copy(update={"args": args, "kwargs": kwargs})


def _refs(outputs: Sequence[Arg]) -> list[str]:
    return [a.name for a in outputs if isinstance(a, NodeRef)]


def _val(gm: fx.GraphModule, name: str) -> Any:
    for n in gm.graph.nodes:
        if n.name == name:
            return n.meta.get("val")
    raise KeyError(name)


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
    return a == b


def _count(gm: fx.GraphModule, pred: Callable[[fx.Node], bool]) -> int:
    return sum(1 for n in gm.graph.nodes if pred(n))


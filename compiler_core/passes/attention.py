"""Attention without materialized scores: `bmm → scale → softmax → bmm` becomes one SDPA extern call.

Note: the chain `softmax(q @ kᵀ * c) @ v` writes an N×L×S scores tensor and an equally large
softmax; an aten scaled-dot-product-attention kernel computes the same result with neither. The
pass rewrites the FX graph in place (the new nodes' FakeTensors derived from their arguments', the
graph's wire form derived from it after the passes: graph.wire_graph) and only where the result is
the same:
- every node of the chain has exactly one user, so neither the scores nor the softmax is a graph
  output or read elsewhere. This is also what keeps training graphs whole: AOTAutograd's forward
  saves the softmax for the backward (a graph output), and a backward reads it twice;
- no mask: SDPA returns 0 for a row whose every score is masked to -inf, where eager's softmax
  returns NaN, and a mask's values are not known at compile time;
- the op is picked by target, never by the device at run time: the composite
  `aten.scaled_dot_product_attention` chooses a kernel when it runs, and the kernels lay their
  output out differently, while the plan reads an extern result with the strides its FakeTensor
  had at compile time. `_scaled_dot_product_efficient_attention` (CUDA) and
  `_scaled_dot_product_flash_attention_for_cpu` have meta kernels that give their real layouts;
  the pass fires only for shapes, strides and dtypes those kernels take.

fxcc's own flash-attention kernel (codegen.attention) replaces the aten kernel where the request
allows it: fp32 with TF32 allowed (`CompileOptions.allow_tf32`), static power-of-two head dims
(compiler_core.target.ATTENTION_HEAD_DIMS), on CUDA or the interpreter. The chain then becomes one
`fxcc.flash_attention` node, which the lowering turns into a template kernel. Direct SDPA calls
that AOTAutograd left in the graph (F.scaled_dot_product_attention: aten's memory-efficient op on
CUDA, the CPU flash op in the interpreter) become that node too, where only their attention
output is read, with no dropout; a float mask (attn_bias on CUDA, attn_mask on the CPU: what a
model's boolean mask becomes in AOTAutograd's graph, 0 or -inf) is read by the kernel as an
additive bias of its own strides. Both aten kernels give zeros for a row whose every score is -inf
(torch's math path gives them too since its _safe_softmax), and so does the template: unlike the
bmm-softmax-bmm chain, whose eager softmax gives NaN there, so a chain with a mask is left alone.
Torch's own math path is the exception (AOTAutograd's decomposition of an SDPA call for which no
fused kernel was chosen at trace time: transformers' BERT on CUDA, with its boolean padding mask):
`_safe_softmax(q·√c @ (kᵀ·√c) + mask) @ v` over [Z, H] batches, whose `_safe_softmax` gives zeros
for a row masked whole, as the template does. Where the template applies, that chain becomes the
template with the mask as its bias (`find_masked_math`), its scores never written.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import operator
from dataclasses import dataclass

import torch
from torch import fx

from fxcc.compiler_core.passes.edit import GraphEdit
from fxcc.compiler_core.target import ATTENTION_DTYPES, ATTENTION_HEAD_DIMS
from fxcc.compiler_core.wire import resolve_target

log = logging.getLogger("fxcc.passes.attention")

aten = torch.ops.aten

CUDA_OP = "aten._scaled_dot_product_efficient_attention.default"
CPU_OP = "aten._scaled_dot_product_flash_attention_for_cpu.default"
TEMPLATE_OP = "fxcc.flash_attention.default"
# Direct SDPA calls the template may replace (fp32 only, so aten's flash op, fp16/bf16, never),
# and the target whose graphs have them.
DIRECT_SDPA = {aten._scaled_dot_product_efficient_attention.default: "cuda",
               aten._scaled_dot_product_flash_attention_for_cpu.default: "interpret"}
# Note: the memory-efficient kernel takes bfloat16 only on sm80 and later, and the pass sees the
# target's kind, not its arch: bfloat16 attention on CUDA stays unfused until it does.
CUDA_DTYPES = (torch.float32, torch.float16)
CPU_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# Note: the memory-efficient kernel wants head dims that are a multiple of its GEMM alignment
# (4 in fp32, 8 in fp16/bf16 on sm80+) and launches batch × heads blocks on a grid axis of at
# most 65535; the CPU kernel wants one head dim for q, k and v.
CUDA_HEAD_ALIGN = 8
MAX_HEADS = 65535

_RESHAPES = frozenset({aten.view.default, aten.reshape.default, aten._unsafe_view.default})
_SCALES = {aten.mul.Tensor: False, aten.mul.Scalar: False, aten.div.Tensor: True, aten.div.Scalar: True}


@dataclass(frozen=True)
class AttentionMatch:
    """One `softmax(q @ kt * scale) @ v` chain of 3-D bmms; `removed` dies with the rewrite."""

    out: fx.Node  # the second bmm, [N, L, Ev]; its name is kept for the SDPA result
    q: fx.Node  # [N, L, E]
    kt: fx.Node  # [N, E, S]
    v: fx.Node  # [N, S, Ev]
    scale: float
    removed: tuple[fx.Node, ...]
    template: bool = False  # fxcc's kernel, not aten's


@dataclass(frozen=True)
class SdpaMatch:
    """A direct SDPA call whose only use is its attention output (`out`, a getitem 0)."""

    call: fx.Node
    out: fx.Node
    q: fx.Node  # [Z, H, L, E]
    k: fx.Node  # [Z, H, S, E]
    v: fx.Node  # [Z, H, S, Ev]
    scale: float
    causal: bool
    heads_outer: bool  # the op's output is laid out [Z, H, L, Ev] (else [Z, L, H, Ev])
    dead: tuple[fx.Node, ...] = ()  # getitems of its other results, which nothing reads
    bias: fx.Node | None = None  # its float mask (attn_bias / attn_mask), added to the scaled scores


@dataclass(frozen=True)
class MaskedMatch:
    """Torch's math SDPA with an additive mask over [Z, H] batches (see module Note); `removed`
    dies with the rewrite."""

    out: fx.Node  # the second bmm's result viewed as [Z, H, L, Ev]: the template's output replaces it
    q: fx.Node  # [Z, H, L, E]
    k: fx.Node | None  # [Z, H, S, E] where the graph has it, else None: a transpose of `kt` is added
    kt: fx.Node  # [Z, H, E, S]
    v: fx.Node  # [Z, H, S, Ev]
    scale: float
    bias: fx.Node  # broadcastable to [Z, H, L, S], q's dtype
    removed: tuple[fx.Node, ...]


def fuse_attention(gm: fx.GraphModule, target: str, allow_tf32: bool = False) -> bool:
    """Each matched attention chain of `gm` replaced in place by one SDPA call, or fxcc's kernel
    where it applies, and direct SDPA calls by fxcc's kernel where it applies; whether any was.

    Note: on a symbolic graph the match may ask something of the sizes that holds only for some of
    them (batch × heads at most MAX_HEADS): the ShapeEnv, the compilation's, records it as a guard,
    which the plan keeps, so other sizes compile a variant of their own (passes/edit.py).
    """
    try:
        matches = find_attention(gm, target, allow_tf32)
        direct = find_direct_sdpa(gm, target, allow_tf32)
    except Exception as e:  # noqa: BLE001 - correctness first: an unsure rewrite is no rewrite
        log.warning("attention pass skipped: %s: %s", type(e).__name__, e)
        return False
    try:
        masked = find_masked_math(gm, target, allow_tf32)
    except Exception as e:  # noqa: BLE001 - the other matches stand
        log.warning("attention pass: masked math chains skipped: %s: %s", type(e).__name__, e)
        masked = []
    if not matches and not direct and not masked:
        return False
    edit = GraphEdit(gm)
    done = {"chain": 0, "template": 0, "direct": 0, "masked": 0}
    for m in [*matches, *direct, *masked]:
        try:
            if isinstance(m, AttentionMatch):
                edit.replace(m.out, sdpa_node(edit, m, target), erase=m.removed)
                done["template" if m.template else "chain"] += 1
            elif isinstance(m, MaskedMatch):
                edit.replace(m.out, masked_node(edit, m), erase=m.removed)
                done["masked"] += 1
            else:
                edit.replace(m.out, template_node(edit, m), erase=(m.call, *m.dead))
                done["direct"] += 1
        except Exception as e:  # noqa: BLE001 - this match's nodes are taken back; the others stand
            edit.rollback()
            log.warning("attention pass skipped %s: %s: %s", m.out.name, type(e).__name__, e)
    edit.finish()
    log.info("attention pass: %d chain(s) → %s, %d → %s; %d direct SDPA call(s) and %d masked math chain(s) → %s",
             done["chain"], CUDA_OP if target == "cuda" else CPU_OP, done["template"], TEMPLATE_OP, done["direct"],
             done["masked"], TEMPLATE_OP)
    return any(done.values())


def find_attention(gm: fx.GraphModule, target: str, allow_tf32: bool = False) -> list[AttentionMatch]:
    """Every attention chain of `gm` that the target's SDPA kernel computes exactly; none overlap.
    Each says whether fxcc's kernel takes it (`template`)."""
    matches: list[AttentionMatch] = []
    taken: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is aten._softmax.default:
            m = match_softmax(node)
            if m is not None and supported(m, target) and not taken.intersection(m.removed):
                q, kt, v = _val(m.q), _val(m.kt), _val(m.v)
                # supported() checked that q, kᵀ (its dim 1) and v are dense along the head dim
                fxcc = template_applies((q.dtype, kt.dtype, v.dtype), (q.shape[-1], kt.shape[1], v.shape[-1]),
                                        True, target, allow_tf32)
                matches.append(dataclasses.replace(m, template=fxcc))
                taken.update(m.removed)
    return matches


def template_applies(dtypes: tuple[torch.dtype, ...], dims: tuple[object, ...], dense: bool, target: str,
                     allow_tf32: bool) -> bool:
    """Whether fxcc's attention kernel computes SDPA of q, k, v of these dtypes, head dims (E of q,
    E of k, Ev of v) and innermost strides (`dense`: all 1) as the request allows.

    Note: sizes other than the head dims may be symbolic (they are kernel arguments); the checks
    here never compare a symbolic size, so they add no guard, and they run no tensor op (the
    FakeTensors belong to the graph's mode, not to the one Dynamo may have active).
    """
    if target not in ("cuda", "interpret") or len(set(dtypes)) != 1 or not dense:
        return False
    if dtypes[0] not in ATTENTION_DTYPES or (dtypes[0] == torch.float32 and not allow_tf32):
        return False
    e, ek, ev = dims
    if not all(isinstance(d, int) for d in dims) or e != ek:
        return False
    return e in ATTENTION_HEAD_DIMS and ev in ATTENTION_HEAD_DIMS


def find_direct_sdpa(gm: fx.GraphModule, target: str, allow_tf32: bool) -> list[SdpaMatch]:
    """Direct SDPA calls of `gm` that fxcc's kernel computes: the target's op, only its output
    read, no dropout, a float mask or none, not asked for anything a kernel without them would
    not give."""
    found: list[SdpaMatch] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or DIRECT_SDPA.get(node.target) != target:
            continue
        args = _bound_args(node)
        if args is None or args.get("dropout_p", 0.0) != 0.0:
            continue
        bias = args.get("attn_bias", args.get("attn_mask"))
        if bias is not None and not _takes_bias(bias, args["query"], _kv_len(args["key"])):
            continue
        users = list(node.users)
        if any(u.target is not operator.getitem for u in users):
            continue
        outs = [u for u in users if u.args[1] == 0]
        dead = tuple(u for u in users if u.args[1] != 0 and not u.users)  # make_fx keeps unused getitems
        if len(outs) != 1 or len(outs) + len(dead) != len(users):
            continue
        q, k, v = (args[name] for name in ("query", "key", "value"))
        vals = [_val(x) for x in (q, k, v)]
        if any(t is None or t.dim() != 4 for t in vals):
            continue
        dense = all(t.stride(-1) == 1 for t in vals)
        if not template_applies(tuple(t.dtype for t in vals), tuple(t.shape[-1] for t in vals), dense,
                                target, allow_tf32):
            continue
        scale = args.get("scale")
        scale = 1.0 / math.sqrt(vals[0].shape[-1]) if scale is None else float(scale)
        if not (math.isfinite(scale) and scale > 0) or not isinstance(args.get("is_causal", False), bool):
            continue
        out = _val(outs[0])
        if out is None or out.dim() != 4:
            continue
        found.append(SdpaMatch(node, outs[0], q, k, v, scale, bool(args.get("is_causal", False)),
                               _heads_outer(out), dead, bias))
    return found


def _kv_len(k: object) -> object:
    """The key length S of a [Z, H, S, E] key (None if it has no FakeTensor)."""
    kv = _val(k)
    return None if kv is None else kv.shape[2]


def _takes_bias(bias: object, q: object, kv_len: object) -> bool:
    """Whether fxcc's kernel reads this SDPA mask as it is: a float tensor of q's dtype (AOTAutograd
    turns a boolean mask into 0 / -inf before the op), of at most 4 dims, each 1 or the size of
    [Z, H, L, S] it lines up with (compared as expressions: no guard)."""
    b, qv = _val(bias), _val(q)
    if b is None or qv is None or kv_len is None or b.dtype != qv.dtype or b.device != qv.device or b.dim() > 4:
        return False
    full = (qv.shape[0], qv.shape[1], qv.shape[2], kv_len)
    for size, want in zip(b.shape, full[4 - b.dim():]):
        if isinstance(size, int) and size == 1:
            continue
        if not _same_size(size, want):
            return False
    return True


def _same_size(a: object, b: object) -> bool:
    """Sizes equal as numbers or as expressions (a symbolic compare would record a guard)."""
    return a is b or str(a) == str(b)


def _heads_outer(out: torch.Tensor) -> bool:
    """Whether an SDPA result [Z, H, L, Ev] lies heads outside rows; else rows outside heads
    ([Z, L, H, Ev] in memory, where a head's stride is Ev). The template's output copies it, so
    the views the graph takes of it stay valid.

    Note: a plain-int compare: a symbolic stride compared with a number would record a guard.
    """
    heads_stride = out.stride(1)
    return not (isinstance(heads_stride, int) and heads_stride == out.shape[-1] and out.shape[1] != 1)


def _bound_args(node: fx.Node) -> dict[str, object] | None:
    """`node`'s arguments by their schema names, defaults filled in (None if they do not bind)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or len(node.args) > len(schema.arguments):
        return None
    out: dict[str, object] = {}
    for i, a in enumerate(schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out if set(node.kwargs) <= set(out) else None


def match_softmax(softmax: fx.Node) -> AttentionMatch | None:
    """The chain around one `_softmax` node, or None where it is not plain attention."""
    if len(softmax.args) != 3 or softmax.kwargs:
        return None
    x, dim, half_to_float = softmax.args
    if half_to_float or not isinstance(x, fx.Node) or dim not in (-1, _ndim(x) - 1):
        return None
    chain = [softmax]
    after = _follow_users(softmax, chain)
    if after is None:
        return None
    out = _only_user(after)
    if out is None or out.target is not aten.bmm.default or out.args[0] is not after:
        return None
    scores, scale = _scale_chain(x, chain)
    if scores is None or scores.target is not aten.bmm.default or len(scores.users) != 1:
        return None
    chain.append(scores)
    if not _same_batch_rows(chain, scores):
        return None
    q, kt = scores.args
    q_scale = _scalar_scale(q)
    if q_scale is not None and len(q.users) == 1:
        chain.append(q)
        q, scale = q.args[0], scale * q_scale
    # Note: positive scales only; a negative one is valid SDPA input, but untested on the fused kernels.
    if not (math.isfinite(scale) and scale > 0):
        return None
    return AttentionMatch(out, q, kt, out.args[1], scale, tuple(chain) + (out,))


def _follow_users(node: fx.Node, chain: list[fx.Node]) -> fx.Node | None:
    """From the softmax down through batch reshapes to the node the second bmm reads."""
    while True:
        user = _only_user(node)
        if user is None:
            return None
        if not _is_batch_reshape(user):
            return node
        chain.append(user)
        node = user


def _scale_chain(x: fx.Node, chain: list[fx.Node]) -> tuple[fx.Node | None, float]:
    """From the softmax's input up through scalar scales and batch reshapes to the scores' producer."""
    scale = 1.0
    while len(x.users) == 1:
        factor = _scalar_scale(x)
        if factor is not None:
            scale *= factor
        elif not _is_batch_reshape(x):
            return x, scale
        chain.append(x)
        x = x.args[0]
    return None, scale


def _scalar_scale(node: fx.Node) -> float | None:
    """The factor of `x * c` or `x / c` with a Python number c (same dtype out as in), else None."""
    if node.op != "call_function" or node.target not in _SCALES or len(node.args) != 2 or node.kwargs:
        return None
    x, c = node.args
    if not isinstance(x, fx.Node) or isinstance(c, bool) or not isinstance(c, (int, float)):
        return None
    if _val(node) is None or _val(x) is None or _val(node).dtype != _val(x).dtype:
        return None
    if _SCALES[node.target]:
        return 1.0 / c if c != 0 else None
    return float(c)


def _is_batch_reshape(node: fx.Node) -> bool:
    """A view that only splits or merges the dims before the last two, or an expand that changes nothing."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    src, out = _val(node.args[0]), _val(node)
    if src is None or out is None or src.dim() < 2 or out.dim() < 2:
        return False
    if node.target is aten.expand.default:
        return tuple(out.shape) == tuple(src.shape)
    # Note: view and reshape are defined in row-major element order whatever the strides, so a
    # view that keeps the last two dims maps batch row b to batch row b.
    return node.target in _RESHAPES and tuple(out.shape[-2:]) == tuple(src.shape[-2:])


def _same_batch_rows(chain: list[fx.Node], scores: fx.Node) -> bool:
    """Every tensor of the chain holds the N × L × S scores (in any split of the batch dims)."""
    n, rows, cols = _val(scores).shape
    for node in chain:
        val = _val(node)
        if val is None or tuple(val.shape[-2:]) != (rows, cols) or math.prod(val.shape[:-2]) != n:
            return False
    return True


def supported(m: AttentionMatch, target: str) -> bool:
    """Whether the target's SDPA kernel takes these q, k, v (3-D, as bmm gives them)."""
    q, kt, v = _val(m.q), _val(m.kt), _val(m.v)
    if any(t is None or t.dim() != 3 for t in (q, kt, v)) or not q.dtype == kt.dtype == v.dtype:
        return False
    (n, rows, e), (_, _, cols), ev = q.shape, kt.shape, v.shape[-1]
    # Note: each size compared with 0 on its own: min() of symbolic sizes compares them with one
    # another, which records a guard (`s0 >= 8` for 8 heads and a sequence of 9) on the graph's sizes.
    if any(d == 0 for d in (n, rows, cols, e, ev)) or n > MAX_HEADS:
        return False
    last_dense = all(t.shape[-1] == 1 or t.stride(-1) == 1 for t in (q, v)) and (kt.shape[1] == 1 or kt.stride(1) == 1)
    if not last_dense:
        return False
    if target == "cuda":
        return q.dtype in CUDA_DTYPES and e % CUDA_HEAD_ALIGN == 0 and ev % CUDA_HEAD_ALIGN == 0
    return q.dtype in CPU_DTYPES and e == ev


def sdpa_node(edit: GraphEdit, m: AttentionMatch, target: str) -> fx.Node:
    """Before the chain's second bmm: q, k, v as 4-D [1, N, ·, ·] views (N heads of one batch), the
    target's SDPA call (or fxcc's kernel), and its output as [N, L, Ev], which is returned."""
    at, stem = m.out, m.out.name
    q = edit.add(at, aten.unsqueeze.default, (m.q, 0), name=f"{stem}_q")
    kt = edit.add(at, aten.transpose.int, (m.kt, 1, 2), name=f"{stem}_kt")
    k = edit.add(at, aten.unsqueeze.default, (kt, 0), name=f"{stem}_k")
    v = edit.add(at, aten.unsqueeze.default, (m.v, 0), name=f"{stem}_v")
    if m.template:
        # Note: laid out as the aten op the target would run lays its output out, so that the
        # rest of the plan is the one it would be with that op.
        out4 = edit.add(at, resolve_target(TEMPLATE_OP), (q, k, v, m.scale, False, True, target != "cuda"),
                        name=f"{stem}_out")
    else:
        if target == "cuda":
            call = edit.add(at, resolve_target(CUDA_OP), (q, k, v, None, False, 0.0, False), {"scale": m.scale},
                            name=f"{stem}_sdpa")
        else:
            call = edit.add(at, resolve_target(CPU_OP), (q, k, v, 0.0, False), {"scale": m.scale},
                            name=f"{stem}_sdpa")
        out4 = edit.add(at, operator.getitem, (call, 0), name=f"{stem}_out")
    return edit.add(at, aten.select.int, (out4, 0, 0), name=stem)


def template_node(edit: GraphEdit, d: SdpaMatch) -> fx.Node:
    """fxcc's kernel on a direct SDPA call's q, k, v, before the call."""
    args = (d.q, d.k, d.v, d.scale, d.causal, True, d.heads_outer)
    if d.bias is not None:
        args += (d.bias,)
    return edit.add(d.call, resolve_target(TEMPLATE_OP), args, name=d.out.name)


def find_masked_math(gm: fx.GraphModule, target: str, allow_tf32: bool) -> list[MaskedMatch]:
    """Every chain of torch's math SDPA with an additive mask (see module Note) that fxcc's kernel
    computes; none overlap."""
    found: list[MaskedMatch] = []
    taken: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not aten._softmax.default:
            continue
        m = match_masked_math(node)
        if m is None or taken.intersection(m.removed):
            continue
        q, kt, v = _val(m.q), _val(m.kt), _val(m.v)
        dense = q.stride(-1) == 1 and kt.stride(-2) == 1 and v.stride(-1) == 1
        if not template_applies((q.dtype, kt.dtype, v.dtype), (q.shape[-1], kt.shape[-2], v.shape[-1]), dense,
                                target, allow_tf32) or not _takes_bias(m.bias, m.q, kt.shape[-1]):
            continue
        found.append(m)
        taken.update(m.removed)
    return found


def match_masked_math(softmax: fx.Node) -> MaskedMatch | None:
    """The math SDPA chain around one `_softmax` node: `where(row masked whole, 0, softmax(x))`
    (the decomposed `_safe_softmax`), x = scores · scale + bias over [Z, H, L, S], read by a bmm
    whose result is viewed back to [Z, H, L, Ev]; None where it is anything else."""
    if len(softmax.args) != 3 or softmax.kwargs:
        return None
    x, dim, half_to_float = softmax.args
    if half_to_float or not isinstance(x, fx.Node) or _ndim(x) != 4 or dim not in (-1, 3):
        return None
    chain: list[fx.Node] = [softmax]
    sel = _safe_select(softmax, x, chain)
    if sel is None:
        return None
    chain.append(sel)
    after = _follow_users(sel, chain)
    bmm2 = None if after is None else _only_user(after)
    if bmm2 is None or bmm2.target is not aten.bmm.default or bmm2.args[0] is not after:
        return None
    out = _only_user(bmm2)
    xv, ov = _val(x), None if out is None else _val(out)
    if out is None or out.target not in _RESHAPES or ov is None or ov.dim() != 4 \
            or not all(_same_size(a, b) for a, b in zip(ov.shape[:3], xv.shape[:3])):
        return None
    chain.append(bmm2)
    if x.target is not aten.add.Tensor or len(x.args) != 2 or x.kwargs:
        return None
    chain.append(x)
    for side in (0, 1):
        found = _masked_scores(x.args[side], x.args[1 - side], xv, chain)
        if found is None:
            continue
        scores, scale, bias = found
        z, h = xv.shape[:2]
        inputs: list[fx.Node] = []  # q's, k's and v's views, copies and scales: removed where only the chain reads them
        q = _unflatten(scores.args[0], z, h, inputs, scale=True)
        kt = _unflatten(scores.args[1], z, h, inputs, scale=True)
        v = _unflatten(bmm2.args[1], z, h, inputs, scale=False)
        if q is None or kt is None or v is None:
            return None
        scale *= q[1] * kt[1]
        if not (math.isfinite(scale) and scale > 0):
            return None
        k = _untransposed(kt[0])
        if k is not None:
            inputs.append(kt[0])
        removed = _removable(chain, inputs, out)
        return None if removed is None else MaskedMatch(out, q[0], k, kt[0], v[0], scale, bias, removed + (out,))
    return None


def _removable(chain: list[fx.Node], inputs: list[fx.Node], out: fx.Node) -> tuple[fx.Node, ...] | None:
    """The chain and those of `inputs` that nothing outside them reads (layers that share a key's
    views keep them); None when a node of the chain itself is read outside it."""
    gone = {*chain, out}
    grown = True
    while grown:
        grown = False
        for node in inputs:
            if node not in gone and all(u in gone for u in node.users):
                gone.add(node)
                grown = True
    if any(u not in gone for node in chain for u in node.users):
        return None
    return tuple(n for n in [*chain, *inputs] if n in gone and n is not out)


def _safe_select(softmax: fx.Node, x: fx.Node, chain: list[fx.Node]) -> fx.Node | None:
    """`where(not any(x != -inf, -1), zeros_like(s), s)` of softmax s of x (the decomposed
    `_safe_softmax`): the `where`, its other nodes added to `chain`; None where the graph differs."""
    users = set(softmax.users)
    sel = next((u for u in users if u.target is aten.where.self), None)
    zeros = next((u for u in users if u.target is aten.full_like.default), None)
    if len(users) != 2 or sel is None or zeros is None or set(zeros.users) != {sel}:
        return None
    if len(zeros.args) != 2 or zeros.args[1] != 0 or zeros.kwargs.get("dtype") not in (None, _val(softmax).dtype):
        return None
    if len(sel.args) != 3 or sel.args[1] is not zeros or sel.args[2] is not softmax:
        return None
    cond = sel.args[0]
    none_kept = _one_arg_op(cond, aten.logical_not.default)
    some_kept = _one_arg_op(none_kept, aten.any.dim)
    if some_kept is None or none_kept.args[1:] not in ((-1, True), (3, True)):
        return None
    kept = _one_arg_op(some_kept, aten.logical_not.default)
    if kept is None or kept.target is not aten.eq.Scalar or kept.args[0] is not x \
            or kept.args[1] != float("-inf") or set(x.users) != {softmax, kept}:
        return None
    chain.extend([zeros, cond, none_kept, some_kept, kept])
    return sel


def _one_arg_op(node: object, target: object) -> fx.Node | None:
    """The single-use `node`'s first argument when `node` is a call of `target` (else None)."""
    if not isinstance(node, fx.Node) or node.target is not target or len(node.users) != 1 or not node.args:
        return None
    arg = node.args[0]
    return arg if isinstance(arg, fx.Node) else None


def _masked_scores(scored: object, bias: object, xv: torch.Tensor,
                   chain: list[fx.Node]) -> tuple[fx.Node, float, fx.Node] | None:
    """(the scores' bmm, the scale on its way, the bias) where `scored` holds all of x's [Z, H, L, S]
    scores (no broadcast) from a single-use bmm through scales and batch reshapes, and `bias` is a
    tensor of x's dtype; None otherwise."""
    if not isinstance(scored, fx.Node) or not isinstance(bias, fx.Node) or _val(bias) is None:
        return None
    sv = _val(scored)
    if sv is None or sv.dim() != 4 or not all(_same_size(a, b) for a, b in zip(sv.shape, xv.shape)) \
            or _val(bias).dtype != xv.dtype:
        return None
    walked: list[fx.Node] = []
    scores, scale = _scale_chain(scored, walked)
    if scores is None or scores.target is not aten.bmm.default or len(scores.users) != 1:
        return None
    chain.extend([*walked, scores])
    return scores, scale, bias


def _unflatten(t3: object, z: object, h: object, chain: list[fx.Node], scale: bool) -> tuple[fx.Node, float] | None:
    """The 4-D [Z, H, ·, ·] tensor whose [Z·H, ·, ·] view a bmm reads (math SDPA: a view of a
    contiguous clone of a no-op expand of a scaled input), with the factor of the scalar scales
    passed through where `scale`; the nodes passed through go into `chain`."""
    if not isinstance(t3, fx.Node) or t3.target not in _RESHAPES:
        return None
    src, tv = t3.args[0], _val(t3)
    sv = _val(src) if isinstance(src, fx.Node) else None
    if sv is None or tv is None or sv.dim() != 4 or tv.dim() != 3 or not _same_size(sv.shape[0], z) \
            or not _same_size(sv.shape[1], h) or tuple(sv.shape[-2:]) != tuple(tv.shape[-2:]):
        return None
    # Note: a view keeps the row-major element order, so element (z·H + h, i, j) of the bmm's
    # operand is element (z, h, i, j) of `src`, whatever either's strides.
    walked, node, factor = [t3], src, 1.0
    while isinstance(node.args[0] if node.args else None, fx.Node):
        f = _scalar_scale(node) if scale else None
        same = _val(node.args[0]) is not None and tuple(_val(node.args[0]).shape) == tuple(_val(node).shape)
        if f is not None:
            factor *= f
        elif not (same and (node.target is aten.expand.default or _is_plain_clone(node))):
            break
        walked.append(node)
        node = node.args[0]
    chain.extend(walked)
    return node, factor


def _is_plain_clone(node: fx.Node) -> bool:
    """A clone that changes nothing but the layout."""
    return node.target is aten.clone.default and len(node.args) == 1 and set(node.kwargs) <= {"memory_format"}


def _untransposed(kt: fx.Node) -> fx.Node | None:
    """The [Z, H, S, E] key whose last two dims `kt` swaps (a permute or transpose of it), else None."""
    if kt.op != "call_function" or not kt.args or not isinstance(kt.args[0], fx.Node):
        return None
    if kt.target is aten.permute.default and list(kt.args[1]) in ([0, 1, 3, 2], [0, 1, -1, -2]):
        return kt.args[0]
    if kt.target is aten.transpose.int and sorted(d % 4 for d in kt.args[1:3]) == [2, 3]:
        return kt.args[0]
    return None


def masked_node(edit: GraphEdit, m: MaskedMatch) -> fx.Node:
    """fxcc's kernel on a masked math chain's q, k, v and mask, before the view it replaces, laid
    out as that view of the bmm's result is (contiguous [Z, H, L, Ev]): the rest of the plan and
    the graph's outputs keep the layouts eager gives them."""
    k = m.k if m.k is not None else edit.add(m.out, aten.transpose.int, (m.kt, 2, 3), name=f"{m.out.name}_k")
    return edit.add(m.out, resolve_target(TEMPLATE_OP), (m.q, k, m.v, m.scale, False, True, True, m.bias),
                    name=m.out.name)


def _only_user(node: fx.Node) -> fx.Node | None:
    if len(node.users) != 1:
        return None
    (user,) = node.users
    return user if user.op == "call_function" and user.target is not operator.getitem else None


def _val(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _ndim(node: fx.Node) -> int:
    val = _val(node)
    return val.dim() if val is not None else -1

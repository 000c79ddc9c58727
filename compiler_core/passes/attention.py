"""Attention without materialized scores: `bmm → scale → softmax → bmm` becomes one SDPA extern call.

Note: the chain `softmax(q @ kᵀ * c) @ v` writes an N×L×S scores tensor and an equally large
softmax; an aten scaled-dot-product-attention kernel computes the same result with neither. The
pass rewrites the GraphSpec (the rewritten spec is rebuilt and re-derived with FakeTensors like any
client graph) and only where the result is the same:
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
"""

from __future__ import annotations

import logging
import math
import operator
from dataclasses import dataclass

import torch
from torch import fx

from compiler_core.graph import rebuild_graph
from compiler_core.wire import BoolArg, FloatArg, GraphSpec, IntArg, Node, NodeRef, NoneArg

log = logging.getLogger("fxcc.passes.attention")

aten = torch.ops.aten

CUDA_OP = "aten._scaled_dot_product_efficient_attention.default"
CPU_OP = "aten._scaled_dot_product_flash_attention_for_cpu.default"
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


def fuse_attention(gm: fx.GraphModule, spec: GraphSpec, target: str) -> tuple[fx.GraphModule, GraphSpec]:
    """`gm` and `spec` with each matched attention chain replaced by one SDPA call (else unchanged)."""
    try:
        syms = gm.meta.get("fxcc_syms")  # a symbolic graph keeps its hints
        before = _recorded(syms)
        matches = find_attention(gm, target)
        if not matches:
            return gm, spec
        if _recorded(syms) != before:
            # Note: the match asked something of the sizes that holds only for some of them (the
            # ShapeEnv recorded a guard); the rebuilt graph gets a new ShapeEnv, where that guard
            # would be lost, and the plan would run SDPA for sizes the match never allowed.
            log.info("attention pass skipped: the match holds only under guards on the sizes")
            return gm, spec
        rewritten = rewrite_spec(spec, matches, target)
        new_gm = rebuild_graph(rewritten, {s.name: v for s, v in syms.hints.items()} if syms else None)
    except Exception as e:  # noqa: BLE001 - correctness first: an unsure rewrite is no rewrite
        log.warning("attention pass skipped: %s: %s", type(e).__name__, e)
        return gm, spec
    log.info("attention pass: %d chain(s) → %s", len(matches), CUDA_OP if target == "cuda" else CPU_OP)
    return new_gm, rewritten


def _recorded(syms: object) -> tuple[int, int]:
    """How many guards and replacements a symbolic graph's ShapeEnv holds ((0, 0) without one)."""
    env = getattr(syms, "shape_env", None)
    return (len(env.guards), len(env.replacements)) if env is not None else (0, 0)


def find_attention(gm: fx.GraphModule, target: str) -> list[AttentionMatch]:
    """Every attention chain of `gm` that the target's SDPA kernel computes exactly; none overlap."""
    matches: list[AttentionMatch] = []
    taken: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is aten._softmax.default:
            m = match_softmax(node)
            if m is not None and supported(m, target) and not taken.intersection(m.removed):
                matches.append(m)
                taken.update(m.removed)
    return matches


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


def rewrite_spec(spec: GraphSpec, matches: list[AttentionMatch], target: str) -> GraphSpec:
    """`spec` without the matched chains; each second bmm's name now holds the SDPA result."""
    removed = {n.name for m in matches for n in m.removed}
    by_out = {m.out.name: m for m in matches}
    taken = {p.name for p in spec.placeholders} | {n.name for n in spec.nodes}
    nodes: list[Node] = []
    for n in spec.nodes:
        if n.name in by_out:
            nodes.extend(sdpa_nodes(by_out[n.name], target, taken))
        elif n.name not in removed:
            nodes.append(n)
    # Note: a symbolic graph keeps its size symbols (their declarations and ranges), or the
    # rewritten spec would use undeclared symbols and dynamic attention would never fuse.
    return GraphSpec(symbols=spec.symbols, placeholders=spec.placeholders,
                     nodes=_drop_dead_views(nodes, spec.outputs), outputs=spec.outputs)


def sdpa_nodes(m: AttentionMatch, target: str, taken: set[str]) -> list[Node]:
    """q, k, v as 4-D [1, N, ·, ·] views (N heads of one batch), the SDPA call, its output as [N, L, Ev]."""
    def name(stem: str) -> str:
        base = f"{m.out.name}_{stem}"[:120]
        new, i = base, 0
        while new in taken:
            i += 1
            new = f"{base}{i}"
        taken.add(new)
        return new

    def ref(n: str | fx.Node) -> NodeRef:
        return NodeRef(name=n if isinstance(n, str) else n.name)

    zero = IntArg(value=0)
    q, k, kt, v = name("q"), name("k"), name("kt"), name("v")
    call, out4 = name("sdpa"), name("out")
    nodes = [
        Node(name=q, target="aten.unsqueeze.default", args=[ref(m.q), zero]),
        Node(name=kt, target="aten.transpose.int", args=[ref(m.kt), IntArg(value=1), IntArg(value=2)]),
        Node(name=k, target="aten.unsqueeze.default", args=[ref(kt), zero]),
        Node(name=v, target="aten.unsqueeze.default", args=[ref(m.v), zero]),
    ]
    scale = {"scale": FloatArg(value=m.scale)}
    if target == "cuda":
        args = [ref(q), ref(k), ref(v), NoneArg(), BoolArg(value=False), FloatArg(value=0.0), BoolArg(value=False)]
        nodes.append(Node(name=call, target=CUDA_OP, args=args, kwargs=scale))
    else:
        args = [ref(q), ref(k), ref(v), FloatArg(value=0.0), BoolArg(value=False)]
        nodes.append(Node(name=call, target=CPU_OP, args=args, kwargs=scale))
    nodes.append(Node(name=out4, target="getitem", args=[ref(call), zero]))
    nodes.append(Node(name=m.out.name, target="aten.select.int", args=[ref(out4), zero, zero]))
    return nodes


_VIEW_OPS = frozenset({"aten.permute.default", "aten.transpose.int", "aten.view.default", "aten.expand.default",
                       "aten.reshape.default", "aten._unsafe_view.default", "aten.unsqueeze.default",
                       "aten.squeeze.dim", "aten.t.default"})


def _drop_dead_views(nodes: list[Node], outputs: list) -> list[Node]:
    """`nodes` without the view ops nothing reads any more (the transposed k the scores bmm read)."""
    from compiler_core.wire import _refs

    while True:
        used = set(_refs(list(outputs)))
        for n in nodes:
            used.update(_refs(list(n.args) + list(n.kwargs.values())))
        dead = {n.name for n in nodes if n.target in _VIEW_OPS and n.name not in used}
        if not dead:
            return nodes
        nodes = [n for n in nodes if n.name not in dead]


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

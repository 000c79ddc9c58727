"""Lowering of flex_attention and its backward: Triton templates with the mods inlined (codegen.flex_attention).

Note: each mod graph (score_mod, mask_mod, the backward's joint graph) is lowered here by fxcc's
own lowerings over 0-dim values, its score (and gradient) at fp32, the precision eager's flex
computes them in, and rendered to Triton text (codegen.flex_mods). Whatever the template cannot do
raises UnsupportedOp, and the node becomes an extern step that runs torch's flex_attention: a mod
op without a lowering or a spelling, symbolic sizes, head dims or dtypes the template has no
kernel for, a block mask whose blocks the tiles cannot cut, k/v broadcast over the batch, a
backward without grad_out or without the transposed block lists.

Note: this lowering renders its mods as Triton text (codegen/flex_mods.py) while it lowers, so it sits
above codegen, outside the lowering package (which codegen's scheduler imports): the pipeline
(compile.py) imports it, and so registers it; a graph lowered without the pipeline runs
flex_attention as an extern step.
"""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch
from torch import fx

from fxcc.compiler_core.codegen import flex_attention as template
from fxcc.compiler_core.codegen.flex_mods import ModText, render_mod
from fxcc.compiler_core.errors import CodegenError, UnsupportedOp
from fxcc.compiler_core.flex import FlexTarget, parse_block
from fxcc.compiler_core.ir.nodes import Buffer, Lazy, Reduction, StridedView, TensorValue, make_loader
from fxcc.compiler_core.ir.ops import ops
from fxcc.compiler_core.lowering.core import (
    LOWERINGS,
    GraphLowering,
    TemplateKernel,
    current_graph,
    current_node,
    lowering_context,
    node_val,
    register_lowering,
)
from fxcc.compiler_core.sizevars import contiguous_strides
from fxcc.compiler_core.symbolic import is_symbolic, sizes_of, strides_of
from fxcc.compiler_core.wire import GraphSpec, NodeRef

MOD_REGISTERS = (template.SCORE, template.BATCH, template.HEAD, template.Q_IDX, template.KV_IDX)


def lower_mod(spec: GraphSpec, registers: tuple[str, ...], captured: list[tuple[str, StridedView]], prefix: str,
              target: str, want: torch.dtype) -> ModText:
    """A mod graph as Triton text: its first inputs are `registers` (float ones at fp32), the rest its
    captured tensors, each (pointer parameter, where the outer graph holds it). UnsupportedOp where
    a node cannot be inlined."""
    from fxcc.compiler_core.graph import rebuild_graph

    if len(spec.placeholders) != len(registers) + len(captured):
        raise UnsupportedOp("a flex_attention mod takes other inputs than its registers and buffers")
    spec = _float_registers_fp32(spec, len(registers))
    gm = rebuild_graph(spec)
    g = GraphLowering(spec, target)
    env: dict[fx.Node, Any] = {}
    reg_dtypes: dict[str, torch.dtype] = {}
    buffers: dict[str, tuple[str, torch.dtype]] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        val = node.meta["val"]
        if i < len(registers):
            if val.dim() != 0:
                raise UnsupportedOp("a flex_attention mod's score or index is not 0-d")
            name = registers[i]
            reg_dtypes[name] = val.dtype
            env[node] = Lazy(val.dtype, (), lambda index, name=name: ops.load(name, sympy.Integer(0)))
        else:
            pointer, view = captured[i - len(registers)]
            if any(is_symbolic(s) for s in (*view.sizes, *view.strides)) or tuple(view.sizes) != sizes_of(val) \
                    or view.dtype != val.dtype:
                raise UnsupportedOp("a flex_attention mod captures a tensor of symbolic or other size")
            name = f"{prefix}_buf{i}"
            buffers[name] = (pointer, val.dtype)
            buf = g.add_buffer(Buffer(name, val.dtype, tuple(view.sizes), tuple(view.strides), "input")).buffer
            env[node] = StridedView(buf, tuple(view.sizes), tuple(view.strides), view.offset)
    result: Any = None
    for node in gm.graph.nodes:
        if node.op == "call_function":
            fn = LOWERINGS.get(node.target)
            if fn is None:
                raise UnsupportedOp(f"flex_attention mod op {node.target} has no lowering", op=str(node.target))
            with lowering_context(g, node):
                env[node] = fn(*fx.node.map_arg(node.args, lambda n: env[n]),
                               **fx.node.map_arg(node.kwargs, lambda n: env[n]))
        elif node.op == "output":
            outs = node.args[0]
            result = outs[0] if isinstance(outs, (tuple, list)) else outs
    if g.program or not isinstance(result, fx.Node) or not isinstance(env[result], (Lazy, StridedView)):
        raise UnsupportedOp("a flex_attention mod needs a buffer of its own or gives no tensor")
    value = env[result]
    if tuple(value.sizes) != ():
        raise UnsupportedOp("a flex_attention mod's value is not 0-d")
    loader = make_loader(value)
    try:
        return render_mod(lambda: loader([]), reg_dtypes, buffers, prefix, target, want)
    except CodegenError as e:
        raise UnsupportedOp(f"flex_attention mod: {e}") from None


def _float_registers_fp32(spec: GraphSpec, n_registers: int) -> GraphSpec:
    """`spec` with its floating register inputs (score, a gradient) at fp32."""
    places = list(spec.placeholders)
    for i in range(n_registers):
        p = places[i]
        if p.spec is not None and p.spec.dtype in ("float16", "bfloat16"):
            places[i] = p.model_copy(update={"spec": p.spec.model_copy(update={"dtype": "float32"})})
    return spec.model_copy(update={"placeholders": places})


def _static(*values: Any) -> None:
    if any(is_symbolic(v) for v in values):
        raise UnsupportedOp("flex_attention template takes static sizes only")


def _dense(g: GraphLowering, value: TensorValue) -> StridedView:
    """`value` in memory with a dense innermost dim (where it lies if it has one)."""
    if isinstance(value, StridedView) and value.strides[-1] == 1:
        return value
    if isinstance(value, StridedView):
        value = Lazy(value.dtype, value.sizes, make_loader(value))
    return g.realize(value, contiguous_strides(value.sizes))


def _mask_ints(prefix: str, num: StridedView | None, idx: StridedView | None, batch: int, heads: int) -> dict[str, Any]:
    """The offsets and strides of one block list (stride 0 over a broadcast batch or head)."""
    if num is None:
        return {}
    out: dict[str, Any] = {}
    for part, t in (("n", num), ("i", idx)):
        b, h = t.sizes[0], t.sizes[1]
        if b not in (1, batch) or h not in (1, heads):
            raise UnsupportedOp("flex_attention's block mask does not broadcast over batch and heads")
        out[f"{prefix}{part}_off"] = t.offset
        out[f"{prefix}{part}_sz"] = 0 if b == 1 else t.strides[0]
        out[f"{prefix}{part}_sh"] = 0 if h == 1 else t.strides[1]
        if part == "i":
            out[f"{prefix}i_sq"] = t.strides[2]
    return out


def _common(q: TensorValue, k: TensorValue, v: TensorValue, block: list[Any], score_bufs: list[Any],
            mask_bufs: list[Any], kind: str) -> dict[str, Any]:
    """What forward and backward share: checks, the block mask in memory, the rendered mods."""
    g = current_graph()
    node = current_node()
    flex = g.wire[node].flex
    fake_block = parse_block([a.meta["val"] if isinstance(a, fx.Node) else a for a in node.args[3 if kind == "forward" else 7]])
    if q.dtype not in template.DTYPES:
        raise UnsupportedOp(f"flex_attention template takes no {q.dtype}")
    batch, heads, q_len, head_dim = q.sizes
    kv_batch, kv_heads, kv_len, value_dim = v.sizes
    _static(batch, heads, q_len, head_dim, kv_len, value_dim, fake_block.q_block, fake_block.kv_block)
    if kv_batch != batch:
        raise UnsupportedOp("flex_attention template takes no k/v broadcast over the batch")
    if head_dim not in template.HEAD_DIMS or value_dim not in template.HEAD_DIMS:
        raise UnsupportedOp(f"flex_attention template takes no head dims {head_dim}, {value_dim}")
    sparse_q, sparse_kv = int(fake_block.q_block), int(fake_block.kv_block)
    if any(s < 16 or s & (s - 1) for s in (sparse_q, sparse_kv)):
        raise UnsupportedOp(f"flex_attention template takes no block sizes {sparse_q}, {sparse_kv}")
    try:
        tiles = template.tile_options(flex.kernel_options, kind)
    except ValueError as e:
        raise UnsupportedOp(str(e)) from None
    tensors = dict(zip(("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                        "q_indices", "full_q_num_blocks", "full_q_indices"), block[2:10]))
    views = {name: (None if t is None else _dense(g, t)) for name, t in tensors.items()}
    bufs = [_dense_any(g, b) for b in score_bufs] + [_dense_any(g, b) for b in mask_bufs]
    target = g.target
    score_ptrs = [(f"SB{i}", b) for i, b in enumerate(bufs[:len(score_bufs)])]
    mask_ptrs = [(f"MB{i}", b) for i, b in enumerate(bufs[len(score_bufs):])]
    score = lower_mod(flex.score_mod, MOD_REGISTERS, score_ptrs, "sm", target, torch.float32)
    mask = lower_mod(flex.mask_mod, MOD_REGISTERS[1:], mask_ptrs, "mm", target, torch.bool)
    joint = None
    if flex.joint is not None:
        joint = lower_mod(flex.joint, (*MOD_REGISTERS, template.GRAD), score_ptrs, "jm", target, torch.float32)
    return {"g": g, "flex": flex, "views": views, "bufs": bufs, "score": score, "mask": mask, "joint": joint,
            "batch": batch, "heads": heads, "kv_heads": kv_heads, "q_len": q_len, "kv_len": kv_len,
            "head_dim": int(head_dim), "value_dim": int(value_dim), "sparse_q": sparse_q, "sparse_kv": sparse_kv,
            "tiles": tiles}


def _dense_any(g: GraphLowering, value: TensorValue) -> StridedView:
    """A captured tensor in memory, as it lies where it does (the mod's loads index its strides)."""
    if isinstance(value, StridedView):
        return value
    return g.realize(value, contiguous_strides(value.sizes))


def _qkv_ints(q: StridedView, k: StridedView, v: StridedView) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, t, row in (("q", q, "m"), ("k", k, "n"), ("v", v, "n")):
        out[f"{name}_off"] = t.offset
        out[f"{name}_sz"], out[f"{name}_sh"], out[f"{name}_s{row}"] = t.strides[:3]
    return out


def _new_buffer(g: GraphLowering, stem: str, val: torch.Tensor) -> StridedView:
    return g.add_buffer(Buffer(g.new_name(stem), val.dtype, sizes_of(val), strides_of(val), "computed"))


@register_lowering(FlexTarget("forward", 2), FlexTarget("forward", 3))
def flex_attention(q: TensorValue, k: TensorValue, v: TensorValue, block: list[Any], scale: float,
                   score_bufs: list[Any], mask_bufs: list[Any]) -> tuple[StridedView, ...]:
    """The forward template writing out, logsumexp (log2 units) and, where asked, max_scores."""
    c = _common(q, k, v, block, score_bufs, mask_bufs, "forward")
    g, views = c["g"], c["views"]
    vals = node_val()
    qv, kv, vv = (_dense(g, t) for t in (q, k, v))
    outs = [_new_buffer(g, "flex", vals[0])] + [_new_buffer(g, "flex_lse", x) for x in vals[1:]]
    has_full = views["full_kv_num_blocks"] is not None
    params = template.FlexParams(
        "forward", c["head_dim"], c["value_dim"], q.dtype, float(scale), c["heads"] // c["kv_heads"], c["score"],
        c["mask"], None, has_full, len(score_bufs), len(mask_bufs), c["sparse_q"], c["sparse_kv"], len(vals) - 1,
        c["tiles"])
    ints = _qkv_ints(qv, kv, vv)
    ints["o_sz"], ints["o_sh"], ints["o_sm"] = outs[0].strides[:3]
    ints |= _mask_ints("kv", views["kv_num_blocks"], views["kv_indices"], c["batch"], c["heads"])
    ints |= _mask_ints("fkv", views["full_kv_num_blocks"], views["full_kv_indices"], c["batch"], c["heads"])
    ints |= {"batch": c["batch"], "heads": c["heads"], "q_len": c["q_len"], "kv_len": c["kv_len"]}
    names = [a for a in template.FWD_INTS if has_full or not a.startswith("fkv")]
    args = [qv, kv, vv, views["kv_num_blocks"], views["kv_indices"]]
    if has_full:
        args += [views["full_kv_num_blocks"], views["full_kv_indices"]]
    _append(g, outs, args + c["bufs"], params, tuple(ints[n] for n in names), c)
    return tuple(outs)


@register_lowering(FlexTarget("backward"))
def flex_attention_backward(q: TensorValue, k: TensorValue, v: TensorValue, out: TensorValue, lse: TensorValue,
                            grad_out: TensorValue | None, grad_lse: TensorValue | None, block: list[Any], scale: float,
                            score_bufs: list[Any], mask_bufs: list[Any]) -> tuple[Any, ...]:
    """delta = rowsum(out * grad_out) - grad_lse / ln 2 (a fused reduction), then the backward template."""
    if grad_out is None:
        raise UnsupportedOp("flex_attention_backward without grad_out")
    c = _common(q, k, v, block, score_bufs, mask_bufs, "backward")
    g, views = c["g"], c["views"]
    if views["q_num_blocks"] is None:
        raise UnsupportedOp("flex_attention_backward without the block mask's q_num_blocks / q_indices")
    has_full = views["full_kv_num_blocks"] is not None
    if has_full != (views["full_q_num_blocks"] is not None):
        raise UnsupportedOp("flex_attention_backward with full kv blocks but no full q blocks, or the reverse")
    vals = node_val()
    qv, kv, vv, dov, lsev = (_dense(g, t) for t in (q, k, v, grad_out, lse))
    delta = _delta(g, out, grad_out, grad_lse)
    dq, dk, dv = (_new_buffer(g, stem, x) for stem, x in (("flex_dq", vals[0]), ("flex_dk", vals[1]),
                                                            ("flex_dv", vals[2])))
    params = template.FlexParams(
        "backward", c["head_dim"], c["value_dim"], q.dtype, float(scale), c["heads"] // c["kv_heads"], c["score"],
        c["mask"], c["joint"], has_full, len(score_bufs), len(mask_bufs), c["sparse_q"], c["sparse_kv"],
        tiles=c["tiles"])
    ints = _qkv_ints(qv, kv, vv)
    ints["do_off"] = dov.offset
    ints["do_sz"], ints["do_sh"], ints["do_sm"] = dov.strides[:3]
    ints["l_off"] = lsev.offset
    ints["l_sz"], ints["l_sh"] = lsev.strides[:2]
    for name, t, row in (("dq", dq, "m"), ("dk", dk, "n"), ("dv", dv, "n")):
        ints[f"{name}_sz"], ints[f"{name}_sh"], ints[f"{name}_s{row}"] = t.strides[:3]
    for prefix, num, idx, heads in (("kv", "kv_num_blocks", "kv_indices", c["heads"]),
                                    ("fkv", "full_kv_num_blocks", "full_kv_indices", c["heads"]),
                                    ("q", "q_num_blocks", "q_indices", c["heads"]),
                                    ("fq", "full_q_num_blocks", "full_q_indices", c["heads"])):
        ints |= _mask_ints(prefix, views[num], views[idx], c["batch"], heads)
    ints |= {"batch": c["batch"], "heads": c["heads"], "kv_heads": c["kv_heads"], "q_len": c["q_len"],
             "kv_len": c["kv_len"]}
    names = [a for a in template.BWD_INTS if has_full or not a.startswith(("fkv", "fq"))]
    args = [qv, kv, vv, dov, lsev, delta, views["kv_num_blocks"], views["kv_indices"]]
    if has_full:
        args += [views["full_kv_num_blocks"], views["full_kv_indices"]]
    args += [views["q_num_blocks"], views["q_indices"]]
    if has_full:
        args += [views["full_q_num_blocks"], views["full_q_indices"]]
    _append(g, [dq, dk, dv], args + c["bufs"], params, tuple(ints[n] for n in names), c)
    return dq, dk, dv, tuple(None for _ in score_bufs)


def _delta(g: GraphLowering, out: TensorValue, grad_out: TensorValue, grad_lse: TensorValue | None) -> StridedView:
    """rowsum(out * grad_out) in fp32, less grad_lse / ln 2 (the gradient of log2-unit logsumexp), written."""
    sizes = tuple(out.sizes[:3])
    width = out.sizes[3]
    load_o, load_do = make_loader(out), make_loader(grad_out)
    load_gl = make_loader(grad_lse) if grad_lse is not None else None

    def body(index: Any, rindex: Any) -> Any:
        full = [*index, *rindex]
        return ops.mul(ops.to_dtype(load_o(full), torch.float32), ops.to_dtype(load_do(full), torch.float32))

    rowsum = g.add_computed(Reduction(torch.float32, sizes, (width,), "sum", body, tuple(out.sizes), (3,)))
    if load_gl is None:
        return rowsum
    load_sum = make_loader(rowsum)
    inv_ln2 = 1.0 / math.log(2)

    def adjusted(index: Any) -> Any:
        gl = ops.to_dtype(load_gl(index), torch.float32)
        return ops.sub(load_sum(index), ops.mul(gl, ops.constant(inv_ln2, torch.float32)))
    return g.realize(Lazy(torch.float32, sizes, adjusted))


def _append(g: GraphLowering, outs: list[StridedView], args: list[StridedView], params: template.FlexParams,
            ints: tuple[Any, ...], c: dict[str, Any]) -> None:
    refs = [NodeRef(name=a.buffer.name) for a in args]
    sizes = {k: int(c[k]) for k in ("batch", "heads", "kv_heads", "q_len", "kv_len")}
    g.program.append(TemplateKernel(outs[0].buffer.name, g.wire[current_node()].target, refs, params=params,
                                    int_args=ints, sizes=sizes, extra_outs=tuple(o.buffer.name for o in outs[1:])))

"""fxcc's flash-attention forward kernel: a Triton template rendered per (head dims, causal, scale, dtype, precision).

Note: one program computes BLOCK_M query rows of one (batch, head) pair. It walks the keys in
tiles of BLOCK_N, keeping for each row the running maximum `m` of its scores, the running sum
`l` of exp(score - m) and the running P @ V in fp32; when a tile raises `m`, the older terms
are scaled by exp(m_old - m_new) (online softmax), so the scores never leave registers. Exps
are base 2 with log2(e) folded into the scale. The grid is one-dimensional (query tiles of a
head adjacent, so they share its K/V tiles in L2, and no 65535 limit on batch × heads).

q, k, v and out are addressed as base pointer + element offset + z * s_z + h * s_h + row * s_row
+ d, with every offset and stride a kernel argument: views of a fused QKV projection are read
where they lie (no copies), and the innermost dim must be dense (stride 1, so loads vectorise).
Rows past the query length and keys past the key length are masked (any length works);
`causal` keeps key j for query i where j <= i (SDPA's `is_causal`, aligned top-left).

With a bias (SDPA's additive float mask, as AOTAutograd leaves a boolean mask: 0 or -inf, or a
model's own finfo.min mask), the kernel reads one more tensor, [Z, H, L, S] by four strides (0 on
broadcast dims: GPT-2's [B, 1, S, S] mask is read once per head from the same memory). Its scores
stay in natural units until the exponent (finfo.min · log2(e) would overflow to -inf, turning a
row that eager's softmax spreads evenly over finfo.min scores into zeros), and a row whose every
score is -inf gives zeros (its running maximum taken as 0, its sum as 1), as aten's memory-efficient
and CPU flash kernels give. A bias built by one pointwise op from smaller tensors (T5's position bias
where its padding mask keeps a key) is instead computed per tile from those tensors
(AttentionParams.bias_mod, rendered by codegen.flex_mods.render_tile over the tile's batch, head,
rows and keys), one pointer per tensor and no bias strides: the [Z, H, L, S] bias is never written.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import torch

from fxcc.compiler_core.codegen.flex_mods import ModText, render_tile
from fxcc.compiler_core.codegen.triton import TL_DTYPES, RenderedKernel, next_pow2
from fxcc.compiler_core.ir.templates import AttentionParams
from fxcc.compiler_core.symbolic import hint, is_symbolic
from fxcc.compiler_core.target import ATTENTION_DTYPES, ATTENTION_HEAD_DIMS

# The head dims and dtypes the template renders (compiler_core.target, which passes and lowering ask).
HEAD_DIMS = ATTENTION_HEAD_DIMS
DTYPES = ATTENTION_DTYPES
# Positions of the KernelStep's integer arguments (after the four pointers q, k, v, out).
INT_ARGS = ("q_off", "q_sz", "q_sh", "q_sm", "k_off", "k_sz", "k_sh", "k_sn",
            "v_off", "v_sz", "v_sh", "v_sn", "o_sz", "o_sh", "o_sm", "batch", "heads", "q_len", "kv_len")
# With a bias, its pointer comes after V and these after v's integers.
BIAS_INT_ARGS = ("b_off", "b_sz", "b_sh", "b_sm", "b_sn")
KERNEL_PREFIX = "fxcc_flash_"


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    @property
    def constexprs(self) -> dict[str, int]:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n}

    @property
    def label(self) -> str:
        return f"m{self.block_m}_n{self.block_n}_w{self.num_warps}_s{self.num_stages}"


def is_template_kernel(name: str) -> bool:
    return name.startswith(KERNEL_PREFIX)


# Streaming multiprocessors of the Hopper cards fxcc tunes for (H100 SXM, H200): a biased kernel
# whose 128-row programs fill fewer than two waves of them takes 64-row tiles (see heuristic_config).
HOPPER_SMS = 132


def heuristic_config(params: AttentionParams, q_len: Any, kv_len: Any, target: str,
                     batch_heads: Any = None) -> AttentionConfig:
    """The launch config before tuning (and of symbolic plans, which are never tuned).

    Note: on the H200 with head dim 64 in TF32 (bench.attention_kernel's sweep), 128-row query
    tiles over 64-key tiles on 4 warps with 2 stages were the fastest config for the
    TransformerBlock's attention (0.311 ms; 8 warps: 0.390) and 8% off the fastest for GPT-2's
    causal one (0.0686 ms against 3 stages on 8 warps, 0.0636). Short sequences (the hint's) get
    tiles no longer than they need; the interpreter takes the same tiles (its cost is per tile).
    A bias tile is as large as the scores' and live beside them: at 128 × 64 on 4 warps ptxas
    (Triton 3.6's, sm_90a, head dim 64, TF32) spills over 500 bytes a thread with one (152
    without), on 8 warps none; GPT-2's masked attention (B8 H12 S512 D64, a [B, 1, S, S] bias,
    bench.attention_mask, H100, session 24) ran fastest at 128 × 64 on 8 warps with 3 stages for
    a causal mask, no mask and a padding mask alike (0.086, 0.089, 0.076 ms; 128 × 32 on 4 warps
    with 2 stages: 0.097, 0.107, 0.082), so a biased kernel takes that; shorter query tiles keep 4
    warps (two warp groups over 64 rows leave the MMA units half fed, autotune_attention's note),
    and head dims over 64 with a bias keep 32-key tiles (ptxas: 104 bytes spilled at 64 × 32,
    340 at 64 × 64; not timed). At GPT-2's batch of 4 (192 programs of 128 rows for 132 SMs, under
    two waves) 64 × 32 on 4 warps was the fastest (0.051, 0.057, 0.044 ms against 0.056, 0.061,
    0.051 at 128 × 64 on 8 warps), so a biased kernel with fewer programs than that (`batch_heads`
    given) takes it.
    """
    del target
    wide = max(params.head_dim, params.value_dim) > 64
    block_m = min(64 if wide else 128, max(16, next_pow2(hint(q_len))))
    block_n = min(32 if params.bias and wide else 64, max(16, next_pow2(hint(kv_len))))
    if params.bias and block_m == 128:
        programs = -(-hint(q_len) // 128) * hint(batch_heads) if batch_heads is not None else None
        if programs is not None and programs < 2 * HOPPER_SMS:
            return AttentionConfig(64, min(32, block_n), 4, 2)
        return AttentionConfig(block_m, block_n, 8, 3)
    return AttentionConfig(block_m, block_n, 4, 2)


def launch_grid(q_len: Any, batch_heads: Any, block_m: int) -> list[Any]:
    """One program per BLOCK_M query rows of each (batch, head): a size expression when symbolic."""
    if is_symbolic(q_len) or is_symbolic(batch_heads):
        from fxcc.compiler_core.sizevars import FloorDiv

        return [FloorDiv(q_len + block_m - 1, block_m) * batch_heads]
    return [-(-int(q_len) // block_m) * int(batch_heads)]


_BODY = '''\
# fxcc-attention {facts}
@triton.jit
def {name}(Q, K, V, {bias_ptr}O,
           q_off, q_sz, q_sh, q_sm, k_off, k_sz, k_sh, k_sn, v_off, v_sz, v_sh, v_sn,{bias_ints}
           o_sz, o_sh, o_sm, batch, heads, q_len, kv_len,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tiles = tl.cdiv(q_len, BLOCK_M)
    pid = tl.program_id(0)
    tile = pid % tiles
    zh = pid // tiles
    z = (zh // heads).to(tl.int64)
    h = (zh % heads).to(tl.int64)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len
    dq = tl.arange(0, {head_dim})
    dv = tl.arange(0, {value_dim})
    q_base = Q + q_off + z * q_sz + h * q_sh
    k_base = K + k_off + z * k_sz + h * k_sh
    v_base = V + v_off + z * v_sz + h * v_sh
{bias_base}
    q = tl.load(q_base + rows[:, None] * q_sm + dq[None, :], mask=row_ok[:, None], other=0.0)
    # running row maximum (of {units} scores), row sum of exponentials, P @ V
    m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_run = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, {value_dim}], tl.float32)
{key_end}
    for start in range({loop_range}, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < kv_len
        kt = tl.load(k_base + cols[None, :] * k_sn + dq[:, None], mask=col_ok[None, :], other=0.0)
        s = tl.dot(q, kt{precision}) * {scale}
{keep}
{softmax}
        l_run = l_run * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * v_sn + dv[None, :], mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to({dot_dtype}), v{precision})
        m_run = m_new
{finish}
    o_ptrs = O + z * o_sz + h * o_sh + rows[:, None] * o_sm + dv[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])
'''

# Note: a key tile whose every bias (of this program's rows) is -inf adds nothing (p = 0, m and l
# unchanged): the loop runs from the first tile holding a kept key to the last one (found by loading
# the bias tiles from either end, until one keeps a key). A causal mask's tiles past the diagonal,
# a padding mask's padded keys and a sliding window's keys outside it are never computed; tiles
# between the bounds are computed as they are. A NaN bias counts as kept (eager's NaN comes out);
# a NaN or inf in K or V at keys of a skipped tile does not come out (0 · NaN is NaN in eager's
# math path), as in any flash kernel that skips masked blocks.
_BIAS_BOUNDS = '''\
    hi = tl.full([], 0, tl.int32) + tl.cdiv(key_end, BLOCK_N)
    live = tl.full([], 0, tl.int32)
    while (live == 0) & (hi > 0):
        cols = (hi - 1) * BLOCK_N + tl.arange(0, BLOCK_N)
        bias = tl.load(b_base + rows[:, None] * b_sm + {b_cols},
                       mask=row_ok[:, None] & (cols < kv_len)[None, :], other=float("-inf"))
        live = tl.sum(tl.sum((bias != float("-inf")).to(tl.int32), 1), 0)
        hi = tl.where(live == 0, hi - 1, hi)
    lo = tl.full([], 0, tl.int32)
    live = tl.full([], 0, tl.int32)
    while (live == 0) & (lo < hi):
        cols = lo * BLOCK_N + tl.arange(0, BLOCK_N)
        bias = tl.load(b_base + rows[:, None] * b_sm + {b_cols},
                       mask=row_ok[:, None] & (cols < kv_len)[None, :], other=float("-inf"))
        live = tl.sum(tl.sum((bias != float("-inf")).to(tl.int32), 1), 0)
        lo = tl.where(live == 0, lo + 1, lo)'''

_BOUND_LOAD = '''\
        bias = tl.load(b_base + rows[:, None] * b_sm + {b_cols},
                       mask=row_ok[:, None] & (cols < kv_len)[None, :], other=float("-inf"))'''

_PLAIN_SOFTMAX = '''\
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_run, tl.max(s, 1))
        alpha = tl.exp2(m_run - m_new)
        p = tl.exp2(s - m_new[:, None])'''
# Note: natural units; a row with no finite score yet exponentiates against 0 (all its terms 0).
_SOFTMAX_LOAD = '''\
        bias = tl.load(b_base + rows[:, None] * b_sm + {b_cols},
                       mask=row_ok[:, None] & col_ok[None, :], other=0.0)'''
_BIAS_SOFTMAX = _SOFTMAX_LOAD + '''
        s = tl.where(keep, s + bias.to(tl.float32), float("-inf"))
        m_new = tl.maximum(m_run, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2((m_run - m_use) * 1.4426950408889634)
        p = tl.exp2((s - m_use[:, None]) * 1.4426950408889634)'''


# A bias computed per tile (AttentionParams.bias_mod): the tile's coordinates, then the expression's
# statements and value (codegen.flex_mods.render_tile), loads masked to the tile's range.
_TILE = '''\
{pad}bias_i = tl.broadcast_to(rows[:, None], (BLOCK_M, BLOCK_N))
{pad}bias_j = tl.broadcast_to(cols[None, :], (BLOCK_M, BLOCK_N))
{pad}bias_ok = row_ok[:, None] & {cols_ok}[None, :]
{lines}'''


def _tile_lines(mod: ModText, pad: str, cols_ok: str) -> tuple[str, str]:
    """(statements, value) of a per-tile bias at indentation `pad`."""
    lines = mod.indented(pad, {})
    return _TILE.format(pad=pad, cols_ok=cols_ok, lines=lines).rstrip("\n"), mod.value_of({})


def _mod_bias_fields(params: AttentionParams, key_end: str, target: str) -> dict[str, str]:
    """The template's fields for a bias computed per tile: pointers B0.. (one per tensor it reads),
    no bias strides, the loop bounds scanned and the scores biased as with a bias read whole."""
    tb = params.bias_mod
    assert tb is not None
    buffers = {name: (f"B{i}", dtype) for i, (name, dtype) in enumerate(tb.buffers)}
    mod = render_tile(lambda: tb.loader(list(tb.index)), buffers, "bx", target, torch.float32)
    pointers = "".join(f"B{i}, " for i in range(len(tb.buffers)))
    scan, scan_value = _tile_lines(mod, " " * 8, "(cols < kv_len)")
    scan_tile = f"{scan}\n        bias = tl.where(bias_ok, {scan_value}, float(\"-inf\"))"
    bounds = _BIAS_BOUNDS.replace(_BOUND_LOAD, scan_tile)
    soft, soft_value = _tile_lines(mod, " " * 8, "col_ok")
    softmax = _BIAS_SOFTMAX.replace(_SOFTMAX_LOAD, f"{soft}\n        bias = {soft_value}")
    return {
        "bias_ptr": pointers, "bias_ints": "", "bias_base": key_end + "\n" + bounds,
        "units": "natural", "scale": repr(float(params.scale)), "softmax": softmax,
        "finish": "    out = acc / tl.where(l_run == 0.0, 1.0, l_run)[:, None]",
        "key_end": "", "loop_range": "lo * BLOCK_N, hi * BLOCK_N",
    }


@dataclass(frozen=True)
class RenderedTemplate:
    name: str
    source: str
    config: AttentionConfig


def render_attention(params: AttentionParams, config: AttentionConfig, target: str = "cuda") -> RenderedTemplate:
    """The Triton source of one attention kernel; its name is a hash of the source and config.

    Note: the config is part of the name for the reason codegen.triton gives (a grid sized for
    one BLOCK_M must never launch another's kernel); tuning keeps the name and regrids.
    """
    if params.head_dim not in HEAD_DIMS or params.value_dim not in HEAD_DIMS:
        raise ValueError(f"head dims {params.head_dim}, {params.value_dim} are not in {HEAD_DIMS}")
    if not (math.isfinite(params.scale) and params.scale > 0):
        raise ValueError(f"scale {params.scale} is not a positive finite number")
    fp32 = params.dtype == torch.float32
    precision = f', input_precision="{params.precision}"' if fp32 else ""
    if params.causal:
        # Note: keys past the tile's last row are masked for every row of it: stop there.
        key_end = "    key_end = tl.minimum(kv_len, (tile + 1) * BLOCK_M)"
        keep = "        keep = col_ok[None, :] & (cols[None, :] <= rows[:, None])"
    else:
        key_end = "    key_end = kv_len"
        keep = "        keep = col_ok[None, :]"
    fields = {
        "head_dim": params.head_dim, "value_dim": params.value_dim, "key_end": key_end, "keep": keep,
        "precision": precision, "dot_dtype": TL_DTYPES[params.dtype],
    }
    if params.bias_mod is not None:
        fields |= _mod_bias_fields(params, key_end, target)
    elif params.bias:
        b_cols = "cols[None, :]" if params.bias_dense else "cols[None, :] * b_sn"
        fields |= {
            "bias_ptr": "B, ", "bias_ints": "\n           b_off, b_sz, b_sh, b_sm, b_sn,",
            # the loop's bounds found before q and the accumulators take their registers
            "bias_base": "    b_base = B + b_off + z * b_sz + h * b_sh\n" + key_end + "\n" + _BIAS_BOUNDS.format(b_cols=b_cols),
            "units": "natural",
            "scale": repr(float(params.scale)), "softmax": _BIAS_SOFTMAX.format(b_cols=b_cols),
            "finish": "    out = acc / tl.where(l_run == 0.0, 1.0, l_run)[:, None]",
            "key_end": "", "loop_range": "lo * BLOCK_N, hi * BLOCK_N",
        }
    else:
        fields |= {
            "bias_ptr": "", "bias_ints": "", "bias_base": "", "units": "log2-scaled",
            "scale": repr(float(params.scale) * math.log2(math.e)), "softmax": _PLAIN_SOFTMAX,
            "finish": "    out = acc / l_run[:, None]", "loop_range": "0, key_end",
        }
    fields["facts"] = (f"head_dim={params.head_dim} value_dim={params.value_dim} "
                       f"dtype={str(params.dtype).removeprefix('torch.')} precision={params.precision if fp32 else 'none'} "
                       f"causal={int(params.causal)} bias={int(params.bias)} bias_dense={int(params.bias_dense)}")
    if params.bias_mod is not None:
        fields["facts"] += " bias_buffers=" + ",".join(f"{dtype}:{span}" for dtype, span in params.bias_buffers)
    body = _BODY.format(name="{name}", **fields)
    digest = hashlib.sha256(f"{body}\n{sorted(config.constexprs.items())}\n{config.num_warps}\n"
                            f"{config.num_stages}".encode()).hexdigest()[:16]
    name = f"{KERNEL_PREFIX}{digest}"
    source = "import triton\nimport triton.language as tl\n\n\n" + body.format(name=name)
    return RenderedTemplate(name, source, config)


def render_template(item: Any, target: str) -> RenderedKernel:
    """The kernel of a lowering.TemplateKernel, with its heuristic launch config and grid."""
    sizes = item.sizes
    config = heuristic_config(item.params, sizes["q_len"], sizes["kv_len"], target, sizes["batch_heads"])
    r = render_attention(item.params, config, target)
    grid = launch_grid(sizes["q_len"], sizes["batch_heads"], config.block_m)
    return RenderedKernel(r.name, r.source, [], None, None, grid, config.constexprs, config.num_warps,
                          num_stages=config.num_stages)


def source_facts(source: str) -> dict[str, str]:
    """What a rendered template's source says of itself (its `# fxcc-attention` line): head_dim,
    value_dim, dtype, precision ("tf32", "ieee", "none" off fp32), causal, bias."""
    for line in source.splitlines():
        if line.startswith("# fxcc-attention "):
            return dict(item.split("=", 1) for item in line.split()[2:])
    raise ValueError("not an fxcc attention template")


def int_args(step_args: list[Any]) -> dict[str, Any]:
    """A template launch's integer arguments by name (the values after its pointers: q, k, v, the
    bias where it has one, or the tensors a bias computed per tile reads, and out)."""
    pointers = next((i for i, a in enumerate(step_args) if getattr(a, "kind", None) != "node"), len(step_args))
    values = [getattr(a, "value", None) for a in step_args[pointers:]]
    strided = len(values) == len(INT_ARGS) + len(BIAS_INT_ARGS)  # a bias read whole, by its strides
    names = INT_ARGS[:12] + BIAS_INT_ARGS + INT_ARGS[12:] if strided else INT_ARGS
    if pointers < 4 or (strided and pointers != 5) or len(values) != len(names):
        raise ValueError(f"an attention launch takes 4 or more pointers and {len(names)} integers, "
                         f"got {pointers} and {len(values)}")
    return dict(zip(names, values))

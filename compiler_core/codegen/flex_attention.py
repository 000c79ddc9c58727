"""fxcc's flex_attention kernels: a forward (out, logsumexp) and a backward (dq, dk, dv) Triton template with
score_mod and mask_mod inlined (codegen.flex_mods), iterating only the blocks the block mask lists.

Note: the forward is flash attention over the block mask's kv blocks. One program holds BLOCK_M
query rows of one (batch, head); it walks the kv blocks kv_indices lists for its sparse query
block (`partial` ones: mask_mod applied) and then the full_kv_indices ones (mask_mod skipped:
every entry is kept), each sparse block in BLOCK_N tiles, in one flat loop (so Triton pipelines
its loads). Online softmax in base 2 as in codegen.attention: m (running max of log2-scaled
scores after score_mod), l (running sum), acc (P @ V in fp32); logsumexp comes out in log2 units,
as torch's flex HOP gives it; a row with no kept key gives out 0 and logsumexp -inf (eager's).

The backward is one launch of two kinds of program, for each (batch, kv head) kv_tiles of the
first kind then q_tiles * group of the second (Inductor's order: the programs of one head sit
together, and read its q, k, v and dO while they are in L2). The first each own BLOCK_N1 keys: for
each query head of their group and each query block the transposed block mask lists
(q_indices / full_q_indices) they recompute P^T from q, k and logsumexp and accumulate
dV += P^T dO and dK += dS^T Q; the others own BLOCK_M2 query rows and accumulate dQ += dS K over
the kv blocks, where dS = joint(P * (dP - delta)) and delta (rowsum(out * dO), less the
logsumexp's gradient) is computed beforehand by fxcc's own fused reduction; dK and dQ are
multiplied by the scale once, after their loops. dS is rounded to the input dtype before its
matmuls, as eager's backward rounds it.

Note: the backward is Inductor's algorithm (torch/_inductor/kernel/flex/templates/
flex_backwards.py.jinja, torch 2.11 to 2.13) at its sm_90 tiles (heuristic_config): one launch of
dk/dv then dq programs per (batch, kv head), k and v (or q and dO) held for the whole walk, P
recomputed from the logsumexp, dV += P^T dO, dK += dS^T Q, dQ += dS K, no TMA (Inductor's default
leaves it off on CUDA), the scale applied to dK and dQ once (fxcc had scaled each dS tile: a
multiply of every element per trip). Each block walk carries its tile's index from trip to trip
(_block_loop), as Inductor's does; fxcc's had loaded each trip's block index in that trip, and
Triton pipelined the full-block loops (a causal mask's bulk) one tile deep only. The logsumexp
rows are dense (the lowering lays them out so), so their loads vectorise, as Inductor's do. Left
different: Inductor's grid is (programs, batch, kv head), fxcc's one axis in the same order per
head; Inductor loads two block indices per trip, fxcc one; with no score_mod the scores' scale
and log2(e) are one multiply (as fxcc's forward), where Inductor multiplies twice.

Tensors are addressed by base pointer + offset + z * s_z + h * s_h + row * s_row + d, every
offset and stride a kernel argument (the innermost dim dense); a block mask of batch or head 1
is broadcast by a stride 0.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from fxcc.compiler_core.codegen.flex_mods import ModText
from fxcc.compiler_core.codegen.triton import HELPERS, TL_DTYPES, RenderedKernel
from fxcc.compiler_core.symbolic import is_symbolic

KERNEL_PREFIX = "fxcc_flex_"
HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = math.log2(math.e)

# Registers of the mods, by the name their graphs' inputs load (flex_lowering.py).
SCORE, BATCH, HEAD, Q_IDX, KV_IDX, GRAD = "score", "b", "h", "m", "n", "grad"


def _mask_args(prefix: str) -> tuple[str, ...]:
    return (f"{prefix}n_off", f"{prefix}n_sz", f"{prefix}n_sh", f"{prefix}i_off", f"{prefix}i_sz",
            f"{prefix}i_sh", f"{prefix}i_sq")


FWD_INTS = ("q_off", "q_sz", "q_sh", "q_sm", "k_off", "k_sz", "k_sh", "k_sn", "v_off", "v_sz", "v_sh", "v_sn",
            "o_sz", "o_sh", "o_sm", *_mask_args("kv"), *_mask_args("fkv"), "batch", "heads", "q_len", "kv_len")
BWD_INTS = ("q_off", "q_sz", "q_sh", "q_sm", "k_off", "k_sz", "k_sh", "k_sn", "v_off", "v_sz", "v_sh", "v_sn",
            "do_off", "do_sz", "do_sh", "do_sm", "l_off", "l_sz", "l_sh",
            "dq_sz", "dq_sh", "dq_sm", "dk_sz", "dk_sh", "dk_sn", "dv_sz", "dv_sh", "dv_sn",
            *_mask_args("kv"), *_mask_args("fkv"), *_mask_args("q"), *_mask_args("fq"),
            "batch", "heads", "kv_heads", "q_len", "kv_len")


@dataclass(frozen=True)
class FlexParams:
    """What one flex kernel's source depends on (sizes, strides and offsets are arguments)."""

    kind: str  # "forward" or "backward"
    head_dim: int
    value_dim: int
    dtype: torch.dtype
    scale: float
    group: int  # query heads per kv head
    score: ModText
    mask: ModText
    joint: ModText | None  # backward: d score_mod / d score, times the incoming gradient
    has_full: bool  # full_kv_* (backward: full_q_* too) given
    n_score_bufs: int
    n_mask_bufs: int
    sparse_q: int  # the block mask's Q_BLOCK_SIZE and KV_BLOCK_SIZE
    sparse_kv: int
    n_stats: int = 1  # forward: logsumexp only (1) or logsumexp and max_scores (2)
    tiles: tuple[tuple[str, int], ...] = ()  # the launch config the user's kernel_options set (tile_options)


TILE_OPTIONS = {"forward": ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"),
                "backward": ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "num_warps", "num_stages")}
WARPS = (1, 2, 4, 8, 16)
MAX_STAGES = 8


def tile_options(kernel_options: dict[str, Any], kind: str) -> tuple[tuple[str, int], ...]:
    """The launch config a flex_attention call's kernel_options set for the `kind` kernel, as
    Inductor reads them: BLOCK_M / BLOCK_N (forward), BLOCK_M1 / BLOCK_N1 / BLOCK_M2 / BLOCK_N2
    (backward), num_warps, num_stages, each also as `fwd_NAME` / `bwd_NAME` for one kernel only
    (which wins over NAME). Other options are not tiles and are left to eager's path. ValueError
    for a block that is no power of two of at least 16, or warps or stages out of range."""
    prefix = "fwd_" if kind == "forward" else "bwd_"
    out = {}
    for name in TILE_OPTIONS[kind]:
        value = kernel_options.get(prefix + name, kernel_options.get(name))
        if value is None:
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        if name.startswith("BLOCK"):
            ok = whole and value >= 16 and not value & (value - 1)
        else:
            ok = whole and (value in WARPS if name == "num_warps" else 1 <= value <= MAX_STAGES)
        if not ok:
            raise ValueError(f"flex_attention kernel option {name}={value!r} is no block (a power of two >= 16), "
                             f"warp count {WARPS} or stage count (1 to {MAX_STAGES})")
        out[name] = value
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class FlexConfig:
    """Tiles: forward BLOCK_M x BLOCK_N; backward BLOCK_M1 x BLOCK_N1 (dk/dv), BLOCK_M2 x BLOCK_N2 (dq)."""

    blocks: tuple[tuple[str, int], ...]
    num_warps: int
    num_stages: int

    @property
    def constexprs(self) -> dict[str, int]:
        return dict(self.blocks)


def _fit(block: int, sparse: int, length: int) -> int:
    """`block` no wider than the sparse block (whose tiles it cuts) nor the length's power of two."""
    cap = 1 << max(4, (max(length, 1) - 1).bit_length())
    return max(16, min(block, sparse, cap))


def heuristic_config(params: FlexParams, q_len: int, kv_len: int, target: str) -> FlexConfig:
    """The launch config: Inductor's sm_90 defaults for flex on CUDA, small tiles in the interpreter
    (whose cost is per element of a tile), less what the call's kernel_options set (params.tiles).

    Note: Inductor's (torch 2.11 to 2.13, template_heuristics/triton.py): forward
    h100_default_flex_config by (dtype, head dim), (64, 64, 4 warps, 3 stages) for a head dim it
    does not list; backward the "sm90" FlexBwDConfig, (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2)
    64/64/64/64 on 4 warps below head dim 64, 64/128/128/64 on 8 warps up to 128, 3 stages, and
    16/16/16/16 on 4 warps and 1 stage for fp32. Inductor keys on the qk head dim, fxcc on the
    larger of it and the value dim. Departures, measured on the H200 (bench/README.md, flex_attention;
    bf16, causal and sliding-window masks): 16-bit forwards of head dim 64 and 128 take 64x64 tiles
    on 4 warps (B4 H16 S2048 D64 causal: 0.123 ms of kernel against 0.143 at Inductor's 128x128;
    B2 H16 S4096 D128: 0.352 against 0.386 at 128x64 on 8 warps), backwards of head dim 64
    64/64/64/64 on 4 warps (causal forward+backward 0.455 ms against 0.509 at 64/128/128/64 on 8),
    of head dim 128 32/64/64/32 on 4 warps (1.356 against 1.389: 64/128/128/64 spills registers).
    """
    d = max(params.head_dim, params.value_dim)
    fp32 = params.dtype == torch.float32
    if params.kind == "forward":
        if target != "cuda":
            config = (32, 32, 4, 1)
        elif d < 64:  # no entry in Inductor's table: its default
            config = (64, 64, 4, 3)
        elif fp32:
            config = (128, 32, 4, 3) if d == 64 else (32, 64, 4, 3)
        else:
            config = (64, 64, 4, 3) if d in (64, 128) else (128, 64, 8, 3)
    elif target != "cuda":
        config = (32, 32, 32, 32, 4, 1)
    elif fp32:
        config = (16, 16, 16, 16, 4, 1)
    elif d <= 64:
        config = (64, 64, 64, 64, 4, 3)
    elif d == 128:
        config = (32, 64, 64, 32, 4, 3)
    else:
        config = (64, 128, 128, 64, 8, 3)
    chosen = dict(zip(TILE_OPTIONS[params.kind], config)) | dict(params.tiles)
    blocks = []
    for name in TILE_OPTIONS[params.kind][:-2]:  # BLOCK_N*: keys, cut from KV_BLOCK_SIZE; BLOCK_M*: query rows
        keys = name.startswith("BLOCK_N")
        blocks.append((name, _fit(chosen[name], params.sparse_kv if keys else params.sparse_q,
                                  kv_len if keys else q_len)))
    return FlexConfig(tuple(blocks), chosen["num_warps"], chosen["num_stages"])


def launch_grid(params: FlexParams, config: FlexConfig, sizes: dict[str, int]) -> list[int]:
    c = config.constexprs
    if params.kind == "forward":
        return [-(-sizes["q_len"] // c["BLOCK_M"]) * sizes["batch"] * sizes["heads"]]
    dkdv = -(-sizes["kv_len"] // c["BLOCK_N1"]) * sizes["batch"] * sizes["kv_heads"]
    return [dkdv + -(-sizes["q_len"] // c["BLOCK_M2"]) * sizes["batch"] * sizes["heads"]]


def _pointers(params: FlexParams, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> str:
    bufs = [f"SB{i}" for i in range(params.n_score_bufs)] + [f"MB{i}" for i in range(params.n_mask_bufs)]
    return ", ".join([*inputs, *bufs, *outputs])


def _block_loop(pad: str, mask: str, sparse_other: int, tile: str, sub: int, lo_var: str, body: str,
                head: str) -> str:
    """A flat loop over the `mask` (kv / fkv / q / fq) block list's tiles of one sparse block row:
    `sub` tiles of `tile` per listed block (a constexpr), the tile's first index in `lo_var`.

    Note: `lo_var` is carried from trip to trip (one tile on, or after a block's last tile the next
    listed block's first index, loaded one trip ahead), the walk of Inductor's
    get_offset_for_next_block. A tile's address then depends on no load of its own trip, and
    Triton's pipeliner prefetches num_stages - 1 tiles ahead in every loop. Where each trip loaded
    its own block index, the pipeliner (Triton 3.6 and 3.9, sm_90) gave the second loop of a program
    (the full blocks: most of a causal mask's work) two buffers and a wait for every copy at each
    trip, so its loads stalled the MMAs. The first index is loaded unmasked, beside the list's
    length rather than after it (every index row has at least one entry, as Inductor assumes): a
    short walk (a sliding window's: two partial blocks, one full) then waits for one load, not two
    in a row, before its first tile's copies start.
    """
    step = (f"{pad}    {lo_var} = nxt * {sparse_other}\n" if sub == 1 else
            f"{pad}    {lo_var} = tl.where((it + 1) % {sub} == 0, nxt * {sparse_other}, {lo_var} + {tile})\n")
    return (f"{pad}n_list = tl.load({mask.upper()}N + {mask}n_off + z * {mask}n_sz + {head} * {mask}n_sh + sblock)\n"
            f"{pad}idx_base = {mask.upper()}I + {mask}i_off + z * {mask}i_sz + {head} * {mask}i_sh + sblock * {mask}i_sq\n"
            f"{pad}{lo_var} = tl.load(idx_base) * {sparse_other}\n"
            f"{pad}for it in range(0, n_list * {sub}):\n"
            f"{body}"
            f"{pad}    nxt = tl.load(idx_base + it // {sub} + 1, mask=it // {sub} + 1 < n_list, other=0, "
            f"eviction_policy=\"evict_last\")\n"
            f"{step}")


def _mods(params: FlexParams, pad: str, regs: dict[str, str], masked: bool) -> tuple[str, list[str]]:
    """Statements of score_mod (and mask_mod where `masked`) and the terms of `keep` they add."""
    text = params.score.indented(pad, regs)
    keep = []
    if masked:
        text += params.mask.indented(pad, regs)
        keep.append(f"({params.mask.value_of(regs)})")
    return text, keep


def _keep(pad: str, terms: list[str]) -> tuple[str, str]:
    """(the statement defining `keep`, or nothing when every entry is kept; an expression of `s` masked by it)."""
    if not terms:
        return "", "{}"
    return f"{pad}keep = {' & '.join(terms)}\n", "tl.where(keep, {}, float(\"-inf\"))"


def _sub_tiles(sparse: int, length: int, tile: int) -> int:
    return max(1, -(-min(sparse, length) // tile))


def _even(length: int, tile: int, sparse: int) -> bool:
    """Whether every tile the block loops visit lies inside `length` (no bounds masks needed):
    tiles cut it evenly, and so do the sparse blocks (or one block covers it all)."""
    return length % tile == 0 and (length % sparse == 0 or sparse >= length)


def _is_identity(mod: ModText) -> bool:
    return not mod.lines and mod.value == f"@{SCORE}@"


def _dot(params: FlexParams, target: str) -> tuple[str, Any]:
    """(the dtype P and dS are rounded to before their matmuls, a function spelling `a @ b`).

    Note: Triton's CPU interpreter computes bf16 tl.dot wrongly (errors of 1e10 on a 16x16 product
    in triton 3.8), so there bf16 operands are widened to fp32 first (exact: each bf16 is an fp32).
    """
    dot = TL_DTYPES[params.dtype]
    if params.dtype == torch.float32:
        return dot, lambda a, b: f'tl.dot({a}, {b}, input_precision="ieee")'
    if params.dtype == torch.bfloat16 and target != "cuda":
        return dot, lambda a, b: f"tl.dot(({a}).to(tl.float32), ({b}).to(tl.float32))"
    return dot, lambda a, b: f"tl.dot({a}, {b})"


def _reads_score(mod: ModText) -> bool:
    return any(f"@{SCORE}@" in text for text in (*mod.lines, mod.value))


def _scores(params: FlexParams, pad: str, var: str, product: str, regs: dict[str, str], fold: bool) -> tuple[str, str]:
    """(the statement setting `var` to the scores, the expression of the log2-scaled scores after score_mod).

    Note: with no score_mod (and, backward, a joint graph that does not read the score), scale and
    log2(e) fold into one multiply of the product, in the backward as in the forward, so that both
    compute the same P.
    """
    if fold and _is_identity(params.score):
        return f"{pad}{var} = {product}\n", f"{var} * {params.scale * LOG2E!r}"
    return f"{pad}{var} = {product} * {params.scale!r}\n", f"({params.score.value_of(regs)}) * {LOG2E!r}"


def _forward_body(params: FlexParams, masked: bool, dot: str, mm: Any, even_kv: bool) -> str:
    pad = " " * 8
    regs = {f"@{SCORE}@": "qk", f"@{BATCH}@": "off_b", f"@{HEAD}@": "off_h", f"@{Q_IDX}@": "m_idx",
            f"@{KV_IDX}@": "n_idx"}
    mods, terms = _mods(params, pad, regs, masked)
    bounds = ""
    k_mask = v_mask = ""
    if not even_kv:
        bounds = f"{pad}col_ok = cols < kv_len\n"
        k_mask, v_mask = ", mask=col_ok[None, :], other=0.0", ", mask=col_ok[:, None], other=0.0"
        terms = ["col_ok[None, :]", *terms]
    keep, where = _keep(pad, terms)
    scores, post = _scores(params, pad, "qk", mm("q", "kt"), regs, fold=True)
    return (f"{pad}cols = start + tl.arange(0, BLOCK_N)\n"
            f"{bounds}"
            f"{pad}kt = tl.load(k_base + cols[None, :] * k_sn + dq[:, None]{k_mask})\n"
            f"{scores}"
            f"{pad}n_idx = cols[None, :]\n"
            f"{mods}"
            f"{keep}"
            f"{pad}s = {where.format(post)}\n"
            f"{pad}m_new = tl.maximum(m_run, tl.max(s, 1))\n"
            f"{pad}m_safe = tl.where(m_new == float(\"-inf\"), 0.0, m_new)\n"
            f"{pad}alpha = tl.exp2(m_run - m_safe)\n"
            f"{pad}p = tl.exp2(s - m_safe[:, None])\n"
            f"{pad}l_run = l_run * alpha + tl.sum(p, 1)\n"
            f"{pad}v = tl.load(v_base + cols[:, None] * v_sn + dv[None, :]{v_mask})\n"
            f"{pad}acc = acc * alpha[:, None] + {mm(f'p.to({dot})', 'v')}\n"
            f"{pad}m_run = m_new\n")


def render_forward(params: FlexParams, config: FlexConfig, q_len: int, kv_len: int, target: str) -> str:
    dot, mm = _dot(params, target)
    c = config.constexprs
    sub = _sub_tiles(params.sparse_kv, kv_len, c["BLOCK_N"])
    inputs = ("Q", "K", "V", "KVN", "KVI") + (("FKVN", "FKVI") if params.has_full else ())
    outputs = ("O", "LSE") + (("MAX",) if params.n_stats == 2 else ())
    ints = int_names(params)
    even_kv = _even(kv_len, c["BLOCK_N"], params.sparse_kv)
    loops = _block_loop("    ", "kv", params.sparse_kv, "BLOCK_N", sub, "start",
                        _forward_body(params, True, dot, mm, even_kv), "hq")
    if params.has_full:
        loops += _block_loop("    ", "fkv", params.sparse_kv, "BLOCK_N", sub, "start",
                             _forward_body(params, False, dot, mm, even_kv), "hq")
    store_max = ("    tl.store(MAX + (zh.to(tl.int64) * q_len + rows), m_run, mask=row_ok)\n"
                 if params.n_stats == 2 else "")
    return (f"@triton.jit\n"
            f"def {{name}}({_pointers(params, inputs, outputs)},\n"
            f"        {', '.join(ints)},\n"
            f"        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):\n"
            f"    tiles = tl.cdiv(q_len, BLOCK_M)\n"
            f"    pid = tl.program_id(0)\n"
            f"    tile = pid % tiles\n"
            f"    zh = pid // tiles\n"
            f"    off_b = zh // heads\n"
            f"    off_h = zh % heads\n"
            f"    z = off_b.to(tl.int64)\n"
            f"    hq = off_h.to(tl.int64)\n"
            f"    hk = (off_h // {params.group}).to(tl.int64)\n"
            f"    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)\n"
            f"    row_ok = rows < q_len\n"
            f"    dq = tl.arange(0, {params.head_dim})\n"
            f"    dv = tl.arange(0, {params.value_dim})\n"
            f"    q = tl.load(Q + q_off + z * q_sz + hq * q_sh + rows[:, None] * q_sm + dq[None, :], "
            f"mask=row_ok[:, None], other=0.0)\n"
            f"    k_base = K + k_off + z * k_sz + hk * k_sh\n"
            f"    v_base = V + v_off + z * v_sz + hk * v_sh\n"
            f"    m_run = tl.full([BLOCK_M], float(\"-inf\"), tl.float32)\n"
            f"    l_run = tl.zeros([BLOCK_M], tl.float32)\n"
            f"    acc = tl.zeros([BLOCK_M, {params.value_dim}], tl.float32)\n"
            f"    m_idx = rows[:, None]\n"
            f"    sblock = (tile * BLOCK_M) // {params.sparse_q}\n"
            f"{loops}"
            f"    empty = l_run == 0.0\n"
            f"    out = acc / tl.where(empty, 1.0, l_run)[:, None]\n"
            f"    tl.store(O + z * o_sz + hq * o_sh + rows[:, None] * o_sm + dv[None, :], out.to(O.dtype.element_ty), "
            f"mask=row_ok[:, None])\n"
            f"    lse = tl.where(empty, float(\"-inf\"), m_run + tl.log2(tl.where(empty, 1.0, l_run)))\n"
            f"    tl.store(LSE + (zh.to(tl.int64) * q_len + rows), lse, mask=row_ok)\n"
            f"{store_max}")


def _dkdv_body(params: FlexParams, masked: bool, dot: str, mm: Any, even: bool) -> str:
    pad = " " * 16
    regs = {f"@{SCORE}@": "qkT", f"@{BATCH}@": "off_b", f"@{HEAD}@": "off_h", f"@{Q_IDX}@": "m_idx",
            f"@{KV_IDX}@": "n_idx", f"@{GRAD}@": "dsT"}
    mods, terms = _mods(params, pad, regs, masked)
    bounds, q_mask, do_mask, row_mask = "", "", "", ""
    if not even:
        bounds = f"{pad}row_ok = rows < q_len\n"
        q_mask, do_mask = ", mask=row_ok[None, :], other=0.0", ", mask=row_ok[:, None], other=0.0"
        row_mask = ", mask=row_ok, other=0.0"
        terms = ["row_ok[None, :] & col_ok[:, None]", *terms]
    keep, where = _keep(pad, terms)
    grad = params.joint.value_of(regs)
    scores, post = _scores(params, pad, "qkT", mm("k", "qt"), regs, fold=not _reads_score(params.joint))
    return (f"{pad}rows = start + tl.arange(0, BLOCK_M1)\n"
            f"{bounds}"
            f"{pad}qt = tl.load(q_base + rows[None, :] * q_sm + dq[:, None]{q_mask})\n"
            f"{pad}lse = tl.load(l_base + rows{row_mask})\n"
            f"{pad}lse = tl.where(lse == float(\"-inf\"), 0.0, lse)\n"
            f"{scores}"
            f"{pad}m_idx = rows[None, :]\n"
            f"{mods}"
            f"{keep}"
            f"{pad}pT = tl.exp2({where.format(post)} - lse[None, :])\n"
            f"{pad}do = tl.load(do_base + rows[:, None] * do_sm + dv[None, :]{do_mask})\n"
            f"{pad}dv_acc += {mm(f'pT.to({dot})', 'do')}\n"
            f"{pad}di = tl.load(d_base + rows{row_mask})\n"
            f"{pad}dpT = {mm('v', 'tl.trans(do)')}\n"
            f"{pad}dsT = pT * (dpT - di[None, :])\n"
            f"{params.joint.indented(pad, regs)}"
            f"{pad}dsT = {f'tl.where(keep, {grad}, 0.0)' if keep else grad}\n"
            f"{pad}dk_acc += {mm(f'dsT.to({dot})', 'tl.trans(qt)')}\n")


def _dq_body(params: FlexParams, masked: bool, dot: str, mm: Any, even: bool) -> str:
    pad = " " * 12
    regs = {f"@{SCORE}@": "qk", f"@{BATCH}@": "off_b", f"@{HEAD}@": "off_h", f"@{Q_IDX}@": "m_idx",
            f"@{KV_IDX}@": "n_idx", f"@{GRAD}@": "ds"}
    mods, terms = _mods(params, pad, regs, masked)
    bounds, kv_mask = "", ""
    if not even:
        bounds = f"{pad}col_ok = cols < kv_len\n"
        kv_mask = ", mask=col_ok[None, :], other=0.0"
        terms = ["col_ok[None, :]", *terms]
    keep, where = _keep(pad, terms)
    grad = params.joint.value_of(regs)
    scores, post = _scores(params, pad, "qk", mm("q", "kt"), regs, fold=not _reads_score(params.joint))
    return (f"{pad}cols = start + tl.arange(0, BLOCK_N2)\n"
            f"{bounds}"
            f"{pad}kt = tl.load(k_base + cols[None, :] * k_sn + dq[:, None]{kv_mask})\n"
            f"{pad}vt = tl.load(v_base + cols[None, :] * v_sn + dv[:, None]{kv_mask})\n"
            f"{scores}"
            f"{pad}n_idx = cols[None, :]\n"
            f"{mods}"
            f"{keep}"
            f"{pad}p = tl.exp2({where.format(post)} - lse[:, None])\n"
            f"{pad}dp = {mm('do', 'vt')}\n"
            f"{pad}ds = p * (dp - di[:, None])\n"
            f"{params.joint.indented(pad, regs)}"
            f"{pad}ds = {f'tl.where(keep, {grad}, 0.0)' if keep else grad}\n"
            f"{pad}dq_acc += {mm(f'ds.to({dot})', 'tl.trans(kt)')}\n")


def render_backward(params: FlexParams, config: FlexConfig, q_len: int, kv_len: int, target: str) -> str:
    dot, mm = _dot(params, target)
    c = config.constexprs
    full = params.has_full
    inputs = ("Q", "K", "V", "DO", "LSE", "DELTA", "KVN", "KVI") + (("FKVN", "FKVI") if full else ()) + \
        ("QN", "QI") + (("FQN", "FQI") if full else ())
    outputs = ("DQ", "DK", "DV")
    ints = int_names(params)
    sub_q = _sub_tiles(params.sparse_q, q_len, c["BLOCK_M1"])
    sub_kv = _sub_tiles(params.sparse_kv, kv_len, c["BLOCK_N2"])
    # Note: the bounds masks go only where every tile of both kinds of program is inside the lengths.
    even = (_even(q_len, c["BLOCK_M1"], params.sparse_q) and _even(kv_len, c["BLOCK_N2"], params.sparse_kv)
            and kv_len % c["BLOCK_N1"] == 0 and q_len % c["BLOCK_M2"] == 0)
    dkdv = _block_loop(" " * 12, "q", params.sparse_q, "BLOCK_M1", sub_q, "start",
                       _dkdv_body(params, True, dot, mm, even), "hq")
    dqs = _block_loop(" " * 8, "kv", params.sparse_kv, "BLOCK_N2", sub_kv, "start", _dq_body(params, True, dot, mm, even), "hq")
    if full:
        dkdv += _block_loop(" " * 12, "fq", params.sparse_q, "BLOCK_M1", sub_q, "start",
                            _dkdv_body(params, False, dot, mm, even), "hq")
        dqs += _block_loop(" " * 8, "fkv", params.sparse_kv, "BLOCK_N2", sub_kv, "start",
                           _dq_body(params, False, dot, mm, even), "hq")
    return (f"@triton.jit\n"
            f"def {{name}}({_pointers(params, inputs, outputs)},\n"
            f"        {', '.join(ints)},\n"
            f"        BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr):\n"
            f"    pid = tl.program_id(0)\n"
            f"    kv_tiles = tl.cdiv(kv_len, BLOCK_N1)\n"
            f"    q_tiles = tl.cdiv(q_len, BLOCK_M2)\n"
            f"    per_kv_head = kv_tiles + q_tiles * {params.group}\n"
            f"    zh = pid // per_kv_head\n"
            f"    local = pid % per_kv_head\n"
            f"    off_b = zh // kv_heads\n"
            f"    off_hkv = zh % kv_heads\n"
            f"    z = off_b.to(tl.int64)\n"
            f"    hk = off_hkv.to(tl.int64)\n"
            f"    dq = tl.arange(0, {params.head_dim})\n"
            f"    dv = tl.arange(0, {params.value_dim})\n"
            f"    if local < kv_tiles:\n"
            f"        tile = local\n"
            f"        cols = tile * BLOCK_N1 + tl.arange(0, BLOCK_N1)\n"
            f"        col_ok = cols < kv_len\n"
            f"        k = tl.load(K + k_off + z * k_sz + hk * k_sh + cols[:, None] * k_sn + dq[None, :], "
            f"mask=col_ok[:, None], other=0.0)\n"
            f"        v = tl.load(V + v_off + z * v_sz + hk * v_sh + cols[:, None] * v_sn + dv[None, :], "
            f"mask=col_ok[:, None], other=0.0)\n"
            f"        dk_acc = tl.zeros([BLOCK_N1, {params.head_dim}], tl.float32)\n"
            f"        dv_acc = tl.zeros([BLOCK_N1, {params.value_dim}], tl.float32)\n"
            f"        n_idx = cols[:, None]\n"
            f"        sblock = (tile * BLOCK_N1) // {params.sparse_kv}\n"
            f"        for g in range(0, {params.group}):\n"
            f"            off_h = off_hkv * {params.group} + g\n"
            f"            hq = off_h.to(tl.int64)\n"
            f"            q_base = Q + q_off + z * q_sz + hq * q_sh\n"
            f"            do_base = DO + do_off + z * do_sz + hq * do_sh\n"
            f"            l_base = LSE + l_off + z * l_sz + hq * l_sh\n"
            f"            d_base = DELTA + (z * heads + hq) * q_len\n"
            f"{dkdv}"
            f"        tl.store(DK + z * dk_sz + hk * dk_sh + cols[:, None] * dk_sn + dq[None, :], "
            f"(dk_acc * {params.scale!r}).to(DK.dtype.element_ty), mask=col_ok[:, None])\n"
            f"        tl.store(DV + z * dv_sz + hk * dv_sh + cols[:, None] * dv_sn + dv[None, :], "
            f"dv_acc.to(DV.dtype.element_ty), mask=col_ok[:, None])\n"
            f"    else:\n"
            f"        pid2 = local - kv_tiles\n"
            f"        tile = pid2 % q_tiles\n"
            f"        off_h = off_hkv * {params.group} + pid2 // q_tiles\n"
            f"        hq = off_h.to(tl.int64)\n"
            f"        rows = tile * BLOCK_M2 + tl.arange(0, BLOCK_M2)\n"
            f"        row_ok = rows < q_len\n"
            f"        q = tl.load(Q + q_off + z * q_sz + hq * q_sh + rows[:, None] * q_sm + dq[None, :], "
            f"mask=row_ok[:, None], other=0.0)\n"
            f"        do = tl.load(DO + do_off + z * do_sz + hq * do_sh + rows[:, None] * do_sm + dv[None, :], "
            f"mask=row_ok[:, None], other=0.0)\n"
            f"        lse = tl.load(LSE + l_off + z * l_sz + hq * l_sh + rows, mask=row_ok, other=0.0)\n"
            f"        lse = tl.where(lse == float(\"-inf\"), 0.0, lse)\n"
            f"        di = tl.load(DELTA + (z * heads + hq) * q_len + rows, mask=row_ok, other=0.0)\n"
            f"        k_base = K + k_off + z * k_sz + hk * k_sh\n"
            f"        v_base = V + v_off + z * v_sz + hk * v_sh\n"
            f"        dq_acc = tl.zeros([BLOCK_M2, {params.head_dim}], tl.float32)\n"
            f"        m_idx = rows[:, None]\n"
            f"        sblock = (tile * BLOCK_M2) // {params.sparse_q}\n"
            f"{dqs}"
            f"        tl.store(DQ + z * dq_sz + hq * dq_sh + rows[:, None] * dq_sm + dq[None, :], "
            f"(dq_acc * {params.scale!r}).to(DQ.dtype.element_ty), mask=row_ok[:, None])\n")


def int_names(params: FlexParams) -> list[str]:
    """The kernel's integer parameters, in order (the launch's integer arguments)."""
    if params.kind == "forward":
        return [a for a in FWD_INTS if params.has_full or not a.startswith("fkv")]
    return [a for a in BWD_INTS if params.has_full or not a.startswith(("fkv", "fq"))]


def _inline_constants(body: str, constants: dict[str, int]) -> str:
    """`body` with each named integer parameter read as its literal value (the signature keeps
    the parameter, which the launch still passes)."""
    head_end = body.index("):\n", body.index("def {name}(")) + 3
    head, rest = body[:head_end], body[head_end:]
    for name, value in constants.items():
        rest = re.sub(rf"\b{name}\b", str(int(value)), rest)
    return head + rest


def render_flex(params: FlexParams, config: FlexConfig, q_len: int, kv_len: int, target: str,
                constants: dict[str, int] | None = None) -> tuple[str, str]:
    """(name, source) of one flex kernel; its name hashes the source and config (as codegen.attention's).

    `constants`: integer parameters (strides, offsets, lengths) inlined as literals, as Inductor
    specializes its templates on static strides: ptxas then folds the address arithmetic (Triton
    3.6, sm_90a, the D128 causal backward at 64/128/128/64 on 8 warps: 100 bytes of spills a
    thread instead of 200).
    """
    if params.head_dim not in HEAD_DIMS or params.value_dim not in HEAD_DIMS:
        raise ValueError(f"head dims {params.head_dim}, {params.value_dim} are not in {HEAD_DIMS}")
    if not math.isfinite(params.scale):
        raise ValueError(f"scale {params.scale} is not finite")
    body = (render_forward if params.kind == "forward" else render_backward)(params, config, q_len, kv_len, target)
    if constants:
        body = _inline_constants(body, constants)
    body = f"# fxcc-flex kind={params.kind} head_dim={params.head_dim} dtype={str(params.dtype).removeprefix('torch.')}\n" + body
    digest = hashlib.sha256(f"{body}\n{sorted(config.constexprs.items())}\n{config.num_warps}\n"
                            f"{config.num_stages}".encode()).hexdigest()[:16]
    name = f"{KERNEL_PREFIX}{digest}"
    # Note: the helpers a mod's text may call (bf16 rounding in the interpreter, normal_cdf).
    return name, "import triton\nimport triton.language as tl\n" + HELPERS + "\n\n" + body.replace("{name}", name)


def render_flex_template(item: Any, target: str) -> RenderedKernel:
    """The kernel of a lowering.TemplateKernel holding FlexParams, with its launch config and grid."""
    sizes = item.sizes
    config = heuristic_config(item.params, sizes["q_len"], sizes["kv_len"], target)
    names = int_names(item.params)
    static = len(names) == len(item.int_args) and not is_symbolic(*item.int_args)
    constants = dict(zip(names, (int(v) for v in item.int_args))) if static else None
    name, source = render_flex(item.params, config, sizes["q_len"], sizes["kv_len"], target, constants)
    return RenderedKernel(name, source, [], None, None, launch_grid(item.params, config, sizes), config.constexprs,
                          config.num_warps, num_stages=config.num_stages)

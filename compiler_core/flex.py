"""flex_attention nodes in a rebuilt graph: their arguments checked and their outputs' fakes derived.

Note: a flex_attention node (wire.FlexAttention) holds no code. Its score_mod, mask_mod and
joint graphs are GraphSpecs of allow-listed aten ops, rebuilt here like any graph (so an op
outside the allow-list is refused with a 422); the node's outputs are derived from its inputs'
FakeTensors as torch's fake kernel derives them (out laid out in q's stride order, logsumexp and
max_scores fp32 and contiguous), never taken from the client. The lowering
(flex_lowering.py) renders a Triton template with the mods inlined; where it cannot,
the node is an extern step the client runs eagerly (client/flex_attention.py).

The block tuple is the BlockMask's `as_tuple()` without its mask_mod: (Q_LEN, KV_LEN,
kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, q_num_blocks, q_indices,
full_q_num_blocks, full_q_indices, [fields newer torch adds, all None], Q_BLOCK_SIZE, KV_BLOCK_SIZE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fxcc.compiler_core.errors import InvalidGraph

FORWARD = "higher_order.flex_attention"
BACKWARD = "higher_order.flex_attention_backward"
BLOCK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")
MAX_EXTRA_FIELDS = 8  # None fields between the block tensors and the block sizes (torch >= 2.13 has 4)


@dataclass(frozen=True)
class Block:
    """A block mask's parts: its lengths, tensors (None where absent) and block sizes."""

    q_len: int
    kv_len: int
    tensors: dict[str, Any]
    q_block: int
    kv_block: int


def parse_block(block: Any) -> Block:
    """The block tuple's parts; InvalidGraph naming what is wrong for a tuple of another form."""
    if not isinstance(block, (list, tuple)) or not 12 <= len(block) <= 12 + MAX_EXTRA_FIELDS:
        raise InvalidGraph("flex_attention's block mask is not a tuple of 12 to 20 fields", op=FORWARD)
    q_len, kv_len, *rest = block
    tensors, extra, (q_block, kv_block) = rest[:8], rest[8:-2], rest[-2:]
    if any(x is not None for x in extra):
        raise InvalidGraph("flex_attention's block mask holds fields fxcc does not know", op=FORWARD)
    ints = (q_len, kv_len, q_block, kv_block)
    if not all(isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool) for x in ints):
        raise InvalidGraph("flex_attention's block mask lengths and block sizes are not integers", op=FORWARD)
    named = dict(zip(BLOCK_FIELDS, tensors))
    if named["kv_num_blocks"] is None or named["kv_indices"] is None:
        raise InvalidGraph("flex_attention's block mask has no kv_num_blocks / kv_indices", op=FORWARD)
    for name, t in named.items():
        if t is not None and (not isinstance(t, torch.Tensor) or t.dtype != torch.int32):
            raise InvalidGraph(f"flex_attention's block mask field {name} is not an int32 tensor", op=FORWARD)
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices"),
                     ("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")):
        n, i = named[num], named[idx]
        if (n is None) != (i is None):
            raise InvalidGraph(f"flex_attention's block mask has {num} or {idx} without the other", op=FORWARD)
        if n is not None and (n.dim() != 3 or i.dim() != 4 or tuple(i.shape[:3]) != tuple(n.shape)):
            raise InvalidGraph(f"flex_attention's block mask {num} / {idx} are not [B, H, n] / [B, H, n, m]",
                               op=FORWARD)
    return Block(q_len, kv_len, named, q_block, kv_block)


def fill_order_strides(sizes: tuple[Any, ...], like: tuple[Any, ...]) -> tuple[Any, ...]:
    """Dense strides for `sizes` in the stride order of `like` (its innermost dim first), with the
    last dim innermost: the layout torch's flex kernels give their outputs."""
    order = sorted(range(len(like)), key=lambda d: like[d])
    if len(order) and order[0] != len(sizes) - 1:
        order.remove(len(sizes) - 1)
        order.insert(0, len(sizes) - 1)
    strides: list[Any] = [0] * len(sizes)
    step: Any = 1
    for d in order:
        strides[d] = step
        step = step * sizes[d]
    return tuple(strides)


def _empty_like_order(t: torch.Tensor, sizes: tuple[Any, ...]) -> torch.Tensor:
    return torch.empty_strided(sizes, fill_order_strides(sizes, tuple(t.stride())), dtype=t.dtype, device=t.device)


def check_qkv(q: Any, k: Any, v: Any) -> None:
    tensors = (q, k, v)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in tensors):
        raise InvalidGraph("flex_attention takes 4-d q, k and v", op=FORWARD)
    if q.dtype != k.dtype or q.dtype != v.dtype or not q.dtype.is_floating_point:
        raise InvalidGraph("flex_attention takes q, k and v of one floating dtype", op=FORWARD)
    if q.shape[-1] != k.shape[-1] or k.shape[:3] != v.shape[:3] or q.shape[1] % k.shape[1] != 0:
        raise InvalidGraph("flex_attention's q, k and v sizes do not fit together", op=FORWARD)
    if q.shape[0] != k.shape[0] and k.shape[0] != 1:
        raise InvalidGraph("flex_attention's batch sizes of q and k/v do not broadcast", op=FORWARD)


class FlexTarget:
    """The FX target of a flex_attention (`kind` forward) or backward node in a rebuilt graph:
    called on FakeTensors it checks the arguments and gives the node's fakes. `n_outputs`
    (forward): 2 (out, lse) or 3 (out, lse, max_scores), as the client's torch returns."""

    def __init__(self, kind: str, n_outputs: int = 3) -> None:
        self.kind = kind
        self.n_outputs = n_outputs
        self.wire_name = FORWARD if kind == "forward" else BACKWARD
        self.__name__ = "flex_attention" if kind == "forward" else "flex_attention_backward"

    def __repr__(self) -> str:
        return f"flex[{self.kind}]"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FlexTarget) and (other.kind, other.n_outputs) == (self.kind, self.n_outputs)

    def __hash__(self) -> int:
        return hash((FlexTarget, self.kind, self.n_outputs))

    def __call__(self, *args: Any) -> Any:
        from torch._subclasses.fake_tensor import FakeTensor

        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if any(not isinstance(t, FakeTensor) for t in tensors):
            raise InvalidGraph(f"{self.wire_name} runs only on the client", op=self.wire_name)
        if self.kind == "forward":
            q, k, v, block, _scale, score_bufs, mask_bufs = args
        else:
            q, k, v, out, lse, grad_out, _grad_lse, block, _scale, score_bufs, mask_bufs = args
        check_qkv(q, k, v)
        parse_block(block)
        if not all(isinstance(b, torch.Tensor) for b in (*score_bufs, *mask_bufs)):
            raise InvalidGraph("flex_attention's captured buffers are not tensors", op=self.wire_name)
        batch, heads, q_len, _ = q.shape
        o_sizes = (batch, heads, q_len, v.shape[-1])
        if self.kind == "forward":
            out = _empty_like_order(q, o_sizes)
            stats = [torch.empty((batch, heads, q_len), dtype=torch.float32, device=q.device)
                     for _ in range(self.n_outputs - 1)]
            return (out, *stats)
        if tuple(out.shape) != o_sizes or tuple(lse.shape) != o_sizes[:3] or \
                (grad_out is not None and tuple(grad_out.shape) != o_sizes):
            raise InvalidGraph("flex_attention_backward's out, lse and grad_out do not fit q and v",
                               op=self.wire_name)
        grad_k_sizes = (batch, *k.shape[1:]) if k.shape[0] == batch else tuple(k.shape)
        grad_v_sizes = (batch, *v.shape[1:]) if v.shape[0] == batch else tuple(v.shape)
        return (_empty_like_order(q, tuple(q.shape)), _empty_like_order(k, grad_k_sizes),
                _empty_like_order(v, grad_v_sizes), tuple(None for _ in score_bufs))

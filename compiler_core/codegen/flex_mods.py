"""flex_attention's score_mod / mask_mod / joint graph as Triton statements over a tile of scores.

Note: a mod's graph is lowered by fxcc's own lowerings (flex_lowering.py) over 0-dim
values: its inputs score, b, h, q_idx, kv_idx (and the joint graph's incoming gradient) load
"registers", its captured tensors are input buffers. The value that comes out is rendered here
under an ops handler whose registers are the template's own variables (a [BLOCK_M, BLOCK_N]
tile of scores, the program's batch and head, the tile's row and column indices), so the same
Triton text as a fused kernel's works on the tile elementwise, and a captured tensor read at
data-dependent indices (bias[h], table[q_idx - kv_idx]) is an indirect, masked load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fxcc.compiler_core.codegen.triton import TL_DTYPES, TritonHandler, TVal
from fxcc.compiler_core.errors import CodegenError
from fxcc.compiler_core.ir.ops import compute_dtype, use_handler
from fxcc.compiler_core.ir.templates import TILE_INDEX
from fxcc.compiler_core.sizevars import Expr, render_index
from fxcc.compiler_core.symbolic import size_symbols_of


@dataclass(frozen=True)
class ModText:
    """A mod rendered: statements (unindented), then the expression of its value."""

    lines: tuple[str, ...]
    value: str

    def indented(self, pad: str, registers: dict[str, str]) -> str:
        """The statements with the template's variable for each register name, one per line."""
        return "".join(f"{pad}{_swap(line, registers)}\n" for line in self.lines)

    def value_of(self, registers: dict[str, str]) -> str:
        return _swap(self.value, registers)


def _swap(text: str, registers: dict[str, str]) -> str:
    for name, var in registers.items():
        text = text.replace(name, var)
    return text


@dataclass
class ModHandler(TritonHandler):
    """TritonHandler over a tile: no kernel coordinates, static indices only, named temporaries."""

    prefix: str = "mod"  # of the temporaries' names (TritonHandler.emit)
    pointers: dict[str, str] = field(default_factory=dict)  # buffer name -> pointer parameter

    def index(self, expr: Expr) -> Expr:
        if size_symbols_of(expr):
            raise CodegenError("a flex_attention mod indexes with a symbolic size")
        return expr

    def load(self, name: str, index: Expr) -> TVal:
        if name in self.registers:
            return self.registers[name]
        pointer = self.pointers.get(name)
        if pointer is None:
            raise CodegenError(f"a flex_attention mod reads {name}, which it was not given")
        index = self.index(index)
        masks = [self.indirect_masks[s] for s in sorted(index.free_symbols, key=str) if s in self.indirect_masks]
        masks += self.mask_stack
        where = f", mask={' & '.join(masks)}, other=0" if masks else ""
        return self.loaded(name, f"tl.load({pointer} + ({render_index(index)}){where})")

    def loaded(self, name: str, text: str) -> TVal:
        """The load `text` of buffer `name`, at its compute dtype."""
        dtype = self.buffer_dtypes[name]
        comp = compute_dtype(dtype)
        if comp != dtype:
            text += f".to({TL_DTYPES[comp]})"
        return self.emit(text, comp)


def render_mod(body: Callable[[], Any], registers: dict[str, torch.dtype], buffers: dict[str, tuple[str, torch.dtype]],
               prefix: str, target: str, want: torch.dtype) -> ModText:
    """The Triton text of `body()` (a mod's value, built from ops.*): `registers` are the names its
    inputs load, standing for template variables; `buffers` maps each captured tensor's buffer name
    to (pointer parameter, dtype). The value is converted to `want`. Raises CodegenError for an op
    the target has no spelling for."""
    handler = ModHandler(target=target, kernel=None, args={}, prefix=prefix,
                         buffer_dtypes={name: dtype for name, (_, dtype) in buffers.items()},
                         pointers={name: ptr for name, (ptr, _) in buffers.items()},
                         registers={name: TVal(f"@{name}@", dtype) for name, dtype in registers.items()})
    with use_handler(handler):
        value = body()
        if not isinstance(value, TVal):
            raise CodegenError("a flex_attention mod gave no value")
        if want == torch.bool and value.dtype != torch.bool:
            value = handler.emit(f"({value.text} != 0)", torch.bool)
        elif value.dtype != want:
            value = handler.to_dtype(value, want)
    return ModText(tuple(handler.lines), value.text)


TILE_MASK = "bias_ok"  # the tile's in-range scores: every load of a tile expression is masked by it


@dataclass
class TileHandler(ModHandler):
    """ModHandler whose loads read a [BLOCK_M, BLOCK_N] tile at indices of the tile's coordinates
    only (no data-dependent index), masked by the tile's range."""

    def load(self, name: str, index: Expr) -> TVal:
        pointer = self.pointers.get(name)
        if pointer is None:
            raise CodegenError(f"an attention tile expression reads {name}, which it was not given")
        index = self.index(index)
        names = {s.name for s in index.free_symbols}
        if not names <= set(TILE_INDEX):
            raise CodegenError(f"an attention tile expression reads {name} at {index}")
        where = render_index(index)
        if not names & {"bias_i", "bias_j"}:  # a batch's or head's value: loaded as a block all the same
            where = f"{where} + 0 * bias_j"
        return self.loaded(name, f"tl.load({pointer} + ({where}), mask={TILE_MASK}, other=0)")


def render_tile(body: Callable[[], Any], buffers: dict[str, tuple[str, torch.dtype]], prefix: str, target: str,
                want: torch.dtype) -> ModText:
    """The Triton text of `body()` (one element of a tensor over TILE_INDEX's symbols, built from
    ops.*) computed for a whole tile; `buffers` maps each buffer it reads to (pointer parameter,
    dtype). Raises CodegenError for what a tile cannot compute."""
    handler = TileHandler(target=target, kernel=None, args={}, prefix=prefix,
                          buffer_dtypes={name: dtype for name, (_, dtype) in buffers.items()},
                          pointers={name: ptr for name, (ptr, _) in buffers.items()})
    with use_handler(handler):
        value = body()
        if not isinstance(value, TVal):
            raise CodegenError("an attention tile expression gave no value")
        value = handler.to_dtype(value, want)
    return ModText(tuple(handler.lines), value.text)


def _render_tile_bias(tile: Any, target: str) -> ModText:
    """A lowering.attention TileBias as codegen.attention renders it (CodegenError where it cannot)."""
    buffers = {name: (f"B{i}", dtype) for i, (name, dtype) in enumerate(tile.buffers)}
    return render_tile(lambda: tile.loader(list(tile.index)), buffers, "bx", target, torch.float32)


def _register() -> None:
    from fxcc.compiler_core.lowering import attention as lowering_attention

    if _render_tile_bias not in lowering_attention.TILE_RENDERERS:
        lowering_attention.TILE_RENDERERS.append(_render_tile_bias)


_register()
